//! The calls of the cache that wait: [`AddressCache::lease`], [`lease_all`], [`lease_within`],
//! [`quiesce`] and [`quiesce_with_patience`], and the patience that bounds every one of them.
//!
//! Every one of them waits at most the cache's patience; the rule, and why it is a bound rather
//! than a guess at whose leases are whose, is on
//! [`with_patience`](AddressCache::with_patience), where a user reads it.
//!
//! # Who decides
//!
//! The writer: a waiter's request carries its deadline, and the writer, which alone admits
//! parked incarnations, answers each waiter exactly once, with the lease's entry when the
//! incarnation gets in, or with [`DmaError::OutOfPatience`] at the deadline. Before it gives up on
//! a waiter it looks once more at the removal the waiter is behind, so a wait that could end now
//! (its last lease dropped, the drop's report not yet read) ends with the entry, and the error
//! always names a removal that was still held when it was given (`loom_tests/tests/patience.rs`).
//! The caller keeps a deadline of its own, one patience later, for a writer that cannot answer
//! (a backend call that does not return).
//!
//! [`lease_all`]: AddressCache::lease_all
//! [`lease_within`]: AddressCache::lease_within
//! [`quiesce`]: AddressCache::quiesce
//! [`quiesce_with_patience`]: AddressCache::quiesce_with_patience

use std::time::{Duration, Instant};

use super::reply::{self, Outcome};
use super::writer::{Reply, Request, on_writer_of};
use super::{AddressCache, AvBackend, Lease, on_writer_thread, pinned_here};
use crate::error::DmaError;
use crate::sync::{mpsc, recv_until};

impl<B: AvBackend> AddressCache<B> {
    /// How long a wait of the cache lasts at most unless [`with_patience`](Self::with_patience)
    /// says otherwise: 5 s. Long enough for any removal that waits on another thread's work (a
    /// completion read, a pin across a post), short enough that a wait on the caller itself
    /// shows up as an error in a log rather than as a hung server.
    pub const DEFAULT_PATIENCE: Duration =
        crate::configuration::Configuration::DEFAULT_CACHE_PATIENCE;

    /// This cache, with `patience` as the longest any of its calls waits (the patience rule,
    /// below). `Duration::ZERO` makes every blocking lease answer at once.
    ///
    /// # The patience rule
    ///
    /// No call of the cache waits for ever, whoever holds what, on whichever thread or task.
    /// Every wait ([`lease`](Self::lease), [`lease_all`](Self::lease_all),
    /// [`lease_within`](Self::lease_within), [`quiesce`](Self::quiesce)) is bounded by the cache's
    /// *patience*: this, set by an endpoint from
    /// [`Configuration::cache_patience`](crate::configuration::Configuration::cache_patience), by
    /// default [`DEFAULT_PATIENCE`](Self::DEFAULT_PATIENCE), 5 s. No timeout a caller passes makes
    /// a wait longer (`Duration::MAX`, 2⁴⁰ s and 100 years all mean "the patience").
    ///
    /// Why a bound rather than a guess: a lease entry that waits for an old incarnation's removal
    /// waits for every lease on it and every reader pinned at its unlink. Which of those belong to
    /// the caller cannot be known: a [`Lease`] is `Send` (a completion thread drops it, an async
    /// task moves between worker threads), and a pin of the calling thread's parent (a fork-join)
    /// is as much the caller's as its own. A rule such as "a lease counts for the thread that
    /// took it" would refuse waits that would end (a thread whose one lease is in flight on a
    /// completion thread would be refused every later wait) and wait for ever on others (a lease
    /// handed to the thread that then waits). The patience needs no guess: a wait on oneself ends
    /// at the bound with an error that says what it waited for
    /// ([`DmaError::OutOfPatience`]), and a wait on another thread ends when that thread drops
    /// what it holds. Each waiter is answered exactly once, and the error always names a removal
    /// that was still held when it was given.
    ///
    /// What is still refused at once, because it is exact: a blocking lease on a thread that
    /// holds a [`Pinned`](super::Pinned) of the cache (its own pin would hold the removal back),
    /// and any wait on the cache's own writer thread.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque))
    ///     .with_patience(Duration::from_millis(200));
    /// assert_eq!(Duration::from_millis(200), cache.patience());
    /// ```
    #[must_use]
    pub fn with_patience(mut self, patience: Duration) -> Self {
        self.reader_side.patience = patience;
        self
    }

    /// The longest any call of this cache waits.
    pub fn patience(&self) -> Duration {
        self.reader_side.patience
    }

