//! Runs an operation sequence against a real cache and checks it, after every step, against the
//! reference model and the invariants of DESIGN.md.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use super::fail;
use super::ops::{CLIENTS, MAX_LEASES, MAX_OPS, MAX_PINS, Op};
use super::reference::{Acceptance, MAX_WORLDS, Now, Outcome, Rules, World, Worlds};
use dma_libfabric::{AddressCache, AvBackend, DmaError, Lease, Pinned};

/// How long `LeaseDirect` waits for its entry: a parked efa incarnation whose old one no lease
/// holds gets in within a few of the writer's epoch ticks (10 ms at most each); one that a lease
/// of the harness holds back never does, and costs this much.
const LEASE_TIMEOUT: Duration = Duration::from_millis(10);

/// How long the last `quiesce` of an input waits without progress once removals have failed:
/// longer than the writer's longest retry backoff (1 s).
const RETRY_PATIENCE: Duration = Duration::from_secs(3);

/// How many times a `quiesce` with no pin alive is repeated while the counters disagree with
/// every world: an answer given because leases hold removals back comes after a few rounds
/// without progress, which a collector slow to hand back the other removals can mimic.
const QUIESCE_ATTEMPTS: usize = 8;

/// What the driver can see of the AV under the cache, beyond the cache itself.
pub(crate) trait Observer {
    /// The address the AV holds at `fi_addr`, as far as the backend can tell.
    fn lookup(&self, fi_addr: u64) -> Option<Vec<u8>>;
    /// How many calls the AV has seen so far, when the backend counts them.
    fn calls(&self) -> Option<usize>;
    /// Whether `address` was inserted by a call after the first `mark` ones, when the backend
    /// can tell.
    fn inserted_since(&self, mark: usize, address: &[u8]) -> Option<bool>;
    /// Checks after every step. `held` lists each `(fi_addr, calls seen when it was handed out)`
    /// whose pin or lease is still alive.
    fn after_step(&mut self, held: &[(u64, usize)], log: &str);
    /// Make every `fi_av_remove` fail (or stop failing); false when the backend cannot.
    fn fail_removes(&mut self, on: bool) -> bool;
    /// Checks once everything has been released and quiesced; `stats` are the cache's counters.
    fn at_end(&mut self, stats: &dma_libfabric::CacheStats, log: &str);
}

/// One resolved peer the harness still holds: the pin it came from, what it was resolved for.
struct HeldPeer {
    pin: u64,
    fi_addr: u64,
    address: Vec<u8>,
    since: usize,
}

/// A lease the harness holds: on what, and since when.
struct HeldLease<'c> {
    lease: Lease<'c>,
    address: Vec<u8>,
    since: usize,
}

/// The classification of a real answer.
fn outcome(result: &Result<u64, DmaError>) -> Outcome {
    match result {
        Ok(fi_addr) => Outcome::Ok(Some(*fi_addr)),
        Err(DmaError::InvalidAddress(_)) => Outcome::InvalidAddress,
        Err(DmaError::Capacity { .. }) => Outcome::Capacity,
        // A blocking lease that waited out its timeout: the request stays queued, as a
        // `WouldBlock` leaves it.
        Err(DmaError::WouldBlock | DmaError::OutOfPatience { .. }) => Outcome::WouldBlock,
        Err(DmaError::Fabric {
            call: "fi_av_insert",
            ..
        }) => Outcome::Fabric,
        Err(other) => fail(&format!("an answer no input explains: {other:?}")),
    }
}

/// The harness over one cache.
pub(crate) struct Driver<'c, B: AvBackend, O: Observer> {
    cache: &'c AddressCache<B>,
    rules: Rules,
    observer: O,
    materialize: &'c dyn Fn(&super::ops::Address) -> Vec<u8>,
    worlds: Worlds,
    predicting: bool,
    pins: Vec<(u64, Pinned<'c>)>,
    next_pin: u64,
    held: Vec<HeldPeer>,
    leases: Vec<HeldLease<'c>>,
    /// Whether the AV fails every removal now.
    failing: bool,
    /// Whether it ever did in this input: removals may then wait for a retry.
    ever_failed: bool,
    log: String,
    start: dma_libfabric::CacheStats,
}

