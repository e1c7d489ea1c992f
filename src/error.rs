//! The one error type of the crate.
//!
//! Every fallible call returns [`DmaError`]. A libfabric failure carries the call that failed,
//! its return code and `fi_strerror`'s text, so a log line names what went wrong without a
//! debugger. Bad input (an address of the wrong length, an oversized message) is reported before
//! any libfabric call is made, and changes nothing.

use std::ffi::CStr;

/// What went wrong.
///
/// ```
/// use dma_libfabric::DmaError;
///
/// let error = DmaError::InvalidAddress("efa addresses are 32 bytes, this one is 3".into());
/// assert!(error.to_string().contains("32 bytes"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DmaError {
    /// A libfabric call returned an error.
    #[error("{call} failed with {code}: {message}")]
    Fabric {
        /// The libfabric call, as the man pages name it.
        call: &'static str,
        /// Its return code (a negative `FI_E*` value for most calls).
        code: i64,
        /// `fi_strerror`'s text for the code, or the provider's own text where it gave one.
        message: String,
    },
    /// None of the configured providers gave a reliable-datagram endpoint.
    #[error("no provider gave a reliable-datagram (FI_EP_RDM) endpoint; tried {tried}")]
    NoProvider {
        /// Each provider tried, with why it was turned down.
        tried: String,
    },
    /// An address that cannot be handed to `fi_av_insert`: empty, not the provider's length, or
    /// all zero bytes (what a peer advertises before `fi_getname` has run, on every provider).
    #[error("invalid address: {0}")]
    InvalidAddress(String),
    /// The address vector holds as many entries as it was opened for.
    ///
    /// libfabric up to 2.6 grows a full table by reallocating it while other threads post
    /// against it, so the cache refuses to grow it. Releasing clients makes room again once their
    /// entries' deferred removals have run.
    #[error(
        "the address vector is full: it was opened for {capacity} entries (Configuration::av_capacity), \
         counting entries still waiting for their deferred removal"
    )]
    Capacity {
        /// `Configuration::av_capacity`.
        capacity: usize,
    },
    /// The provider asks for something the endpoint cannot honour yet (a threading model other
    /// than `FI_THREAD_SAFE`, `FI_MR_LOCAL`, `FI_ADDR_STR` addresses), so `open` turns it down
    /// and says why; [`DmaError::NoProvider`] lists it among the providers tried.
    #[error("the provider asks for what this endpoint cannot honour yet: {0}")]
    Unsupported(String),
    /// An argument the call cannot take, with what was wrong with it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The address cache's writer thread has stopped, so nothing more can be resolved.
    #[error("the address cache is closed: its writer thread has stopped")]
    Closed,
    /// The call would have had to wait longer than it was allowed to. What was left behind
    /// depends on the call, and its docs say which:
    /// - a resolve ([`Pinned::try_resolve`](crate::cache::Pinned::try_resolve), a bounded lease) has
    ///   been handed to the writer; resolving again under a later pin finds its result (when
    ///   nothing could be queued, `try_resolve` answers [`DmaError::Busy`] instead);
    /// - a send or an RMA post ([`LibfabricEndpoint::write`](crate::endpoint::LibfabricEndpoint::write) and
    ///   friends) was **not** posted: the provider still pushed back (a full queue, or a peer that
    ///   has not accepted the connection yet, which on tcp;ofi_rxm 1.17 is also how a peer whose
    ///   process has gone looks, and how a peer whose rxm eager limit differs looks: rxm refuses a
    ///   connection between processes whose `FI_OFI_RXM_BUFFER_SIZE`
    ///   ([`RxmSizing::buffer_size`](crate::configuration::RxmSizing::buffer_size)) differ, and
    ///   says so only in its own log) when its timeout ran out;
    /// - a wait ([`LibfabricEndpoint::wait_for`](crate::endpoint::LibfabricEndpoint::wait_for)) timed out
    ///   and the operation is still in flight.
    #[error(
        "the operation would block: not done within its timeout (a resolve stays queued for the \
         writer; a send or RMA post was not posted: the provider pushed back for the whole \
         timeout, with a full queue or a connection not accepted yet, which on tcp;ofi_rxm is \
         also how a peer whose port refuses connections looks, and a peer whose rxm eager limit \
         differs: rxm refuses connections between processes whose FI_OFI_RXM_BUFFER_SIZE \
         (RxmSizing::buffer_size) differ; a waited-for operation is still in flight)"
    )]
    WouldBlock,
    /// The call would have to wait for something this call cannot wait on; nothing was queued
    /// and nothing changed. Try again.
    ///
    /// - The address cache's writer's inbox is full
    ///   ([`AddressCache::INBOX_BOUND`](crate::cache::AddressCache::INBOX_BOUND) requests), so
    ///   [`Pinned::try_resolve`](crate::cache::Pinned::try_resolve) queued nothing (a later
    ///   `try_resolve` queues the miss once the writer has made room, or
    ///   [`Pinned::resolve`](crate::cache::Pinned::resolve) waits for room).
    /// - A [`MemoryRegion`](crate::endpoint::MemoryRegion) of the application's memory is in use: an
    ///   operation holds it or a post waits for it (so it lends no slice and gives no buffer
    ///   back), or a slice of it stayed lent for the whole of a post's patience (so the operation
    ///   was not posted). See [`StableBuffer`](crate::endpoint::StableBuffer).
    #[error(
        "busy: the address cache's writer's inbox is full, or the memory region is held by an \
         operation or a lent slice; nothing was queued or changed; try again"
    )]
    Busy,
    /// The provider reported the peer's connection refused, reset or otherwise given up, so the
    /// operation was not (or will never be) delivered. Returned at once, not after a retry
    /// budget, and by every later operation to the same peer until it is resolved anew.
    #[error("peer {peer:#x}{} is unreachable: {reason}", client_text(*.client))]
    PeerUnreachable {
        /// The peer's `fi_addr_t`, as the operation was posted against it.
        peer: u64,
        /// The client the operation was posted for ([`Peer::client`](crate::cache::Peer::client),
        /// [`Lease::client`](crate::cache::Lease::client)); `None` for a post to a raw
        /// `fi_addr_t` (`send_raw` and friends), which names no client.
        client: Option<u64>,
        /// What the provider said (its error text and code).
        reason: String,
    },
    /// A blocking call of the address cache ([`AddressCache::lease`](crate::cache::AddressCache::lease),
    /// `lease_all`, `lease_within`, a rail set's lease) waited as long as the cache's patience
    /// allows ([`Configuration::cache_patience`](crate::configuration::Configuration::cache_patience)) for a new
    /// incarnation whose old one has not left the address vector yet. The request stays queued:
    /// once the old incarnation's leases are dropped and its readers unpinned, the same call
    /// finds the entry. A thread that holds one of those leases itself (wherever it was taken)
    /// must drop it first.
    #[error(
        "client {client} waited out the address cache's patience: the old incarnation it waits \
         behind still has {leases} lease(s) out and has waited {held_for:?} for its removal"
    )]
    OutOfPatience {
        /// The client whose entry waited.
        client: u64,
        /// How many leases the old incarnation had out when the wait ended (0 while it waits for
        /// readers pinned at its unlink, or when the writer did not answer in time).
        leases: u64,
        /// How long the old incarnation had been waiting for its removal when the wait ended.
        held_for: std::time::Duration,
    },
}

