//! The cache's bounds at their worst cases (issue 29, "Bounds"): the inbox counts misses, not
//! requests, so a storm of `resolve_all` chunks behind one slow insert queues at most
//! `AddressCache::INBOX_BOUND` misses, however many threads send them; and the failure records
//! of 4,096 refused clients stay within their term of the byte bound.
//!
//! Its own binary, with a counting allocator; the tests take turns ([`serial`]) so each count is
//! its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use dma_libfabric::sys::fi_addr_t;
use dma_libfabric::{AddressCache, AddressFormat, AvBackend, DmaError, ModelAv};
use testkit::fuzzing::heap;

#[global_allocator]
static GLOBAL: heap::Counting = heap::Counting;

/// The tests of this binary take turns: the count is the whole process's.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How many inserts have reached a [`Gated`] AV's gate, in this process.
static INSERTS_ENTERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A model AV whose inserts wait while its gate is shut: a slow `fi_av_insert` that holds the
/// writer up.
struct Gated {
    av: ModelAv,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl AvBackend for Gated {
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
        INSERTS_ENTERED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (shut, opened) = &*self.gate;
        let mut shut = shut.lock().unwrap();
        while *shut {
            shut = opened.wait(shut).unwrap();
        }
        drop(shut);
        self.av.insert(address)
    }
    fn remove(&mut self, fi_addr: fi_addr_t) -> Result<(), DmaError> {
        self.av.remove(fi_addr)
    }
}

/// An efa `FI_AV_TABLE` (the lowest free index first) whose storage is allocated once, up front,
/// so every byte the count sees move after the cache is built is the cache's.
struct FixedAv {
    slots: Vec<bool>,
}

impl FixedAv {
    fn new(capacity: usize) -> Self {
        Self {
            slots: vec![false; capacity],
        }
    }
}

impl AvBackend for FixedAv {
    fn format(&self) -> AddressFormat {
        AddressFormat::Efa
    }
    fn address_len(&self) -> usize {
        32
    }
    fn capacity(&self) -> usize {
        self.slots.len()
    }
    fn insert(&mut self, _: &[u8]) -> Result<fi_addr_t, DmaError> {
        let Some(index) = self.slots.iter().position(|used| !used) else {
            return Err(DmaError::Capacity {
                capacity: self.slots.len(),
            });
        };
        self.slots[index] = true;
        Ok(index as fi_addr_t)
    }
    fn remove(&mut self, fi_addr: fi_addr_t) -> Result<(), DmaError> {
        match self.slots.get_mut(fi_addr as usize) {
            Some(used @ true) => {
                *used = false;
                Ok(())
            }
            _ => Err(DmaError::InvalidArgument(format!(
                "{fi_addr} is not in the AV"
            ))),
        }
    }
}

/// The address of miss `n`: 16 opaque bytes, never all zero.
fn address(n: u32) -> Vec<u8> {
    let mut address = vec![1; 16];
    address[..4].copy_from_slice(&n.to_le_bytes());
    address
}

#[test]
fn a_storm_of_chunks_behind_a_slow_insert_queues_at_most_the_inbox_bound_in_misses() {
    let _turn = serial();
    const THREADS: u32 = 8;
    const PER_THREAD: u32 = 1_024;
    let gate = Arc::new((Mutex::new(true), Condvar::new()));
    let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 1 << 16);
    let cache = AddressCache::with_backend(Gated {
        av: av.clone(),
        gate: Arc::clone(&gate),
    });
    let bound = AddressCache::<ModelAv>::INBOX_BOUND;
    std::thread::scope(|scope| {
        let cache = &cache;
        let storm: Vec<_> = (0..THREADS)
            .map(|thread| {
                scope.spawn(move || {
                    let addresses: Vec<Vec<u8>> = (0..PER_THREAD)
                        .map(|n| address(thread * PER_THREAD + n))
                        .collect();
                    let requests: Vec<(u64, &[u8])> = addresses
                        .iter()
                        .enumerate()
                        .map(|(n, address)| {
                            (u64::from(thread * PER_THREAD) + n as u64, &address[..])
                        })
                        .collect();
                    cache
                        .pin()
                        .resolve_all(&requests)
                        .iter()
                        .filter(|peer| peer.is_ok())
                        .count()
                })
            })
            .collect();
        // The storm has 8,192 misses to queue, twice the bound: it fills the budget, and no
        // more, while the first insert holds the writer up.
        let started = Instant::now();
        let mut most = 0;
        while most < bound {
            let queued = cache.queued_chunk_misses();
            assert!(queued <= bound, "{queued} misses queued, past {bound}");
            most = most.max(queued);
            assert!(
                started.elapsed() < Duration::from_secs(8),
                "the storm never filled the budget: {most}"
            );
            std::thread::yield_now();
        }
        for _ in 0..1_000 {
            let queued = cache.queued_chunk_misses();
            assert!(queued <= bound, "{queued} misses queued, past {bound}");
        }
        let (shut, opened) = &*gate;
        *shut.lock().unwrap() = false;
        opened.notify_all();
        let admitted: usize = storm.into_iter().map(|thread| thread.join().unwrap()).sum();
        assert_eq!((THREADS * PER_THREAD) as usize, admitted);
    });
    assert_eq!(0, cache.queued_chunk_misses());
    assert_eq!((THREADS * PER_THREAD) as usize, av.len());
}