    /// A [`Lease`] on `client`'s entry for `address`, without a pin: resolve (inserting through
    /// the writer on a miss) and lease in one call, for a connect path, or for code that kept an
    /// `fi_addr_t` per client. Blocks until the entry is in the AV: on efa, while a new
    /// incarnation waits for the old one's removal it waits too, rather than answer
    /// [`DmaError::WouldBlock`], for at most the cache's [`patience`](Self::patience). That wait
    /// ends when the old incarnation's last lease is dropped and its readers have unpinned,
    /// whichever thread holds them.
    ///
    /// # Errors
    /// As [`Pinned::resolve`](super::Pinned::resolve), except `WouldBlock`; and
    /// - [`DmaError::OutOfPatience`] when the entry is still waiting for the old incarnation's
    ///   removal after the patience: it names the client, how many leases the old incarnation
    ///   still has out, and how long it has waited for removal. The request stays queued: once
    ///   those leases are dropped (a thread that holds one itself drops it), `lease` again finds
    ///   the entry. This is the answer, within the patience, to a thread that waits on a lease it
    ///   holds, wherever that lease was taken, and to a worker whose parent's pin holds the
    ///   removal back;
    /// - [`DmaError::InvalidArgument`], at once: when the calling thread holds a
    ///   [`Pinned`](super::Pinned) of this cache, which a parked incarnation would wait for (take
    ///   the lease from that pin with [`Pinned::lease`](super::Pinned::lease) instead), and on
    ///   the cache's writer thread (see [`AvBackend`]).
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let av = ModelAv::new(AddressFormat::Opaque);
    /// let cache = AddressCache::with_backend(av.clone());
    /// let lease = cache.lease(1, &[1; 16])?;
    /// assert_eq!(Some(vec![1; 16]), av.lookup(lease.fi_addr()));
    /// # Ok::<(), DmaError>(())
    /// ```
    ///
    /// A wait on the caller's own lease ends at the patience, and a retry once it is dropped
    /// succeeds:
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let efa = |qkey: u8| { let mut a = [7; 32]; a[20] = qkey; a };
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Efa))
    ///     .with_patience(Duration::from_millis(50));
    /// let old = cache.lease(1, &efa(1))?;
    /// // A new incarnation of the same slot evicts the old one, and waits for `old`.
    /// let waited = cache.lease(1, &efa(2));
    /// assert!(matches!(waited, Err(DmaError::OutOfPatience { client: 1, leases: 1, .. })));
    /// drop(old);
    /// assert!(cache.lease(1, &efa(2)).is_ok());
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn lease(&self, client: u64, address: &[u8]) -> Result<Lease<'_>, DmaError> {
        self.lease_for(client, address, self.reader_side.patience)
    }

    /// [`lease`](Self::lease) for many `(client, address)` pairs at once: the misses go to the
    /// writer in chunks of at most 64, one request and one answer a chunk (see
    /// [`Pinned::resolve_all`](super::Pinned::resolve_all)), and each entry is leased. An entry
    /// that must wait for an old incarnation's removal waits as `lease` does, before this call
    /// takes any lease of its own (so its wait is never on one of them), and the whole call waits
    /// at most the cache's [`patience`](Self::patience).
    ///
    /// The results come back in request order; a bad address fails its own entry only.
    ///
    /// # Errors
    /// Per entry, as [`lease`](Self::lease).
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
    ///
    /// let av = ModelAv::new(AddressFormat::Opaque);
    /// let cache = AddressCache::with_backend(av.clone());
    /// let addresses: Vec<[u8; 16]> = (1..=100).map(|n| [n; 16]).collect();
    /// let requests: Vec<(u64, &[u8])> =
    ///     addresses.iter().enumerate().map(|(client, a)| (client as u64, &a[..])).collect();
    /// let leases = cache.lease_all(&requests);
    /// assert_eq!(100, leases.iter().filter(|lease| lease.is_ok()).count());
    /// assert_eq!(100, cache.stats().leases);
    /// ```
    pub fn lease_all(&self, requests: &[(u64, &[u8])]) -> Vec<Result<Lease<'_>, DmaError>> {
        // Under the writer role, the refusal says so, whether or not the holder is pinned too (a
        // caller serving its own miss is).
        if on_writer_of(self.reader_side.id) {
            let refusal = on_writer_thread("AddressCache::lease_all");
            return requests.iter().map(|_| Err(refusal.clone())).collect();
        }
        if self.reader_side.epochs.pinned_here() {
            let refusal = pinned_here(
                "AddressCache::lease_all",
                "Pinned::resolve_all and Pinned::lease",
            );
            return requests.iter().map(|_| Err(refusal.clone())).collect();
        }
        let started = Instant::now();
        // Register every entry, the misses in chunks, under one pin, then let the pin go: an
        // entry parked behind an old incarnation waits for every pin, this one's too.
        let registered: Vec<Result<(), DmaError>> = self
            .pin()
            .resolve_all(requests)
            .into_iter()
            .map(|peer| peer.map(|_| ()))
            .collect();
        let mut results: Vec<Result<Lease<'_>, DmaError>> = registered
            .iter()
            .map(|registered| match registered {
                Ok(()) | Err(DmaError::WouldBlock) => Err(DmaError::WouldBlock),
                Err(error) => Err(error.clone()),
            })
            .collect();
        // The parked entries first, before this call holds any lease a wait could be on; then the
        // rest, each a hit now (or, if another thread released it meanwhile, a miss as in
        // `lease`). What is left of the patience bounds each, so the whole call waits at most
        // the patience.
        let parked = registered
            .iter()
            .enumerate()
            .filter(|(_, registered)| matches!(registered, Err(DmaError::WouldBlock)));
        let ready = registered
            .iter()
            .enumerate()
            .filter(|(_, registered)| registered.is_ok());
        for (position, _) in parked.chain(ready) {
            if let (Some(slot), Some(&(client, address))) =
                (results.get_mut(position), requests.get(position))
            {
                let left = self.reader_side.patience.saturating_sub(started.elapsed());
                *slot = self.lease_for(client, address, left);
            }
        }
        results
    }

    /// [`lease`](Self::lease), waiting at most `timeout` for the entry to enter the AV, and never
    /// longer than the cache's [`patience`](Self::patience), whatever `timeout` says
    /// (`Duration::MAX`, 2⁴⁰ s and 100 years are all the patience).
    ///
    /// # Errors
    /// As `lease`: [`DmaError::OutOfPatience`] once `timeout` (or the patience) has passed; the
    /// request stays queued, so a later call finds the entry.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let lease = cache.lease_within(1, &[1; 16], Duration::MAX)?;
    /// assert_eq!(1, cache.stats().leases);
    /// # drop(lease);
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn lease_within(
        &self,
        client: u64,
        address: &[u8],
        timeout: Duration,
    ) -> Result<Lease<'_>, DmaError> {
        self.lease_for(client, address, timeout.min(self.reader_side.patience))
    }

    /// `lease`'s loop, waiting at most `patience` (no more than the cache's).
    fn lease_for(
        &self,
        client: u64,
        address: &[u8],
        patience: Duration,
    ) -> Result<Lease<'_>, DmaError> {
        // Under the writer role, the refusal says so, whether or not the holder is pinned too (a
        // caller serving its own miss is).
        if on_writer_of(self.reader_side.id) {
            return Err(on_writer_thread("AddressCache::lease"));
        }
        if self.reader_side.epochs.pinned_here() {
            return Err(pinned_here("AddressCache::lease", "Pinned::lease"));
        }
        let started = Instant::now();
        // The cache's patience is at most an hour (`Configuration::validate`), so these do not
        // overflow; if they did, the wait would be the writer's alone.
        let deadline = started.checked_add(patience);
        // The caller's own bound, for a writer that cannot answer at the deadline.
        let fallback = deadline.and_then(|deadline| deadline.checked_add(patience.max(GRACE)));
        let out_of_patience = || DmaError::OutOfPatience {
            client,
            leases: 0,
            held_for: Duration::ZERO,
        };
        let mut asked = false;
        loop {
            {
                let pinned = self.pin();
                if let Some(peer) = pinned.hit(client, address)? {
                    return pinned.lease(peer);
                }
            }
            let Some(deadline) = deadline else {
                return Err(out_of_patience());
            };
            if asked && Instant::now() >= deadline {
                // Admitted and released again, or turned away, until the patience ran out.
                return Err(out_of_patience());
            }
            asked = true;
            // Unpinned while waiting: a parked incarnation waits for every pin, this one's too.
            // At the deadline the background thread answers it; if that thread is busy with
            // another cache's work (it serves every cache in the process), this caller serves
            // the round itself once the role is free, so the answer still names the leases.
            let serve = || self.reader_side.requests.serve();
            let nudge = deadline
                .checked_add(NUDGE_AFTER)
                .map(|at| (at, &serve as &dyn Fn()));
            let outcome = match reply::round_trip_nudging(
                |answer| {
                    self.reader_side
                        .ask(client, address, Reply::Admitted { answer, deadline })
                },
                fallback,
                self.reader_side.requests.waiting(),
                nudge,
            ) {
                Outcome::Answered(outcome) => outcome,
                Outcome::TimedOut => return Err(out_of_patience()),
            };
            match outcome {
                // In the AV, or turned away by a newer incarnation: probe again.
                Ok(_) | Err(DmaError::WouldBlock) => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// Block until the writer has applied every request sent before this call and run every
    /// removal whose readers are gone. Removals held back by a reader that is still pinned stay
    /// pending (see [`CacheStats::pending_removals`](super::CacheStats::pending_removals)):
    /// `quiesce` waits for such a reader for
    /// [`DEFAULT_QUIESCE_PATIENCE`](Self::DEFAULT_QUIESCE_PATIENCE) without progress, then
    /// returns. [`quiesce_with_patience`](Self::quiesce_with_patience) sets that wait.
    ///
    /// With nothing held back it returns as soon as the removals have run, typically within
    /// tens of microseconds.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let reader = cache.pin();
    /// reader.resolve(1, &[1; 16])?;
    /// cache.release(1);
    /// cache.quiesce();
    /// assert_eq!(1, cache.stats().pending_removals, "held back by `reader`");
    /// drop(reader);
    /// cache.quiesce();
    /// assert_eq!(0, cache.stats().pending_removals);
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn quiesce(&self) {
        self.quiesce_with_patience(Self::DEFAULT_QUIESCE_PATIENCE);
    }

    /// How long [`quiesce`](Self::quiesce) waits for pending removals that make no progress
    /// before it concludes that a pinned reader holds them back.
    ///
    /// A thread is pinned for a moment in places its caller cannot see (while it exits and
    /// finalizes its epoch handle, or while it runs a deferred closure), and a loaded machine can
    /// preempt it there for a time slice; this is several of those.
    pub const DEFAULT_QUIESCE_PATIENCE: Duration = Duration::from_millis(20);

    /// [`quiesce`](Self::quiesce), waiting up to `patience` without progress for removals held
    /// back by pinned readers or leases, and never longer than the cache's
    /// [`patience`](Self::patience) in all. `Duration::ZERO` returns as soon as a few epoch
    /// advances in a row free nothing: exact when the caller knows no other thread is pinned on
    /// this cache, and the fastest way to learn that a reader still holds something.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let reader = cache.pin();
    /// reader.resolve(1, &[1; 16])?;
    /// cache.release(1);
    /// cache.quiesce_with_patience(Duration::ZERO);
    /// assert_eq!(1, cache.stats().pending_removals, "held back by `reader`");
    /// # Ok::<(), DmaError>(())
    /// ```
    ///
    /// It never waits for ever, whatever `patience` says (`Duration::MAX` included): at most the
    /// cache's patience; on a thread that holds a [`Pinned`](super::Pinned) of this cache, whose
    /// removals that pin holds back cannot progress while it waits here, patience is zero; and
    /// on the cache's own writer thread (a `tracing` subscriber, an [`AvBackend`]) it returns at
    /// once.
    pub fn quiesce_with_patience(&self, patience: Duration) {
        if on_writer_of(self.reader_side.id) {
            tracing::debug!("quiesce called on the writer thread: returns at once");
            return;
        }
        let patience = if self.reader_side.epochs.pinned_here() {
            Duration::ZERO
        } else {
            patience.min(self.reader_side.patience)
        };
        let started = Instant::now();
        let (reply, done) = mpsc::channel();
        if self
            .reader_side
            .requests
            .send(Request::Quiesce { reply, patience })
            .is_ok()
        {
            // An error means the writer stopped, which leaves nothing to wait for; a timeout, a
            // writer still applying what came before after the whole patience: return anyway.
            let bound = started.checked_add(self.reader_side.patience.max(GRACE));
            match bound {
                Some(bound) => {
                    let _ = recv_until(&done, bound);
                }
                None => {
                    let _ = done.recv();
                }
            }
        }
    }
}

/// The least a caller waits past its deadline for the writer's answer, which the writer sends at
/// the deadline: room for a writer that is preempted then.
const GRACE: Duration = Duration::from_millis(100);

/// How long after its deadline a blocked `lease` with no answer serves the cache's round itself
/// (if the role is free): the background thread, which answers deadlines, may be busy with
/// another cache's long step.
const NUDGE_AFTER: Duration = Duration::from_millis(5);
