//! No blocking wait sleeps through connection setup: fresh pairs of real tcp;ofi_rxm endpoints
//! on 127.0.0.1 ping-pong with the sync face, and the first send of each side (which rxm answers
//! "retry after progress" while it sets the connection up) is never left to sleep its whole
//! longest sleep.
//!
//! Before, the first send of a fresh pair slept 1 s in every round: rxm's connection events woke
//! the poller, but the refused `fi_send` (or the progress after it) read the last one, so the
//! next attempt would have gone through and nothing was left to wake it (`src/endpoint/wait.rs`,
//! "Connection setup"). The assertions here are on the waits' own counters, not on time: how
//! many posts the provider asked to retry, and how many sleeps ran out their longest sleep
//! (`LibfabricEndpoint::sleeps_run_out`, feature `model`). The first-message latency, before and
//! after, is in `docs/benchmarks.md`, "Connection setup".
//!
//! What is not asserted: the receivers' sleeps. A `receive` waits for a peer that may, on a busy
//! machine, take more than a second to send; its sleep running out then is right.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::Duration;

use testkit::{PATIENCE, tcp};

/// Fresh pairs: each round opens a client and a server, the server's thread blocks in `receive`,
/// the client resolves the server and sends a ping (with a timeout past the longest sleep, so a
/// sleep through the setup would run out rather than end at the deadline), the server answers on
/// the connection the client set up, and the client receives the answer. Each first send was
/// asked to retry at least once (the provider was setting the connection up: what this test is
/// about), and no sleep of either send ran out. Fails without the retry's short sleep (mutation
/// V in `loom_tests/README.md`): the client's first send then sleeps its whole second, once a
/// round.
#[test]
fn no_first_send_of_a_fresh_pair_sleeps_through_connection_setup() {
    for round in 0..10 {
        let (client, server) = (tcp(), tcp());
        let (client_address, server_address) = (
            client.local_address().unwrap(),
            server.local_address().unwrap(),
        );
        std::thread::scope(|scope| {
            let echo = scope.spawn(|| {
                let ping = server.receive(PATIENCE).unwrap().expect("the ping arrives");
                let pinned = server.cache().pin();
                let peer = pinned.resolve(1, &client_address).unwrap();
                let run_out = server.sleeps_run_out();
                server.send_within(peer, &ping, PATIENCE).unwrap();
                assert_eq!(
                    run_out,
                    server.sleeps_run_out(),
                    "round {round}: the server's first send slept its whole longest sleep"
                );
            });
            let pinned = client.cache().pin();
            let peer = pinned.resolve(1, &server_address).unwrap();
            let (asked, run_out) = (client.posts_asked_to_retry(), client.sleeps_run_out());
            client
                .send_within(peer, format!("ping {round}").as_bytes(), PATIENCE)
                .unwrap();
            assert!(
                client.posts_asked_to_retry() > asked,
                "round {round}: the first send to a new peer was never asked to retry (no \
                 connection setup to wait through?)"
            );
            assert_eq!(
                run_out,
                client.sleeps_run_out(),
                "round {round}: the client's first send slept its whole longest sleep: nothing \
                 woke it while the connection was set up"
            );
            let pong = client.receive(PATIENCE).unwrap().expect("the pong arrives");
            assert_eq!(format!("ping {round}").as_bytes(), pong.as_slice());
            echo.join().unwrap();
        });
    }
}

/// The counter the test above reads is not vacuous: a `receive` on an idle endpoint whose
/// timeout is past the longest sleep sleeps that whole sleep, and it is counted, as the first
/// send's was before the fix. (An idle endpoint still sleeps long: no retry is asked.)
#[test]
fn an_idle_receive_runs_out_its_longest_sleep_and_is_counted() {
    let endpoint = tcp();
    let (asked, run_out) = (endpoint.posts_asked_to_retry(), endpoint.sleeps_run_out());
    assert_eq!(
        None,
        endpoint.receive(Duration::from_millis(1_100)).unwrap()
    );
    assert_eq!(asked, endpoint.posts_asked_to_retry());
    assert!(
        endpoint.sleeps_run_out() > run_out,
        "a 1.1 s receive with nothing arriving did not sleep its whole 1 s"
    );
}