impl DmaError {
    /// The error for libfabric call `call` that returned `code`.
    pub(crate) fn fabric(call: &'static str, code: i64) -> Self {
        Self::Fabric {
            call,
            code,
            message: strerror(code),
        }
    }
}

/// `fi_strerror` of a return code, whichever sign it was returned with.
pub(crate) fn strerror(code: i64) -> String {
    let Ok(errno) = i32::try_from(code.unsigned_abs()) else {
        return format!("unknown error {code}");
    };
    // SAFETY: fi_strerror takes any integer and returns a pointer to a static, NUL-terminated
    // string (or NULL, checked below); it keeps no state.
    let text = unsafe { dma_libfabric_sys::fi_strerror(errno) };
    if text.is_null() {
        return format!("unknown error {code}");
    }
    // SAFETY: non-null and NUL-terminated, as fi_strerror promises; it is static, so it outlives
    // the copy made here.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

impl DmaError {
    /// This error, naming `client` if it is a [`DmaError::PeerUnreachable`] that names none: for
    /// the paths that post to a `Peer` through its raw index.
    pub(crate) fn for_client(self, client: u64) -> Self {
        match self {
            Self::PeerUnreachable {
                peer,
                client: None,
                reason,
            } => Self::PeerUnreachable {
                peer,
                client: Some(client),
                reason,
            },
            other => other,
        }
    }
}

/// `PeerUnreachable`'s words for its client: " (client N)", or nothing for a raw post.
fn client_text(client: Option<u64>) -> String {
    client.map_or_else(String::new, |client| format!(" (client {client})"))
}
