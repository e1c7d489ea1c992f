//! The async API (feature `tokio`): an endpoint's sends, receives, RMA writes and reads as
//! futures that resolve when their completion has been read, woken by the reactor of the runtime
//! that polls them, with a thread of its own behind them that sleeps on the completion queues'
//! file descriptors.
//!
//! # What wakes a future
//!
//! A future that waits for a completion or an arrival first reads the queues itself; if what it
//! waits for is not there, it parks on its runtime's reactor, which watches duplicates of the
//! queues' descriptors (registered once per runtime, on first use: see `reactor.rs`), after
//! `fi_trywait` has said nothing is left to read. A descriptor that becomes readable wakes it on
//! its own runtime's thread, which reads the queues again: no other thread stands between the
//! descriptor and the future, as none stands between them and a sync waiter. Where there is no
//! reactor to use (a future polled outside tokio, or on a runtime built without `enable_io`) the
//! future is woken by the driver (below) alone. (tokio answers a registration on a runtime without
//! IO with a panic, caught once per runtime; a build with `panic = "abort"` cannot catch it, so
//! there the futures must be awaited on runtimes with IO.)
//!
//! # The driver
//!
//! [`AsyncEndpoint::new`] starts one thread of its own, not a task: it lives as long as the
//! endpoint's last `AsyncEndpoint` clone, whatever runtime made it, and whether that runtime still
//! runs (a driver task on a runtime that shut down, or a current-thread runtime that idles, left
//! futures pending for ever). It keeps the endpoint progressing when no future does: it sleeps in
//! the endpoint's own sleeping wait (`poll(2)` on the completion queues' descriptors and the
//! endpoint's `eventfd` bell), then reads both queues: the transmit queue, which drives the
//! provider's progress and hands each completion to the party that posted it (its sink: see
//! `endpoint::engine`), waking its future; and the receive queue, whose messages it sets aside
//! for the receivers, which it then wakes. While futures are parked on reactors it stands by
//! instead: it still sleeps on the descriptors, but leaves a readable queue to the futures their
//! reactors woke, and reads it itself only if none did within [`STANDBY_GRACE`], so a runtime
//! whose thread is busy elsewhere (blocked in a sync call) holds up nobody's progress, and a
//! runtime that runs pays no second thread's reads (the driver wakes at most once a grace). No
//! thread spins: between events the driver sleeps, for at most a second, and every future is
//! parked in its runtime. A post that meets backpressure (a full slab, the peer's budget,
//! `-FI_EAGAIN`) parks its future until the driver's next pass or a woken future's reading of the
//! queues, and while any does the driver naps at most [`BACKPRESSURE_NAP`] between passes: a
//! waiting post is retried every few milliseconds, or at once when a completion frees what it
//! waits for.
//!
//! Dropping the last clone hands the endpoint to the driver and returns at once: the driver stops
//! within its sleep, and if its `Arc` was the last, the endpoint's drain
//! ([`LibfabricEndpoint::DRAIN_PATIENCE`]) runs on the driver's thread, never on a runtime's.
//! The same endpoint may be wrapped again at once (each wrapping registers duplicates of the
//! descriptors of its own, which it deregisters as it drops).
//!
//! Only providers whose queues have a wait descriptor (tcp, tcp;ofi_rxm) can be driven this way;
//! [`AsyncEndpoint::new`] refuses the others (efa, whose waits sleep in `fi_cq_sread` on a thread
//! of their own, which an event loop has no place for) and an endpoint opened with
//! [`Configuration::busy_poll`](crate::configuration::Configuration::busy_poll), with [`DmaError::Unsupported`].
//!
//! # Cancel safety
//!
//! Every future here may be dropped at any await point:
//! - before its operation is posted, nothing was posted, and the lease and buffer borrowed by
//!   the future go with it as with any borrow;
//! - once it is posted, the operation's slot in the endpoint holds its own clone of the lease and
//!   of the buffer's registration (the same slot the sync API uses), so dropping the future
//!   frees, reuses and unregisters nothing the provider may still touch, and the lease stays
//!   until the completion is read. The operation goes on; the driver (or any thread that reads
//!   the queue) reads its completion, and drops the lease and the buffer then. Nothing leaks:
//!   the future's state is freed when the last of the future and the slot lets go of it.
//!
//! # Bounds
//!
//! One allocation per operation (the state the slot and the future share); per runtime that
//! polls, one registration of two duplicated descriptors, at most four of them (the runtimes
//! seen last) per `AsyncEndpoint`; at most as many operations in flight as the endpoint's slab
//! holds
//! ([`MAX_OPERATIONS`](crate::endpoint::MAX_OPERATIONS)): a post into a full slab is retried, as
//! backpressure is, for at most [`POST_PATIENCE`].
//!
//! # Timeouts and faults
//!
//! The futures have no deadline of their own: wrap them in `tokio::time::timeout` of the
//! server's write deadline. What each fault does to a pending write or read:
//! - a peer process that dies (SIGKILL, a crash): the kernel resets its connections, and the
//!   future resolves by itself, within milliseconds on tcp, with its completion (the bytes were
//!   in the socket) or [`DmaError::PeerUnreachable`] in [`Completion::result`](crate::endpoint::Completion::result); the peer is then
//!   marked, and a new `write` or `read` to it answers `PeerUnreachable` at once;
//! - a peer that is alive but stopped (SIGSTOP, a hung process), or unreachable with nothing to
//!   say so (a partition): the future stays pending until the peer moves again, so only the
//!   `timeout` resolves it. Dropping the timed-out future is safe (above); its operation stays
//!   in flight, holding its lease and buffer, and the endpoint's
//!   [`overdue_operations`](crate::endpoint::LibfabricEndpoint::overdue_operations) lists it, which tells
//!   the server which peer stopped answering (release it: its entry goes once the provider
//!   completes what is in flight).
//!
//! `tests/tokio_faults.rs` checks both on real endpoints, one peer process killed and one stopped
//! mid-transfer: every future resolves under its deadline, none panics, and the stopped peer's
//! writes complete once its fate is known.

