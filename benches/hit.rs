//! The hit path on one thread: `pinned.resolve` on a warm cache of 1,000 and 100,000 live
//! entries, efa (32-byte addresses, model AV) and tcp (16-byte, real AV), in batch mode (one pin,
//! many resolves) and single-shot mode (pin, resolve, unpin), next to the baselines probing the
//! same keys in the same order with the same hasher; below them, the floor (a bare papaya `get` of
//! the same keys under one guard) and the limit (a bare foldhash map keyed by the address alone);
//! and what a lease adds to a round.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{Cursor, Keys, Kind, Order, Reference, Subject};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use dma_libfabric::sys::fi_addr_t;
use dma_libfabric::{AddressCache, AvBackend};

/// Every row's bench, ours and the baselines' alike: `hold` once a sample (ours_batch's pin, the
/// floor's guard, nothing for the rest), then one `probe` an iteration, on the next probe of the
/// walk every row continues.
fn probes<G, H, F>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    cursor: &mut Cursor<'_>,
    name: &str,
    hold: H,
    probe: F,
) where
    H: Fn() -> G,
    F: Fn(&G, u64, &[u8]) -> fi_addr_t,
{
    group.bench_function(name, |b| {
        let held = hold();
        b.iter(|| {
            let (client, address) = cursor.next_probe();
            black_box(probe(&held, client, address))
        })
    });
}

/// Ours: batch (one pin a sample) and single-shot (a pin a resolve).
fn ours<B: AvBackend>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    cursor: &mut Cursor<'_>,
    cache: &AddressCache<B>,
) {
    probes(
        group,
        cursor,
        "ours_batch",
        || cache.pin(),
        |pinned, client, address| pinned.resolve(client, address).unwrap().fi_addr(),
    );
    probes(
        group,
        cursor,
        "ours_single",
        || (),
        |(), client, address| cache.pin().resolve(client, address).unwrap().fi_addr(),
    );
}

/// The limit: an unsynchronised foldhash map from the `N`-byte address alone.
fn foldhash_bare<const N: usize>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    cursor: &mut Cursor<'_>,
    keys: &Keys,
) {
    let bare = common::bare::<N>(keys);
    probes(
        group,
        cursor,
        "foldhash_bare",
        || (),
        |(), _, address| common::probe_bare(&bare, address).unwrap(),
    );
}

fn hit(criterion: &mut Criterion) {
    for kind in [Kind::Efa, Kind::Tcp] {
        for n in [1_000, 100_000] {
            let keys = Keys::new(kind, n);
            let identity_len = kind.identity_len();
            let capacity = n.max(4096);
            let subject = Subject::new(kind, capacity);
            subject.warm(&keys);
            let floor = common::floor(&keys, capacity);
            let plain = common::plain(&keys);
            let reference = Mutex::new(Reference::warmed(kind, &keys));
            let rwlock = common::rwlock(&keys);
            let dashmap = common::dashmap(&keys);

            let mut group = criterion.benchmark_group(format!("hit_{}_{n}", kind.name()));
            group.throughput(Throughput::Elements(1));
            let mut cursor = keys.cursor(0);
            let cursor = &mut cursor;
            match &subject {
                Subject::Tcp(endpoint) => ours(&mut group, cursor, endpoint.cache()),
                Subject::Efa(cache) => ours(&mut group, cursor, cache),
            }
            probes(
                &mut group,
                cursor,
                "papaya_floor",
                || floor.guard(),
                |guard, client, address| {
                    common::probe_floor(&floor, guard, identity_len, client, address).unwrap()
                },
            );
            // The floor as ours paid it before its pin held papaya's guard across probes: the
            // guard taken for each probe (an atomic swap to leave it), the price of a bound on
            // what a long pin holds back. Ours now refreshes the guard only when the writer has
            // changed the index, so it should sit near `papaya_floor`, not this.
            probes(
                &mut group,
                cursor,
                "papaya_floor_guard_per_probe",
                || (),
                |(), client, address| {
                    common::probe_floor(&floor, &floor.guard(), identity_len, client, address)
                        .unwrap()
                },
            );
            // The layout that would bring a registration to 64 B a client or less (see
            // `docs/guarantees.md`, the per-client term): the index keyed by the client alone,
            // its node a client and an index (16 B), and the hit confirming the address from a
            // per-entry array, one more dependent load.
            let (by_client, addresses) = client_keyed(&keys, capacity);
            probes(
                &mut group,
                cursor,
                "papaya_client_keyed",
                || by_client.guard(),
                |guard, client, address| {
                    let fi_addr = *by_client.get(&client, guard).unwrap();
                    let stored = &addresses[fi_addr as usize];
                    assert!(stored[..address.len()] == *address);
                    fi_addr
                },
            );
            match kind {
                Kind::Efa => foldhash_bare::<32>(&mut group, cursor, &keys),
                Kind::Tcp => foldhash_bare::<16>(&mut group, cursor, &keys),
            }
            probes(
                &mut group,
                cursor,
                "hashmap",
                || (),
                |(), client, address| common::probe(&plain, identity_len, client, address).unwrap(),
            );
            probes(
                &mut group,
                cursor,
                "mutex_reference",
                || (),
                |(), client, address| common::probe_reference(&reference, client, address),
            );
            probes(
                &mut group,
                cursor,
                "rwlock_hashmap",
                || (),
                |(), client, address| {
                    common::probe_rwlock(&rwlock, identity_len, client, address).unwrap()
                },
            );
            probes(
                &mut group,
                cursor,
                "dashmap",
                || (),
                |(), client, address| {
                    common::probe_dashmap(&dashmap, identity_len, client, address).unwrap()
                },
            );
            group.finish();
            let misses = match &subject {
                Subject::Tcp(endpoint) => endpoint.cache().stats().misses,
                Subject::Efa(cache) => cache.stats().misses,
            };
            assert_eq!(n as u64, misses, "every probe after warming must have hit");
        }
    }
}

