//! A soak of the cache's edges (issue 18): long-lived pins while other threads churn,
//! release/revive cycles under a pin, `lease_within` retry loops against a parked efa
//! incarnation, and removals held by leases. None may grow the cache's heap past
//! [`heap_bound`] above the empty cache, and once everything is released, dropped and quiesced,
//! the heap is back within 16 B per former entry of the empty cache.
//!
//! Its own test binary, because it installs a counting global allocator. The tests in it take
//! turns ([`serial`]), so each one's count is its own. Bounded iteration counts, no sleeps, no
//! timing: a few seconds in debug.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, mpsc};
use std::time::Duration;

use common::{efa, sockaddr};
use dma_libfabric::sys::fi_addr_t;
use dma_libfabric::{AddressCache, AddressFormat, AvBackend, DmaError};
use testkit::efa_numbered;
use testkit::fuzzing::heap;

#[global_allocator]
static GLOBAL: heap::Counting = heap::Counting;

/// The AV's capacity in every scenario.
const CAPACITY: usize = 4096;

/// How far above the empty cache its heap may grow, whatever readers, leases and retries do: the
/// bound the writer's module docs state ("Bounds"; `heap::cache_bound`: 384 B per AV entry, 64 B
/// per inbox slot), and 256 KiB for what is not the cache's (the threads' epoch handles and reply
/// channels, the test's own vectors). Measured peaks: 795 KB (long pin over revives and churn),
/// 280 KB (lease retries), 241 KB (removals held by leases), against 1.8 MB here.
fn heap_bound() -> isize {
    heap::cache_bound(CAPACITY) + (256 << 10)
}

/// What may stay allocated, per entry the cache held, once it is empty again.
const LEFT_PER_FORMER_ENTRY: isize = 16;

/// And a residue that does not grow with the work done. Traced allocation by allocation (a
/// tracing allocator over this binary's scenarios): each scenario run alone leaves 8.3-11 KB
/// (crossbeam's bag nodes, 3 × 2,072 B; the writer's tables bounded by the capacity at their
/// smallest; this thread's one-time state), with the index keyed by the client and replaced once
/// it empties (the 81-160 KB that 20,000 or more release/revive cycles left before are gone:
/// 10.9 KB after them now). One figure is still larger: the idle-pin scenario leaves 159 KB when
/// it runs right after the 400,000-cycle one in this process, and 10.0 KB alone, so it is the
/// earlier scenario's memory moving during this one (the count is the process's), not this
/// cache's; allowed here so that what grows with the entries or the cycles still fails.
const LEFT_RESIDUE: isize = 192 << 10;

/// The tests of this binary take turns: the counter is the whole process's.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An `FI_AV_TABLE` (the lowest free index first) whose storage is allocated once, up front, so
/// every byte the count sees move after the cache is built is the cache's.
struct FixedAv {
    format: AddressFormat,
    address_len: usize,
    slots: Vec<Option<[u8; 32]>>,
}

impl FixedAv {
    fn new(format: AddressFormat, address_len: usize) -> Self {
        assert!(address_len <= 32);
        Self {
            format,
            address_len,
            slots: vec![None; CAPACITY],
        }
    }
}

impl AvBackend for FixedAv {
    fn format(&self) -> AddressFormat {
        self.format
    }
    fn address_len(&self) -> usize {
        self.address_len
    }
    fn capacity(&self) -> usize {
        CAPACITY
    }
    fn insert(&mut self, address: &[u8]) -> Result<fi_addr_t, DmaError> {
        let Some(index) = self.slots.iter().position(Option::is_none) else {
            return Err(DmaError::Capacity { capacity: CAPACITY });
        };
        let mut stored = [0; 32];
        stored[..address.len()].copy_from_slice(address);
        self.slots[index] = Some(stored);
        Ok(index as fi_addr_t)
    }
    fn remove(&mut self, fi_addr: fi_addr_t) -> Result<(), DmaError> {
        match self.slots.get_mut(fi_addr as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(DmaError::InvalidArgument(format!(
                "fi_av_remove of {fi_addr}, which is not in the AV"
            ))),
        }
    }
}

