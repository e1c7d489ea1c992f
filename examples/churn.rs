//! The churn demo: real endpoints, real traffic, clients restarting under it.
//!
//! A server endpoint and `--clients` client endpoints open on 127.0.0.1 over tcp (or another
//! provider with `--provider`). `--threads` posting threads send real messages to random
//! clients through the server's address cache, each message carrying (client id, incarnation,
//! sequence). A churn thread restarts `--churn-per-sec` clients a second: it withdraws the
//! client's advertisement, releases it from the server, closes its endpoint, opens a fresh one
//! (a new address) and advertises that, so the posting threads resolve the new address and the
//! cache lets the old one go. One receiver thread polls every client (tcp progresses only while
//! the receiving side reads its queue) and checks that every message it receives was meant for
//! that very client *and* incarnation.
//!
//! Every tcp incarnation opens on a loopback IP of its own (`127.1.X.Y`, never reused in a run),
//! so a stale address can never reach a new endpoint that the OS happened to give the old port:
//! that would be an ABA below the cache, which no cache could see.
//!
//! At the end every client is released, the cache quiesced, and the AV must be empty with every
//! `fi_av_insert` matched by one `fi_av_remove`. The demo exits non-zero if any message was
//! misdirected or any AV entry leaked. Messages lost to a client that departed are counted apart
//! and are not errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint, Provider};
use indicatif::{ProgressBar, ProgressStyle};

/// Command-line flags.
#[derive(Debug, Parser)]
#[command(about = "Clients restart while posting threads send through the server's address cache")]
struct Flags {
    /// Client endpoints.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Posting threads on the server.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Client restarts per second.
    #[arg(long, default_value_t = 20.0)]
    churn_per_sec: f64,
    /// How long the traffic runs, in seconds.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// The provider: tcp, tcp-native (libfabric 2.x), verbs, shm, sockets, udp, efa or
    /// efa-direct.
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// No progress bar (for scripts and the test suite).
    #[arg(long)]
    no_progress: bool,
}

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// How long a posting thread keeps retrying a send the provider pushes back on before it counts
/// the message as undeliverable (a client that departed, or one that never accepts).
const SEND_PATIENCE: Duration = Duration::from_millis(20);
/// How long the end of the run waits for messages still in flight to live clients.
const DRAIN_PATIENCE: Duration = Duration::from_secs(3);
/// One in this many hit latencies is kept for the percentiles.
const HIT_SAMPLING: u64 = 8;
/// The message: client id, incarnation, sequence.
const MESSAGE_LEN: usize = 24;

fn provider(name: &str) -> Result<Provider> {
    Ok(match name {
        "tcp" => Provider::Tcp,
        "tcp-native" => Provider::TcpNative,
        "verbs" => Provider::Verbs,
        "shm" => Provider::Shm,
        "sockets" => Provider::Sockets,
        "udp" => Provider::Udp,
        "efa" => Provider::Efa,
        "efa-direct" => Provider::EfaDirect,
        other => return Err(format!("unknown provider {other:?}").into()),
    })
}

/// What one incarnation of a client was sent and received.
#[derive(Debug, Default)]
struct Traffic {
    /// Messages the server's provider accepted for this incarnation.
    sent: AtomicU64,
    /// Messages this incarnation received that were meant for it.
    received: AtomicU64,
}

/// What a client advertises to the server: its current incarnation and address.
#[derive(Debug, Clone)]
struct Advert {
    incarnation: u64,
    address: Vec<u8>,
    traffic: Arc<Traffic>,
}

/// One client endpoint, while it lives.
struct Incarnation {
    incarnation: u64,
    endpoint: LibfabricEndpoint,
    traffic: Arc<Traffic>,
}

/// One client id: its live incarnation, and what it advertises.
struct Client {
    live: RwLock<Option<Incarnation>>,
    advert: RwLock<Option<Advert>>,
}

/// Counters only one posting thread writes.
#[derive(Debug, Default)]
struct PostStats {
    sent: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    undeliverable: AtomicU64,
    resolve_errors: AtomicU64,
}

/// Loopback addresses for new incarnations, none used twice in a run.
struct Nodes {
    next: AtomicU64,
    provider: Provider,
}

impl Nodes {
    fn next(&self) -> Option<String> {
        match self.provider {
            Provider::Tcp
            | Provider::TcpNative
            | Provider::Sockets
            | Provider::Verbs
            | Provider::Udp => {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                // 127.B.X.Y with B in 1..=254, X in 0..=255, Y in 1..=254.
                let y = 1 + n % 254;
                let x = (n / 254) % 256;
                let b = 1 + n / (254 * 256);
                Some(format!("127.{b}.{x}.{y}"))
            }
            _ => None,
        }
    }
}

