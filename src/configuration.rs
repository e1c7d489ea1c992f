//! How an endpoint is opened: which providers to try, where to bind, how big the address vector
//! and the queues are, and how much memory rxm gives each endpoint.
//!
//! # Endpoint sizing
//!
//! The queue sizes ([`Configuration::tx_size`], [`Configuration::rx_size`],
//! [`Configuration::cq_size`]) go to libfabric with each endpoint: they are `fi_getinfo` hints
//! and the `fi_cq_attr` size.
//!
//! rxm's buffers ([`RxmSizing`]) cannot be chosen per endpoint: rxm reads them from
//! `FI_OFI_RXM_*` environment variables once, when libfabric initialises its providers (the
//! process's first `fi_getinfo`), and every later endpoint of the process uses them. rxm's own
//! defaults (16 KiB bounce buffers, pools of 1,024 of them for each direction) cost each endpoint
//! tens of MB and tens of milliseconds to open. Since `setenv` is not thread safe, the library
//! never sets them behind the caller's back; the rule is:
//!
//! - call [`Configuration::apply_rxm_environment`] at the start of `main`, before any thread is
//!   spawned and before the first endpoint opens, or
//! - set the variables [`Configuration::rxm_environment`] lists in the environment the process
//!   is started with (a launcher, a systemd unit).
//!
//! A variable already present in the environment wins over the configuration. When the sizing
//! was not applied, [`LibfabricEndpoint::open`](crate::LibfabricEndpoint::open) still works, with
//! rxm's defaults (and their cost).
//!
//! What the sizing buys (`examples/open_cost`, tcp;ofi_rxm on 127.0.0.1, 16 endpoints held
//! open, medians; the README has the table): on libfabric 1.17 an endpoint costs 5.3 MiB of
//! resident memory instead of 68.5 MiB, on 2.6.0 21 MiB instead of 132 MiB, and opens several
//! times faster.

use std::ffi::CStr;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::DmaError;
use crate::sys;

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

/// Set once this process has called `fi_getinfo` through this crate: from then on rxm has read
/// its environment variables and setting them no longer changes anything.
static LIBFABRIC_INITIALISED: AtomicBool = AtomicBool::new(false);

/// Record that libfabric has been initialised (called before every `fi_getinfo`).
pub(crate) fn note_libfabric_initialised() {
    LIBFABRIC_INITIALISED.store(true, Ordering::Release);
}

/// rxm's buffer sizes, which libfabric reads only from `FI_OFI_RXM_*` environment variables at
/// provider initialisation (see the [module docs](self) for when and how they are applied).
/// `None` leaves rxm's own default.
///
/// Read in libfabric 1.17 and 2.6.0's `prov/rxm/src/rxm_init.c`, and measured with
/// `examples/open_cost`. Over tcp, rxm by default shares one receive context among all of an
/// endpoint's connections, `msg_rx_size` deep, and its bounce-buffer pools grow in chunks of
/// 1,024 buffers of `buffer_size` bytes: those two set what an endpoint costs when it opens.
///
/// ```
/// use dma_libfabric::{Configuration, RxmSizing};
///
/// let sizing = RxmSizing::default();
/// assert_eq!(Some(4096), sizing.buffer_size);
/// let names: Vec<_> = Configuration::default().rxm_environment().into_iter().map(|(name, _)| name).collect();
/// assert!(names.contains(&"FI_OFI_RXM_BUFFER_SIZE"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RxmSizing {
    /// `FI_OFI_RXM_BUFFER_SIZE`: the size of each bounce buffer, and so rxm's eager limit
    /// (larger messages go by rendezvous). rxm's default is 16,384; the default here, 4,096,
    /// matches [`Configuration::receive_size`].
    pub buffer_size: Option<usize>,
    /// `FI_OFI_RXM_TX_SIZE`: the largest transmit queue depth rxm offers, and what it gives
    /// when the hints ask for none (rxm's default 2,048). [`Configuration::tx_size`] asks per
    /// endpoint instead, and must not exceed it; the default leaves it alone.
    pub tx_size: Option<usize>,
    /// `FI_OFI_RXM_RX_SIZE`: the largest receive queue depth rxm offers, and what it gives when
    /// the hints ask for none (rxm's default 2,048). [`Configuration::rx_size`] asks per
    /// endpoint instead, and must not exceed it; the default leaves it alone.
    pub rx_size: Option<usize>,
    /// `FI_OFI_RXM_MSG_TX_SIZE`: the transmit depth of each connection rxm opens to a peer
    /// (rxm's default 128).
    pub msg_tx_size: Option<usize>,
    /// `FI_OFI_RXM_MSG_RX_SIZE`: the depth of the shared receive context that rxm over tcp
    /// uses by default for all its connections (rxm's default 4,096), or of each connection's
    /// own receive queue without one (rxm's default 128). The default here is 512: enough
    /// messages in flight for a server, and an endpoint of 5 MiB (libfabric 1.17) or 21 MiB
    /// (2.6.0) rather than 20 or 83 MiB with 4,096.
    pub msg_rx_size: Option<usize>,
    /// `FI_OFI_RXM_USE_SRX`: whether connections share one receive context (rxm's default over
    /// tcp). Without it an endpoint opens in about a millisecond and holds 0.5 MiB, but every
    /// connection posts its own `msg_rx_size` bounce buffers (128 x 4 KiB = 512 KiB a peer), so
    /// a server with many peers keeps it; `None` leaves rxm's default.
    pub use_srx: Option<bool>,
}