/// The client-keyed layout of `keys`: a papaya map from the client to its entry's index, and the
/// entries' addresses by index, each inline.
fn client_keyed(
    keys: &Keys,
    capacity: usize,
) -> (
    papaya::HashMap<u64, fi_addr_t, common::Hasher>,
    Vec<[u8; 32]>,
) {
    let map = papaya::HashMap::builder()
        .hasher(common::Hasher::default())
        .capacity(capacity)
        .resize_mode(papaya::ResizeMode::Blocking)
        .build();
    let mut addresses = vec![[0; 32]; keys.addresses.len()];
    {
        let guard = map.guard();
        for (client, address) in keys.addresses.iter().enumerate() {
            map.insert(client as u64, client as fi_addr_t, &guard);
            addresses[client][..address.len()].copy_from_slice(address);
        }
    }
    (map, addresses)
}

/// What a lease costs: a `pin → resolve → lease → drop` round next to `pin → resolve → drop`, on
/// one thread and on two, and the same round with an `Arc` clone and drop added, which is what a
/// `'static` lease holding its cache by `Arc` would cost on top (one shared counter for every
/// posting thread, where the borrowed lease touches a counter of its entry's own).
fn lease(criterion: &mut Criterion) {
    let keys = Keys::new(Kind::Tcp, 1_000);
    let endpoint = common::tcp_endpoint(4096);
    let cache = endpoint.cache();
    common::warm(cache, &keys);
    let shared = Arc::new(());
    let mut group = criterion.benchmark_group("lease_tcp_1000");
    group.throughput(Throughput::Elements(1));
    let round = |cursor: &mut Cursor<'_>, arc: Option<&Arc<()>>| {
        let (client, address) = cursor.next_probe();
        let pinned = cache.pin();
        let peer = pinned.resolve(client, address).unwrap();
        let lease = pinned.lease(peer).unwrap();
        let held = arc.map(Arc::clone);
        drop(pinned);
        black_box(lease.fi_addr());
        drop(held);
        drop(lease);
    };
    for threads in [1_usize, 2] {
        for (name, arc) in [("lease_round", None), ("lease_round_arc", Some(&shared))] {
            group.bench_function(format!("{name}_t{threads}"), |b| {
                b.iter_custom(|iterations| {
                    let barrier = Barrier::new(threads);
                    let started = Instant::now();
                    std::thread::scope(|scope| {
                        for thread in 0..threads {
                            let (barrier, round, keys) = (&barrier, &round, &keys);
                            scope.spawn(move || {
                                let mut cursor = keys.cursor(thread * 7_919);
                                barrier.wait();
                                for _ in 0..iterations {
                                    round(&mut cursor, arc);
                                }
                            });
                        }
                    });
                    started.elapsed()
                })
            });
        }
    }
    group.bench_function("pin_resolve_t1", |b| {
        let mut cursor = keys.cursor(0);
        b.iter(|| {
            let (client, address) = cursor.next_probe();
            let pinned = cache.pin();
            black_box(pinned.resolve(client, address).unwrap().fi_addr())
        })
    });
    group.finish();
    assert_eq!(0, cache.stats().leases, "every lease was dropped");
}

/// Issue 43's comparison, outside criterion: blocks of [`BLOCK`] probes, ours and papaya's `get`
/// of the same `(client, identity)` keys in the same order, each round running every contestant
/// once in a shuffled order (interleaved, so the machine's load falls on all alike), each block
/// timed after an untimed run of the same probes, best and median of [`ROUNDS`].
const BLOCK: usize = 65_536;
const ROUNDS: usize = 40;

