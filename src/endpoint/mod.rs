//! A safe libfabric reliable-datagram endpoint.
//!
//! What the endpoint opens, what its types enforce and what it guarantees a user are on
//! [`LibfabricEndpoint`], where a user reads them. This module holds the endpoint, its
//! [`Description`] and its `Drop` order; the rooms below hold its concerns one each: `open`,
//! `handles` (the libfabric objects and their close), `messaging`, `receive`, `sends` and
//! `senders` (the copying sends and receives), `receiving` (reading the receive queue, in its
//! order), `credits` (what a receiver grants each peer, and what a sender may send), `budget`
//! (what one peer may have in flight), `engine` (the operations in flight: one slab, one submit
//! path, one reaper, one way to deliver), `rma`, `vectored` and `in_flight` (RMA operations and
//! their age), `memory`, `buffer` and `access` (registration, and a `Local` region's access word),
//! `completions`, `wait` and `deadline` (reading and sleeping on the queues), `lookup` (reading
//! the AV back).

mod access;
mod budget;
mod buffer;
pub(crate) mod completions;
mod credits;
pub(crate) mod deadline;
pub(crate) mod engine;
mod error_entry;
mod handles;
mod in_flight;
mod lookup;
pub(crate) mod memory;
mod messaging;
mod open;
mod receive;
mod receiving;
pub(crate) mod rma;
mod senders;
mod sends;
pub(crate) mod vectored;
pub(crate) mod wait;

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

/// The access word of a `Local` region, for the loom models (`loom_tests/`).
#[cfg(dma_loom)]
pub use self::access::AccessWord;
pub use self::buffer::{RegionSlice, StableBuffer};
pub use self::credits::CreditStats;
pub use self::engine::{Completion, MAX_OPERATIONS, Operation};
use self::error_entry::read_error_entry;
use self::handles::Handles;
pub use self::in_flight::OverdueOperation;
/// A slot's post record, for the loom model `posted_at` (`loom_tests/`).
#[cfg(dma_loom)]
pub use self::in_flight::PostedAt;
pub use self::memory::registration::{Exposure, MemoryInterface};
pub use self::memory::{MemoryRegion, PooledBuffer, RemoteRegion, Segment};
use self::receive::ReceiveSlots;
/// The four RMA calls, written once for the endpoint and the rail set (see `rma::calls`).
pub(crate) use self::rma::{RmaCall, rma_calls};
pub use self::senders::Received;
pub use self::sends::{MAX_SEND_COPY, MAX_SENDS};
pub use self::vectored::{MAX_PIECES, Notification};
/// The completion waiters' hand-off and its deadline, for the loom models (`loom_tests/`).
#[cfg(dma_loom)]
pub use self::{deadline::Deadline, wait::Handoff};
use crate::av::fabric::{self as av, HandedOut};
use crate::cache::AddressCache;
#[cfg(doc)] // for the docs' links
use crate::cache::Peer;
#[cfg(doc)]
use crate::configuration::Configuration;
use crate::error::DmaError;

