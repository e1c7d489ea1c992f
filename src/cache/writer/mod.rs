//! The writer: the only caller of `fi_av_insert` and `fi_av_remove`, the only owner of who holds
//! what, and the only code that changes the index. It is a role, not a thread.
//!
//! # The writer as a role
//!
//! One thread at a time holds the cache's writer role ([`crate::cache::role`]), and only the
//! holder touches the writer's state ([`WriterCell`]). Who may hold it:
//!
//! - **A caller whose miss found the role free.** `resolve`, `lease`, `resolve_all`, `lease_all`
//!   and `release` queue their request as always, then try to take the role with one
//!   compare-and-swap. The winner applies one batch inline (its own request and whatever else is
//!   queued, up to [`BATCH`]), publishes, hands its retirements to the collector, answers, gives
//!   the role back, and looks at the inbox again; if a waiter polls for its answer meanwhile, it
//!   leaves what is queued to that waiter, and after [`Role::ROUNDS`](crate::cache::role::Role)
//!   rounds it hands what is left to the background thread. A loser waits for its answer as it
//!   always did (a short poll while the role is held, then a block on its answer channel), and
//!   while it polls it serves what is queued whenever it finds the role free: the work goes to a
//!   thread that runs, not to a holder that may be descheduled after its round (issue 43, item
//!   2; the guarantee "the work goes to a thread that runs" in `role`). A batch stops taking requests after
//!   [`BATCH_TIME`], so a waiter whose request a holder took waits for at most about that much of
//!   the holder's running time. No hand-off to another thread on an uncontended miss, and no
//!   context switch.
//! - **The background thread** (`dma-av-writer`, one per process, shared by every cache:
//!   [`background`]), for the work no caller brings: removals as readers unpin and leases drop
//!   once callers stop coming, failed removals' retries, `quiesce`, waiters' deadlines, the
//!   eviction hook's leftovers, and the requests of callers that do not serve (`try_resolve`,
//!   `quiesce`, a rail set's queued releases), which ring its [`Doorbell`]. It visits each
//!   cache in turn and takes that cache's role the same way. A holder that leaves it work it
//!   does not know of (a new deferral while it has no timer, a quiescer, an earlier deadline)
//!   wakes it. (A caller's `release` is not left to the background thread: it would cost the
//!   thread a wake-up and a context switch a release.)
//! - **Callers do the background thread's routine work while they come.** A caller that holds
//!   the role takes what the readers and leases reported (removing what they freed) and moves the
//!   epoch on while a deferral is out, at most once a `FIRST_TICK`. While callers keep leaving
//!   work that needs ticks, the background thread dozes: it parks on a timer (doubling up to
//!   `rounds::DOZE_MAX` while they leave it nothing to remove) that the holders do not cut
//!   short and the deferral's closure does not ring (`Doorbell::ring_report`), so a stream of
//!   updates costs no wake-up each; once a round finds that no caller came, it ticks or parks
//!   again. The price: a removal whose readers have gone waits for the next caller or the timer,
//!   at most `DOZE_MAX`, where a parked thread would be rung at once.
//!
//! Why one holder at a time keeps every invariant the single writer thread kept: each invariant
//! is about the order in which the writer's state changes and its calls into the AV happen, never
//! about which thread makes them. The role gives a total order of holders, each holder's
//! `Acquire` take seeing everything the previous one released, so the holders together are one
//! sequential writer: requests are still applied one at a time in the order they left the inbox,
//! `fi_av_insert` and `fi_av_remove` are still called by one thread at a time, and the index
//! still has one writer. What followed the thread follows the role: the mark that makes a call
//! "from the writer" refuse to wait ([`on_writer_of`]) is set while a thread holds the role and
//! cleared when it gives it back, on whichever thread that is, and releases queued beside a full
//! inbox by code under the role are applied before the role is given back.
//!
//! The role is never held across a wait of the caller's: it is taken inside the miss's call and
//! given back before it returns, so never across an endpoint's `progress()`, `fi_cq_read` or an
//! await. Code that runs under it (an [`AvBackend`], a `tracing` subscriber, the eviction hook, a
//! lease dropped there) never waits for the writer: see "Calls under the writer role".
//!
//! A holder that panics (a backend that panics) poisons the role: the writer's state is dropped
//! (its inbox closes, and every answer unsent is answered `Closed`), nobody takes the role again,
//! and every later call that needs the writer answers [`DmaError::Closed`], as when the writer
//! thread died. The panic stays in the holder's round: it reaches no caller as a panic.
//!
//! # Files
//!
//! This file holds the requests, what readers and the writer share, and [`Writer`], which holds
//! the writer's parts: `table.rs` the AV and each incarnation of ours in it, by index and by
//! identity ([`Table`]); `parking.rs` the clients the index does not hold, parked or admitted
//! and not yet published ([`Parking`]); `reclaim.rs` the way out of the AV (retire, the one
//! deferral, remove once readers and leases are gone, retry, forget: [`Reclamation`]);
//! `outbox.rs` the answers and reports owed ([`Outbox`]); `pacing.rs` the background thread's
//! ticks and dozes and what the doorbell is told (`Pacing`, [`Announced`]). Across the parts:
//! `cell.rs` the writer's state between holders and a background visit; `background.rs` the
//! process's background thread; `rounds.rs` a caller's and the background thread's rounds;
//! `state.rs` the per-entry state (holders, entries, parked incarnations, pending removals);
//! `run.rs` batches, quiescers, waiters' deadlines, counters and shutdown; `apply.rs` what a
//! request does to the state (resolve, release, evict, park, admit); and `tables.rs` how the
//! tables give their memory back.
//!
//! # State
//!
//! Every incarnation in the AV has an [`Entry`](state::Entry) at its own index (`fi_addr_t`,
//! which `FI_AV_TABLE` keeps below the AV's capacity): its address, stored once, its holders,
//! and whether it is published (`live`) or on its way out (`removing`: unlinked, its
//! `fi_av_remove` waiting for its readers to unpin and its leases to drop). Each identity (efa:
//! GID + QPN; otherwise the whole address) has at most one incarnation in the AV, live or
//! removing, found through the `slots` table, which stores nothing but the index. A removing
//! incarnation may have a newer one `parked` behind it: clients asked for it, and it may enter
//! the AV only once the old one has left (efa's reverse AV holds one entry per GID and QPN). It
//! is inserted when the removal runs, not before, and the rest of the queue goes on meanwhile.
//!
//! Each client is in at most one place, as a holder of a live entry or a waiter on a parked one.
//! The writer keeps no map of every client: a holder whose registration is published is found
//! in the index (which the writer alone writes, and reads its own writes from: papaya is
//! linearizable), and only the clients the index does not hold, those parked and those an
//! admission has enrolled and not yet published, are kept in `unindexed`, which empties as
//! they are admitted and published.
//!
//! # Batches
//!
//! The writer drains what is queued in its inbox in one go (up to [`BATCH`] requests), applies
//! each in arrival order, and then, once for the batch, flushes its retirements to the epoch
//! collector, publishes the counters and sends the replies: so a caller that reads the counters
//! after its reply sees its request, and a burst of misses shares the bookkeeping.
//!
//! # Ordering
//!
//! Retiring an entry unlinks every registration of it from the index first, and only then defers
//! its removal on the cache's epoch collector (at the latest by the next deferral, which covers
//! every ticket retired before it: see "One deferral at a time"). A reader that found the
//! registration was pinned before the unlink, so the collector runs the deferred closure only
//! after that reader unpins (crossbeam-epoch's guarantee: a closure deferred while a participant
//! is pinned runs after that participant unpins). The closure itself only sets a flag for this
//! thread (an `AcqRel` exchange the writer reads with `Acquire`), so `fi_av_remove` always runs
//! here, after every such reader has gone. A reader that pins after
//! the unlink cannot find the registration, because crossbeam's pin and the writer's flush are
//! `SeqCst` fences that order the unlink before that reader's probe.
//!
//! Once the readers are gone, a removal still waits for the entry's leases (see
//! [`super::lease`]): the writer reads the index's lease counter, and while it is not zero marks
//! it awaited and forgets it until the last lease's drop reports the index. A failed
//! `fi_av_remove` is retried with a backoff, from a set ordered by when each retry is due: its
//! entry still counts against the capacity and its slot stays `removing`, so on efa no second
//! incarnation goes in beside it. Neither is rescanned: a miss costs the same however many
//! removals wait.
//!
//! # One deferral at a time
//!
//! Retirements are not deferred one by one. At most one closure is outstanding on the collector:
//! it covers every ticket retired before it was deferred, and tickets retired while it is out wait
//! for the next one, deferred as soon as it returns. A later deferral is as safe as an earlier one
//! (every reader pinned at a ticket's unlink is either gone by then or pinned still, and so waited
//! for), and it bounds what reclamation costs whatever the readers do: one crossbeam bag in the
//! collector's queue, however long a reader stays pinned and however many entries are retired and
//! revived meanwhile. The closure only sets a flag and rings the writer's doorbell (an atomic
//! store, a fence, an unpark), so the reader whose `pin()` happens to run it allocates nothing and
//! takes no lock.
//!
//! # Bounds
//!
//! Every structure the writer keeps is bounded by the AV's capacity `C` or the inbox bound, not by
//! what readers do: `entries`, `slots`, `pending`, `retries`, `parked` and the scratch list hold at
//! most `C` items each (an entry awaiting removal still occupies its index, and counts against the
//! capacity); the index holds one registration per registered client, each on one of those
//! entries (an entry keeps its holders as a set as well, for its eviction: `state::Holders`);
//! `unindexed` one item per parked client and per client enrolled and not yet published, and
//! `unpublished` at most one per client, those an admission has enrolled and not yet published (a
//! parked incarnation's set of clients becomes its entry's holders whole when it enters the AV,
//! their places in `unindexed` are left as they are and read through `forwarded`, one item per
//! such admission, and their registrations are published a slice of `apply::ADMISSION_SLICE` a
//! round, the waiters' first, so an unrelated miss waits for the list of the clients, a copy
//! each, and a slice rather than for every client's enrolment and registration; `quiesce` waits
//! for the last slice; the list, 8 B a client, is freed once published); a parked incarnation
//! keeps at most one waiter per client (a newer request from the same client answers the older one
//! `WouldBlock`; the waiter's deadline is kept once, in `deadlines`); `deferred_evictions` at most
//! one per client this writer evicted while a rail's inbox was full; `replies` and the quiescers at
//! most one per request of a batch. The tables shrink once they empty well below their peak, and
//! give back all their memory once the cache holds no entry (`tables.rs`).
//!
//! In bytes, one bound for the whole cache, above the empty cache:
//!
//! ```text
//! C × 384 B                     entries, slots, pending removals, parked incarnations
//! + INBOX_BOUND × 64 B          queued requests, with at most INBOX_BOUND misses in chunks
//!                               (a chunk counts as its misses: `cache::budget`)
//! + Failures::BOUND × 72 B      failure records of queued misses (4,096 of them: 288 KiB)
//!                               that share their error (a full AV's refusals); 240 B a
//!                               record with an error of its own (960 KiB in all); an address
//!                               over 32 bytes adds its length: `cache::failures`
//! + per registered client 104 B its place in its entry's holders set and its index
//!                               registration (papaya's 56-byte node and table slot)
//! + per parked client 64 B      its place in `unindexed` and in its parked incarnation's set;
//!                               while its admission publishes it, both terms at once
//! + per blocked lease 256 B     a caller waiting in `lease` on a parked incarnation: its waiter
//!                               and deadline (one per client, so at most one per blocked thread)
//! + per live thread 4,904 B     an epoch handle and a reply channel, made once; an exited
//!                               thread's handle goes back to the cache for the next thread
//!                               (`cache::epoch`), its channel is freed: nothing per exited
//!                               thread, whoever stays pinned
//! ```
//!
//! however long a probing reader stays pinned (a pin refreshes its guard on the index whenever
//! the writer has changed it; an idle pin holds the index nodes retired until its next probe, a
//! per-pin cost: `cache::index`) and however many releases, revives, retries and patience
//! expiries go by. The per-client term covers papaya's node (56 B: the client, its entry's index
//! and the address a hit confirms, inline so the hit follows no pointer past papaya's), its
//! table slot and the client's place in the holders sets, at the tables' worst load (just after
//! they double) and while papaya holds its old and new tables at a doubling; the writer keeps no
//! map of the clients beside the index. The parked-client term covers `unindexed` and the parked
//! set just after they double; at the peak of its admission a client is counted in both terms (a
//! holder, and published, while its parked place is still held). The blocked-lease term covers a
//! 48-byte waiter in a hash map at its worst load and a 32-byte deadline in a B-tree whose leaves
//! hold 5 to 11 of them.
//! Once every client is released and the cache quiesced, nothing stays per former client or
//! entry: the writer replaces the index's table once it has emptied to an eighth of what it
//! grew to (`cache::index`), and once the cache holds no entry its own tables give back all
//! their memory (`tables.rs`), so the cache is back within 16 B a former entry of its empty self,
//! beside crossbeam's garbage in flight (its queue's sentinel and sealed bags, 2,072 B each,
//! freed by later pins) and each thread's one-time state (4,904 B: its epoch handle on the
//! cache's collector and its registration, its reply channel and the channel's block, its role
//! marks): `tests/cache_bounds.rs`, `released_residue`. An exited thread's epoch handle goes back
//! to its cache for the next thread, so nothing stays per exited thread while a reader stays
//! pinned (`tests/cache_worst_case_bounds.rs`, which also holds 200,000 clients on a 64-entry
//! model AV, released, to 0.06 MB, the AV's own log included).
//! `tests/soak.rs` checks the capacity and inbox terms with a counting allocator, at `C` = 4,096
//! under a long pin over 20,000 revives and churn, and `tests/cache_bounds.rs` each other term at
//! its worst case: the chunked misses (a storm of 8,192 behind a slow insert queues at most
//! 4,096), the failure records (4,096 refused clients on a full 64-entry AV, each refused with
//! the same 4 KiB provider text; each with a text of its own in
//! `tests/cache_worst_case_bounds.rs`), the clients (200,000 on 64 entries, and just past each
//! doubling, up to 262,145 clients, against 104 B a client), the parked clients (14,337 and
//! 57,345, against 64 B a client, and 128 B at the admission's peak) and an entry's holders
//! (100,000 moves away and back keep nothing); the `cache_ops` fuzz target checks the first two
//! terms after every step. What each of them measured, and the figures measured by hand:
//! `docs/benchmarks.md`, "Figures moved out of the module docs".
//!
//! # Calls under the writer role
//!
//! Code that runs under the writer role (a `tracing` subscriber that sees the writer's events, an
//! [`AvBackend`] that calls back into its cache, the eviction hook), on whichever thread holds
//! it, must not wait for the writer. Every call of the cache that would wait answers
//! [`DmaError::InvalidArgument`] there instead; `release` is queued without waiting (beside the
//! inbox if it is full, applied before the role is given back), and `quiesce` returns at once.
//!
//! # Requests, backpressure and quiesce
//!
//! Requests arrive on a bounded channel ([`INBOX_BOUND`]), and the misses of `resolve_all`
//! chunks take credits from a budget of as many misses (`cache::budget`), which the writer gives
//! back once it has applied a chunk: a flood of queued misses cannot grow memory without bound,
//! however many threads send chunks; `resolve` and `release` wait for room, `try_resolve` does not queue and
//! answers `Busy`. The background thread parks on its [`Doorbell`], which every sender that does
//! not serve rings after queueing, and which the deferral's closure and an awaited lease's last
//! drop ring too: neither ever sends on a channel, so neither can wait, allocate or take a lock.
//!
//! A quiescer records the ticket the next retirement would take: it is answered once no removal
//! older than that is pending (or those that are have made no progress for its patience), however
//! busy the inbox is after it. While removals are pending the writer moves the epoch on between
//! requests as well as when idle, so a busy inbox does not hold removals back.

