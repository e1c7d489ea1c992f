//! The published index readers probe: one registration per client, mapping it to the AV index of
//! the entry it holds, and the address of every entry, by index.
//!
//! A hit is one probe of the map by the client id (a `u64`: the cheapest key to hash), then a
//! compare of the probe's whole address with the address of the entry the client is registered
//! on, read from a per-entry array the writer fills when it installs the entry. So a registration
//! is found only for a client the writer registered on that very address, and a new QKEY on a
//! known efa slot, or a client that was evicted, is a miss that goes to the writer. A client is
//! registered on at most one entry (the writer's invariant), which is what lets the client alone
//! be the key: a map node is 16 bytes (client and index), where a node that carried the address
//! it confirms would be 56.
//!
//! Only the writer inserts and removes; readers only probe. The writer also reads it, to find
//! the entry a published client holds (`registered`, and what `unlink` took out): the index
//! stands in for a writer-side map of every client, which cost 16 B a client and its slack.
//! papaya's own reclamation (seize) keeps a node alive while a reader's guard may still see it,
//! so a reader may read a node the writer has just unlinked. That is memory safety only:
//! whether the *fi_addr_t* in it is still in the AV is the epoch deferral's business (see the
//! `cache` module), and so is the address slot it reads: the writer rewrites an index's slot
//! only for a new entry at that index, after the old one's `fi_av_remove`, which waited for
//! every reader that could have found it.
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
//! reclamation as it grows, at most one replaced table waiting for its readers, and the address
//! slots, one per AV index (40 bytes each, allocated with the cache).

#[cfg(not(dma_loom))]
use std::cell::UnsafeCell;
#[cfg(not(dma_loom))]
use std::sync::Arc;
#[cfg(not(dma_loom))]
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use super::epoch::EpochPin;
use super::stored::StoredAddress;
use dma_libfabric_sys::fi_addr_t;

/// The hasher: foldhash, seeded per map. A lookup hashes one `u64`, where SipHash would cost
/// more than the probe.
#[cfg(not(dma_loom))]
pub(crate) type IndexHasher = foldhash::fast::RandomState;

