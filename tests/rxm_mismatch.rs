//! Peers whose rxm eager limits differ (issue 40, item 5), on real tcp;ofi_rxm endpoints in two
//! processes: rxm refuses the connection (`rxm_verify_connreq`: "eager_limit mismatch", in its
//! own log only), so every post answers `-FI_EAGAIN`. The first send answers `WouldBlock` after
//! its patience (a second), and the error names the setting that differs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint};
use testkit::{hex, unhex};

/// Marks the child this test starts with an environment of its own.
const CHILD: &str = "DMA_LIBFABRIC_RXM_MISMATCH_CHILD";

/// The child's `FI_OFI_RXM_BUFFER_SIZE`: neither the crate's default (4,096) nor rxm's (16,384),
/// so it differs from this process's whichever applied.
const CHILD_BUFFER_SIZE: &str = "12288";

/// The child: an endpoint under its own rxm sizing that announces its address and receives until
/// its stdin closes.
fn be_the_peer() -> ! {
    let peer =
        LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1")).expect("the peer");
    println!("PEER {}", hex(&peer.local_address().expect("address")));
    std::io::stdout().flush().expect("flush");
    std::thread::spawn(|| {
        let mut byte = [0; 1];
        while let Ok(1) = std::io::stdin().read(&mut byte) {}
        std::process::exit(0);
    });
    loop {
        let _ = peer.receive(Duration::from_millis(10));
    }
}

/// Killed when dropped, so a failing test leaves nothing behind.
struct PeerProcess(Child);

impl Drop for PeerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_peer_with_another_eager_limit_is_refused_with_an_error_naming_the_setting() {
    const NAME: &str =
        "a_peer_with_another_eager_limit_is_refused_with_an_error_naming_the_setting";
    if std::env::var(CHILD).is_ok() {
        be_the_peer();
    }
    assert_ne!(
        Ok(CHILD_BUFFER_SIZE),
        std::env::var("FI_OFI_RXM_BUFFER_SIZE").as_deref(),
        "this process must run under another eager limit than the child's"
    );
    let mut child = PeerProcess(
        Command::new(std::env::current_exe().expect("this binary"))
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("FI_OFI_RXM_BUFFER_SIZE", CHILD_BUFFER_SIZE)
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the peer process"),
    );
    let mut stdout = BufReader::new(child.0.stdout.take().expect("piped"));
    let address = loop {
        let mut line = String::new();
        assert!(
            0 < stdout.read_line(&mut line).expect("read"),
            "the peer ended"
        );
        if let Some(at) = line.find("PEER ") {
            break unhex(line[at + 5..].trim());
        }
    };
    let server = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1")).unwrap();
    let pinned = server.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolve");
    let refused = server.send(peer, b"hello");
    assert_eq!(
        Err(DmaError::WouldBlock),
        refused,
        "rxm refuses the connection"
    );
    let text = refused.unwrap_err().to_string();
    for needle in ["FI_OFI_RXM_BUFFER_SIZE", "RxmSizing::buffer_size"] {
        assert!(text.contains(needle), "{needle:?} is not in {text:?}");
    }
    assert_eq!(0, server.sends_in_flight(), "nothing was posted");
    drop(pinned);
    drop(child);
}