/// Everything the threads share.
struct World {
    server: LibfabricEndpoint,
    clients: Vec<Client>,
    configuration: Configuration,
    nodes: Nodes,
    stop_posting: AtomicBool,
    stop_receiving: AtomicBool,
    misdirected: AtomicU64,
    receive_errors: AtomicU64,
    restarts: AtomicU64,
    /// The traffic of every incarnation that has departed.
    departed: Mutex<Vec<Arc<Traffic>>>,
}

impl World {
    /// Open client `id`'s incarnation `incarnation` and advertise it.
    fn start_client(&self, id: usize, incarnation: u64) -> Result<()> {
        let node = self.nodes.next();
        let endpoint = LibfabricEndpoint::open(&self.configuration, node.as_deref())?;
        let address = endpoint.local_address()?;
        let traffic = Arc::new(Traffic::default());
        let client = &self.clients[id];
        *client.live.write().map_err(|_| "poisoned")? = Some(Incarnation {
            incarnation,
            endpoint,
            traffic: Arc::clone(&traffic),
        });
        *client.advert.write().map_err(|_| "poisoned")? = Some(Advert {
            incarnation,
            address,
            traffic,
        });
        Ok(())
    }

    /// Withdraw client `id`'s advertisement, release it from the server, and close its endpoint.
    fn stop_client(&self, id: usize) -> Result<Option<u64>> {
        let client = &self.clients[id];
        client.advert.write().map_err(|_| "poisoned")?.take();
        self.server.peers().release(id as u64);
        let old = client.live.write().map_err(|_| "poisoned")?.take();
        Ok(old.map(|old| {
            // What arrived but was never read is lost with the client, like the rest.
            self.receive_from(id, &old);
            self.departed
                .lock()
                .map(|mut departed| departed.push(Arc::clone(&old.traffic)))
                .ok();
            old.incarnation
        }))
    }

    /// Read what `incarnation` of client `id` has received, checking each message.
    fn receive_from(&self, id: usize, incarnation: &Incarnation) -> usize {
        let mut read = 0;
        loop {
            match incarnation.endpoint.try_receive() {
                Ok(Some(message)) => {
                    read += 1;
                    let (to, to_incarnation) = decode(&message);
                    if to == Some(id as u64) && to_incarnation == Some(incarnation.incarnation) {
                        incarnation.traffic.received.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.misdirected.fetch_add(1, Ordering::Relaxed);
                        eprintln!(
                            "MISDIRECTED: client {id} incarnation {} received a message for client {to:?} incarnation {to_incarnation:?}",
                            incarnation.incarnation
                        );
                    }
                }
                Ok(None) => return read,
                Err(error) => {
                    // An error completion (a peer that went away, say) re-posts its buffer.
                    self.receive_errors.fetch_add(1, Ordering::Relaxed);
                    tracing_error(&error);
                    return read;
                }
            }
        }
    }
}

fn tracing_error(error: &DmaError) {
    if std::env::var_os("CHURN_VERBOSE").is_some() {
        eprintln!("receive error: {error}");
    }
}

fn encode(client: u64, incarnation: u64, sequence: u64) -> [u8; MESSAGE_LEN] {
    let mut message = [0_u8; MESSAGE_LEN];
    message[0..8].copy_from_slice(&client.to_le_bytes());
    message[8..16].copy_from_slice(&incarnation.to_le_bytes());
    message[16..24].copy_from_slice(&sequence.to_le_bytes());
    message
}

fn decode(message: &[u8]) -> (Option<u64>, Option<u64>) {
    let word = |range: std::ops::Range<usize>| {
        message
            .get(range)
            .and_then(|bytes| bytes.try_into().ok())
            .map(u64::from_le_bytes)
    };
    (word(0..8), word(8..16))
}

/// A small deterministic generator (xorshift64*).
struct Random(u64);

impl Random {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound.max(1)
    }
}

/// Latency samples, in nanoseconds.
#[derive(Debug, Default)]
struct Samples {
    hits: Vec<u64>,
    misses: Vec<u64>,
}

