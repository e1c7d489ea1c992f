//! How an endpoint is opened: which providers to try, where to bind, how big the address vector
//! and the queues are, and how much memory rxm gives each endpoint.
//!
//! The queue sizes ([`Configuration::tx_size`], [`Configuration::rx_size`],
//! [`Configuration::cq_size`]) go to libfabric with each endpoint, as `fi_getinfo` hints and the
//! `fi_cq_attr` size. rxm's buffers cannot: when and how they apply, and what they cost, is on
//! [`RxmSizing`], where a user reads it; `initialisation::before_getinfo` is the first open's part of it.
//!
//! This file holds [`Configuration`] itself, its defaults and rxm's environment; `bounds` the
//! crate's ceilings and [`Configuration::validate`]; `provider` the [`Provider`]s and what the
//! runtime libfabric offers.

use crate::error::DmaError;

mod bounds;
mod credits;
mod initialisation;
mod provider;
mod rxm;
mod send_completion;
mod write_completion;
pub use self::credits::{DEFAULT_RECEIVE_MEMORY_LIMIT, PeerProtocol, ReceiveWindow};
pub(crate) use self::initialisation::{before_getinfo, rxm_eager_limit};
pub use self::provider::{Provider, compiled_providers, runtime_version};
pub(crate) use self::provider::{check_chosen, no_data};
pub use self::rxm::RxmSizing;
pub use self::send_completion::SendCompletion;
pub use self::write_completion::WriteCompletion;