#[test]
fn a_sender_past_the_budget_gets_in_once_the_writer_makes_room() {
    let _turn = serial();
    let gate = Arc::new((Mutex::new(true), Condvar::new()));
    let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 1 << 16);
    let cache = AddressCache::with_backend(Gated {
        av,
        gate: Arc::clone(&gate),
    });
    let bound = AddressCache::<ModelAv>::INBOX_BOUND;
    let addresses: Vec<Vec<u8>> = (0..bound as u32 + 256).map(address).collect();
    let requests: Vec<(u64, &[u8])> = addresses
        .iter()
        .enumerate()
        .map(|(n, address)| (n as u64, &address[..]))
        .collect();
    std::thread::scope(|scope| {
        let cache = &cache;
        let requests = &requests;
        // A miss that holds the writer role, stuck in the shut gate: the sender's chunks queue
        // behind it (a sender that found the role free would apply its own chunks instead).
        let blocker = address(u32::MAX);
        let entered = INSERTS_ENTERED.load(std::sync::atomic::Ordering::SeqCst);
        let holder = scope.spawn(move || cache.pin().resolve(u64::MAX, &blocker).is_ok());
        while INSERTS_ENTERED.load(std::sync::atomic::Ordering::SeqCst) == entered {
            std::thread::yield_now();
        }
        let sender = scope.spawn(move || cache.pin().resolve_all(requests).len());
        while cache.queued_chunk_misses() < bound {
            std::thread::yield_now();
        }
        let (shut, opened) = &*gate;
        *shut.lock().unwrap() = false;
        opened.notify_all();
        assert_eq!(requests.len(), sender.join().unwrap());
        assert!(holder.join().unwrap());
    });
    drop(cache);
}

#[test]
fn failure_records_of_4096_refused_clients_stay_within_their_term() {
    let _turn = serial();
    const CAPACITY: usize = 64;
    let cache =
        AddressCache::with_backend(ModelAv::with_layout(AddressFormat::Opaque, 16, CAPACITY));
    for client in 0..CAPACITY as u32 {
        cache
            .pin()
            .resolve(u64::from(client), &address(client))
            .unwrap();
    }
    // Addresses made before the count starts: only the cache's bytes move after it.
    let refused: Vec<Vec<u8>> = (0..4_096).map(|n| address(1_000 + n)).collect();
    cache.quiesce();
    let empty = heap::Baseline::take(CAPACITY).expect("the counting allocator is installed");
    for (n, address) in refused.iter().enumerate() {
        loop {
            match cache.pin().try_resolve(1_000 + n as u64, address) {
                Err(DmaError::Busy) => std::thread::yield_now(),
                Err(DmaError::WouldBlock) => break,
                other => panic!("a queued miss: {other:?}"),
            }
        }
    }
    cache.quiesce();
    let grown = empty.peak();
    // The bound the writer's module docs state: the cache's term, and each failure record's.
    let bound = heap::cache_bound(CAPACITY) + FAILURE_RECORD as isize * 4_096;
    assert!(
        grown <= bound,
        "4,096 failure records: the heap grew {grown} B, past {bound} B"
    );
    let record = cache
        .pin()
        .try_resolve(1_000, &refused[0])
        .map(|peer| peer.fi_addr());
    assert!(
        matches!(record, Err(DmaError::Capacity { .. })),
        "{record:?}"
    );
    println!("failure records: +{grown} B for 4,096 refused clients, bound {bound} B");
}

/// What one failure record may cost, as the writer's module docs and `cache::failures` state it.
const FAILURE_RECORD: usize = 256;

#[test]
fn evictions_driven_on_one_rail_with_the_rail_set_never_called_keep_nothing() {
    let _turn = serial();
    const EVICTIONS: u32 = 10_000;
    // AVs that allocate nothing after they are built (the model AV logs every call).
    let rails = dma_libfabric::RailCaches::new(
        (0..2)
            .map(|_| AddressCache::with_backend(FixedAv::new(256)))
            .collect(),
    )
    .unwrap();
    let rail = rails.rail(0);
    let incarnations: Vec<Vec<u8>> = (0..=EVICTIONS + 100)
        .map(|round| testkit::efa(1, 7, round + 1))
        .collect();
    // Each new client leases a new incarnation of one slot on rail 0 alone, driving its cache
    // directly: it evicts the last client there, which the rail set releases on rail 1.
    let evict = |at: u32| {
        drop(
            rail.lease(u64::from(at), &incarnations[at as usize])
                .unwrap(),
        );
    };
    for at in 0..100 {
        evict(at);
    }
    rails.quiesce();
    let steady = heap::Baseline::take(256).expect("the counting allocator is installed");
    for at in 100..100 + EVICTIONS {
        evict(at);
    }
    rails.quiesce();
    let kept = steady.now();
    // Nothing is queued per eviction: the releases went straight into rail 1's inbox.
    assert!(
        kept <= 16 << 10,
        "{EVICTIONS} evictions: the heap kept {kept} B more"
    );
    assert_eq!(
        u64::from(EVICTIONS + 99),
        rails.evictions_propagated(),
        "every evicted client released on the other rail"
    );
    assert_eq!(u64::from(EVICTIONS + 99), rail.stats().evicted_clients);
}
