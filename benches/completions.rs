//! Waiting for completions: sleeping against spinning, and the async API against both, on
//! loopback tcp;ofi_rxm. Prints a markdown table (docs/benchmarks.md, "Completions").
//!
//! - idle CPU: the CPU time a thread blocked in `receive` for 2 s uses (its own clock,
//!   `CLOCK_THREAD_CPUTIME_ID`), with the queues sleeping (`FI_WAIT_FD`, the default) and spinning
//!   (`Configuration::busy_poll`); and the whole process's over 2 s of an idle `AsyncEndpoint`
//!   (its driver task asleep on the fds, the runtime's threads parked);
//! - 4 KiB write latency, one in flight, post to completion read, p50 and p99: sync spinning
//!   (`busy_poll`, `wait_for`), sync sleeping (`wait_for`), async (`AsyncEndpoint::write`, current-
//!   thread runtime); the target is driven the same way (a spinning progress loop, or a thread
//!   sleeping in `progress_sleeping`, or its own `AsyncEndpoint`);
//! - 4 KiB message round trip, one at a time, p50 and p99: one side sends a copied message and
//!   waits for the other's echo; sync (`send_within`, `receive`, sleeping, a thread each) against
//!   async (`AsyncEndpoint::send`, `receive`, a task each on a two-thread runtime, and once more
//!   on a current-thread runtime); `-- --round-trip` runs these alone;
//! - 64 KiB writes with 64 in flight: throughput, sync sleeping against async, the target driven
//!   by a thread of its own sleeping in `progress_sleeping` for both (and, for async, once more
//!   by its own `AsyncEndpoint` on the initiator's single runtime thread); each round runs the
//!   three over one pair of endpoints (one connection), in an order that turns each round.
//!
//! `cargo bench --features tokio --bench completions` (add `-- --quick` for a short run,
//! `-- --throughput` for the throughput rows alone, and `-- --local-writes` for writes that
//! complete once sent, `WriteCompletion::Local`, instead of once delivered).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dma_libfabric::asynchronous::AsyncEndpoint;
use dma_libfabric::{Configuration, LibfabricEndpoint, WriteCompletion};

/// Set by `--local-writes`: every endpoint completes its writes once sent
/// (`WriteCompletion::Local`) instead of once delivered (the default), to measure what the
/// acknowledgement costs.
static LOCAL_WRITES: AtomicBool = AtomicBool::new(false);

/// `Configuration::spin_before_sleep` for every endpoint: `SPIN_BEFORE_SLEEP_US` microseconds
/// (the default's zero when unset).
fn spin_before_sleep() -> Duration {
    let micros = std::env::var("SPIN_BEFORE_SLEEP_US").ok();
    Duration::from_micros(micros.and_then(|text| text.parse().ok()).unwrap_or(0))
}