impl<'c, B: AvBackend, O: Observer> Driver<'c, B, O> {
    pub(crate) fn new(
        cache: &'c AddressCache<B>,
        rules: Rules,
        observer: O,
        materialize: &'c dyn Fn(&super::ops::Address) -> Vec<u8>,
    ) -> Self {
        Self {
            cache,
            rules,
            observer,
            materialize,
            worlds: Worlds::default(),
            predicting: true,
            pins: Vec::new(),
            next_pin: 0,
            held: Vec::new(),
            leases: Vec::new(),
            failing: false,
            ever_failed: false,
            log: String::new(),
            start: cache.stats(),
        }
    }

    /// Run `ops` (the first [`MAX_OPS`]), then release everything and check that nothing is
    /// left.
    pub(crate) fn run(mut self, ops: &[Op]) -> String {
        for op in ops.iter().take(MAX_OPS) {
            let _ = writeln!(self.log, "{op:?}");
            self.step(op);
            self.after_step();
        }
        self.finish()
    }

    fn alive(&self) -> BTreeSet<u64> {
        self.pins.iter().map(|(id, _)| *id).collect()
    }

    /// What holds removals back now.
    fn now(&self) -> Now {
        Now {
            pins: self.alive(),
            leased: self
                .leases
                .iter()
                .map(|held| (held.lease.fi_addr(), held.address.clone()))
                .collect(),
            failing: self.failing,
        }
    }

    fn fail(&self, what: &str) -> ! {
        let worlds: Vec<&World> = self.worlds.iter().take(4).collect();
        fail(&format!(
            "{what}\nsteps:\n{}worlds before the last step ({} in all, first 4): {worlds:#?}",
            self.log,
            self.worlds.len()
        ))
    }