mod operations;
mod reactor;

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::cache::Lease;
use crate::endpoint::LibfabricEndpoint;
use crate::error::DmaError;

/// How long a post retries backpressure (`-FI_EAGAIN`, a full slab) before its future answers
/// [`DmaError::WouldBlock`] with nothing posted; as the sync [`LibfabricEndpoint::write`].
pub const POST_PATIENCE: Duration = Duration::from_secs(1);

/// The longest the driver sleeps between passes while a post waits for backpressure to clear
/// (module docs, "The driver"); without one waiting, it sleeps up to [`IDLE_NAP`] unless an event
/// wakes it.
pub const BACKPRESSURE_NAP: Duration = Duration::from_millis(5);

/// The longest the driver sleeps between passes when nothing wakes it.
pub const IDLE_NAP: Duration = Duration::from_secs(1);

/// How long the standing-by driver leaves a readable queue to the futures its runtime's reactor
/// woke before it reads the queue itself (module docs, "The driver").
pub const STANDBY_GRACE: Duration = Duration::from_millis(2);

/// A [`LibfabricEndpoint`] whose operations are futures. Cheap to clone: clones share the
/// endpoint and its driver, which stops when the last clone drops (operations still in flight
/// then are reaped by whoever reads the queue next, or drained when the endpoint drops).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dma_libfabric::DmaError> {
/// use std::sync::Arc;
/// use dma_libfabric::{Configuration, LibfabricEndpoint};
/// use dma_libfabric::asynchronous::AsyncEndpoint;
///
/// let configuration = Configuration { rma: true, ..Configuration::default() };
/// let server = AsyncEndpoint::new(Arc::new(LibfabricEndpoint::open(&configuration, None)?))?;
/// let client = AsyncEndpoint::new(Arc::new(LibfabricEndpoint::open(&configuration, None)?))?;
/// let target = client.endpoint().register(64)?;
/// let source = server.endpoint().register(64)?;
/// source.write_bytes(0, &[7; 64])?;
///
/// let lease = server.lease(1, &client.endpoint().local_address()?).await?;
/// let done = server.write(lease.lease(), source.segment(0, 64)?, target.remote()).await?;
/// assert_eq!(Ok(()), done.result);
/// // The bytes land as the client's driver reads its queues.
/// let mut seen = [0; 64];
/// while seen != [7; 64] {
///     tokio::task::yield_now().await;
///     target.read_bytes(0, &mut seen)?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AsyncEndpoint {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AsyncEndpoint {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AsyncEndpoint")
            .field("endpoint", self.shared.endpoint())
            .finish_non_exhaustive()
    }
}