fn open(busy_poll: bool) -> LibfabricEndpoint {
    let write_completion = if LOCAL_WRITES.load(Ordering::Relaxed) {
        WriteCompletion::Local
    } else {
        WriteCompletion::Delivered
    };
    let configuration = Configuration {
        rma: true,
        busy_poll,
        write_completion,
        spin_before_sleep: spin_before_sleep(),
        // The throughput runs keep `WINDOW` writes in flight to one peer, on both faces: a
        // smaller per-peer budget would hold half of them back as backpressure.
        max_operations_per_peer: WINDOW,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap()
}

fn clock(id: libc::clockid_t) -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a live timespec for the call to fill.
    unsafe { libc::clock_gettime(id, &raw mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

fn percent(cpu: Duration, wall: Duration) -> f64 {
    100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
}

/// The share of a core a thread blocked in `receive(2 s)` uses.
fn idle_receive(busy_poll: bool) -> f64 {
    let endpoint = open(busy_poll);
    let (wall, cpu) = (Instant::now(), clock(libc::CLOCK_THREAD_CPUTIME_ID));
    assert_eq!(None, endpoint.receive(Duration::from_secs(2)).unwrap());
    percent(clock(libc::CLOCK_THREAD_CPUTIME_ID) - cpu, wall.elapsed())
}

/// A runtime of two worker threads, as the sync side's two threads.
fn two_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The share of a core the whole process uses over 2 s of an idle `AsyncEndpoint`.
fn idle_async() -> f64 {
    let runtime = two_thread_runtime();
    runtime.block_on(async {
        let endpoint = AsyncEndpoint::new(Arc::new(open(false))).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (wall, cpu) = (Instant::now(), clock(libc::CLOCK_PROCESS_CPUTIME_ID));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let share = percent(clock(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu, wall.elapsed());
        drop(endpoint);
        share
    })
}

fn quantiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |fraction: f64| samples[((samples.len() - 1) as f64 * fraction) as usize];
    (at(0.5), at(0.99))
}

/// Run `body` while another thread drives `target` (spinning on `progress`, or sleeping in
/// `progress_sleeping`).
fn with_target<R>(target: &LibfabricEndpoint, spin: bool, body: impl FnOnce() -> R) -> R {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Named, so that a profile tells the target's samples from the initiator's.
        let thread = std::thread::Builder::new().name("target".into());
        thread
            .spawn_scoped(scope, || {
                while !stop.load(Ordering::Relaxed) {
                    if spin {
                        target.progress();
                    } else {
                        target.progress_sleeping(Duration::from_millis(50));
                    }
                }
            })
            .unwrap();
        let result = body();
        stop.store(true, Ordering::Relaxed);
        result
    })
}

/// 4 KiB writes, one at a time, sync: (p50, p99).
fn sync_latency(busy_poll: bool, writes: usize) -> (Duration, Duration) {
    let server = open(busy_poll);
    let client = open(busy_poll);
    let source = server.register(4096).unwrap();
    let target = client.register(4096).unwrap();
    let address = client.local_address().unwrap();
    with_target(&client, busy_poll, || {
        let mut samples = Vec::with_capacity(writes);
        for id in 0..(writes + 100) as u64 {
            let lease = server.cache().lease(1, &address).unwrap();
            let posted = Instant::now();
            server
                .write(lease, source.segment(0, 4096).unwrap(), target.remote(), id)
                .unwrap();
            server
                .wait_for(id, Duration::from_secs(10))
                .unwrap()
                .result
                .unwrap();
            if id >= 100 {
                samples.push(posted.elapsed());
            }
        }
        quantiles(samples)
    })
}

/// 4 KiB writes, one at a time, async on a current-thread runtime: (p50, p99).
fn async_latency(writes: usize) -> (Duration, Duration) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = AsyncEndpoint::new(Arc::new(open(false))).unwrap();
        let client = AsyncEndpoint::new(Arc::new(open(false))).unwrap();
        let source = server.endpoint().register(4096).unwrap();
        let target = client.endpoint().register(4096).unwrap();
        let address = client.endpoint().local_address().unwrap();
        let mut samples = Vec::with_capacity(writes);
        for round in 0..writes + 100 {
            let lease = server.lease(1, &address).await.unwrap();
            let posted = Instant::now();
            let done = server
                .write(
                    lease.lease(),
                    source.segment(0, 4096).unwrap(),
                    target.remote(),
                )
                .await
                .unwrap();
            done.result.unwrap();
            if round >= 100 {
                samples.push(posted.elapsed());
            }
        }
        quantiles(samples)
    })
}

const MESSAGE: usize = 4096;

