//! The address-vector layer: what the cache's writer needs from an AV, and the AVs that ship.
//!
//! This layer sits between the bindings and the cache, and depends on neither the cache nor the
//! endpoint: `dma-libfabric-sys` → `av` → `cache` → `endpoint`.
//!
//! - [`AvBackend`]: the trait the writer drives (`fi_av_insert`, `fi_av_remove`, the layout).
//! - [`FabricAv`]: a real libfabric `FI_AV_TABLE`, as an endpoint opens it.
//! - `ModelAv` (feature `model`): libfabric's table semantics and efa's address
//!   rules without a device, for tests, loom and fuzzing.

pub(crate) mod fabric;
#[cfg(any(test, feature = "model"))]
pub(crate) mod model;
pub(crate) mod unreachable;

pub use self::fabric::FabricAv;

use crate::address::AddressFormat;
use crate::error::DmaError;
use dma_libfabric_sys::fi_addr_t;

/// An address vector the cache's writer thread drives. It is the only caller of `insert` and
/// `remove`, so an implementation needs no synchronisation of its own.
///
/// Two implementations ship: [`FabricAv`], the endpoint's real libfabric AV,
/// and, with the `model` feature, `ModelAv`, which has efa's address rules
/// without an efa device.
///
/// # Calling back into the cache
///
/// Its methods run under the cache's writer role: on its background thread, or on a caller whose
/// miss took the role (one at a time, never two at once). An implementation (or a `tracing` subscriber
/// that sees the writer's events) may call its own cache, and no call deadlocks: those that would
/// wait for the writer (a resolve or lease that misses, `lease`, `lease_within`) answer
/// [`DmaError::InvalidArgument`] at once, `release` is queued without waiting, `quiesce` returns
/// at once, and hits, `try_resolve` and `stats` work as anywhere.
pub trait AvBackend: Send + 'static {
    /// How addresses are laid out, and so what identifies a peer.
    fn format(&self) -> AddressFormat;
    /// The provider's address length: every address must be exactly this long.
    fn address_len(&self) -> usize;
    /// How many entries the AV was opened for. The cache never holds more, counting entries
    /// still awaiting their deferred removal.
    fn capacity(&self) -> usize;
    /// `fi_av_insert` of one address, already checked against `format` and `address_len`.
    ///
    /// # Errors
    /// Whatever the AV reports; the cache hands it to the caller unchanged.
    fn insert(&mut self, address: &[u8]) -> Result<fi_addr_t, DmaError>;
    /// `fi_av_remove` of one index this backend inserted.
    ///
    /// # Errors
    /// Whatever the AV reports; the cache logs it.
    fn remove(&mut self, fi_addr: fi_addr_t) -> Result<(), DmaError>;
}
