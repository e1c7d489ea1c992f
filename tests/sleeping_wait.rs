//! Blocking waits sleep on the completion queues' file descriptors (`FI_WAIT_FD`, the
//! `fi_trywait` protocol) instead of spinning, on real tcp;ofi_rxm endpoints on 127.0.0.1.
//!
//! The CPU figures are resource assertions, not timing ones: the thread's own CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) over a wait that lasts its whole timeout, against a generous bound
//! (a tenth of the wall time waited; a sleeping wait measures well under 1%). On `6095657` every
//! one of them spun: `receive` used 99.7% of a core.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::{Duration, Instant};

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint};
use testkit::{PATIENCE, rma_tcp, tcp, wait_for_bytes, with_progress};

/// The CPU time this thread has used so far.
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a live timespec for the call to fill.
    let code = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut now) };
    assert_eq!(0, code, "clock_gettime");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Run `wait` on this thread, and assert it used at most a tenth of the wall time it took in
/// CPU time. Returns what it returned.
fn sleeps<R>(what: &str, wait: impl FnOnce() -> R) -> R {
    let (wall, cpu) = (Instant::now(), thread_cpu());
    let result = wait();
    let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
    assert!(
        cpu * 10 < wall,
        "{what} used {cpu:?} of CPU over {wall:?}: it spins"
    );
    eprintln!("{what}: {cpu:?} of CPU over {wall:?}");
    result
}

/// A thread blocked in `receive` with nothing on its way sleeps.
#[test]
fn a_receive_with_nothing_arriving_sleeps() {
    let endpoint = tcp();
    let received = sleeps("receive(1 s)", || endpoint.receive(Duration::from_secs(1)));
    assert_eq!(None, received.expect("no error"));
}

/// A thread blocked in `wait_for` on a write whose target has stopped progressing sleeps, and
/// the write still completes once the target progresses again.
#[test]
fn a_wait_for_a_stalled_write_sleeps() {
    let server = rma_tcp();
    let client = rma_tcp();
    let len = 32 << 20; // more than loopback buffers hold without a reader
    let source = server.register(len).unwrap();
    let data: Vec<u8> = (0..len).map(|at| (at % 253) as u8).collect();
    source.write_bytes(0, &data).unwrap();
    let target = client.register(len).unwrap();
    let address = client.local_address().unwrap();
    with_progress(&client, || {
        // Connect while the client progresses.
        let lease = server.cache().lease(1, &address).unwrap();
        server
            .write(lease, source.segment(0, 64).unwrap(), target.remote(), 1)
            .unwrap();
        server.wait_for(1, PATIENCE).expect("connected");
    });
    let lease = server.cache().lease(1, &address).unwrap();
    server
        .write(lease, source.segment(0, len).unwrap(), target.remote(), 2)
        .unwrap();
    let waited = sleeps("wait_for(1 s) on a stalled write", || {
        server.wait_for(2, Duration::from_secs(1))
    });
    assert_eq!(Err(DmaError::WouldBlock), waited.map(|done| done.id));
    assert_eq!(1, server.operations_in_flight());
    with_progress(&client, || {
        let done = server
            .wait_for(2, PATIENCE)
            .expect("completes once the target progresses");
        assert_eq!((2, Ok(())), (done.id, done.result));
        wait_for_bytes(&target, len - 4096, &data[len - 4096..]);
    });
}

/// A rail set's `wait_for` sleeps on every rail's queues.
#[test]
fn a_rail_sets_wait_sleeps() {
    let rails = testkit::rma_rails(2);
    let waited = sleeps("RailSet::wait_for(500 ms)", || {
        rails.wait_for(7, Duration::from_millis(500))
    });
    assert_eq!(Err(DmaError::WouldBlock), waited.map(|done| done.id));
}

