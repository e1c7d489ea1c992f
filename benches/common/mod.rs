//! What the benches share: the keys, the baselines (DESIGN.md), the endpoints, and where the
//! figures criterion does not measure are written for `scripts/bench-table`.
//!
//! Every baseline is keyed like the cache's index: the pair (client, identity), hashed with the
//! same foldhash (`write_u64(client)` then `write(identity)`), looked up with a borrowed
//! [`Lookup`] (as the cache looks up with its own borrowed `Lookup`, building no key), compared on
//! the identity, and a hit confirmed against the full address. Only the storage differs: the
//! baselines keep the key inline, and the unsynchronised `HashMap` probe is what the same lookup
//! costs with no synchronisation at all. Two rows of `hit` go below it: [`Floor`], a bare papaya map of the same keys
//! (what the cache's index is built on), and [`BareMap`], a map keyed by the address alone.
//!
//! Every timed loop, ours and the baselines', draws its probes from a [`Cursor`] over the same
//! walk, so the loop around a probe costs every contestant the same.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::hash::Hasher as StdHasher;
use std::hash::{BuildHasher, Hash};
use std::io::Write;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use criterion::Criterion;
use dma_libfabric::sys::{self, fi_addr_t};
use dma_libfabric::{AddressCache, AddressFormat, AvBackend, Configuration, LibfabricEndpoint};
use dma_libfabric::{DmaError, ModelAv};

/// The hasher of the cache's index, and so of every baseline.
pub type Hasher = foldhash::fast::RandomState;

/// Criterion settings short enough for the whole run on 2 cores.
pub fn criterion() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .without_plots()
        .configure_from_args()
}

/// Which addresses a bench uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 32-byte efa addresses over the model AV (identity: GID + QPN, 18 bytes).
    Efa,
    /// 16-byte `sockaddr_in`s over a real tcp AV.
    Tcp,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Efa => "efa",
            Self::Tcp => "tcp",
        }
    }

    pub fn address_len(self) -> usize {
        match self {
            Self::Efa => 32,
            Self::Tcp => 16,
        }
    }

    pub fn identity_len(self) -> usize {
        match self {
            Self::Efa => 18,
            Self::Tcp => 16,
        }
    }

    pub fn format(self) -> AddressFormat {
        match self {
            Self::Efa => AddressFormat::Efa,
            Self::Tcp => AddressFormat::Opaque,
        }
    }

    /// Address number `n` (distinct for every `n` below 16 million).
    pub fn address(self, n: u32) -> Vec<u8> {
        match self {
            Self::Efa => efa(n),
            Self::Tcp => sockaddr(n),
        }
    }
}

pub use testkit::{Random, sockaddr};

/// efa address number `n`.
pub fn efa(n: u32) -> Vec<u8> {
    testkit::efa_numbered(n)
}

/// `n` live entries: client `i` advertises address `i`.
pub struct Keys {
    pub kind: Kind,
    pub addresses: Vec<Vec<u8>>,
    /// The order probes visit them in (see [`Order`]), the same for every contestant.
    pub order: Vec<u32>,
    /// The probes in that order, each address inline: what a [`Cursor`] walks.
    walk: Vec<Probe>,
}

/// One probe of the walk: a client and its address, inline.
#[derive(Clone, Copy)]
struct Probe {
    client: u64,
    len: u8,
    address: [u8; 32],
}

/// The order a walk visits the keys in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// A random permutation, the same for every contestant.
    Random,
    /// The order the keys were inserted in (client 0, 1, 2, ...), as the cache was warmed and
    /// every baseline built.
    Inserted,
}

impl Order {
    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::Inserted => "inserted",
        }
    }
}

impl Keys {
    /// `n` keys of `kind`, walked in a random order.
    pub fn new(kind: Kind, n: usize) -> Self {
        Self::with_order(kind, n, Order::Random)
    }

