//! rxm's sizes are checked: `validate` refuses a size past rxm's or tcp's bound, naming it (the
//! configuration's), and `open` names the environment variable when the process was started
//! with one rxm does not accept (`usize::MAX` used to fail with a bare "no provider").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint, RxmSizing};

/// Marks the child this test starts with an environment of its own.
const CHILD: &str = "DMA_LIBFABRIC_RXM_SIZING_CHILD";

#[test]
fn a_configured_rxm_size_past_its_bound_is_refused_before_open_naming_it() {
    let mut configuration = Configuration::default();
    configuration.rxm.msg_rx_size = Some(usize::MAX);
    let Err(DmaError::InvalidArgument(reason)) =
        LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))
    else {
        panic!("opened with msg_rx_size usize::MAX");
    };
    assert!(reason.contains("rxm.msg_rx_size"), "{reason}");
    assert!(reason.contains(&usize::MAX.to_string()), "{reason}");
    assert!(
        reason.contains(&RxmSizing::MAX_MSG_RX_SIZE.to_string()),
        "{reason}"
    );
}

/// A process started with `FI_OFI_RXM_MSG_RX_SIZE` at `usize::MAX`: whatever libfabric does with
/// it, `open` either works or names the variable and its value.
#[test]
fn an_environment_rxm_size_past_its_bound_is_named_by_open() {
    const NAME: &str = "an_environment_rxm_size_past_its_bound_is_named_by_open";
    let value = usize::MAX.to_string();
    if std::env::var(CHILD).is_err() {
        let output = std::process::Command::new(std::env::current_exe().expect("this binary"))
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("FI_OFI_RXM_MSG_RX_SIZE", &value)
            .current_dir(std::env::temp_dir())
            .output()
            .expect("the child");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "the child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        return;
    }
    match LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1")) {
        Ok(_) => println!("libfabric accepted FI_OFI_RXM_MSG_RX_SIZE={value}"),
        Err(error) => {
            let text = error.to_string();
            assert!(text.contains("FI_OFI_RXM_MSG_RX_SIZE"), "{text}");
            assert!(text.contains(&value), "{text}");
            println!("refused: {text}");
        }
    }
}
