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
//!
//! With `--rma` the posting threads write instead of sending: each client incarnation registers
//! a buffer of record slots and advertises its `RemoteRegion` beside its address; each posting
//! thread `fi_write`s records (client, incarnation, sequence, checksum) from its own registered
//! buffer into the chosen client's memory, against a `Lease` taken under its pin; a completion
//! thread reaps the completions (which drops the leases); the receiver thread checks every record
//! that lands in each client's memory. The demo then also exits non-zero if a record reached the
//! wrong client or a write never completed. `--no-leases` posts the same writes with no lease
//! (`write_unleased`), so an entry's `fi_av_remove` may run under a write in flight: the contrast
//! `docs/rma.md` ("The churn demo on RMA writes") measures, with and without
//! `FI_AV_REMOVE_CLEANUP=1`.
//!
//! With `--rma --rails N` the server and every client incarnation are rail sets of `N` tcp
//! rails, each rail on a loopback IP of its own: the posting threads resolve and lease a client
//! on every rail at once (`RailPinned`), and write through `RailSet::write`, which sends short
//! writes whole to one rail, round-robin, and cuts every `LARGE_EVERY`th write, of
//! `LARGE_WRITE` bytes, into stripes across the rails; one completion comes back per write. A
//! large write carries its record at the start of every 128 KiB and at its end, so each stripe
//! carries one, and the client checks that a large slot whose records have all landed holds one
//! write of its own incarnation (a record whose stripes landed in two incarnations is counted
//! as `striped records torn`, and must be 0).
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The table and the verdict, in a file of their own (beside this one: `examples/churn/` has no
// `main.rs`, so cargo takes it for no example of its own).
#[path = "churn/report.rs"]
mod report;

use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use dma_libfabric::{
    AddressCache, CacheStats, Configuration, Description, DmaError, LibfabricEndpoint, MIN_STRIPE,
    MemoryRegion, Peer, Pinned, Provider, RailRegion, RailRemoteRegion, RailSet, RemoteRegion,
};
use indicatif::{ProgressBar, ProgressStyle};
// An RMA record (client id, incarnation, sequence, checksum) and the report table, shared with
// the fleet demo.
use testkit::demo::{RECORD_LEN, decode_record, encode_record, print_table};

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
    /// Write records into registered client memory (fi_write) instead of sending messages.
    #[arg(long)]
    rma: bool,
    /// With --rma: post the writes without leases, so an AV entry may be removed under a write
    /// in flight. For measuring what leases prevent; never the default.
    #[arg(long, requires = "rma")]
    no_leases: bool,
    /// With --rma: bytes per write (the record, padded; at least 32). Large writes fill the
    /// sockets, so writes are still in flight when their client departs.
    #[arg(long, default_value_t = RECORD_LEN, requires = "rma")]
    write_size: usize,
    /// With --rma: the server and every client are rail sets of this many tcp rails (1 to 8),
    /// and one write in `LARGE_EVERY` is a large one, striped across them. 0: one endpoint each.
    #[arg(long, default_value_t = 0, requires = "rma")]
    rails: usize,
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
/// Record slots in each client incarnation's registered memory.
const CLIENT_SLOTS: usize = 64;
/// Record slots in each posting thread's registered source memory: a slot is reused only once
/// its write has completed.
const SOURCE_SLOTS: usize = 64;
/// With --rails: one write in this many is a large one.
const LARGE_EVERY: u64 = 8;
/// With --rails: the large write's length, three minimum stripes (two stripes on two rails,
/// three on three or more).
const LARGE_WRITE: usize = 3 * MIN_STRIPE;
/// With --rails: large slots in each client incarnation's memory, after its record slots.
const LARGE_SLOTS: usize = 4;
/// With --rails: where a large write carries its record: every 128 KiB, and its last bytes.
const LARGE_RECORDS: [usize; 4] = [0, MIN_STRIPE, 2 * MIN_STRIPE, LARGE_WRITE - RECORD_LEN];

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
    /// RMA records found in this incarnation's memory that were meant for it.
    records: AtomicU64,
}

/// What a client advertises to the server: its current incarnation and address.
#[derive(Debug, Clone)]
struct Advert {
    incarnation: u64,
    address: Vec<u8>,
    /// With --rma: the incarnation's `RemoteRegion`, as advertised bytes.
    memory: Option<[u8; RemoteRegion::ENCODED_LEN]>,
    /// With --rails: every rail's address, and the `RailRemoteRegion` as advertised bytes.
    rails: Option<(Vec<Vec<u8>>, Vec<u8>)>,
    traffic: Arc<Traffic>,
}

