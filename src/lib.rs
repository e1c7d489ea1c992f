//! dma-libfabric: a lock-free address-vector cache and a safe endpoint for data-transfer servers
//! on libfabric (RDMA NICs, AWS EFA, or the tcp provider on any host).
//!
//! - [`endpoint`]: [`LibfabricEndpoint`], a reliable-datagram endpoint with its AV and queues.
//! - [`address`]: [`AddressFormat`], which bytes of an address name a peer.
//! - [`cache`]: [`AddressCache`], wait-free hits, one writer, epoch-deferred `fi_av_remove`.
//!
//! ```
//! use std::time::Duration;
//! use dma_libfabric::{Configuration, LibfabricEndpoint};
//!
//! let server = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
//! let client = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
//! let address = client.local_address()?;
//! std::thread::scope(|scope| {
//!     // tcp progresses manually: the client accepts the connection while it polls.
//!     let received = scope.spawn(|| client.receive(Duration::from_secs(10)));
//!     let pinned = server.peers().pin();
//!     let peer = pinned.resolve(1, &address)?;
//!     server.send(peer.fi_addr(), b"ping")?;
//!     assert_eq!(Some(b"ping".to_vec()), received.join().expect("receiver")?);
//!     Ok::<(), dma_libfabric::DmaError>(())
//! })?;
//! # Ok::<(), dma_libfabric::DmaError>(())
//! ```

pub mod address;
pub mod cache;
pub mod configuration;
pub mod endpoint;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod sync;

/// The raw bindings, for code that calls libfabric itself.
pub use libfabric_sys as sys;

pub use address::AddressFormat;
#[cfg(any(test, feature = "model"))]
pub use cache::model::{AvEvent, ModelAv};
pub use cache::{AddressCache, AvBackend, CacheStats, Lease, Peer, Pinned};
pub use configuration::{Configuration, Provider};
pub use endpoint::{
    Completion, Description, FabricAv, LibfabricEndpoint, MemoryRegion, Operation, RemoteRegion,
    Segment,
};
pub use error::DmaError;
