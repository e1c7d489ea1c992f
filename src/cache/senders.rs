//! From an AV index back to the clients registered on it: how a receiver turns a message's sender
//! ([`Received::sender`](crate::endpoint::Received::sender), [`Completion::sender`](crate::endpoint::Completion::sender))
//! into the clients it knows that peer as.
//!
//! Read-only and off the hot path: one scan of the published index (bounded by the AV's capacity
//! times the clients registered on each entry), no request to the writer, no lock.

use super::AddressCache;
use super::index::RegistrationIndex;
use crate::av::AvBackend;
use dma_libfabric_sys::fi_addr_t;

impl<B: AvBackend> AddressCache<B> {
    /// The first client id of those an endpoint keeps for the senders that introduce themselves
    /// to it (the credit protocol, [`PeerProtocol::Credited`](crate::configuration::PeerProtocol::Credited)):
    /// ids from 2⁶³ up. An application that resolves clients of its own under them may find them
    /// released or replaced by the endpoint; [`clients_at`](Self::clients_at) leaves them out.
    pub const INTRODUCED_CLIENTS: u64 = 1 << 63;

    /// The clients registered on AV index `fi_addr` now, sorted: none when no client resolved to
    /// it (the peer is not in the AV through this cache, or every client of it was released),
    /// several when several clients resolved to one address. A snapshot: a client released or
    /// resolved meanwhile may be missing or present. Client ids with the top bit set
    /// ([`AddressCache::INTRODUCED_CLIENTS`]) are left out: an endpoint resolves the senders that
    /// introduce themselves to it (the credit protocol) under such ids, and they are not the
    /// application's.
    ///
    /// A sender's index is exact only while the sender's entry is in the AV: rxm reports a
    /// removed index for a connection that outlived it, and `FI_AV_TABLE` hands that index to
    /// the next peer (see [`Received::sender`](crate::endpoint::Received::sender)).
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let pinned = cache.pin();
    /// let peer = pinned.resolve(1, &[1; 16])?;
    /// pinned.resolve(2, &[1; 16])?;
    /// let other = pinned.resolve(3, &[2; 16])?;
    /// assert_eq!(vec![1, 2], cache.clients_at(peer.fi_addr()));
    /// assert_eq!(vec![3], cache.clients_at(other.fi_addr()));
    /// assert!(cache.clients_at(99).is_empty());
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn clients_at(&self, fi_addr: fi_addr_t) -> Vec<u64> {
        let pinned = self.reader_side.epochs.pin();
        let mut clients = self.reader_side.shared.index.clients_at(&pinned, fi_addr);
        drop(pinned);
        clients.retain(|&client| client < Self::INTRODUCED_CLIENTS);
        clients.sort_unstable();
        clients
    }
}
