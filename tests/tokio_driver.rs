//! The async face's driver is a thread of its own (issue 41, item 4, A to D), on real tcp;ofi_rxm
//! endpoints on 127.0.0.1:
//! - A: futures resolve whatever runtime made the endpoint, and after that runtime is gone;
//! - B: a post waiting for backpressure sleeps (it spun with `yield_now`: 68–99% of a core);
//! - C: dropping the last clone with operations in flight returns at once, and the endpoint's
//!   drain runs on the driver's thread, not a runtime's;
//! - D: the same endpoint can be wrapped again at once (it failed with `EEXIST`);
//! - a runtime without IO falls back to the driver, and a runtime blocked in a sync call holds up
//!   no progress while its futures are parked on its reactor;
//! - on a `PeerProtocol::Plain` endpoint, whose `progress` leaves the receive queue alone, the
//!   async face's passes still read it.
#![cfg(feature = "tokio")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dma_libfabric::asynchronous::{AsyncEndpoint, POST_PATIENCE};
use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint, Operation, PeerProtocol};
use testkit::PATIENCE;

fn endpoint(rma: bool) -> Arc<LibfabricEndpoint> {
    let configuration = Configuration {
        rma,
        ..Configuration::default()
    };
    Arc::new(LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap())
}

async fn bounded<F: std::future::Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} never resolved"))
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A: both endpoints are wrapped inside a current-thread runtime that is then dropped; a write, a
/// read, a send and a receive, each in a task of its own on another runtime, all resolve.
#[test]
fn futures_resolve_after_the_runtime_that_made_the_endpoint_is_gone() {
    let (server, client) = {
        let first = current_thread();
        let wrapped = first.block_on(async {
            (
                AsyncEndpoint::new(endpoint(true)).unwrap(),
                AsyncEndpoint::new(endpoint(true)).unwrap(),
            )
        });
        drop(first);
        wrapped
    };
    let second = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let len = 64 << 10;
        let source = server.endpoint().register(len).unwrap();
        source.write_bytes(0, &[0x5a; 64 << 10]).unwrap();
        let target = client.endpoint().register(len).unwrap();
        let back = server.endpoint().register(len).unwrap();
        let address = client.endpoint().local_address().unwrap();
        let server_address = server.endpoint().local_address().unwrap();

        let receiving = {
            let client = client.clone();
            tokio::spawn(async move { bounded("a receive", client.receive()).await })
        };
        let lease = bounded("a lease", server.lease(1, &address)).await.unwrap();
        let wrote = bounded(
            "a write",
            server.write(
                lease.lease(),
                source.segment(0, len).unwrap(),
                target.remote(),
            ),
        )
        .await
        .unwrap();
        assert_eq!((Operation::Write, Ok(())), (wrote.operation, wrote.result));
        let read = bounded(
            "a read",
            server.read(
                lease.lease(),
                back.segment(0, len).unwrap(),
                target.remote(),
            ),
        )
        .await
        .unwrap();
        assert_eq!((Operation::Read, Ok(())), (read.operation, read.result));
        let mut seen = vec![0; len];
        back.read_bytes(0, &mut seen).unwrap();
        assert!(seen.iter().all(|&byte| 0x5a == byte), "the read's bytes");
        bounded("a send", server.send(lease.peer(), b"after the runtime"))
            .await
            .unwrap();
        let message = receiving.await.unwrap().unwrap();
        assert_eq!(b"after the runtime".to_vec(), message);
        // And the other way, from a task of its own, with the client's lease on the server.
        let sending = {
            let client = client.clone();
            tokio::spawn(async move {
                let lease = bounded("a lease", client.lease(9, &server_address))
                    .await
                    .unwrap();
                bounded("a send", client.send(lease.peer(), b"back")).await
            })
        };
        assert_eq!(
            b"back".to_vec(),
            bounded("a receive", server.receive()).await.unwrap()
        );
        sending.await.unwrap().unwrap();
    });
}

