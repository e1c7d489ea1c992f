//! Helpers shared by the integration tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking
#![allow(dead_code)] // each test binary uses some of these

use dma_libfabric::{Configuration, LibfabricEndpoint};

/// A real tcp endpoint on loopback.
pub fn tcp() -> LibfabricEndpoint {
    tcp_with_capacity(Configuration::default().av_capacity)
}

/// A real tcp endpoint whose AV was opened for `capacity` entries.
pub fn tcp_with_capacity(capacity: usize) -> LibfabricEndpoint {
    let configuration = Configuration {
        av_capacity: capacity,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint on 127.0.0.1")
}

/// A well-formed `sockaddr_in` for 127.0.0.1 and a port derived from `n`, with `n`'s high bits
/// in the host byte, so up to 16 million distinct addresses. `fi_av_insert` never contacts a
/// peer, so nothing needs to listen there.
pub fn sockaddr(n: u32) -> Vec<u8> {
    let port = 1 + (n % 65_000) as u16;
    let host = 1 + (n / 65_000) as u8;
    let mut address = vec![0_u8; 16];
    address[0..2].copy_from_slice(&2_u16.to_ne_bytes()); // AF_INET
    address[2..4].copy_from_slice(&port.to_be_bytes());
    address[4..8].copy_from_slice(&[127, 0, 0, host]);
    address
}

/// An efa address: GID `gid` (repeated), QPN `qpn`, QKEY `qkey`.
pub fn efa(gid: u8, qpn: u16, qkey: u32) -> Vec<u8> {
    let mut address = vec![0_u8; 32];
    address[..16].fill(gid);
    address[16..18].copy_from_slice(&qpn.to_ne_bytes());
    address[20..24].copy_from_slice(&qkey.to_ne_bytes());
    address
}

/// A small deterministic generator (xorshift64*), so stress tests need no extra crate and replay.
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}
