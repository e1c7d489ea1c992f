//! The index that ships: registrations in a papaya map, one table at a time. What [`PapayaIndex`] guarantees a reader beyond
//! [`RegistrationIndex`]'s contract: its guard's memory stays bounded, and so does the index's
//! own across a peak of registrations.
//!
//! A reader's guard lives as long as its pin, so a hit does not pay papaya's enter and leave (an
//! atomic swap) per probe. What keeps that bounded: the index counts the writer's changes
//! (`PapayaIndex::retirements`, bumped after every publish, unlink and replacement, alone on its
//! cache line), and a probe that sees the count moved refreshes its guard first, letting go of
//! every node retired since its last refresh. A pin that stops probing holds what is retired
//! until its next probe (`tests/soak.rs` measures it).
//!
//! The writer replaces the table once it has emptied to an eighth of what it grew to
//! ([`RegistrationIndex::shrink`]), so the index's memory follows the registrations, not their
//! peak: after every client is released it is back to the table the AV's capacity asked for. A
//! reader keeps the table it probes with its guard and moves to the new one when the count moved;
//! the old one is freed once every reader pinned at the replacement has unpinned (see
//! [`PapayaIndex`]). Bounded: one table of fewer than three slots a registration (the writer
//! doubles it at 70% full, `GROW_AT_TENTHS`) or the capacity's, the table it outgrew handed to
//! reclamation as it grows, and at most one replaced table waiting for its readers; a
//! registration's node holds the client, the entry's index and its address (56 bytes).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use super::{Registration, RegistrationIndex};
use crate::cache::epoch::EpochPin;
use crate::cache::stored::StoredAddress;
use dma_libfabric_sys::fi_addr_t;

/// The hasher: foldhash, seeded per map. A lookup hashes one `u64`, where SipHash would cost
/// more than the probe.
pub(crate) type IndexHasher = foldhash::fast::RandomState;

/// One table of registrations: a papaya map, and what the writer knows of its size.
struct Table {
    map: papaya::HashMap<u64, Registration, IndexHasher>,
    /// Which of the index's two collectors the map reclaims through.
    collector: usize,
    /// How many registrations it holds, and the most it has held (at least what it was built
    /// for): the writer's alone, relaxed.
    live: AtomicUsize,
    grown_to: AtomicUsize,
    /// How many slots papaya's table has, as the writer grows it (`GROW_AT_TENTHS`): the writer's
    /// alone, relaxed.
    slots: AtomicUsize,
}

/// The slots papaya gives a table built or reserved for `entries` (its `probe::entries_for`).
fn slots_for(entries: usize) -> usize {
    (entries.saturating_mul(8) / 6).next_power_of_two()
}

/// The writer doubles the table once it is this full (in tenths). papaya grows a table itself
/// only when an insert probes past its limit (5 × log2 of its slots), at a load that depends on
/// the hash seed, "rarely before 75%" (its docs), and retires the old one into the inserting
/// thread's seize batch, where it stays until the batch fills, so a retired table's memory
/// depends on the seed and on other threads' batches (figures:
/// `docs/benchmarks.md`, "Figures moved out of the module docs"). A growth the writer makes
/// itself, before papaya's, is one it knows of, so it hands the old table to reclamation at
/// once.
const GROW_AT_TENTHS: usize = 7;

impl Table {
    fn new(capacity: usize, collector: usize, collectors: &[Arc<seize::Collector>; 2]) -> Self {
        let map = papaya::HashMap::builder()
            .hasher(IndexHasher::default())
            .capacity(capacity)
            .resize_mode(papaya::ResizeMode::Blocking)
            .shared_collector(Arc::clone(&collectors[collector]))
            .build();
        Self {
            map,
            collector,
            live: AtomicUsize::new(0),
            grown_to: AtomicUsize::new(capacity),
            slots: AtomicUsize::new(slots_for(capacity)),
        }
    }
}

/// The concurrent index: a papaya map, pre-sized to the AV's capacity so the hot path meets no
/// resize in steady state, which the writer replaces with a fresh one once it has emptied well
/// below what it grew to (papaya's table never shrinks by itself but on an insert that finds it
/// full of tombstones).
///
/// Readers reach the table through [`current`](Self::current), under their epoch pin; a replaced
/// table waits, in `retired`, for a deferral on the cache's epoch collector deferred after its
/// replacement, and is freed by the writer once that deferral has returned: every reader that
/// could have loaded it has unpinned by then, and each reader drops its guard on the table
/// before its pin. At most one replaced table waits at a time.
///
/// The tables reclaim through two seize collectors the index owns, used in turn: a thread that
/// enters a collector registers there once (an allocation), so alternating between two keeps the
/// first probe after a replacement allocation-free once a thread has met both. A table's drop
/// reclaims everything its collector holds, which is sound because no guard of that collector
/// is alive then: the readers of the replaced table have gone, and the table that replaced it
/// uses the other collector.
pub(crate) struct PapayaIndex {
    /// The table readers probe: a leaked `Box<Table>`, replaced by the writer alone.
    current: AtomicPtr<Table>,
    /// See [`retirements`](Self::retirements). On a line of its own: the writer bumps it on every
    /// change, and readers load it on every probe.
    retirements: Padded<AtomicU64>,
    /// A replaced table waiting for its readers (a leaked `Box<Table>`, or null), and whether the
    /// outstanding deferral covers it. The writer's alone.
    retired: AtomicPtr<Table>,
    covered: AtomicBool,
    /// What every table is built for at least: the AV's capacity.
    presized: usize,
    collectors: [Arc<seize::Collector>; 2],
    /// See [`RegistrationIndex::replacements`]: the writer's alone, read by tests.
    replacements: AtomicU64,
}