/// What `fi_getinfo` chose, as [`LibfabricEndpoint::describe`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The provider name, e.g. `tcp;ofi_rxm`.
    pub provider: String,
    /// The fabric name, e.g. `127.0.0.1/32`.
    pub fabric: String,
    /// The domain name, e.g. `lo`.
    pub domain: String,
    /// `fi_info.addr_format` (`FI_SOCKADDR_IN`, `FI_ADDR_EFA`, ...).
    pub addr_format: u32,
    /// The provider's address length in bytes: what `fi_av_insert` reads per address.
    pub address_len: usize,
    /// The domain's threading model (`FI_THREAD_SAFE` here).
    pub threading: u32,
    /// The address vector type (`FI_AV_TABLE` here).
    pub av_type: u32,
    /// The provider's inject size (`tx_attr.inject_size`). [`send`](LibfabricEndpoint::send)
    /// does not inject (an inject asks for no completion, so its failure is never reported);
    /// only the opt-in [`inject_within`](LibfabricEndpoint::inject_within) does, up to this
    /// size. See [`max_send_size`](Self::max_send_size).
    pub inject_size: usize,
    /// Whether received messages name their sender: the provider took `FI_SOURCE` (tcp;ofi_rxm
    /// and native tcp are asked for it). When `false`, every
    /// [`Received::sender`](Received::sender) and receive's
    /// [`Completion::sender`](Completion::sender) is `None`; when `true`, `None` means a sender
    /// that is not in this endpoint's address vector.
    pub reports_senders: bool,
    /// The largest message [`LibfabricEndpoint::send`] copies and sends: the configuration's
    /// `receive_size`, at most [`MAX_SEND_COPY`].
    pub max_send_size: usize,
    /// How many sends may be in flight at once (the transmit queue's depth, `tx_attr.size`,
    /// within the completion queue's and [`MAX_SENDS`]): past it, a send answers
    /// [`DmaError::WouldBlock`] and posts nothing. One peer may have at most its budget of them in
    /// flight ([`max_sends_in_flight_per_peer`](Self::max_sends_in_flight_per_peer)).
    pub max_sends_in_flight: usize,
    /// How many sends one peer may have in flight: its whole budget,
    /// [`max_operations_per_peer`](Self::max_operations_per_peer), within
    /// [`max_sends_in_flight`](Self::max_sends_in_flight).
    pub max_sends_in_flight_per_peer: usize,
    /// How many operations of every kind one peer incarnation may have in flight
    /// ([`Configuration::max_operations_per_peer`](crate::configuration::Configuration::max_operations_per_peer)),
    /// so a peer that stops reading leaves the rest of the slots to the others.
    pub max_operations_per_peer: usize,
}

/// How long `open` keeps posting a receive buffer the provider answers `-FI_EAGAIN` for, driving
/// progress meanwhile, before it gives up with [`DmaError::Fabric`].
pub const RECEIVE_POST_PATIENCE: Duration = Duration::from_secs(1);

