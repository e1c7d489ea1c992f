//! How an endpoint is opened: which providers to try, where to bind, how big the address vector
//! and the queues are, and how much memory rxm gives each endpoint.
//!
//! The queue sizes ([`Configuration::tx_size`], [`Configuration::rx_size`],
//! [`Configuration::cq_size`]) go to libfabric with each endpoint, as `fi_getinfo` hints and the
//! `fi_cq_attr` size. rxm's buffers cannot: when and how they apply, and what they cost, is on
//! [`RxmSizing`], where a user reads it; `initialisation::before_getinfo` is the first open's part of it.

use std::ffi::CStr;
use std::ptr;

use crate::error::DmaError;
use dma_libfabric_sys as sys;

mod credits;
mod initialisation;
mod rxm;
mod write_completion;
pub use self::credits::{DEFAULT_RECEIVE_MEMORY_LIMIT, PeerProtocol, ReceiveWindow};
pub(crate) use self::initialisation::{before_getinfo, rxm_eager_limit};
pub use self::rxm::RxmSizing;
pub use self::write_completion::WriteCompletion;

/// A libfabric provider, by the name `fi_getinfo` knows it.
///
/// ```
/// use dma_libfabric::Provider;
///
/// assert_eq!("tcp;ofi_rxm", Provider::Tcp.name());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// TCP sockets under the RxM utility provider, which makes them reliable datagrams. Works on
    /// any host, loopback included.
    Tcp,
    /// libfabric 2.x's native tcp reliable-datagram endpoint (provider `tcp` alone, no RxM).
    /// libfabric 1.x's tcp has no RDM endpoint, so there this provider is turned down.
    TcpNative,
    /// AWS Elastic Fabric Adapter.
    Efa,
    /// AWS EFA's direct path (libfabric 2.x: fabric `efa-direct` of provider `efa`).
    EfaDirect,
    /// InfiniBand / RoCE verbs under RxM.
    Verbs,
    /// Shared memory, for peers on one host.
    Shm,
    /// The legacy sockets provider.
    Sockets,
    /// UDP under the RxD utility provider.
    Udp,
}

