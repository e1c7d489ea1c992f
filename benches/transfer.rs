//! Transfers in nixlbench's columns, on loopback tcp;ofi_rxm (`cargo bench --bench transfer`,
//! `-- --quick` for a short run). Prints a markdown table (docs/benchmarks.md, "Transfers, in
//! nixlbench's columns").
//!
//! For WRITE and READ, every block size of 4 KiB, 64 KiB, 1 MiB, 16 MiB and 64 MiB and every
//! batch size of 1, 16 and 64: one thread leases the peer and posts `batch` transfers of `block`
//! bytes, each at its own offset of the peer's region and of its own, then waits for all of
//! them (`wait_for`, sleeping), and does it again, for a fixed number of bytes, iterations or
//! seconds, whichever comes first. A second thread drives the target (`progress_sleeping`).
//! The regions are 1 GiB each: a batch larger than that (16 MiB × 64, 64 MiB × 16 and × 64)
//! wraps around and reuses offsets within the batch.
//!
//! Then the same row runs both ways at once, in the shape of fi_rma_bw's own `-o write` and
//! `-o read` tests: two threads, each posting the same number of batches from its endpoint to
//! the other's and waiting for its own (asleep in `wait_for`, which drives its endpoint's
//! progress, so each serves the other's transfers as target, as each fi_rma_bw process does),
//! and no third thread. The table gives the slower side's GB/s (its own bytes over its own
//! time, as fi_rma_bw reports its client's), and that as a ratio of fi_rma_bw: the comparison
//! of like with like. The one-way GB/s is given as a ratio of it too, as before (a one-way
//! stream against fi_rma_bw's one side of a two-way one).
//!
//! Columns, as nixlbench's:
//!
//! - GB/s: bytes moved ÷ the measured time (10^9 bytes a second);
//! - average latency: the measured time ÷ the batches, per batch;
//! - p99 post time: one post call, the lease (a cache hit) and the `write` or `read`;
//! - p99 transfer time: from the first post of a batch to the last of its completions read.
//!
//! `TRANSFER_ONLY=write:4096:16` (op, block in bytes, batch) runs that row alone, for `perf`.
//!
//! Then, where fabtests' `fi_rma_bw` is found (the path in `FI_RMA_BW`, else `PATH`, else
//! `target/fabtests-2.6.0/bin/fi_rma_bw`, a build of the fabtests of the repository's 2.6.0
//! tarball), it runs on the same block size, with the batch as its window (`-W`) and the same
//! number of transfers (whole windows, at least two), over `-p "tcp;ofi_rxm" -e rdm` between a
//! server and a client process on 127.0.0.1, with `-U` (delivery complete, as our writes) for
//! WRITE; the table gives its MB/s (10^6 bytes a second, the client's figure) and ours as a
//! ratio of it. fi_rma_bw's WRITE and READ tests are bidirectional: both processes post at
//! once, each at the other (hence ours both ways). So for WRITE it runs once more as `-o writedata`, its one-way
//! test (the client writes, with remote CQ data the server reads; `-U` too), in the last two
//! columns; READ has no one-way test. It waits for its completions with `-c sread` (asleep in
//! `fi_cq_sread`, as ours sleep): on this shared two-core machine its default, `-c spin`, gave a
//! quarter to a ninth of that rate (4 KiB × 64 writes 19 against 92 MB/s, 1 MiB × 16 235 against
//! 923, 64 KiB × 64 reads 79 against 700, at load 9). `FI_RMA_BW_ARGS` replaces `-c sread` with
//! other arguments (split at spaces), `FI_RMA_BW_ARGS=` with none. A window whose buffers
//! (2 × block × window a process) would pass 2 GiB is not run.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint, WriteCompletion};

const BLOCKS: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
const BATCHES: [usize; 3] = [1, 16, 64];
/// Each side's region: a batch of more than this many bytes reuses offsets.
const REGION: usize = 1 << 30;
/// The peer's budget of operations in flight: at least the largest batch.
const IN_FLIGHT: usize = 64;
/// fi_rma_bw runs only where block × window is at most this (its buffers are twice that, in
/// each of its two processes).
const FABTESTS_LIMIT: usize = 1 << 30;
const PATIENCE: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Read,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Write => "WRITE",
            Op::Read => "READ",
        }
    }
}

