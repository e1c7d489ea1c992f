//! The server process: an endpoint with RMA, a control listener, two posting threads and a
//! completion thread.
//!
//! A client's cache key is `id << 32 | incarnation`, so releasing a departed incarnation never
//! touches its successor. A registration departs when its control connection closes (EOF or an
//! error) or a write to it completes with an error; the server then calls `release` for it. A
//! posting thread that resolved a registration which departed meanwhile releases it again after
//! its post (its resolve may have come after the departure's release), so no entry outlives its
//! client.

use std::io::{BufRead, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use dma_libfabric::{
    CacheStats, Configuration, DmaError, LibfabricEndpoint, RemoteRegion, WriteCompletion,
};

use crate::protocol::{self, CLIENT_SLOTS, Counts, Framer, Message, Polled, RECORD_LEN, Sample};
use crate::{Flags, Result, signals};

/// Posting threads.
const POSTERS: usize = 2;
/// Source record slots per posting thread: a slot is reused once its write has completed.
const SOURCE_SLOTS: usize = 64;
/// Writes in flight to one client at most: a peer that stops reading holds at most this many
/// operation slots, so it cannot starve the others.
const CLIENT_CREDITS: u64 = 16;
/// How long a post retries backpressure.
const POST_PATIENCE: Duration = Duration::from_millis(20);
/// How long shutdown waits for the writes in flight: longer than tcp takes to give up on a client
/// cut off for good just before the end (6.2 s with the CI runs' `--tcp-retries2 4`), since a
/// write completes only once the client acknowledged it (`WriteCompletion::Delivered`) or the
/// provider reported it failed, and until then it holds its lease.
const SHUTDOWN_PATIENCE: Duration = Duration::from_secs(12);
/// How long a `Leaving` client's writes may take to drain before `Drained` is sent anyway.
const LEAVE_PATIENCE: Duration = Duration::from_secs(3);
/// The most post-to-completion samples kept (16 bytes each).
const MAX_SAMPLES: usize = 4 << 20;
/// How often the completion thread looks for writes past the deadline.
const DEADLINE_CHECK: Duration = Duration::from_millis(100);
/// Control connections' read timeout: how often their threads look at the stop flag.
const CONTROL_TICK: Duration = Duration::from_millis(50);

const LIVE: u8 = 0;
const LEAVING: u8 = 1;
const DEPARTED: u8 = 2;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One client incarnation, as the server knows it.
struct Registration {
    id: u32,
    incarnation: u32,
    /// The cache's client key.
    key: u64,
    address: Vec<u8>,
    region: RemoteRegion,
    state: AtomicU8,
    in_flight: AtomicU64,
    sequence: AtomicU64,
    /// When the server learned it departed.
    departed_at: Mutex<Option<Instant>>,
    /// The same, in [`protocol::unix_nanos`], and how (for the supervisor's timeline).
    departed_unix: AtomicU64,
    departed_why: Mutex<&'static str>,
    /// When its last write in flight after the departure completed ([`protocol::unix_nanos`]):
    /// its last lease returned.
    leases_returned_unix: AtomicU64,
    /// Writes in flight to it when the server learned it departed.
    in_flight_at_departure: AtomicU64,
    /// The client's latest report.
    counts: Mutex<Counts>,
}

/// A write in flight from a source slot: its target, when it was posted (monotonic, and
/// [`protocol::unix_nanos`] for the supervisor's fault windows).
type InFlight = (Arc<Registration>, Instant, u64);

/// Everything the server's threads share.
struct Server {
    endpoint: LibfabricEndpoint,
    /// The current registration of each client id.
    current: Vec<Mutex<Option<Arc<Registration>>>>,
    /// Every registration ever made (for the totals).
    all: Mutex<Vec<Arc<Registration>>>,
    /// Per posting thread and source slot: the write in flight from it.
    slots: Vec<Vec<Mutex<Option<InFlight>>>>,
    stop_posting: AtomicBool,
    stop_completions: AtomicBool,
    stop_control: AtomicBool,
    posted: AtomicU64,
    completed_ok: AtomicU64,
    completed_error: AtomicU64,
    not_posted: AtomicU64,
    resolve_errors: AtomicU64,
    /// Departures learned from an error completion (the rest: the control connection closed).
    error_departures: AtomicU64,
    departures: AtomicU64,
    /// Departures for a write older than the deadline.
    deadline_departures: AtomicU64,
    /// `--write-deadline`.
    write_deadline: Option<Duration>,
    /// The oldest write in flight seen, nanoseconds.
    oldest_write: AtomicU64,
    /// Error completions by their error's text.
    error_kinds: Mutex<Vec<(String, u64)>>,
    /// The longest a departed registration still had writes (so leases) in flight, nanoseconds.
    longest_lease_after_departure: AtomicU64,
}

impl Server {
    /// `registration` has gone: stop writing to it and let the cache release its entry.
    fn depart(&self, registration: &Arc<Registration>, why: &str) {
        if DEPARTED == registration.state.swap(DEPARTED, Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        let unix = protocol::unix_nanos();
        *lock(&registration.departed_at) = Some(now);
        registration.departed_unix.store(unix, Ordering::SeqCst);
        *lock(&registration.departed_why) = if why.starts_with("error completion") {
            "error-completion"
        } else if why == "superseded" {
            "superseded"
        } else if why == "shutdown" {
            "shutdown"
        } else if why.starts_with("deadline") {
            "deadline"
        } else {
            "control-closed"
        };
        let in_flight = registration.in_flight.load(Ordering::SeqCst);
        registration
            .in_flight_at_departure
            .store(in_flight, Ordering::SeqCst);
        if 0 == in_flight {
            let _ = registration.leases_returned_unix.compare_exchange(
                0,
                unix,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
        self.departures.fetch_add(1, Ordering::Relaxed);
        self.endpoint.cache().release(registration.key);
        {
            let mut current = lock(&self.current[registration.id as usize]);
            if current
                .as_ref()
                .is_some_and(|held| Arc::ptr_eq(held, registration))
            {
                *current = None;
            }
        }
        if std::env::var_os("FLEET_VERBOSE").is_some() {
            eprintln!(
                "server: client {} incarnation {} departed ({why}), {} writes in flight",
                registration.id,
                registration.incarnation,
                registration.in_flight.load(Ordering::SeqCst)
            );
        }
    }

    /// One write to `registration` is over (completed, or never posted).
    fn finish(&self, registration: &Registration) {
        if 1 == registration.in_flight.fetch_sub(1, Ordering::SeqCst)
            && DEPARTED == registration.state.load(Ordering::SeqCst)
        {
            if let Some(at) = *lock(&registration.departed_at) {
                self.longest_lease_after_departure
                    .fetch_max(at.elapsed().as_nanos() as u64, Ordering::Relaxed);
                registration
                    .leases_returned_unix
                    .store(protocol::unix_nanos(), Ordering::SeqCst);
            }
        }
    }
}

/// Run the server until a `stop` line or EOF on stdin, phase by phase: open, announce the
/// control port, run the threads, stop them in order, depart every registration, and print the
/// totals the supervisor reads.
pub fn run(flags: &Flags) -> Result<()> {
    signals::die_with_parent(flags.supervisor_pid)?;
    let (server, listener) = open(flags)?;
    announce(&listener)?;
    let threads = spawn_threads(&server, listener)?;
    wait_for_stop();
    let (samples, in_flight) = stop_threads(&server, threads)?;
    let all = depart_everyone(&server);
    let cache = server.endpoint.cache();
    cache.quiesce_with_patience(Duration::from_secs(2));
    let stats = cache.stats();
    if let Some(path) = &flags.samples {
        write_samples(path, &samples)?;
    }
    print_totals(&server, &all, &stats, in_flight, samples.len())
}

/// Open the endpoint and the control listener, and the state the threads share.
fn open(flags: &Flags) -> Result<(Arc<Server>, TcpListener)> {
    let clients = flags.clients.max(1) as usize;
    let configuration = Configuration {
        rma: true,
        av_capacity: (clients * 8).max(256),
        providers: vec![flags.provider.provider()],
        // The fleet checks that every lease comes back under kills, stops and partitions. Under
        // the default `WriteCompletion::Delivered` a write completes only once the client
        // acknowledged it, and a client killed while cut off leaves a half-open connection (its
        // reset is lost in the partition; tcp acknowledged the bytes, and no keepalive runs), so
        // the writes it had not acknowledged never complete and hold their leases until the
        // endpoint drops (docs/faults.md). The fleet measures the local completion, as before.
        write_completion: WriteCompletion::Local,
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    // Inside the fleet's own namespace every client connects to its own loopback address (so a
    // partition cuts its control connection too): listen on all of them. Nothing outside the
    // namespace can reach it.
    let listen_on = if flags.inside_netns {
        Ipv4Addr::UNSPECIFIED
    } else {
        Ipv4Addr::LOCALHOST
    };
    let listener = TcpListener::bind(SocketAddrV4::new(listen_on, 0))?;
    listener.set_nonblocking(true)?;
    let server = Arc::new(Server {
        endpoint,
        current: (0..clients).map(|_| Mutex::new(None)).collect(),
        all: Mutex::new(Vec::new()),
        slots: (0..POSTERS)
            .map(|_| (0..SOURCE_SLOTS).map(|_| Mutex::new(None)).collect())
            .collect(),
        stop_posting: AtomicBool::new(false),
        stop_completions: AtomicBool::new(false),
        stop_control: AtomicBool::new(false),
        posted: AtomicU64::new(0),
        completed_ok: AtomicU64::new(0),
        completed_error: AtomicU64::new(0),
        not_posted: AtomicU64::new(0),
        resolve_errors: AtomicU64::new(0),
        error_departures: AtomicU64::new(0),
        departures: AtomicU64::new(0),
        error_kinds: Mutex::new(Vec::new()),
        deadline_departures: AtomicU64::new(0),
        write_deadline: (flags.write_deadline > 0.0)
            .then(|| Duration::from_secs_f64(flags.write_deadline)),
        oldest_write: AtomicU64::new(0),
        longest_lease_after_departure: AtomicU64::new(0),
    });
    Ok((server, listener))
}

/// Tell the supervisor the control port (`listening port=`).
fn announce(listener: &TcpListener) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening port={}", listener.local_addr()?.port())?;
    stdout.flush()?;
    Ok(())
}

/// The server's threads, while they run.
struct Threads {
    /// Accepts control connections; returns their threads.
    acceptor: thread::JoinHandle<Vec<thread::JoinHandle<()>>>,
    posters: Vec<thread::JoinHandle<Result<()>>>,
    /// Reaps the completions; returns the post-to-completion samples.
    reaper: thread::JoinHandle<Vec<Sample>>,
}

/// Start the acceptor (which owns `listener`), the posting threads and the completion thread.
fn spawn_threads(server: &Arc<Server>, listener: TcpListener) -> Result<Threads> {
    let acceptor = {
        let server = Arc::clone(server);
        thread::Builder::new()
            .name("acceptor".into())
            .spawn(move || accept(&server, &listener))?
    };
    let posters = (0..POSTERS)
        .map(|n| {
            let server = Arc::clone(server);
            thread::Builder::new()
                .name(format!("poster-{n}"))
                .spawn(move || post(&server, n))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let reaper = {
        let server = Arc::clone(server);
        thread::Builder::new()
            .name("completions".into())
            .spawn(move || reap(&server))?
    };
    Ok(Threads {
        acceptor,
        posters,
        reaper,
    })
}

/// Until the supervisor says stop (or goes away: EOF).
fn wait_for_stop() {
    for line in std::io::stdin().lock().lines() {
        match line {
            Ok(line) if line.trim() == "stop" => break,
            Ok(_) => {}
            Err(_) => break,
        }
    }
}

/// Stop the threads in order: the posting threads; the completion thread once the writes in
/// flight completed (or after [`SHUTDOWN_PATIENCE`]); then the control connections. The
/// post-to-completion samples, and the operations still in flight when the completion thread
/// stopped.
fn stop_threads(server: &Server, threads: Threads) -> Result<(Vec<Sample>, usize)> {
    server.stop_posting.store(true, Ordering::SeqCst);
    for poster in threads.posters {
        poster.join().map_err(|_| "a posting thread panicked")??;
    }
    let deadline = Instant::now() + SHUTDOWN_PATIENCE;
    let pending = || {
        server.posted.load(Ordering::SeqCst)
            > server.completed_ok.load(Ordering::SeqCst)
                + server.completed_error.load(Ordering::SeqCst)
    };
    while pending() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
    }
    server.stop_completions.store(true, Ordering::SeqCst);
    let samples = threads
        .reaper
        .join()
        .map_err(|_| "the completion thread panicked")?;
    let in_flight = server.endpoint.operations_in_flight();
    server.stop_control.store(true, Ordering::SeqCst);
    let handlers = threads
        .acceptor
        .join()
        .map_err(|_| "the acceptor panicked")?;
    for handler in handlers {
        handler.join().map_err(|_| "a control thread panicked")?;
    }
    Ok((samples, in_flight))
}

/// Depart every registration ever made (`shutdown`), and count how long those still holding
/// writes have held their leases: every registration.
fn depart_everyone(server: &Server) -> Vec<Arc<Registration>> {
    let all = lock(&server.all).clone();
    for registration in &all {
        server.depart(registration, "shutdown");
    }
    // Departed registrations still holding writes: they hold their leases until now.
    for registration in &all {
        if 0 < registration.in_flight.load(Ordering::SeqCst) {
            if let Some(at) = *lock(&registration.departed_at) {
                server
                    .longest_lease_after_departure
                    .fetch_max(at.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
    }
    all
}

/// Write the post-to-completion samples to `path`, for the supervisor.
fn write_samples(path: &std::path::Path, samples: &[Sample]) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for sample in samples {
        out.write_all(&sample.to_bytes())?;
    }
    out.flush()?;
    Ok(())
}

/// Print what the supervisor reads: a `FLEET-DEPARTURE` line per registration, `FLEET-ERRORS`
/// and `FLEET-TOTALS`.
fn print_totals(
    server: &Server,
    all: &[Arc<Registration>],
    stats: &CacheStats,
    in_flight: usize,
    samples: usize,
) -> Result<()> {
    let counts = all.iter().fold(Counts::default(), |sum, registration| {
        let counts = *lock(&registration.counts);
        Counts {
            checked: sum.checked + counts.checked,
            misdirected: sum.misdirected + counts.misdirected,
            corrupt: sum.corrupt + counts.corrupt,
            last: false,
        }
    });
    let reported_last = all
        .iter()
        .filter(|registration| lock(&registration.counts).last)
        .count();
    let av_entries =
        (stats.entries + stats.pending_removals).max(stats.inserts.saturating_sub(stats.removes));
    let mut stdout = std::io::stdout().lock();
    for registration in all {
        writeln!(
            stdout,
            "FLEET-DEPARTURE id={} incarnation={} why={} detected={} leases_returned={} \
             in_flight_at_departure={} in_flight={}",
            registration.id,
            registration.incarnation,
            lock(&registration.departed_why),
            registration.departed_unix.load(Ordering::SeqCst),
            registration.leases_returned_unix.load(Ordering::SeqCst),
            registration.in_flight_at_departure.load(Ordering::SeqCst),
            registration.in_flight.load(Ordering::SeqCst),
        )?;
    }
    let kinds = lock(&server.error_kinds)
        .iter()
        .map(|(kind, count)| format!("{count}x \"{kind}\""))
        .collect::<Vec<_>>()
        .join(", ");
    writeln!(stdout, "FLEET-ERRORS {kinds}")?;
    writeln!(
        stdout,
        "FLEET-TOTALS provider={} posted={} ok={} error={} in_flight={} not_posted={} resolve_errors={} \
         checked={} misdirected={} corrupt={} reported_last={} registrations={} departures={} \
         error_departures={} deadline_departures={} oldest_write_ns={} longest_lease_ns={} leases={} av_entries={} inserts={} removes={} \
         failed_removes={} samples={}",
        server.endpoint.describe().provider,
        server.posted.load(Ordering::SeqCst),
        server.completed_ok.load(Ordering::SeqCst),
        server.completed_error.load(Ordering::SeqCst),
        in_flight,
        server.not_posted.load(Ordering::SeqCst),
        server.resolve_errors.load(Ordering::SeqCst),
        counts.checked,
        counts.misdirected,
        counts.corrupt,
        reported_last,
        all.len(),
        server.departures.load(Ordering::SeqCst),
        server.error_departures.load(Ordering::SeqCst),
        server.deadline_departures.load(Ordering::SeqCst),
        server.oldest_write.load(Ordering::SeqCst),
        server.longest_lease_after_departure.load(Ordering::SeqCst),
        stats.leases,
        av_entries,
        stats.inserts,
        stats.removes,
        stats.failed_removes,
        samples,
    )?;
    stdout.flush()?;
    Ok(())
}

/// Accept control connections until told to stop; returns their threads.
fn accept(server: &Arc<Server>, listener: &TcpListener) -> Vec<thread::JoinHandle<()>> {
    let mut handlers = Vec::new();
    while !server.stop_control.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let server = Arc::clone(server);
                match thread::Builder::new()
                    .name("control".into())
                    .spawn(move || control(&server, stream))
                {
                    Ok(handler) => handlers.push(handler),
                    Err(error) => eprintln!("server: no thread for a control connection: {error}"),
                }
                handlers.retain(|handler| !handler.is_finished());
            }
            // Pacing, not synchronisation: the listener is non-blocking.
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
    handlers
}

/// One client's control connection: its hello, its reports, its departure.
fn control(server: &Server, mut stream: TcpStream) {
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(CONTROL_TICK)))
        .and_then(|()| stream.set_nodelay(true));
    if let Err(error) = setup {
        eprintln!("server: control connection: {error}");
        return;
    }
    let mut framer = Framer::default();
    let mut registration: Option<Arc<Registration>> = None;
    let why = loop {
        if server.stop_control.load(Ordering::SeqCst) {
            break "shutdown".to_string();
        }
        if registration
            .as_ref()
            .is_some_and(|held| DEPARTED == held.state.load(Ordering::SeqCst))
        {
            // Departed on an error completion or the write deadline: close the connection, so a
            // client that is still alive learns it and comes back as a new incarnation.
            break "departed".to_string();
        }
        match framer.poll(&mut stream) {
            Polled::Nothing => continue,
            Polled::Closed(why) => break why,
            Polled::Message(Message::Hello {
                id,
                incarnation,
                address,
                region,
            }) => {
                let Ok(region) = RemoteRegion::from_bytes(&region) else {
                    break "a bad region".into();
                };
                if registration.is_some() || id as usize >= server.current.len() {
                    break format!("a second hello, or client id {id} out of range");
                }
                let new = Arc::new(Registration {
                    id,
                    incarnation,
                    key: (u64::from(id) << 32) | u64::from(incarnation),
                    address,
                    region,
                    state: AtomicU8::new(LIVE),
                    in_flight: AtomicU64::new(0),
                    sequence: AtomicU64::new(0),
                    departed_at: Mutex::new(None),
                    departed_unix: AtomicU64::new(0),
                    departed_why: Mutex::new(""),
                    leases_returned_unix: AtomicU64::new(0),
                    in_flight_at_departure: AtomicU64::new(0),
                    counts: Mutex::new(Counts::default()),
                });
                lock(&server.all).push(Arc::clone(&new));
                let old = lock(&server.current[id as usize]).replace(Arc::clone(&new));
                if let Some(old) = old {
                    // A new incarnation announced itself before the old connection's end was
                    // read: the old one has gone.
                    server.depart(&old, "superseded");
                }
                registration = Some(new);
            }
            Polled::Message(Message::Counts(counts)) => {
                if let Some(registration) = &registration {
                    *lock(&registration.counts) = counts;
                }
            }
            Polled::Message(Message::Leaving) => {
                let Some(registration) = &registration else {
                    break "leaving before hello".into();
                };
                let _ = registration.state.compare_exchange(
                    LIVE,
                    LEAVING,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                let deadline = Instant::now() + LEAVE_PATIENCE;
                while 0 < registration.in_flight.load(Ordering::SeqCst) && Instant::now() < deadline
                {
                    thread::sleep(Duration::from_millis(1));
                }
                if let Err(error) = protocol::send(&mut stream, &Message::Drained) {
                    break error.to_string();
                }
            }
            Polled::Message(Message::Drained) => break "a client said Drained".into(),
        }
    };
    if let Some(registration) = &registration {
        server.depart(registration, &why);
    }
}

/// One posting thread: write records into random live clients.
fn post(server: &Server, thread_index: usize) -> Result<()> {
    let mut random = protocol::Random(0x9e37_79b9_7f4a_7c15 ^ (thread_index as u64 + 1) | 1);
    let source = server.endpoint.register(SOURCE_SLOTS * RECORD_LEN)?;
    let slots = &server.slots[thread_index];
    let cache = server.endpoint.cache();
    let clients = server.current.len() as u64;
    let mut next_slot = 0;
    let mut idle = 0_u32;
    let panic_at = (0 == thread_index && crate::panic_injected(crate::Role::Server))
        .then(|| Instant::now() + Duration::from_secs(3));
    while !server.stop_posting.load(Ordering::SeqCst) {
        if panic_at.is_some_and(|at| at <= Instant::now()) {
            panic!("FLEET_PANIC=server: a panic injected into a posting thread");
        }
        if idle > 64 {
            // Every client is away, leaving or out of credits: give the core back.
            thread::sleep(Duration::from_micros(100));
            idle = 0;
        }
        // The next free source slot: one whose write is still in flight (to a stopped or cut off
        // client, say) is skipped, not waited for, so it cannot hold up writes to the others.
        let Some(slot) = (0..SOURCE_SLOTS)
            .map(|step| (next_slot + step) % SOURCE_SLOTS)
            .find(|&slot| lock(&slots[slot]).is_none())
        else {
            idle += 1;
            thread::yield_now();
            continue; // every write is in flight: the completion thread frees them
        };
        let id = random.below(clients) as usize;
        let Some(registration) = lock(&server.current[id]).clone() else {
            idle += 1;
            continue;
        };
        if LIVE != registration.state.load(Ordering::SeqCst) {
            idle += 1;
            continue;
        }
        if registration.in_flight.fetch_add(1, Ordering::SeqCst) >= CLIENT_CREDITS {
            registration.in_flight.fetch_sub(1, Ordering::SeqCst);
            idle += 1;
            continue;
        }
        idle = 0;
        let sequence = registration.sequence.fetch_add(1, Ordering::Relaxed);
        let at = slot * RECORD_LEN;
        source.write_bytes(
            at,
            &protocol::encode_record(
                u64::from(registration.id),
                u64::from(registration.incarnation),
                sequence,
            ),
        )?;
        let segment = source.segment(at, RECORD_LEN)?;
        let target = registration.region.slice(
            (sequence % CLIENT_SLOTS as u64) * RECORD_LEN as u64,
            RECORD_LEN as u64,
        )?;
        let operation = ((thread_index as u64) << 32) | slot as u64;
        *lock(&slots[slot]) = Some((
            Arc::clone(&registration),
            Instant::now(),
            protocol::unix_nanos(),
        ));
        let posting = Instant::now();
        let posted = {
            let pinned = cache.pin();
            match pinned.resolve(registration.key, &registration.address) {
                Ok(peer) => match pinned.lease(peer) {
                    Ok(lease) => server.endpoint.write_within(
                        lease,
                        segment,
                        target,
                        operation,
                        POST_PATIENCE,
                    ),
                    Err(error) => Err(error),
                },
                Err(error) => {
                    server.resolve_errors.fetch_add(1, Ordering::Relaxed);
                    Err(error)
                }
            }
        };
        match posted {
            Ok(()) => {
                next_slot = (slot + 1) % SOURCE_SLOTS;
                server.posted.fetch_add(1, Ordering::SeqCst);
            }
            Err(error) => {
                lock(&slots[slot]).take();
                server.not_posted.fetch_add(1, Ordering::Relaxed);
                server.finish(&registration);
                let departed = DEPARTED == registration.state.load(Ordering::SeqCst);
                if (departed || !matches!(error, DmaError::WouldBlock))
                    && std::env::var_os("FLEET_VERBOSE").is_some()
                {
                    eprintln!(
                        "server: post to client {id} incarnation {} (departed: {departed}) \
                         failed after {:.2} ms: {error}",
                        registration.incarnation,
                        posting.elapsed().as_secs_f64() * 1e3
                    );
                }
            }
        }
        // The departure's release may have been applied before this thread's resolve, which
        // then registered the key again: release it once more (repeats are harmless).
        if DEPARTED == registration.state.load(Ordering::SeqCst) {
            cache.release(registration.key);
        }
    }
    Ok(())
}

/// Record the oldest write's age, and depart every live client with a write older than the
/// deadline: it has stopped answering for longer than any stop a live client is allowed, so the
/// server stops writing to it and releases its entry, which goes once the provider has completed
/// what is in flight (the writes are not abandoned: their leases and buffers stay).
fn check_deadline(server: &Server, overdue: &mut Vec<dma_libfabric::OverdueOperation>) {
    if let Some(age) = server.endpoint.oldest_operation_age() {
        server
            .oldest_write
            .fetch_max(age.as_nanos() as u64, Ordering::Relaxed);
    }
    let Some(deadline) = server.write_deadline else {
        return;
    };
    overdue.clear();
    server.endpoint.overdue_operations(deadline, overdue);
    for operation in overdue.iter() {
        let thread_index = (operation.id >> 32) as usize;
        let slot = (operation.id & u64::from(u32::MAX)) as usize;
        let Some(registration) = server
            .slots
            .get(thread_index)
            .and_then(|slots| slots.get(slot))
            .and_then(|slot| lock(slot).as_ref().map(|(held, _, _)| Arc::clone(held)))
        else {
            continue;
        };
        if LIVE == registration.state.load(Ordering::SeqCst) {
            server.deadline_departures.fetch_add(1, Ordering::Relaxed);
            server.depart(
                &registration,
                &format!("deadline: a write in flight for {:?}", operation.age),
            );
        }
    }
}

/// The completion thread: reap completions (the endpoint drops their leases), free the source
/// slots, count, sample the post-to-completion time.
fn reap(server: &Server) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut completions = Vec::new();
    let mut overdue = Vec::new();
    let mut next_check = Instant::now();
    while !server.stop_completions.load(Ordering::SeqCst) {
        if Instant::now() >= next_check {
            next_check = Instant::now() + DEADLINE_CHECK;
            check_deadline(server, &mut overdue);
        }
        completions.clear();
        if server.endpoint.poll_completions(&mut completions).is_err() || completions.is_empty() {
            thread::yield_now();
            continue;
        }
        for completion in &completions {
            let thread_index = (completion.id >> 32) as usize;
            let slot = (completion.id & u64::from(u32::MAX)) as usize;
            let Some(held) = server
                .slots
                .get(thread_index)
                .and_then(|slots| slots.get(slot))
                .and_then(|slot| lock(slot).take())
            else {
                eprintln!(
                    "server: a completion for an unknown operation {}",
                    completion.id
                );
                continue;
            };
            let (registration, posted_at, posted_unix) = held;
            if samples.len() < MAX_SAMPLES {
                samples.push(Sample {
                    posted: posted_unix,
                    latency: u32::try_from(
                        posted_at.elapsed().as_nanos() / protocol::LATENCY_UNIT_NANOS,
                    )
                    .unwrap_or(u32::MAX),
                    client: registration.id,
                });
            }
            match &completion.result {
                Ok(()) => {
                    server.completed_ok.fetch_add(1, Ordering::SeqCst);
                }
                Err(error) => {
                    server.completed_error.fetch_add(1, Ordering::SeqCst);
                    {
                        let text = error.to_string();
                        let mut kinds = lock(&server.error_kinds);
                        match kinds.iter_mut().find(|(kind, _)| *kind == text) {
                            Some((_, count)) => *count += 1,
                            None => kinds.push((text, 1)),
                        }
                    }
                    if DEPARTED != registration.state.load(Ordering::SeqCst) {
                        server.error_departures.fetch_add(1, Ordering::Relaxed);
                        server.depart(&registration, &format!("error completion: {error}"));
                    }
                }
            }
            server.finish(&registration);
        }
    }
    samples
}