/// How to open a [`LibfabricEndpoint`](crate::endpoint::LibfabricEndpoint).
///
/// The default is the embedded one that works on any Linux host: tcp on 127.0.0.1, with queues
/// and buffers sized for a server with many peers and small messages (see
/// [`RxmSizing`] for rxm's buffers).
///
/// ```
/// use dma_libfabric::{Configuration, Provider};
///
/// let configuration = Configuration::default();
/// assert_eq!(vec![Provider::Tcp], configuration.providers);
/// assert_eq!(4096, configuration.av_capacity);
/// assert_eq!(Some(256), configuration.tx_size);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configuration {
    /// Providers to try, in order. The first that yields a reliable-datagram endpoint wins.
    /// Default `[Provider::Tcp]` (tcp;ofi_rxm).
    pub providers: Vec<Provider>,
    /// The local node to open on (an IP address for tcp), unless `open` is given one. `None`
    /// lets the provider choose, as efa wants. Default `Some("127.0.0.1")`: loopback, where tcp
    /// works on any host.
    pub bind: Option<String>,
    /// How many address-vector entries the endpoint may hold (`fi_av_attr.count`). The cache
    /// never grows the table past it, because libfabric up to 2.6 grows it without a lock.
    /// From 1 to [`MAX_AV_CAPACITY`](Self::MAX_AV_CAPACITY). Default 4,096.
    pub av_capacity: usize,
    /// How many receive buffers stay posted: at least 1, and at most `cq_size`, `rx_size` and
    /// the provider's receive queue (`rx_attr.size`). Default 64.
    pub receive_buffers: usize,
    /// The size of each receive buffer, and so the largest message received: from 1 to
    /// [`MAX_RECEIVE_SIZE`](Self::MAX_RECEIVE_SIZE) and the provider's `ep_attr.max_msg_size`.
    /// Default 4,096 bytes.
    pub receive_size: usize,
    /// The transmit queue depth asked of the provider (the `tx_attr.size` hint), and so how many
    /// sends the endpoint keeps in flight (counted until their completion is read; past it a
    /// send answers `WouldBlock` and posts nothing: see
    /// [`Description::max_sends_in_flight`](crate::endpoint::Description::max_sends_in_flight)). `None` takes the provider's
    /// default (rxm: 2,048 or `FI_OFI_RXM_TX_SIZE`; native tcp: 65,536), and so does `Some(0)`.
    /// More than the provider accepts (rxm: 16,384) is refused by
    /// [`open`](crate::endpoint::LibfabricEndpoint::open) with [`DmaError::InvalidArgument`] naming the
    /// provider's bound. Default `Some(256)`.
    pub tx_size: Option<usize>,
    /// The receive queue depth asked of the provider (the `rx_attr.size` hint); at least
    /// `receive_buffers`. `None` takes the provider's default. More than the provider accepts
    /// (rxm: 65,536) is refused as for [`tx_size`](Self::tx_size). Default `Some(256)`.
    pub rx_size: Option<usize>,
    /// The size of each completion queue (`fi_cq_attr.size`); at least `receive_buffers`, since
    /// every posted receive may complete before the queue is read, and at most
    /// [`MAX_CQ_SIZE`](Self::MAX_CQ_SIZE). Default 512.
    pub cq_size: usize,
    /// Whether the endpoint does RMA: registers memory and posts `fi_write` and `fi_read`
    /// ([`LibfabricEndpoint::register`](crate::endpoint::LibfabricEndpoint::register),
    /// [`write`](crate::endpoint::LibfabricEndpoint::write), [`read`](crate::endpoint::LibfabricEndpoint::read)).
    /// Only then are `FI_RMA` capabilities asked of `fi_getinfo`, so an endpoint that only sends
    /// and receives costs what it did before. Default `false`.
    pub rma: bool,
    /// Whether `FI_HMEM` (device memory: CUDA, ROCr, Level Zero, Neuron) is asked of
    /// `fi_getinfo`, so that [`register_buffer`](crate::endpoint::LibfabricEndpoint::register_buffer) takes
    /// a buffer whose [`interface`](crate::endpoint::StableBuffer::interface) is a device. A provider that
    /// does not offer it is passed over (tcp on libfabric 1.17 does not). Default `false`.
    pub hmem: bool,
    /// rxm's buffer sizes. They take effect only if they are in the environment when libfabric
    /// initialises: the process's first open puts them there itself when the process has one
    /// thread, and otherwise [`apply_rxm_environment`](Self::apply_rxm_environment) or the
    /// launcher does (see [`RxmSizing`], "When the sizing applies"). Default
    /// [`RxmSizing::default()`]: `buffer_size` 4,096 and `msg_rx_size` 512, the rest rxm's own.
    pub rxm: RxmSizing,
    /// The longest any call of the endpoint's address cache waits
    /// ([`AddressCache::with_patience`](crate::cache::AddressCache::with_patience)): a blocking lease
    /// whose new incarnation waits for an old one's removal answers
    /// [`DmaError::OutOfPatience`] after it, whatever timeout it was given. Default
    /// [`AddressCache::DEFAULT_PATIENCE`](crate::cache::AddressCache::DEFAULT_PATIENCE), 5 s; at most
    /// [`MAX_CACHE_PATIENCE`](Self::MAX_CACHE_PATIENCE).
    pub cache_patience: std::time::Duration,
    /// Whether the endpoint's blocking waits ([`wait_for`](crate::endpoint::LibfabricEndpoint::wait_for),
    /// [`receive`](crate::endpoint::LibfabricEndpoint::receive), a blocking send, the drain) spin on the
    /// completion queues instead of sleeping on their file descriptor. Default `false`: where
    /// the provider offers a wait object (tcp, tcp;ofi_rxm) the queues are opened with
    /// `FI_WAIT_FD` and a wait sleeps between reads, using next to no CPU; `true` opens them
    /// with `FI_WAIT_NONE`, as every provider without a wait object does anyway, and trades a
    /// core per waiting thread for the few microseconds a wake-up costs (see
    /// `docs/completions.md`).
    pub busy_poll: bool,
    /// How many operations one peer may have in flight at once, across every kind the endpoint
    /// posts to a peer: copying sends, `send_from`, `write`, `read`, `write_with_data`,
    /// `write_gather`, `read_scatter` (and so the rail set's stripes, on each rail). Past it, that
    /// peer's next operation waits its patience for one of them to complete, then answers
    /// [`DmaError::WouldBlock`] with nothing posted; other peers are not affected. The count
    /// belongs to the peer's incarnation (its cache entry), not its AV index: a newcomer on a
    /// reused index starts with a full budget.
    ///
    /// Default [`DEFAULT_MAX_OPERATIONS_PER_PEER`](Self::DEFAULT_MAX_OPERATIONS_PER_PEER), 32:
    /// an eighth of the default transmit queue (`tx_size` 256), so that up to seven peers can stop
    /// reading, each holding its whole budget, and the provider still has a quarter of its
    /// transmit queue and operation slots for everyone else; and enough to keep one peer's link
    /// busy (32 writes of 64 KiB in flight fill tcp loopback). Raise it for few peers and deep
    /// pipelines, lower it for many peers. At least 1.
    pub max_operations_per_peer: usize,
    /// When a write (`write`, `write_gather`, `write_with_data`, and the rail set's writes)
    /// completes: once the target holds the bytes ([`WriteCompletion::Delivered`], the default),
    /// or once they are sent ([`WriteCompletion::Local`]: faster on tcp, but a completed write's
    /// bytes may not be there yet; see [`WriteCompletion`] for what each risks).
    pub write_completion: WriteCompletion,
    /// When a message's send (`send`, `send_from`) completes: once the peer's provider
    /// acknowledged it ([`SendCompletion::Acknowledged`], the default: a send to a peer that died
    /// fails, and a stopped peer holds at most its sends in flight), or once it is in the socket
    /// ([`SendCompletion::Local`]: faster on tcp, but a message sent just before its peer died is
    /// lost without an error; see [`SendCompletion`] for what each risks).
    pub send_completion: SendCompletion,
    /// How long a wait for one result (`wait_for`, `receive`, `receive_from`) keeps reading the
    /// queues back to back before it sleeps on their descriptors, on an endpoint whose waits
    /// sleep (not `busy_poll`). A sleep's wake-up costs tens of microseconds, and on a fast path
    /// the answer often comes sooner: a short spin (tens of microseconds) cuts a one-at-a-time
    /// write's or round trip's latency by about half (`docs/benchmarks.md`), at the price of
    /// that much CPU on every wait that outlasts it. Idle waits are not changed beyond the first
    /// spin of each call. `progress_sleeping` never spins. Never past the wait's own timeout;
    /// `Duration::MAX` spins until it. Default `Duration::ZERO`: waits sleep at once.
    pub spin_before_sleep: std::time::Duration,
    /// How messages travel between this endpoint and its peers: with credits
    /// ([`PeerProtocol::Credited`], the default: both sides run this library, and a receiver
    /// bounds what each sender makes it hold), or as plain libfabric messages
    /// ([`PeerProtocol::Plain`], for a peer that does not run this library; bounded by the
    /// per-peer budget alone). Both sides must choose the same.
    pub peer_protocol: PeerProtocol,
    /// What this endpoint grants each peer that sends to it, at most, before the application
    /// has read it: messages, bytes and notifications (see [`ReceiveWindow`]). Credited
    /// endpoints only. Default [`ReceiveWindow::default()`]: 64 messages, 1 MiB, 64
    /// notifications. Every field at least 1.
    pub receive_window: ReceiveWindow,
    /// What all the peers that send to this endpoint may make it hold at once, in bytes: every
    /// grant is paid for out of a pool of this size, a message and a notification counted as
    /// their bytes plus [`ReceiveWindow::MESSAGE_OVERHEAD`] (rxm's buffer for it), and paid back as
    /// the application reads. A peer whose grant the pool cannot pay waits for the next reads.
    /// Credited endpoints only. Default [`DEFAULT_RECEIVE_MEMORY_LIMIT`], 64 MiB; at least one
    /// window's [`cost`](ReceiveWindow::cost).
    pub receive_memory_limit: u64,
}