/// A reliable-datagram endpoint with its address vector, completion queues and address cache.
///
/// [`open`](Self::open) walks the configured providers in order and opens, for the first that
/// offers an `FI_EP_RDM` endpoint: the fabric, a domain with `FI_THREAD_SAFE` threading (so many
/// threads post on one endpoint), an `FI_AV_TABLE` address vector sized to
/// [`Configuration::av_capacity`], one completion queue for transmits and one for receives, and
/// the enabled endpoint. It owns an [`AddressCache`] over that address vector
/// ([`peers`](Self::peers)), which posting threads use to turn peer addresses into `fi_addr_t`s.
///
/// `Send` and `Sync`: many threads post, receive and drive progress on one endpoint at once,
/// while its cache's writer thread inserts into and removes from the address vector. That is
/// sound only because `open` accepts nothing but an `FI_THREAD_SAFE` domain, in which libfabric
/// serialises those calls itself. An `FI_THREAD_DOMAIN` domain (efa-direct's) leaves every call
/// on the domain, its endpoints, queues and AV, to be serialised by the application; the endpoint
/// has no such lock yet, so it refuses that provider rather than be `Sync` over it.
///
/// ```
/// use dma_libfabric::{Configuration, LibfabricEndpoint, SEAL_LEN, SOCKADDR_IN_LEN};
///
/// let endpoint = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
/// assert_eq!("tcp;ofi_rxm", endpoint.describe().provider);
/// // A sockaddr_in, sealed: credited endpoints (the default) prove who they are.
/// assert_eq!(SOCKADDR_IN_LEN + SEAL_LEN, endpoint.local_address()?.len());
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
///
/// # What the types enforce
///
/// - **Posting takes a [`Peer`], never a raw index.** [`send`](LibfabricEndpoint::send),
///   [`send_within`](LibfabricEndpoint::send_within) and [`try_send`](LibfabricEndpoint::try_send)
///   take a `Peer<'_>`, which only a [`Pinned`](crate::cache::Pinned) resolve makes and which
///   borrows that pin: the borrow checker refuses a post after the pin is dropped, so safe code
///   cannot post to an index the cache has since removed or handed to another peer (the
///   `compile_fail` example on `send` shows it). A peer resolved by another endpoint's cache is
///   refused with [`DmaError::InvalidArgument`] before libfabric sees it: its index means nothing
///   in this AV. So is a peer of a second cache built with `FabricAv::from_raw` on this endpoint's
///   AV: the check is by cache, not by AV. Posting to a raw `fi_addr_t` is `unsafe`
///   ([`send_raw`](LibfabricEndpoint::send_raw) and friends), with the caller's promises written
///   down. Sends copy the message into a slot of the endpoint's own before they return; a send
///   may still be in flight against the index once the pin drops (see "Guarantees" below for
///   what each provider does then).
/// - **`lookup` reads only indices this AV has handed out.**
///   [`lookup`](LibfabricEndpoint::lookup) answers `None`, without calling libfabric, for an
///   index at or past the AV's capacity or past the highest index a
///   [`FabricAv`](crate::av::FabricAv) on this AV has been given by `fi_av_insert` (the
///   endpoint's own cache, and `FabricAv::from_raw` backends on its AV). libfabric 1.17 crashes
///   on the others.
/// - **Nothing waits for ever.** `open` refuses more receive buffers than the provider's receive
///   queue holds (`rx_attr.size`), posting them at `open` gives up after
///   [`RECEIVE_POST_PATIENCE`] of `-FI_EAGAIN`, a send gives up after its timeout, and `receive`
///   returns `None` after its own. A receive buffer whose re-post fails is kept and posted again
///   by a later [`try_receive`](LibfabricEndpoint::try_receive) or
///   [`progress`](LibfabricEndpoint::progress); the message it held is returned all the same.
///   Every timeout takes any `Duration`: one too long for an `Instant` (`Duration::MAX`) is no
///   deadline, and the call waits as long as its own completion takes, rather than panic on the
///   overflow.
/// - **Every size is checked before libfabric or the allocator sees it**
///   ([`Configuration::validate`], then the provider's own limits once `fi_getinfo` has
///   answered), with a [`DmaError::InvalidArgument`] naming the value and the bound: libfabric
///   rounds queue and AV sizes up to a power of two and multiplies them without an overflow
///   check, so a size past the bound opened an endpoint that corrupted the heap, or crashed.
/// - **Providers whose demands the endpoint cannot meet are refused at `open`**, with the reason
///   in [`DmaError::NoProvider`]: threading other than `FI_THREAD_SAFE` (the endpoint is `Sync`,
///   and the cache's writer thread inserts into the AV while other threads post; efa-direct is
///   `FI_THREAD_DOMAIN`), `FI_MR_LOCAL` (the copying `send`/`receive` path posts from slots the
///   crate does not register, so they have no descriptors; efa-direct requires it), and
///   `FI_ADDR_STR` addresses (shm: strings that `fi_av_insert` reads up to their NUL, whatever
///   length the cache checked).
///
/// # Guarantees
///
/// - Dropping the endpoint first drops its cache, which runs every pending `fi_av_remove`, and
///   only then closes the endpoint, the queues, the address vector, the domain and the fabric,
///   in that order. Nothing is leaked, file descriptors included.
/// - Receive buffers are owned by the endpoint and outlive its libfabric objects.
/// - A failure part-way through `open` closes what was opened and reports which call failed.
/// - Sends are bounded and never lost without an error: at most
///   [`Description::max_sends_in_flight`] (the transmit queue's depth) are in flight, counted
///   until their completion is read, and past it a send answers [`DmaError::WouldBlock`] with
///   nothing posted. A failed send is counted ([`LibfabricEndpoint::failed_sends`]) and logged,
///   and once the provider reports a peer gone every later send to it answers
///   [`DmaError::PeerUnreachable`] until it is resolved anew. Dropping the endpoint counts the
///   sends still in flight after [`LibfabricEndpoint::SEND_DRAIN_PATIENCE`] as discarded
///   ([`LibfabricEndpoint::discarded_sends`], and a `warn`). A send holds no lease: tcp;ofi_rxm
///   finishes a send whose entry was removed meanwhile; efa frees it without a completion,
///   which keeps its slot counted.
/// - RMA operations in flight ([`write`](Self::write), [`read`](Self::read) and the rest that
///   return an [`Operation`]) hold their lease and local memory until their completion has been
///   read; dropping the endpoint drains them, or abandons them after closing the endpoint, before
///   the cache and the domain close.
pub struct LibfabricEndpoint {
    /// Dropped by hand, first, in `Drop`: its writer removes every entry before the AV closes.
    peers: ManuallyDrop<AddressCache>,
    handles: Handles,
    /// Declared after `handles` so it is dropped after the endpoint has been closed.
    receives: ReceiveSlots,
    /// The control receives of the credit protocol (none for a plain endpoint): after
    /// `handles`, as `receives`.
    controls: ReceiveSlots,
    /// The credit protocol's state; `None` for a plain endpoint
    /// ([`PeerProtocol::Plain`](crate::configuration::PeerProtocol::Plain)).
    credits: Option<Box<credits::Credits>>,
    /// Boxed: read rarely, and it keeps the endpoint small to move.
    description: Box<Description>,
    /// The indices `FabricAv` backends on this AV have been handed, and the AV's capacity: what
    /// `lookup` may read.
    handed_out: Arc<HandedOut>,
    /// Test-only fault injection: how many of the next receive posts fail without reaching
    /// `fi_recv`, with `-FI_EIO`, or with `-FI_EAGAIN` while `posts_ask_to_retry` is set.
    #[cfg(test)]
    failing_posts: std::sync::atomic::AtomicUsize,
    #[cfg(test)]
    posts_ask_to_retry: std::sync::atomic::AtomicBool,
    /// RMA operations in flight (see `rma`): drained in `Drop` before the cache goes, and
    /// declared after `handles` so their contexts outlive the endpoint.
    operations: Box<engine::Operations>,
}