/// A value alone on its cache line (128 bytes: a pair of lines, as the adjacent-line prefetcher
/// fetches them), so the writer's stores to it do not take the line of what readers load.
#[repr(align(128))]
struct Padded<T>(T);

/// What a reader keeps between probes: the retirement count it last saw, the table it probes
/// (null before its first probe) and its guard on that table's collector.
pub(crate) struct PapayaReader<'a> {
    seen: u64,
    table: *const Table,
    guard: Option<papaya::LocalGuard<'a>>,
}

impl PapayaIndex {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let collectors = [
            Arc::new(seize::Collector::new()),
            Arc::new(seize::Collector::new()),
        ];
        let table = Box::new(Table::new(capacity, 0, &collectors));
        Self {
            current: AtomicPtr::new(Box::into_raw(table)),
            retirements: Padded(AtomicU64::new(0)),
            retired: AtomicPtr::new(std::ptr::null_mut()),
            covered: AtomicBool::new(false),
            presized: capacity,
            collectors,
            replacements: AtomicU64::new(0),
        }
    }

    /// The table the writer changes. Writer only (or under a pin: see [`Self::pinned`]).
    fn table(&self) -> &Table {
        // SAFETY: `current` always holds a leaked `Box<Table>`, replaced only by the writer, which
        // frees the old one after a deferral returns. The writer calls this itself (so nothing
        // frees the table while it uses it); readers call it under their epoch pin (`pinned`).
        unsafe { &*self.current.load(Ordering::Acquire) }
    }

    /// The table readers probe now, for a caller pinned on the cache's epoch.
    fn pinned<'p>(&'p self, _pinned: &'p EpochPin) -> &'p Table {
        self.table()
    }

    /// How many times the writer has changed the index in a way that may retire index memory
    /// (an unlink, a publish, which may replace a node or resize the table, a replaced table): a
    /// reader that holds its guard across probes refreshes it when this moved. Relaxed: it only
    /// says when to let go of memory, never what a probe may see (that is the table pointer's
    /// `Acquire`, and the epoch's).
    #[inline]
    fn retirements(&self) -> u64 {
        self.retirements.0.load(Ordering::Relaxed)
    }

    fn retired(&self) {
        self.retirements.0.fetch_add(1, Ordering::Release);
    }
}

impl RegistrationIndex for PapayaIndex {
    type Reader<'a> = PapayaReader<'a>;