impl Provider {
    /// The provider name handed to `fi_getinfo` (`fabric_attr.prov_name`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp;ofi_rxm",
            Self::TcpNative => "tcp",
            Self::Efa | Self::EfaDirect => "efa",
            Self::Verbs => "verbs;ofi_rxm",
            Self::Shm => "shm",
            Self::Sockets => "sockets",
            Self::Udp => "udp;ofi_rxd",
        }
    }

    /// The fabric name to ask for, where the provider offers several.
    pub fn fabric(self) -> Option<&'static str> {
        match self {
            Self::EfaDirect => Some("efa-direct"),
            _ => None,
        }
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.fabric() {
            Some(fabric) => write!(formatter, "{} ({fabric})", self.name()),
            None => formatter.write_str(self.name()),
        }
    }
}

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
    /// The most address-vector entries an endpoint may be opened for
    /// ([`av_capacity`](Self::av_capacity)): 2^20, 1,048,576 peers.
    ///
    /// `fi_info` gives no limit for an address vector's size, so this is a ceiling of the
    /// crate's own. Everything sized by the capacity is allocated up front, not as peers arrive:
    /// the cache's index and its lease counters at `open`, and libfabric 1.17's table of
    /// `count` entries (rounded up to a power of two) at the first insert, so an endpoint's
    /// resident memory after its first peer grows with the capacity (figures:
    /// `docs/benchmarks.md`, "Figures moved out of the module docs"); a capacity of
    /// `usize::MAX` panics in the index's allocation, 2^40 aborts on it, and above 2^63
    /// libfabric's power-of-two rounding wraps to 0. A million peers is more than one endpoint
    /// of a data-transfer server addresses on any fabric this crate targets.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError};
    ///
    /// let too_many = Configuration {
    ///     av_capacity: Configuration::MAX_AV_CAPACITY + 1,
    ///     ..Configuration::default()
    /// };
    /// assert!(matches!(too_many.validate(), Err(DmaError::InvalidArgument(_))));
    /// ```
    pub const MAX_AV_CAPACITY: usize = 1 << 20;

    /// The deepest completion queue an endpoint may ask for ([`cq_size`](Self::cq_size)): 2^22,
    /// 4,194,304 entries.
    ///
    /// `fi_info` gives no limit for a completion queue's depth (`domain_attr.cq_cnt` is how many
    /// queues, not how deep), and libfabric does not check the size it is given: its utility
    /// queue (tcp, rxm, and most software providers) allocates `size` rounded up to a power of
    /// two entries of 48 bytes with no overflow check, so a size above 2^58 wraps that product
    /// and one above 2^63 rounds to 0, and the queue then writes past a small allocation (sizes
    /// of `usize::MAX` and 2^63 + 1 opened an endpoint that later corrupted the heap; 2^60 and
    /// 2^63 crashed). 2^22 is the depth of the deepest hardware queues (ConnectX reports a
    /// `max_cqe` of 2^22 - 1), and costs libfabric's utility queue 192 MiB of address space for
    /// each of the endpoint's two queues, which the kernel backs only as entries are written.
    /// An endpoint never has more completions outstanding than its posted receives
    /// ([`receive_buffers`](Self::receive_buffers), at most the provider's `rx_attr.size`) and
    /// RMA operations ([`MAX_OPERATIONS`](crate::endpoint::MAX_OPERATIONS)) plus failed sends.
    ///
    /// ```
    /// use dma_libfabric::Configuration;
    ///
    /// let deepest = Configuration { cq_size: Configuration::MAX_CQ_SIZE, ..Configuration::default() };
    /// assert_eq!(Ok(()), deepest.validate());
    /// ```
    pub const MAX_CQ_SIZE: usize = 1 << 22;

    /// The largest receive buffer an endpoint may post ([`receive_size`](Self::receive_size)):
    /// 2^30 bytes, 1 GiB, unless the provider's own limit (`ep_attr.max_msg_size`) is lower.
    ///
    /// tcp;ofi_rxm reports a `max_msg_size` of `SIZE_MAX`, so this ceiling is the crate's own.
    /// Every one of the [`receive_buffers`](Self::receive_buffers) is allocated at `open` and
    /// stays posted for the endpoint's life, and [`receive`](crate::endpoint::LibfabricEndpoint::receive)
    /// copies each message into a fresh `Vec`: a message of more than a gibibyte is bulk data,
    /// which belongs to RMA ([`rma`](Self::rma)), not to a two-sided receive. The buffers are
    /// allocated fallibly: memory that cannot be had is an error from `open`, not an abort.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError};
    ///
    /// let huge = Configuration { receive_size: 1 << 40, ..Configuration::default() };
    /// let Err(DmaError::InvalidArgument(reason)) = huge.validate() else {
    ///     panic!("a receive buffer past the bound");
    /// };
    /// assert!(reason.contains("1099511627776") && reason.contains("1073741824"), "{reason}");
    /// ```
    pub const MAX_RECEIVE_SIZE: usize = 1 << 30;

    /// Check every size this configuration gives against its bounds, before anything reaches
    /// libfabric or the allocator; [`LibfabricEndpoint::open`](crate::endpoint::LibfabricEndpoint::open)
    /// calls it first. What only the provider knows (its `tx_attr.size`, `rx_attr.size` and
    /// `ep_attr.max_msg_size`) is checked by `open` once `fi_getinfo` has answered.
    ///
    /// The bounds: at least one provider; `av_capacity` from 1 to
    /// [`MAX_AV_CAPACITY`](Self::MAX_AV_CAPACITY); `receive_buffers` at least 1, and at most
    /// `cq_size` and `rx_size` (every posted receive may complete before the queue is read);
    /// `receive_size` from 1 to [`MAX_RECEIVE_SIZE`](Self::MAX_RECEIVE_SIZE); `cq_size` at most
    /// [`MAX_CQ_SIZE`](Self::MAX_CQ_SIZE); and rxm's sizes ([`RxmSizing::validate`]).
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError};
    ///
    /// assert_eq!(Ok(()), Configuration::default().validate());
    /// let huge = Configuration { cq_size: usize::MAX, ..Configuration::default() };
    /// let Err(DmaError::InvalidArgument(reason)) = huge.validate() else {
    ///     panic!("a queue deeper than the bound");
    /// };
    /// assert!(reason.contains(&usize::MAX.to_string()), "{reason}");
    /// assert!(reason.contains(&Configuration::MAX_CQ_SIZE.to_string()), "{reason}");
    /// ```
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] naming the first value out of bounds, the value and the
    /// bound.
    pub fn validate(&self) -> Result<(), DmaError> {
        if self.providers.is_empty() {
            return Err(DmaError::InvalidArgument("no providers configured".into()));
        }
        within(
            "av_capacity",
            self.av_capacity,
            1,
            Self::MAX_AV_CAPACITY,
            "Configuration::MAX_AV_CAPACITY",
        )?;
        within(
            "cq_size",
            self.cq_size,
            1,
            Self::MAX_CQ_SIZE,
            "Configuration::MAX_CQ_SIZE",
        )?;
        within(
            "receive_size",
            self.receive_size,
            1,
            Self::MAX_RECEIVE_SIZE,
            "Configuration::MAX_RECEIVE_SIZE",
        )?;
        if 0 == self.receive_buffers {
            return Err(DmaError::InvalidArgument(
                "receive_buffers is 0, below the bound of 1: an endpoint keeps at least one \
                 receive posted"
                    .into(),
            ));
        }
        if self.cq_size < self.receive_buffers
            || self.rx_size.is_some_and(|size| size < self.receive_buffers)
        {
            return Err(DmaError::InvalidArgument(format!(
                "receive_buffers is {}, and the queues must hold every posted receive: \
                 cq_size is {} and rx_size {:?}; raise them to at least {} (rx_size: None \
                 takes the provider's own depth)",
                self.receive_buffers, self.cq_size, self.rx_size, self.receive_buffers
            )));
        }
        if 0 == self.max_operations_per_peer {
            return Err(DmaError::InvalidArgument(
                "max_operations_per_peer is 0, below the bound of 1: a peer with no budget could \
                 never be sent to"
                    .into(),
            ));
        }
        if self.cache_patience > Self::MAX_CACHE_PATIENCE {
            return Err(DmaError::InvalidArgument(format!(
                "cache_patience is {:?}, above the bound of {:?} \
                 (Configuration::MAX_CACHE_PATIENCE)",
                self.cache_patience,
                Self::MAX_CACHE_PATIENCE
            )));
        }
        self.receive_window.validate()?;
        if self.receive_memory_limit < self.receive_window.cost() {
            return Err(DmaError::InvalidArgument(format!(
                "receive_memory_limit is {} bytes, below the {} one receive_window costs \
                 (ReceiveWindow::cost): no peer could be granted a whole window",
                self.receive_memory_limit,
                self.receive_window.cost()
            )));
        }
        self.rxm.validate()
    }

    /// The default [`max_operations_per_peer`](Self::max_operations_per_peer): 32 (why, on the
    /// field).
    pub const DEFAULT_MAX_OPERATIONS_PER_PEER: usize = 32;

    /// The default [`cache_patience`](Self::cache_patience): 5 s, the cache's own
    /// [`AddressCache::DEFAULT_PATIENCE`](crate::cache::AddressCache::DEFAULT_PATIENCE).
    pub const DEFAULT_CACHE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

    /// The longest [`cache_patience`](Self::cache_patience) may be: an hour. A wait longer than
    /// that is a hung server, not a patient one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, DmaError};
    ///
    /// let endless = Configuration { cache_patience: Duration::MAX, ..Configuration::default() };
    /// assert!(matches!(endless.validate(), Err(DmaError::InvalidArgument(_))));
    /// ```
    pub const MAX_CACHE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3600);

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
            peer_protocol: PeerProtocol::Credited,
            receive_window: ReceiveWindow::default(),
            receive_memory_limit: DEFAULT_RECEIVE_MEMORY_LIMIT,
        }
    }
}