/// Whether `a` and `b` hold the same bytes: as one fixed-size compare for the lengths addresses
/// have (a `sockaddr_in`'s 16, efa's 32), which the compiler inlines, instead of a call to
/// `memcmp`; a slice compare otherwise.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    match (<&[u8; 16]>::try_from(a), <&[u8; 16]>::try_from(b)) {
        (Ok(a), Ok(b)) => return a == b,
        (Err(_), Err(_)) => {}
        _ => return false,
    }
    match (<&[u8; 32]>::try_from(a), <&[u8; 32]>::try_from(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// What the cache needs of its index: readers probe under a pin, the writer alone publishes,
/// unlinks and replaces. Two implementations: papaya in the build that ships, and a locked map
/// under loom, which cannot see papaya's per-thread reclamation state. The protocol's proof needs
/// only that a probe after an unlink (in the writer's program order, ordered by the epoch fences)
/// misses, which both give.
pub(crate) trait RegistrationIndex: Send + Sync {
    /// What a reader keeps between its probes: the table it probes and its guard on that table's
    /// memory. Dropped before the epoch pin it was used under.
    type Reader<'a>
    where
        Self: 'a;
    /// A reader that has not probed yet.
    fn reader(&self) -> Self::Reader<'_>;
    /// The entry `client` is registered on for exactly `address`, whose first `identity_len`
    /// bytes are its identity, as `reader` sees the index: when the writer has changed it since
    /// `reader`'s last probe, `reader` first lets go of what was retired meanwhile (which may
    /// reclaim it on this thread) and moves to the table readers probe now.
    ///
    /// # Safety
    /// The calling thread is pinned on the cache's epoch collector, and stays pinned until
    /// `reader` is dropped: a table the writer replaced is freed only once every reader pinned
    /// at its replacement has unpinned.
    unsafe fn probe<'a>(
        &'a self,
        reader: &mut Self::Reader<'a>,
        client: u64,
        address: &[u8],
    ) -> Option<fi_addr_t>;
    /// Record `address` as the address of the entry at `fi_addr`, before any registration on it
    /// is published. Writer only, for an entry it has just inserted: no reader can read the slot
    /// of an index the AV has just handed out (its previous entry's readers are gone).
    fn install(&self, fi_addr: fi_addr_t, address: &StoredAddress);
    /// The entry `client`'s published registration names, if it has one. Writer only: the
    /// writer reads its own writes (papaya is linearizable), so this is where it finds a
    /// registered client's entry, with no map of its own beside the index.
    fn registered(&self, client: u64) -> Option<fi_addr_t>;
    /// Publish `client`'s registration on the entry at `fi_addr`, whose address is installed.
    /// Writer only.
    fn publish(&self, client: u64, fi_addr: fi_addr_t);
    /// Unlink `client`'s registration; the entry it named, if it had one. Writer only. Unlinking
    /// a client with no registration changes nothing (readers are not told to refresh).
    fn unlink(&self, client: u64) -> Option<fi_addr_t>;
    /// How many registrations are published; `pinned` keeps the table read alive.
    fn len(&self, pinned: &EpochPin) -> usize;
    /// The clients registered on index `fi_addr`, in no order: a scan of every registration
    /// (bounded by the AV's capacity times its clients), for the cold path only; `pinned` keeps
    /// the table read alive.
    fn clients_at(&self, pinned: &EpochPin, fi_addr: fi_addr_t) -> Vec<u64>;
    /// If the table has emptied well below what it grew to (to an eighth) and no replaced table
    /// still waits for its readers, replace it with a fresh one sized for what is left (at least
    /// the capacity it was built with), so the index's memory follows the registrations rather
    /// than their peak. Whether it did. Writer only: the caller then defers the old table's
    /// release ([`cover_retired`](Self::cover_retired)).
    fn shrink(&self) -> bool;
    /// Whether a replaced table waits for a deferral to cover it.
    fn retired_uncovered(&self) -> bool;
    /// The deferral just deferred covers the replaced table: every reader that could still probe
    /// it was pinned before that deferral. Writer only.
    fn cover_retired(&self);
    /// The deferral that covered the replaced table has returned: free it. Writer only.
    fn readers_gone(&self);
    /// Whether a replaced table is still held for its readers.
    fn holds_retired(&self) -> bool;
    /// How many times the table has been replaced (a test hook: feature `model`).
    #[cfg(feature = "model")]
    fn replacements(&self) -> u64;
}

/// The index the cache uses in this build.
#[cfg(not(dma_loom))]
pub(crate) type Index = PapayaIndex;
/// The index the cache uses in this build.
#[cfg(dma_loom)]
pub(crate) type Index = LockedIndex;

/// One table of registrations: a papaya map, and what the writer knows of its size.
#[cfg(not(dma_loom))]
struct Table {
    map: papaya::HashMap<u64, fi_addr_t, IndexHasher>,
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
#[cfg(not(dma_loom))]
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
#[cfg(not(dma_loom))]
const GROW_AT_TENTHS: usize = 7;

#[cfg(not(dma_loom))]
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
#[cfg(not(dma_loom))]
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
    /// The address of the entry at each AV index below the capacity: what a hit compares the
    /// probe's address with.
    addresses: Box<[AddressSlot]>,
}

/// The address of the entry at one AV index.
#[cfg(not(dma_loom))]
struct AddressSlot(UnsafeCell<StoredAddress>);

// SAFETY: the writer alone writes a slot, and only in `install`, for an index the AV has just
// handed out: the entry that held it before was removed after every reader that could have
// found a registration on it unpinned, and no registration on the new entry is published yet,
// so no reader reads the slot while it is written. A reader reads a slot only at the index of a
// registration it found under its pin; the publish of that registration (papaya's insert,
// `Release`, paired with its `get`'s `Acquire`) orders the slot's write before the read.
#[cfg(not(dma_loom))]
unsafe impl Sync for AddressSlot {}

/// A value alone on its cache line (128 bytes: a pair of lines, as the adjacent-line prefetcher
/// fetches them), so the writer's stores to it do not take the line of what readers load.
#[cfg(not(dma_loom))]
#[repr(align(128))]
struct Padded<T>(T);

/// What a reader keeps between probes: the retirement count it last saw, the table it probes
/// (null before its first probe) and its guard on that table's collector.
#[cfg(not(dma_loom))]
pub(crate) struct PapayaReader<'a> {
    seen: u64,
    table: *const Table,
    guard: Option<papaya::LocalGuard<'a>>,
}

#[cfg(not(dma_loom))]
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
            addresses: (0..capacity)
                .map(|_| AddressSlot(UnsafeCell::new(StoredAddress::new(&[], 0))))
                .collect(),
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

