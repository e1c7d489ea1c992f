//! How an endpoint is opened: which providers to try, where to bind, how big the address vector
//! is.

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

/// How to open a [`LibfabricEndpoint`](crate::LibfabricEndpoint).
///
/// The default is the embedded one that works on any Linux host: tcp on 127.0.0.1.
///
/// ```
/// use dma_libfabric::{Configuration, Provider};
///
/// let configuration = Configuration::default();
/// assert_eq!(vec![Provider::Tcp], configuration.providers);
/// assert_eq!(4096, configuration.av_capacity);
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
    /// Whether the endpoint does RMA: registers memory and posts `fi_write` and `fi_read`
    /// ([`LibfabricEndpoint::register`](crate::LibfabricEndpoint::register),
    /// [`write`](crate::LibfabricEndpoint::write), [`read`](crate::LibfabricEndpoint::read)).
    /// Only then are `FI_RMA` capabilities asked of `fi_getinfo`, so an endpoint that only sends
    /// and receives costs what it did before. Default `false`.
    pub rma: bool,
}

impl Default for Configuration {
    fn default() -> Self {
        Self {
            providers: vec![Provider::Tcp],
            bind: Some("127.0.0.1".to_string()),
            av_capacity: 4096,
            receive_buffers: 64,
            receive_size: 4096,
            rma: false,
        }
    }
}