/// How long one (operation, block, batch) runs: until `bytes` have moved, `iterations`
/// batches have completed or `seconds` have passed, whichever comes first, and at least one
/// batch.
struct Budget {
    bytes: usize,
    iterations: usize,
    seconds: f64,
}

struct Row {
    iterations: usize,
    seconds: f64,
    posts: Vec<Duration>,
    transfers: Vec<Duration>,
}

impl Row {
    /// GB/s: the row's bytes, `iterations` batches of `batch` transfers of `block`, over its time.
    fn rate(&self, block: usize, batch: usize) -> f64 {
        (self.iterations * batch * block) as f64 / self.seconds / 1e9
    }
}

/// `Configuration::spin_before_sleep` for both endpoints: `SPIN_BEFORE_SLEEP_US` microseconds
/// (the default's zero when unset).
fn spin_before_sleep() -> Duration {
    let micros = std::env::var("SPIN_BEFORE_SLEEP_US").ok();
    Duration::from_micros(micros.and_then(|text| text.parse().ok()).unwrap_or(0))
}

fn p99(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * 0.99) as usize]
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

struct Bench<'a> {
    initiator: &'a LibfabricEndpoint,
    local: dma_libfabric::MemoryRegion<'a, Vec<u8>>,
    remote: dma_libfabric::RemoteRegion,
    address: Vec<u8>,
    next_id: u64,
}

impl Bench<'_> {
    /// One batch: `batch` posts (each one's time pushed on `posts`), then every completion.
    /// Returns the batch's transfer time, from its first post to its last completion read.
    fn batch(&mut self, op: Op, block: usize, batch: usize, posts: &mut Vec<Duration>) -> Duration {
        let slots = REGION / block;
        let first = self.next_id;
        let started = Instant::now();
        for at in 0..batch {
            let offset = (at % slots) * block;
            let id = self.next_id;
            self.next_id += 1;
            let posted = Instant::now();
            let lease = self.initiator.cache().lease(1, &self.address).unwrap();
            let segment = self.local.segment(offset, block).unwrap();
            let remote = self.remote.slice(offset as u64, block as u64).unwrap();
            match op {
                Op::Write => self.initiator.write(lease, segment, remote, id),
                Op::Read => self.initiator.read(lease, segment, remote, id),
            }
            .unwrap();
            posts.push(posted.elapsed());
        }
        for id in first..self.next_id {
            let done = self.initiator.wait_for(id, PATIENCE).unwrap();
            assert_eq!(Ok(()), done.result);
        }
        started.elapsed()
    }

    fn run(&mut self, op: Op, block: usize, batch: usize, budget: &Budget) -> Row {
        // Warm-up: up to 10 batches, no more than 64 MiB of them (none past that).
        let warm = (64 << 20) / (block * batch);
        let mut scratch = Vec::new();
        for _ in 0..warm.min(10) {
            self.batch(op, block, batch, &mut scratch);
        }
        let mut posts = Vec::new();
        let mut transfers = Vec::new();
        let started = Instant::now();
        loop {
            transfers.push(self.batch(op, block, batch, &mut posts));
            let moved = transfers.len() * batch * block;
            if moved >= budget.bytes
                || transfers.len() >= budget.iterations
                || started.elapsed().as_secs_f64() >= budget.seconds
            {
                break;
            }
        }
        Row {
            iterations: transfers.len(),
            seconds: started.elapsed().as_secs_f64(),
            posts,
            transfers,
        }
    }
}

/// Whether this row runs: all of them, or with `TRANSFER_ONLY=op:block:batch` (for example
/// `write:4096:16`, for `perf` to look at one row) only that one.
fn selected(op: Op, block: usize, batch: usize) -> bool {
    std::env::var("TRANSFER_ONLY").map_or(true, |only| {
        only.eq_ignore_ascii_case(&format!("{}:{block}:{batch}", op.name()))
    })
}