// SAFETY: `open` refuses any domain whose threading is not FI_THREAD_SAFE (see `refusal`), so
// libfabric serialises concurrent calls on the endpoint, its queues and its address vector
// itself; FI_THREAD_DOMAIN, which would leave that serialisation to the caller, is refused
// rather than honoured. Receive slots are handed between threads only through completions and the
// slab's locked list of unposted slots (see `receive`), the record of handed-out indices is
// atomic, and every other field is immutable after `open`.
unsafe impl Send for LibfabricEndpoint {}
// SAFETY: as for `Send`.
unsafe impl Sync for LibfabricEndpoint {}

impl std::fmt::Debug for LibfabricEndpoint {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("LibfabricEndpoint")
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

impl Drop for LibfabricEndpoint {
    fn drop(&mut self) {
        // Sends still in flight are counted as discarded (they hold nothing but their slot).
        self.shut_down_sends();
        // RMA operations hold leases on the cache and registrations in the domain: first.
        self.shut_down_operations();
        // SAFETY: dropped exactly once, here, before `handles` closes the address vector it
        // removes from; `peers` is not used again.
        unsafe { ManuallyDrop::drop(&mut self.peers) };
        av::unregister(self.handles.av);
    }
}

/// A libfabric return code as a result.
fn check(call: &'static str, code: impl Into<i64>) -> Result<(), DmaError> {
    let code = code.into();
    if 0 == code {
        Ok(())
    } else {
        Err(DmaError::fabric(call, code))
    }
}