    /// `n` keys of `kind`, walked in `order`.
    pub fn with_order(kind: Kind, n: usize, visit: Order) -> Self {
        let addresses: Vec<Vec<u8>> = (0..n as u32).map(|i| kind.address(i)).collect();
        let mut order: Vec<u32> = (0..n as u32).collect();
        if visit == Order::Random {
            let mut random = Random::new(0x5eed_1234_abcd_0001);
            for i in (1..order.len()).rev() {
                order.swap(i, random.below(i as u64 + 1) as usize);
            }
        }
        let walk = order
            .iter()
            .map(|&i| {
                let bytes = &addresses[i as usize];
                let mut address = [0; 32];
                address[..bytes.len()].copy_from_slice(bytes);
                Probe {
                    client: u64::from(i),
                    len: bytes.len() as u8,
                    address,
                }
            })
            .collect();
        Self {
            kind,
            addresses,
            order,
            walk,
        }
    }

    pub fn len(&self) -> usize {
        self.addresses.len()
    }

    /// The `step`-th probe: (client, address). For set-up code: it takes a modulo and reads
    /// through `order`; timed loops draw from a [`Cursor`].
    pub fn probe(&self, step: usize) -> (u64, &[u8]) {
        let i = self.order[step % self.order.len()] as usize;
        (i as u64, &self.addresses[i])
    }

    /// A walk through every key in `order`, starting at its `start`-th probe and wrapping.
    pub fn cursor(&self, start: usize) -> Cursor<'_> {
        assert!(!self.walk.is_empty(), "a walk needs a key");
        Cursor {
            walk: &self.walk,
            at: start % self.walk.len(),
        }
    }
}

/// Where a timed loop is in the walk through the keys. Every contestant, ours and each baseline,
/// draws its probes through [`next_probe`](Self::next_probe): a sequential read of the next
/// probe (client and inline address, in visiting order) and an increment that wraps with a
/// compare, no modulo and no pointer to follow before the probe itself.
#[derive(Clone)]
pub struct Cursor<'k> {
    walk: &'k [Probe],
    at: usize,
}

impl<'k> Cursor<'k> {
    /// The next probe: (client, address).
    #[inline(always)]
    pub fn next_probe(&mut self) -> (u64, &'k [u8]) {
        let probe = &self.walk[self.at];
        self.at += 1;
        if self.at == self.walk.len() {
            self.at = 0;
        }
        (probe.client, &probe.address[..usize::from(probe.len)])
    }
}

/// A tcp endpoint on 127.0.0.1 whose AV holds `capacity` entries.
pub fn tcp_endpoint(capacity: usize) -> LibfabricEndpoint {
    let configuration = Configuration {
        av_capacity: capacity,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint on 127.0.0.1")
}

/// The cache under test: the endpoint's own (tcp), or one over the model AV (efa).
pub enum Subject {
    Tcp(LibfabricEndpoint),
    Efa(AddressCache<ModelAv>),
}

impl Subject {
    pub fn new(kind: Kind, capacity: usize) -> Self {
        match kind {
            Kind::Tcp => Self::Tcp(tcp_endpoint(capacity)),
            Kind::Efa => Self::Efa(AddressCache::with_backend(ModelAv::with_layout(
                AddressFormat::Efa,
                32,
                capacity,
            ))),
        }
    }

    /// Resolve every key once, so the cache is warm.
    pub fn warm(&self, keys: &Keys) {
        match self {
            Self::Tcp(endpoint) => warm(endpoint.cache(), keys),
            Self::Efa(cache) => warm(cache, keys),
        }
    }
}

pub fn warm<B: AvBackend>(cache: &AddressCache<B>, keys: &Keys) {
    for (client, address) in keys.addresses.iter().enumerate() {
        cache
            .pin()
            .resolve(client as u64, address)
            .expect("resolve while warming");
    }
    assert_eq!(keys.len() as u64, cache.stats().entries);
}

/// A baseline key: the pair (client, identity), stored inline.
#[derive(Clone, Copy)]
pub struct Key {
    client: u64,
    len: u8,
    identity: [u8; 32],
}

impl Key {
    #[inline]
    pub fn new(client: u64, identity: &[u8]) -> Self {
        let mut bytes = [0_u8; 32];
        bytes[..identity.len()].copy_from_slice(identity);
        Self {
            client,
            len: identity.len() as u8,
            identity: bytes,
        }
    }

    fn identity(&self) -> &[u8] {
        &self.identity[..usize::from(self.len)]
    }
}

// `Key` and its `Lookup` hash the cache's sequence: `write_u64(client)`, then `write(identity)`.
impl Hash for Key {
    #[inline]
    fn hash<H: StdHasher>(&self, state: &mut H) {
        Lookup {
            client: self.client,
            identity: self.identity(),
        }
        .hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.client == other.client && self.identity() == other.identity()
    }
}

impl Eq for Key {}

/// A borrowed baseline key, what every baseline probes with: the cache's own `Lookup`
/// (src/cache/index.rs) field for field, so no probe builds or copies a key.
#[derive(Debug, Clone, Copy)]
pub struct Lookup<'a> {
    pub client: u64,
    pub identity: &'a [u8],
}