/// `Ok` when `low <= value <= high`, else an error naming the field, its value and the bound
/// it crossed (`high` under the name `bound`).
fn within(field: &str, value: usize, low: usize, high: usize, bound: &str) -> Result<(), DmaError> {
    if value < low {
        return Err(DmaError::InvalidArgument(format!(
            "{field} is {value}, below the bound of {low}"
        )));
    }
    if value > high {
        return Err(DmaError::InvalidArgument(format!(
            "{field} is {value}, above the bound of {high} ({bound})"
        )));
    }
    Ok(())
}

/// The runtime libfabric's API version as `(major, minor)`: `fi_version()` of the library this
/// process loaded, which may differ from the headers it was built against.
///
/// ```
/// let (major, _minor) = dma_libfabric::runtime_version();
/// assert!(major >= 1);
/// ```
pub fn runtime_version() -> (u32, u32) {
    // SAFETY: fi_version takes nothing, touches no state and returns a number.
    let version = unsafe { sys::fi_version() };
    (version >> 16, version & 0xffff)
}

/// The providers compiled into the runtime libfabric, core and utility providers alike, by
/// the names `fi_getinfo` knows (`efa`, `tcp`, `ofi_rxm`, ...): what `fi_info -l` lists. A
/// provider listed here may still offer no endpoint on this host (efa without a device).
///
/// ```
/// let providers = dma_libfabric::compiled_providers()?;
/// assert!(providers.iter().any(|name| name == "tcp"));
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
///
/// # Errors
/// [`DmaError::Fabric`] when `fi_getinfo` fails.
pub fn compiled_providers() -> Result<Vec<String>, DmaError> {
    before_getinfo(&Configuration::default());
    let mut info: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: no node, service or hints; fi_getinfo writes one list head into `info`, freed
    // below. FI_PROV_ATTR_ONLY asks for one entry per provider with its fabric attributes.
    let code = unsafe {
        sys::fi_getinfo(
            sys::dmafab_version(),
            ptr::null(),
            ptr::null(),
            sys::FI_PROV_ATTR_ONLY,
            ptr::null(),
            &raw mut info,
        )
    };
    if 0 != code {
        return Err(DmaError::fabric("fi_getinfo", code.into()));
    }
    let mut names = Vec::new();
    let mut entry = info;
    while !entry.is_null() {
        // SAFETY: every entry of the list fi_getinfo returned is valid until fi_freeinfo; its
        // fabric_attr and prov_name are null or valid, the name NUL-terminated.
        unsafe {
            let fabric = (*entry).fabric_attr;
            if !fabric.is_null() && !(*fabric).prov_name.is_null() {
                let name = CStr::from_ptr((*fabric).prov_name).to_string_lossy();
                if !names.iter().any(|known| *known == name) {
                    names.push(name.into_owned());
                }
            }
            entry = (*entry).next;
        }
    }
    // SAFETY: the list fi_getinfo returned, freed once, after its last use above.
    unsafe { sys::fi_freeinfo(info) };
    Ok(names)
}

