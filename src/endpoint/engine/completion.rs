//! What an operation is ([`Operation`]) and what its completion says ([`Completion`]): the
//! values every face of the engine hands its callers, whichever sink delivered them.

#[cfg(doc)]
use crate::endpoint::LibfabricEndpoint;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// Which operation a completion is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// An `fi_write`: local memory into a peer's.
    Write,
    /// An `fi_read`: a peer's memory into local memory.
    Read,
    /// An `fi_send` of registered memory ([`LibfabricEndpoint::send_from`]).
    Send,
    /// An `fi_recv` into registered memory ([`LibfabricEndpoint::receive_into`]); its
    /// completion's `len` is the length received.
    Receive,
}

impl Operation {
    /// The libfabric call that posts it.
    pub fn call(self) -> &'static str {
        match self {
            Self::Write => "fi_write",
            Self::Read => "fi_read",
            Self::Send => "fi_send",
            Self::Receive => "fi_recv",
        }
    }
}

/// The completion of one RMA operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The id the caller chose when posting.
    pub id: u64,
    /// What was posted.
    pub operation: Operation,
    /// How many bytes were to be transferred; for a [`receive_into`](LibfabricEndpoint::receive_into),
    /// how many were received.
    pub len: usize,
    /// Who sent a [`receive_into`](LibfabricEndpoint::receive_into)'s message: the sender's index
    /// in this endpoint's address vector, as [`Received::sender`](crate::endpoint::Received::sender)
    /// says (on a credited endpoint the sender that proved its secret, on a plain one the index
    /// the provider names); `None` for every other operation.
    pub sender: Option<sys::fi_addr_t>,
    /// `Ok` when the transfer is complete: for a read, its bytes are here; for a write, the
    /// target holds them (under the default
    /// [`WriteCompletion::Delivered`](crate::configuration::WriteCompletion::Delivered); under
    /// `Local`, the provider has sent them, and on tcp they land when the target progresses); [`DmaError::PeerUnreachable`] naming the peer's `fi_addr_t` when the provider
    /// says its connection was refused, reset or lost (tcp's provider errors `ECONNREFUSED`,
    /// `ECONNRESET`, `ECONNABORTED`, `ENOTCONN`, `EPIPE`, `EHOSTDOWN`, `EHOSTUNREACH`,
    /// `ENETUNREACH`, `ESHUTDOWN`, `ETIMEDOUT`: the one list of `av::unreachable`); the
    /// error entry's detail otherwise ([`DmaError::Fabric`] naming the operation's call, whose
    /// `code` is the negative `FI_E*` error, `-FI_ECANCELED` for a cancelled one, and whose
    /// message has the provider's own text from `fi_cq_strerror`).
    pub result: Result<(), DmaError>,
}