/// An RMA target whose only thread sleeps in `receive` still lands a peer's write: the queue's
/// descriptor wakes it when bytes arrive, and its read moves them (DESIGN.md: nothing progresses
/// while the application sleeps, so some thread must wait on every RMA target's queue). The
/// initiator then tells it, by a message, that the write has completed.
#[test]
fn a_target_that_only_sleeps_in_receive_lands_a_write() {
    let server = rma_tcp();
    let client = rma_tcp();
    let len = 8 << 20;
    let source = server.register(len).unwrap();
    let data: Vec<u8> = (0..len).map(|at| (at % 239) as u8).collect();
    source.write_bytes(0, &data).unwrap();
    let target = client.register(len).unwrap();
    let address = client.local_address().unwrap();
    std::thread::scope(|scope| {
        let sleeper = scope.spawn(|| {
            // Only ever blocked in receive: no progress thread, no polling loop.
            let deadline = Instant::now() + PATIENCE;
            while Instant::now() < deadline {
                if let Some(message) = client.receive(Duration::from_millis(200)).unwrap() {
                    return message;
                }
            }
            panic!("no message");
        });
        let lease = server.cache().lease(1, &address).unwrap();
        server
            .write_within(
                lease,
                source.segment(0, len).unwrap(),
                target.remote(),
                1,
                PATIENCE,
            )
            .unwrap();
        let done = server.wait_for(1, PATIENCE).expect("completed");
        assert_eq!(Ok(()), done.result);
        let pinned = server.cache().pin();
        let peer = pinned.resolve(1, &address).unwrap();
        server.send_within(peer, b"done", PATIENCE).unwrap();
        drop(pinned);
        assert_eq!(b"done".to_vec(), sleeper.join().unwrap());
    });
    // The message went after the write's completion on the same connection.
    wait_for_bytes(&target, 0, &data[..4096]);
    wait_for_bytes(&target, len - 4096, &data[len - 4096..]);
}

/// An RMA target whose only thread loops on `progress_sleeping` lands a write, and that thread
/// sleeps while nothing arrives.
#[test]
fn a_target_in_progress_sleeping_lands_a_write_and_sleeps_when_idle() {
    let server = rma_tcp();
    let client = rma_tcp();
    let len = 8 << 20;
    let source = server.register(len).unwrap();
    let data: Vec<u8> = (0..len).map(|at| (at % 233) as u8).collect();
    source.write_bytes(0, &data).unwrap();
    let target = client.register(len).unwrap();
    let address = client.local_address().unwrap();
    let landed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let serving = scope.spawn(|| {
            let deadline = Instant::now() + PATIENCE;
            let mut last = vec![0; 4096];
            while Instant::now() < deadline {
                client.progress_sleeping(Duration::from_millis(100));
                target.read_bytes(len - 4096, &mut last).unwrap();
                if last[..] == data[len - 4096..] {
                    landed.store(true, std::sync::atomic::Ordering::Release);
                    // Idle now: the same loop sleeps.
                    return sleeps("progress_sleeping for 500 ms, idle", || {
                        let idle = Instant::now();
                        while idle.elapsed() < Duration::from_millis(500) {
                            client.progress_sleeping(Duration::from_millis(100));
                        }
                    });
                }
            }
            panic!("the write never landed");
        });
        let lease = server.cache().lease(1, &address).unwrap();
        server
            .write_within(
                lease,
                source.segment(0, len).unwrap(),
                target.remote(),
                1,
                PATIENCE,
            )
            .unwrap();
        assert_eq!(Ok(()), server.wait_for(1, PATIENCE).unwrap().result);
        serving.join().unwrap();
    });
    assert!(landed.load(std::sync::atomic::Ordering::Acquire));
    wait_for_bytes(&target, 0, &data[..4096]);
}

