//! Who sent a message: the sender a receive's completion names, where the provider gives it.
//!
//! A receive is read with `fi_cq_readfrom`, which hands back the sender's index in this
//! endpoint's address vector for endpoints opened with `FI_SOURCE`, and `FI_ADDR_NOTAVAIL`
//! otherwise (fi_cq(3)). Both copying receives ([`LibfabricEndpoint::receive_from`],
//! [`LibfabricEndpoint::try_receive_from`]) and receives into registered memory
//! ([`Completion::sender`](super::Completion::sender)) carry it as an `Option<fi_addr_t>`:
//! `Some(index)` where the provider named the sender, `None` where it did not. The cache turns an
//! index back into the clients registered on it
//! ([`AddressCache::clients_at`](crate::cache::AddressCache::clients_at)).
//!
//! # What the providers give (read in the libfabric 2.6.0 source, checked on 1.17 and 2.6.0)
//!
//! - **tcp;ofi_rxm** is opened with `FI_SOURCE`, asked for explicitly (`rxm_alter_info` in
//!   `prov/rxm/src/rxm_init.c` counts it among the caps that cost on the fast path). Its receive completion then carries
//!   `conn->peer->fi_addr` (`prov/rxm/src/rxm_cq.c`, `rxm_cq_write_recv_comp`): the index the
//!   sender's advertised address (its `fi_getname`) has in this AV. A sender that is not in the
//!   AV is `FI_ADDR_NOTAVAIL`, so `None`: rxm creates its peer at the connection request with
//!   that value (`prov/util/src/rxm_av.c`, `util_get_peer`) and sets the index only when the
//!   address is inserted; inserting it later names the sender on that connection's later
//!   messages. rxm does not offer `FI_SOURCE_ERR`, so such a message is delivered, not refused.
//! - **A removed index is still reported.** `fi_av_remove` does not clear the peer's index while
//!   its connection holds the peer (`rxm_put_peer_addr` in `prov/util/src/rxm_av.c` drops a
//!   reference and clears the AV's context only; the connection stays open unless
//!   `FI_AV_REMOVE_CLEANUP=1`, `rxm_av_remove_handler` in `prov/rxm/src/rxm_conn.c`): a message on that connection after the removal
//!   names the old index, which `FI_AV_TABLE` may already have handed to another peer. So a
//!   sender is exact while the sender's entry is in the AV (the cache keeps it there while any
//!   client holds it); after every client of that peer was released, a late message of its may
//!   name whoever holds the index now. Where that matters, the message's own content must say
//!   who sent it.
//! - **tcp native** (libfabric 2.x's reliable-datagram tcp) is asked for `FI_SOURCE` too, which
//!   its shared receive context offers (`XNET_SRX_CAPS`, `prov/tcp/src/xnet_attr.c`); a receive
//!   reports the connection's `src_addr` (`prov/tcp/src/xnet_cq.c`): checked on 2.6.0, a sender
//!   in the AV named and one outside it `None`; and it too reports a removed index for a
//!   connection that outlived its entry (the same test holds it on 2.6.0).
//! - Providers without `FI_SOURCE` (every other one, as this crate opens them, unless the
//!   provider offers it unasked) answer `None` for every message.
//!   [`Description::reports_senders`](super::Description::reports_senders) says which case an
//!   endpoint is in.
//!
//! Reading the sender costs nothing on the hot path: no allocation, no lock; the lookup through
//! the cache is the caller's choice, off the receive path.

#[cfg(doc)]
use super::LibfabricEndpoint;
use dma_libfabric_sys as sys;

/// A received message and who sent it, as [`LibfabricEndpoint::try_receive_from`] and
/// [`LibfabricEndpoint::receive_from`] return it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The message's bytes.
    pub message: Vec<u8>,
    /// The sender's index in this endpoint's address vector; `None` where it is not known.
    /// [`AddressCache::clients_at`](crate::cache::AddressCache::clients_at) says which clients
    /// are registered on it.
    ///
    /// On a credited endpoint (the default) it is the index of the sender that proved the
    /// secret the message's tag carries: the one that introduced itself with that secret and an
    /// address sealed with it. A message whose secret no introduced sender holds names nobody
    /// (`None`), whatever index the provider reports. The rest of this note is about a plain
    /// endpoint, where the provider's `FI_SOURCE` is all there is.
    ///
    /// tcp;ofi_rxm ([`Description::reports_senders`](super::Description::reports_senders))
    /// names a sender whose address is in this AV (resolved through this endpoint's cache), and
    /// `None` for one that is not, until it is resolved. The index is exact while the sender's
    /// entry is in the AV: after every client of that peer was released and its entry removed,
    /// rxm keeps reporting the removed index for the peer's still-open connection, and the next
    /// insert may already have taken that index, so a late message can name the newcomer (held
    /// by `tests/messages_senders.rs`; libfabric 1.17 and 2.6.0). A message that must never be
    /// misattributed then says in its content who sent it. libfabric 2.x's native tcp names
    /// senders the same way, late messages included. Other providers, as opened here, give
    /// `None`.
    pub sender: Option<sys::fi_addr_t>,
}

/// `source` as a receive's sender: `None` for the values that name nobody.
pub(super) fn named(source: sys::fi_addr_t) -> Option<sys::fi_addr_t> {
    (sys::FI_ADDR_NOTAVAIL != source && sys::FI_ADDR_UNSPEC != source).then_some(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_that_name_nobody_are_none() {
        assert_eq!(None, named(sys::FI_ADDR_NOTAVAIL));
        assert_eq!(None, named(sys::FI_ADDR_UNSPEC));
        assert_eq!(Some(0), named(0));
        assert_eq!(Some(7), named(7));
    }
}