struct Shared {
    /// Taken only by `drop`, which hands it to the driver.
    endpoint: ManuallyDrop<Arc<LibfabricEndpoint>>,
    driver: Arc<Driver>,
}

impl Shared {
    fn endpoint(&self) -> &Arc<LibfabricEndpoint> {
        &self.endpoint
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and nothing reads the field after it.
        let endpoint = unsafe { ManuallyDrop::take(&mut self.endpoint) };
        // Wake the driver before handing over: after the hand-off this clone owns nothing to ring
        // with. A driver that passes in between sleeps at most `IDLE_NAP` before it sees the
        // stop.
        self.driver.wake(&endpoint);
        *crate::sync::lock(&self.driver.handed_over) = Some(endpoint);
        self.driver.stop.store(true, Ordering::Release);
    }
}

/// What the driver thread and the futures share.
struct Driver {
    stop: AtomicBool,
    /// The last clone's endpoint, dropped by the driver as it stops (so the drain, if any, runs
    /// on its thread).
    handed_over: Mutex<Option<Arc<LibfabricEndpoint>>>,
    /// Woken after every pass that read the receive queue.
    received: Notify,
    /// Woken after every pass, and by every [`serve`](Self::serve): what a post waiting for
    /// backpressure waits for.
    progressed: Notify,
    /// Posts waiting for backpressure to clear: while any is, the driver naps short.
    backpressured: AtomicUsize,
    /// The queues' descriptors, registered with the reactors of the runtimes that poll.
    reactors: reactor::Reactors,
    /// How many times a future its reactor woke has served the queues ([`serve`](Self::serve)):
    /// the standing-by driver reads them only if this did not move during its grace.
    served: AtomicU64,
}

impl Driver {
    /// The driver thread's loop (module docs, "The driver").
    fn run(&self, endpoint: &LibfabricEndpoint) {
        while !self.stop.load(Ordering::Acquire) {
            if 0 < self.backpressured.load(Ordering::Acquire) {
                endpoint.progress_sleeping(BACKPRESSURE_NAP);
            } else if self.reactors.in_use() {
                // A runtime's reactor watches the descriptors for the futures on it, which read
                // the queues as they wake: once a descriptor is readable, the driver stays off
                // them while futures keep serving, waking once a grace, and reads the queues
                // itself only after a grace in which none did (a runtime busy elsewhere, or the
                // future its reactor woke was dropped).
                let mut served = self.served.load(Ordering::Acquire);
                if self.reactors.stand_by(IDLE_NAP) {
                    loop {
                        std::thread::sleep(STANDBY_GRACE);
                        let now = self.served.load(Ordering::Acquire);
                        if now == served
                            || self.stop.load(Ordering::Acquire)
                            || 0 < self.backpressured.load(Ordering::Acquire)
                        {
                            break;
                        }
                        served = now;
                    }
                }
                endpoint.progress();
            } else {
                endpoint.progress_sleeping(IDLE_NAP);
            }
            endpoint.reap_receive_queue_after_progress();
            self.received.notify_waiters();
            self.progressed.notify_waiters();
        }
    }

    /// A post met backpressure: counted as waiting (so the driver naps short) until the returned
    /// guard drops, when the post is done or its future dropped. The first waiter cuts the
    /// driver's current sleep, which may be a long one.
    fn start_waiting(&self, endpoint: &LibfabricEndpoint) -> Waiting<'_> {
        if 0 == self.backpressured.fetch_add(1, Ordering::AcqRel) {
            self.wake(endpoint);
        }
        Waiting(self)
    }

    /// Cut the driver's current sleep, on the descriptors or standing by.
    fn wake(&self, endpoint: &LibfabricEndpoint) {
        endpoint.wake_sleepers();
        self.reactors.ring();
    }

    /// What a future its runtime's reactor woke does before it looks for its own completion or
    /// message: read both queues, handing each completion to its sink (waking its future) and
    /// setting each arrival aside, then wake the receivers and the posts waiting for
    /// backpressure. A reactor wakes one future per descriptor event (the one that parked last),
    /// so that one serves every other.
    fn serve(&self, endpoint: &LibfabricEndpoint) {
        endpoint.progress();
        endpoint.reap_receive_queue_after_progress();
        self.served.fetch_add(1, Ordering::AcqRel);
        self.received.notify_waiters();
        // What it read may have freed what a post waiting for backpressure waits for.
        self.progressed.notify_waiters();
    }

    /// The driver's next pass (every pass ends by waking these).
    async fn next_pass(&self) {
        self.progressed.notified().await;
    }
}