/// A source region on `from` and a landing region on `to`, a [`REGION`] each.
fn regions<'a>(
    from: &'a LibfabricEndpoint,
    to: &'a LibfabricEndpoint,
) -> (
    dma_libfabric::MemoryRegion<'a, Vec<u8>>,
    dma_libfabric::MemoryRegion<'a, Vec<u8>>,
) {
    (
        from.register_buffer(vec![0x5a_u8; REGION], Exposure::Local)
            .unwrap(),
        to.register_buffer(vec![0xa5_u8; REGION], Exposure::Remote)
            .unwrap(),
    )
}

/// Both ways at once, as fi_rma_bw's `-o write` and `-o read` run: two threads, each posting
/// `iterations` batches from its own endpoint to the other's and waiting for its own completions
/// (asleep in `wait_for`, which drives its endpoint's progress, so each serves the other's
/// transfers as their target, as each fi_rma_bw process does; no third thread). The slower
/// side's GB/s, its own bytes over its own time, as fi_rma_bw reports the client's.
fn both_ways(
    [forward, backward]: [&mut Bench<'_>; 2],
    op: Op,
    block: usize,
    batch: usize,
    iterations: usize,
) -> f64 {
    let budget = Budget {
        bytes: usize::MAX,
        iterations,
        seconds: f64::INFINITY,
    };
    // A side that is done keeps driving its endpoint until the other is: its transfers need
    // their target's progress (and its first, the connection's).
    let done = AtomicUsize::new(0);
    let side = |bench: &mut Bench<'_>| {
        let row = bench.run(op, block, batch, &budget);
        done.fetch_add(1, Ordering::SeqCst);
        while done.load(Ordering::SeqCst) < 2 {
            bench.initiator.progress_sleeping(Duration::from_millis(1));
        }
        row
    };
    let (there, back) = std::thread::scope(|scope| {
        let back = scope.spawn(|| side(backward));
        let there = side(forward);
        (there, back.join().unwrap())
    });
    there.rate(block, batch).min(back.rate(block, batch))
}

/// Where fi_rma_bw is, or why not.
fn find_fi_rma_bw() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("FI_RMA_BW") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("FI_RMA_BW={} is not a file", path.display()))
        };
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for directory in std::env::split_paths(&paths) {
            let path = directory.join("fi_rma_bw");
            if path.is_file() {
                return Ok(path);
            }
        }
    }
    let built =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/fabtests-2.6.0/bin/fi_rma_bw");
    if built.is_file() {
        return Ok(built);
    }
    Err(format!(
        "no fi_rma_bw: FI_RMA_BW is not set, none on PATH, and no {} (fabtests of the 2.6.0 tarball, \
         built with ./configure --with-libfabric=target/libfabric-2.6.0)",
        built.display()
    ))
}

/// Whether something listens on 127.0.0.1 (or any address) at `port`, from /proc/net/tcp.
fn listening(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 3
            && fields[3] == "0A"
            && fields[1].ends_with(&format!(":{port:04X}"))
            && (fields[1].starts_with("0100007F") || fields[1].starts_with("00000000"))
    })
}

/// Waits up to `limit` for `child`, killing it past that. Its stdout, or why not.
fn finish(mut child: Child, limit: Duration) -> Result<String, String> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|error| error.to_string())? {
            let output = child
                .wait_with_output()
                .map_err(|error| error.to_string())?;
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            return if status.success() {
                Ok(stdout)
            } else {
                Err(format!(
                    "{status}: {}",
                    String::from_utf8_lossy(&output.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                ))
            };
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("killed after {} s", limit.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The MB/s of fi_rma_bw's result line: `bytes iters total time MB/sec usec/xfer Mxfers/sec`.
fn parse_rate(stdout: &str) -> Option<f64> {
    stdout.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() == 7)
            .then(|| fields[4].parse::<f64>().ok())
            .flatten()
    })
}

