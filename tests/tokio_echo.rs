//! The async face under a steady exchange: one task echoes every message back, the other waits
//! for each echo before it sends the next, on real tcp;ofi_rxm endpoints on 127.0.0.1. Every
//! message arrives, in order, through the driver, the credit protocol's grants and the
//! receivers' wake-ups.
//!
//! Written for `benches/completions.rs`'s round trip, which stalled: about one round trip in
//! twenty waited a whole second (2,000 of them took 40 to 150 s instead of under one), because
//! a thread other than the driver took an arrival off the receive queue while the driver slept.
//! What that was, and the counter-based test of its fix, are in `tests/arrivals_wake.rs`; this
//! one checks that nothing is lost or reordered on the way.
#![cfg(feature = "tokio")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::Arc;

use dma_libfabric::asynchronous::AsyncEndpoint;
use testkit::{PATIENCE, rma_tcp};

fn open() -> AsyncEndpoint {
    AsyncEndpoint::new(Arc::new(rma_tcp())).unwrap()
}

async fn bounded<F: std::future::Future>(what: String, future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} never resolved"))
}

/// 2,000 round trips of 4 KiB, each message numbered: every echo is the message sent, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echo_of_thousands_of_messages_loses_none() {
    const ROUNDS: u32 = 2_000;
    let (pinger, ponger) = (open(), open());
    let pinger_address = pinger.endpoint().local_address().unwrap();
    let ponger_address = ponger.endpoint().local_address().unwrap();
    let lease = pinger.lease(1, &ponger_address).await.unwrap();
    let echo = tokio::spawn(async move {
        let back = ponger.lease(1, &pinger_address).await.unwrap();
        for round in 0..ROUNDS {
            let message = bounded(format!("the echo's receive {round}"), ponger.receive())
                .await
                .unwrap();
            bounded(
                format!("the echo's send {round}"),
                ponger.send(back.peer(), &message),
            )
            .await
            .unwrap();
        }
    });
    for round in 0..ROUNDS {
        let mut message = vec![7; 4096];
        message[..4].copy_from_slice(&round.to_le_bytes());
        bounded(format!("send {round}"), pinger.send(lease.peer(), &message))
            .await
            .unwrap();
        let echoed = bounded(format!("receive {round}"), pinger.receive())
            .await
            .unwrap();
        assert_eq!(message, echoed, "round {round}");
    }
    echo.await.unwrap();
}