/// The CPU time this process has used.
fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a live rusage for the call to fill.
    assert_eq!(0, unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr())
    });
    // SAFETY: getrusage filled it (checked above).
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// B: a send to a peer that never progresses (so its connection is never accepted, and every
/// post answers `-FI_EAGAIN`) waits its whole patience for backpressure, and the process uses a
/// small share of a core meanwhile, the driver included. A verdict on CPU time, not on time:
/// a busy machine gives the process less of a core, never more.
#[test]
fn a_post_waiting_for_backpressure_sleeps() {
    // Alone in a process of its own: the CPU time counted is this test's, not its neighbours'.
    if !testkit::in_child_process("a_post_waiting_for_backpressure_sleeps") {
        return;
    }
    let runtime = current_thread();
    let server = runtime.block_on(async { AsyncEndpoint::new(endpoint(false)).unwrap() });
    let silent = endpoint(false); // never progressed: it never accepts the connection
    let address = silent.local_address().unwrap();
    let (spent, wall, answer) = runtime.block_on(async {
        let lease = bounded("a lease", server.lease(1, &address)).await.unwrap();
        let (cpu, wall) = (process_cpu(), Instant::now());
        let answer = bounded("a send", server.send(lease.peer(), b"x")).await;
        (process_cpu() - cpu, wall.elapsed(), answer)
    });
    assert_eq!(Err(DmaError::WouldBlock), answer);
    assert!(wall >= POST_PATIENCE, "it waited its patience: {wall:?}");
    let share = spent.as_secs_f64() / wall.as_secs_f64();
    eprintln!(
        "a send waiting {wall:?} for backpressure used {spent:?} of CPU ({share:.3} of a core)"
    );
    assert!(
        share <= 0.10,
        "a post waiting for backpressure used {share:.2} of a core ({spent:?} over {wall:?})"
    );
}

/// The thread name of each `warn` event whose fields mention `abandoned`.
#[derive(Clone, Default)]
struct AbandonedOn(Arc<(Mutex<Vec<String>>, std::sync::Condvar)>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AbandonedOn {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={value:?} ", field.name()));
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        if fields.0.contains("were abandoned") {
            let thread = std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_string();
            self.0.0.lock().unwrap().push(thread);
            self.0.1.notify_all();
        }
    }
}

/// C: the last clone is dropped, on a runtime thread, with a write in flight to a peer that
/// stopped progressing; the endpoint's drain (which waits up to `DRAIN_PATIENCE` for it, then
/// abandons it) runs on the driver's thread.
#[test]
fn the_last_clone_dropped_with_writes_in_flight_drains_on_the_drivers_thread() {
    use tracing_subscriber::layer::SubscriberExt;
    let abandoned = AbandonedOn::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(abandoned.clone()))
        .expect("this test binary's only global subscriber");
    let peer = endpoint(true);
    let target = peer.register(4096).unwrap();
    let address = peer.local_address().unwrap();
    let server_endpoint = endpoint(true);
    let weak = Arc::downgrade(&server_endpoint);
    let runtime = current_thread();
    let server = AsyncEndpoint::new(server_endpoint).unwrap();
    let source = server.endpoint().register(4096).unwrap();
    let lease = runtime
        .block_on(bounded("a lease", server.lease(1, &address)))
        .unwrap();
    // Connect: the peer progresses for the first write only.
    let connected = testkit::with_progress(&peer, || {
        runtime
            .block_on(bounded(
                "the first write",
                server.write(
                    lease.lease(),
                    source.segment(0, 4096).unwrap(),
                    target.remote(),
                ),
            ))
            .unwrap()
    });
    assert_eq!(Ok(()), connected.result);
    runtime.block_on(async {
        // The peer stops progressing: this write stays in flight (it completes once delivered).
        let in_flight = server.write(
            lease.lease(),
            source.segment(0, 4096).unwrap(),
            target.remote(),
        );
        let dropped = tokio::time::timeout(Duration::from_millis(1), in_flight).await;
        assert!(dropped.is_err(), "the write to a stopped peer completed");
        assert_eq!(1, server.endpoint().operations_in_flight());
    });
    drop((source, lease)); // the `OwnedLease` holds the endpoint too
    {
        let _inside = runtime.enter();
        drop(server); // the last clone, inside the runtime
    }
    // The drain waits its patience for the write (the peer is alive, but does not progress),
    // then abandons it and says so, on whichever thread dropped the endpoint.
    let (said, _) = abandoned
        .0
        .1
        .wait_timeout_while(abandoned.0.0.lock().unwrap(), PATIENCE, |said| {
            said.is_empty()
        })
        .unwrap();
    assert!(weak.upgrade().is_none(), "the endpoint is being dropped");
    assert_eq!(
        vec!["dma-libfabric-async".to_string()],
        *said,
        "the drain ran on the driver's thread"
    );
    drop(said);
    drop(target);
}

