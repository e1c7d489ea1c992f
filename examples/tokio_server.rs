//! A data-transfer server on tokio: a TCP control plane on 127.0.0.1, RMA writes through the
//! async API (`dma_libfabric::asynchronous`), and clients that come and go.
//!
//! ```text
//! cargo run --release --features tokio --example tokio_server
//! cargo run --release --features tokio --example tokio_server -- --clients 200 --writes 10
//! ```
//!
//! - The server listens on a TCP port. Each client connects and sends its fabric address, the
//!   24-byte descriptor of a region of its memory, and how many writes it wants.
//! - The accepting loop reads the client's hello, leases the client (`AsyncEndpoint::lease`: a
//!   miss resolves off the runtime) and registers the client's pages in place
//!   (`AsyncEndpoint::register_buffer`), then moves both into the client's own task
//!   (`tokio::spawn`): they hold the endpoint by `Arc`. The task answers the client's id, writes
//!   each record into the client's region with `AsyncEndpoint::write`, awaiting each completion,
//!   then answers how many writes completed.
//! - Every client is a task; they share a few client endpoints (each endpoint has its own
//!   address-cache writer thread, so one per client would be a thousand threads). Some clients
//!   hang up mid-transfer: the server sees the TCP connection close and drops its pending write
//!   future, which is cancel-safe (the write completes on its own, its lease and buffer held by
//!   the endpoint until the driver reads the completion).
//! - Clients that stay check every byte of their region.
//!
//! It prints writes per second, the p50 and p99 completion latency (post to completion read),
//! and the process's CPU time over a second of idleness afterwards (every endpoint's driver
//! asleep on its completion queues' file descriptors).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use dma_libfabric::asynchronous::{AsyncEndpoint, OwnedLease};
use dma_libfabric::{
    Configuration, DmaError, Exposure, LibfabricEndpoint, MemoryRegion, RemoteRegion,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser, Debug)]
#[command(about = "A tokio data-transfer server: RMA writes to clients over a TCP control plane")]
struct Arguments {
    /// Client tasks, all connected at once.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Writes each client asks for.
    #[arg(long, default_value_t = 20)]
    writes: u32,
    /// Bytes per write.
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Client endpoints the client tasks share.
    #[arg(long, default_value_t = 4)]
    client_endpoints: usize,
    /// One client in this many hangs up mid-transfer.
    #[arg(long, default_value_t = 10)]
    hang_up_every: usize,
    /// Seconds of idleness over which the process's CPU time is measured at the end.
    #[arg(long, default_value_t = 1.0)]
    idle_seconds: f64,
}

fn rma_endpoint() -> Result<AsyncEndpoint, DmaError> {
    let configuration = Configuration {
        rma: true,
        av_capacity: 4096,
        ..Configuration::default()
    };
    AsyncEndpoint::new(Arc::new(LibfabricEndpoint::open(
        &configuration,
        Some("127.0.0.1"),
    )?))
}

/// The record a write carries: different for every client and write, never all zero.
fn record(client: u64, write: u32, size: usize) -> Vec<u8> {
    (0..size)
        .map(|at| ((client as usize * 31 + write as usize * 7 + at) % 255) as u8 + 1)
        .collect()
}