/// 4 KiB message round trips, one at a time, sync: a thread echoes every message back; (p50,
/// p99) of send-to-echo-received.
fn sync_round_trip(rounds: usize) -> (Duration, Duration) {
    let (pinger, ponger) = (open(false), open(false));
    let (pinger_address, ponger_address) = (
        pinger.local_address().unwrap(),
        ponger.local_address().unwrap(),
    );
    let patience = Duration::from_secs(10);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let pinned = ponger.cache().pin();
            let peer = pinned.resolve(1, &pinger_address).unwrap();
            for _ in 0..rounds + 100 {
                let message = ponger.receive(patience).unwrap().unwrap();
                ponger.send_within(peer, &message, patience).unwrap();
            }
        });
        let pinned = pinger.cache().pin();
        let peer = pinned.resolve(1, &ponger_address).unwrap();
        let message = vec![7; MESSAGE];
        let mut samples = Vec::with_capacity(rounds);
        for round in 0..rounds + 100 {
            let sent = Instant::now();
            pinger.send_within(peer, &message, patience).unwrap();
            let echo = pinger.receive(patience).unwrap().unwrap();
            assert_eq!(MESSAGE, echo.len());
            if round >= 100 {
                samples.push(sent.elapsed());
            }
        }
        quantiles(samples)
    })
}

/// The same round trips through the async face: the echo a task of its own, on a two-thread
/// runtime (as sync's two threads), or with `one_thread` on a current-thread runtime (both
/// sides' tasks on one thread).
fn async_round_trip(rounds: usize, one_thread: bool) -> (Duration, Duration) {
    let runtime = if one_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        two_thread_runtime()
    };
    runtime.block_on(async {
        let pinger = AsyncEndpoint::new(Arc::new(open(false))).unwrap();
        let ponger = AsyncEndpoint::new(Arc::new(open(false))).unwrap();
        let pinger_address = pinger.endpoint().local_address().unwrap();
        let ponger_address = ponger.endpoint().local_address().unwrap();
        let echo = tokio::spawn(async move {
            let back = ponger.lease(1, &pinger_address).await.unwrap();
            for _ in 0..rounds + 100 {
                let message = ponger.receive().await.unwrap();
                ponger.send(back.peer(), &message).await.unwrap();
            }
        });
        // A task too, as the echo: `block_on`'s own future runs on the calling thread, which is
        // not one of the runtime's workers, so every wake-up of it would be one more thread hop.
        let ping = tokio::spawn(async move {
            let lease = pinger.lease(1, &ponger_address).await.unwrap();
            let message = vec![7; MESSAGE];
            let mut samples = Vec::with_capacity(rounds);
            for round in 0..rounds + 100 {
                let sent = Instant::now();
                pinger.send(lease.peer(), &message).await.unwrap();
                let echo = pinger.receive().await.unwrap();
                assert_eq!(MESSAGE, echo.len());
                if round >= 100 {
                    samples.push(sent.elapsed());
                }
            }
            samples
        });
        let samples = ping.await.unwrap();
        echo.await.unwrap();
        quantiles(samples)
    })
}

const WINDOW: usize = 64;
const LARGE: usize = 64 << 10;

/// A throughput run's figures: bytes per second, and the initiating thread's own CPU time per
/// write in microseconds (a figure the machine's load moves far less than the rate).
type Rate = (f64, f64);

fn rate(writes: usize, started: Instant, cpu: Duration) -> Rate {
    let cpu = clock(libc::CLOCK_THREAD_CPUTIME_ID) - cpu;
    (
        (writes * LARGE) as f64 / started.elapsed().as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / writes as f64,
    )
}

/// One round's endpoints and memory, which every face of the round uses in turn: on loopback
/// each connection settles at a rate of its own (the sync rate alone moved 1.0–2.8 GB/s from
/// one pair of endpoints to the next), so the faces compared in a round share one connection.
struct Pair {
    server: Arc<LibfabricEndpoint>,
    client: Arc<LibfabricEndpoint>,
    /// One source for every write, on both faces: 64 sources of their own were a 4 MiB working
    /// set for the socket copies against 64 KiB, which stays in cache (an async run's
    /// `_copy_from_iter` was 29% of its thread's samples against 6%).
    source: Arc<dma_libfabric::MemoryRegion<'static>>,
    target: dma_libfabric::MemoryRegion<'static>,
    address: Vec<u8>,
    /// The next sync write's id (ids stay unique on the server across its runs).
    next_id: u64,
}

