//! [`RailCaches`]: the rail logic over caches of any [`AvBackend`] (the model AV in tests), the
//! same [`RailGroup`] a [`RailSet`](super::RailSet) runs over its endpoints' caches.

use super::group::{RailGroup, forward_to_group};
use crate::av::AvBackend;
use crate::cache::AddressCache;
use crate::error::DmaError;

/// The rail logic over caches of any backend: what [`RailSet`](super::RailSet) runs over its
/// endpoints' caches, here over caches you build, such as `ModelAv` ones with
/// efa's address rules. Pinning, resolving, leasing, releasing and quiescing behave exactly as on
/// a [`RailSet`](super::RailSet) (the same code runs); it has no endpoints, so no memory and no
/// RMA.
///
/// ```
/// use dma_libfabric::{AddressCache, AddressFormat, ModelAv, RailCaches};
///
/// let avs = [ModelAv::new(AddressFormat::Opaque), ModelAv::new(AddressFormat::Opaque)];
/// let rails = RailCaches::new(avs.iter().map(|av| AddressCache::with_backend(av.clone())).collect())?;
/// let addresses: [&[u8]; 2] = [&[1; 16], &[2; 16]];
/// let pinned = rails.pin();
/// let peers = pinned.resolve(7, &addresses)?;
/// assert_eq!(Some(vec![2; 16]), avs[1].lookup(peers.rail(1).fi_addr()));
/// drop(pinned);
/// rails.release(7);
/// rails.quiesce();
/// assert!(avs.iter().all(ModelAv::is_empty));
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
pub struct RailCaches<B: AvBackend> {
    group: RailGroup<AddressCache<B>>,
}

impl<B: AvBackend> std::fmt::Debug for RailCaches<B> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RailCaches")
            .field("rails", &self.group.len())
            .finish_non_exhaustive()
    }
}

impl<B: AvBackend> RailCaches<B> {
    /// Rails over `caches`, rail 0 first.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for no caches or more than [`MAX_RAILS`](super::MAX_RAILS).
    pub fn new(caches: Vec<AddressCache<B>>) -> Result<Self, DmaError> {
        Ok(Self {
            group: RailGroup::new(caches)?,
        })
    }

    forward_to_group! {
        rail: AddressCache<B>;
        /// Rail `rail`'s cache.
        ///
        /// # Panics
        /// If `rail >= len()`, as slice indexing does.
        fn rail;
        /// As [`RailSet::lease`](super::RailSet::lease).
        ///
        /// # Errors
        /// As [`RailSet::lease`](super::RailSet::lease).
        fn lease;
    }
}
