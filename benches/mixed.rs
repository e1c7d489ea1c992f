//! Mixed traffic: 99% hits, 1% re-advertise (a client moves to a new address) or release (a
//! client leaves and comes back on its next resolve), on 1, 2 and 4 threads. Each thread owns a
//! disjoint share of the clients, so every contestant sees the same operations in the same order.
//! Every contestant's inserts and removes are real `fi_av_insert` / `fi_av_remove` calls on a
//! tcp AV: the cache's own writer for ours, the bench thread under the structure's lock for the
//! baselines (which remove at once, with no protection against the ABA the cache defers for).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::hint::black_box;
use std::sync::{Mutex, RwLock};

use common::{
    Dash, Key, Keys, Kind, Lookup, Plain, Random, RefAv, Reference, Value, av_insert, av_remove,
    parallel, sockaddr, tcp_endpoint,
};
use criterion::{Criterion, Throughput};
use dma_libfabric::sys::fid_av;

/// Live clients.
const CLIENTS: usize = 10_000;
/// One operation in this many is a re-advertise or a release.
const UPDATE_EVERY: u64 = 100;

/// Client `client`'s address in its variant `variant` (0 or 1).
fn address(client: usize, variant: u8) -> Vec<u8> {
    sockaddr(client as u32 + u32::from(variant) * 2_000_000)
}

/// What a thread does next for one of its clients.
enum Op {
    Hit(usize),
    Readvertise(usize),
    Release(usize),
}

/// The operation stream of one thread: its own clients, a fixed seed.
struct Stream {
    random: Random,
    thread: usize,
    threads: usize,
}

impl Stream {
    fn new(thread: usize, threads: usize) -> Self {
        Self {
            random: Random(0xabcd_0000 + thread as u64),
            thread,
            threads,
        }
    }

    fn next(&mut self) -> Op {
        let share = CLIENTS / self.threads;
        let client = self.thread + self.threads * self.random.below(share as u64) as usize;
        match self.random.below(2 * UPDATE_EVERY) {
            0 => Op::Readvertise(client),
            1 => Op::Release(client),
            _ => Op::Hit(client),
        }
    }
}

/// Per-thread view of its clients: which address each advertises now.
struct Local {
    addresses: Vec<[Vec<u8>; 2]>,
    variant: Vec<u8>,
}

impl Local {
    fn new() -> Self {
        Self {
            addresses: (0..CLIENTS)
                .map(|client| [address(client, 0), address(client, 1)])
                .collect(),
            variant: vec![0; CLIENTS],
        }
    }

    fn current(&self, client: usize) -> &[u8] {
        &self.addresses[client][usize::from(self.variant[client])]
    }
}

/// A locked map over a raw AV, as the RwLock and dashmap baselines use it.
trait Locked: Sync {
    fn hit(&self, client: u64, address: &[u8]) -> Option<u64>;
    fn insert(&self, client: u64, address: &[u8]) -> u64;
    fn remove(&self, client: u64, address: &[u8]);
}

struct RwBaseline {
    map: RwLock<Plain>,
    av: AvPtr,
}

struct DashBaseline {
    map: Dash,
    av: AvPtr,
}

#[derive(Clone, Copy)]
struct AvPtr(*mut fid_av);
// SAFETY: the AV belongs to a FI_THREAD_SAFE domain that outlives every bench thread.
unsafe impl Send for AvPtr {}
// SAFETY: as for `Send`.
unsafe impl Sync for AvPtr {}

impl Locked for RwBaseline {
    fn hit(&self, client: u64, address: &[u8]) -> Option<u64> {
        common::probe(&self.map.read().unwrap(), 16, client, address)
    }

    fn insert(&self, client: u64, address: &[u8]) -> u64 {
        let mut map = self.map.write().unwrap();
        let lookup = Lookup {
            client,
            identity: address,
        };
        if let Some(value) = map.get(&lookup) {
            return value.fi_addr;
        }
        let fi_addr = av_insert(self.av.0, address).unwrap();
        map.insert(Key::new(client, address), Value::new(address, fi_addr));
        fi_addr
    }

    fn remove(&self, client: u64, address: &[u8]) {
        let mut map = self.map.write().unwrap();
        let lookup = Lookup {
            client,
            identity: address,
        };
        if let Some(value) = map.remove(&lookup) {
            av_remove(self.av.0, value.fi_addr);
        }
    }
}

// dashmap's hit probes with the borrowed key (`common::probe_dashmap`); its `entry` and `remove`
// take only an owned or `Borrow`ed key, so an insert or a remove (1% of operations) builds one.
impl Locked for DashBaseline {
    fn hit(&self, client: u64, address: &[u8]) -> Option<u64> {
        common::probe_dashmap(&self.map, 16, client, address)
    }

    fn insert(&self, client: u64, address: &[u8]) -> u64 {
        self.map
            .entry(Key::new(client, address))
            .or_insert_with(|| Value::new(address, av_insert(self.av.0, address).unwrap()))
            .fi_addr
    }

    fn remove(&self, client: u64, address: &[u8]) {
        if let Some((_, value)) = self.map.remove(&Key::new(client, address)) {
            av_remove(self.av.0, value.fi_addr);
        }
    }
}

