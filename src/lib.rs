//! dma-libfabric: a lock-free address-vector cache and a safe endpoint for data-transfer servers
//! on libfabric (RDMA NICs, AWS EFA, or the tcp provider on any host).
//!
//! Everything is named at the crate root, in the order a server meets it:
//!
//! - Configuration, and opening an endpoint: [`Configuration`], [`LibfabricEndpoint`].
//! - Addresses, and the cache of them an endpoint keeps: [`AddressFormat`], [`AddressCache`]
//!   (wait-free hits, one writer, epoch-deferred `fi_av_remove`) over an [`AvBackend`] such as
//!   the real [`FabricAv`].
//! - Leases and pins: a [`Pinned`] guard resolves a [`Peer`]; a [`Lease`] holds an entry while an
//!   operation is in flight.
//! - Messages: [`LibfabricEndpoint::send`], [`Received`], [`Notification`].
//! - Memory and RMA: [`StableBuffer`], [`MemoryRegion`], [`RemoteRegion`], [`Segment`],
//!   [`Operation`].
//! - Completions: [`Completion`], [`OverdueOperation`].
//! - Rails: [`RailSet`], one endpoint per NIC driven as one: a client resolved on every rail at
//!   once, memory on every rail, transfers striped across them.
//! - Errors: [`DmaError`].
//! - The async API (feature `tokio`): the `asynchronous` module.
//! - The raw libfabric bindings: [`sys`] (the `dma-libfabric-sys` crate).
//!
//! The layers under them (`error`, `address`, `configuration`, `av`, `cache`, `endpoint`,
//! `rails`; `ARCHITECTURE.md` draws them) are private modules, each using only those below it
//! (`tests/layout.rs` checks it).
//!
//! Where the guarantees are: each on the item it is about, in its docs.
//!
//! - [`AddressCache`]: how a hit, a lease, a miss and a removal work, and the cache's eight
//!   guarantees (no ABA, one remove per insert, bounded memory, no wait for ever, ...);
//!   [`AddressCache::with_patience`]: the patience rule that bounds every wait.
//! - [`Lease`]: what holding an entry for an operation in flight guarantees, and what it costs.
//! - [`LibfabricEndpoint`]: what `open` opens, what the types enforce, and the endpoint's own
//!   guarantees (drop order, bounded sends, refused providers);
//!   [`LibfabricEndpoint::send_within`]: how sends are bounded and their failures reported.
//! - [`MemoryRegion`]: a registration's lifetime, why dropped memory is parked and what its reuse
//!   risks; [`PooledBuffer`]: the bound on parked memory; [`StableBuffer`]: who may touch the
//!   bytes of an application's buffer, and why that is sound.
//! - [`OverdueOperation`]: watching operations in flight for a peer that stopped answering.
//! - [`RailSet`]: the rails' mapping, their four guarantees and the argument for them.
//! - [`RxmSizing`]: what an endpoint costs on tcp;ofi_rxm, and when the sizing applies.
//!
//! `docs/guarantees.md` in the repository collects the edges (sizes, timeouts, bounds) with the
//! tests that hold them.
//!
//! What the types enforce: safe code posts only to a [`Peer`], which a [`Pinned`] resolve makes
//! and which cannot outlive that pin, so it cannot post to an index the cache has removed or
//! handed to another peer; a peer of another endpoint's cache is refused with
//! [`DmaError::InvalidArgument`]. Posting to a raw `fi_addr_t` is `unsafe`
//! ([`LibfabricEndpoint::send_raw`]). [`LibfabricEndpoint::lookup`] reads only indices the AV has
//! handed out, and every wait on libfabric is bounded.
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

mod address;
// The tokio API stays a public module, behind its feature: its docs (the driver, cancel safety)
// are the module's, and its `POST_PATIENCE` (how long a future retries a full queue) reads as
// `asynchronous::POST_PATIENCE`, apart from the root's `RECEIVE_POST_PATIENCE` (`open`'s).
#[cfg(feature = "tokio")]
pub mod asynchronous;
mod av;
mod cache;
mod configuration;
mod endpoint;
mod error;
mod rails;
mod sync;