impl<'a> Lookup<'a> {
    /// The key `client` probes with for `address`, whose first `identity_len` bytes are its
    /// identity.
    #[inline]
    pub fn of(client: u64, address: &'a [u8], identity_len: usize) -> Self {
        Self {
            client,
            identity: &address[..identity_len],
        }
    }
}

impl Hash for Lookup<'_> {
    #[inline]
    fn hash<H: StdHasher>(&self, state: &mut H) {
        state.write_u64(self.client);
        state.write(self.identity);
    }
}

// One trait for hashbrown and papaya: both re-export the `equivalent` crate's.
impl hashbrown::Equivalent<Key> for Lookup<'_> {
    #[inline]
    fn equivalent(&self, key: &Key) -> bool {
        self.client == key.client && *self.identity == *key.identity()
    }
}

/// A baseline value: the full address, to confirm the incarnation, and the `fi_addr_t`.
#[derive(Clone, Copy)]
pub struct Value {
    len: u8,
    address: [u8; 32],
    pub fi_addr: fi_addr_t,
}

impl Value {
    pub fn new(address: &[u8], fi_addr: fi_addr_t) -> Self {
        let mut bytes = [0_u8; 32];
        bytes[..address.len()].copy_from_slice(address);
        Self {
            len: address.len() as u8,
            address: bytes,
            fi_addr,
        }
    }

    #[inline]
    pub fn confirms(&self, address: &[u8]) -> bool {
        self.address[..usize::from(self.len)] == *address
    }
}

/// The unsynchronised map every baseline builds on (hashbrown, which std's `HashMap` wraps, for
/// its `Equivalent` lookups).
pub type Plain = hashbrown::HashMap<Key, Value, Hasher>;

/// Every key's entry, as each map-based baseline holds it: client `i` on address `i`, at index `i`.
pub fn entries(keys: &Keys) -> impl Iterator<Item = (Key, Value)> + '_ {
    keys.addresses.iter().enumerate().map(|(client, address)| {
        let identity = &address[..keys.kind.identity_len()];
        (
            Key::new(client as u64, identity),
            Value::new(address, client as u64),
        )
    })
}

pub fn plain(keys: &Keys) -> Plain {
    let mut map = Plain::with_capacity_and_hasher(keys.len(), Hasher::default());
    map.extend(entries(keys));
    same_hashes(map.hasher(), keys);
    map
}

/// Check that a key and its borrowed lookup hash alike, and as the cache hashes.
fn same_hashes(hasher: &Hasher, keys: &Keys) {
    let identity_len = keys.kind.identity_len();
    if let Some((key, _)) = entries(keys).next() {
        let lookup = Lookup {
            client: key.client,
            identity: key.identity(),
        };
        let cache = hash_of(hasher, key.client, &keys.addresses[0][..identity_len]);
        assert_eq!(cache, hasher.hash_one(key));
        assert_eq!(cache, hasher.hash_one(lookup));
    }
}

/// The baselines' probe: `client`'s entry for `address`, looked up by the borrowed (client,
/// identity), confirmed on the full address.
#[inline]
pub fn probe(map: &Plain, identity_len: usize, client: u64, address: &[u8]) -> Option<fi_addr_t> {
    let lookup = Lookup::of(client, address, identity_len);
    let value = map.get(&lookup)?;
    value.confirms(address).then_some(value.fi_addr)
}

pub type Dash = dashmap::DashMap<Key, Value, Hasher>;

pub fn dashmap(keys: &Keys) -> Dash {
    let map = Dash::with_capacity_and_hasher(keys.len(), Hasher::default());
    for (key, value) in entries(keys) {
        map.insert(key, value);
    }
    same_hashes(map.hasher(), keys);
    map
}

