//! The published index readers probe: one registration per client, holding everything its hit
//! needs, the AV index of the entry it is registered on and that entry's whole address.
//!
//! A hit is one probe of the map by the client id (a `u64`: the cheapest key to hash), then a
//! compare of the probe's whole address with the address in the registration papaya returned,
//! in place: the registration is the map's value, inline in the node papaya's probe has already
//! loaded, so the hit's one chain of dependent loads is papaya's own (its table, the slot, the
//! node) and nothing behind it. So a registration is found only for a client the writer
//! registered on that very address, and a new QKEY on a known efa slot, or a client that was
//! evicted, is a miss that goes to the writer. A client is registered on at most one entry (the
//! writer's invariant), which is what lets the client alone be the key. An address longer than
//! [`INLINE_ADDRESS`](super::stored::INLINE_ADDRESS) bytes (none of the providers the cache is
//! tested on) is kept on the heap, and its hit reads it there.
//!
//! Only the writer inserts and removes; readers only probe. The writer also reads it, to find
//! the entry a published client holds (`registered`, and what `unlink` took out): the index
//! stands in for a writer-side map of every client. A registration is never changed in place:
//! the writer publishes a new node, and papaya's own reclamation (seize) keeps the old one alive
//! while a reader's guard may still see it, so a reader may read a node the writer has just
//! unlinked or replaced, and what it reads is the pair the writer published together. That is
//! memory safety only: whether the *fi_addr_t* in it is still in the AV is the epoch deferral's
//! business (see the `cache` module).
//!
//! Two implementations keep [`RegistrationIndex`]'s contract: `lock_free`'s `PapayaIndex`, in
//! the build that ships (its reader guards and table replacement, and their bounds, are that
//! module's), and `locked`'s `LockedIndex` under loom.

use super::epoch::EpochPin;
use super::stored::StoredAddress;
use dma_libfabric_sys::fi_addr_t;

#[cfg(not(dma_loom))]
mod lock_free;
#[cfg(dma_loom)]
mod locked;
#[cfg(not(dma_loom))]
use self::lock_free::PapayaIndex;
#[cfg(dma_loom)]
use self::locked::LockedIndex;

/// A published registration: the entry's AV index and its whole address, the map's value.
#[derive(Clone, Debug)]
pub(crate) struct Registration {
    fi_addr: fi_addr_t,
    address: StoredAddress,
}

impl Registration {
    pub(crate) fn new(fi_addr: fi_addr_t, address: &StoredAddress) -> Self {
        Self {
            fi_addr,
            address: address.clone(),
        }
    }

    /// The entry's AV index.
    pub(crate) fn fi_addr(&self) -> fi_addr_t {
        self.fi_addr
    }

    /// `fi_addr` for a probe of exactly this address, `None` for any other.
    #[inline]
    pub(crate) fn confirm(&self, address: &[u8]) -> Option<fi_addr_t> {
        same_bytes(self.address.bytes(), address).then_some(self.fi_addr)
    }
}