impl Configuration {
    /// The default [`max_operations_per_peer`](Self::max_operations_per_peer): 32 (why, on the
    /// field).
    pub const DEFAULT_MAX_OPERATIONS_PER_PEER: usize = 32;

    /// The default [`cache_patience`](Self::cache_patience): 5 s, the cache's own
    /// [`AddressCache::DEFAULT_PATIENCE`](crate::cache::AddressCache::DEFAULT_PATIENCE).
    pub const DEFAULT_CACHE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

    /// The `FI_OFI_RXM_*` variables and values [`rxm`](Self::rxm) asks for, for a launcher to
    /// set, or for [`apply_rxm_environment`](Self::apply_rxm_environment).
    pub fn rxm_environment(&self) -> Vec<(&'static str, String)> {
        let sizes = [
            ("FI_OFI_RXM_BUFFER_SIZE", self.rxm.buffer_size),
            ("FI_OFI_RXM_TX_SIZE", self.rxm.tx_size),
            ("FI_OFI_RXM_RX_SIZE", self.rxm.rx_size),
            ("FI_OFI_RXM_MSG_TX_SIZE", self.rxm.msg_tx_size),
            ("FI_OFI_RXM_MSG_RX_SIZE", self.rxm.msg_rx_size),
        ];
        let use_srx = self
            .rxm
            .use_srx
            .map(|on| ("FI_OFI_RXM_USE_SRX", if on { "1" } else { "0" }.to_string()));
        sizes
            .into_iter()
            .filter_map(|(name, value)| value.map(|value| (name, value.to_string())))
            .chain(use_srx)
            .collect()
    }

