//! The published index readers probe: one entry per (client, identity) registration.
//!
//! The key folds the client check into the one probe a hit costs: a reader looks up the pair
//! (client id, identity slice) with a borrowed [`Lookup`], which builds nothing on the heap, and a
//! hit then compares the full address bytes. So a registration is found only for a client the
//! writer registered on that very address, and a new QKEY on a known efa slot, or a client that
//! was evicted, is a miss that goes to the writer.
//!
//! Only the writer thread inserts and removes; readers only probe. papaya's own reclamation
//! (seize) keeps a key alive while a reader's guard may still see it, so a reader may read a key
//! the writer has just unlinked. That is memory safety only: whether the *fi_addr_t* in it is
//! still in the AV is the epoch deferral's business (see the `cache` module).
//!
//! A reader's guard lives as long as its pin, so a hit does not pay papaya's enter and leave (an
//! atomic swap) per probe. What keeps that bounded: the index counts the writer's changes
//! ([`RegistrationIndex::retirements`], bumped after every publish and unlink, alone on its
//! cache line), and a probe that sees the count moved refreshes its guard first, letting go of
//! every node retired since its last refresh. A pin that stops probing holds what is retired
//! until its next probe (`tests/soak.rs` measures it).

use std::hash::{Hash, Hasher};

use super::stored::StoredAddress;
use dma_libfabric_sys::fi_addr_t;

/// The hasher: foldhash, seeded per map. Lookups hash a `u64` and 16 to 18 bytes, where
/// SipHash would cost more than the probe.
#[cfg(not(dma_loom))]
pub(crate) type IndexHasher = foldhash::fast::RandomState;

/// A registration: `client` posts to the entry for `address`. The address is stored inline up to
/// 32 bytes (efa's 32, a `sockaddr_in6`'s 28, a `sockaddr_in`'s 16), so a hit reads the key's
/// bytes from the node papaya already loaded instead of following one more pointer.
#[derive(Debug)]
pub(crate) struct Registration {
    client: u64,
    /// The full address, so a hit can confirm the incarnation too, and its identity's length.
    address: StoredAddress,
}

impl Registration {
    pub(crate) fn new(client: u64, address: StoredAddress) -> Self {
        Self { client, address }
    }

    #[inline]
    fn address(&self) -> &[u8] {
        self.address.bytes()
    }

    #[inline]
    fn identity(&self) -> &[u8] {
        self.address.identity()
    }
}

/// A borrowed key: what a reader probes with.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(dma_loom, allow(dead_code))]
pub(crate) struct Lookup<'a> {
    pub(crate) client: u64,
    pub(crate) identity: &'a [u8],
}

/// A reader's probe: the client and the whole address, whose first `identity_len` bytes are the
/// identity. It hashes as the `(client, identity)` key does, and is equivalent only to the
/// registration of that client on exactly that address: so one comparison confirms the key and
/// the incarnation, and a registration on another incarnation of the identity is a miss, as it
/// must be (the writer decides what becomes of it).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(dma_loom, allow(dead_code))]
pub(crate) struct Probe<'a> {
    pub(crate) client: u64,
    pub(crate) identity_len: usize,
    pub(crate) address: &'a [u8],
}

impl Hash for Probe<'_> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        Lookup {
            client: self.client,
            identity: &self.address[..self.identity_len.min(self.address.len())],
        }
        .hash(state);
    }
}

impl papaya::Equivalent<Registration> for Probe<'_> {
    #[inline]
    fn equivalent(&self, key: &Registration) -> bool {
        self.client == key.client && same_bytes(self.address, key.address())
    }
}

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

// `Hash` writes the same sequence for a `Registration` and for a `Lookup` or `Probe` of it, and
// `Eq` and `Equivalent` compare the same fields (a `Probe` the whole address, which decides the
// identity too), as papaya requires of a borrowed key.
impl Hash for Registration {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Lookup {
            client: self.client,
            identity: self.identity(),
        }
        .hash(state);
    }
}