    /// Which held pin an op names, or `None` for a temporary pin of its own.
    fn choose_pin(&self, pin: u8) -> Option<usize> {
        let choice = usize::from(pin) % (self.pins.len() + 1);
        (choice < self.pins.len()).then_some(choice)
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::Resolve {
                client,
                address,
                pin,
            } => self.resolve(u64::from(*client) % CLIENTS, address, *pin, false),
            Op::TryResolve {
                client,
                address,
                pin,
            } => self.resolve(u64::from(*client) % CLIENTS, address, *pin, true),
            Op::Release { client } => {
                let client = u64::from(*client) % CLIENTS;
                self.cache.release(client);
                let now = self.now();
                self.update(|world| world.release(&now, client));
                self.quiesce();
            }
            Op::Pin => {
                if self.pins.len() < MAX_PINS {
                    self.pins.push((self.next_pin, self.cache.pin()));
                    self.next_pin += 1;
                }
            }
            Op::Unpin { pin } => {
                if !self.pins.is_empty() {
                    let (id, pinned) = self.pins.remove(usize::from(*pin) % self.pins.len());
                    self.held.retain(|peer| peer.pin != id);
                    drop(pinned);
                }
            }
            Op::Quiesce => self.quiesce(),
            Op::Lease { peer } => self.lease(usize::from(*peer)),
            Op::CloneLease { lease } => {
                if self.leases.is_empty() || self.leases.len() >= MAX_LEASES {
                    return;
                }
                let held = &self.leases[usize::from(*lease) % self.leases.len()];
                let clone = HeldLease {
                    lease: held.lease.clone(),
                    address: held.address.clone(),
                    since: held.since,
                };
                if clone.lease.fi_addr() != held.lease.fi_addr() {
                    self.fail("a cloned lease names another entry");
                }
                self.leases.push(clone);
            }
            Op::DropLease { lease } => {
                if !self.leases.is_empty() {
                    let index = usize::from(*lease) % self.leases.len();
                    drop(self.leases.remove(index));
                }
            }
            Op::LeaseDirect { client, address } => {
                self.lease_direct(u64::from(*client) % CLIENTS, address);
            }
            Op::FailRemoves(on) => self.fail_removes(*on),
        }
    }

    /// Take a lease on held peer `peer` under the pin it came from.
    fn lease(&mut self, peer: usize) {
        if self.held.is_empty() || self.leases.len() >= MAX_LEASES {
            return;
        }
        let held = &self.held[peer % self.held.len()];
        let Some((_, pinned)) = self.pins.iter().find(|(id, _)| *id == held.pin) else {
            self.fail("a held peer whose pin is gone");
        };
        // SAFETY: `held.fi_addr` was resolved under `pinned`, which is still held.
        let peer = unsafe { pinned.peer_unchecked(0, held.fi_addr) };
        let lease = match pinned.lease(peer) {
            Ok(lease) => lease,
            Err(error) => self.fail(&format!("a lease on {} refused: {error}", held.fi_addr)),
        };
        if lease.fi_addr() != held.fi_addr || lease.peer().fi_addr() != held.fi_addr {
            self.fail(&format!(
                "a lease on {} names {}",
                held.fi_addr,
                lease.fi_addr()
            ));
        }
        let _ = writeln!(self.log, "   -> leased {}", held.fi_addr);
        let lease = HeldLease {
            lease,
            address: held.address.clone(),
            since: held.since,
        };
        self.leases.push(lease);
    }

    /// `AddressCache::lease_within`: refused under a pin of this thread; otherwise a resolve that
    /// waits for a parked incarnation, and a lease.
    fn lease_direct(&mut self, client: u64, address: &super::ops::Address) {
        if self.leases.len() >= MAX_LEASES {
            return;
        }
        let bytes = (self.materialize)(address);
        if (self.rules.skip)(&bytes) {
            let _ = writeln!(self.log, "   -> skipped: a path with a known bug");
            return;
        }
        let before = self.cache.stats();
        let calls_before = self.observer.calls();
        let result = self.cache.lease_within(client, &bytes, LEASE_TIMEOUT);
        let answer = result
            .as_ref()
            .map(|lease| lease.fi_addr())
            .map_err(Clone::clone);
        if !self.pins.is_empty() {
            // Invariant 5: a wrong call is a clear error, before anything changes.
            let _ = writeln!(self.log, "   -> under a pin: {answer:?}");
            let inserted = self
                .observer
                .inserted_since(calls_before.unwrap_or(0), &bytes)
                .unwrap_or(false);
            if !matches!(answer, Err(DmaError::InvalidArgument(_)))
                || self.cache.stats().misses != before.misses
                || inserted
            {
                self.fail(&format!(
                    "lease_within under a pin of the same thread answered {answer:?}, and did not leave the cache alone"
                ));
            }
            return;
        }
        let actual = outcome(&answer);
        let _ = writeln!(self.log, "   -> {} bytes, {actual:?}", bytes.len());
        let identity = self.rules.identity(&bytes);
        let actual = self.check_answer(&bytes, identity.as_ref(), actual, &before, calls_before);
        // The leases before this one: no lease held the entry while the writer resolved.
        let now = self.now();
        if let Ok(lease) = result {
            let fi_addr = lease.fi_addr();
            if !self.maps_to(fi_addr, &bytes) {
                self.fail(&format!(
                    "leased {fi_addr}, which the AV maps to {:?}, not {bytes:?}",
                    self.observer.lookup(fi_addr)
                ));
            }
            let since = self.observer.calls().unwrap_or(0);
            self.leases.push(HeldLease {
                lease,
                address: bytes.clone(),
                since,
            });
        }
        let Some(identity) = identity else {
            return;
        };
        let rules = self.rules;
        self.update(|world| {
            let mut next = Vec::new();
            for (predicted, mut world) in world.resolve(&rules, &now, client, &bytes) {
                match actual {
                    // Timed out: the request was sent (the quiesce below sees it applied),
                    // whatever its answer.
                    Outcome::WouldBlock => next.push(world),
                    Outcome::Ok(Some(fi_addr)) => {
                        let admitted = match predicted {
                            Outcome::Ok(known) => known.is_none_or(|known| known == fi_addr),
                            Outcome::WouldBlock => {
                                world.admit_parked(&identity, &bytes, &now, client)
                            }
                            _ => false,
                        };
                        if admitted && world.learn(&now, &identity, &bytes, fi_addr) {
                            next.push(world);
                        }
                    }
                    actual => {
                        if predicted.admits(actual) {
                            next.push(world);
                        }
                    }
                }
            }
            next
        });
        if Outcome::WouldBlock == actual {
            self.quiesce();
        }
    }

    /// `ModelAv::fail_removes`, where the backend has it.
    fn fail_removes(&mut self, on: bool) {
        if on == self.failing {
            return;
        }
        if !self.observer.fail_removes(on) {
            let _ = writeln!(self.log, "   -> not supported by this AV");
            return;
        }
        if on {
            // Whatever may have been removed before this step may have been.
            let now = self.now();
            self.update(|world| world.fail_removes(&now));
        }
        self.failing = on;
        self.ever_failed |= on;
    }

    /// Apply `next` to every world, when still predicting.
    fn update(&mut self, mut next: impl FnMut(&World) -> Vec<World>) {
        if !self.predicting {
            return;
        }
        let worlds: Vec<World> = self.worlds.iter().flat_map(&mut next).collect();
        self.set_worlds(worlds);
    }

    fn set_worlds(&mut self, worlds: Vec<World>) {
        if worlds.is_empty() {
            self.fail("the cache did something the reference model allows in no timing");
        }
        self.worlds.replace(worlds);
        if self.worlds.len() > MAX_WORLDS {
            self.predicting = false;
        }
    }

    fn resolve(&mut self, client: u64, address: &super::ops::Address, pin: u8, queued: bool) {
        let bytes = (self.materialize)(address);
        if (self.rules.skip)(&bytes) {
            let _ = writeln!(self.log, "   -> skipped: a path with a known bug");
            return;
        }
        let before = self.cache.stats();
        let calls_before = self.observer.calls();
        let chosen = self.choose_pin(pin);
        let temporary = match chosen {
            Some(_) => None,
            None => {
                let id = self.next_pin;
                self.next_pin += 1;
                Some((id, self.cache.pin()))
            }
        };
        let (pin_id, pinned) = match (&temporary, chosen) {
            (Some((id, pinned)), _) => (*id, pinned),
            (None, Some(index)) => (self.pins[index].0, &self.pins[index].1),
            (None, None) => self.fail("no pin to resolve under"),
        };
        let result = if queued {
            pinned.try_resolve(client, &bytes)
        } else {
            pinned.resolve(client, &bytes)
        }
        .map(|peer| peer.fi_addr());
        let actual = outcome(&result);
        let _ = writeln!(self.log, "   -> {} bytes, {actual:?}", bytes.len());
        let since = self.observer.calls().unwrap_or(0);
        let mut now = self.now();
        now.pins.insert(pin_id);

        let identity = self.rules.identity(&bytes);
        let actual = self.check_answer(&bytes, identity.as_ref(), actual, &before, calls_before);
        if let Ok(fi_addr) = result {
            // Invariant 1, at once: the peer maps to exactly these bytes.
            if !self.maps_to(fi_addr, &bytes) {
                self.fail(&format!(
                    "resolved {fi_addr}, which the AV maps to {:?}, not {bytes:?}",
                    self.observer.lookup(fi_addr)
                ));
            }
            if temporary.is_none() {
                self.held.push(HeldPeer {
                    pin: pin_id,
                    fi_addr,
                    address: bytes.clone(),
                    since,
                });
            }
        }
        drop(temporary);

        let rules = self.rules;
        // The writer applies a queued miss after the temporary pin is gone.
        let later = self.now();
        if let Some(identity) = identity {
            if queued {
                self.update(|world| {
                    let mut next = Vec::new();
                    for (hit, world) in world.probe(&rules, &now, client, &bytes) {
                        match (hit, actual) {
                            (Some(known), Outcome::Ok(Some(fi_addr))) => {
                                let mut world = world;
                                if known.is_none_or(|known| known == fi_addr)
                                    && world.learn(&now, &identity, &bytes, fi_addr)
                                {
                                    next.push(world);
                                }
                            }
                            (None, actual) => next.extend(
                                world
                                    .queued_miss(&rules, &later, client, &bytes)
                                    .into_iter()
                                    .filter(|(answer, _)| *answer == actual)
                                    .map(|(_, world)| world),
                            ),
                            _ => {}
                        }
                    }
                    next
                });
            } else {
                self.update(|world| {
                    let mut next = Vec::new();
                    for (predicted, mut world) in world.resolve(&rules, &now, client, &bytes) {
                        if !predicted.admits(actual) {
                            continue;
                        }
                        if let Outcome::Ok(Some(fi_addr)) = actual {
                            if !world.learn(&now, &identity, &bytes, fi_addr) {
                                continue;
                            }
                        }
                        next.push(world);
                    }
                    next
                });
            }
        }
        if queued {
            self.quiesce();
        }
    }

    /// Invariant 5 on an answer for `bytes`: bad input is an error before any AV call and
    /// changes nothing. Returns the answer as the model classifies it.
    fn check_answer(
        &self,
        bytes: &[u8],
        identity: Option<&Vec<u8>>,
        actual: Outcome,
        before: &dma_libfabric::CacheStats,
        calls_before: Option<usize>,
    ) -> Outcome {
        let rejected = Acceptance::Reject == (self.rules.acceptance)(bytes);
        if identity.is_none() != (Outcome::InvalidAddress == actual)
            && !(rejected && Outcome::InvalidAddress == actual)
        {
            self.fail(&format!(
                "{} bytes answered {actual:?}; the provider's addresses are {}",
                bytes.len(),
                self.rules.address_len
            ));
        }
        // Bytes of the right length that the cache itself refuses stand for a rejection.
        let actual = match (actual, identity) {
            (Outcome::InvalidAddress, Some(_)) => Outcome::Fabric,
            (actual, _) => actual,
        };
        // Removals (and, on efa, the inserts of parked incarnations they let in) may run in the
        // background meanwhile, so "no change" is: no insert of these bytes, and for bad
        // lengths, no request to the writer either.
        let mark = calls_before.unwrap_or(0);
        let inserted = self
            .observer
            .inserted_since(mark, bytes)
            .unwrap_or_else(|| self.cache.stats().inserts != before.inserts);
        if identity.is_none() && (self.cache.stats().misses != before.misses || inserted) {
            self.fail("an invalid address reached the writer or the AV");
        }
        if let Outcome::Capacity | Outcome::Fabric = actual {
            if inserted {
                self.fail(&format!("{actual:?}, and still an insert"));
            }
        }
        actual
    }

    /// `quiesce()`; with no pin alive every removal that may run has run, and the counters must
    /// say so.
    fn quiesce(&mut self) {
        // Only this thread pins this cache, so rounds alone are exact and no patience is needed.
        self.quiesce_with(Duration::ZERO, false);
    }

    /// `quiesce_with_patience(patience)`; `patient` when it outlasts every retry of a failed
    /// removal.
    fn quiesce_with(&mut self, patience: Duration, patient: bool) {
        self.cache.quiesce_with_patience(patience);
        if !self.pins.is_empty() {
            return;
        }
        let now = self.now();
        // Nothing changes under the harness unless a failed removal may be retried meanwhile.
        let quiet = patient || !self.ever_failed;
        let mut stats = self.cache.stats();
        if quiet && self.leases.is_empty() && 0 != stats.pending_removals {
            self.fail(&format!(
                "quiesce with no pin and no lease alive left removals pending: {stats:?}"
            ));
        }
        if quiet {
            let indexed = self.cache.indexed() as u64;
            if indexed != stats.clients {
                self.fail(&format!(
                    "the index holds {indexed}, the counters {stats:?}"
                ));
            }
        }
        if !self.predicting {
            return;
        }
        let settled: Vec<World> = self
            .worlds
            .iter()
            .flat_map(|world| world.settle(&now, patient))
            .collect();
        let agrees = |world: &World, stats: &dma_libfabric::CacheStats| {
            let counted = world.settled();
            // A world in which a retry may be under way has no exact counters to compare.
            let counts_agree = world.unsettled(&now)
                || (counted.entries == stats.entries
                    && counted.clients == stats.clients
                    && world.pending() == stats.pending_removals
                    && world.awaiting_leases(&now) == stats.removals_awaiting_leases);
            counts_agree
                && world
                    .live_entries()
                    .iter()
                    .all(|(fi_addr, address)| self.maps_to(*fi_addr, address))
        };
        // Leases holding removals back make the writer answer after rounds without progress: ask
        // again while no world explains the counters yet.
        for _ in 1..QUIESCE_ATTEMPTS {
            if self.leases.is_empty() || settled.iter().any(|world| agrees(world, &stats)) {
                break;
            }
            self.cache.quiesce_with_patience(patience);
            stats = self.cache.stats();
        }
        let worlds: Vec<World> = settled
            .into_iter()
            .filter(|world| agrees(world, &stats))
            .collect();
        if worlds.is_empty() {
            self.fail(&format!(
                "after quiesce the counters read {stats:?}, which no world of the model explains"
            ));
        }
        self.set_worlds(worlds);
    }

    /// Whether the AV maps `fi_addr` to `address`: to its provider part, all the AV is given of
    /// a sealed address.
    fn maps_to(&self, fi_addr: u64, address: &[u8]) -> bool {
        self.observer.lookup(fi_addr).as_deref() == address.get(..self.rules.address_len)
    }

    fn after_step(&mut self) {
        // Invariant 1: every peer whose pin lives, and every lease, still maps to its address.
        for peer in &self.held {
            if !self.maps_to(peer.fi_addr, &peer.address) {
                let now = self.observer.lookup(peer.fi_addr);
                self.fail(&format!(
                    "a peer held under pin {} at {} now maps to {now:?}, not {:?}",
                    peer.pin, peer.fi_addr, peer.address
                ));
            }
        }
        for held in &self.leases {
            let fi_addr = held.lease.fi_addr();
            if !self.maps_to(fi_addr, &held.address) {
                let now = self.observer.lookup(fi_addr);
                self.fail(&format!(
                    "a lease on {fi_addr} now maps to {now:?}, not {:?}",
                    held.address
                ));
            }
        }
        let leases = self.cache.stats().leases;
        if leases != self.leases.len() as u64 {
            self.fail(&format!(
                "the cache counts {leases} leases; the harness holds {}",
                self.leases.len()
            ));
        }
        let held: Vec<(u64, usize)> = self
            .held
            .iter()
            .map(|peer| (peer.fi_addr, peer.since))
            .chain(
                self.leases
                    .iter()
                    .map(|held| (held.lease.fi_addr(), held.since)),
            )
            .collect();
        self.observer.after_step(&held, &self.log);
    }

    fn finish(mut self) -> String {
        let _ = writeln!(
            self.log,
            "-- drop every lease and pin, stop failing removes, release everything, quiesce"
        );
        self.held.clear();
        self.pins.clear();
        self.leases.clear();
        if self.failing {
            self.fail_removes(false);
        }
        let mut clients: BTreeSet<u64> = (0..CLIENTS).collect();
        for world in self.worlds.iter() {
            clients.extend(world.clients());
        }
        for client in clients {
            self.cache.release(client);
            let now = self.now();
            self.update(|world| world.release(&now, client));
        }
        let patience = if self.ever_failed {
            RETRY_PATIENCE
        } else {
            Duration::ZERO
        };
        self.quiesce_with(patience, true);
        if self.predicting && self.worlds.iter().any(|world| !world.is_empty()) {
            self.fail("the model still holds something after releasing everyone");
        }
        // Invariant 4: nothing left; invariant 2: every insert matched by one remove that
        // succeeded.
        let stats = self.cache.stats();
        let inserts = stats.inserts - self.start.inserts;
        let removes = (stats.removes - self.start.removes)
            - (stats.failed_removes - self.start.failed_removes);
        if !self.ever_failed && stats.failed_removes != self.start.failed_removes {
            self.fail(&format!("removes failed, and none was made to: {stats:?}"));
        }
        if (0, 0, 0, 0, 0)
            != (
                stats.entries,
                stats.clients,
                stats.pending_removals,
                stats.leases,
                self.cache.indexed() as u64,
            )
            || inserts != removes
        {
            self.fail(&format!(
                "left behind after releasing everyone: {stats:?}, indexed {}, {inserts} inserts and {removes} removes",
                self.cache.indexed()
            ));
        }
        self.observer.at_end(&stats, &self.log);
        let _ = writeln!(self.log, "-- {} worlds at the end", self.worlds.len());
        self.log
    }
}