/// dashmap's probe. dashmap 6's `get` takes only a key the map's key `Borrow`s, which would mean
/// building a whole `Key` a probe; so this is the body of its `get` (`DashMap::_get`) through
/// its `raw-api`, with the borrowed [`Lookup`]: hash once, pick the shard from the hash,
/// read-lock the shard, probe its table, read the value under the lock. What it does that the
/// cache does not is dashmap itself: the shard's read lock (an atomic add and subtract on a
/// counter every reader of the shard shares).
#[inline]
pub fn probe_dashmap(
    map: &Dash,
    identity_len: usize,
    client: u64,
    address: &[u8],
) -> Option<fi_addr_t> {
    use hashbrown::Equivalent;
    let lookup = Lookup::of(client, address, identity_len);
    let hash = map.hasher().hash_one(lookup);
    let shard = map.shards()[map.determine_shard(hash as usize)].read();
    let (_, value) = shard.get(hash, |(key, _)| lookup.equivalent(key))?;
    let value = value.get();
    value.confirms(address).then_some(value.fi_addr)
}

pub fn rwlock(keys: &Keys) -> RwLock<Plain> {
    RwLock::new(plain(keys))
}

#[inline]
pub fn probe_rwlock(
    map: &RwLock<Plain>,
    identity_len: usize,
    client: u64,
    address: &[u8],
) -> Option<fi_addr_t> {
    probe(&map.read().unwrap(), identity_len, client, address)
}

/// The floor under the cache's hit: a bare papaya map of the same (client, identity) keys, held
/// inline, to the `fi_addr_t`, built as the cache's index is (foldhash, pre-sized, blocking
/// resizes). Its probe confirms nothing and checks no address: it is papaya's `get` alone.
pub type Floor = papaya::HashMap<Key, fi_addr_t, Hasher>;

/// The floor map of `keys`, pre-sized to `capacity` as the cache's index is to its AV's.
pub fn floor(keys: &Keys, capacity: usize) -> Floor {
    let hasher = Hasher::default();
    same_hashes(&hasher, keys);
    let map = papaya::HashMap::builder()
        .hasher(hasher)
        .capacity(capacity)
        .resize_mode(papaya::ResizeMode::Blocking)
        .build();
    {
        let guard = map.guard();
        for (key, value) in entries(keys) {
            map.insert(key, value.fi_addr, &guard);
        }
    }
    map
}

/// papaya's `get` of the borrowed (client, identity), under a guard the caller holds.
#[inline]
pub fn probe_floor(
    map: &Floor,
    guard: &papaya::LocalGuard<'_>,
    identity_len: usize,
    client: u64,
    address: &[u8],
) -> Option<fi_addr_t> {
    let lookup = Lookup::of(client, address, identity_len);
    map.get(&lookup, guard).copied()
}

/// The physical limit of a hash-map hit: an address alone, `N` bytes inline, the whole key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bare<const N: usize>([u8; N]);

impl<const N: usize> Hash for Bare<N> {
    #[inline]
    fn hash<H: StdHasher>(&self, state: &mut H) {
        state.write(&self.0);
    }
}

/// A borrowed [`Bare`] key: the probe's address bytes.
#[derive(Clone, Copy)]
pub struct BareLookup<'a>(pub &'a [u8]);

impl Hash for BareLookup<'_> {
    #[inline]
    fn hash<H: StdHasher>(&self, state: &mut H) {
        state.write(self.0);
    }
}

impl<const N: usize> hashbrown::Equivalent<Bare<N>> for BareLookup<'_> {
    #[inline]
    fn equivalent(&self, key: &Bare<N>) -> bool {
        *self.0 == key.0
    }
}

/// An unsynchronised map from the address alone to the `fi_addr_t`, foldhash: no client, no
/// identity, no confirmation. `N` is the address length.
pub type BareMap<const N: usize> = hashbrown::HashMap<Bare<N>, fi_addr_t, Hasher>;

pub fn bare<const N: usize>(keys: &Keys) -> BareMap<N> {
    let mut map = BareMap::with_capacity_and_hasher(keys.len(), Hasher::default());
    for (client, address) in keys.addresses.iter().enumerate() {
        let key = Bare(address.as_slice().try_into().expect("an N-byte address"));
        map.insert(key, client as u64);
    }
    map
}