impl Pair {
    fn open() -> Self {
        let server = Arc::new(open(false));
        let client = Arc::new(open(false));
        let source = Arc::new(server.register_shared(LARGE).unwrap());
        let target = client.register_shared(WINDOW * LARGE).unwrap();
        let address = client.local_address().unwrap();
        Self {
            server,
            client,
            source,
            target,
            address,
            next_id: 0,
        }
    }

    /// The remote slice slot `slot` of the target writes into.
    fn slot(&self, slot: usize) -> dma_libfabric::RemoteRegion {
        self.target
            .remote()
            .slice((slot * LARGE) as u64, LARGE as u64)
            .unwrap()
    }
}

/// 64 KiB writes with 64 in flight, sync sleeping, the target on a thread of its own sleeping
/// in `progress_sleeping`.
fn sync_throughput(pair: &mut Pair, writes: usize) -> Rate {
    let first = pair.next_id;
    pair.next_id += writes as u64;
    let Pair {
        server,
        client,
        source,
        address,
        ..
    } = &*pair;
    with_target(client, false, || {
        let (started, cpu) = (Instant::now(), clock(libc::CLOCK_THREAD_CPUTIME_ID));
        for id in first..first + writes as u64 {
            if id >= first + WINDOW as u64 {
                server
                    .wait_for(id - WINDOW as u64, Duration::from_secs(10))
                    .unwrap()
                    .result
                    .unwrap();
            }
            let lease = server.cache().lease(1, address).unwrap();
            let remote = pair.slot((id % WINDOW as u64) as usize);
            server
                .write(lease, source.segment(0, LARGE).unwrap(), remote, id)
                .unwrap();
        }
        let last = first + writes as u64;
        for id in last.saturating_sub(WINDOW as u64).max(first)..last {
            server.wait_for(id, Duration::from_secs(10)).unwrap();
        }
        rate(writes, started, cpu)
    })
}

/// Where the target of the async throughput run is driven.
#[derive(Clone, Copy)]
enum AsyncTarget {
    /// A thread of its own sleeping in `progress_sleeping`, as in [`sync_throughput`]: the
    /// initiator's runtime thread does only the initiator's work, so the two compare the
    /// initiator's waits alone.
    OwnThread,
    /// Its own `AsyncEndpoint` on the initiator's current-thread runtime: one thread does both
    /// sides' work (the target's socket reads included), against the sync run's two.
    SameRuntime,
}

/// 64 KiB writes with 64 in flight, async (64 tasks, current-thread runtime; its thread's CPU
/// time includes the target's work when that runs on the same runtime).
fn async_throughput(pair: &Pair, writes: usize, driven: AsyncTarget) -> Rate {
    match driven {
        AsyncTarget::OwnThread => with_target(&pair.client, false, || {
            async_throughput_to(pair, writes, driven)
        }),
        AsyncTarget::SameRuntime => async_throughput_to(pair, writes, driven),
    }
}

