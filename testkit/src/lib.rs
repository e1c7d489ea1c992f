//! What dma-libfabric's tests, benches, loom models and fuzz targets share, written once:
//!
//! - address builders for each format: [`efa`] and [`efa_numbered`], [`sockaddr`] and
//!   [`sockaddr_parts`], [`opaque`];
//! - real tcp endpoints on 127.0.0.1: [`tcp`], [`tcp_with_capacity`];
//! - [`park_behind_lease`]: many clients parked behind a leased incarnation;
//! - [`Observed`], any AV backend with an [`Observer`] around its calls;
//! - [`Random`], a small deterministic generator, so stress tests and benches replay;
//! - `fuzzing` (feature `fuzzing`): the fuzz targets' checks and reference model.
//!
//! Not part of the library: nothing here ships to users.
#![allow(clippy::expect_used, clippy::panic)] // a test helper that cannot set up fails the test at once

pub mod demo;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;

use dma_libfabric::sys::fi_addr_t;
use dma_libfabric::{AddressFormat, AvBackend, Configuration, DmaError, LibfabricEndpoint};

/// A 32-byte efa address: GID of `gid`s, QPN `qpn`, QKEY `qkey` (the pad and the trailing
/// pointer bytes zero).
///
/// ```
/// let address = testkit::efa(1, 7, 2);
/// assert_eq!(32, address.len());
/// assert_eq!(testkit::efa(1, 7, 3)[..18], address[..18], "the QKEY is not part of the identity");
/// ```
pub fn efa(gid: u8, qpn: u16, qkey: u32) -> Vec<u8> {
    let mut address = vec![0_u8; 32];
    address[..16].fill(gid);
    address[16..18].copy_from_slice(&qpn.to_ne_bytes());
    address[20..24].copy_from_slice(&qkey.to_ne_bytes());
    address
}

/// Lease `old` as client 0 and park clients `1..=clients` on `new`, a newer incarnation of the
/// same slot, behind it (one `resolve_all`); panics unless every one answers `WouldBlock`. They
/// stay parked until the returned lease is dropped, which starts their admission.
pub fn park_behind_lease<'cache, B: AvBackend>(
    cache: &'cache dma_libfabric::AddressCache<B>,
    old: &[u8],
    new: &[u8],
    clients: u64,
) -> dma_libfabric::Lease<'cache> {
    let lease = cache.lease(0, old).expect("the old incarnation");
    let requests: Vec<(u64, &[u8])> = (1..=clients).map(|client| (client, new)).collect();
    let all_parked = cache
        .pin()
        .resolve_all(&requests)
        .iter()
        .all(|parked| matches!(parked, Err(DmaError::WouldBlock)));
    assert!(all_parked, "all parked behind the leased incarnation");
    lease
}

/// efa address number `n`: a link-local GID and a QPN from `n` (distinct for every `n`), and a
/// QKEY that looks random.
pub fn efa_numbered(n: u32) -> Vec<u8> {
    let mut address = vec![0_u8; 32];
    address[0..2].copy_from_slice(&[0xfe, 0x80]);
    address[8..12].copy_from_slice(&(n >> 16).to_be_bytes());
    address[16..18].copy_from_slice(&(n as u16).to_ne_bytes());
    address[20..24].copy_from_slice(&(n.wrapping_mul(0x9e37_79b9) | 1).to_ne_bytes());
    address
}

/// A well-formed `sockaddr_in` for 127.0.0.x and a port derived from `n`, with `n`'s high bits
/// in the host byte: up to 16 million distinct addresses. `fi_av_insert` never contacts a peer,
/// so nothing needs to listen there.
///
/// ```
/// assert_ne!(testkit::sockaddr(1), testkit::sockaddr(65_001));
/// ```
pub fn sockaddr(n: u32) -> Vec<u8> {
    let port = 1 + (n % 65_000) as u16;
    let host = 1 + (n / 65_000) as u8;
    sockaddr_parts(2, port, [127, 0, 0, host])
}

/// A 16-byte `sockaddr_in` of any `family` (AF_INET is 2), in the machine's byte order for the
/// family and network order for the port.
pub fn sockaddr_parts(family: u16, port: u16, host: [u8; 4]) -> Vec<u8> {
    let mut address = vec![0_u8; 16];
    address[0..2].copy_from_slice(&family.to_ne_bytes());
    address[2..4].copy_from_slice(&port.to_be_bytes());
    address[4..8].copy_from_slice(&host);
    address
}

/// A 16-byte opaque address numbered `n`.
pub fn opaque(n: u8) -> Vec<u8> {
    vec![n; 16]
}

