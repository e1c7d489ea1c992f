//! `poll_notifications` delivers every notification whatever the target's loop calls (issue 42
//! item 8), on real tcp;ofi_rxm endpoints.
//!
//! Before, `poll_notifications` only handed over what `receive`/`try_receive` had set aside, and
//! `progress` does not read the receive queue, so a target that called `progress` then
//! `poll_notifications` (as `docs/guide.md` said) never saw one. Now it reads the receive queue
//! itself; messages it meets there wait, in order, for the next receive.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::{Duration, Instant};

use dma_libfabric::{LibfabricEndpoint, Notification};
use testkit::{PATIENCE, rma_tcp};

const WRITES: u64 = 200;

#[derive(Clone, Copy, Debug)]
enum Loop {
    /// `poll_notifications` alone.
    PollOnly,
    /// `progress`, then `poll_notifications`.
    Progress,
    /// `receive` with a short wait (it reads the receive queue), then `poll_notifications`.
    Receive,
}

/// `WRITES` writes that notify from a server to a target whose loop is `shape`, and a message sent
/// after every 50th; the target collects every notification and message.
fn deliver(shape: Loop) -> (Vec<u64>, Vec<Vec<u8>>, u64) {
    let server = rma_tcp();
    let target = rma_tcp();
    let inbox = target.register(64).expect("the target's region");
    let source = server.register(64).expect("the server's memory");
    let address = target.local_address().expect("address");
    std::thread::scope(|scope| {
        let collector = scope.spawn(|| {
            let mut notifications: Vec<Notification> = Vec::new();
            let mut messages = Vec::new();
            let deadline = Instant::now() + PATIENCE;
            while (notifications.len() as u64) < WRITES && Instant::now() < deadline {
                match shape {
                    Loop::PollOnly => {}
                    Loop::Progress => target.progress(),
                    Loop::Receive => {
                        if let Some(message) =
                            target.receive(Duration::from_millis(1)).expect("receive")
                        {
                            messages.push(message);
                        }
                    }
                }
                target.poll_notifications(&mut notifications);
            }
            // The messages the notifications' reads set aside are all there for the receives.
            while messages.len() < (WRITES / 50) as usize && Instant::now() < deadline {
                if let Some(message) = target.try_receive().expect("receive") {
                    messages.push(message);
                }
            }
            (notifications, messages)
        });
        let pinned = server.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        for data in 0..WRITES {
            let lease = pinned.lease(peer).expect("a lease");
            server
                .write_with_data(
                    lease,
                    source.segment(0, 64).expect("segment"),
                    inbox.remote(),
                    data,
                    data,
                )
                .expect("posted");
            assert_eq!(
                Ok(()),
                server.wait_for(data, PATIENCE).expect("completed").result
            );
            if 49 == data % 50 {
                server
                    .send_within(peer, &data.to_le_bytes(), PATIENCE)
                    .expect("a message after the writes");
            }
        }
        let (notifications, messages) = collector.join().expect("the target's loop");
        let data = notifications.iter().map(|notification| notification.data);
        (data.collect(), messages, target.dropped_notifications())
    })
}

fn check(shape: Loop) {
    let (notifications, messages, dropped) = deliver(shape);
    assert_eq!(0, dropped, "{shape:?}");
    assert_eq!(
        (0..WRITES).collect::<Vec<_>>(),
        notifications,
        "{shape:?}: every notification, in order"
    );
    let expected: Vec<Vec<u8>> = (0..WRITES)
        .filter(|data| 49 == data % 50)
        .map(|data| data.to_le_bytes().to_vec())
        .collect();
    assert_eq!(expected, messages, "{shape:?}: every message, in order");
}

#[test]
fn a_loop_of_poll_notifications_alone_gets_every_notification() {
    check(Loop::PollOnly);
}

#[test]
fn a_loop_of_progress_and_poll_notifications_gets_every_notification() {
    check(Loop::Progress);
}

#[test]
fn a_loop_of_receive_and_poll_notifications_gets_every_notification() {
    check(Loop::Receive);
}

/// Nothing arrives: an empty answer, and nothing is invented.
#[test]
fn an_idle_endpoint_has_no_notifications() {
    let endpoint: LibfabricEndpoint = rma_tcp();
    let mut out = Vec::new();
    assert_eq!(0, endpoint.poll_notifications(&mut out));
    assert!(out.is_empty());
}
