//! dma-libfabric: a lock-free address-vector cache and a safe endpoint for data-transfer servers
//! on libfabric (RDMA NICs, AWS EFA, or the tcp provider on any host).
//!
//! The modules, bottom up; each uses only those above it (`tests/layout.rs` checks it):
//!
//! - [`sys`]: the raw libfabric bindings (the `dma-libfabric-sys` crate).
//! - [`error`], [`address`], [`configuration`]: the error type, which bytes of an address name a
//!   peer ([`AddressFormat`]), and how an endpoint is opened.
//! - [`av`]: the address-vector layer: [`AvBackend`], the real [`FabricAv`], the model AV.
//! - [`cache`]: [`AddressCache`], wait-free hits, one writer, epoch-deferred `fi_av_remove`,
//!   [`Lease`]s for operations in flight.
//! - [`endpoint`]: [`LibfabricEndpoint`], a reliable-datagram endpoint that owns its AV, its
//!   queues and a cache over that AV.
//! - [`rails`]: [`RailSet`], one endpoint per NIC driven as one: a client resolved on every rail
//!   at once, memory on every rail, transfers striped across them.
//!
//! What the types enforce: safe code posts only to a [`Peer`], which a [`Pinned`] resolve makes
//! and which cannot outlive that pin, so it cannot post to an index the cache has removed or
//! handed to another peer; a peer of another endpoint's cache is refused with
//! [`DmaError::InvalidArgument`]. Posting to a raw `fi_addr_t` is `unsafe`
//! ([`LibfabricEndpoint::send_raw`]). [`LibfabricEndpoint::lookup`] reads only indices the AV has
//! handed out, and every wait on libfabric is bounded. See the [`endpoint`] module docs.
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
//!     let pinned = server.cache().pin();
//!     let peer = pinned.resolve(1, &address)?;
//!     server.send(peer, b"ping")?; // a `Peer`, valid while `pinned` lives
//!     assert_eq!(Some(b"ping".to_vec()), received.join().expect("receiver")?);
//!     Ok::<(), dma_libfabric::DmaError>(())
//! })?;
//! # Ok::<(), dma_libfabric::DmaError>(())
//! ```

pub mod address;
#[cfg(feature = "tokio")]
pub mod asynchronous;
pub mod av;
pub mod cache;
pub mod configuration;
pub mod endpoint;
pub mod error;
pub mod rails;
pub(crate) mod sync;

/// The raw bindings, for code that calls libfabric itself.
pub use dma_libfabric_sys as sys;

pub use address::AddressFormat;
#[cfg(any(test, feature = "model"))]
pub use av::model::{AvEvent, ModelAv};
pub use av::{AvBackend, FabricAv};
pub use cache::{AddressCache, CacheStats, Lease, Peer, Pinned};
pub use configuration::{Configuration, Provider, RxmSizing};
pub use endpoint::{
    Completion, Description, Exposure, LibfabricEndpoint, MemoryInterface, MemoryRegion,
    Notification, Operation, OverdueOperation, PooledBuffer, Received, RegionSlice, RemoteRegion,
    Segment, StableBuffer,
};
pub use error::DmaError;
/// Deprecated names, kept one release (see `CHANGELOG.md`).
#[allow(deprecated)] // the old name itself, re-exported where it was
pub use rails::RailsPinned;
pub use rails::{
    MAX_RAILS, MIN_STRIPE, RailCaches, RailLease, RailPeers, RailPinned, RailRegion,
    RailRemoteRegion, RailSegment, RailSet,
};

/// The README's first program, run as a doc test so the front page cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's server (`docs/guide.md`), run as a doc test so the guide cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct GuideDoctests;