fn async_throughput_to(pair: &Pair, writes: usize, driven: AsyncTarget) -> Rate {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = AsyncEndpoint::new(Arc::clone(&pair.server)).unwrap();
        let _client_driver = match driven {
            AsyncTarget::SameRuntime => Some(AsyncEndpoint::new(Arc::clone(&pair.client)).unwrap()),
            AsyncTarget::OwnThread => None,
        };
        let (started, cpu) = (Instant::now(), clock(libc::CLOCK_THREAD_CPUTIME_ID));
        let tasks: Vec<_> = (0..WINDOW)
            .map(|slot| {
                let (server, address) = (server.clone(), pair.address.clone());
                let source = Arc::clone(&pair.source);
                let remote = pair.slot(slot);
                tokio::spawn(async move {
                    for _ in 0..writes / WINDOW {
                        let lease = server.lease(1, &address).await.unwrap();
                        let segment = source.segment(0, LARGE).unwrap();
                        server
                            .write(lease.lease(), segment, remote)
                            .await
                            .unwrap()
                            .result
                            .unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        rate(writes / WINDOW * WINDOW, started, cpu)
    })
}

fn micros(duration: Duration) -> String {
    format!("{:.1} µs", duration.as_secs_f64() * 1e6)
}

/// Rounds of the throughput comparison. Each round opens one pair of endpoints and runs sync,
/// async with the target on its own thread, and async with the target on the initiator's
/// runtime over it, in an order that turns by one each round (so neither face always runs first
/// on a fresh connection); the table gives the medians of the rounds' figures and of their
/// per-round ratios. Pairing within a round cancels what moves between connections and with the
/// machine's load, where one long run of each did not (0.68× to 1.39× in three runs at load 7–9).
const ROUNDS: usize = 9;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_unstable_by(f64::total_cmp);
    values[values.len() / 2]
}

/// One round of [`ROUNDS`]: `[sync, async own thread, async same runtime]`, run from `first`.
fn round(writes: usize, first: usize) -> [Rate; 3] {
    let mut pair = Pair::open();
    // The connection is set up before any clock runs, by a write of each face's kind.
    sync_throughput(&mut pair, WINDOW);
    let mut rates = [(0.0, 0.0); 3];
    for step in 0..3 {
        let at = (first + step) % 3;
        rates[at] = match at {
            0 => sync_throughput(&mut pair, writes),
            1 => async_throughput(&pair, writes, AsyncTarget::OwnThread),
            _ => async_throughput(&pair, writes, AsyncTarget::SameRuntime),
        };
    }
    rates
}

/// The throughput rows: sync, async with the target on a thread of its own (as sync's), async
/// with the target on the initiator's runtime; `writes` split over [`ROUNDS`] rounds.
fn throughput(writes: usize) -> f64 {
    let per_round = (writes / ROUNDS).max(WINDOW);
    let rounds: Vec<[Rate; 3]> = (0..ROUNDS).map(|at| round(per_round, at)).collect();
    let of = |pick: &dyn Fn(&[Rate; 3]) -> f64| median(rounds.iter().map(pick).collect());
    let [sync, own, same] = [0, 1, 2].map(|at| of(&|round| round[at].0) / 1e6);
    let [sync_cpu, own_cpu, same_cpu] = [0, 1, 2].map(|at| of(&|round| round[at].1));
    let [own_ratio, same_ratio] = [1, 2].map(|at| of(&|round| round[at].0 / round[0].0));
    let ratios = rounds.iter().map(|round| round[1].0 / round[0].0);
    let low = ratios.clone().fold(f64::MAX, f64::min);
    let high = ratios.fold(0.0, f64::max);
    println!(
        "| 64 KiB writes, 64 in flight ({ROUNDS} rounds of {per_round} writes, each round's faces on one connection, medians), target on its own thread | {sync:.0} MB/s, {sync_cpu:.1} µs CPU/write | | {own:.0} MB/s, {own_cpu:.1} µs CPU/write ({own_ratio:.2}× sync; rounds {low:.2}–{high:.2}×) |"
    );
    println!(
        "| the same, async target on the initiator's runtime thread (its CPU included) | | | {same:.0} MB/s, {same_cpu:.1} µs CPU/write ({same_ratio:.2}× sync) |"
    );
    own_ratio
}

fn main() {
    let quick = std::env::args().any(|argument| "--quick" == argument);
    let (latency_writes, throughput_writes) = if quick {
        (2_000, 4_096)
    } else {
        (20_000, ROUNDS * 16_384)
    };
    let local = std::env::args().any(|argument| "--local-writes" == argument);
    LOCAL_WRITES.store(local, Ordering::Relaxed);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at the start: {}", load.trim());
    println!(
        "spin_before_sleep: {:?} (SPIN_BEFORE_SLEEP_US)",
        spin_before_sleep()
    );
    println!(
        "writes complete: {}",
        if local {
            "once sent (WriteCompletion::Local, --local-writes)"
        } else {
            "once delivered (WriteCompletion::Delivered, the default)"
        }
    );
    println!();
    if std::env::args().any(|argument| "--profile-async" == argument) {
        // Only the async initiator, for a profiler: `perf record -g … -- --profile-async`.
        let mut pair = Pair::open();
        sync_throughput(&mut pair, WINDOW);
        println!(
            "{:?}",
            async_throughput(&pair, throughput_writes, AsyncTarget::OwnThread)
        );
        return;
    }
    if std::env::args().any(|argument| "--profile-sync" == argument) {
        let mut pair = Pair::open();
        sync_throughput(&mut pair, WINDOW);
        println!("{:?}", sync_throughput(&mut pair, throughput_writes));
        return;
    }
    if std::env::args().any(|argument| "--round-trip" == argument) {
        // Only the round trips, sync then async on both runtimes, and their ratios.
        let (sync50, sync99) = sync_round_trip(latency_writes);
        let (async50, async99) = async_round_trip(latency_writes, false);
        let (one50, one99) = async_round_trip(latency_writes, true);
        let ratio = |async50: Duration| async50.as_secs_f64() / sync50.as_secs_f64();
        println!(
            "4 KiB round trip p50 / p99: sync {} / {}, async two workers {} / {} ({:.2}×), \
             async current-thread {} / {} ({:.2}×)",
            micros(sync50),
            micros(sync99),
            micros(async50),
            micros(async99),
            ratio(async50),
            micros(one50),
            micros(one99),
            ratio(one50)
        );
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!("load average at the end: {}", load.trim());
        return;
    }
    if std::env::args().any(|argument| "--throughput" == argument) {
        let _ratio = throughput(throughput_writes);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!("load average at the end: {}", load.trim());
        return;
    }
    println!("| measure | sleeping (default) | spinning (`busy_poll`) | async (tokio) |");
    println!("|---|---|---|---|");
    println!(
        "| idle CPU, a thread blocked in `receive(2 s)` / the process with an idle `AsyncEndpoint` | {:.3}% of a core | {:.1}% of a core | {:.3}% of a core |",
        idle_receive(false),
        idle_receive(true),
        idle_async()
    );
    let (sleep50, sleep99) = sync_latency(false, latency_writes);
    let (spin50, spin99) = sync_latency(true, latency_writes);
    let (async50, async99) = async_latency(latency_writes);
    println!(
        "| 4 KiB write, post to completion, p50 ({latency_writes} writes) | {} | {} | {} |",
        micros(sleep50),
        micros(spin50),
        micros(async50)
    );
    println!(
        "| the same, p99 | {} | {} | {} |",
        micros(sleep99),
        micros(spin99),
        micros(async99)
    );
    let (sync_trip50, sync_trip99) = sync_round_trip(latency_writes);
    let (async_trip50, async_trip99) = async_round_trip(latency_writes, false);
    let (one_trip50, one_trip99) = async_round_trip(latency_writes, true);
    println!(
        "| 4 KiB message round trip, p50 / p99 ({latency_writes} round trips; async: two workers) | {} / {} | | {} / {} |",
        micros(sync_trip50),
        micros(sync_trip99),
        micros(async_trip50),
        micros(async_trip99)
    );
    println!(
        "| the same, async on a current-thread runtime (both sides' tasks on one thread) | | | {} / {} |",
        micros(one_trip50),
        micros(one_trip99)
    );
    let bandwidth = throughput(throughput_writes);
    println!();
    let trip = async_trip50.as_secs_f64() / sync_trip50.as_secs_f64();
    let one_trip = one_trip50.as_secs_f64() / sync_trip50.as_secs_f64();
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!(
        "async ÷ sync, 4 KiB round trip p50: {trip:.2}× on two workers (goal ≤ 1.5×: {}), \
         {one_trip:.2}× on a current-thread runtime",
        verdict(trip <= 1.5)
    );
    println!(
        "async ÷ sync, 64 KiB write bandwidth: {bandwidth:.2}× (goal ≥ 0.95×: {})",
        verdict(bandwidth >= 0.95)
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!();
    println!("load average at the end: {}", load.trim());
}
