//! Loom models of the address cache's protocol, over the model AV.
//!
//! The models are in `tests/`, one race each. They compile to nothing unless built with
//! `RUSTFLAGS="--cfg dma_loom --cfg crossbeam_loom"`, which `scripts/loom` sets, so that
//! `cargo test --workspace` does not run them on std threads. See the crate README for the
//! mutation table: the one-line change to the shipped code each model exists to catch.

/// A 16-byte opaque address numbered `n`.
pub fn opaque(n: u8) -> Vec<u8> {
    vec![n; 16]
}

/// A 32-byte efa address: GID of `gid`s, QPN `qpn`, QKEY `qkey`.
pub fn efa(gid: u8, qpn: u16, qkey: u32) -> Vec<u8> {
    let mut address = vec![0_u8; 32];
    address[..16].fill(gid);
    address[16..18].copy_from_slice(&qpn.to_ne_bytes());
    address[20..24].copy_from_slice(&qkey.to_ne_bytes());
    address
}