/// Whether `a` and `b` hold the same bytes: as one fixed-size compare for the lengths addresses
/// have (a `sockaddr_in`'s 16, efa's 32), which the compiler inlines, instead of a call to
/// `memcmp`; a slice compare otherwise.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    match (<&[u8; 16]>::try_from(a), <&[u8; 16]>::try_from(b)) {
        (Ok(a), Ok(b)) => return a == b,
        (Err(_), Err(_)) => {}
        _ => return false,
    }
    match (<&[u8; 32]>::try_from(a), <&[u8; 32]>::try_from(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// What the cache needs of its index: readers probe under a pin, the writer alone publishes,
/// unlinks and replaces. Two implementations: papaya in the build that ships, and a locked map
/// under loom, which cannot see papaya's per-thread reclamation state. The protocol's proof needs
/// only that a probe after an unlink (in the writer's program order, ordered by the epoch fences)
/// misses, which both give.
pub(crate) trait RegistrationIndex: Send + Sync {
    /// What a reader keeps between its probes: the table it probes and its guard on that table's
    /// memory. Dropped before the epoch pin it was used under.
    type Reader<'a>
    where
        Self: 'a;
    /// A reader that has not probed yet.
    fn reader(&self) -> Self::Reader<'_>;
    /// The entry `client` is registered on for exactly `address` (its whole bytes, compared in
    /// the registration), as `reader` sees the index: when the writer has changed it since
    /// `reader`'s last probe, `reader` first lets go of what was retired meanwhile (which may
    /// reclaim it on this thread) and moves to the table readers probe now.
    ///
    /// # Safety
    /// The calling thread is pinned on the cache's epoch collector, and stays pinned until
    /// `reader` is dropped: a table the writer replaced is freed only once every reader pinned
    /// at its replacement has unpinned.
    unsafe fn probe<'a>(
        &'a self,
        reader: &mut Self::Reader<'a>,
        client: u64,
        address: &[u8],
    ) -> Option<fi_addr_t>;
    /// The entry `client`'s published registration names, if it has one. Writer only: the
    /// writer reads its own writes (papaya is linearizable), so this is where it finds a
    /// registered client's entry, with no map of its own beside the index.
    fn registered(&self, client: u64) -> Option<fi_addr_t>;
    /// Publish `client`'s registration on the entry at `fi_addr`, whose address is `address`,
    /// replacing any it had. Writer only.
    fn publish(&self, client: u64, fi_addr: fi_addr_t, address: &StoredAddress);
    /// Unlink `client`'s registration; the entry it named, if it had one. Writer only. Unlinking
    /// a client with no registration changes nothing (readers are not told to refresh).
    fn unlink(&self, client: u64) -> Option<fi_addr_t>;
    /// How many registrations are published; `pinned` keeps the table read alive.
    fn len(&self, pinned: &EpochPin) -> usize;
    /// The clients registered on index `fi_addr`, in no order: a scan of every registration
    /// (bounded by the AV's capacity times its clients), for the cold path only; `pinned` keeps
    /// the table read alive.
    fn clients_at(&self, pinned: &EpochPin, fi_addr: fi_addr_t) -> Vec<u64>;
    /// If the table has emptied well below what it grew to (to an eighth) and no replaced table
    /// still waits for its readers, replace it with a fresh one sized for what is left (at least
    /// the capacity it was built with), so the index's memory follows the registrations rather
    /// than their peak. Whether it did. Writer only: the caller then defers the old table's
    /// release ([`cover_retired`](Self::cover_retired)).
    fn shrink(&self) -> bool;
    /// Whether a replaced table waits for a deferral to cover it.
    fn retired_uncovered(&self) -> bool;
    /// The deferral just deferred covers the replaced table: every reader that could still probe
    /// it was pinned before that deferral. Writer only.
    fn cover_retired(&self);
    /// The deferral that covered the replaced table has returned: free it. Writer only.
    fn readers_gone(&self);
    /// Whether a replaced table is still held for its readers.
    fn holds_retired(&self) -> bool;
    /// How many times the table has been replaced (a test hook: feature `model`).
    #[cfg(feature = "model")]
    fn replacements(&self) -> u64;
}

/// The index the cache uses in this build.
#[cfg(not(dma_loom))]
pub(crate) type Index = PapayaIndex;
/// The index the cache uses in this build.
#[cfg(dma_loom)]
pub(crate) type Index = LockedIndex;

#[cfg(test)]
mod tests {
    use super::same_bytes;

    #[test]
    fn same_bytes_agrees_with_a_slice_compare() {
        let lengths = [0, 1, 15, 16, 17, 28, 32, 33];
        for &one in &lengths {
            for &other in &lengths {
                let a: Vec<u8> = (0..one as u8).collect();
                let mut b: Vec<u8> = (0..other as u8).collect();
                assert_eq!(a == b, same_bytes(&a, &b), "{one} and {other} bytes");
                if let Some(last) = b.last_mut() {
                    *last ^= 1;
                    assert_eq!(
                        a == b,
                        same_bytes(&a, &b),
                        "{one} and {other} bytes, last differs"
                    );
                }
            }
        }
    }
}