impl Default for RxmSizing {
    fn default() -> Self {
        Self {
            buffer_size: Some(4096),
            tx_size: None,
            rx_size: None,
            msg_tx_size: None,
            msg_rx_size: Some(512),
            use_srx: None,
        }
    }
}

impl RxmSizing {
    /// rxm's own defaults: no variable set.
    pub fn provider_defaults() -> Self {
        Self {
            buffer_size: None,
            tx_size: None,
            rx_size: None,
            msg_tx_size: None,
            msg_rx_size: None,
            use_srx: None,
        }
    }
}

/// How to open a [`LibfabricEndpoint`](crate::LibfabricEndpoint).
///
/// The default is the embedded one that works on any Linux host: tcp on 127.0.0.1, with queues
/// and buffers sized for a server with many peers and small messages (see the
/// [module docs](self) for rxm's buffers).
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
    pub providers: Vec<Provider>,
    /// The local node to open on (an IP address for tcp), unless `open` is given one. `None`
    /// lets the provider choose, as efa wants.
    pub bind: Option<String>,
    /// How many address-vector entries the endpoint may hold (`fi_av_attr.count`). The cache
    /// never grows the table past it, because libfabric up to 2.6 grows it without a lock.
    pub av_capacity: usize,
    /// How many receive buffers stay posted.
    pub receive_buffers: usize,
    /// The size of each receive buffer, and so the largest message received.
    pub receive_size: usize,
    /// The transmit queue depth asked of the provider (the `tx_attr.size` hint): how many sends
    /// may be outstanding before the provider answers `FI_EAGAIN`. `None` takes the provider's
    /// default (rxm: 2,048 or `FI_OFI_RXM_TX_SIZE`; native tcp: 65,536). A provider that cannot
    /// offer this much is turned down.
    pub tx_size: Option<usize>,
    /// The receive queue depth asked of the provider (the `rx_attr.size` hint); at least
    /// `receive_buffers`. `None` takes the provider's default.
    pub rx_size: Option<usize>,
    /// The size of each completion queue (`fi_cq_attr.size`); at least `receive_buffers`, since
    /// every posted receive may complete before the queue is read.
    pub cq_size: usize,
    /// Whether the endpoint does RMA: registers memory and posts `fi_write` and `fi_read`
    /// ([`LibfabricEndpoint::register`](crate::LibfabricEndpoint::register),
    /// [`write`](crate::LibfabricEndpoint::write), [`read`](crate::LibfabricEndpoint::read)).
    /// Only then are `FI_RMA` capabilities asked of `fi_getinfo`, so an endpoint that only sends
    /// and receives costs what it did before. Default `false`.
    pub rma: bool,
    /// rxm's buffer sizes. They take effect only once applied to the environment before
    /// libfabric initialises; see [`apply_rxm_environment`](Self::apply_rxm_environment).
    pub rxm: RxmSizing,
}

impl Configuration {
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
        if LIBFABRIC_INITIALISED.load(Ordering::Acquire) {
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
        }
    }
}

/// The runtime libfabric's API version as `(major, minor)`: `fi_version()` of the library this
/// process loaded, which may differ from the headers it was built against.
///
/// ```
/// let (major, _minor) = dma_libfabric::configuration::runtime_version();
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
/// let providers = dma_libfabric::configuration::compiled_providers()?;
/// assert!(providers.iter().any(|name| name == "tcp"));
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
///
/// # Errors
/// [`DmaError::Fabric`] when `fi_getinfo` fails.
pub fn compiled_providers() -> Result<Vec<String>, DmaError> {
    note_libfabric_initialised();
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
        let hint = match provider {
            Provider::Efa | Provider::EfaDirect => " (no efa device on this host?)",
            Provider::TcpNative if major < 2 => {
                " (libfabric 1.x's tcp has no reliable-datagram endpoint: use Provider::Tcp)"
            }
            _ => "",
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

    #[test]
    fn the_runtime_version_is_at_least_the_oldest_supported() {
        let (major, minor) = runtime_version();
        assert!((major, minor) >= (1, 17), "{major}.{minor}");
    }
}