use std::time::{Duration, Instant};

use crossbeam_epoch::LocalHandle;

use super::reply::Answer;
use super::stats::CacheStats;
use super::stored::StoredAddress;
use crate::av::AvBackend;
use crate::error::DmaError;
#[cfg(not(dma_loom))]
use crate::sync::atomic::Ordering;
use crate::sync::{Arc, mpsc};
use dma_libfabric_sys::fi_addr_t;
use outbox::Outbox;
use pacing::Announced;
#[cfg(not(dma_loom))]
use pacing::Pacing;
use parking::Parking;
use reclaim::Reclamation;
use table::Table;

mod apply;
#[cfg(not(dma_loom))]
mod background;
#[cfg(not(dma_loom))]
mod cell;
mod outbox;
mod pacing;
mod parking;
mod reclaim;
#[cfg(not(dma_loom))]
mod rounds;
mod run;
mod state;
mod table;
mod tables;

pub(crate) use super::budget::INBOX_BOUND;
pub(crate) use super::shared::SharedState;
#[cfg(not(dma_loom))]
pub(crate) use background::tend;
#[cfg(not(dma_loom))]
pub(crate) use cell::{Tend, WriterCell};
pub(crate) use table::usable_capacity;

/// Under loom the background thread owns the writer for its whole life (see `run`): no cell.
#[cfg(dma_loom)]
pub(crate) struct WriterCell<B>(std::marker::PhantomData<fn() -> B>);