/// The model AV seen through its events: checks invariants 1 to 3 call by call.
pub(crate) struct ModelObserver {
    pub(crate) av: dma_libfabric::ModelAv,
    pub(crate) format: dma_libfabric::AddressFormat,
    pub(crate) address_len: usize,
    cursor: usize,
    table: BTreeMap<u64, Vec<u8>>,
    /// The heap as the input started, where the binary counts it.
    heap: Option<super::heap::Baseline>,
}

impl ModelObserver {
    pub(crate) fn new(
        av: dma_libfabric::ModelAv,
        address_len: usize,
        heap: Option<super::heap::Baseline>,
    ) -> Self {
        let format = dma_libfabric::AvBackend::format(&av);
        Self {
            av,
            format,
            address_len,
            cursor: 0,
            table: BTreeMap::new(),
            heap,
        }
    }

    /// The heap bound: whatever the steps did, the heap never grew past it.
    fn check_heap(&self, log: &str) {
        if let Some(grown) = self.heap.as_ref().and_then(super::heap::Baseline::exceeded) {
            let bound = self.heap.as_ref().map_or(0, super::heap::Baseline::bound);
            fail(&format!(
                "the heap grew {grown} B above the empty cache, past the bound of {bound} B\nsteps:\n{log}"
            ));
        }
    }