#[cfg(not(dma_loom))]
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
        let fi_addr = *table.map.get(&client, guard)?;
        let slot = self.addresses.get(usize::try_from(fi_addr).ok()?)?;
        // SAFETY: `fi_addr` is the index of a registration found under the caller's pin, so its
        // slot holds that entry's address and is not written while the pin lives (see
        // `AddressSlot`).
        let stored = unsafe { &*slot.0.get() };
        same_bytes(stored.bytes(), address).then_some(fi_addr)
    }

    fn install(&self, fi_addr: fi_addr_t, address: &StoredAddress) {
        let Some(slot) = usize::try_from(fi_addr)
            .ok()
            .and_then(|index| self.addresses.get(index))
        else {
            return;
        };
        // SAFETY: the writer alone calls this, for an index the AV has just handed out, whose
        // slot no reader reads until a registration on it is published (see `AddressSlot`).
        unsafe { *slot.0.get() = address.clone() };
    }

    fn registered(&self, client: u64) -> Option<fi_addr_t> {
        let table = self.table();
        table.map.get(&client, &table.map.guard()).copied()
    }

    fn publish(&self, client: u64, fi_addr: fi_addr_t) {
        let table = self.table();
        let guard = table.map.guard();
        if table.map.insert(client, fi_addr, &guard).is_none() {
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
        let unlinked = table.map.remove(&client, &guard).copied();
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
            .filter(|(_, index)| fi_addr == **index)
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
            for (&client, &fi_addr) in old.map.iter(&from) {
                fresh.map.insert(client, fi_addr, &to);
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

#[cfg(not(dma_loom))]
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

/// The index under loom: a loom mutex over std maps, so loom sees every probe and change.
#[cfg(dma_loom)]
pub(crate) struct LockedIndex {
    maps: loom::sync::Mutex<LockedMaps>,
}

/// The clients' registrations and the entries' addresses, under one lock.
#[cfg(dma_loom)]
#[derive(Default)]
struct LockedMaps {
    clients: std::collections::HashMap<u64, fi_addr_t>,
    addresses: std::collections::HashMap<fi_addr_t, Box<[u8]>>,
}

#[cfg(dma_loom)]
impl LockedIndex {
    pub(crate) fn with_capacity(_capacity: usize) -> Self {
        Self {
            maps: loom::sync::Mutex::new(LockedMaps::default()),
        }
    }

    fn locked(&self) -> loom::sync::MutexGuard<'_, LockedMaps> {
        crate::sync::lock_modelled(&self.maps)
    }
}

#[cfg(dma_loom)]
impl RegistrationIndex for LockedIndex {
    type Reader<'a> = std::marker::PhantomData<&'a ()>;

    fn reader(&self) -> Self::Reader<'_> {
        std::marker::PhantomData
    }

    unsafe fn probe<'a>(
        &'a self,
        _reader: &mut Self::Reader<'a>,
        client: u64,
        address: &[u8],
    ) -> Option<fi_addr_t> {
        let maps = self.locked();
        let fi_addr = *maps.clients.get(&client)?;
        let registered = maps.addresses.get(&fi_addr)?;
        same_bytes(registered, address).then_some(fi_addr)
    }

    fn install(&self, fi_addr: fi_addr_t, address: &StoredAddress) {
        self.locked()
            .addresses
            .insert(fi_addr, address.bytes().into());
    }

    fn registered(&self, client: u64) -> Option<fi_addr_t> {
        self.locked().clients.get(&client).copied()
    }

    fn publish(&self, client: u64, fi_addr: fi_addr_t) {
        self.locked().clients.insert(client, fi_addr);
    }

    fn unlink(&self, client: u64) -> Option<fi_addr_t> {
        self.locked().clients.remove(&client)
    }

    fn len(&self, _pinned: &EpochPin) -> usize {
        self.locked().clients.len()
    }

    fn clients_at(&self, _pinned: &EpochPin, fi_addr: fi_addr_t) -> Vec<u64> {
        self.locked()
            .clients
            .iter()
            .filter(|(_, index)| fi_addr == **index)
            .map(|(client, _)| *client)
            .collect()
    }

    /// A std map's memory is the loom models' least concern: never replaced.
    fn shrink(&self) -> bool {
        false
    }

    fn retired_uncovered(&self) -> bool {
        false
    }

    fn cover_retired(&self) {}

    fn readers_gone(&self) {}

    fn holds_retired(&self) -> bool {
        false
    }

    #[cfg(feature = "model")]
    fn replacements(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::same_bytes;

    #[test]
    fn same_bytes_agrees_with_a_slice_compare() {
        let lengths = [0, 1, 15, 16, 17, 28, 32, 33];
        for &one in &lengths {
            for &other in &lengths {
                let a: Vec<u8> = (0..one as u8).collect();
                let mut b: Vec<u8> = (0..other as u8).collect();
                assert_eq!(a == b, same_bytes(&a, &b), "{one} and {other} bytes");
                if let Some(last) = b.last_mut() {
                    *last ^= 1;
                    assert_eq!(
                        a == b,
                        same_bytes(&a, &b),
                        "{one} and {other} bytes, last differs"
                    );
                }
            }
        }
    }
}
