//! What a receiver grants each peer, and how endpoints talk to each other: the settings of the
//! credit protocol (`endpoint::credits`).

/// How an endpoint's messages travel, chosen by [`Configuration::peer_protocol`](super::Configuration::peer_protocol).
///
/// ```
/// use dma_libfabric::{Configuration, PeerProtocol};
///
/// assert_eq!(PeerProtocol::Credited, Configuration::default().peer_protocol);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PeerProtocol {
    /// Both sides run this library (the default). Every message is a tagged message whose tag
    /// carries the protocol's version and the sender's secret; a sender introduces itself to a
    /// receiver once (its address and secret), the receiver grants it a window of messages,
    /// bytes and notifications ([`Configuration::receive_window`](super::Configuration::receive_window)),
    /// and the sender sends only while it holds credit: past it, a send (or a
    /// `write_with_data`) waits its patience for a grant, then answers
    /// [`DmaError::WouldBlock`](crate::error::DmaError::WouldBlock). The receiver grants again as the
    /// application reads, so what one peer can make a receiver hold is its window, and what all
    /// of them can is [`Configuration::receive_memory_limit`](super::Configuration::receive_memory_limit).
    #[default]
    Credited,
    /// Plain libfabric messages, without a tag or credits, for a peer that does not run this
    /// library (a C client, a fabtests program): `fi_send` and `fi_recv` as they are, and RMA as
    /// always. Such a peer is bounded by the per-peer budget alone
    /// ([`Configuration::max_operations_per_peer`](super::Configuration::max_operations_per_peer)):
    /// nothing bounds what it makes this endpoint's provider hold when it sends faster than the
    /// application reads (rxm copies every unexpected message into a pool with no maximum), so
    /// use it only towards peers you trust. Both sides must choose the same protocol: a
    /// credited endpoint's messages do not match a plain endpoint's receives, and the reverse.
    Plain,
}

/// What a receiver grants each peer that sends to it, at most, before the application has read
/// any of it (see [`PeerProtocol::Credited`]).
///
/// ```
/// use dma_libfabric::{Configuration, ReceiveWindow};
///
/// let window = Configuration::default().receive_window;
/// assert_eq!(ReceiveWindow { messages: 64, bytes: 1 << 20, notifications: 64 }, window);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveWindow {
    /// Messages one peer may have sent and the application not yet read. At least 1. Default
    /// 64: enough to keep tcp loopback busy with 4 KiB messages, while 64 messages of rxm's
    /// unexpected-message buffers, counted at [`MESSAGE_OVERHEAD`](Self::MESSAGE_OVERHEAD) each,
    /// are 288 KiB a peer.
    pub messages: u32,
    /// Bytes one peer may have sent and the application not yet read: a message is admitted
    /// while the peer has sent fewer bytes than it was granted, so a peer may pass the window by
    /// at most one message. At least 1. Default 1 MiB.
    pub bytes: u64,
    /// Notifications (`write_with_data`) one peer may have made and the application not yet
    /// polled. At least 1. Default 64, an eighth of the default completion queue.
    pub notifications: u32,
}

impl Default for ReceiveWindow {
    fn default() -> Self {
        Self {
            messages: 64,
            bytes: 1 << 20,
            notifications: 64,
        }
    }
}

/// The default [`Configuration::receive_memory_limit`](super::Configuration::receive_memory_limit):
/// 64 MiB.
pub const DEFAULT_RECEIVE_MEMORY_LIMIT: u64 = 64 << 20;

impl ReceiveWindow {
    /// What one granted message or notification is counted as in the receive memory limit,
    /// besides its bytes: rxm holds an unexpected message in a buffer of its own, and 4.5 KiB
    /// covers what that buffer was measured to cost for a small message on libfabric 1.17 and
    /// 2.6.0, tcp;ofi_rxm (figures: `docs/benchmarks.md`, "Figures moved out of the module docs").
    pub const MESSAGE_OVERHEAD: u64 = 4608;

    /// What granting this whole window costs against the receive memory limit: its bytes, plus
    /// [`MESSAGE_OVERHEAD`](Self::MESSAGE_OVERHEAD) per message and per notification.
    #[must_use]
    pub fn cost(&self) -> u64 {
        let units = u64::from(self.messages) + u64::from(self.notifications);
        self.bytes
            .saturating_add(units.saturating_mul(Self::MESSAGE_OVERHEAD))
    }

    /// `Ok` when every field is at least 1, else an error naming the field.
    pub(crate) fn validate(&self) -> Result<(), crate::error::DmaError> {
        let zero = [
            ("messages", 0 == self.messages),
            ("bytes", 0 == self.bytes),
            ("notifications", 0 == self.notifications),
        ]
        .into_iter()
        .find_map(|(field, zero)| zero.then_some(field));
        match zero {
            Some(field) => Err(crate::error::DmaError::InvalidArgument(format!(
                "receive_window.{field} is 0, below the bound of 1: a peer granted nothing can \
                 never send"
            ))),
            None => Ok(()),
        }
    }
}
