//! When a write's completion is reported ([`WriteCompletion`]).

#[cfg(doc)] // for the docs' links
use super::Configuration;
use dma_libfabric_sys as sys;

/// When [`write`](crate::endpoint::LibfabricEndpoint::write),
/// [`write_gather`](crate::endpoint::LibfabricEndpoint::write_gather) and
/// [`write_with_data`](crate::endpoint::LibfabricEndpoint::write_with_data) complete
/// ([`Configuration::write_completion`]).
///
/// ```
/// use dma_libfabric::{Configuration, WriteCompletion};
///
/// assert_eq!(WriteCompletion::Delivered, Configuration::default().write_completion);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WriteCompletion {
    /// The write completes once the target holds the bytes: it is posted with
    /// `FI_DELIVERY_COMPLETE`, and a provider that honours it reports the completion only after
    /// the target's provider has placed the data in the target's memory and acknowledged it (tcp
    /// and tcp;ofi_rxm, libfabric 1.17 and 2.6.0: the target acknowledges after the last byte is
    /// in its region; RC verbs and efa complete a write only once the target acknowledged it
    /// anyway). So "done" means "there": a server may tell a client through any other channel
    /// that its pages are written. The target must progress for the acknowledgement, as it must
    /// for the bytes to land at all. The default.
    #[default]
    Delivered,
    /// The write completes once the provider has sent it (`FI_COMPLETION` alone): on tcp, once
    /// the bytes are in the local socket. Faster on tcp (no round trip before the completion),
    /// but a completed write's bytes may still be on their way: the target sees them only once it
    /// has progressed, and a target that stops progressing, or dies, before that never has them,
    /// while the initiator read `Ok`. Choose it only where the target learns of the write another
    /// way that follows the data (a notification, `write_with_data`, or a message sent after it
    /// on the same endpoint).
    Local,
}

impl WriteCompletion {
    /// The flags an `fi_writemsg` asks with.
    pub(crate) fn flags(self) -> u64 {
        match self {
            Self::Delivered => u64::from(sys::FI_COMPLETION | sys::FI_DELIVERY_COMPLETE),
            Self::Local => u64::from(sys::FI_COMPLETION),
        }
    }
}