/// The heap's size as the scenario starts: the empty cache, built, and this thread's epoch
/// handle and reply channel made (what any thread that uses the cache has). The peak starts here
/// too.
fn baseline<B: AvBackend>(cache: &AddressCache<B>) -> heap::Baseline {
    drop(cache.pin());
    cache.quiesce();
    heap::Baseline::take(CAPACITY).expect("the counting allocator is installed")
}

/// The most the heap has grown above `empty` since [`baseline`], checked against the bound.
fn assert_bounded(empty: &heap::Baseline, what: &str) {
    let (grown, bound) = (empty.peak(), heap_bound());
    eprintln!("{what}: a peak of {grown} B above the empty cache (bound {bound} B)");
    assert!(
        grown <= bound,
        "{what}: the heap grew {grown} B above the empty cache, past the bound of {bound} B"
    );
}

/// Every client gone, every lease and pin dropped, quiesced: the AV and the index are empty,
/// and the heap is back within 16 B per former entry of `empty`: per entry of the fullest the
/// AV has been, which is every test's [`CAPACITY`] (each fills it once).
fn assert_back_to_empty(cache: &AddressCache<FixedAv>, empty: &heap::Baseline) {
    let former_entries = CAPACITY;
    cache.quiesce_with_patience(Duration::ZERO);
    // crossbeam-epoch frees what it retired (the exited threads' handles, its own queue's
    // nodes) in the collection a pin runs every 128 pins: let it catch up.
    for _ in 0..4 {
        for _ in 0..256 {
            drop(cache.pin());
        }
        cache.quiesce_with_patience(Duration::ZERO);
    }
    let stats = cache.stats();
    assert_eq!(
        (0, 0, 0, 0),
        (
            stats.entries,
            stats.clients,
            stats.pending_removals,
            stats.leases
        ),
        "{stats:?}"
    );
    assert_eq!(0, cache.indexed());
    let left = empty.now();
    eprintln!("back to empty: {left} B above the empty cache");
    assert!(
        left <= LEFT_PER_FORMER_ENTRY * former_entries as isize + LEFT_RESIDUE,
        "{left} B still allocated after {former_entries} entries came and went"
    );
}

/// Fill the AV but for `keep` slots with clients `first..`, then release them all: each entry
/// comes and goes once, so the writer's structures have held a nearly full AV.
fn fill_and_release<B: AvBackend>(
    cache: &AddressCache<B>,
    address: fn(u32) -> Vec<u8>,
    first: u32,
    keep: usize,
) {
    let count = (CAPACITY - keep) as u32;
    {
        let pinned = cache.pin();
        for n in first..first + count {
            pinned.resolve(u64::from(n), &address(n)).expect("room");
        }
    }
    for n in first..first + count {
        cache.release(u64::from(n));
    }
    cache.quiesce();
}

/// Enough cycles that ~2.8 KB each (the growth issue 18 measured) would pass [`heap_bound`]
/// many times over.
const REVIVE_CYCLES: u32 = 20_000;