/// A real tcp endpoint on loopback, with the default configuration.
pub fn tcp() -> LibfabricEndpoint {
    tcp_with_capacity(Configuration::default().av_capacity)
}

/// A real tcp endpoint on loopback with RMA asked for (`Configuration::rma`).
pub fn rma_tcp() -> LibfabricEndpoint {
    let configuration = Configuration {
        rma: true,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("an RMA endpoint on tcp")
}

/// Run `body` while another thread drives `peer`'s progress (tcp progresses manually: the target
/// of RMA accepts the connection and lands or answers it only while it reads its queues). The
/// helper thread stops when `body` returns or panics.
pub fn with_progress<R>(peer: &LibfabricEndpoint, body: impl FnOnce() -> R) -> R {
    while_driving(
        || {
            peer.progress();
            let _ = peer.try_receive();
        },
        body,
    )
}

/// Run `body` while another thread calls `step` over and over; that thread stops when `body`
/// returns or panics. What [`with_progress`] and [`with_rails_progress`] share.
fn while_driving<R>(step: impl Fn() + Sync, body: impl FnOnce() -> R) -> R {
    /// Sets its flag when dropped, unwinding included.
    struct StopOnDrop<'flag>(&'flag std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Release);
        }
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                step();
                std::thread::yield_now();
            }
        });
        let _stop = StopOnDrop(&stop);
        body()
    })
}

/// How long a test waits for something on loopback before it fails: a bound against hangs, not a
/// timing assertion, so long that a loaded machine (two builds on two cores) does not reach it.
pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long [`wait_until`] waits for an event before it calls the wait endless: a bound against
/// hangs only, far past anything a loaded machine takes, never a timing assertion.
pub const FAILSAFE: std::time::Duration = std::time::Duration::from_secs(120);

/// Wait until `condition` holds, polling it (yielding between polls): for a test to wait for the
/// event it means (a removal run, an entry admitted) rather than for a time. Panics, naming
/// `what`, only after [`FAILSAFE`], which only a real hang reaches.
///
/// ```
/// let mut polls = 0;
/// testkit::wait_until("the third poll", || {
///     polls += 1;
///     3 <= polls
/// });
/// assert_eq!(3, polls);
/// ```
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + FAILSAFE;
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not after {FAILSAFE:?}, a wait for ever"
        );
        std::thread::yield_now();
    }
}

/// `attempt` (a blocking lease of an entry whose old incarnation's lease or pin the test has
/// just let go), again while it answers `OutOfPatience` with `leases: 0`: nothing holds the old
/// incarnation any more and its removal is still on its way (a loaded machine keeps the writer
/// or an exiting reader off a core for longer than a short patience). What else it answers is
/// the answer, the entry or another error; `leases: 1` or more fails the test at once, as a
/// caller who let go still being waited on is a bug. Panics after [`FAILSAFE`].
pub fn once_admitted<T>(
    what: &str,
    mut attempt: impl FnMut() -> Result<T, DmaError>,
) -> Result<T, DmaError> {
    let deadline = std::time::Instant::now() + FAILSAFE;
    loop {
        match attempt() {
            Err(DmaError::OutOfPatience { leases: 0, .. }) => assert!(
                std::time::Instant::now() < deadline,
                "{what}: not admitted after {FAILSAFE:?}, a wait for ever"
            ),
            answer => return answer,
        }
    }
}

/// Wait until `region` holds `expected` at `offset`: RMA data lands when the target progresses,
/// which may be after the initiator's completion. Panics after [`PATIENCE`].
pub fn wait_for_bytes(region: &dma_libfabric::MemoryRegion<'_>, offset: usize, expected: &[u8]) {
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut seen = vec![0; expected.len()];
    loop {
        region.read_bytes(offset, &mut seen).expect("in range");
        if seen == expected {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the bytes never landed: {seen:?}"
        );
        std::thread::yield_now();
    }
}

