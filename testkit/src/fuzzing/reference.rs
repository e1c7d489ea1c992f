//! The reference model: the seed's single-threaded semantics of the cache, written plainly.
//!
//! A [`World`] is one state the cache may be in: which identity has which live incarnation and
//! clients, which incarnation awaits its removal, which new one is parked behind it. It follows
//! `writer.rs` rule by rule, but with ordinary maps and no threads.
//!
//! Single-threaded driving leaves exactly one thing to timing: when a removal whose pinned
//! readers have all gone actually runs (crossbeam-epoch frees it once the global epoch has moved
//! on twice, which a pin taken in between may or may not prevent). So a removal is
//!
//! - *held* while some pin that was alive when it was retired is still alive, while the harness
//!   holds a lease on its entry, or while the AV fails every removal: it certainly has not run;
//! - *maybe* otherwise: it may have run or not, until a `quiesce` with no pin alive, after which
//!   it certainly has, unless it is *tainted*: it may have failed once, and then its retry waits
//!   out a backoff that a `quiesce` does not, so it stays *maybe* until the final, patient
//!   `quiesce` of the input.
//!
//! What holds removals back besides the world itself (the pins, the leases and whether removals
//! fail) is the harness's, passed in as [`Now`].
//!
//! A queued miss (`try_resolve`) that fails is recorded under its client, and the next
//! `try_resolve` of that client and address answers the failure instead of queuing again; the
//! world keeps that record too.
//!
//! The oracle therefore keeps a set of worlds ([`Worlds`]). Each step maps every world to the
//! outcomes it allows (branching on whether the maybe-removal of the identity the step touches
//! has run), keeps those that agree with what the real cache answered, and drops duplicates. An
//! empty set is a bug in the cache (or in this model): the cache did something no legal timing
//! explains.

use std::collections::{BTreeMap, BTreeSet};

use dma_libfabric::AddressFormat;

/// What a resolve may answer, as far as the model can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// `Ok` with this `fi_addr_t`, or with one the model does not know yet (a fresh insert).
    Ok(Option<u64>),
    /// `DmaError::InvalidAddress`.
    InvalidAddress,
    /// `DmaError::Capacity`.
    Capacity,
    /// `DmaError::WouldBlock`.
    WouldBlock,
    /// `DmaError::Fabric` from `fi_av_insert`: the provider rejected the bytes (or the cache
    /// refused, with `DmaError::InvalidAddress`, bytes of the right length that the provider
    /// would reject).
    Fabric,
}

impl Outcome {
    /// Whether the real answer `actual` is what this prediction allows.
    pub fn admits(self, actual: Outcome) -> bool {
        match (self, actual) {
            (Outcome::Ok(None), Outcome::Ok(_)) => true,
            (expected, actual) => expected == actual,
        }
    }
}

/// Whether the provider takes an address of the right length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acceptance {
    /// Always (the model AV).
    Accept,
    /// Never: malformed for this provider (a bad family, port zero, ...).
    Reject,
    /// The model does not know; either answer is legal, and a rejection changes nothing.
    Either,
}

/// The fixed facts of one cache.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// The AV's format.
    pub format: AddressFormat,
    /// Its address length.
    pub address_len: usize,
    /// Its capacity, counting entries awaiting removal.
    pub capacity: usize,
    /// Which addresses the provider takes.
    pub acceptance: fn(&[u8]) -> Acceptance,
    /// Addresses the harness must not hand the cache at all (a path with a known, unfixed bug).
    pub skip: fn(&[u8]) -> bool,
}