#[test]
fn a_long_pin_that_goes_on_probing_over_release_revive_cycles_and_churn_stays_bounded() {
    let _turn = serial();
    let cache = AddressCache::with_backend(FixedAv::new(AddressFormat::Opaque, 16));
    let empty = baseline(&cache);
    fill_and_release(&cache, sockaddr, 1_000, 2);
    let shared = sockaddr(1);
    cache.pin().resolve(1, &shared).expect("the shared entry");
    let own = cache
        .pin()
        .resolve(3, &sockaddr(3))
        .expect("room")
        .fi_addr();
    {
        // This thread holds one pin throughout and goes on hitting through it, as a posting loop
        // does, while another churns.
        let long = cache.pin();
        let seen = long.resolve(1, &shared).expect("a hit").fi_addr();
        let churned = AtomicBool::new(false);
        let probes = AtomicU64::new(0);
        std::thread::scope(|scope| {
            let churner = scope.spawn(|| {
                // Every `PROBE_EVERY` cycles, wait until the long pin has probed once more: a
                // posting loop's rate, made independent of how the two threads are scheduled.
                let mut cycles = 0_u32;
                let mut paced = || {
                    cycles += 1;
                    if 0 == cycles % PROBE_EVERY {
                        let from = probes.load(Ordering::Acquire);
                        // Two more: at least one whole probe began after this point.
                        while probes.load(Ordering::Acquire) < from + 2
                            && !churned_or_gone(&churned)
                        {
                            std::thread::yield_now();
                        }
                    }
                };
                // Release and revive: each release retires the entry (its last client goes),
                // each resolve revives it before its removal could run.
                for cycle in 0..REVIVE_CYCLES {
                    let (gone, back) = if 0 == cycle % 2 { (1, 2) } else { (2, 1) };
                    cache.release(gone);
                    cache.pin().resolve(back, &shared).expect("revived");
                    paced();
                }
                // New clients come and go: each removal waits for the long pin, until the
                // AV is full of them and the cache answers Capacity.
                for n in 0..4 * CAPACITY as u32 {
                    let address = sockaddr(10_000 + n);
                    match cache.pin().resolve(u64::from(10_000 + n), &address) {
                        Ok(_) | Err(DmaError::Capacity { .. }) => {}
                        Err(other) => panic!("churn: {other:?}"),
                    }
                    cache.release(u64::from(10_000 + n));
                    paced();
                }
                churned.store(true, Ordering::Release);
            });
            // If this thread fails, the churner must not wait for its probes.
            let _gone = SetOnDrop(&churned);
            // The posting loop's own peer stays registered throughout, so every probe is a hit
            // and none asks the writer for anything.
            while !churned.load(Ordering::Acquire) && !churner.is_finished() {
                assert_eq!(own, long.resolve(3, &sockaddr(3)).expect("a hit").fi_addr());
                probes.fetch_add(1, Ordering::Release);
            }
        });
        assert!(
            0 < probes.into_inner(),
            "the long pin probed while the other thread churned"
        );
        assert_eq!(
            seen,
            long.resolve(1, &shared).expect("still a hit").fi_addr()
        );
        assert_bounded(
            &empty,
            "release/revive and churn under a long pin that probes",
        );
    }
    cache.release(1);
    cache.release(2);
    cache.release(3);
    assert_back_to_empty(&cache, &empty);
}

/// How many of the churner's cycles may pass between two of the long pin's probes: what the
/// pin holds back between them is about 650 B a cycle.
const PROBE_EVERY: u32 = 256;

fn churned_or_gone(churned: &AtomicBool) -> bool {
    churned.load(Ordering::Acquire)
}

/// Sets its flag when dropped, unwinding included.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Release/revive cycles under one pin that probes between them (issue 30: 400,000 asked; see
/// [`a_pin_that_probes_over_many_release_revive_cycles_stays_flat`]).
const PROBED_REVIVE_CYCLES: u32 = 400_000;