/// A post waiting for backpressure to clear ([`Driver::start_waiting`]).
struct Waiting<'driver>(&'driver Driver);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.backpressured.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AsyncEndpoint {
    /// Drive `endpoint` from a thread of its own (module docs, "The driver"). It needs no
    /// runtime: the futures may be awaited on any runtime, and outlive the one that called this.
    ///
    /// # Errors
    /// [`DmaError::Unsupported`] for an endpoint whose queues have no wait object (efa, or opened
    /// with `Configuration::busy_poll`); [`DmaError::Fabric`] (call `std::thread::spawn`) when
    /// the driver's thread cannot be started.
    pub fn new(endpoint: Arc<LibfabricEndpoint>) -> Result<Self, DmaError> {
        let sleeps = endpoint
            .wait_sources()
            .first()
            .is_some_and(|source| !source.reads_blocking());
        if !sleeps {
            return Err(DmaError::Unsupported(format!(
                "the async API sleeps on the completion queues' wait descriptors, and {}'s \
                 queues have none (a provider without FI_WAIT_FD, efa's blocking read, or \
                 Configuration::busy_poll)",
                endpoint.describe().provider
            )));
        }
        let driver = Arc::new(Driver {
            stop: AtomicBool::new(false),
            handed_over: Mutex::new(None),
            received: Notify::new(),
            progressed: Notify::new(),
            backpressured: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            reactors: reactor::Reactors::of(&endpoint),
        });
        let (thread_driver, thread_endpoint) = (Arc::clone(&driver), Arc::clone(&endpoint));
        std::thread::Builder::new()
            .name("dma-libfabric-async".into())
            .spawn(move || {
                thread_driver.run(&thread_endpoint);
                // Stopped: the last clone's endpoint goes now, then this thread's own; whichever
                // is the last runs the endpoint's drain here.
                let handed_over = crate::sync::lock(&thread_driver.handed_over).take();
                drop(handed_over);
                drop(thread_endpoint);
            })
            .map_err(|error| DmaError::Fabric {
                call: "std::thread::spawn",
                code: -i64::from(error.raw_os_error().unwrap_or(0)),
                message: format!("the async driver's thread: {error}"),
            })?;
        Ok(Self {
            shared: Arc::new(Shared {
                endpoint: ManuallyDrop::new(endpoint),
                driver,
            }),
        })
    }

    /// The endpoint: for registering memory, its cache, and every sync call.
    pub fn endpoint(&self) -> &Arc<LibfabricEndpoint> {
        self.shared.endpoint()
    }

    /// A lease on `client` at `address` (see [`AddressCache::lease`](crate::cache::AddressCache::lease))
    /// without blocking the runtime: a hit is taken at once; a miss is resolved on tokio's
    /// blocking pool (`spawn_blocking`), where waiting for the cache's writer to insert the
    /// entry costs no runtime thread, and then taken as the hit it has become. The lease holds
    /// the endpoint by `Arc`, so it is `Send + 'static`: it moves into `tokio::spawn` (a task per
    /// client); post with [`OwnedLease::lease`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it leaves at most a resolved entry for `client` in the cache, as a
    /// `resolve` would, and no lease.
    ///
    /// # Errors
    /// As [`AddressCache::lease`](crate::cache::AddressCache::lease).
    pub async fn lease(&self, client: u64, address: &[u8]) -> Result<OwnedLease, DmaError> {
        let endpoint = self.shared.endpoint();
        let peers = endpoint.cache();
        let lease = match peers.lease_within(client, address, Duration::ZERO) {
            Err(DmaError::WouldBlock) => {
                let resolving = Arc::clone(endpoint);
                let owned = address.to_vec();
                let resolved = tokio::task::spawn_blocking(move || {
                    resolving.cache().pin().resolve(client, &owned).map(|_| ())
                })
                .await
                .map_err(|error| {
                    DmaError::InvalidArgument(format!("the resolving task failed: {error}"))
                })?;
                resolved?;
                peers.lease(client, address)?
            }
            done => done?,
        };
        Ok(OwnedLease::new(lease, Arc::clone(endpoint)))
    }