/// One client endpoint, while it lives.
struct Incarnation {
    incarnation: u64,
    /// With --rma: the memory peers write records into. Declared before the endpoint, which it
    /// holds too.
    memory: Option<MemoryRegion<'static>>,
    /// With --rails: the client's memory on every rail (which holds its rail set), instead of
    /// `memory` and `endpoint`.
    rails: Option<RailRegion<'static>>,
    /// With --rails: the client's rail set (its memory holds it too).
    rail_set: Option<Arc<RailSet>>,
    endpoint: Option<Arc<LibfabricEndpoint>>,
    traffic: Arc<Traffic>,
}

/// One client id: its live incarnation, and what it advertises.
struct Client {
    live: RwLock<Option<Incarnation>>,
    advert: RwLock<Option<Advert>>,
}

impl Client {
    /// What the client advertises now: `None` while it restarts (or if its lock was poisoned).
    fn advert(&self) -> Option<Advert> {
        self.advert.read().ok().and_then(|advert| advert.clone())
    }
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
    /// With --rails: the server's rail set, which the posting threads use instead of `server`.
    rail_server: Option<RailSet>,
    rails: usize,
    /// With --rails: large slots whose records named two incarnations (or clients).
    striped_torn: AtomicU64,
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
    /// With --rma.
    rma: RmaStats,
    /// With --rma: per posting thread, which source slots have a write in flight.
    busy: Vec<Vec<AtomicBool>>,
    no_leases: bool,
    /// With --rma: bytes per write and per record slot.
    write_size: usize,
    stop_completions: AtomicBool,
}

/// The RMA rows of the summary.
#[derive(Debug, Default)]
struct RmaStats {
    posted: AtomicU64,
    completed_ok: AtomicU64,
    completed_error: AtomicU64,
    /// Of those, completed with `FI_ECANCELED`: rxm cancels what is queued on a connection it
    /// closes (on `fi_av_remove` with `FI_AV_REMOVE_CLEANUP=1`).
    cancelled: AtomicU64,
    misdirected: AtomicU64,
    /// Records that failed their checksum when read (a write still landing): read again later.
    torn: AtomicU64,
    /// The most removals the completion thread saw held back by a lease at once: entries whose
    /// readers had all gone while a write to them was still in flight.
    peak_awaiting_leases: AtomicU64,
}

impl World {
    /// Open client `id`'s incarnation `incarnation` and advertise it.
    fn start_client(&self, id: usize, incarnation: u64) -> Result<()> {
        if 0 < self.rails {
            return self.start_rail_client(id, incarnation);
        }
        let node = self.nodes.next();
        let endpoint = Arc::new(LibfabricEndpoint::open(
            &self.configuration,
            node.as_deref(),
        )?);
        let address = endpoint.local_address()?;
        let memory = if self.configuration.rma {
            Some(endpoint.register_shared(CLIENT_SLOTS * self.write_size)?)
        } else {
            None
        };
        let advertised = memory.as_ref().map(|memory| memory.remote().to_bytes());
        let traffic = Arc::new(Traffic::default());
        let client = &self.clients[id];
        *client.live.write().map_err(|_| "poisoned")? = Some(Incarnation {
            incarnation,
            memory,
            rails: None,
            rail_set: None,
            endpoint: Some(endpoint),
            traffic: Arc::clone(&traffic),
        });
        *client.advert.write().map_err(|_| "poisoned")? = Some(Advert {
            incarnation,
            address,
            memory: advertised,
            rails: None,
            traffic,
        });
        Ok(())
    }

    /// [`start_client`](Self::start_client) as a rail set, each rail on a loopback IP of its own.
    fn start_rail_client(&self, id: usize, incarnation: u64) -> Result<()> {
        let nodes: Vec<String> = (0..self.rails)
            .map(|_| self.nodes.next().ok_or("--rails needs loopback IPs (tcp)"))
            .collect::<std::result::Result<_, _>>()?;
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let set = Arc::new(RailSet::open(&self.configuration, &nodes)?);
        let addresses = set.local_addresses();
        let memory =
            set.register_shared(CLIENT_SLOTS * self.write_size + LARGE_SLOTS * LARGE_WRITE)?;
        let advertised = memory.remote().to_bytes();
        let traffic = Arc::new(Traffic::default());
        let client = &self.clients[id];
        *client.live.write().map_err(|_| "poisoned")? = Some(Incarnation {
            incarnation,
            memory: None,
            rails: Some(memory),
            rail_set: Some(set),
            endpoint: None,
            traffic: Arc::clone(&traffic),
        });
        *client.advert.write().map_err(|_| "poisoned")? = Some(Advert {
            incarnation,
            address: Vec::new(),
            memory: None,
            rails: Some((addresses, advertised)),
            traffic,
        });
        Ok(())
    }