/// The pin's thread does the churn itself, so it probes between every two of the writer's
/// changes, deterministically: the index nodes the writer retires are released by the pin's next
/// probe, and the heap stays flat however many cycles go by. (`release` is queued; the
/// `resolve` after it is a miss the writer answers: a revive of the retired entry, whose removal
/// the pin holds back.)
#[test]
fn a_pin_that_probes_over_many_release_revive_cycles_stays_flat() {
    let _turn = serial();
    let cache = AddressCache::with_backend(FixedAv::new(AddressFormat::Opaque, 16));
    let empty = baseline(&cache);
    fill_and_release(&cache, sockaddr, 1_000, 1);
    let shared = sockaddr(1);
    let pinned = cache.pin();
    let seen = pinned
        .resolve(1, &shared)
        .expect("the shared entry")
        .fi_addr();
    // The heap's floor (its least, sampled every cycle) over each half: flat means the second
    // half's floor is no higher than the first's. Not two point samples: between the writer's
    // reclamation passes the heap swings by whatever is retired and not yet freed (hundreds of
    // KB), so a point can land on either side of a pass; the floor is what a leak raises.
    let (mut first_floor, mut second_floor) = (isize::MAX, isize::MAX);
    for cycle in 0..PROBED_REVIVE_CYCLES {
        let (gone, back) = if 0 == cycle % 2 { (1, 2) } else { (2, 1) };
        cache.release(gone);
        assert_eq!(
            seen,
            pinned.resolve(back, &shared).expect("revived").fi_addr()
        );
        assert_eq!(
            seen,
            pinned.resolve(back, &shared).expect("a hit").fi_addr()
        );
        let floor = if cycle < PROBED_REVIVE_CYCLES / 2 {
            &mut first_floor
        } else {
            &mut second_floor
        };
        *floor = (*floor).min(empty.now());
    }
    assert_bounded(&empty, "release/revive cycles under one probing pin");
    assert!(
        second_floor <= first_floor + 64 * 1024,
        "the heap's floor rose from {first_floor} B to {second_floor} B above the empty cache \
         from the first half of the cycles to the second"
    );
    drop(pinned);
    cache.release(1);
    cache.release(2);
    assert_back_to_empty(&cache, &empty);
}

/// What a pin that never probed may hold over [`REVIVE_CYCLES`] cycles: the cache's own state
/// under a pin and the writer's unflushed batch of retired nodes, not a node a cycle.
const NEVER_PROBED_BOUND: isize = 256 << 10;

/// A pin that probes once and then sits while another thread churns holds back the index
/// nodes the writer retires meanwhile (papaya's guard, held across the pin's probes: the cost
/// `docs/guarantees.md` states), and lets them go at its next probe: the heap is back within
/// the bound at once, before the pin is dropped.
#[test]
fn an_idle_long_pin_lets_go_of_the_index_at_its_next_probe() {
    let _turn = serial();
    let cache = AddressCache::with_backend(FixedAv::new(AddressFormat::Opaque, 16));
    let empty = baseline(&cache);
    let shared = sockaddr(1);
    cache.pin().resolve(1, &shared).expect("the shared entry");
    let own = cache
        .pin()
        .resolve(3, &sockaddr(3))
        .expect("room")
        .fi_addr();
    let churn = || {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    for cycle in 0..REVIVE_CYCLES {
                        let (gone, back) = if 0 == cycle % 2 { (1, 2) } else { (2, 1) };
                        cache.release(gone);
                        cache.pin().resolve(back, &shared).expect("revived");
                    }
                })
                .join()
                .expect("the churning thread");
        });
        cache.quiesce();
    };
    // A pin that has not probed holds no guard on the index: only its epoch.
    let never = cache.pin();
    churn();
    let held = empty.now();
    eprintln!("a pin that never probed, over {REVIVE_CYCLES} cycles: {held} B held");
    assert!(
        held <= NEVER_PROBED_BOUND,
        "a pin that never probed held {held} B over {REVIVE_CYCLES} release/revive cycles"
    );
    drop(never);
    // One that probed holds the guard it took, until its next probe.
    let idle = cache.pin();
    assert_eq!(own, idle.resolve(3, &sockaddr(3)).expect("a hit").fi_addr());
    churn();
    let held = empty.now();
    assert_eq!(own, idle.resolve(3, &sockaddr(3)).expect("a hit").fi_addr());
    let after_probe = empty.now();
    eprintln!(
        "an idle pin over {REVIVE_CYCLES} release/revive cycles held {held} B above the empty \
         cache ({} B a cycle); {after_probe} B after its next probe",
        held / isize::try_from(REVIVE_CYCLES).expect("small")
    );
    assert!(
        after_probe <= heap_bound(),
        "{after_probe} B above the empty cache after the idle pin's next probe"
    );
    drop(idle);
    cache.release(1);
    cache.release(2);
    cache.release(3);
    assert_back_to_empty(&cache, &empty);
}

