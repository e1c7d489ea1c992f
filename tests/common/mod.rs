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

/// The variable that tells a re-run test binary which test is its child's to run.
const CHILD_TEST: &str = "DMA_LIBFABRIC_CHILD_TEST";

/// Run the rest of test `name` in a child process, since a crash there must fail the test rather
/// than end the test binary: in the parent, re-run this binary with `--exact name`, assert that
/// the child ran that one test and exited successfully (a crash fails, whether the signal ends
/// the child or libfabric's handler turns it into an exit status), and return `false`; in that child, return `true`, so the test does its
/// dangerous calls and assertions.
///
/// ```ignore
/// #[test]
/// fn dangerous() {
///     if !common::in_child_process("dangerous") {
///         return;
///     }
///     // the calls that used to crash
/// }
/// ```
pub fn in_child_process(name: &str) -> bool {
    if std::env::var(CHILD_TEST).as_deref() == Ok(name) {
        return true;
    }
    let output = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_TEST, name)
        .output()
        .expect("re-run this test binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let signal = std::os::unix::process::ExitStatusExt::signal(&output.status);
    assert!(
        output.status.success(),
        "the child running {name} failed: {:?} (signal {signal:?}; libfabric's own handler \
         turns a SIGSEGV into exit status 1 and prints \"terminated with signal 11\")\n\
         stdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("1 passed"),
        "the child ran {name}:\n{stdout}"
    );
    false
}