impl Rules {
    /// The identity of a checked address: efa's first 18 bytes, or all of them; `None` for an
    /// address the cache must refuse with `DmaError::InvalidAddress`. Worked out here, not with
    /// the library's own check, so the two are compared: an empty address, one of another
    /// length than the provider's (or that and a seal of this release's version), an efa one
    /// that is not 32 bytes, and one whose provider part is all zero bytes (a peer that has not
    /// run `fi_getname` yet) are invalid on every format.
    pub fn identity(&self, address: &[u8]) -> Option<Vec<u8>> {
        let identity_len = match self.format {
            AddressFormat::Efa => dma_libfabric::EFA_IDENTITY_LEN,
            AddressFormat::Opaque => address.len(),
        };
        // Bare (the provider's length), or sealed: that and a seal of version 1 (its eighth
        // byte); either way a provider part that is not all zero.
        let sealed = address.len() == self.address_len + dma_libfabric::SEAL_LEN;
        let valid = !address.is_empty()
            && (address.len() == self.address_len
                || (sealed && 1 == address[self.address_len + 7]))
            && (AddressFormat::Opaque == self.format
                || dma_libfabric::EFA_ADDRESS_LEN == self.address_len)
            && address[..self.address_len].iter().any(|&byte| 0 != byte);
        valid.then(|| address[..identity_len].to_vec())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Live {
    address: Vec<u8>,
    fi_addr: Option<u64>,
    clients: BTreeSet<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Removal {
    address: Vec<u8>,
    fi_addr: Option<u64>,
    /// The pins alive when it was retired: while one of them lives, it has not run.
    holders: BTreeSet<u64>,
    /// It may have failed: its retry waits out a backoff that no `quiesce` of the harness does.
    tainted: bool,
}

impl Removal {
    /// Whether a lease of the harness holds it.
    fn leased(&self, now: &Now) -> bool {
        self.fi_addr.is_some_and(|fi_addr| {
            now.leased
                .iter()
                .any(|(leased, address)| *leased == fi_addr && *address == self.address)
        })
    }

    /// Whether it may have run by now (or may run at any moment).
    fn may_run(&self, now: &Now) -> bool {
        !now.failing && self.holders.is_disjoint(&now.pins) && !self.leased(now)
    }
}

/// What holds removals back at a step besides the world itself: the harness's state.
#[derive(Debug, Clone, Default)]
pub struct Now {
    /// The ids of the pins alive.
    pub pins: BTreeSet<u64>,
    /// The entries the harness holds leases on, as `(fi_addr, address)`.
    pub leased: BTreeSet<(u64, Vec<u8>)>,
    /// Whether every `fi_av_remove` fails now.
    pub failing: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Parked {
    address: Vec<u8>,
    clients: BTreeSet<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Slot {
    live: Option<Live>,
    removing: Option<Removal>,
    parked: Option<Parked>,
}

impl Slot {
    fn is_empty(&self) -> bool {
        self.live.is_none() && self.removing.is_none() && self.parked.is_none()
    }
}

/// One state the cache may be in. See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct World {
    slots: BTreeMap<Vec<u8>, Slot>,
    /// Which identity each client holds or waits on.
    clients: BTreeMap<u64, Vec<u8>>,
    /// The failed queued miss recorded for each client: its address and the error.
    failed: BTreeMap<u64, (Vec<u8>, Outcome)>,
}

/// What the counters must read once every removal has run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Live entries.
    pub entries: u64,
    /// Clients registered on a live entry.
    pub clients: u64,
}

impl World {
    /// Whether the removal awaiting `identity` may already have run.
    fn maybe_removed(&self, identity: &[u8], now: &Now) -> bool {
        self.slots
            .get(identity)
            .and_then(|slot| slot.removing.as_ref())
            .is_some_and(|removal| removal.may_run(now))
    }

    /// This world, and, if the removal awaiting `identity` may have run, the world where it has.
    fn branch_on(&self, identity: &[u8], now: &Now) -> Vec<World> {
        let mut worlds = vec![self.clone()];
        if self.maybe_removed(identity, now) {
            let mut removed = self.clone();
            removed.removal_ran(identity);
            worlds.push(removed);
        }
        worlds
    }

    /// The removal awaiting `identity` ran: the parked incarnation, if any, enters the AV.
    fn removal_ran(&mut self, identity: &[u8]) {
        let Some(slot) = self.slots.get_mut(identity) else {
            return;
        };
        if slot.removing.take().is_none() {
            return;
        }
        if let Some(parked) = slot.parked.take() {
            slot.live = Some(Live {
                address: parked.address,
                fi_addr: None,
                clients: parked.clients,
            });
        }
        self.tidy(identity);
    }

    fn tidy(&mut self, identity: &[u8]) {
        if self.slots.get(identity).is_some_and(Slot::is_empty) {
            self.slots.remove(identity);
        }
    }

    /// Live entries and entries awaiting removal: the real count lies between these bounds,
    /// because a maybe-removal without a parked successor may already have freed its place.
    fn occupied(&self, now: &Now) -> (usize, usize) {
        let live = self
            .slots
            .values()
            .filter(|slot| slot.live.is_some())
            .count();
        let pending = self
            .slots
            .values()
            .filter(|slot| slot.removing.is_some())
            .count();
        let may_be_gone = self
            .slots
            .values()
            .filter(|slot| {
                slot.parked.is_none()
                    && slot
                        .removing
                        .as_ref()
                        .is_some_and(|removal| removal.may_run(now))
            })
            .count();
        (live + pending - may_be_gone, live + pending)
    }

    /// Whether `client` is registered on the live entry holding exactly `address`: an index hit.
    fn hit(&self, client: u64, identity: &[u8], address: &[u8]) -> Option<Option<u64>> {
        if self.clients.get(&client).map(Vec::as_slice) != Some(identity) {
            return None;
        }
        let live = self.slots.get(identity)?.live.as_ref()?;
        (live.address == address && live.clients.contains(&client)).then_some(live.fi_addr)
    }

    /// Whether `client` waits on the parked incarnation `address`.
    fn waits(&self, client: u64, identity: &[u8], address: &[u8]) -> bool {
        self.clients.get(&client).map(Vec::as_slice) == Some(identity)
            && self
                .slots
                .get(identity)
                .and_then(|slot| slot.parked.as_ref())
                .is_some_and(|parked| parked.address == address && parked.clients.contains(&client))
    }

    /// An index probe by `client`: `Some(fi_addr)` on a hit, in each world the timing allows.
    pub fn probe(
        &self,
        rules: &Rules,
        now: &Now,
        client: u64,
        address: &[u8],
    ) -> Vec<(Option<Option<u64>>, World)> {
        let Some(identity) = rules.identity(address) else {
            return vec![(None, self.clone())];
        };
        self.branch_on(&identity, now)
            .into_iter()
            .map(|world| (world.hit(client, &identity, address), world))
            .collect()
    }

    /// The writer's resolve of `client` on a checked `address`, with every outcome the timing
    /// allows. The address's length has already been checked by the caller.
    pub fn resolve(
        &self,
        rules: &Rules,
        now: &Now,
        client: u64,
        address: &[u8],
    ) -> Vec<(Outcome, World)> {
        let Some(identity) = rules.identity(address) else {
            return vec![(Outcome::InvalidAddress, self.clone())];
        };
        // The client's old registration goes too, so the removal pending on its old identity
        // matters as well: if it has run, the client may hold a parked incarnation let in since.
        let mut worlds = self.branch_on(&identity, now);
        if let Some(old) = self.clients.get(&client).filter(|old| **old != identity) {
            worlds = worlds
                .iter()
                .flat_map(|world| world.branch_on(old, now))
                .collect();
        }
        let mut outcomes = Vec::new();
        for mut world in worlds {
            if let Some(fi_addr) = world.hit(client, &identity, address) {
                // An index hit: the writer hears nothing of it.
                outcomes.push((Outcome::Ok(fi_addr), world));
                continue;
            }
            // A resolve that reaches the writer drops the client's failure record.
            world.failed.remove(&client);
            world.resolve_now(rules, now, client, &identity, address, &mut outcomes);
        }
        outcomes
    }

    /// A queued miss (`try_resolve`) of `client` on a checked `address`, which the index did not
    /// hit: the recorded failure of an earlier one, taken, or else the writer's resolve, whose
    /// failure is recorded. Each world the timing allows, with the answer `try_resolve` gives.
    pub fn queued_miss(
        &self,
        rules: &Rules,
        now: &Now,
        client: u64,
        address: &[u8],
    ) -> Vec<(Outcome, World)> {
        if let Some((recorded, error)) = self.failed.get(&client) {
            if recorded.as_slice() == address {
                let mut world = self.clone();
                world.failed.remove(&client);
                return vec![(*error, world)];
            }
        }
        self.resolve(rules, now, client, address)
            .into_iter()
            .map(|(outcome, mut world)| {
                if let Outcome::Capacity | Outcome::Fabric = outcome {
                    world.failed.insert(client, (address.to_vec(), outcome));
                }
                (Outcome::WouldBlock, world)
            })
            .collect()
    }

    fn resolve_now(
        &self,
        rules: &Rules,
        now: &Now,
        client: u64,
        identity: &[u8],
        address: &[u8],
        outcomes: &mut Vec<(Outcome, World)>,
    ) {
        if let Some(fi_addr) = self.hit(client, identity, address) {
            outcomes.push((Outcome::Ok(fi_addr), self.clone()));
            return;
        }
        if self.waits(client, identity, address) {
            outcomes.push((Outcome::WouldBlock, self.clone()));
            return;
        }
        if !self.slots.contains_key(identity) {
            // A brand-new identity: capacity first, then the insert, then the client's old
            // registration goes.
            let (least, most) = self.occupied(now);
            if most >= rules.capacity {
                outcomes.push((Outcome::Capacity, self.clone()));
            }
            if least >= rules.capacity {
                return;
            }
            let acceptance = (rules.acceptance)(address);
            if Acceptance::Accept != acceptance {
                outcomes.push((Outcome::Fabric, self.clone()));
            }
            if Acceptance::Reject == acceptance {
                return;
            }
            let mut world = self.clone();
            world.detach(client, now);
            let mut clients = BTreeSet::new();
            clients.insert(client);
            world.slots.insert(
                identity.to_vec(),
                Slot {
                    live: Some(Live {
                        address: address.to_vec(),
                        fi_addr: None,
                        clients,
                    }),
                    ..Slot::default()
                },
            );
            world.clients.insert(client, identity.to_vec());
            outcomes.push((Outcome::Ok(None), world));
            return;
        }
        let mut world = self.clone();
        world.detach(client, now);
        let outcome = world.join(now, client, identity, address);
        outcomes.push((outcome, world));
    }

    /// Register `client` on an identity that has a slot.
    fn join(&mut self, now: &Now, client: u64, identity: &[u8], address: &[u8]) -> Outcome {
        let Some(slot) = self.slots.get_mut(identity) else {
            // Detaching never drops a slot with a live entry or a removal.
            return Outcome::WouldBlock;
        };
        if let Some(live) = &mut slot.live {
            if live.address == address {
                live.clients.insert(client);
                let fi_addr = live.fi_addr;
                self.clients.insert(client, identity.to_vec());
                return Outcome::Ok(fi_addr);
            }
            // A new incarnation: the old one and every client on it are evicted.
            if let Some(live) = slot.live.take() {
                for holder in &live.clients {
                    self.clients.remove(holder);
                }
                self.retire(identity, live.address, live.fi_addr, now);
            }
            self.park(client, identity, address);
            return Outcome::WouldBlock;
        }
        let revivable = slot
            .removing
            .as_ref()
            .is_some_and(|removal| removal.address == address);
        if revivable {
            if let Some(parked) = slot.parked.take() {
                for waiter in &parked.clients {
                    self.clients.remove(waiter);
                }
            }
            if let Some(slot) = self.slots.get_mut(identity) {
                if let Some(removal) = slot.removing.take() {
                    let mut clients = BTreeSet::new();
                    clients.insert(client);
                    let fi_addr = removal.fi_addr;
                    slot.live = Some(Live {
                        address: removal.address,
                        fi_addr,
                        clients,
                    });
                    self.clients.insert(client, identity.to_vec());
                    return Outcome::Ok(fi_addr);
                }
            }
        }
        self.park(client, identity, address);
        Outcome::WouldBlock
    }

    fn park(&mut self, client: u64, identity: &[u8], address: &[u8]) {
        let Some(slot) = self.slots.get_mut(identity) else {
            return;
        };
        if slot
            .parked
            .as_ref()
            .is_some_and(|parked| parked.address != address)
        {
            if let Some(parked) = slot.parked.take() {
                for waiter in &parked.clients {
                    self.clients.remove(waiter);
                }
            }
        }
        if let Some(slot) = self.slots.get_mut(identity) {
            slot.parked
                .get_or_insert_with(|| Parked {
                    address: address.to_vec(),
                    clients: BTreeSet::new(),
                })
                .clients
                .insert(client);
            self.clients.insert(client, identity.to_vec());
        }
    }

    fn retire(&mut self, identity: &[u8], address: Vec<u8>, fi_addr: Option<u64>, now: &Now) {
        if let Some(slot) = self.slots.get_mut(identity) {
            slot.removing = Some(Removal {
                address,
                fi_addr,
                holders: now.pins.clone(),
                tainted: now.failing,
            });
        }
    }

    /// Let go of whatever `client` holds or waits on.
    fn detach(&mut self, client: u64, now: &Now) {
        let Some(identity) = self.clients.remove(&client) else {
            return;
        };
        let Some(slot) = self.slots.get_mut(&identity) else {
            return;
        };
        let mut retired = None;
        if let Some(live) = &mut slot.live {
            if live.clients.remove(&client) && live.clients.is_empty() {
                retired = slot.live.take();
            }
        } else if let Some(parked) = &mut slot.parked {
            if parked.clients.remove(&client) && parked.clients.is_empty() {
                slot.parked = None;
            }
        }
        if let Some(live) = retired {
            self.retire(&identity, live.address, live.fi_addr, now);
        }
        self.tidy(&identity);
    }

    /// `release(client)`, in each world the timing allows.
    pub fn release(&self, now: &Now, client: u64) -> Vec<World> {
        let mut world = self.clone();
        world.failed.remove(&client);
        let Some(identity) = world.clients.get(&client).cloned() else {
            return vec![world];
        };
        world
            .branch_on(&identity, now)
            .into_iter()
            .map(|mut world| {
                world.detach(client, now);
                world
            })
            .collect()
    }

    /// `quiesce()` with no pin alive: every removal that may run has run, except that a tainted
    /// one may still wait for its retry (each world it allows), unless `patient`: the caller
    /// waited out every retry.
    pub fn settle(&self, now: &Now, patient: bool) -> Vec<World> {
        let mut worlds = vec![self.clone()];
        for (identity, slot) in &self.slots {
            let Some(removal) = slot
                .removing
                .as_ref()
                .filter(|removal| removal.may_run(now))
            else {
                continue;
            };
            let waits = removal.tainted && !patient;
            worlds = worlds
                .into_iter()
                .flat_map(|world| {
                    let mut ran = world.clone();
                    ran.removal_ran(identity);
                    if waits { vec![world, ran] } else { vec![ran] }
                })
                .collect();
        }
        worlds
    }

    /// Every removal starts failing: each one that may have run may have done so before, and
    /// every one left may fail from now on.
    pub fn fail_removes(&self, now: &Now) -> Vec<World> {
        let mut worlds = vec![self.clone()];
        for (identity, slot) in &self.slots {
            if slot
                .removing
                .as_ref()
                .is_some_and(|removal| removal.may_run(now))
            {
                worlds = worlds
                    .into_iter()
                    .flat_map(|world| {
                        let mut ran = world.clone();
                        ran.removal_ran(identity);
                        [world, ran]
                    })
                    .collect();
            }
        }
        for world in &mut worlds {
            for slot in world.slots.values_mut() {
                if let Some(removal) = &mut slot.removing {
                    removal.tainted = true;
                }
            }
        }
        worlds
    }

    /// `client`, parked on `address`, was let in (`AddressCache::lease` waited for it): the
    /// removal it waited for ran. False when that cannot be.
    pub fn admit_parked(
        &mut self,
        identity: &[u8],
        address: &[u8],
        now: &Now,
        client: u64,
    ) -> bool {
        if !self.waits(client, identity, address) || !self.maybe_removed(identity, now) {
            return false;
        }
        self.removal_ran(identity);
        true
    }

    /// Whether a removal may still run at any moment (a tainted one's retry): the cache's
    /// counters may change under the harness.
    pub fn unsettled(&self, now: &Now) -> bool {
        self.slots
            .values()
            .filter_map(|slot| slot.removing.as_ref())
            .any(|removal| removal.may_run(now))
    }

    /// Removals pending.
    pub fn pending(&self) -> u64 {
        self.slots
            .values()
            .filter(|slot| slot.removing.is_some())
            .count() as u64
    }

    /// Removals pending that a lease of the harness holds.
    pub fn awaiting_leases(&self, now: &Now) -> u64 {
        self.slots
            .values()
            .filter_map(|slot| slot.removing.as_ref())
            .filter(|removal| removal.leased(now))
            .count() as u64
    }

    /// Learn the `fi_addr_t` the real cache answered for `client` on `address`. False when it
    /// cannot be right in this world: another entry still in the AV (live, or awaiting a removal
    /// that certainly has not run) already has it.
    pub fn learn(&mut self, now: &Now, identity: &[u8], address: &[u8], fi_addr: u64) -> bool {
        let taken = self.slots.iter().any(|(other, slot)| {
            other.as_slice() != identity
                && (slot.live.as_ref().and_then(|live| live.fi_addr) == Some(fi_addr)
                    || slot.removing.as_ref().is_some_and(|removal| {
                        removal.fi_addr == Some(fi_addr) && !removal.may_run(now)
                    }))
        });
        if taken {
            return false;
        }
        match self
            .slots
            .get_mut(identity)
            .and_then(|slot| slot.live.as_mut())
        {
            Some(live) if live.address == address => match live.fi_addr {
                Some(known) => known == fi_addr,
                None => {
                    live.fi_addr = Some(fi_addr);
                    true
                }
            },
            // An answer for an entry the world does not hold live.
            _ => false,
        }
    }

    /// The counters once every removal that may run has run (call after
    /// [`settle`](Self::settle)).
    pub fn settled(&self) -> Settled {
        let live = self.slots.values().filter_map(|slot| slot.live.as_ref());
        Settled {
            entries: live.clone().count() as u64,
            clients: live.map(|live| live.clients.len() as u64).sum(),
        }
    }

    /// Every live entry whose `fi_addr_t` is known, with its address.
    pub fn live_entries(&self) -> Vec<(u64, Vec<u8>)> {
        self.slots
            .values()
            .filter_map(|slot| slot.live.as_ref())
            .filter_map(|live| live.fi_addr.map(|fi_addr| (fi_addr, live.address.clone())))
            .collect()
    }

    /// Every client the world knows of, holding or waiting.
    pub fn clients(&self) -> impl Iterator<Item = u64> + '_ {
        self.clients.keys().copied()
    }

    /// Whether nothing is held, awaited or parked.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty() && self.clients.is_empty()
    }
}

/// The set of worlds the cache may be in. See the module docs.
#[derive(Debug, Clone)]
pub struct Worlds {
    worlds: Vec<World>,
}

/// More worlds than this and the oracle stops predicting for the rest of the input (it goes on
/// checking the invariants). Inputs are short, so this is not reached in practice.
pub const MAX_WORLDS: usize = 512;

impl Default for Worlds {
    fn default() -> Self {
        Self {
            worlds: vec![World::default()],
        }
    }
}

impl Worlds {
    /// Replace the set by `worlds`, without duplicates.
    pub fn replace(&mut self, mut worlds: Vec<World>) {
        worlds.sort();
        worlds.dedup();
        self.worlds = worlds;
    }

    /// The worlds.
    pub fn iter(&self) -> impl Iterator<Item = &World> {
        self.worlds.iter()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.worlds.len()
    }

    /// Whether no world is left: the cache did something no timing explains.
    pub fn is_empty(&self) -> bool {
        self.worlds.is_empty()
    }
}
