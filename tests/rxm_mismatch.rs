//! Peers whose rxm eager limits differ (issue 40, item 5), on real tcp;ofi_rxm endpoints in two
//! processes: rxm refuses the connection (`rxm_verify_connreq`: "eager_limit mismatch", in its
//! own log only), so every post would answer `-FI_EAGAIN`. A sealed address says its process's
//! eager limit, so the first operation, the resolve, is refused at once with an error that
//! names both limits and the setting, and nothing enters the AV. A bare address (a plain peer's)
//! says nothing: its first send answers `WouldBlock` after its patience (a second), and that
//! error names the setting too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::process::{Command, Stdio};

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint, SEAL_LEN};

/// Marks the child this test starts with an environment of its own.
const CHILD: &str = "DMA_LIBFABRIC_RXM_MISMATCH_CHILD";

/// The child's `FI_OFI_RXM_BUFFER_SIZE`: neither the crate's default (4,096) nor rxm's (16,384),
/// so it differs from this process's whichever applied.
const CHILD_BUFFER_SIZE: &str = "12288";

#[test]
fn a_peer_with_another_eager_limit_is_refused_with_an_error_naming_the_setting() {
    const NAME: &str =
        "a_peer_with_another_eager_limit_is_refused_with_an_error_naming_the_setting";
    if std::env::var(CHILD).is_ok() {
        testkit::be_a_message_peer(); // under the child's own rxm sizing
    }
    assert_ne!(
        Ok(CHILD_BUFFER_SIZE),
        std::env::var("FI_OFI_RXM_BUFFER_SIZE").as_deref(),
        "this process must run under another eager limit than the child's"
    );
    let mut child = testkit::PeerProcess(
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
    let (address, _stdin) = testkit::announced_address(&mut child.0);
    let server = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1")).unwrap();
    let pinned = server.cache().pin();
    match pinned.resolve(1, &address) {
        Err(DmaError::InvalidAddress(why)) => {
            for needle in [
                CHILD_BUFFER_SIZE,
                "FI_OFI_RXM_BUFFER_SIZE",
                "RxmSizing::buffer_size",
            ] {
                assert!(why.contains(needle), "{needle:?} is not in {why:?}");
            }
        }
        other => panic!("a sealed address of another eager limit was resolved: {other:?}"),
    }
    assert_eq!(None, server.lookup(0).unwrap(), "nothing entered the AV");
    // The same peer's bare address, as a plain peer would give it: nothing to compare.
    let bare = &address[..address.len() - SEAL_LEN];
    let peer = pinned.resolve(2, bare).expect("resolve");
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