/// Two pins alive at once on one thread share its papaya reservation, and seize refreshes only a
/// thread's last guard: while both live, neither probe lets go of what the writer retires, so
/// the thread holds it however often it probes. Once one is dropped, the other lets go of it all
/// at its first probe after the writer's next change (the cost `docs/guarantees.md` states).
#[test]
fn two_pins_on_one_thread_hold_the_index_until_one_is_dropped() {
    let _turn = serial();
    let cache = AddressCache::with_backend(FixedAv::new(AddressFormat::Opaque, 16));
    let empty = baseline(&cache);
    let shared = sockaddr(1);
    cache.pin().resolve(1, &shared).expect("the shared entry");
    let own = cache
        .pin()
        .resolve(3, &sockaddr(3))
        .expect("room")
        .fi_addr();
    let (outer, inner) = (cache.pin(), cache.pin());
    let churned = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let churner = scope.spawn(|| {
            for cycle in 0..REVIVE_CYCLES {
                let (gone, back) = if 0 == cycle % 2 { (1, 2) } else { (2, 1) };
                cache.release(gone);
                cache.pin().resolve(back, &shared).expect("revived");
            }
            churned.store(true, Ordering::Release);
        });
        let _gone = SetOnDrop(&churned);
        while !churned.load(Ordering::Acquire) && !churner.is_finished() {
            for pinned in [&outer, &inner] {
                assert_eq!(
                    own,
                    pinned.resolve(3, &sockaddr(3)).expect("a hit").fi_addr()
                );
            }
        }
    });
    cache.quiesce();
    let held = empty.now();
    drop(inner);
    // The outer pin's last probe may have come after the writer's last change, when its refresh
    // could do nothing (two guards on the thread): it refreshes again once the writer changes
    // the index again.
    cache.release(1);
    cache.pin().resolve(2, &shared).expect("revived");
    assert_eq!(
        own,
        outer.resolve(3, &sockaddr(3)).expect("a hit").fi_addr()
    );
    let after = empty.now();
    eprintln!(
        "two probing pins on one thread over {REVIVE_CYCLES} release/revive cycles held {held} B; \
         {after} B once one was dropped and the other probed"
    );
    assert!(
        after <= heap_bound(),
        "{after} B above the empty cache after one of the two pins was dropped and the other probed"
    );
    drop(outer);
    cache.release(1);
    cache.release(2);
    cache.release(3);
    assert_back_to_empty(&cache, &empty);
}

/// Enough retries that ~31.5 B each (the growth issue 18 measured) would pass [`heap_bound`].
const LEASE_RETRIES: u32 = 400_000;