#[cfg(dma_loom)]
impl<B> WriterCell<B> {
    /// Never built under loom.
    pub(crate) fn panicked(&self) -> bool {
        false
    }
}

#[cfg(dma_loom)]
impl<B> Serve for WriterCell<B> {
    fn serve(&self) {}
}

/// A cache's writer, whatever its backend (defined beside the role, which a waiter polls).
pub(crate) use crate::cache::role::Serve;

/// The most requests applied between two publications of the counters: enough to share the
/// bookkeeping across a burst, few enough that a quiescer or a removal is not kept waiting.
pub(crate) const BATCH: usize = 64;

/// The longest a batch goes on taking requests: past it, the holder publishes and answers what
/// it has applied and gives the role back, so a waiter is held by one holder's batch for at most
/// about this long of the holder's running time (issue 43, item 2), and what is queued after it
/// goes to a waiter that polls (`role`). Checked after every request (one clock read, small
/// beside a miss's `fi_av_insert`); a request is never cut (a chunk of up to [`BATCH`] misses is
/// one request), and a batch takes at least one.
#[cfg_attr(dma_loom, allow(dead_code))]
pub(crate) const BATCH_TIME: Duration = Duration::from_micros(20);

/// The writer's hasher, for its own tables: foldhash, as the index uses.
type Hasher = foldhash::fast::RandomState;