#[inline]
pub fn probe_bare<const N: usize>(map: &BareMap<N>, address: &[u8]) -> Option<fi_addr_t> {
    map.get(&BareLookup(address)).copied()
}

/// Where the reference model's entries go: the real AV, or nowhere (hit benches, which never
/// insert after warming, and so may use a counter).
pub enum RefAv {
    Counter(fi_addr_t),
    Raw(*mut sys::fid_av),
}

// SAFETY: the raw AV belongs to a FI_THREAD_SAFE domain, and the model is only used under its
// mutex.
unsafe impl Send for RefAv {}

impl RefAv {
    fn insert(&mut self, address: &[u8]) -> Result<fi_addr_t, DmaError> {
        match self {
            Self::Counter(next) => {
                *next += 1;
                Ok(*next - 1)
            }
            Self::Raw(av) => av_insert(*av, address),
        }
    }

    fn remove(&mut self, fi_addr: fi_addr_t) {
        if let Self::Raw(av) = self {
            av_remove(*av, fi_addr);
        }
    }
}

/// `fi_av_insert` of one address on a raw AV.
pub fn av_insert(av: *mut sys::fid_av, address: &[u8]) -> Result<fi_addr_t, DmaError> {
    let mut fi_addr = sys::FI_ADDR_NOTAVAIL;
    // SAFETY: `av` is an open AV of a tcp endpoint that outlives the call; `address` holds the
    // provider's 16 bytes; `fi_addr` has room for the one index written.
    let inserted = unsafe {
        sys::fi_av_insert(
            av,
            address.as_ptr().cast(),
            1,
            &raw mut fi_addr,
            0,
            std::ptr::null_mut(),
        )
    };
    if 1 == inserted {
        Ok(fi_addr)
    } else {
        Err(DmaError::InvalidArgument(format!(
            "fi_av_insert returned {inserted}"
        )))
    }
}

/// `fi_av_remove` of one index on a raw AV.
pub fn av_remove(av: *mut sys::fid_av, fi_addr: fi_addr_t) {
    let mut fi_addr = fi_addr;
    // SAFETY: `av` is open and `fi_addr` is an index this bench inserted and has not removed.
    let code = unsafe { sys::fi_av_remove(av, &raw mut fi_addr, 1, 0) };
    assert_eq!(0, code, "fi_av_remove");
}

/// One AV entry of the reference model; it leaves the AV when the last client drops it.
pub struct RefEntry {
    fi_addr: fi_addr_t,
    av: Arc<Mutex<RefAv>>,
}

impl RefEntry {
    pub fn fi_addr(&self) -> fi_addr_t {
        self.fi_addr
    }
}

impl Drop for RefEntry {
    fn drop(&mut self) {
        self.av.lock().unwrap().remove(self.fi_addr);
    }
}

/// An identity key of the reference model's dedup index, with the full address beside it.
struct RefAddress {
    bytes: Box<[u8]>,
    identity_len: usize,
}

impl std::borrow::Borrow<[u8]> for RefAddress {
    fn borrow(&self) -> &[u8] {
        &self.bytes[..self.identity_len]
    }
}

impl Hash for RefAddress {
    fn hash<H: StdHasher>(&self, state: &mut H) {
        let identity: &[u8] = std::borrow::Borrow::borrow(self);
        identity.hash(state);
    }
}

impl PartialEq for RefAddress {
    fn eq(&self, other: &Self) -> bool {
        self.bytes[..self.identity_len] == other.bytes[..other.identity_len]
    }
}

impl Eq for RefAddress {}

/// The seed's `PeerAddresses`, in the bench's words: a dedup index of weak entries by identity,
/// the ownership (and so the refcount) by client, and a lookup that replaces the client's `Arc`
/// on every call, as the seed's `handle` does. Shared as a user would share it: in a `Mutex`.
pub struct Reference {
    identity_len: usize,
    by_address: HashMap<RefAddress, Weak<RefEntry>, Hasher>,
    by_client: HashMap<u64, Arc<RefEntry>, Hasher>,
    av: Arc<Mutex<RefAv>>,
    /// Index size at which dead weak entries are swept (the seed's policy).
    sweep_at: usize,
}