fn run_locked(baseline: &impl Locked, thread: usize, threads: usize, iters: u64) {
    let mut stream = Stream::new(thread, threads);
    let mut local = Local::new();
    for _ in 0..iters {
        match stream.next() {
            Op::Hit(client) => {
                let address = local.current(client);
                let fi_addr = match baseline.hit(client as u64, address) {
                    Some(fi_addr) => fi_addr,
                    None => baseline.insert(client as u64, address),
                };
                black_box(fi_addr);
            }
            Op::Readvertise(client) => {
                baseline.remove(client as u64, local.current(client));
                local.variant[client] ^= 1;
                black_box(baseline.insert(client as u64, local.current(client)));
            }
            Op::Release(client) => baseline.remove(client as u64, local.current(client)),
        }
    }
    // Put every client back on variant 0, live, so the next sample starts where this one did.
    for client in (thread..CLIENTS).step_by(threads) {
        if 1 == local.variant[client] {
            baseline.remove(client as u64, local.current(client));
            local.variant[client] = 0;
        }
        baseline.insert(client as u64, local.current(client));
    }
}

fn mixed(criterion: &mut Criterion) {
    let keys = Keys::new(Kind::Tcp, CLIENTS);
    let ours = tcp_endpoint(4 * CLIENTS);
    common::warm(ours.cache(), &keys);
    let cache = ours.cache();

    let reference_endpoint = tcp_endpoint(4 * CLIENTS);
    let reference = Mutex::new(Reference::new(
        Kind::Tcp,
        RefAv::Raw(reference_endpoint.address_vector()),
        CLIENTS,
    ));
    let rw_endpoint = tcp_endpoint(4 * CLIENTS);
    let rwlock = RwBaseline {
        map: RwLock::new(Plain::default()),
        av: AvPtr(rw_endpoint.address_vector()),
    };
    let dash_endpoint = tcp_endpoint(4 * CLIENTS);
    let dash = DashBaseline {
        map: Dash::default(),
        av: AvPtr(dash_endpoint.address_vector()),
    };
    for client in 0..CLIENTS {
        let address = address(client, 0);
        reference
            .lock()
            .unwrap()
            .handle(client as u64, &address)
            .unwrap();
        rwlock.insert(client as u64, &address);
        dash.insert(client as u64, &address);
    }

    for threads in [1, 2, 4] {
        let mut group = criterion.benchmark_group(format!("mixed_tcp_t{threads}"));
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_function("ours", |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, &|thread, iters| {
                    let mut stream = Stream::new(thread, threads);
                    let mut local = Local::new();
                    for _ in 0..iters {
                        match stream.next() {
                            Op::Hit(client) => {
                                let pinned = cache.pin();
                                let peer = pinned.resolve(client as u64, local.current(client));
                                black_box(peer.unwrap().fi_addr());
                            }
                            Op::Readvertise(client) => {
                                local.variant[client] ^= 1;
                                let pinned = cache.pin();
                                let peer = pinned.resolve(client as u64, local.current(client));
                                black_box(peer.unwrap().fi_addr());
                            }
                            Op::Release(client) => cache.release(client as u64),
                        }
                    }
                    for client in (thread..CLIENTS).step_by(threads) {
                        local.variant[client] = 0;
                        let pinned = cache.pin();
                        black_box(
                            pinned
                                .resolve(client as u64, local.current(client))
                                .unwrap(),
                        );
                    }
                })
            })
        });
        group.bench_function("mutex_reference", |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, &|thread, iters| {
                    let mut stream = Stream::new(thread, threads);
                    let mut local = Local::new();
                    for _ in 0..iters {
                        match stream.next() {
                            Op::Hit(client) => {
                                let entry = reference
                                    .lock()
                                    .unwrap()
                                    .handle(client as u64, local.current(client))
                                    .unwrap();
                                black_box(entry.fi_addr());
                            }
                            Op::Readvertise(client) => {
                                local.variant[client] ^= 1;
                                let entry = reference
                                    .lock()
                                    .unwrap()
                                    .handle(client as u64, local.current(client))
                                    .unwrap();
                                black_box(entry.fi_addr());
                            }
                            Op::Release(client) => {
                                reference.lock().unwrap().release(client as u64);
                            }
                        }
                    }
                    for client in (thread..CLIENTS).step_by(threads) {
                        local.variant[client] = 0;
                        let mut model = reference.lock().unwrap();
                        black_box(model.handle(client as u64, local.current(client)).unwrap());
                    }
                })
            })
        });
        group.bench_function("rwlock_hashmap", |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, &|thread, iters| {
                    run_locked(&rwlock, thread, threads, iters);
                })
            })
        });
        group.bench_function("dashmap", |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, &|thread, iters| {
                    run_locked(&dash, thread, threads, iters);
                })
            })
        });
        group.finish();
    }

    // Everything the baselines inserted leaves their AVs before the endpoints close.
    reference.lock().unwrap().clear();
    for (key, value) in rwlock.map.write().unwrap().drain() {
        let _ = key;
        av_remove(rwlock.av.0, value.fi_addr);
    }
    let keys_left: Vec<Key> = dash.map.iter().map(|entry| *entry.key()).collect();
    for key in keys_left {
        if let Some((_, value)) = dash.map.remove(&key) {
            av_remove(dash.av.0, value.fi_addr);
        }
    }
    for client in 0..CLIENTS {
        cache.release(client as u64);
    }
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!((0, 0), (stats.entries, stats.pending_removals));
    assert_eq!(stats.inserts, stats.removes);
}

fn main() {
    let mut criterion = common::criterion();
    mixed(&mut criterion);
    criterion.final_summary();
}