    fn identity<'a>(&self, address: &'a [u8]) -> &'a [u8] {
        self.format
            .identity(address, self.address_len)
            .unwrap_or(address)
    }
}

impl Observer for ModelObserver {
    fn lookup(&self, fi_addr: u64) -> Option<Vec<u8>> {
        self.av.lookup(fi_addr)
    }

    fn calls(&self) -> Option<usize> {
        Some(self.av.events().len())
    }

    fn inserted_since(&self, mark: usize, address: &[u8]) -> Option<bool> {
        Some(self.av.events().iter().skip(mark).any(|event| {
            matches!(event, dma_libfabric::AvEvent::Inserted { address: inserted, .. } if inserted == address)
        }))
    }

    fn fail_removes(&mut self, on: bool) -> bool {
        let error = DmaError::Fabric {
            call: "fi_av_remove",
            code: -16, // -FI_EBUSY
            message: "failed by the fuzz harness".into(),
        };
        self.av.fail_removes(on.then_some(error));
        true
    }

    fn after_step(&mut self, held: &[(u64, usize)], log: &str) {
        self.check_heap(log);
        let violations = self.av.violations();
        if !violations.is_empty() {
            fail(&format!(
                "the model AV saw breaches: {violations:?}\nsteps:\n{log}"
            ));
        }
        let events = self.av.events();
        for (at, event) in events.iter().enumerate().skip(self.cursor) {
            match event {
                dma_libfabric::AvEvent::Inserted { fi_addr, address } => {
                    // Invariant 3 (and 2): each identity is in the AV once, inserted once.
                    let identity = self.identity(address);
                    if self
                        .table
                        .values()
                        .any(|held| self.identity(held) == identity)
                    {
                        fail(&format!(
                            "call {at}: {address:?} inserted at {fi_addr} while its identity is in the AV\nsteps:\n{log}"
                        ));
                    }
                    self.table.insert(*fi_addr, address.clone());
                }
                dma_libfabric::AvEvent::Removed { fi_addr, address } => {
                    if self.table.remove(fi_addr).as_ref() != Some(address) {
                        fail(&format!(
                            "call {at}: removed {fi_addr}, which the cache had not inserted\nsteps:\n{log}"
                        ));
                    }
                    // Invariant 1 and 2: no removal while a reader that saw it is pinned, or a
                    // lease on it is held.
                    if held
                        .iter()
                        .any(|(held, since)| held == fi_addr && *since <= at)
                    {
                        fail(&format!(
                            "call {at}: removed {fi_addr} while a pinned reader or a lease holds it\nsteps:\n{log}"
                        ));
                    }
                }
            }
        }
        self.cursor = events.len();
    }

    fn at_end(&mut self, stats: &dma_libfabric::CacheStats, log: &str) {
        self.after_step(&[], log);
        if !self.av.is_empty()
            || !self.table.is_empty()
            || self.av.inserts() != self.av.removes()
            || stats.inserts != self.av.inserts()
            || stats.removes - stats.failed_removes != self.av.removes()
        {
            fail(&format!(
                "the model AV is not empty after releasing everyone: {} entries, {} inserts, {} removes, cache {stats:?}\nsteps:\n{log}",
                self.av.len(),
                self.av.inserts(),
                self.av.removes()
            ));
        }
    }
}