/// A real tcp endpoint on loopback whose AV was opened for `capacity` entries.
pub fn tcp_with_capacity(capacity: usize) -> LibfabricEndpoint {
    let configuration = Configuration {
        av_capacity: capacity,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint on 127.0.0.1")
}

/// A small deterministic generator (xorshift64*).
///
/// ```
/// let mut random = testkit::Random::new(7);
/// assert!(random.below(10) < 10);
/// ```
#[derive(Debug, Clone)]
pub struct Random(pub u64);

impl Random {
    /// A generator from `seed` (made odd, so never the stuck zero state).
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// The next 64 bits.
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `bound` (0 for a bound of 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
}

/// What an [`Observed`] backend does around each call its writer makes. Every method does
/// nothing unless overridden.
pub trait Observer: Send + 'static {
    /// Before `fi_av_insert` of `address`: may block, to hold the writer still.
    fn before_insert(&mut self, _address: &[u8]) {}
    /// After `fi_av_insert`, with its result.
    fn after_insert(&mut self, _result: &Result<fi_addr_t, DmaError>) {}
    /// After `fi_av_remove` of `fi_addr`, with its result.
    fn after_remove(&mut self, _fi_addr: fi_addr_t, _result: &Result<(), DmaError>) {}
}

/// Any AV backend with an [`Observer`] around its calls: counts, timestamps or gates, without
/// writing the delegation out again for each.
///
/// ```
/// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
/// use testkit::{Observed, Observer};
///
/// struct Inserts(std::sync::Arc<std::sync::atomic::AtomicU64>);
/// impl Observer for Inserts {
///     fn after_insert(&mut self, _: &Result<u64, DmaError>) {
///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     }
/// }
/// let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
/// let cache = AddressCache::with_backend(Observed {
///     av: ModelAv::new(AddressFormat::Opaque),
///     observer: Inserts(count.clone()),
/// });
/// cache.pin().resolve(1, &[1; 16])?;
/// assert_eq!(1, count.load(std::sync::atomic::Ordering::Relaxed));
/// # Ok::<(), DmaError>(())
/// ```
pub struct Observed<B, O> {
    /// The backend the calls go to.
    pub av: B,
    /// What runs around them.
    pub observer: O,
}

impl<B: AvBackend, O: Observer> AvBackend for Observed<B, O> {
    fn format(&self) -> AddressFormat {
        self.av.format()
    }
    fn address_len(&self) -> usize {
        self.av.address_len()
    }
    fn capacity(&self) -> usize {
        self.av.capacity()
    }
    fn insert(&mut self, address: &[u8]) -> Result<fi_addr_t, DmaError> {
        self.observer.before_insert(address);
        let result = self.av.insert(address);
        self.observer.after_insert(&result);
        result
    }
    fn remove(&mut self, fi_addr: fi_addr_t) -> Result<(), DmaError> {
        let result = self.av.remove(fi_addr);
        self.observer.after_remove(fi_addr, &result);
        result
    }
}

/// The variable that tells a re-run test binary which test is its child's to run.
const CHILD_TEST: &str = "DMA_LIBFABRIC_CHILD_TEST";

/// Run the rest of test `name` in a child process, since a crash there must fail the test rather
/// than end the test binary: in the parent, re-run this binary with `--exact name`, assert that
/// the child ran that one test and exited successfully (a crash fails, whether the signal ends
/// the child or libfabric's handler turns it into an exit status), and return `false`; in that child, return `true`, so the test does its
/// dangerous calls and assertions.
///
/// ```ignore
/// #[test]
/// fn dangerous() {
///     if !testkit::in_child_process("dangerous") {
///         return;
///     }
///     // the calls that used to crash
/// }
/// ```
pub fn in_child_process(name: &str) -> bool {
    let Some(output) = child_output(name) else {
        return true;
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let signal = std::os::unix::process::ExitStatusExt::signal(&output.status);
    assert!(
        output.status.success(),
        "the child running {name} failed: {:?} (signal {signal:?}; libfabric's own handler \
         turns a SIGSEGV into exit status 1 and prints \"terminated with signal 11\")\n\
         stdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("1 passed"),
        "the child ran {name}:\n{stdout}"
    );
    false
}

/// Run the rest of test `name` in a child process and hand back how it ended: `None` in the
/// child (which goes on with the test), the child's output in the parent. For a test whose child
/// is meant to die (an abort), which [`in_child_process`] would count as a failure.
pub fn child_output(name: &str) -> Option<std::process::Output> {
    if std::env::var(CHILD_TEST).as_deref() == Ok(name) {
        return None;
    }
    Some(
        std::process::Command::new(std::env::current_exe().expect("this test binary"))
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_TEST, name)
            // A child that dies may leave a crash report in its working directory (this
            // machine's handler writes `*.btr` files): keep them out of the source tree.
            .current_dir(std::env::temp_dir())
            .output()
            .expect("re-run this test binary"),
    )
}

/// Run the rest of test `name` in a child process that keeps running, for a test that kills it:
/// `None` in the child (which goes on with the test), the running child in the parent, with its
/// stdin and stdout piped. A child that waits on its stdin ends when the parent drops its
/// `Child` (the pipe closes), so a parent that fails before it kills the child leaves nothing
/// behind.
pub fn spawn_child(name: &str) -> Option<std::process::Child> {
    if std::env::var(CHILD_TEST).as_deref() == Ok(name) {
        return None;
    }
    Some(
        std::process::Command::new(std::env::current_exe().expect("this test binary"))
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_TEST, name)
            .current_dir(std::env::temp_dir())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("re-run this test binary"),
    )
}