// The bindings stay a module of their own (the `dma-libfabric-sys` crate): libfabric's hundreds
// of names do not belong in this list.
/// The raw bindings, for code that calls libfabric itself.
pub use dma_libfabric_sys as sys;

// Configuration, and opening an endpoint.
pub use configuration::{
    Configuration, DEFAULT_RECEIVE_MEMORY_LIMIT, PeerProtocol, Provider, ReceiveWindow, RxmSizing,
    SendCompletion, WriteCompletion, compiled_providers, runtime_version,
};
pub use endpoint::{Description, LibfabricEndpoint, RECEIVE_POST_PATIENCE};

// Addresses, and the cache of them an endpoint keeps.
pub use address::{AddressFormat, EFA_ADDRESS_LEN, EFA_IDENTITY_LEN, SEAL_LEN, SOCKADDR_IN_LEN};
pub use av::{AvBackend, FabricAv};
pub use cache::{AddressCache, CacheStats};

// The model AV (feature `model`): efa's address rules without an efa device, for tests, loom and
// fuzzing; off the default build's surface.
#[cfg(any(test, feature = "model"))]
pub use av::model::{AvEvent, ModelAv};

// Leases and pins: what a transfer holds while it uses an address.
pub use cache::{Lease, Peer, Pinned};

// Messages.
pub use endpoint::{CreditStats, MAX_PIECES, MAX_SEND_COPY, MAX_SENDS, Notification, Received};

// Memory and RMA.
pub use endpoint::memory::{
    MAX_REGION_LEN, REGION_KEY_ATTEMPTS, REGION_REUSE_QUARANTINE, RegionView, ViewBytes,
};
pub use endpoint::{
    Exposure, MAX_OPERATIONS, MemoryInterface, MemoryRegion, Operation, PooledBuffer, RegionSlice,
    RemoteRegion, Segment, StableBuffer,
};

// Completions.
pub use endpoint::{Completion, OverdueOperation};

// Rails: one endpoint per NIC, driven as one.
pub use rails::{
    MAX_RAILS, MIN_STRIPE, RailCaches, RailLease, RailPeers, RailPinned, RailRegion,
    RailRemoteRegion, RailSegment, RailSet, STRIPE_ALIGN,
};

// Errors.
pub use error::DmaError;

/// Deprecated names, kept one release (see `CHANGELOG.md`).
#[allow(deprecated)] // the old name itself, re-exported where it was
pub use rails::RailsPinned;

// The async API is the public module `asynchronous` above (feature `tokio`).

// The loom models' view of the primitives they check (`loom_tests/`, `--cfg dma_loom` only):
// the writer role, a region's access word, the completion waiters' hand-off.
#[cfg(dma_loom)]
pub use cache::{Role, Served, Take};
#[cfg(dma_loom)]
pub use endpoint::{AccessWord, Deadline, Handoff, PostedAt};

/// The layers are private: one path per name, the root's. Each of these fails to compile
/// (`E0603`, a private module), so a layer made public again by mistake fails the doc tests
/// (and `tests/public_surface.txt`).
///
/// ```compile_fail,E0603
/// use dma_libfabric::address::AddressFormat;
/// ```
/// ```compile_fail,E0603
/// use dma_libfabric::av::FabricAv;
/// ```
/// ```compile_fail,E0603
/// use dma_libfabric::cache::AddressCache;
/// ```
/// ```compile_fail,E0603
/// use dma_libfabric::configuration::Configuration;
/// ```
/// ```compile_fail,E0603
/// use dma_libfabric::endpoint::LibfabricEndpoint;
/// ```
/// ```compile_fail,E0603
/// use dma_libfabric::error::DmaError;
/// ```
/// ```compile_fail,E0603
/// use dma_libfabric::rails::RailSet;
/// ```
/// ```
/// // The root paths of the same names.
/// use dma_libfabric::{
///     AddressCache, AddressFormat, Configuration, DmaError, FabricAv, LibfabricEndpoint, RailSet,
/// };
/// ```
#[cfg(doctest)]
pub struct PrivateLayers;

/// The README's first program, run as a doc test so the front page cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's server (`docs/guide.md`), run as a doc test so the guide cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct GuideDoctests;