/// Where the writer's answer to a resolve goes.
pub(crate) enum Reply {
    /// Nobody waits (`try_resolve`): a failure is recorded in [`Failures`] instead.
    Queued,
    /// Answer at once, `WouldBlock` included (`resolve`).
    Now(Answer),
    /// Answer once the entry is in the AV: a parked incarnation answers when it is admitted, or
    /// `OutOfPatience` at `deadline` if it is not in by then (`AddressCache::lease`).
    Admitted { answer: Answer, deadline: Instant },
}

/// Each entry's result for a chunk of misses, in order.
pub(crate) type ChunkAnswer = Vec<Result<fi_addr_t, DmaError>>;
/// Where the writer sends a chunk's answer.
pub(crate) type ChunkReply = mpsc::Sender<ChunkAnswer>;

/// What the writer is asked to do. Requests are applied in the order they arrive.
pub(crate) enum Request {
    /// Register `client` on `address`.
    Resolve {
        client: u64,
        address: StoredAddress,
        reply: Reply,
    },
    /// Register each client on its address, in order, and answer all of them at once: a chunk of
    /// `Pinned::resolve_all` or `AddressCache::lease_all`, at most [`BATCH`] misses.
    ResolveChunk {
        requests: Vec<(u64, StoredAddress)>,
        reply: ChunkReply,
    },
    /// Let go of `client`'s registration.
    Release { client: u64 },
    /// Reply once every removal retired before this request has run, or once those left have
    /// made no progress for `patience`.
    Quiesce {
        reply: mpsc::Sender<()>,
        patience: Duration,
    },
    /// Remove everything and stop.
    Shutdown,
}