#[test]
fn lease_within_retries_against_a_parked_incarnation_stay_bounded() {
    let _turn = serial();
    let cache = AddressCache::with_backend(FixedAv::new(AddressFormat::Efa, 32));
    let empty = baseline(&cache);
    let (old, new) = (efa(1, 7, 1), efa(1, 7, 2));
    let new = &new;
    let (leased, held) = mpsc::sync_channel(0);
    let (done, release) = mpsc::sync_channel::<()>(0);
    let cache = &cache;
    // Everything moves in, so a failed assertion drops `done` and the holder stops waiting.
    std::thread::scope(move |scope| {
        // Another thread holds the old incarnation's lease until told to drop it.
        let holder = scope.spawn(move || {
            let lease = cache.lease(1, &old).expect("the old incarnation");
            leased.send(()).expect("the test");
            let _ = release.recv();
            drop(lease);
        });
        held.recv().expect("the holder leased the old incarnation");
        for retry in 0..LEASE_RETRIES {
            match cache.lease_within(2, new, Duration::ZERO) {
                Err(DmaError::OutOfPatience { client: 2, .. }) => {}
                other => panic!("retry {retry}: the new incarnation waits, {other:?}"),
            }
        }
        assert_eq!(1, cache.stats().leases);
        assert_bounded(&empty, "lease_within retries");
        done.send(()).expect("the holder");
        holder.join().expect("the holder");
    });
    let lease = cache
        .lease(2, new)
        .expect("admitted once the old lease is gone");
    drop(lease);
    cache.release(1);
    cache.release(2);
    cache.quiesce();
    assert_bounded(&empty, "lease_within retries, then admission");
    fill_and_release(cache, efa_numbered, 1_000, 0);
    assert_back_to_empty(cache, &empty);
}

/// Cycles of the churn that runs while removals wait for leases, on each of two threads.
const LEASED_CHURN: u32 = 10_000;

/// How many removals wait for leases meanwhile.
const LEASED: u32 = 512;

#[test]
fn removals_held_by_leases_stay_bounded() {
    let _turn = serial();
    let cache = AddressCache::with_backend(FixedAv::new(AddressFormat::Opaque, 16));
    let empty = baseline(&cache);
    let held = LEASED;
    // Leased and released: every one of those removals waits for its lease.
    // Taken from a pin, as a posting thread does, so no rule about a thread's own leases applies.
    let leases: Vec<_> = (0..held)
        .map(|n| {
            let pinned = cache.pin();
            let peer = pinned.resolve(u64::from(n), &sockaddr(n)).expect("room");
            pinned.lease(peer).expect("a lease")
        })
        .collect();
    for n in 0..held {
        cache.release(u64::from(n));
    }
    cache.quiesce();
    assert_eq!(u64::from(held), cache.stats().removals_awaiting_leases);
    // Meanwhile, clients on the other half come and go, on two threads, with a pin held on a
    // third for the first half of the churn.
    let (pinned, go) = mpsc::sync_channel(0);
    let (halfway, unpin) = mpsc::sync_channel::<()>(0);
    let cache = &cache;
    // Everything moves in, so a failed assertion drops `halfway` and the pin holder stops
    // waiting.
    std::thread::scope(move |scope| {
        scope.spawn(move || {
            let long = cache.pin();
            pinned.send(()).expect("the test");
            let _ = unpin.recv();
            drop(long);
        });
        go.recv().expect("the long pin is taken");
        let churners: Vec<_> = (0..2_u32)
            .map(|thread| {
                let halfway = halfway.clone();
                scope.spawn(move || {
                    for cycle in 0..LEASED_CHURN {
                        if 0 == thread && LEASED_CHURN / 2 == cycle {
                            let _ = halfway.send(());
                        }
                        let n = 100_000 + thread * 1_000 + cycle % 50;
                        match cache.pin().resolve(u64::from(n), &sockaddr(n)) {
                            Ok(_) | Err(DmaError::Capacity { .. }) => {}
                            Err(other) => panic!("churn: {other:?}"),
                        }
                        cache.release(u64::from(n));
                    }
                })
            })
            .collect();
        drop(halfway);
        for churner in churners {
            churner.join().expect("a churning thread");
        }
    });
    cache.quiesce();
    assert_eq!(u64::from(held), cache.stats().removals_awaiting_leases);
    assert_bounded(&empty, "removals held by leases, under churn");
    drop(leases);
    cache.quiesce();
    // Every slot of the AV filled once, so the writer's structures have held a full AV.
    fill_and_release(cache, sockaddr, 1_000_000, 0);
    assert_back_to_empty(cache, &empty);
}