    /// Withdraw client `id`'s advertisement, release it from the server, and close its endpoint.
    fn stop_client(&self, id: usize) -> Result<Option<u64>> {
        let client = &self.clients[id];
        client.advert.write().map_err(|_| "poisoned")?.take();
        self.server.cache().release(id as u64);
        if let Some(rails) = &self.rail_server {
            rails.release(id as u64);
        }
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
        if let Some(memory) = &incarnation.rails {
            // Progress first: on tcp a write lands while its target reads its queues.
            if let Some(set) = &incarnation.rail_set {
                set.progress();
            }
            read += self.check_rail_records(id, incarnation, memory);
        }
        let Some(endpoint) = &incarnation.endpoint else {
            return read;
        };
        if let Some(memory) = &incarnation.memory {
            // Progress first: on tcp a write lands while its target reads its queues.
            endpoint.progress();
            read += self.check_records(id, incarnation, memory);
        }
        loop {
            match endpoint.try_receive() {
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

impl World {
    /// Check every record that has landed in `memory` since the last look, and clear it.
    fn check_records(
        &self,
        id: usize,
        incarnation: &Incarnation,
        memory: &MemoryRegion<'_>,
    ) -> usize {
        let mut found = 0;
        let mut record = [0_u8; RECORD_LEN];
        for slot in 0..CLIENT_SLOTS {
            let at = slot * self.write_size;
            if memory.read_bytes(at, &mut record).is_err() || record == [0; RECORD_LEN] {
                continue;
            }
            let Some((client, to_incarnation, sequence)) = decode_record(&record) else {
                self.rma.torn.fetch_add(1, Ordering::Relaxed);
                continue; // still landing: look again next round
            };
            found += 1;
            if client == id as u64 && to_incarnation == incarnation.incarnation {
                incarnation.traffic.records.fetch_add(1, Ordering::Relaxed);
            } else {
                self.rma.misdirected.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "MISDIRECTED WRITE: client {id} incarnation {} holds record {sequence} for client {client} incarnation {to_incarnation}",
                    incarnation.incarnation
                );
            }
            let _ = memory.write_bytes(at, &[0; RECORD_LEN]);
        }
        found
    }
}

impl World {
    /// [`check_records`](Self::check_records) for a rail client: its record slots, then its large
    /// slots, each of which must hold one write, of this incarnation, once all its records (one
    /// per stripe at least) have landed.
    fn check_rail_records(
        &self,
        id: usize,
        incarnation: &Incarnation,
        memory: &RailRegion<'_>,
    ) -> usize {
        let mut found = 0;
        let mut record = [0_u8; RECORD_LEN];
        let check = |client: u64, to_incarnation: u64, sequence: u64| {
            if client == id as u64 && to_incarnation == incarnation.incarnation {
                incarnation.traffic.records.fetch_add(1, Ordering::Relaxed);
            } else {
                self.rma.misdirected.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "MISDIRECTED WRITE: client {id} incarnation {} holds record {sequence} for client {client} incarnation {to_incarnation}",
                    incarnation.incarnation
                );
            }
        };
        for slot in 0..CLIENT_SLOTS {
            let at = slot * self.write_size;
            if memory.read_bytes(at, &mut record).is_err() || record == [0; RECORD_LEN] {
                continue;
            }
            let Some((client, to_incarnation, sequence)) = decode_record(&record) else {
                self.rma.torn.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            found += 1;
            check(client, to_incarnation, sequence);
            let _ = memory.write_bytes(at, &[0; RECORD_LEN]);
        }
        let large = CLIENT_SLOTS * self.write_size;
        'slots: for slot in 0..LARGE_SLOTS {
            let base = large + slot * LARGE_WRITE;
            let mut seen = Vec::with_capacity(LARGE_RECORDS.len());
            for offset in LARGE_RECORDS {
                if memory.read_bytes(base + offset, &mut record).is_err() {
                    continue 'slots;
                }
                seen.push((record == [0; RECORD_LEN], decode_record(&record)));
            }
            if seen.iter().all(|(zero, _)| *zero) {
                continue;
            }
            let records: Vec<(u64, u64, u64)> =
                seen.iter().filter_map(|(_, record)| *record).collect();
            if records.len() < seen.len() {
                // A stripe still landing: look again next round.
                self.rma.torn.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            found += 1;
            let (client, to_incarnation, sequence) = records[0];
            if records.iter().any(|&(other, other_incarnation, _)| {
                (other, other_incarnation) != (client, to_incarnation)
            }) {
                self.striped_torn.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "TORN STRIPED RECORD: client {id} incarnation {} large slot {slot} holds {records:?}",
                    incarnation.incarnation
                );
            }
            check(client, to_incarnation, sequence);
            for offset in LARGE_RECORDS {
                let _ = memory.write_bytes(base + offset, &[0; RECORD_LEN]);
            }
        }
        found
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

/// Resolve `address` for client `id` under `pinned`, as a posting thread does: the hit alone
/// first (`probe`, which queues nothing), the blocking resolve on a miss, which applies the miss
/// on this thread when the writer's role is free. Counts the hit, miss or error in `stats` and
/// samples its latency (every hit in `HIT_SAMPLING`, every miss); `None` on an error.
fn resolve_timed<'p>(
    pinned: &'p Pinned<'_>,
    id: u64,
    address: &[u8],
    sequence: u64,
    stats: &PostStats,
    samples: &mut Samples,
) -> Option<Peer<'p>> {
    let started = Instant::now();
    let (peer, hit) = match pinned.probe(id, address) {
        Some(peer) => (Ok(peer), true),
        None => (pinned.resolve(id, address), false),
    };
    let took = started.elapsed().as_nanos() as u64;
    let Ok(peer) = peer else {
        stats.resolve_errors.fetch_add(1, Ordering::Relaxed);
        return None;
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
    Some(peer)
}

/// One posting thread: resolve a random client's advertised address and send it a message.
fn post(world: &World, seed: u64, stats: &PostStats) -> Samples {
    let mut random = Random(seed | 1);
    let mut samples = Samples::default();
    let mut sequence = 0_u64;
    let clients = world.clients.len() as u64;
    let cache = world.server.cache();
    while !world.stop_posting.load(Ordering::Relaxed) {
        let id = random.below(clients);
        let Some(advert) = world.clients[id as usize].advert() else {
            continue; // restarting
        };
        sequence += 1;
        let pinned = cache.pin();
        let Some(peer) = resolve_timed(&pinned, id, &advert.address, sequence, stats, &mut samples)
        else {
            continue;
        };
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

/// One RMA posting thread: resolve a random client, lease its entry, and write a record into its
/// advertised memory from one of this thread's source slots.
fn post_rma(world: &World, thread_index: usize, seed: u64, stats: &PostStats) -> Result<Samples> {
    let mut random = Random(seed | 1);
    let mut samples = Samples::default();
    let mut sequence = 0_u64;
    let clients = world.clients.len() as u64;
    let cache = world.server.cache();
    let write_size = world.write_size;
    let source = world.server.register(SOURCE_SLOTS * write_size)?;
    let busy = &world.busy[thread_index];
    let mut next_slot = 0;
    while !world.stop_posting.load(Ordering::Relaxed) {
        let slot = next_slot;
        if busy[slot].load(Ordering::Acquire) {
            // Its write is still in flight: the completion thread frees it.
            thread::yield_now();
            continue;
        }
        let id = random.below(clients);
        let Some(advert) = world.clients[id as usize].advert() else {
            continue; // restarting
        };
        let Some(remote) = advert
            .memory
            .and_then(|bytes| RemoteRegion::from_bytes(&bytes).ok())
        else {
            continue;
        };
        sequence += 1;
        let target = remote.slice(
            (sequence % CLIENT_SLOTS as u64) * write_size as u64,
            write_size as u64,
        )?;
        let pinned = cache.pin();
        let Some(peer) = resolve_timed(&pinned, id, &advert.address, sequence, stats, &mut samples)
        else {
            continue;
        };
        let at = slot * write_size;
        source.write_bytes(at, &encode_record(id, advert.incarnation, sequence))?;
        let segment = source.segment(at, write_size)?;
        let operation = ((thread_index as u64) << 32) | slot as u64;
        busy[slot].store(true, Ordering::Release);
        let posted = if world.no_leases {
            // SAFETY: deliberately not upheld: this is the measurement of what happens without
            // leases (--no-leases). The post itself happens under the pin, so the entry is in the
            // AV while fi_write runs; only the write in flight after it may outlive the entry.
            unsafe {
                world
                    .server
                    .write_unleased(peer, segment, target, operation, SEND_PATIENCE)
            }
        } else {
            match pinned.lease(peer) {
                Ok(lease) => {
                    world
                        .server
                        .write_within(lease, segment, target, operation, SEND_PATIENCE)
                }
                Err(error) => Err(error),
            }
        };
        drop(pinned);
        match posted {
            Ok(()) => {
                next_slot = (slot + 1) % SOURCE_SLOTS;
                stats.sent.fetch_add(1, Ordering::Relaxed);
                world.rma.posted.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                busy[slot].store(false, Ordering::Release);
                stats.undeliverable.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(samples)
}

/// One posting thread of a rail server: resolve a random client on every rail, lease it there,
/// and write a record into its memory through `RailSet::write` (striped when large).
fn post_rails(
    world: &World,
    rails: &RailSet,
    thread_index: usize,
    seed: u64,
    stats: &PostStats,
) -> Result<Samples> {
    let mut random = Random(seed | 1);
    let mut samples = Samples::default();
    let mut sequence = 0_u64;
    let clients = world.clients.len() as u64;
    let write_size = world.write_size;
    // Small slots first, then one large slot of this thread's.
    let small = SOURCE_SLOTS * write_size;
    let source = rails.register(small + LARGE_WRITE)?;
    let busy = &world.busy[thread_index];
    let mut next_slot = 0;
    while !world.stop_posting.load(Ordering::Relaxed) {
        sequence += 1;
        let large = 0 == sequence % LARGE_EVERY;
        // The large write uses the last busy flag; small ones cycle through the others.
        let slot = if large { SOURCE_SLOTS - 1 } else { next_slot };
        if busy[slot].load(Ordering::Acquire) {
            thread::yield_now();
            continue;
        }
        let id = random.below(clients);
        let Some(advert) = world.clients[id as usize].advert() else {
            continue; // restarting
        };
        let Some((addresses, memory)) = &advert.rails else {
            continue;
        };
        let Ok(remote) = RailRemoteRegion::from_bytes(memory) else {
            continue;
        };
        let (local_at, target_at, len) = if large {
            let target = (thread_index + (sequence / LARGE_EVERY) as usize) % LARGE_SLOTS;
            (
                small,
                CLIENT_SLOTS * write_size + target * LARGE_WRITE,
                LARGE_WRITE,
            )
        } else {
            (
                slot * write_size,
                (sequence % CLIENT_SLOTS as u64) as usize * write_size,
                write_size,
            )
        };
        let target = remote.slice(target_at as u64, len as u64)?;
        let record = encode_record(id, advert.incarnation, sequence);
        if large {
            for offset in LARGE_RECORDS {
                source.write_bytes(local_at + offset, &record)?;
            }
        } else {
            source.write_bytes(local_at, &record)?;
        }
        let addresses: Vec<&[u8]> = addresses.iter().map(Vec::as_slice).collect();
        let started = Instant::now();
        let pinned = rails.pin();
        let lease = match pinned.resolve(id, &addresses) {
            Ok(peers) => pinned.lease(&peers),
            Err(error) => Err(error),
        };
        drop(pinned);
        let took = started.elapsed().as_nanos() as u64;
        let Ok(lease) = lease else {
            stats.resolve_errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        stats.hits.fetch_add(1, Ordering::Relaxed);
        if 0 == sequence % HIT_SAMPLING {
            samples.hits.push(took);
        }
        let operation = ((thread_index as u64) << 32) | slot as u64;
        busy[slot].store(true, Ordering::Release);
        match rails.write_within(
            lease,
            source.segment(local_at, len)?,
            target,
            operation,
            SEND_PATIENCE,
        ) {
            Ok(()) => {
                if !large {
                    next_slot = (slot + 1) % (SOURCE_SLOTS - 1);
                }
                stats.sent.fetch_add(1, Ordering::Relaxed);
                world.rma.posted.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                busy[slot].store(false, Ordering::Release);
                stats.undeliverable.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(samples)
}

/// The completion thread: reap RMA completions (the endpoint drops their leases), free their
/// source slots and count them, until told to stop.
fn reap_completions(world: &World) {
    let mut completions = Vec::new();
    while !world.stop_completions.load(Ordering::Relaxed) {
        let awaiting = world
            .caches()
            .iter()
            .map(|cache| cache.stats().removals_awaiting_leases)
            .sum();
        world
            .rma
            .peak_awaiting_leases
            .fetch_max(awaiting, Ordering::Relaxed);
        completions.clear();
        let polled = match &world.rail_server {
            Some(rails) => rails.poll_completions(&mut completions),
            None => world.server.poll_completions(&mut completions),
        };
        if polled.is_err() || completions.is_empty() {
            thread::yield_now();
            continue;
        }
        for completion in &completions {
            let thread_index = (completion.id >> 32) as usize;
            let slot = (completion.id & u64::from(u32::MAX)) as usize;
            if let Some(busy) = world.busy.get(thread_index).and_then(|busy| busy.get(slot)) {
                busy.store(false, Ordering::Release);
            }
            match &completion.result {
                Ok(()) => world.rma.completed_ok.fetch_add(1, Ordering::Relaxed),
                Err(error) => {
                    tracing_error(error);
                    if let DmaError::Fabric { code, .. } = error {
                        if *code == -i64::from(dma_libfabric::sys::FI_ECANCELED) {
                            world.rma.cancelled.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    world.rma.completed_error.fetch_add(1, Ordering::Relaxed)
                }
            };
        }
    }
}

impl World {
    /// The server's caches: one, or one per rail.
    fn caches(&self) -> Vec<&AddressCache> {
        match &self.rail_server {
            Some(rails) => (0..rails.len())
                .map(|rail| rails.rail(rail).cache())
                .collect(),
            None => vec![self.server.cache()],
        }
    }

    /// Every server cache's stats, summed.
    fn stats(&self) -> (CacheStats, usize) {
        let mut total = CacheStats::default();
        let mut indexed = 0;
        for cache in self.caches() {
            let stats = cache.stats();
            total.entries += stats.entries;
            total.leases += stats.leases;
            total.pending_removals += stats.pending_removals;
            total.inserts += stats.inserts;
            total.removes += stats.removes;
            total.misses += stats.misses;
            total.evictions += stats.evictions;
            indexed += cache.indexed();
        }
        (total, indexed)
    }
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
        if let Some(rails) = &world.rail_server {
            rails.progress();
        }
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

/// Run the demo, phase by phase; `Ok(false)` when a message was misdirected or an AV entry
/// leaked.
fn run() -> Result<bool> {
    let flags = Flags::parse();
    let provider = check_flags(&flags)?;
    let (world, description, server_node) = open_world(&flags, provider)?;
    start_clients(&world)?;
    announce(&flags, &description, server_node.as_deref());
    let threads = spawn_threads(&world, &flags)?;
    let elapsed = show_progress(&flags, &world, &threads.post_stats)?;
    let traffic = stop_traffic(&flags, &world, threads)?;
    let end = shut_down(&world)?;
    let summary = Summary::count(&world, traffic, end, elapsed)?;
    print_table(&report::report(&flags, &world, &description, &summary)?);
    Ok(report::verdict(&flags, &world, &summary))
}

/// The flags' own checks, and the provider they name.
fn check_flags(flags: &Flags) -> Result<Provider> {
    if 0 == flags.clients || 0 == flags.threads {
        return Err("--clients and --threads must be at least 1".into());
    }
    if flags.write_size < RECORD_LEN {
        return Err(format!("--write-size must be at least {RECORD_LEN}").into());
    }
    if flags.rails > dma_libfabric::MAX_RAILS {
        return Err(format!("--rails is at most {}", dma_libfabric::MAX_RAILS).into());
    }
    provider(&flags.provider)
}

/// Open the server (and with `--rails`, its rail set) and the world the threads share, with
/// every client still to start: the world, the server's description, and the node it is on.
fn open_world(
    flags: &Flags,
    provider: Provider,
) -> Result<(Arc<World>, Description, Option<String>)> {
    let configuration = Configuration {
        providers: vec![provider],
        bind: None,
        av_capacity: (flags.clients * 4).max(256),
        rma: flags.rma,
        ..Configuration::default()
    };
    let nodes = Nodes {
        next: AtomicU64::new(0),
        provider,
    };
    let server_node = nodes.next();
    let server = LibfabricEndpoint::open(&configuration, server_node.as_deref())?;
    let description = server.describe().clone();
    let rail_server = if 0 < flags.rails {
        let nodes: Vec<String> = (0..flags.rails)
            .map(|_| nodes.next().ok_or("--rails needs loopback IPs (tcp)"))
            .collect::<std::result::Result<_, _>>()?;
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        Some(RailSet::open(&configuration, &nodes)?)
    } else {
        None
    };
    let world = Arc::new(World {
        server,
        rail_server,
        rails: flags.rails,
        striped_torn: AtomicU64::new(0),
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
        rma: RmaStats::default(),
        busy: (0..flags.threads)
            .map(|_| (0..SOURCE_SLOTS).map(|_| AtomicBool::new(false)).collect())
            .collect(),
        no_leases: flags.no_leases,
        write_size: flags.write_size,
        stop_completions: AtomicBool::new(false),
    });
    Ok((world, description, server_node))
}

/// Open every client's first incarnation and advertise it.
fn start_clients(world: &World) -> Result<()> {
    for id in 0..world.clients.len() {
        world.start_client(id, 0)?;
    }
    Ok(())
}

/// The line that says what runs.
fn announce(flags: &Flags, description: &Description, server_node: Option<&str>) {
    println!(
        "churn: {}{}server on {} ({}), {} clients, {} posting threads, {} restarts/s, {} s",
        match (flags.rma, flags.no_leases) {
            (false, _) => "",
            (true, false) => "RMA writes with leases, ",
            (true, true) => "RMA writes WITHOUT leases, ",
        },
        if 0 < flags.rails {
            format!("{} rails, ", flags.rails)
        } else {
            String::new()
        },
        description.provider,
        server_node.unwrap_or("provider's choice"),
        flags.clients,
        flags.threads,
        flags.churn_per_sec,
        flags.seconds
    );
}

/// The threads of the run, while they run.
struct Threads {
    receiver: thread::JoinHandle<()>,
    /// What each posting thread counts, as it counts it.
    post_stats: Vec<Arc<PostStats>>,
    posters: Vec<thread::JoinHandle<Result<Samples>>>,
    reaper: thread::JoinHandle<()>,
    churner: thread::JoinHandle<Result<()>>,
}

/// Start the receiver, the posting threads, the completion thread and the churn thread, in that
/// order.
fn spawn_threads(world: &Arc<World>, flags: &Flags) -> Result<Threads> {
    let receiver = {
        let world = Arc::clone(world);
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
            let world = Arc::clone(world);
            let stats = Arc::clone(stats);
            let rma = flags.rma;
            thread::Builder::new()
                .name(format!("poster-{n}"))
                .spawn(move || {
                    let seed = 0x9e37_79b9_7f4a_7c15 ^ (n as u64 + 1);
                    if let Some(rails) = &world.rail_server {
                        post_rails(&world, rails, n, seed, &stats)
                    } else if rma {
                        post_rma(&world, n, seed, &stats)
                    } else {
                        Ok(post(&world, seed, &stats))
                    }
                })
        })
        .collect::<std::result::Result<_, _>>()?;
    let reaper = {
        let world = Arc::clone(world);
        thread::Builder::new()
            .name("completions".into())
            .spawn(move || reap_completions(&world))?
    };
    let churner = {
        let world = Arc::clone(world);
        let rate = flags.churn_per_sec;
        thread::Builder::new()
            .name("churn".into())
            .spawn(move || churn(&world, rate, 0x2545_f491))?
    };
    Ok(Threads {
        receiver,
        post_stats,
        posters,
        reaper,
        churner,
    })
}

/// Let the traffic run for `--seconds`, showing its rates on the progress bar (hidden with
/// `--no-progress`); the time it ran.
fn show_progress(flags: &Flags, world: &World, post_stats: &[Arc<PostStats>]) -> Result<Duration> {
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
        let (sent, hits, misses, _, _) = totals(post_stats);
        let now = Instant::now();
        let rate = (sent - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-9);
        last = (now, sent);
        let (stats, _) = world.stats();
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
    Ok(started.elapsed())
}

/// What the run's threads leave once they have stopped.
struct Stopped {
    /// Every posting thread's latency samples, together.
    samples: Samples,
    post_stats: Vec<Arc<PostStats>>,
    /// The traffic of each client's last incarnation, still live.
    last_incarnations: Vec<Arc<Traffic>>,
}

/// Stop the threads in order: the posting threads and the churn thread; then, once what is in
/// flight has arrived ([`drain`]), the completion thread and the receiver.
fn stop_traffic(flags: &Flags, world: &World, threads: Threads) -> Result<Stopped> {
    world.stop_posting.store(true, Ordering::Relaxed);
    let mut samples = Samples::default();
    for poster in threads.posters {
        let mut part = poster.join().map_err(|_| "a posting thread panicked")??;
        samples.hits.append(&mut part.hits);
        samples.misses.append(&mut part.misses);
    }
    threads
        .churner
        .join()
        .map_err(|_| "the churn thread panicked")??;
    drain(world, flags.rma);
    world.stop_completions.store(true, Ordering::Relaxed);
    threads
        .reaper
        .join()
        .map_err(|_| "the completion thread panicked")?;
    world.stop_receiving.store(true, Ordering::Relaxed);
    threads
        .receiver
        .join()
        .map_err(|_| "the receiver thread panicked")?;
    let last_incarnations: Vec<Arc<Traffic>> = world
        .clients
        .iter()
        .filter_map(|client| client.advert.read().ok().and_then(|advert| advert.clone()))
        .map(|advert| advert.traffic)
        .collect();
    Ok(Stopped {
        samples,
        post_stats: threads.post_stats,
        last_incarnations,
    })
}

/// Let what is in flight arrive, for at most [`DRAIN_PATIENCE`]: every write's completion with
/// `rma`, else every message to a live client.
fn drain(world: &World, rma: bool) {
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
    let rma_pending = || {
        world.rma.posted.load(Ordering::Relaxed)
            > world.rma.completed_ok.load(Ordering::Relaxed)
                + world.rma.completed_error.load(Ordering::Relaxed)
    };
    while (rma_pending() || (!rma && 0 < live_pending())) && Instant::now() < drain_deadline {
        thread::yield_now();
    }
}

/// The server's caches once every client has left.
struct End {
    /// Every cache's stats, summed.
    stats: CacheStats,
    /// Registrations still in the caches' indexes.
    indexed: usize,
}

/// Every client leaves, and the caches quiesce: the AV must end empty.
fn shut_down(world: &World) -> Result<End> {
    for id in 0..world.clients.len() {
        world.stop_client(id)?;
    }
    world.server.cache().quiesce();
    if let Some(rails) = &world.rail_server {
        rails.quiesce();
    }
    let (stats, indexed) = world.stats();
    Ok(End { stats, indexed })
}

/// The run's figures, counted once everything has stopped.
struct Summary {
    elapsed: Duration,
    /// Hit and miss latencies, sorted.
    samples: Samples,
    sent: u64,
    hits: u64,
    misses: u64,
    undeliverable: u64,
    resolve_errors: u64,
    /// Messages the departed incarnations received that were meant for them.
    received: u64,
    misdirected: u64,
    lost_departed: u64,
    undelivered_live: u64,
    end: End,
    /// The AV did not end empty, or an insert was not matched by a remove.
    leaked: bool,
    writes_posted: u64,
    writes_ok: u64,
    writes_error: u64,
    writes_without_completion: u64,
    writes_misdirected: u64,
}

impl Summary {
    /// Count what `stopped` and `end` left, over `elapsed`.
    fn count(world: &World, stopped: Stopped, end: End, elapsed: Duration) -> Result<Self> {
        let stats = &end.stats;
        let leaked = stats.entries != 0
            || stats.leases != 0
            || stats.pending_removals != 0
            || stats.inserts != stats.removes
            || end.indexed != 0;
        let missing = |traffic: &Arc<Traffic>| {
            traffic
                .sent
                .load(Ordering::Relaxed)
                .saturating_sub(traffic.received.load(Ordering::Relaxed))
        };
        let undelivered_live: u64 = stopped.last_incarnations.iter().map(missing).sum();
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
        let (sent, hits, misses, undeliverable, resolve_errors) = totals(&stopped.post_stats);
        let mut samples = stopped.samples;
        samples.hits.sort_unstable();
        samples.misses.sort_unstable();
        let writes_posted = world.rma.posted.load(Ordering::Relaxed);
        let writes_ok = world.rma.completed_ok.load(Ordering::Relaxed);
        let writes_error = world.rma.completed_error.load(Ordering::Relaxed);
        Ok(Self {
            elapsed,
            samples,
            sent,
            hits,
            misses,
            undeliverable,
            resolve_errors,
            received,
            misdirected: world.misdirected.load(Ordering::Relaxed),
            lost_departed,
            undelivered_live,
            end,
            leaked,
            writes_posted,
            writes_ok,
            writes_error,
            writes_without_completion: writes_posted.saturating_sub(writes_ok + writes_error),
            writes_misdirected: world.rma.misdirected.load(Ordering::Relaxed),
        })
    }
}
