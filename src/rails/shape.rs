//! What both sides of the rail logic use: the [`Rails`] a pin calls through (implemented by
//! `group`'s `RailGroup`, called by `resolve`'s pins), each rail's [`Shape`], and the address checks
//! made before any rail's writer is asked anything. Its own room, so that the rail group and the
//! pins each import it and not each other.

use super::MAX_RAILS;
use crate::cache::Pinned;
use crate::error::DmaError;

/// The calls a [`RailPinned`](super::RailPinned) makes on every rail, whatever the backend: object safe, so the
/// pin carries no backend type.
pub(crate) trait Rails: Sync {
    /// How many rails.
    fn count(&self) -> usize;
    /// A pin of rail `rail`'s cache.
    fn pin_rail(&self, rail: usize) -> Option<Pinned<'_>>;
    /// How many rails, and how long an address each rail's AV takes.
    fn shape(&self) -> &Shape;
    /// Release `client` on every rail, after releasing the clients evicted meanwhile.
    fn release_everywhere(&self, client: u64);
}

/// The address local rail `rail` uses: the peer's rail `rail mod m` of its `m`.
pub(crate) fn address_for<'a>(addresses: &[&'a [u8]], rail: usize) -> &'a [u8] {
    match addresses.len() {
        0 => &[],
        m => addresses[rail % m],
    }
}

/// How many rails, and each rail's address length: what checking addresses needs, read without
/// a call through `dyn Rails`.
pub(crate) struct Shape {
    pub(crate) count: usize,
    pub(crate) address_lens: [usize; MAX_RAILS],
}

/// Refuse a wrong number of addresses, or an address of the wrong length or all zero bytes for
/// the rail that would use it, before any rail's writer is asked anything.
pub(crate) fn check_addresses(rails: &Shape, addresses: &[&[u8]]) -> Result<(), DmaError> {
    if addresses.is_empty() || addresses.len() > MAX_RAILS {
        return Err(DmaError::InvalidArgument(format!(
            "a peer advertises 1 to {MAX_RAILS} rail addresses, not {}",
            addresses.len()
        )));
    }
    for (rail, &expected) in rails.address_lens[..rails.count].iter().enumerate() {
        let address = address_for(addresses, rail);
        let sealed = expected + crate::address::SEAL_LEN;
        if address.len() != expected && address.len() != sealed {
            return Err(DmaError::InvalidAddress(format!(
                "rail {rail} takes {expected}-byte addresses ({sealed} sealed); the peer's rail \
                 {} gave {}",
                rail % addresses.len(),
                address.len()
            )));
        }
        if address[..expected].iter().all(|&byte| 0 == byte) {
            return Err(DmaError::InvalidAddress(format!(
                "the peer's rail {} address is all zero bytes (advertised before it had one)",
                rail % addresses.len()
            )));
        }
    }
    Ok(())
}