/// The peer's side of an RMA peer process, in the child [`spawn_child`] started: open an RMA
/// endpoint, register `region_len` bytes, announce the address and the region on stdout (a
/// `PEER <address> <region>` line, in hex, that [`announced_peer`] reads), progress until the
/// parent says "hold" (a byte on stdin), then never again, until killed or its stdin closes.
pub fn be_an_rma_peer(region_len: usize) -> ! {
    use std::io::{Read, Write};
    let peer = rma_tcp();
    let target = peer.register(region_len).expect("peer memory");
    println!(
        "PEER {} {}",
        hex(&peer.local_address().expect("address")),
        hex(&target.remote().to_bytes())
    );
    std::io::stdout().flush().expect("flush");
    let (said, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut byte = [0; 1];
        while let Ok(1) = std::io::stdin().read(&mut byte) {
            let _ = said.send(());
        }
        std::process::exit(0);
    });
    while heard.try_recv().is_err() {
        peer.progress();
        std::thread::yield_now();
    }
    loop {
        std::thread::park();
    }
}

/// The parent's side of [`be_an_rma_peer`]: read the child's announcement from its stdout, and
/// hand back its address and its region.
pub fn announced_peer(child: &mut std::process::Child) -> (Vec<u8>, dma_libfabric::RemoteRegion) {
    use std::io::BufRead;
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    let announced = loop {
        line.clear();
        let read = stdout.read_line(&mut line).expect("read");
        assert!(0 < read, "the peer ended before announcing itself");
        // libtest prints "test NAME ... " before the child's own output, on the same line.
        if let Some(at) = line.find("PEER ") {
            break line[at..].to_string();
        }
    };
    let mut fields = announced.split_whitespace().skip(1);
    let address = unhex(fields.next().expect("address"));
    let region = dma_libfabric::RemoteRegion::from_bytes(&unhex(fields.next().expect("region")))
        .expect("region");
    (address, region)
}

/// An [`Observer`] that holds the writer inside its first insert until the test says go: it
/// signals `entered` from there, then waits on `go`. So a test can fill the writer's inbox.
#[derive(Debug)]
pub struct Gate {
    /// Taken by the first insert, which waits on it.
    pub go: Option<std::sync::mpsc::Receiver<()>>,
    /// Signalled once the writer is inside its first insert.
    pub entered: std::sync::mpsc::SyncSender<()>,
}

impl Observer for Gate {
    fn before_insert(&mut self, _: &[u8]) {
        if let Some(go) = self.go.take() {
            let _ = self.entered.send(());
            let _ = go.recv();
        }
    }
}

/// The loopback nodes of `rails` tcp rails: `127.0.0.1`, `127.0.0.2`, ...
pub fn rail_nodes(rails: usize) -> Vec<String> {
    (1..=rails).map(|rail| format!("127.0.0.{rail}")).collect()
}

/// A rail set of `rails` tcp rails on loopback (`127.0.0.1`, `127.0.0.2`, ...), with RMA.
pub fn rma_rails(rails: usize) -> dma_libfabric::RailSet {
    let configuration = Configuration {
        rma: true,
        ..Configuration::default()
    };
    let nodes = rail_nodes(rails);
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    dma_libfabric::RailSet::open(&configuration, &nodes).expect("tcp rails on loopback")
}

/// [`with_progress`] for every rail of a rail set.
pub fn with_rails_progress<R>(peer: &dma_libfabric::RailSet, body: impl FnOnce() -> R) -> R {
    while_driving(|| peer.progress(), body)
}

/// [`wait_for_bytes`] for a rail region.
pub fn wait_for_rail_bytes(region: &dma_libfabric::RailRegion<'_>, offset: usize, expected: &[u8]) {
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut seen = vec![0; expected.len()];
    loop {
        region.read_bytes(offset, &mut seen).expect("in range");
        if seen == expected {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the bytes never landed ({} of {} differ)",
            seen.iter().zip(expected).filter(|(a, b)| a != b).count(),
            expected.len()
        );
        std::thread::yield_now();
    }
}

/// A global allocator that counts the allocations of the current thread only (so a writer
/// thread's work and the test harness's do not blur the count), for a test binary that checks an
/// allocation-free path: `#[global_allocator] static GLOBAL: CountingAllocator =
/// CountingAllocator;`, then [`allocations`] before and after.
pub struct CountingAllocator;