/// One posting thread: resolve a random client's advertised address and send it a message.
fn post(world: &World, seed: u64, stats: &PostStats) -> Samples {
    let mut random = Random(seed | 1);
    let mut samples = Samples::default();
    let mut sequence = 0_u64;
    let clients = world.clients.len() as u64;
    let cache = world.server.peers();
    while !world.stop_posting.load(Ordering::Relaxed) {
        let id = random.below(clients);
        let Some(advert) = world.clients[id as usize]
            .advert
            .read()
            .ok()
            .and_then(|advert| advert.clone())
        else {
            continue; // restarting
        };
        sequence += 1;
        let pinned = cache.pin();
        let started = Instant::now();
        let (peer, hit) = match pinned.try_resolve(id, &advert.address) {
            Ok(peer) => (Ok(peer), true),
            Err(DmaError::WouldBlock) => (pinned.resolve(id, &advert.address), false),
            Err(error) => (Err(error), false),
        };
        let took = started.elapsed().as_nanos() as u64;
        let peer = match peer {
            Ok(peer) => peer,
            Err(_) => {
                stats.resolve_errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        if hit {
            stats.hits.fetch_add(1, Ordering::Relaxed);
            if 0 == sequence % HIT_SAMPLING {
                samples.hits.push(took);
            }
        } else {
            stats.misses.fetch_add(1, Ordering::Relaxed);
            samples.misses.push(took);
        }
        let message = encode(id, advert.incarnation, sequence);
        let deadline = Instant::now() + SEND_PATIENCE;
        let sent = loop {
            match world.server.try_send(peer, &message) {
                Ok(()) => break true,
                Err(DmaError::WouldBlock) if Instant::now() < deadline => {
                    world.server.progress();
                    thread::yield_now();
                }
                Err(_) => break false,
            }
        };
        drop(pinned);
        if sent {
            advert.traffic.sent.fetch_add(1, Ordering::Relaxed);
            stats.sent.fetch_add(1, Ordering::Relaxed);
        } else {
            stats.undeliverable.fetch_add(1, Ordering::Relaxed);
        }
    }
    samples
}

/// The receiver: poll every client round-robin until told to stop.
fn receive(world: &World) {
    while !world.stop_receiving.load(Ordering::Relaxed) {
        let mut read = 0;
        for (id, client) in world.clients.iter().enumerate() {
            if let Ok(live) = client.live.read() {
                if let Some(incarnation) = live.as_ref() {
                    read += world.receive_from(id, incarnation);
                }
            }
        }
        world.server.progress();
        if 0 == read {
            thread::yield_now();
        }
    }
}

/// The churn thread: restart a random client `rate` times a second.
fn churn(world: &World, rate: f64, seed: u64) -> Result<()> {
    if rate <= 0.0 {
        return Ok(());
    }
    let mut random = Random(seed | 1);
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut next = Instant::now() + period;
    let mut incarnations = vec![0_u64; world.clients.len()];
    while !world.stop_posting.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            // Pacing, not synchronisation: the churn rate is a wall-clock rate.
            thread::sleep((next - now).min(Duration::from_millis(50)));
            continue;
        }
        next += period;
        let id = random.below(world.clients.len() as u64) as usize;
        world.stop_client(id)?;
        incarnations[id] += 1;
        world.start_client(id, incarnations[id])?;
        world.restarts.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

fn percentile(sorted: &[u64], fraction: f64) -> String {
    if sorted.is_empty() {
        return "-".into();
    }
    let index = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    let nanos = sorted[index.min(sorted.len() - 1)];
    if nanos >= 10_000 {
        format!("{:.1} us", nanos as f64 / 1000.0)
    } else {
        format!("{nanos} ns")
    }
}

fn totals(stats: &[Arc<PostStats>]) -> (u64, u64, u64, u64, u64) {
    stats.iter().fold((0, 0, 0, 0, 0), |acc, stats| {
        (
            acc.0 + stats.sent.load(Ordering::Relaxed),
            acc.1 + stats.hits.load(Ordering::Relaxed),
            acc.2 + stats.misses.load(Ordering::Relaxed),
            acc.3 + stats.undeliverable.load(Ordering::Relaxed),
            acc.4 + stats.resolve_errors.load(Ordering::Relaxed),
        )
    })
}

fn main() -> ExitCode {
    // rxm reads its buffer sizes from the environment once, when libfabric initialises: the
    // configuration's sizing (4 KiB bounce buffers instead of 16 KiB) goes in first.
    // SAFETY: nothing else runs yet (no thread has been spawned and libfabric has not been
    // initialised), so no one reads the environment concurrently.
    if let Err(error) = unsafe { Configuration::default().apply_rxm_environment() } {
        eprintln!("churn: {error}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("churn: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Run the demo; `Ok(false)` when a message was misdirected or an AV entry leaked.
fn run() -> Result<bool> {
    let flags = Flags::parse();
    if 0 == flags.clients || 0 == flags.threads {
        return Err("--clients and --threads must be at least 1".into());
    }
    let provider = provider(&flags.provider)?;
    let configuration = Configuration {
        providers: vec![provider],
        bind: None,
        av_capacity: (flags.clients * 4).max(256),
        ..Configuration::default()
    };
    let nodes = Nodes {
        next: AtomicU64::new(0),
        provider,
    };
    let server_node = nodes.next();
    let server = LibfabricEndpoint::open(&configuration, server_node.as_deref())?;
    let description = server.describe().clone();
    let world = Arc::new(World {
        server,
        clients: (0..flags.clients)
            .map(|_| Client {
                live: RwLock::new(None),
                advert: RwLock::new(None),
            })
            .collect(),
        configuration,
        nodes,
        stop_posting: AtomicBool::new(false),
        stop_receiving: AtomicBool::new(false),
        misdirected: AtomicU64::new(0),
        receive_errors: AtomicU64::new(0),
        restarts: AtomicU64::new(0),
        departed: Mutex::new(Vec::new()),
    });
    for id in 0..flags.clients {
        world.start_client(id, 0)?;
    }
    println!(
        "churn: server on {} ({}), {} clients, {} posting threads, {} restarts/s, {} s",
        description.provider,
        server_node.as_deref().unwrap_or("provider's choice"),
        flags.clients,
        flags.threads,
        flags.churn_per_sec,
        flags.seconds
    );

    let receiver = {
        let world = Arc::clone(&world);
        thread::Builder::new()
            .name("receiver".into())
            .spawn(move || receive(&world))?
    };
    let post_stats: Vec<Arc<PostStats>> = (0..flags.threads)
        .map(|_| Arc::new(PostStats::default()))
        .collect();
    let posters: Vec<_> = post_stats
        .iter()
        .enumerate()
        .map(|(n, stats)| {
            let world = Arc::clone(&world);
            let stats = Arc::clone(stats);
            thread::Builder::new()
                .name(format!("poster-{n}"))
                .spawn(move || post(&world, 0x9e37_79b9_7f4a_7c15 ^ (n as u64 + 1), &stats))
        })
        .collect::<std::result::Result<_, _>>()?;
    let churner = {
        let world = Arc::clone(&world);
        let rate = flags.churn_per_sec;
        thread::Builder::new()
            .name("churn".into())
            .spawn(move || churn(&world, rate, 0x2545_f491))?
    };

    let started = Instant::now();
    let run_for = Duration::from_secs_f64(flags.seconds.max(0.0));
    let bar = if flags.no_progress {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(run_for.as_millis() as u64).with_style(
            ProgressStyle::with_template("{bar:24} {elapsed}/{duration} {msg}")?
                .progress_chars("=> "),
        )
    };
    let mut last = (Instant::now(), 0_u64);
    while started.elapsed() < run_for {
        // The bar's refresh period: pacing, not synchronisation.
        thread::sleep(Duration::from_millis(200).min(run_for.saturating_sub(started.elapsed())));
        let (sent, hits, misses, _, _) = totals(&post_stats);
        let now = Instant::now();
        let rate = (sent - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-9);
        last = (now, sent);
        let stats = world.server.peers().stats();
        bar.set_position(started.elapsed().as_millis() as u64);
        bar.set_message(format!(
            "{:>8.0} msg/s  hit {:>6.2}%  misses {misses}  inserts {}  removals {}  pending {}",
            rate,
            100.0 * hits as f64 / (hits + misses).max(1) as f64,
            stats.inserts,
            stats.removes,
            stats.pending_removals
        ));
    }
    bar.finish_and_clear();
    let elapsed = started.elapsed();

    world.stop_posting.store(true, Ordering::Relaxed);
    let mut samples = Samples::default();
    for poster in posters {
        let mut part = poster.join().map_err(|_| "a posting thread panicked")?;
        samples.hits.append(&mut part.hits);
        samples.misses.append(&mut part.misses);
    }
    churner.join().map_err(|_| "the churn thread panicked")??;

    // Let what is in flight to live clients arrive.
    let drain_deadline = Instant::now() + DRAIN_PATIENCE;
    let live_pending = || -> u64 {
        world
            .clients
            .iter()
            .filter_map(|client| client.advert.read().ok().and_then(|advert| advert.clone()))
            .map(|advert| {
                advert
                    .traffic
                    .sent
                    .load(Ordering::Relaxed)
                    .saturating_sub(advert.traffic.received.load(Ordering::Relaxed))
            })
            .sum()
    };
    while 0 < live_pending() && Instant::now() < drain_deadline {
        thread::yield_now();
    }
    world.stop_receiving.store(true, Ordering::Relaxed);
    receiver
        .join()
        .map_err(|_| "the receiver thread panicked")?;
    let last_incarnations: Vec<Arc<Traffic>> = world
        .clients
        .iter()
        .filter_map(|client| client.advert.read().ok().and_then(|advert| advert.clone()))
        .map(|advert| advert.traffic)
        .collect();

    // Every client leaves; the AV must end empty.
    for id in 0..world.clients.len() {
        world.stop_client(id)?;
    }
    let cache = world.server.peers();
    cache.quiesce();
    let stats = cache.stats();
    let indexed = cache.indexed();
    let leaked = stats.entries != 0
        || stats.pending_removals != 0
        || stats.inserts != stats.removes
        || indexed != 0;

    let missing = |traffic: &Arc<Traffic>| {
        traffic
            .sent
            .load(Ordering::Relaxed)
            .saturating_sub(traffic.received.load(Ordering::Relaxed))
    };
    let undelivered_live: u64 = last_incarnations.iter().map(missing).sum();
    let departed = world.departed.lock().map_err(|_| "poisoned")?;
    let lost_departed = departed
        .iter()
        .map(missing)
        .sum::<u64>()
        .saturating_sub(undelivered_live);
    let received: u64 = departed
        .iter()
        .map(|traffic| traffic.received.load(Ordering::Relaxed))
        .sum();
    drop(departed);
    let (sent, hits, misses, undeliverable, resolve_errors) = totals(&post_stats);
    let misdirected = world.misdirected.load(Ordering::Relaxed);
    samples.hits.sort_unstable();
    samples.misses.sort_unstable();

    let rows: Vec<(&str, String)> = vec![
        ("provider", description.provider.clone()),
        (
            "clients / posting threads",
            format!("{} / {}", flags.clients, flags.threads),
        ),
        ("run time", format!("{:.1} s", elapsed.as_secs_f64())),
        (
            "client restarts",
            world.restarts.load(Ordering::Relaxed).to_string(),
        ),
        ("messages sent", sent.to_string()),
        (
            "messages/s",
            format!("{:.0}", sent as f64 / elapsed.as_secs_f64()),
        ),
        ("messages received", received.to_string()),
        ("misdirected", misdirected.to_string()),
        ("lost to departed clients", lost_departed.to_string()),
        ("undelivered to live clients", undelivered_live.to_string()),
        (
            "undeliverable sends (peer gone or busy)",
            undeliverable.to_string(),
        ),
        ("resolve errors", resolve_errors.to_string()),
        (
            "receive error completions",
            world.receive_errors.load(Ordering::Relaxed).to_string(),
        ),
        (
            "hit rate",
            format!(
                "{:.3}%",
                100.0 * hits as f64 / (hits + misses).max(1) as f64
            ),
        ),
        ("hits / misses", format!("{hits} / {misses}")),
        (
            "resolve p50 / p99, hit",
            format!(
                "{} / {}",
                percentile(&samples.hits, 0.5),
                percentile(&samples.hits, 0.99)
            ),
        ),
        (
            "resolve p50 / p99, miss",
            format!(
                "{} / {}",
                percentile(&samples.misses, 0.5),
                percentile(&samples.misses, 0.99)
            ),
        ),
        ("cache misses (writer requests)", stats.misses.to_string()),
        (
            "fi_av_insert / fi_av_remove",
            format!("{} / {}", stats.inserts, stats.removes),
        ),
        ("evictions", stats.evictions.to_string()),
        ("AV entries left after shutdown", stats.entries.to_string()),
        (
            "pending removals after shutdown",
            stats.pending_removals.to_string(),
        ),
        ("index registrations after shutdown", indexed.to_string()),
    ];
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let value_width = rows.iter().map(|(_, value)| value.len()).max().unwrap_or(0);
    println!("| {:width$} | {:>value_width$} |", "figure", "value");
    println!(
        "|{}|{}:|",
        "-".repeat(width + 2),
        "-".repeat(value_width + 1)
    );
    for (name, value) in &rows {
        println!("| {name:width$} | {value:>value_width$} |");
    }

    let mut ok = true;
    if 0 < misdirected {
        eprintln!("FAIL: {misdirected} messages reached a client they were not meant for");
        ok = false;
    }
    if leaked {
        eprintln!(
            "FAIL: AV entries leaked: {} live, {} pending, {} inserts vs {} removes, {} indexed",
            stats.entries, stats.pending_removals, stats.inserts, stats.removes, indexed
        );
        ok = false;
    }
    if ok {
        println!("ok: no message misdirected, no AV entry leaked");
    }
    Ok(ok)
}