impl Hash for Lookup<'_> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.client);
        state.write(self.identity);
    }
}

impl PartialEq for Registration {
    fn eq(&self, other: &Self) -> bool {
        self.client == other.client && self.identity() == other.identity()
    }
}

impl Eq for Registration {}

impl papaya::Equivalent<Registration> for Lookup<'_> {
    #[inline]
    fn equivalent(&self, key: &Registration) -> bool {
        self.client == key.client && self.identity == key.identity()
    }
}

/// What the cache needs of its index: readers probe under a guard, the writer alone publishes
/// and unlinks. Two implementations: papaya in the build that ships, and a locked map under loom,
/// which cannot see papaya's per-thread reclamation state. The protocol's proof needs only that a
/// probe after an unlink (in the writer's program order, ordered by the epoch fences) misses,
/// which both give.
pub(crate) trait RegistrationIndex: Send + Sync {
    /// A reader's guard on the index's memory.
    type Guard<'a>
    where
        Self: 'a;
    fn guard(&self) -> Self::Guard<'_>;
    /// How many times the writer has changed the index in a way that may retire index memory
    /// (an unlink, a publish, which may replace a node or resize the table): a reader that holds
    /// its guard across probes refreshes it when this moved. Relaxed: it only says when to let
    /// go of memory, never what a probe may see.
    fn retirements(&self) -> u64;
    /// Let go of what `guard` protects and protect afresh, on the calling thread: what the
    /// writer retired meanwhile may be reclaimed (on this thread, if it is the last to leave it).
    fn refresh(guard: &mut Self::Guard<'_>);
    /// The entry `client` is registered on for exactly `address`, whose first `identity_len`
    /// bytes are its identity.
    fn get(
        &self,
        guard: &Self::Guard<'_>,
        client: u64,
        identity_len: usize,
        address: &[u8],
    ) -> Option<fi_addr_t>;
    /// Publish a registration. Writer only.
    fn publish(&self, registration: Registration, fi_addr: fi_addr_t);
    /// Unlink a registration. Writer only.
    fn unlink(&self, client: u64, identity: &[u8]);
    /// How many registrations are published.
    fn len(&self) -> usize;
    /// The clients registered on index `fi_addr`, in no order: a scan of every registration
    /// (bounded by the AV's capacity times its clients), for the cold path only.
    fn clients_at(&self, fi_addr: fi_addr_t) -> Vec<u64>;
}

/// The index the cache uses in this build.
#[cfg(not(dma_loom))]
pub(crate) type Index = PapayaIndex;
/// The index the cache uses in this build.
#[cfg(dma_loom)]
pub(crate) type Index = LockedIndex;

/// The concurrent index: papaya, pre-sized to the AV's capacity so the hot path meets no resize
/// in steady state.
#[cfg(not(dma_loom))]
pub(crate) struct PapayaIndex {
    map: papaya::HashMap<Registration, fi_addr_t, IndexHasher>,
    /// See [`RegistrationIndex::retirements`]. On a line of its own: the writer bumps it on every
    /// change, and readers load it on every probe next to the map's own fields.
    retirements: Padded<std::sync::atomic::AtomicU64>,
}

/// A value alone on its cache line (128 bytes: a pair of lines, as the adjacent-line prefetcher
/// fetches them), so the writer's stores to it do not take the line of what readers load.
#[cfg(not(dma_loom))]
#[repr(align(128))]
struct Padded<T>(T);

#[cfg(not(dma_loom))]
impl PapayaIndex {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let map = papaya::HashMap::builder()
            .hasher(IndexHasher::default())
            .capacity(capacity)
            .resize_mode(papaya::ResizeMode::Blocking)
            .build();
        Self {
            map,
            retirements: Padded(std::sync::atomic::AtomicU64::new(0)),
        }
    }