impl Reference {
    pub fn new(kind: Kind, av: RefAv, capacity: usize) -> Self {
        Self {
            identity_len: kind.identity_len(),
            by_address: HashMap::with_capacity_and_hasher(capacity, Hasher::default()),
            by_client: HashMap::with_capacity_and_hasher(capacity, Hasher::default()),
            av: Arc::new(Mutex::new(av)),
            sweep_at: 64,
        }
    }

    pub fn warmed(kind: Kind, keys: &Keys) -> Self {
        let mut model = Self::new(kind, RefAv::Counter(0), keys.len());
        for (client, address) in keys.addresses.iter().enumerate() {
            model.handle(client as u64, address).unwrap();
        }
        model
    }

    /// The seed's `handle`: the entry `client` posts to for `address`.
    #[inline]
    pub fn handle(&mut self, client: u64, address: &[u8]) -> Result<Arc<RefEntry>, DmaError> {
        let identity = &address[..self.identity_len];
        let held = self
            .by_address
            .get_key_value(identity)
            .and_then(|(known, entry)| {
                entry
                    .upgrade()
                    .map(|entry| (*known.bytes == *address, entry))
            });
        match held {
            Some((true, entry)) => {
                self.by_client.insert(client, Arc::clone(&entry));
                return Ok(entry);
            }
            Some((false, stale)) => {
                self.by_client.retain(|_, held| !Arc::ptr_eq(held, &stale));
            }
            None => {}
        }
        self.by_client.remove(&client);
        self.by_address.remove(identity);
        let fi_addr = self.av.lock().unwrap().insert(address)?;
        let entry = Arc::new(RefEntry {
            fi_addr,
            av: Arc::clone(&self.av),
        });
        if self.by_address.len() >= self.sweep_at {
            self.sweep();
            self.sweep_at = 64.max(self.by_address.len() * 2);
        }
        self.by_address.insert(
            RefAddress {
                bytes: address.into(),
                identity_len: self.identity_len,
            },
            Arc::downgrade(&entry),
        );
        self.by_client.insert(client, Arc::clone(&entry));
        Ok(entry)
    }

    /// The seed's `release`.
    pub fn release(&mut self, client: u64) {
        // Dropping the last `Arc` removes the entry from the AV.
        self.by_client.remove(&client);
    }

    /// Drop dead index keys, as the seed's sweep does.
    pub fn sweep(&mut self) {
        self.by_address.retain(|_, entry| 0 < entry.strong_count());
    }

    pub fn clear(&mut self) {
        self.by_client.clear();
        self.by_address.clear();
    }
}

#[inline]
pub fn probe_reference(model: &Mutex<Reference>, client: u64, address: &[u8]) -> fi_addr_t {
    // The caller posts while holding the `Arc`, then drops it.
    let entry = model.lock().unwrap().handle(client, address).unwrap();
    entry.fi_addr()
}

/// Run `work(thread, iters)` on `threads` threads at once and time the whole, from the moment
/// all of them are ready to the moment the last one finishes.
pub fn parallel<F: Fn(usize, u64) + Sync>(threads: usize, iters: u64, work: &F) -> Duration {
    let ready = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let ready = &ready;
                scope.spawn(move || {
                    ready.wait();
                    work(thread, iters);
                })
            })
            .collect();
        ready.wait();
        let started = std::time::Instant::now();
        for handle in handles {
            handle.join().unwrap();
        }
        started.elapsed()
    })
}

/// Hash the way the cache does, for a sanity check that the baselines see the same hashes.
pub fn hash_of(hasher: &Hasher, client: u64, identity: &[u8]) -> u64 {
    let mut state = hasher.build_hasher();
    state.write_u64(client);
    state.write(identity);
    state.finish()
}

/// Record a figure criterion does not measure (or a derived one) for `scripts/bench-table`:
/// one `name<TAB>value` line in `$CARGO_TARGET_DIR/bench-results/<bench>.tsv`.
pub fn record(bench: &str, name: &str, value: f64) {
    let directory = results_dir();
    std::fs::create_dir_all(&directory).unwrap();
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(directory.join(format!("{bench}.tsv")))
        .unwrap();
    writeln!(file, "{name}\t{value}").unwrap();
    println!("{bench}: {name} = {value:.3}");
}

/// Start a fresh results file for `bench`.
pub fn reset(bench: &str) {
    let _ = std::fs::remove_file(results_dir().join(format!("{bench}.tsv")));
}

fn results_dir() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("bench-results")
}