std::thread_local! {
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// const-initialised thread-local without a destructor, so touching it never allocates or
// re-enters the allocator.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: forwarded with the caller's layout, as GlobalAlloc requires.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `pointer` came from `System.alloc` with this layout.
        unsafe { std::alloc::System.dealloc(pointer, layout) }
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: as for `dealloc`, and `size` is the caller's.
        unsafe { std::alloc::System.realloc(pointer, layout, size) }
    }
}

/// How many allocations [`CountingAllocator`] has counted on this thread.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(std::cell::Cell::get)
}

/// The resident memory of this process, in bytes (`/proc/self/statm`'s second field, in pages):
/// what the zero-copy and bounded-memory tests compare before and after.
pub fn resident() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("a resident page count");
    pages * 4096
}

/// The first line of a child's output that has `tag`, from just after it (libtest prints
/// "test NAME ... " before the child's own output, on the same line). Panics, naming `tag`, if
/// the child ends first.
pub fn line_after(stdout: &mut std::io::BufReader<std::process::ChildStdout>, tag: &str) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            0 < stdout.read_line(&mut line).expect("read"),
            "the child ended before saying {tag}"
        );
        if let Some(at) = line.find(tag) {
            return line[at + tag.len()..].trim().to_string();
        }
    }
}

/// `bytes` as lowercase hex: how a test hands a fabric address to a child process.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The bytes [`hex`] wrote.
pub fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).expect("hex"))
        .collect()
}

/// This test binary run again as a child in `role`: only `test` (`--exact`, one thread, its
/// output not captured), with `role_variable` set to `role` and `envs` added, in the temporary
/// directory, stdin and stdout piped. Answers the child (killed when dropped) and its stdout.
pub fn spawn_role(
    test: &str,
    role_variable: &str,
    role: &str,
    envs: &[(&str, String)],
) -> (PeerProcess, std::io::BufReader<std::process::ChildStdout>) {
    use std::process::{Command, Stdio};
    let mut child = Command::new(std::env::current_exe().expect("this binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(role_variable, role)
        .envs(envs.iter().map(|(key, value)| (*key, value)))
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("a child");
    let stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
    (PeerProcess(child), stdout)
}

/// A peer process a test started: continued (it may be stopped) and killed when dropped, so a
/// failing test leaves no stopped process behind. One that was already reaped is left alone
/// (its pid may be another process's by now).
pub struct PeerProcess(pub std::process::Child);

impl Drop for PeerProcess {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0.id().to_string()])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Send `child` the signal `name` (`-STOP`, `-CONT`, `-KILL`) with kill(1). For `-STOP`, return
/// only once the child is stopped (its `/proc` state is `T`): kill(1) returns as the signal is
/// queued, and a child running on the other core meanwhile still answers a few operations.
pub fn signal(child: &std::process::Child, name: &str) {
    let status = std::process::Command::new("kill")
        .args([name, &child.id().to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success(), "kill {name}");
    if "-STOP" == name {
        let stat = format!("/proc/{}/stat", child.id());
        wait_until("the stopped child to stop", || {
            let text = std::fs::read_to_string(&stat).unwrap_or_default();
            // `pid (comm) state ...`: the state follows the last ')'.
            text.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        });
    }
}

/// A message peer's side, in a child process: open a tcp endpoint with the default
/// configuration, announce its address on stdout (a `PEER <address>` line in hex, which
/// [`announced_address`] reads), then receive and drive progress until killed or until the
/// parent goes (its stdin closes).
pub fn be_a_message_peer() -> ! {
    use std::io::{Read, Write};
    let peer = tcp();
    println!("PEER {}", hex(&peer.local_address().expect("address")));
    std::io::stdout().flush().expect("flush");
    std::thread::spawn(|| {
        let mut byte = [0; 1];
        while let Ok(1) = std::io::stdin().read(&mut byte) {}
        std::process::exit(0);
    });
    loop {
        let _ = peer.receive(std::time::Duration::from_millis(10));
    }
}

/// The parent's side of [`be_a_message_peer`]: the child's announced address, and its stdin
/// (dropping it ends the child).
pub fn announced_address(child: &mut std::process::Child) -> (Vec<u8>, std::process::ChildStdin) {
    use std::io::BufRead;
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    loop {
        line.clear();
        let read = stdout.read_line(&mut line).expect("read");
        assert!(0 < read, "the peer ended before announcing itself");
        // libtest prints "test NAME ... " before the child's own output, on the same line.
        if let Some(at) = line.find("PEER ") {
            let address = unhex(line[at + 5..].trim());
            return (address, child.stdin.take().expect("piped"));
        }
    }
}