/// One contestant: its name, and a block of `BLOCK` probes from the cursor, timed.
type Block<'a> = (
    &'static str,
    Box<dyn FnMut(&mut Cursor<'_>) -> Duration + 'a>,
);

/// Ours, batch (one pin a block) and single (a pin a probe).
fn ours_blocks<B: AvBackend>(cache: &AddressCache<B>) -> [Block<'_>; 2] {
    [
        (
            "ours_batch",
            Box::new(move |cursor: &mut Cursor<'_>| {
                let pinned = cache.pin();
                let started = Instant::now();
                for _ in 0..BLOCK {
                    let (client, address) = cursor.next_probe();
                    black_box(pinned.resolve(client, address).unwrap().fi_addr());
                }
                started.elapsed()
            }),
        ),
        (
            "ours_single",
            Box::new(move |cursor: &mut Cursor<'_>| {
                let started = Instant::now();
                for _ in 0..BLOCK {
                    let (client, address) = cursor.next_probe();
                    black_box(cache.pin().resolve(client, address).unwrap().fi_addr());
                }
                started.elapsed()
            }),
        ),
    ]
}

/// papaya's `get` of the floor's `(client, identity)` keys: under one guard a block, and with a
/// guard of its own a probe.
fn papaya_blocks(floor: &common::Floor, identity_len: usize) -> [Block<'_>; 2] {
    [
        (
            "papaya_get",
            Box::new(move |cursor: &mut Cursor<'_>| {
                let guard = floor.guard();
                let started = Instant::now();
                for _ in 0..BLOCK {
                    let (client, address) = cursor.next_probe();
                    black_box(
                        common::probe_floor(floor, &guard, identity_len, client, address).unwrap(),
                    );
                }
                started.elapsed()
            }),
        ),
        (
            "papaya_get_own_guard",
            Box::new(move |cursor: &mut Cursor<'_>| {
                let started = Instant::now();
                for _ in 0..BLOCK {
                    let (client, address) = cursor.next_probe();
                    let guard = floor.guard();
                    black_box(
                        common::probe_floor(floor, &guard, identity_len, client, address).unwrap(),
                    );
                }
                started.elapsed()
            }),
        ),
    ]
}

/// papaya keyed by the client and a boxed identity: a key shape a user might write, whose
/// probe follows the node to the identity's own allocation.
#[derive(PartialEq, Eq)]
struct BoxedKey {
    client: u64,
    identity: Box<[u8]>,
}

impl std::hash::Hash for BoxedKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::hash::Hash::hash(
            &common::Lookup {
                client: self.client,
                identity: &self.identity,
            },
            state,
        );
    }
}

impl papaya::Equivalent<BoxedKey> for common::Lookup<'_> {
    fn equivalent(&self, key: &BoxedKey) -> bool {
        self.client == key.client && *self.identity == *key.identity
    }
}

type Boxed = papaya::HashMap<BoxedKey, fi_addr_t, common::Hasher>;
type Confirmed = papaya::HashMap<common::Key, common::Value, common::Hasher>;

fn papaya_map<K: std::hash::Hash + Eq, V>(
    capacity: usize,
) -> papaya::HashMap<K, V, common::Hasher> {
    papaya::HashMap::builder()
        .hasher(common::Hasher::default())
        .capacity(capacity)
        .resize_mode(papaya::ResizeMode::Blocking)
        .build()
}

fn boxed_keys(keys: &Keys, capacity: usize) -> Boxed {
    let map = papaya_map(capacity);
    let identity_len = keys.kind.identity_len();
    for (client, address) in keys.addresses.iter().enumerate() {
        let key = BoxedKey {
            client: client as u64,
            identity: address[..identity_len].into(),
        };
        map.pin().insert(key, client as fi_addr_t);
    }
    map
}

/// papaya keyed as the floor, its value the whole address and the `fi_addr_t`: a probe that does
/// the cache's whole work (the identity compared in the key, the address confirmed, the index
/// read).
fn confirmed_keys(keys: &Keys, capacity: usize) -> Confirmed {
    let map = papaya_map(capacity);
    for (key, value) in common::entries(keys) {
        map.pin().insert(key, value);
    }
    map
}

