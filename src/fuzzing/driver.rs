//! Runs an operation sequence against a real cache and checks it, after every step, against the
//! reference model and the invariants of DESIGN.md.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::fail;
use super::ops::{CLIENTS, MAX_OPS, MAX_PINS, Op};
use super::reference::{Acceptance, MAX_WORLDS, Outcome, Rules, World, Worlds};
use crate::cache::{AddressCache, AvBackend, Pinned};
use crate::error::DmaError;

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
    /// whose pin is still alive.
    fn after_step(&mut self, held: &[(u64, usize)], log: &str);
    /// Checks once everything has been released and quiesced; `stats` are the cache's counters.
    fn at_end(&mut self, stats: &crate::CacheStats, log: &str);
}

/// One resolved peer the harness still holds: the pin it came from, what it was resolved for.
struct HeldPeer {
    pin: u64,
    fi_addr: u64,
    address: Vec<u8>,
    since: usize,
}

/// The classification of a real answer.
fn outcome(result: &Result<u64, DmaError>) -> Outcome {
    match result {
        Ok(fi_addr) => Outcome::Ok(Some(*fi_addr)),
        Err(DmaError::InvalidAddress(_)) => Outcome::InvalidAddress,
        Err(DmaError::Capacity { .. }) => Outcome::Capacity,
        Err(DmaError::WouldBlock) => Outcome::WouldBlock,
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
    log: String,
    start: crate::CacheStats,
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
                let alive = self.alive();
                self.update(|world| world.release(&alive, client));
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
        }
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
        let mut alive = self.alive();
        alive.insert(pin_id);

        // Invariant 5: bad input is an error before any AV call and changes nothing.
        let identity = self.rules.identity(&bytes);
        let rejected = Acceptance::Reject == (self.rules.acceptance)(&bytes);
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
        let actual = match (actual, &identity) {
            (Outcome::InvalidAddress, Some(_)) => Outcome::Fabric,
            (actual, _) => actual,
        };
        // Removals (and, on efa, the inserts of parked incarnations they let in) may run in the
        // background meanwhile, so "no change" is: no insert of these bytes, and for bad
        // lengths, no request to the writer either.
        let mark = calls_before.unwrap_or(0);
        let inserted = self
            .observer
            .inserted_since(mark, &bytes)
            .unwrap_or_else(|| self.cache.stats().inserts != before.inserts);
        if identity.is_none() && (self.cache.stats().misses != before.misses || inserted) {
            self.fail("an invalid address reached the writer or the AV");
        }
        if let Outcome::Capacity | Outcome::Fabric = actual {
            if inserted {
                self.fail(&format!("{actual:?}, and still an insert"));
            }
        }
        if let Ok(fi_addr) = result {
            // Invariant 1, at once: the peer maps to exactly these bytes.
            if self.observer.lookup(fi_addr) != Some(bytes.clone()) {
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
        let held_pins = self.alive();
        if let Some(identity) = identity {
            if queued {
                self.update(|world| {
                    let mut next = Vec::new();
                    for (hit, world) in world.probe(&rules, &alive, client, &bytes) {
                        match (hit, actual) {
                            (Some(known), Outcome::Ok(Some(fi_addr))) => {
                                let mut world = world;
                                if known.is_none_or(|known| known == fi_addr)
                                    && world.learn(&alive, &identity, &bytes, fi_addr)
                                {
                                    next.push(world);
                                }
                            }
                            (None, Outcome::WouldBlock) => next.extend(
                                world
                                    .resolve(&rules, &held_pins, client, &bytes)
                                    .into_iter()
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
                    for (predicted, mut world) in world.resolve(&rules, &alive, client, &bytes) {
                        if !predicted.admits(actual) {
                            continue;
                        }
                        if let Outcome::Ok(Some(fi_addr)) = actual {
                            if !world.learn(&alive, &identity, &bytes, fi_addr) {
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

    /// `quiesce()`; with no pin alive every removal has run, and the counters must say so.
    fn quiesce(&mut self) {
        // Only this thread pins this cache, so rounds alone are exact and no patience is needed.
        self.cache.quiesce_with_patience(std::time::Duration::ZERO);
        if !self.pins.is_empty() {
            return;
        }
        let stats = self.cache.stats();
        if 0 != stats.pending_removals {
            self.fail(&format!(
                "quiesce with no pin alive left removals pending: {stats:?}"
            ));
        }
        let indexed = self.cache.indexed() as u64;
        if indexed != stats.clients {
            self.fail(&format!(
                "the index holds {indexed}, the counters {stats:?}"
            ));
        }
        if !self.predicting {
            return;
        }
        let mut worlds = Vec::new();
        for world in self.worlds.iter() {
            let mut world = world.clone();
            world.settle();
            let settled = world.settled();
            let agrees = settled.entries == stats.entries
                && settled.clients == stats.clients
                && world.live_entries().iter().all(|(fi_addr, address)| {
                    self.observer.lookup(*fi_addr) == Some(address.clone())
                });
            if agrees {
                worlds.push(world);
            }
        }
        if worlds.is_empty() {
            self.fail(&format!(
                "after quiesce the counters read {stats:?}, which no world of the model explains"
            ));
        }
        self.set_worlds(worlds);
    }

    fn after_step(&mut self) {
        // Invariant 1: every peer whose pin lives still maps to its address.
        for peer in &self.held {
            let now = self.observer.lookup(peer.fi_addr);
            if now.as_deref() != Some(peer.address.as_slice()) {
                self.fail(&format!(
                    "a peer held under pin {} at {} now maps to {now:?}, not {:?}",
                    peer.pin, peer.fi_addr, peer.address
                ));
            }
        }
        let held: Vec<(u64, usize)> = self
            .held
            .iter()
            .map(|peer| (peer.fi_addr, peer.since))
            .collect();
        self.observer.after_step(&held, &self.log);
    }

    fn finish(mut self) -> String {
        let _ = writeln!(self.log, "-- release everything, quiesce");
        self.held.clear();
        self.pins.clear();
        let mut clients: BTreeSet<u64> = (0..CLIENTS).collect();
        for world in self.worlds.iter() {
            clients.extend(world.clients());
        }
        for client in clients {
            self.cache.release(client);
            let alive = self.alive();
            self.update(|world| world.release(&alive, client));
        }
        self.quiesce();
        if self.predicting && self.worlds.iter().any(|world| !world.is_empty()) {
            self.fail("the model still holds something after releasing everyone");
        }
        // Invariant 4: nothing left, and every insert matched by one remove.
        let stats = self.cache.stats();
        let inserts = stats.inserts - self.start.inserts;
        let removes = stats.removes - self.start.removes;
        if (0, 0, 0, 0)
            != (
                stats.entries,
                stats.clients,
                stats.pending_removals,
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
    pub(crate) av: crate::ModelAv,
    pub(crate) format: crate::AddressFormat,
    pub(crate) address_len: usize,
    cursor: usize,
    table: BTreeMap<u64, Vec<u8>>,
}

impl ModelObserver {
    pub(crate) fn new(av: crate::ModelAv, address_len: usize) -> Self {
        let format = crate::AvBackend::format(&av);
        Self {
            av,
            format,
            address_len,
            cursor: 0,
            table: BTreeMap::new(),
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
            matches!(event, crate::AvEvent::Inserted { address: inserted, .. } if inserted == address)
        }))
    }

    fn after_step(&mut self, held: &[(u64, usize)], log: &str) {
        let violations = self.av.violations();
        if !violations.is_empty() {
            fail(&format!(
                "the model AV saw breaches: {violations:?}\nsteps:\n{log}"
            ));
        }
        let events = self.av.events();
        for (at, event) in events.iter().enumerate().skip(self.cursor) {
            match event {
                crate::AvEvent::Inserted { fi_addr, address } => {
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
                crate::AvEvent::Removed { fi_addr, address } => {
                    if self.table.remove(fi_addr).as_ref() != Some(address) {
                        fail(&format!(
                            "call {at}: removed {fi_addr}, which the cache had not inserted\nsteps:\n{log}"
                        ));
                    }
                    // Invariant 1 and 2: no removal while a reader that saw it is pinned.
                    if held
                        .iter()
                        .any(|(held, since)| held == fi_addr && *since <= at)
                    {
                        fail(&format!(
                            "call {at}: removed {fi_addr} while a pinned reader holds it\nsteps:\n{log}"
                        ));
                    }
                }
            }
        }
        self.cursor = events.len();
    }

    fn at_end(&mut self, stats: &crate::CacheStats, log: &str) {
        self.after_step(&[], log);
        if !self.av.is_empty()
            || !self.table.is_empty()
            || self.av.inserts() != self.av.removes()
            || stats.inserts != self.av.inserts()
            || stats.removes != self.av.removes()
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