#[cfg(not(dma_loom))]
std::thread_local! {
    /// The ids of the caches whose writer role this thread holds now, innermost last (a holder
    /// of one cache's role may take another's: a rail set's eviction hook). Marked and unmarked
    /// by [`RoleMark`]: the marks follow the role, not the thread.
    static HOLDING: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Clients released, by cache id, by code running under that cache's role while its inbox was
    /// full: applied before the holder releases the role, so such a release never waits for the
    /// writer. Only the holding thread pushes and drains its own, so it needs no lock. Bounded by
    /// [`INBOX_BOUND`].
    static OWN_RELEASES: std::cell::RefCell<Vec<(u64, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks the calling thread as the holder of cache `cache`'s writer role for as long as it lives
/// (an unwinding holder unmarks too).
#[cfg_attr(dma_loom, allow(dead_code))] // under loom the background thread never marks
pub(crate) struct RoleMark {
    #[cfg_attr(dma_loom, allow(dead_code))]
    cache: u64,
}

#[cfg_attr(dma_loom, allow(dead_code))]
impl RoleMark {
    pub(crate) fn new(cache: u64) -> Self {
        #[cfg(not(dma_loom))]
        let _ = HOLDING.try_with(|holding| holding.borrow_mut().push(cache));
        Self { cache }
    }
}

impl Drop for RoleMark {
    fn drop(&mut self) {
        #[cfg(not(dma_loom))]
        let _ = HOLDING.try_with(|holding| {
            let mut holding = holding.borrow_mut();
            if let Some(at) = holding.iter().rposition(|&cache| cache == self.cache) {
                holding.remove(at);
            }
        });
    }
}

/// Queue `client`'s release of cache `cache` beside its full inbox, from code running under that
/// cache's writer role; whether there was room (at most [`INBOX_BOUND`]).
pub(crate) fn queue_own_release(cache: u64, client: u64) -> bool {
    #[cfg(not(dma_loom))]
    {
        OWN_RELEASES
            .try_with(|own| {
                let mut own = own.borrow_mut();
                let room = own.len() < INBOX_BOUND;
                if room {
                    own.push((cache, client));
                }
                room
            })
            .unwrap_or(false)
    }
    #[cfg(dma_loom)]
    {
        let _ = (cache, client);
        false
    }
}

/// Take the releases of cache `cache` that code under its role queued on this thread.
#[cfg(not(dma_loom))]
pub(super) fn take_own_releases(cache: u64) -> Vec<u64> {
    OWN_RELEASES
        .try_with(|own| {
            let mut own = own.borrow_mut();
            if own.is_empty() {
                return Vec::new();
            }
            let mine = own
                .iter()
                .filter(|&&(of, _)| of == cache)
                .map(|&(_, client)| client)
                .collect();
            own.retain(|&(of, _)| of != cache);
            mine
        })
        .unwrap_or_default()
}

/// Whether the calling thread holds the writer role of cache `cache`: a call from it that waited
/// for the writer would wait for ever.
pub(crate) fn on_writer_of(cache: u64) -> bool {
    #[cfg(not(dma_loom))]
    {
        HOLDING
            .try_with(|holding| holding.borrow().contains(&cache))
            .unwrap_or(false)
    }
    #[cfg(dma_loom)]
    {
        let _ = cache;
        false
    }
}

/// The writer's whole state: one job, to apply requests one at a time in the order they left
/// the inbox, as the one writer of the AV and the index. It holds parts that each keep one
/// invariant (see each type) and what spans them: the shared state, the counters and the inbox.
/// Invariant: only the role's holder touches it (`cell.rs`; under loom, `run` consumes it on
/// the writer thread), and the counters it publishes are those of the requests it has applied;
/// every part is bounded as "Bounds" says.
pub(crate) struct Writer<B> {
    /// The AV and each incarnation of ours in it, by index and by identity.
    table: Table<B>,
    shared: Arc<SharedState>,
    /// Where the clients the index does not hold are, and the incarnations they wait for.
    parking: Parking,
    /// Retired entries on their way out, and the epoch deferral that covers them.
    reclaim: Reclamation,
    /// This cache's id: the role's holder is marked with it ([`on_writer_of`]), and its own
    /// releases are filed under it.
    #[cfg_attr(dma_loom, allow(dead_code))] // no thread-local marks under loom
    cache: u64,
    /// When the background thread moves the epoch on and how long it parks (the loom loop
    /// keeps its own).
    #[cfg(not(dma_loom))]
    pacing: Pacing,
    stats: CacheStats,
    inbox: mpsc::Receiver<Request>,
    /// The answers and reports owed, until they may go out.
    outbox: Outbox,
    /// What the doorbell was last told: the state and the costs a waiter spins by.
    announced: Announced,
}

/// The inbox has been closed: the cache is gone.
#[cfg(dma_loom)]
struct Stopped;

/// Whether work other than a request has come for the writer of `shared`: the deferral's readers
/// have gone, or an awaited lease was dropped.
#[cfg(not(dma_loom))]
fn signalled(shared: &SharedState) -> bool {
    shared.readers_gone.load(Ordering::Relaxed) || shared.leases.reported()
}

impl<B: AvBackend> Writer<B> {
    pub(crate) fn new(
        backend: B,
        shared: Arc<SharedState>,
        epoch: LocalHandle,
        inbox: mpsc::Receiver<Request>,
        cache: u64,
    ) -> Self {
        Self {
            table: Table::new(backend),
            shared,
            parking: Parking::new(),
            reclaim: Reclamation::new(epoch),
            cache,
            #[cfg(not(dma_loom))]
            pacing: Pacing::new(),
            stats: CacheStats::default(),
            inbox,
            outbox: Outbox::new(),
            announced: Announced::new(),
        }
    }
}

impl<B> Drop for Writer<B> {
    /// However the writer ends (shutdown, or a panic unwinding), no sender waits for it to make
    /// room for a chunk any more.
    fn drop(&mut self) {
        self.shared.chunk_misses.close();
    }
}
