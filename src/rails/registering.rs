//! Memory on every rail, as a rail set registers it: one buffer registered in every rail's
//! domain ([`RailRegion`]), all or nothing: a rail that refuses leaves nothing registered on
//! the others.

use super::region::RailRegion;
use super::set::RailSet;
#[cfg(doc)]
use crate::endpoint::LibfabricEndpoint;
use crate::error::DmaError;

impl RailSet {
    /// Register `len` bytes of fresh zeroed memory on every rail: one buffer (rail 0's), under
    /// each rail's own key.
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::register`], for any rail; nothing stays registered.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, RailRemoteRegion, RailSet};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let rails = RailSet::open(&configuration, &["127.0.0.1", "127.0.0.2"])?;
    /// let region = rails.register(1 << 20)?;
    /// region.write_bytes(0, b"one buffer")?;
    /// let remote = region.remote(); // one key per rail, one length
    /// assert_eq!((2, 1 << 20), (remote.len(), remote.region_len()));
    /// assert_ne!(remote.rail(0).key, remote.rail(1).key);
    /// assert_eq!(remote, RailRemoteRegion::from_bytes(&remote.to_bytes())?);
    /// assert!(region.segment(1 << 19, 1 << 19).is_ok());
    /// assert!(region.segment(1 << 19, (1 << 19) + 1).is_err());
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn register(&self, len: usize) -> Result<RailRegion<'_>, DmaError> {
        let primary = self.group.rail(0).register(len)?;
        let mut regions = Vec::with_capacity(self.len());
        for rail in &self.group.rails()[1..] {
            // SAFETY: rail 0's endpoint outlives every other rail's: `RailGroup` drops its rails
            // last to first.
            regions.push(unsafe { rail.register_alias(&primary) }?);
        }
        regions.insert(0, primary);
        Ok(RailRegion {
            regions,
            owner: None,
            buffer: std::marker::PhantomData,
        })
    }

    /// [`register`](Self::register) for a rail set shared through an `Arc`: the region keeps the
    /// rail set alive rather than borrowing it, so it can be stored beside it (a client that
    /// advertises its memory for as long as it lives).
    ///
    /// # Errors
    /// As `register`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use dma_libfabric::{Configuration, RailRegion, RailSet};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let rails = Arc::new(RailSet::open(&configuration, &["127.0.0.1", "127.0.0.2"])?);
    /// let region: RailRegion<'static> = rails.register_shared(64)?;
    /// drop(rails); // the region still holds it
    /// assert_eq!((64, 2), (region.len(), region.remote().len()));
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn register_shared(
        self: &std::sync::Arc<Self>,
        len: usize,
    ) -> Result<RailRegion<'static>, DmaError> {
        let region = self.register(len)?;
        let regions = region
            .regions
            .into_iter()
            // SAFETY: the returned region holds an `Arc` of the rail set, declared after its
            // registrations, so every rail's endpoint outlives them.
            .map(|region| unsafe { region.unbind() })
            .collect();
        Ok(RailRegion {
            regions,
            owner: Some(std::sync::Arc::clone(self)),
            buffer: std::marker::PhantomData,
        })
    }

    /// The application's `buffer`, registered in place on every rail (see
    /// [`LibfabricEndpoint::register_buffer`]): rail 0 registers it, and every other rail
    /// registers the same bytes under its own key. Nothing is copied.
    ///
    /// # Errors
    /// As `LibfabricEndpoint::register_buffer`, for any rail; the buffer is dropped (or, if
    /// [`Exposure::Remote`](crate::endpoint::Exposure::Remote), parked) on an error, and nothing is left
    /// registered.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, Exposure, RailSet};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let rails = RailSet::open(&configuration, &["127.0.0.1", "127.0.0.2"])?;
    /// let pages = vec![0_u8; 8192];
    /// let address = pages.as_ptr() as usize;
    /// let region = rails.register_buffer(pages, Exposure::Local)?;
    /// assert_eq!((8192, 2), (region.len(), region.rails()));
    /// assert_eq!(address, region.as_slice()?.as_ptr() as usize);
    /// let pages = region.into_buffer().map_err(|(_, error)| error)?;
    /// assert_eq!(address, pages.as_ptr() as usize);
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn register_buffer<B: crate::endpoint::StableBuffer>(
        &self,
        buffer: B,
        exposure: crate::endpoint::Exposure,
    ) -> Result<RailRegion<'_, B>, DmaError> {
        let primary = self
            .group
            .rail(0)
            .register_buffer(buffer, exposure)?
            .erase();
        let mut regions = Vec::with_capacity(self.len());
        regions.push(primary);
        for rail in &self.group.rails()[1..] {
            // SAFETY: rail 0's endpoint outlives every other rail's: `RailGroup` drops its rails
            // last to first.
            let alias = unsafe { rail.register_alias(&regions[0]) }?;
            regions.push(alias);
        }
        Ok(RailRegion {
            regions,
            owner: None,
            buffer: std::marker::PhantomData,
        })
    }
}