    /// Set each variable of [`rxm_environment`](Self::rxm_environment) that the environment does
    /// not already hold (what the operator set wins), so that rxm reads them when libfabric
    /// initialises.
    ///
    /// A process whose first open runs while it has one thread needs no call: that open applies
    /// its configuration's sizing itself. Call this where other threads may already run by then
    /// (a tokio runtime started in `main`, say), before any of them starts.
    ///
    /// ```no_run
    /// use dma_libfabric::Configuration;
    ///
    /// let configuration = Configuration::default();
    /// // SAFETY: the first thing this program does: no other thread runs yet.
    /// unsafe { configuration.apply_rxm_environment() }?;
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Safety
    /// `setenv` is not thread safe: no other thread may read or write the environment during the
    /// call (libfabric and libc read it too). Call it at the start of `main`, before spawning
    /// threads.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when this process has already opened an endpoint: libfabric
    /// has read its variables then, and setting them would change nothing. Nothing is set.
    pub unsafe fn apply_rxm_environment(&self) -> Result<(), DmaError> {
        if initialisation::libfabric_initialised() {
            return Err(DmaError::InvalidArgument(
                "rxm's sizing must be applied before the process's first endpoint opens: \
                 libfabric has read FI_OFI_RXM_* already"
                    .into(),
            ));
        }
        for (name, value) in self.rxm_environment() {
            if std::env::var_os(name).is_none() {
                // SAFETY: the caller promises no other thread touches the environment now.
                unsafe { std::env::set_var(name, value) };
            }
        }
        Ok(())
    }
}

impl Default for Configuration {
    fn default() -> Self {
        Self {
            providers: vec![Provider::Tcp],
            bind: Some("127.0.0.1".to_string()),
            av_capacity: 4096,
            receive_buffers: 64,
            receive_size: 4096,
            tx_size: Some(256),
            rx_size: Some(256),
            cq_size: 512,
            rxm: RxmSizing::default(),
            rma: false,
            cache_patience: Self::DEFAULT_CACHE_PATIENCE,
            busy_poll: false,
            hmem: false,
            max_operations_per_peer: Self::DEFAULT_MAX_OPERATIONS_PER_PEER,
            write_completion: WriteCompletion::Delivered,
            send_completion: SendCompletion::Acknowledged,
            spin_before_sleep: std::time::Duration::ZERO,
            peer_protocol: PeerProtocol::Credited,
            receive_window: ReceiveWindow::default(),
            receive_memory_limit: DEFAULT_RECEIVE_MEMORY_LIMIT,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use super::*;

    #[test]
    fn the_environment_lists_only_what_is_chosen() {
        let configuration = Configuration::default();
        assert_eq!(
            vec![
                ("FI_OFI_RXM_BUFFER_SIZE", "4096".to_string()),
                ("FI_OFI_RXM_MSG_RX_SIZE", "512".to_string()),
            ],
            configuration.rxm_environment()
        );
        let mut provider = configuration.clone();
        provider.rxm = RxmSizing::provider_defaults();
        assert!(provider.rxm_environment().is_empty());
        provider.rxm.use_srx = Some(false);
        assert_eq!(
            vec![("FI_OFI_RXM_USE_SRX", "0".to_string())],
            provider.rxm_environment()
        );
    }

    #[test]
    fn applying_after_libfabric_initialised_is_refused() {
        compiled_providers().expect("fi_getinfo");
        // SAFETY: the call refuses before touching the environment, since libfabric has been
        // initialised just above; nothing is set while other test threads run.
        let applied = unsafe { Configuration::default().apply_rxm_environment() };
        assert!(
            matches!(applied, Err(DmaError::InvalidArgument(_))),
            "{applied:?}"
        );
    }
}