/// The diagnostic shapes, under one guard a block.
fn shapes<'a>(boxed: &'a Boxed, confirmed: &'a Confirmed, identity_len: usize) -> [Block<'a>; 2] {
    [
        (
            "papaya_get_boxed_key",
            Box::new(move |cursor: &mut Cursor<'_>| {
                let guard = boxed.guard();
                let started = Instant::now();
                for _ in 0..BLOCK {
                    let (client, address) = cursor.next_probe();
                    let lookup = common::Lookup::of(client, address, identity_len);
                    black_box(*boxed.get(&lookup, &guard).unwrap());
                }
                started.elapsed()
            }),
        ),
        (
            "papaya_get_confirmed",
            Box::new(move |cursor: &mut Cursor<'_>| {
                let guard = confirmed.guard();
                let started = Instant::now();
                for _ in 0..BLOCK {
                    let (client, address) = cursor.next_probe();
                    let lookup = common::Lookup::of(client, address, identity_len);
                    let value = confirmed.get(&lookup, &guard).unwrap();
                    assert!(value.confirms(address));
                    black_box(value.fi_addr);
                }
                started.elapsed()
            }),
        ),
    ]
}

/// Run every contestant `ROUNDS` times, interleaved, each on a cursor of its own over the same
/// walk (so each block of each round probes the same keys); the best and the median ns a probe
/// of each.
fn interleave(keys: &Keys, contestants: &mut [Block<'_>]) -> Vec<(f64, f64)> {
    let mut cursors: Vec<Cursor<'_>> = contestants.iter().map(|_| keys.cursor(0)).collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); contestants.len()];
    // One untimed round: every contestant's first block warms what it touches.
    for ((_, block), cursor) in contestants.iter_mut().zip(&mut cursors) {
        block(cursor);
    }
    // Each round runs the contestants in an order of its own (none always follows the same
    // other one), and each runs its block twice, timing the second: what a block costs depends
    // on whose memory the caches hold when it starts, so each is timed with its own warm, as
    // criterion times a bench that runs alone for seconds.
    let count = contestants.len();
    let mut random = common::Random::new(0x43);
    let mut turns: Vec<usize> = (0..count).collect();
    for _ in 0..ROUNDS {
        for i in (1..count).rev() {
            turns.swap(i, random.below(i as u64 + 1) as usize);
        }
        for &at in &turns {
            let block = &mut contestants[at].1;
            block(&mut cursors[at].clone());
            times[at].push(block(&mut cursors[at]).as_nanos() as f64 / BLOCK as f64);
        }
    }
    times
        .into_iter()
        .map(|mut times| {
            times.sort_by(f64::total_cmp);
            (times[0], times[times.len() / 2])
        })
        .collect()
}

/// Whether the command line's filter (criterion's first free argument), if any, selects `name`.
fn selected(name: &str) -> bool {
    let filter = std::env::args()
        .skip(1)
        .find(|argument| !argument.starts_with('-'));
    filter.is_none_or(|filter| name.contains(&filter))
}

/// Ours ÷ papaya's `get`, batch and single, in both orders, for 100,000 efa and tcp identities.
fn orders() {
    let n = 100_000;
    for kind in [Kind::Efa, Kind::Tcp] {
        let name = format!("hit_orders_{}_{n}", kind.name());
        if !selected(&name) {
            continue;
        }
        let subject = Subject::new(kind, n);
        let warming = Keys::new(kind, n);
        subject.warm(&warming);
        let floor = common::floor(&warming, n);
        let (boxed, confirmed) = (boxed_keys(&warming, n), confirmed_keys(&warming, n));
        for order in [Order::Inserted, Order::Random] {
            let keys = Keys::with_order(kind, n, order);
            let mut contestants: Vec<Block<'_>> = Vec::new();
            match &subject {
                Subject::Tcp(endpoint) => contestants.extend(ours_blocks(endpoint.cache())),
                Subject::Efa(cache) => contestants.extend(ours_blocks(cache)),
            }
            contestants.extend(papaya_blocks(&floor, kind.identity_len()));
            contestants.extend(shapes(&boxed, &confirmed, kind.identity_len()));
            let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            let figures = interleave(&keys, &mut contestants);
            println!(
                "{name}, {} order, best / median of {ROUNDS} interleaved blocks of {BLOCK} (load {}):",
                order.name(),
                load.trim()
            );
            for ((label, _), (best, median)) in contestants.iter().zip(&figures) {
                println!("  {label:>22}: {best:7.1} / {median:7.1} ns");
                common::record(
                    "hit",
                    &format!("{name}_{}_{label}_best", order.name()),
                    *best,
                );
                common::record(
                    "hit",
                    &format!("{name}_{}_{label}_median", order.name()),
                    *median,
                );
            }
            for (ours, papaya, mode) in [(0, 2, "batch"), (1, 3, "single")] {
                let (best, median) = (
                    figures[ours].0 / figures[papaya].0,
                    figures[ours].1 / figures[papaya].1,
                );
                println!(
                    "  {mode} ÷ {}: {best:.2} (best) / {median:.2} (median)",
                    contestants[papaya].0
                );
            }
        }
    }
}

fn main() {
    common::reset("hit");
    orders();
    let mut criterion = common::criterion();
    hit(&mut criterion);
    lease(&mut criterion);
    criterion.final_summary();
}