/// Many threads asleep on one endpoint at once (one in `poll`, the others on the condition
/// variable), each waiting for its own write, and one more in `receive`: every completion reaches
/// its waiter, whichever thread read it, and the message reaches the receiver.
#[test]
fn many_sleeping_waiters_each_get_their_own_completion() {
    let server = rma_tcp();
    let client = rma_tcp();
    let source = server.register(4096).unwrap();
    let target = client.register(8 * 4096).unwrap();
    let address = client.local_address().unwrap();
    let client_address = server.local_address().unwrap();
    with_progress(&client, || {
        let ready = std::sync::Barrier::new(10);
        std::thread::scope(|scope| {
            let waiters: Vec<_> = (0..8_u64)
                .map(|id| {
                    let (server, ready) = (&server, &ready);
                    scope.spawn(move || {
                        ready.wait();
                        server.wait_for(id, PATIENCE)
                    })
                })
                .collect();
            let receiver = scope.spawn(|| {
                ready.wait();
                server.receive(PATIENCE)
            });
            ready.wait();
            // Posted in reverse, so the first waiter's completion comes last.
            for id in (0..8_u64).rev() {
                let lease = server.cache().lease(1, &address).unwrap();
                let slot = target.remote().slice(id * 4096, 4096).unwrap();
                server
                    .write(lease, source.segment(0, 4096).unwrap(), slot, id)
                    .unwrap();
            }
            for (id, waiter) in waiters.into_iter().enumerate() {
                let done = waiter.join().unwrap().expect("its own completion");
                assert_eq!((id as u64, Ok(())), (done.id, done.result));
            }
            let pinned = client.cache().pin();
            let peer = pinned.resolve(2, &client_address).unwrap();
            client.send_within(peer, b"hello", PATIENCE).unwrap();
            drop(pinned);
            assert_eq!(Some(b"hello".to_vec()), receiver.join().unwrap().unwrap());
        });
    });
    assert_eq!(0, server.operations_in_flight());
}

/// `Configuration::busy_poll` keeps the spinning wait, which still answers.
#[test]
fn busy_poll_keeps_the_spinning_wait() {
    let configuration = Configuration {
        busy_poll: true,
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
    let (wall, cpu) = (Instant::now(), thread_cpu());
    assert_eq!(None, endpoint.receive(Duration::from_millis(200)).unwrap());
    eprintln!(
        "busy_poll receive(200 ms): {:?} of CPU over {:?}",
        thread_cpu() - cpu,
        wall.elapsed()
    );
}

/// Run `call` on a thread of its own and fail the test if it has not returned within
/// [`PATIENCE`] (or panicked): a hang is a failure, not a stuck run. (A hung thread is left
/// behind; the failed test ends the binary.)
fn returns(what: &str, call: impl FnOnce() + Send + 'static) {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        call();
        let _ = done.send(());
    });
    match finished.recv_timeout(PATIENCE) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what} hung"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// Issue 31, hostile timeouts: `progress_sleeping(Duration::MAX)` (no deadline: `now + MAX`
/// overflows an `Instant`) and `progress_sleeping(Duration::ZERO)` on an idle endpoint return,
/// without a panic: `MAX` after one wake-up or the one-second bound of a single `poll`, `ZERO`
/// after one read. Both on a sleeping endpoint and on a `busy_poll` one (which reads once).
/// Fails if the deadline were `Instant::now() + timeout` (a panic) or if the wait looped until
/// its deadline (a hang for `MAX`).
#[test]
fn progress_sleeping_returns_for_duration_max_and_zero_on_an_idle_endpoint() {
    for busy_poll in [false, true] {
        let configuration = Configuration {
            busy_poll,
            ..Configuration::default()
        };
        let endpoint = std::sync::Arc::new(
            LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap(),
        );
        for timeout in [Duration::MAX, Duration::ZERO, Duration::MAX] {
            let idle = std::sync::Arc::clone(&endpoint);
            returns(
                &format!("progress_sleeping({timeout:?}), busy_poll {busy_poll}"),
                move || idle.progress_sleeping(timeout),
            );
        }
        assert_eq!(0, endpoint.operations_in_flight());
    }
}