    fn reader(&self) -> Self::Reader<'_> {
        PapayaReader {
            // Never the count: the first probe takes the table and a guard.
            seen: u64::MAX,
            table: std::ptr::null(),
            guard: None,
        }
    }

    #[inline]
    unsafe fn probe<'a>(
        &'a self,
        reader: &mut Self::Reader<'a>,
        client: u64,
        address: &[u8],
    ) -> Option<fi_addr_t> {
        let retirements = self.retirements();
        if reader.seen != retirements {
            reader.seen = retirements;
            let current = self.current.load(Ordering::Acquire);
            if !std::ptr::eq(current, reader.table) {
                // Leave the old table's collector before entering the new one's.
                reader.guard = None;
                reader.table = current;
                // SAFETY: the caller is pinned (this function's contract), so the table the
                // writer published cannot be freed before this reader is dropped.
                let collector = unsafe { (*current).collector };
                reader.guard = Some(self.collectors[collector].enter());
            } else if let Some(guard) = &mut reader.guard {
                papaya::Guard::refresh(guard);
            }
        }
        let guard = reader.guard.as_ref()?;
        // SAFETY: `reader.table` was loaded from `current` under the caller's pin, which lives
        // as long as `reader` (this function's contract), and the writer frees a replaced table
        // only once every reader pinned at its replacement has unpinned.
        let table = unsafe { &*reader.table };
        // The registration is the node's value: the address is compared where papaya's probe
        // left it, and the index read beside it.
        table.map.get(&client, guard)?.confirm(address)
    }

    fn registered(&self, client: u64) -> Option<fi_addr_t> {
        let table = self.table();
        table
            .map
            .get(&client, &table.map.guard())
            .map(Registration::fi_addr)
    }

    fn publish(&self, client: u64, fi_addr: fi_addr_t, address: &StoredAddress) {
        let table = self.table();
        let guard = table.map.guard();
        let registration = Registration::new(fi_addr, address);
        if table.map.insert(client, registration, &guard).is_none() {
            let live = table.live.load(Ordering::Relaxed) + 1;
            table.live.store(live, Ordering::Relaxed);
            if table.grown_to.load(Ordering::Relaxed) < live {
                table.grown_to.store(live, Ordering::Relaxed);
            }
            let slots = table.slots.load(Ordering::Relaxed);
            if live.saturating_mul(10) >= slots.saturating_mul(GROW_AT_TENTHS) {
                // Double the table now (a blocking copy, as papaya's own growth is in this
                // build), and hand the old one to reclamation at once rather than leave it in
                // this thread's batch until the batch fills: the tables outgrown cost nothing
                // once readers have moved on. Once per doubling: a flush is a `membarrier`. If
                // papaya grew the table itself first, the reserve finds room and does nothing,
                // and the flush hands over the table papaya retired.
                let doubled = slots.saturating_mul(2);
                // papaya reserves `slots_for(len + additional)`: exactly `doubled` for this.
                let entries = doubled / 8 * 6;
                table.map.reserve(entries.saturating_sub(live), &guard);
                table.slots.store(doubled, Ordering::Relaxed);
                papaya::Guard::flush(&guard);
            }
        }
        drop(guard);
        self.retired();
    }

    fn unlink(&self, client: u64) -> Option<fi_addr_t> {
        let table = self.table();
        let guard = table.map.guard();
        let unlinked = table.map.remove(&client, &guard).map(Registration::fi_addr);
        if unlinked.is_some() {
            let live = table.live.load(Ordering::Relaxed).saturating_sub(1);
            table.live.store(live, Ordering::Relaxed);
            if live == 0 {
                // The writer's batch of retired nodes (a replaced papaya table among them) waits
                // in seize until it fills; an empty index hands it over now, so a quiesced empty
                // cache holds none of it once its readers have left. Only then: a flush is a
                // `membarrier`.
                papaya::Guard::flush(&guard);
            }
            drop(guard);
            // Only a removal retires a node: a client that had no registration leaves the
            // readers' guards alone.
            self.retired();
        }
        unlinked
    }

    fn len(&self, pinned: &EpochPin) -> usize {
        self.pinned(pinned).map.len()
    }

    fn clients_at(&self, pinned: &EpochPin, fi_addr: fi_addr_t) -> Vec<u64> {
        let map = &self.pinned(pinned).map;
        let guard = map.guard();
        map.iter(&guard)
            .filter(|(_, registration)| fi_addr == registration.fi_addr())
            .map(|(&client, _)| client)
            .collect()
    }

    fn shrink(&self) -> bool {
        let old = self.table();
        let (live, grown_to) = (
            old.live.load(Ordering::Relaxed),
            old.grown_to.load(Ordering::Relaxed),
        );
        let roomy = grown_to > self.presized && live <= grown_to / 8;
        if !roomy || !self.retired.load(Ordering::Relaxed).is_null() {
            return false;
        }
        let fresh = Table::new(
            self.presized.max(2 * live),
            1 - old.collector,
            &self.collectors,
        );
        {
            let (from, to) = (old.map.guard(), fresh.map.guard());
            for (&client, registration) in old.map.iter(&from) {
                fresh.map.insert(client, registration.clone(), &to);
            }
        }
        fresh.live.store(live, Ordering::Relaxed);
        let old = self
            .current
            .swap(Box::into_raw(Box::new(fresh)), Ordering::AcqRel);
        self.retired.store(old, Ordering::Relaxed);
        self.covered.store(false, Ordering::Relaxed);
        self.retired();
        self.replacements.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn retired_uncovered(&self) -> bool {
        !self.retired.load(Ordering::Relaxed).is_null() && !self.covered.load(Ordering::Relaxed)
    }

    fn cover_retired(&self) {
        if !self.retired.load(Ordering::Relaxed).is_null() {
            self.covered.store(true, Ordering::Relaxed);
        }
    }

    fn readers_gone(&self) {
        if !self.covered.swap(false, Ordering::Relaxed) {
            return;
        }
        let retired = self.retired.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if !retired.is_null() {
            // SAFETY: `retired` is the leaked `Box<Table>` the writer replaced; the deferral that
            // covered it was deferred after the replacement and has returned, so every reader
            // that could have loaded it has unpinned, and dropped its guard on it before that.
            // The table that replaced it reclaims through the other collector, so no guard of
            // this one's is alive while its drop reclaims everything the collector holds.
            drop(unsafe { Box::from_raw(retired) });
        }
    }

    fn holds_retired(&self) -> bool {
        !self.retired.load(Ordering::Relaxed).is_null()
    }

    #[cfg(feature = "model")]
    fn replacements(&self) -> u64 {
        self.replacements.load(Ordering::Relaxed)
    }
}

impl Drop for PapayaIndex {
    fn drop(&mut self) {
        for table in [*self.current.get_mut(), *self.retired.get_mut()] {
            if !table.is_null() {
                // SAFETY: both are leaked `Box<Table>`s the index owns; the index is being
                // dropped, so no reader and no writer is left (every pin borrows the cache).
                drop(unsafe { Box::from_raw(table) });
            }
        }
    }
}