    fn retired(&self) {
        self.retirements
            .0
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(not(dma_loom))]
impl RegistrationIndex for PapayaIndex {
    type Guard<'a> = papaya::LocalGuard<'a>;

    fn guard(&self) -> Self::Guard<'_> {
        self.map.guard()
    }

    #[inline]
    fn retirements(&self) -> u64 {
        self.retirements
            .0
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    #[inline]
    fn refresh(guard: &mut Self::Guard<'_>) {
        papaya::Guard::refresh(guard);
    }

    #[inline]
    fn get(
        &self,
        guard: &Self::Guard<'_>,
        client: u64,
        identity_len: usize,
        address: &[u8],
    ) -> Option<fi_addr_t> {
        let probe = Probe {
            client,
            identity_len,
            address,
        };
        self.map.get(&probe, guard).copied()
    }

    fn publish(&self, registration: Registration, fi_addr: fi_addr_t) {
        let guard = self.map.guard();
        self.map.insert(registration, fi_addr, &guard);
        drop(guard);
        self.retired();
    }

    fn unlink(&self, client: u64, identity: &[u8]) {
        let guard = self.map.guard();
        self.map.remove(&Lookup { client, identity }, &guard);
        if self.map.is_empty() {
            // The writer's batch of retired nodes (a replaced table among them) waits in seize
            // until it fills; an empty index hands it over now, so a quiesced empty cache holds
            // none of it once its readers have left. Only then: a flush is a `membarrier`.
            papaya::Guard::flush(&guard);
        }
        drop(guard);
        self.retired();
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn clients_at(&self, fi_addr: fi_addr_t) -> Vec<u64> {
        let guard = self.map.guard();
        self.map
            .iter(&guard)
            .filter(|(_, index)| fi_addr == **index)
            .map(|(registration, _)| registration.client)
            .collect()
    }
}

/// The index under loom: a loom mutex over a std map, so loom sees every probe and change.
#[cfg(dma_loom)]
pub(crate) struct LockedIndex {
    map: loom::sync::Mutex<std::collections::HashMap<(u64, Vec<u8>), (Box<[u8]>, fi_addr_t)>>,
}

#[cfg(dma_loom)]
impl LockedIndex {
    pub(crate) fn with_capacity(_capacity: usize) -> Self {
        Self {
            map: loom::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    fn locked(
        &self,
    ) -> loom::sync::MutexGuard<'_, std::collections::HashMap<(u64, Vec<u8>), (Box<[u8]>, fi_addr_t)>>
    {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(dma_loom)]
impl RegistrationIndex for LockedIndex {
    type Guard<'a> = std::marker::PhantomData<&'a ()>;

    fn guard(&self) -> Self::Guard<'_> {
        std::marker::PhantomData
    }

    fn retirements(&self) -> u64 {
        0
    }

    fn refresh(_guard: &mut Self::Guard<'_>) {}

    fn get(
        &self,
        _guard: &Self::Guard<'_>,
        client: u64,
        identity_len: usize,
        address: &[u8],
    ) -> Option<fi_addr_t> {
        let map = self.locked();
        let identity = address.get(..identity_len)?;
        let (registered, fi_addr) = map.get(&(client, identity.to_vec()))?;
        (**registered == *address).then_some(*fi_addr)
    }

    fn publish(&self, registration: Registration, fi_addr: fi_addr_t) {
        let key = (registration.client, registration.identity().to_vec());
        self.locked()
            .insert(key, (registration.address().into(), fi_addr));
    }

    fn unlink(&self, client: u64, identity: &[u8]) {
        self.locked().remove(&(client, identity.to_vec()));
    }

    fn len(&self) -> usize {
        self.locked().len()
    }

    fn clients_at(&self, fi_addr: fi_addr_t) -> Vec<u64> {
        self.locked()
            .iter()
            .filter(|(_, (_, index))| fi_addr == *index)
            .map(|((client, _), _)| *client)
            .collect()
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