/// fi_rma_bw's arguments besides the test's: `FI_RMA_BW_ARGS`, or `-c sread`.
fn extra_arguments() -> Vec<String> {
    std::env::var("FI_RMA_BW_ARGS")
        .unwrap_or_else(|_| "-c sread".to_owned())
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// One fi_rma_bw run of `-o op`: `transfers` of `block` bytes, `window` in flight, `-U` if
/// `delivered`; the client's MB/s.
fn fi_rma_bw(
    binary: &PathBuf,
    op: &str,
    block: usize,
    window: usize,
    transfers: usize,
    delivered: bool,
    port: u16,
) -> Result<f64, String> {
    // Whole windows, and more transfers than one window (fi_rma_bw needs that).
    let transfers = transfers.div_ceil(window).max(2) * window;
    let arguments = |command: &mut Command| {
        command
            .args(["-p", "tcp;ofi_rxm", "-e", "rdm", "-o", op])
            .args(["-S", &block.to_string(), "-W", &window.to_string()])
            .args(["-I", &transfers.to_string()])
            .args(extra_arguments())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if delivered {
            command.arg("-U");
        }
    };
    let mut server = Command::new(binary);
    arguments(&mut server);
    server.args(["-s", "127.0.0.1", "-B", &port.to_string()]);
    let server = server.spawn().map_err(|error| error.to_string())?;
    let started = Instant::now();
    while !listening(port) && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut client = Command::new(binary);
    arguments(&mut client);
    client.args(["-P", &port.to_string(), "127.0.0.1"]);
    let client = match client.spawn() {
        Ok(client) => client,
        Err(error) => {
            let _ = finish(server, Duration::ZERO);
            return Err(error.to_string());
        }
    };
    let limit = Duration::from_secs(120);
    let client = finish(client, limit);
    let server = finish(server, Duration::from_secs(10));
    let stdout = client.map_err(|error| format!("client: {error}"))?;
    server.map_err(|error| format!("server: {error}"))?;
    parse_rate(&stdout).ok_or_else(|| format!("no rate in its output: {stdout:?}"))
}

fn main() {
    let quick = std::env::args().any(|argument| "--quick" == argument);
    let budget = if quick {
        Budget {
            bytes: 64 << 20,
            iterations: 2_000,
            seconds: 0.4,
        }
    } else {
        Budget {
            bytes: 1 << 30,
            iterations: 20_000,
            seconds: 2.0,
        }
    };
    let write_completion = WriteCompletion::Delivered;
    let configuration = Configuration {
        rma: true,
        max_operations_per_peer: IN_FLIGHT,
        write_completion,
        spin_before_sleep: spin_before_sleep(),
        ..Configuration::default()
    };
    let initiator = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
    let target = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
    let fabtests = find_fi_rma_bw();
    let (major, minor) = dma_libfabric::runtime_version();

    println!("load average at the start: {}", load());
    println!(
        "libfabric {major}.{minor} (runtime), tcp;ofi_rxm on 127.0.0.1; {}",
        if quick { "--quick" } else { "full run" }
    );
    println!(
        "threads: 2 (one way: one posts and waits, sleeping in wait_for; one drives the target, sleeping in progress_sleeping. Both ways: each posts to the other and waits, sleeping in wait_for)"
    );
    println!(
        "spin_before_sleep: {:?} (SPIN_BEFORE_SLEEP_US)",
        spin_before_sleep()
    );
    println!(
        "writes complete: {}; max_operations_per_peer {IN_FLIGHT}",
        match write_completion {
            WriteCompletion::Delivered =>
                "once delivered (WriteCompletion::Delivered, the default)",
            _ => "once sent (WriteCompletion::Local)",
        }
    );
    println!(
        "each row: until {} MiB moved, {} batches or {} s, after up to 10 batches (≤ 64 MiB) of warm-up",
        budget.bytes >> 20,
        budget.iterations,
        budget.seconds
    );
    match &fabtests {
        Ok(path) => println!(
            "fi_rma_bw: {} -p \"tcp;ofi_rxm\" -e rdm {} (window = batch, the same transfers, -U on writes; -o write and -o read bidirectional, -o writedata one way)",
            path.display(),
            extra_arguments().join(" ")
        ),
        Err(why) => println!("fi_rma_bw: skipped: {why}"),
    }
    println!();

    let ((local, landing), (local_back, landing_back)) =
        (regions(&initiator, &target), regions(&target, &initiator));
    let mut bench = Bench {
        initiator: &initiator,
        local,
        remote: landing.remote(),
        address: target.local_address().unwrap(),
        next_id: 0,
    };
    // The other way, for the rows' both-ways run: from the target to the initiator.
    let mut back = Bench {
        initiator: &target,
        local: local_back,
        remote: landing_back.remote(),
        address: initiator.local_address().unwrap(),
        next_id: 0,
    };
    // Each endpoint's connection to the other, set up before any row is timed.
    both_ways([&mut bench, &mut back], Op::Write, 4 << 10, 1, 10);
    let mut port = 20_000 + (std::process::id() % 20_000) as u16;

    println!(
        "| op | block | batch | batches | GB/s | avg latency (µs/batch) | p99 post (µs) | p99 transfer (µs) | ours both ways (GB/s, slower side) | fi_rma_bw (MB/s) | ours both ways ÷ fi_rma_bw | one way ÷ fi_rma_bw | fi_rma_bw writedata, one way (MB/s) | one way ÷ that |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for op in [Op::Write, Op::Read] {
        for block in BLOCKS {
            for batch in BATCHES {
                if !selected(op, block, batch) {
                    continue;
                }
                // One way: this thread posts, a second drives the target asleep.
                let stop = AtomicBool::new(false);
                let row = std::thread::scope(|scope| {
                    scope.spawn(|| {
                        while !stop.load(Ordering::Relaxed) {
                            target.progress_sleeping(Duration::from_millis(50));
                        }
                    });
                    let row = bench.run(op, block, batch, &budget);
                    stop.store(true, Ordering::Relaxed);
                    row
                });
                let both = both_ways([&mut bench, &mut back], op, block, batch, row.iterations);
                let rate = row.rate(block, batch);
                let average = row.seconds * 1e6 / row.iterations as f64;
                let delivered = write_completion == WriteCompletion::Delivered;
                // fi_rma_bw's MB/s as the table gives it, and the figure when it ran.
                let mut compare = |fabtests_op: &str, delivered: bool| match &fabtests {
                    Err(_) => ("skipped".to_owned(), None),
                    Ok(_) if block * batch > FABTESTS_LIMIT => {
                        ("not run (buffers > 2 GiB)".to_owned(), None)
                    }
                    Ok(binary) => {
                        port = port.wrapping_add(1).max(20_000);
                        let transfers = row.iterations * batch;
                        match fi_rma_bw(
                            binary,
                            fabtests_op,
                            block,
                            batch,
                            transfers,
                            delivered,
                            port,
                        ) {
                            Ok(mbs) => (format!("{mbs:.0}"), Some(mbs)),
                            Err(why) => (format!("failed: {why}"), None),
                        }
                    }
                };
                let ratio = |ours: f64, theirs: Option<f64>| {
                    theirs.map_or_else(String::new, |mbs| format!("{:.2}×", ours * 1e3 / mbs))
                };
                let (theirs, their_rate) = match op {
                    Op::Write => compare("write", delivered),
                    Op::Read => compare("read", false),
                };
                let (one_way, one_way_rate) = match op {
                    Op::Write => compare("writedata", delivered),
                    Op::Read => ("–".to_owned(), None),
                };
                println!(
                    "| {} | {} | {batch} | {} | {rate:.3} | {average:.1} | {:.1} | {:.1} | {both:.3} | {theirs} | {} | {} | {one_way} | {} |",
                    op.name(),
                    size(block),
                    row.iterations,
                    micros(p99(row.posts)),
                    micros(p99(row.transfers)),
                    ratio(both, their_rate),
                    ratio(rate, their_rate),
                    ratio(rate, one_way_rate),
                );
            }
        }
    }
    println!();
    println!("load average at the end: {}", load());
}
