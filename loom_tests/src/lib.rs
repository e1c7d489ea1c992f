//! Loom models of the address cache's protocol, over the model AV.
//!
//! The models are in `tests/`, one race each. They compile to nothing unless built with
//! `RUSTFLAGS="--cfg dma_loom --cfg crossbeam_loom"`, which `scripts/loom` sets, so that
//! `cargo test --workspace` does not run them on std threads. See the crate README for the
//! mutation table: the one-line change to the shipped code each model exists to catch.

pub use testkit::{efa, opaque};
