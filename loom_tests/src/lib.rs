//! Loom models of the address cache's protocol, over the model AV.
//!
//! The models are in `tests/`, one race each. They compile to nothing unless built with
//! `RUSTFLAGS="--cfg dma_loom --cfg crossbeam_loom"`, which `scripts/loom` sets, so that
//! `cargo test --workspace` does not run them on std threads. See the crate README for the
//! mutation table: the one-line change to the shipped code each model exists to catch.

pub use testkit::{efa, opaque};

/// `static_world!(WORLD, AddressFormat::Opaque, 16)`: a model AV of that format and address
/// length (capacity 4) and a cache over it, in a `loom::lazy_static!` named `WORLD`. A static,
/// so that a `Lease` borrowing the cache is `'static` and can move to another loom thread; loom
/// builds it afresh in each execution and drops it (stopping the writer) at the end of each.
///
/// `static_world!(WORLD, AddressFormat::Efa, 32, patience)` gives the cache that patience
/// (`AddressCache::with_patience`).
#[macro_export]
macro_rules! static_world {
    ($name:ident, $format:expr, $address_len:expr, $patience:expr) => {
        loom::lazy_static! {
            static ref $name: (
                ::dma_libfabric::ModelAv,
                ::dma_libfabric::AddressCache<::dma_libfabric::ModelAv>,
            ) = {
                let av = ::dma_libfabric::ModelAv::with_layout($format, $address_len, 4);
                let cache =
                    ::dma_libfabric::AddressCache::with_backend(av.clone()).with_patience($patience);
                (av, cache)
            };
        }
    };
    ($name:ident, $format:expr, $address_len:expr) => {
        loom::lazy_static! {
            static ref $name: (
                ::dma_libfabric::ModelAv,
                ::dma_libfabric::AddressCache<::dma_libfabric::ModelAv>,
            ) = {
                let av = ::dma_libfabric::ModelAv::with_layout($format, $address_len, 4);
                // An hour: a model's waits end by what the model does, never at a deadline that
                // a slow run of loom might reach.
                let cache = ::dma_libfabric::AddressCache::with_backend(av.clone())
                    .with_patience(::std::time::Duration::from_secs(3600));
                (av, cache)
            };
        }
    };
}