/// D: wrapping the same endpoint again right after a drop works, every time, on a
/// current-thread runtime, and each wrapper sends.
#[test]
fn the_same_endpoint_is_wrapped_again_at_once() {
    let runtime = current_thread();
    let shared = endpoint(false);
    let peer = endpoint(false);
    let address = peer.local_address().unwrap();
    for round in 0..10_u8 {
        let wrapped = AsyncEndpoint::new(Arc::clone(&shared))
            .unwrap_or_else(|error| panic!("round {round}: {error}"));
        let lease = runtime
            .block_on(bounded("a lease", wrapped.lease(1, &address)))
            .unwrap();
        testkit::with_progress(&peer, || {
            runtime
                .block_on(bounded("a send", wrapped.send(lease.peer(), &[round])))
                .unwrap();
        });
        drop(lease);
        drop(wrapped);
    }
}

/// Futures on a runtime built without `enable_io` have no reactor to park on: the driver's
/// thread wakes them, as on any runtime, and nothing panics into the caller.
#[test]
fn futures_on_a_runtime_without_io_are_woken_by_the_driver() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = AsyncEndpoint::new(endpoint(true)).unwrap();
        let client = AsyncEndpoint::new(endpoint(true)).unwrap();
        let target = client.endpoint().register(4096).unwrap();
        let source = server.endpoint().register(4096).unwrap();
        source.write_bytes(0, &[3; 4096]).unwrap();
        let address = client.endpoint().local_address().unwrap();
        let lease = bounded("a lease", server.lease(1, &address)).await.unwrap();
        let receiving = {
            let client = client.clone();
            tokio::spawn(async move { bounded("a receive", client.receive()).await })
        };
        let wrote = bounded(
            "a write",
            server.write(
                lease.lease(),
                source.segment(0, 4096).unwrap(),
                target.remote(),
            ),
        )
        .await
        .unwrap();
        assert_eq!(Ok(()), wrote.result);
        bounded("a send", server.send(lease.peer(), b"no reactor"))
            .await
            .unwrap();
        assert_eq!(b"no reactor".to_vec(), receiving.await.unwrap().unwrap());
    });
}

/// While a future is parked on its runtime's reactor the driver stands by; if that runtime's one
/// thread then blocks in a sync call that needs the endpoint's progress (a peer's delivered
/// write into its memory), the driver still reads the queues: the write completes, and the
/// parked receive resolves once the thread is back.
#[test]
fn a_runtime_blocked_in_a_sync_call_does_not_hold_the_endpoints_progress() {
    let (server, client) = (endpoint(true), endpoint(true));
    let len = 1 << 20;
    let target = server.register(len).unwrap();
    let source = client.register(len).unwrap();
    source.write_bytes(0, &vec![0x3c; len]).unwrap();
    let address = server.local_address().unwrap();
    current_thread().block_on(async {
        let wrapped = AsyncEndpoint::new(Arc::clone(&server)).unwrap();
        let receiving = tokio::spawn({
            let wrapped = wrapped.clone();
            async move { wrapped.receive().await }
        });
        // The receive runs first and parks on this runtime's reactor.
        tokio::task::yield_now().await;
        // This thread now blocks: only the server's driver can serve the write.
        let lease = client.cache().lease(1, &address).unwrap();
        let peer = lease.peer();
        client
            .write_within(
                lease.clone(),
                source.segment(0, len).unwrap(),
                target.remote(),
                1,
                PATIENCE,
            )
            .unwrap();
        let completion = client.wait_for(1, PATIENCE).unwrap();
        assert_eq!(Ok(()), completion.result);
        let mut landed = vec![0; len];
        target.read_bytes(0, &mut landed).unwrap();
        assert!(landed.iter().all(|&byte| 0x3c == byte), "the write's bytes");
        client.send_within(peer, b"back", PATIENCE).unwrap();
        let message = bounded("the parked receive", receiving).await;
        assert_eq!(b"back".to_vec(), message.unwrap().unwrap());
    });
}

