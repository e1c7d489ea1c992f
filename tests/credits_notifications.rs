//! Notifications under credits (issue 40, item 3), on real tcp;ofi_rxm endpoints: a target
//! grants each writer a window of notifications (`ReceiveWindow::notifications`) and grants again
//! as its application polls them, out of a pool no larger than what it keeps waiting
//! (`cq_size`), so a writer without credit answers `WouldBlock` and no notification is dropped.
//!
//! Before (main at `5303d52`): 600,000 `write_with_data` against a target that never polled grew
//! it 76-94 MiB and the writer was never refused; a 20,000-write burst against `cq_size` 512,
//! polled every millisecond, lost 8,200-16,800 notifications (counted in
//! `dropped_notifications`). With grants made whatever is polled, both tests fail (the first
//! accepts every write, the second drops).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dma_libfabric::{Completion, Configuration, DmaError, LibfabricEndpoint, Notification};
use testkit::{PATIENCE, resident};

fn endpoint() -> LibfabricEndpoint {
    let configuration = Configuration {
        rma: true,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("an RMA endpoint on tcp")
}

/// 600,000 writes that notify, each tried once, against a target that drives progress (so it
/// answers the writer's introduction) and never polls its notifications: the writer is refused
/// once its window is spent, the process grows at most 64 MiB, and nothing is dropped.
#[test]
fn a_target_that_never_polls_refuses_past_the_window_and_drops_nothing() {
    const WRITES: u64 = 600_000;
    let (writer, target) = (endpoint(), endpoint());
    let inbox = target.register(64).expect("the target's region");
    let source = writer.register(64).expect("the writer's memory");
    let address = target.local_address().expect("address");
    let window = u64::from(Configuration::default().receive_window.notifications);
    let stop = AtomicBool::new(false);
    let before = resident();
    let (accepted, refused) = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                target.progress();
                std::thread::yield_now();
            }
        });
        let pinned = writer.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        let (mut accepted, mut refused) = (0_u64, 0_u64);
        let mut completions: Vec<Completion> = Vec::new();
        for data in 0..WRITES {
            let lease = pinned.lease(peer).expect("a lease");
            // The first waits for the target's first grant; the rest are tried once.
            let patience = if 0 == data { PATIENCE } else { Duration::ZERO };
            match writer.write_with_data_within(
                lease,
                source.segment(0, 64).expect("segment"),
                inbox.remote(),
                data,
                data,
                patience,
            ) {
                Ok(()) => accepted += 1,
                Err(DmaError::WouldBlock) => refused += 1,
                Err(error) => panic!("{error}"),
            }
            writer.poll_completions(&mut completions).expect("poll");
        }
        stop.store(true, Ordering::Release);
        (accepted, refused)
    });
    let grown = resident().saturating_sub(before);
    println!("accepted {accepted}, refused {refused}, grown {grown} bytes");
    assert!(0 < accepted, "the first grant never came");
    assert!(
        accepted <= window,
        "{accepted} accepted against a window of {window}"
    );
    assert_eq!(WRITES, accepted + refused);
    assert!(grown <= 64 << 20, "grew {grown} bytes");
    assert_eq!(0, target.dropped_notifications());
    let mut notifications = Vec::new();
    target.poll_notifications(&mut notifications);
    assert!(notifications.len() as u64 <= accepted);
}

/// A 20,000-write burst against `cq_size` 512, the target polling every millisecond: every
/// notification arrives, with its data, and none is dropped.
#[test]
fn a_burst_against_a_target_polling_every_millisecond_loses_nothing() {
    const WRITES: u64 = 20_000;
    let (writer, target) = (endpoint(), endpoint());
    assert_eq!(512, Configuration::default().cq_size);
    let inbox = target.register(64).expect("the target's region");
    let source = writer.register(64).expect("the writer's memory");
    let address = target.local_address().expect("address");
    let seen = std::thread::scope(|scope| {
        let polling = scope.spawn(|| {
            let mut notifications: Vec<Notification> = Vec::new();
            let deadline = Instant::now() + PATIENCE;
            while (notifications.len() as u64) < WRITES {
                assert!(Instant::now() < deadline, "{} arrived", notifications.len());
                target.poll_notifications(&mut notifications);
                // The slow target this test is about: it polls once a millisecond.
                std::thread::sleep(Duration::from_millis(1));
            }
            notifications
        });
        let pinned = writer.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        let mut completions: Vec<Completion> = Vec::new();
        for data in 0..WRITES {
            loop {
                let lease = pinned.lease(peer).expect("a lease");
                match writer.write_with_data_within(
                    lease,
                    source.segment(0, 64).expect("segment"),
                    inbox.remote(),
                    data,
                    data,
                    PATIENCE,
                ) {
                    Ok(()) => break,
                    // Out of operation slots or budget while completions wait to be read.
                    Err(DmaError::WouldBlock) => {}
                    Err(error) => panic!("{error}"),
                }
                writer.poll_completions(&mut completions).expect("poll");
            }
            writer.poll_completions(&mut completions).expect("poll");
        }
        polling.join().expect("the polling thread")
    });
    let data: BTreeSet<u64> = seen.iter().map(|notification| notification.data).collect();
    assert_eq!(WRITES as usize, seen.len());
    assert_eq!((0..WRITES).collect::<BTreeSet<_>>(), data);
    assert_eq!(0, target.dropped_notifications());
}
