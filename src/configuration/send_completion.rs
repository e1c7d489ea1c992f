//! When a message's send completes ([`SendCompletion`]).

#[cfg(doc)] // for the docs' links
use super::{Configuration, PeerProtocol};
use dma_libfabric_sys as sys;

/// When [`send`](crate::endpoint::LibfabricEndpoint::send) and
/// [`send_from`](crate::endpoint::LibfabricEndpoint::send_from) complete
/// ([`Configuration::send_completion`]). It decides what the transmit queue is opened with
/// (`tx_attr.op_flags`), so it is the endpoint's, not a send's.
///
/// It matters on tcp (tcp;ofi_rxm, and native tcp on 2.x); other providers' sends complete as
/// the provider defines either way (efa's reliable datagrams once the peer acknowledged them).
///
/// ```
/// use dma_libfabric::{Configuration, SendCompletion};
///
/// assert_eq!(SendCompletion::Acknowledged, Configuration::default().send_completion);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SendCompletion {
    /// A send completes once the peer's provider has the message: the transmit queue is opened
    /// with `FI_TRANSMIT_COMPLETE`, which tcp implements as an acknowledgement the peer's provider
    /// sends back (a 16-byte message of its own per send). So a send to a peer that died before
    /// reading it completes with an error, and the peer is marked; a peer that stops reading
    /// holds at most its share of sends in flight
    /// ([`max_operations_per_peer`](Configuration::max_operations_per_peer)), whatever the
    /// kernel's socket buffers could absorb. The default.
    #[default]
    Acknowledged,
    /// A send completes once the provider has written it to the socket (no
    /// `FI_TRANSMIT_COMPLETE`: how libfabric's own fabtests send). Faster on tcp: no
    /// acknowledgement for the peer's provider to send before it hands the message over, nor for
    /// this side to read (`docs/benchmarks.md` has the figures). What it gives up:
    /// - a send written just before its peer died completes `Ok`, and its message is lost with
    ///   no error: learn of delivery from the peer (a reply), as request and response protocols
    ///   do anyway;
    /// - a peer that stops reading is not bounded by its sends in flight, which complete while
    ///   the kernel's socket buffers take them: on a [`PeerProtocol::Credited`] endpoint (the
    ///   default) its receive window bounds what it is sent, but on a
    ///   [`PeerProtocol::Plain`] one, nothing but those buffers does.
    Local,
}

impl SendCompletion {
    /// The `tx_attr.op_flags` a tcp endpoint is opened with (other providers are asked for none:
    /// `open`'s hints).
    pub(crate) fn tx_op_flags(self) -> u64 {
        match self {
            Self::Acknowledged => u64::from(sys::FI_TRANSMIT_COMPLETE),
            Self::Local => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_default_asks_for_an_acknowledgement() {
        assert_eq!(
            u64::from(sys::FI_TRANSMIT_COMPLETE),
            SendCompletion::default().tx_op_flags()
        );
        assert_eq!(0, SendCompletion::Local.tx_op_flags());
    }
}