    /// Register `buffer` in place, as [`LibfabricEndpoint::register_buffer`]; the region holds
    /// the endpoint by `Arc`, so it is `Send + 'static`: it moves into `tokio::spawn`, or sits in
    /// a pool shared between tasks.
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::register_buffer`].
    pub fn register_buffer<B: crate::endpoint::StableBuffer>(
        &self,
        buffer: B,
        exposure: crate::endpoint::Exposure,
    ) -> Result<crate::endpoint::MemoryRegion<'static, B>, DmaError> {
        let endpoint = self.shared.endpoint();
        Ok(endpoint
            .register_buffer(buffer, exposure)?
            .owned_by(Arc::clone(endpoint)))
    }
}

/// A [`Lease`] that holds its endpoint by `Arc` ([`AsyncEndpoint::lease`]): `Send + 'static`, so
/// a task of its own can keep it. Post against it with [`lease`](Self::lease), a lease borrowed
/// from it; clones lease the same entry again.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dma_libfabric::DmaError> {
/// use std::sync::Arc;
/// use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};
/// use dma_libfabric::asynchronous::{AsyncEndpoint, OwnedLease};
///
/// let configuration = Configuration { rma: true, ..Configuration::default() };
/// let server = AsyncEndpoint::new(Arc::new(LibfabricEndpoint::open(&configuration, None)?))?;
/// let client = AsyncEndpoint::new(Arc::new(LibfabricEndpoint::open(&configuration, None)?))?;
/// let target = client.register_buffer(vec![0_u8; 64], Exposure::Remote)?;
///
/// let lease: OwnedLease = server.lease(1, &client.endpoint().local_address()?).await?;
/// let pages = server.register_buffer(vec![7_u8; 64], Exposure::Local)?;
/// let remote = target.remote();
/// let task = tokio::spawn({
///     let server = server.clone();
///     async move { server.write(lease.lease(), pages.segment(0, 64)?, remote).await }
/// });
/// let done = task.await.expect("the client's task")?;
/// assert_eq!(Ok(()), done.result);
/// # Ok(())
/// # }
/// ```
pub struct OwnedLease {
    /// Declared first, so it drops before the endpoint it points into.
    lease: Lease<'static>,
    endpoint: Arc<LibfabricEndpoint>,
}

impl OwnedLease {
    fn new(lease: Lease<'_>, endpoint: Arc<LibfabricEndpoint>) -> Self {
        // SAFETY: `lease` borrows `endpoint`'s own cache (the caller took it from there), which
        // the endpoint owns and drops only in its own `Drop`. The `Arc` kept beside it holds the
        // endpoint for as long as the lease lives, and the lease drops first (field order). The
        // `'static` lease is never handed out: `lease` reborrows it for the `OwnedLease`'s own
        // lifetime.
        let lease = unsafe { std::mem::transmute::<Lease<'_>, Lease<'static>>(lease) };
        Self { lease, endpoint }
    }

    /// Another lease on the same entry, borrowed from this one: what an operation takes.
    pub fn lease(&self) -> Lease<'_> {
        self.lease.clone()
    }

    /// The `fi_addr_t` the lease holds.
    pub fn fi_addr(&self) -> dma_libfabric_sys::fi_addr_t {
        self.lease.fi_addr()
    }

    /// The leased entry as a [`Peer`](crate::cache::Peer), to send to.
    pub fn peer(&self) -> crate::cache::Peer<'_> {
        self.lease.peer()
    }
}

impl Clone for OwnedLease {
    fn clone(&self) -> Self {
        Self {
            lease: self.lease.clone(),
            endpoint: Arc::clone(&self.endpoint),
        }
    }
}

impl std::fmt::Debug for OwnedLease {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("OwnedLease")
            .field("fi_addr", &self.fi_addr())
            .finish_non_exhaustive()
    }
}