/// The cache's client id for a peer: one per client endpoint (its address), shared by the client
/// tasks on it, and released only when the server stops. Releasing a peer and resolving it again
/// while transfers to it are still in flight (one id per connection, released at each hang-up)
/// removes and re-inserts its AV entry under live traffic: tcp;ofi_rxm then opens a second
/// connection to the same peer and the first one breaks (measured: writes failing with
/// `ENOTCONN`/`EPIPE`, and bytes of completed writes never landing).
fn peer_id(address: &[u8]) -> u64 {
    address.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What the server counts.
#[derive(Default)]
struct Counters {
    writes: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    latencies: std::sync::Mutex<Vec<u32>>,
}

async fn serve(
    server: AsyncEndpoint,
    listener: TcpListener,
    size: usize,
    counters: Arc<Counters>,
) -> std::io::Result<()> {
    let mut next_client = 0_u64;
    loop {
        let mut stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors, say: the connection waits in the backlog meanwhile.
                eprintln!("accept: {error}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        next_client += 1;
        // The accepting loop takes the client's lease and registers its pages, then moves both
        // into the client's own task: they hold the endpoint by `Arc` (`Send + 'static`). A
        // client that does not say hello in time costs the loop one second, no more.
        let hello = tokio::time::timeout(Duration::from_secs(1), read_hello(&mut stream)).await;
        let Ok(Ok(hello)) = hello else {
            eprintln!("client {next_client}: no hello");
            continue;
        };
        let client = next_client;
        let taken = async {
            let lease = server
                .lease(peer_id(&hello.address), &hello.address)
                .await?;
            let pages = server.register_buffer(vec![0_u8; size], Exposure::Local)?;
            Ok::<_, DmaError>((lease, pages))
        };
        let (lease, pages) = match taken.await {
            Ok(taken) => taken,
            Err(error) => {
                eprintln!("client {client}: {error}");
                counters.failed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let (server, counters) = (server.clone(), Arc::clone(&counters));
        tokio::spawn(async move {
            let task = ClientTask {
                server,
                lease,
                pages,
                hello,
                client,
                size,
            };
            if let Err(error) = task.serve(stream, &counters).await {
                eprintln!("client {client}: {error}");
            }
        });
    }
}

/// What a client says first: its fabric address, its region, and how many writes it wants.
struct Hello {
    address: Vec<u8>,
    target: RemoteRegion,
    writes: u32,
}

async fn read_hello(
    stream: &mut TcpStream,
) -> Result<Hello, Box<dyn std::error::Error + Send + Sync>> {
    let address_len = stream.read_u32().await? as usize;
    let mut address = vec![0; address_len.min(64)];
    stream.read_exact(&mut address).await?;
    let mut descriptor = [0; RemoteRegion::ENCODED_LEN];
    stream.read_exact(&mut descriptor).await?;
    let target = RemoteRegion::from_bytes(&descriptor)?;
    let writes = stream.read_u32().await?;
    Ok(Hello {
        address,
        target,
        writes,
    })
}

/// One client's task: everything it uses is its own (`Send + 'static`).
struct ClientTask {
    server: AsyncEndpoint,
    lease: OwnedLease,
    pages: MemoryRegion<'static, Vec<u8>>,
    hello: Hello,
    client: u64,
    size: usize,
}

impl ClientTask {
    async fn serve(
        self,
        mut stream: TcpStream,
        counters: &Counters,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let Self {
            server,
            lease,
            mut pages,
            hello,
            client,
            size,
        } = self;
        stream.write_u64(client).await?;
        let (mut reader, mut writer) = stream.into_split();
        let mut completed = 0_u32;
        let transfer = async {
            for write in 0..hello.writes {
                // The task's own pages, written in place: nothing else can touch them now (the
                // last write's completion has been read).
                pages.as_mut_slice()?[..size].copy_from_slice(&record(client, write, size));
                let slot = hello
                    .target
                    .slice(u64::from(write) * size as u64, size as u64)?;
                let posted = Instant::now();
                let done = server
                    .write(lease.lease(), pages.segment(0, size)?, slot)
                    .await?;
                done.result?;
                let micros = u32::try_from(posted.elapsed().as_micros()).unwrap_or(u32::MAX);
                counters
                    .latencies
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(micros);
                counters.writes.fetch_add(1, Ordering::Relaxed);
                completed += 1;
            }
            Ok::<(), DmaError>(())
        };
        let mut hung_up = [0_u8; 1];
        tokio::select! {
            result = transfer => {
                if let Err(error) = result {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                    return Err(error.into());
                }
                writer.write_u32(completed).await?;
            }
            // The client hung up mid-transfer: the pending write future is dropped, safely.
            _ = reader.read(&mut hung_up) => {
                counters.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

async fn run_client(
    endpoint: AsyncEndpoint,
    port: u16,
    client: usize,
    writes: u32,
    size: usize,
    hang_up: bool,
) -> Result<Option<MemoryRegion<'static>>, Box<dyn std::error::Error + Send + Sync>> {
    let region = endpoint
        .endpoint()
        .register_shared(writes as usize * size)?;
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|error| format!("client {client}: connect: {error}"))?;
    let address = endpoint.endpoint().local_address()?;
    stream.write_u32(address.len() as u32).await?;
    stream.write_all(&address).await?;
    stream.write_all(&region.remote().to_bytes()).await?;
    stream.write_u32(writes).await?;
    if hang_up {
        tokio::task::yield_now().await;
        // The stream drops: the server sees the close. The region is kept registered: a write
        // the server already posted into it would otherwise reach a closed key, and the tcp
        // provider answers that by closing the whole connection between the two endpoints,
        // failing every other client's writes on it (measured: EPIPE, and completed writes whose
        // bytes never landed). A client process that dies takes its connection with it instead.
        return Ok(Some(region));
    }
    let id = stream
        .read_u64()
        .await
        .map_err(|error| format!("client {client}: reading its id: {error}"))?;
    let completed = stream.read_u32().await?;
    if completed != writes {
        return Err(format!("client {client}: {completed} of {writes} writes").into());
    }
    let mut seen = vec![0; size];
    for write in 0..writes {
        // The bytes land as this endpoint's driver reads its queues.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            region.read_bytes(write as usize * size, &mut seen)?;
            if seen == record(id, write, size) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!("client {client}: write {write} never landed whole").into());
            }
            tokio::task::yield_now().await;
        }
    }
    Ok(None)
}

/// The process's CPU time (user and system) so far.
fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the rusage it is given, which lives across the call.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

fn percentile(sorted: &[u32], fraction: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let at = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// Raise the soft limit on open files to the hard one: two TCP sockets per client, both ends in
/// this process, are more than the usual soft limit of 1,024.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the rlimit given, which lives across both.
    unsafe {
        if 0 == libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit);
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // rxm reads its buffer sizes from the environment once, at the first open, and the runtime's
    // threads would make setting it unsound later: apply the sizing before they start (about
    // 5 MiB an endpoint instead of rxm's own 68 MiB).
    // SAFETY: the first thing the program does; no other thread runs yet.
    unsafe { Configuration::default().apply_rxm_environment() }?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let arguments = Arguments::parse();
    raise_open_files_limit();
    let server = rma_endpoint()?;
    let clients: Vec<AsyncEndpoint> = (0..arguments.client_endpoints.max(1))
        .map(|_| rma_endpoint())
        .collect::<Result<_, _>>()?;
    // A backlog for every client connecting at once (tokio's `bind` asks for 1,024).
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(([127, 0, 0, 1], 0).into())?;
    let listener = socket.listen(
        u32::try_from(arguments.clients)
            .unwrap_or(u32::MAX)
            .max(128),
    )?;
    let port = listener.local_addr()?.port();
    let counters = Arc::new(Counters::default());
    let serving = tokio::spawn(serve(
        server.clone(),
        listener,
        arguments.size,
        Arc::clone(&counters),
    ));

    let started = Instant::now();
    let tasks: Vec<_> = (0..arguments.clients)
        .map(|client| {
            let endpoint = clients[client % clients.len()].clone();
            let hang_up = arguments.hang_up_every > 0 && 0 == client % arguments.hang_up_every;
            tokio::spawn(run_client(
                endpoint,
                port,
                client,
                arguments.writes,
                arguments.size,
                hang_up,
            ))
        })
        .collect();
    let (mut verified, mut hung_up, mut failed) = (0, 0, 0);
    let mut kept = Vec::new();
    for task in tasks {
        match task.await? {
            Ok(None) => verified += 1,
            Ok(Some(region)) => {
                kept.push(region);
                hung_up += 1;
            }
            Err(error) => {
                eprintln!("{error}");
                failed += 1;
            }
        }
    }
    let elapsed = started.elapsed();
    // Let the server notice the last hang-ups and drain what they left in flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    while 0 < server.endpoint().operations_in_flight() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    let writes = counters.writes.load(Ordering::Relaxed);
    let mut latencies = std::mem::take(
        &mut *counters
            .latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    latencies.sort_unstable();
    println!(
        "{} clients ({verified} verified every byte, {hung_up} hung up mid-transfer, {failed} failed), {} bytes a write",
        arguments.clients, arguments.size
    );
    println!(
        "{writes} writes in {:.2} s: {:.0} writes/s; completion latency p50 {} us, p99 {} us",
        elapsed.as_secs_f64(),
        writes as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
    );
    println!(
        "server: {} transfers cancelled by a hang-up, {} failed, {} operations in flight, {} leases",
        counters.cancelled.load(Ordering::Relaxed),
        counters.failed.load(Ordering::Relaxed),
        server.endpoint().operations_in_flight(),
        server.endpoint().cache().stats().leases,
    );

    let idle = Duration::from_secs_f64(arguments.idle_seconds.max(0.0));
    let cpu = process_cpu();
    tokio::time::sleep(idle).await;
    let cpu = process_cpu() - cpu;
    println!(
        "idle: {:.2} ms of CPU over {:.1} s ({:.3}% of a core), {} endpoints asleep",
        cpu.as_secs_f64() * 1e3,
        idle.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / idle.as_secs_f64().max(1e-9),
        1 + clients.len(),
    );
    serving.abort();
    drop(kept);
    if 0 < failed || 0 < server.endpoint().operations_in_flight() {
        return Err("some clients failed, or operations stayed in flight".into());
    }
    Ok(())
}