/// Turn down what `fi_getinfo` chose when it is not what `provider` promises: asked for `tcp`
/// alone, libfabric 1.x layers rxm over it by itself, since its tcp has no reliable-datagram
/// endpoint of its own.
pub(crate) fn check_chosen(provider: Provider, chosen: &str) -> Result<(), DmaError> {
    if provider == Provider::TcpNative && chosen != provider.name() {
        let (major, minor) = runtime_version();
        return Err(DmaError::Fabric {
            call: "fi_getinfo",
            code: -i64::from(sys::FI_ENODATA),
            message: format!(
                "libfabric {major}.{minor}'s tcp has no reliable-datagram endpoint of its own \
                 (fi_getinfo offered {chosen}): use Provider::Tcp"
            ),
        });
    }
    Ok(())
}

/// The error for a `fi_getinfo` of `provider` that found nothing (`-FI_ENODATA`), saying why as
/// far as libfabric lets us see: a provider that is not compiled in, or one that is but offers
/// no matching endpoint here (no device, or no reliable-datagram endpoint in this version).
pub(crate) fn no_data(provider: Provider) -> DmaError {
    let code = -i64::from(sys::FI_ENODATA);
    let (major, minor) = runtime_version();
    let compiled = compiled_providers().unwrap_or_default();
    let missing: Vec<&str> = provider
        .name()
        .split(';')
        .filter(|name| !compiled.iter().any(|known| known == name))
        .collect();
    let why = if !missing.is_empty() {
        format!(
            "{} not compiled into this libfabric {major}.{minor} (fi_info -l lists {})",
            missing.join(" and "),
            compiled.join(" ")
        )
    } else {
        let rxm = matches!(provider, Provider::Tcp | Provider::Verbs)
            .then(RxmSizing::environment_misfit)
            .flatten()
            .map(|reason| format!(" ({reason})"));
        let hint = match provider {
            Provider::Efa | Provider::EfaDirect => " (no efa device on this host?)",
            Provider::TcpNative if major < 2 => {
                " (libfabric 1.x's tcp has no reliable-datagram endpoint: use Provider::Tcp)"
            }
            _ => rxm.as_deref().unwrap_or(""),
        };
        format!(
            "{} is compiled into libfabric {major}.{minor} but offers no thread-safe \
             reliable-datagram endpoint here{hint}",
            provider.name()
        )
    };
    DmaError::Fabric {
        call: "fi_getinfo",
        code,
        message: format!("{}: {why}", crate::error::strerror(code)),
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

    /// `configuration` is accepted: a value at its bound is taken.
    fn accepted(configuration: Configuration) {
        assert_eq!(Ok(()), configuration.validate());
    }

    /// `configuration` is refused for `value`, past `bound`, with a reason naming both.
    fn refused(configuration: Configuration, value: usize, bound: usize) {
        match configuration.validate() {
            Err(DmaError::InvalidArgument(reason)) => {
                assert!(
                    reason.contains(&format!("is {value},")),
                    "{value} in {reason}"
                );
                assert!(
                    reason.contains(&format!("bound of {bound}")),
                    "{bound} in {reason}"
                );
            }
            other => panic!("expected InvalidArgument for {value}, got {other:?}"),
        }
    }

    /// Each of the endpoint's sizes refuses the value past its bound (above and below), naming
    /// both, and takes the value at it.
    #[test]
    fn every_endpoint_size_is_checked_against_its_bounds() {
        let base = Configuration::default;
        accepted(Configuration {
            av_capacity: Configuration::MAX_AV_CAPACITY,
            ..base()
        });
        refused(
            Configuration {
                av_capacity: Configuration::MAX_AV_CAPACITY + 1,
                ..base()
            },
            Configuration::MAX_AV_CAPACITY + 1,
            Configuration::MAX_AV_CAPACITY,
        );
        refused(
            Configuration {
                av_capacity: 0,
                ..base()
            },
            0,
            1,
        );
        accepted(Configuration {
            cq_size: Configuration::MAX_CQ_SIZE,
            ..base()
        });
        refused(
            Configuration {
                cq_size: usize::MAX,
                ..base()
            },
            usize::MAX,
            Configuration::MAX_CQ_SIZE,
        );
        accepted(Configuration {
            receive_size: Configuration::MAX_RECEIVE_SIZE,
            ..base()
        });
        refused(
            Configuration {
                receive_size: Configuration::MAX_RECEIVE_SIZE + 1,
                ..base()
            },
            Configuration::MAX_RECEIVE_SIZE + 1,
            Configuration::MAX_RECEIVE_SIZE,
        );
        refused(
            Configuration {
                receive_size: 0,
                ..base()
            },
            0,
            1,
        );
        refused(
            Configuration {
                receive_buffers: 0,
                ..base()
            },
            0,
            1,
        );
    }

    #[test]
    fn an_empty_provider_list_is_refused() {
        assert!(matches!(
            Configuration {
                providers: Vec::new(),
                ..Configuration::default()
            }
            .validate(),
            Err(DmaError::InvalidArgument(_))
        ));
    }

    /// Each of rxm's sizes refuses the value past its bound, naming both (`msg_rx_size` without
    /// the shared receive context is bound by `msg_tx_size`'s bound), and all take the value at
    /// their bound at once.
    #[test]
    fn every_rxm_size_is_checked_against_its_bounds() {
        let rxm = |sizing: RxmSizing| Configuration {
            rxm: sizing,
            ..Configuration::default()
        };
        let none = RxmSizing::provider_defaults;
        for (sizing, value, bound) in [
            (
                RxmSizing {
                    buffer_size: Some(usize::MAX),
                    ..none()
                },
                usize::MAX,
                RxmSizing::MAX_BUFFER_SIZE,
            ),
            (
                RxmSizing {
                    tx_size: Some(RxmSizing::MAX_TX_SIZE + 1),
                    ..none()
                },
                RxmSizing::MAX_TX_SIZE + 1,
                RxmSizing::MAX_TX_SIZE,
            ),
            (
                RxmSizing {
                    rx_size: Some(usize::MAX),
                    ..none()
                },
                usize::MAX,
                RxmSizing::MAX_RX_SIZE,
            ),
            (
                RxmSizing {
                    msg_tx_size: Some(1025),
                    ..none()
                },
                1025,
                RxmSizing::MAX_MSG_TX_SIZE,
            ),
            (
                RxmSizing {
                    msg_rx_size: Some(usize::MAX),
                    ..none()
                },
                usize::MAX,
                RxmSizing::MAX_MSG_RX_SIZE,
            ),
            (
                RxmSizing {
                    msg_rx_size: Some(2048),
                    use_srx: Some(false),
                    ..none()
                },
                2048,
                RxmSizing::MAX_MSG_TX_SIZE,
            ),
            (
                RxmSizing {
                    msg_tx_size: Some(0),
                    ..none()
                },
                0,
                1,
            ),
        ] {
            refused(rxm(sizing), value, bound);
        }
        accepted(rxm(RxmSizing {
            buffer_size: Some(RxmSizing::MAX_BUFFER_SIZE),
            tx_size: Some(RxmSizing::MAX_TX_SIZE),
            rx_size: Some(RxmSizing::MAX_RX_SIZE),
            msg_tx_size: Some(RxmSizing::MAX_MSG_TX_SIZE),
            msg_rx_size: Some(RxmSizing::MAX_MSG_RX_SIZE),
            use_srx: None,
        }));
    }

    #[test]
    fn more_receive_buffers_than_the_completion_queue_holds_are_refused() {
        assert!(matches!(
            Configuration { receive_buffers: 513, ..Configuration::default() }.validate(),
            Err(DmaError::InvalidArgument(reason)) if reason.contains("513") && reason.contains("cq_size is 512")
        ));
    }

    #[test]
    fn the_runtime_version_is_at_least_the_oldest_supported() {
        let (major, minor) = runtime_version();
        assert!((major, minor) >= (1, 17), "{major}.{minor}");
    }
}