/// A receive first polled on one runtime, which parks it on that runtime's reactor, and then
/// awaited on another after the first is dropped: its registration's reactor is gone, and it
/// resolves all the same when the message comes.
#[test]
fn a_receive_parked_on_a_runtime_that_is_gone_resolves_on_another() {
    let (server, client) = (endpoint(false), endpoint(false));
    let wrapped = AsyncEndpoint::new(Arc::clone(&server)).unwrap();
    let mut receiving = Box::pin(wrapped.receive());
    let first = current_thread();
    let parked = first.block_on(std::future::poll_fn(|context| {
        std::task::Poll::Ready(receiving.as_mut().poll(context).is_pending())
    }));
    assert!(parked, "nothing was sent yet");
    drop(first);
    let address = server.local_address().unwrap();
    let sending = std::thread::spawn(move || {
        let pinned = client.cache().pin();
        let peer = pinned.resolve(1, &address).unwrap();
        // Its completion needs the server's answer: the server's driver serves it.
        client.send_within(peer, b"elsewhere", PATIENCE).unwrap();
    });
    let message = current_thread().block_on(bounded("the receive", receiving));
    assert_eq!(b"elsewhere".to_vec(), message.unwrap());
    sending.join().unwrap();
}

/// The reactor wakes only the future that parked last on a registration. Here that future is
/// dropped while parked, after another receive parked before it: the message that then arrives
/// wakes nobody through the reactor, and the standing-by driver must read it and wake the
/// receive that is left.
#[test]
fn a_receive_resolves_after_the_future_parked_after_it_is_dropped() {
    let (server, client) = (endpoint(false), endpoint(false));
    let address = server.local_address().unwrap();
    current_thread().block_on(async {
        let wrapped = AsyncEndpoint::new(Arc::clone(&server)).unwrap();
        let receiving = tokio::spawn({
            let wrapped = wrapped.clone();
            async move { wrapped.receive().await }
        });
        // The spawned receive runs first and parks on this runtime's reactor.
        tokio::task::yield_now().await;
        // A second receive parks after it, so the reactor now holds its waker; then it is dropped.
        let mut last = Box::pin(wrapped.receive());
        let parked = std::future::poll_fn(|context| {
            std::task::Poll::Ready(last.as_mut().poll(context).is_pending())
        })
        .await;
        assert!(parked, "nothing was sent yet");
        drop(last);
        let sending = std::thread::spawn(move || {
            let pinned = client.cache().pin();
            let peer = pinned.resolve(1, &address).unwrap();
            client.send_within(peer, b"to the first", PATIENCE).unwrap();
        });
        let message = bounded("the first receive", receiving).await;
        assert_eq!(b"to the first".to_vec(), message.unwrap().unwrap());
        sending.join().unwrap();
    });
}

/// `progress` reads the receive queue only on a credited endpoint; the async face's passes (a
/// future its reactor woke, the driver) read it themselves on a `PeerProtocol::Plain` one. A
/// receive parked on the reactor resolves with a plain peer's messages, one after another.
#[test]
fn a_plain_endpoints_receives_parked_on_the_reactor_resolve() {
    let plain = || {
        let configuration = Configuration {
            peer_protocol: PeerProtocol::Plain,
            ..Configuration::default()
        };
        Arc::new(LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap())
    };
    let (server, client) = (plain(), plain());
    let address = server.local_address().unwrap();
    current_thread().block_on(async {
        let wrapped = AsyncEndpoint::new(Arc::clone(&server)).unwrap();
        for round in 0..3_u8 {
            let receiving = tokio::spawn({
                let wrapped = wrapped.clone();
                async move { wrapped.receive().await }
            });
            // The receive runs first and parks on this runtime's reactor.
            tokio::task::yield_now().await;
            let sending = std::thread::spawn({
                let (client, address) = (Arc::clone(&client), address.clone());
                move || {
                    let pinned = client.cache().pin();
                    let peer = pinned.resolve(1, &address).unwrap();
                    client.send_within(peer, &[round; 8], PATIENCE).unwrap();
                }
            });
            let message = bounded("a plain receive", receiving).await;
            assert_eq!(vec![round; 8], message.unwrap().unwrap());
            sending.join().unwrap();
        }
    });
}
