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

use std::hash::{Hash, Hasher};

use crate::sys::fi_addr_t;

/// The hasher: foldhash, seeded per map. Lookups hash a `u64` and 16 to 18 bytes, where
/// SipHash would cost more than the probe.
pub(crate) type IndexHasher = foldhash::fast::RandomState;

/// A registration: `client` posts to the entry for `address`.
#[derive(Debug)]
pub(crate) struct Registration {
    client: u64,
    /// The full address, so a hit can confirm the incarnation too.
    address: Box<[u8]>,
    identity_len: usize,
}

impl Registration {
    pub(crate) fn new(client: u64, address: &[u8], identity_len: usize) -> Self {
        Self {
            client,
            address: address.into(),
            identity_len: identity_len.min(address.len()),
        }
    }

    fn identity(&self) -> &[u8] {
        &self.address[..self.identity_len]
    }
}

/// A borrowed key: what a reader probes with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lookup<'a> {
    pub(crate) client: u64,
    pub(crate) identity: &'a [u8],
}

// `Hash` writes the same sequence for a `Registration` and for a `Lookup` of it, and `Eq` and
// `Equivalent` compare the same fields, as papaya requires of a borrowed key.
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
    fn equivalent(&self, key: &Registration) -> bool {
        self.client == key.client && self.identity == key.identity()
    }
}

/// The concurrent index: papaya, pre-sized to the AV's capacity so the hot path meets no resize
/// in steady state.
pub(crate) struct Index {
    map: papaya::HashMap<Registration, fi_addr_t, IndexHasher>,
}

/// A reader's pin on the index's memory.
pub(crate) type IndexGuard<'a> = papaya::LocalGuard<'a>;

impl Index {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let map = papaya::HashMap::builder()
            .hasher(IndexHasher::default())
            .capacity(capacity)
            .resize_mode(papaya::ResizeMode::Blocking)
            .build();
        Self { map }
    }

    pub(crate) fn guard(&self) -> IndexGuard<'_> {
        self.map.guard()
    }

    /// The entry `client` is registered on for exactly `address`, whose identity is `identity`.
    #[inline]
    pub(crate) fn get(
        &self,
        guard: &IndexGuard<'_>,
        client: u64,
        identity: &[u8],
        address: &[u8],
    ) -> Option<fi_addr_t> {
        let (registration, fi_addr) = self
            .map
            .get_key_value(&Lookup { client, identity }, guard)?;
        (*registration.address == *address).then_some(*fi_addr)
    }

    /// Publish a registration. Writer only.
    pub(crate) fn publish(&self, registration: Registration, fi_addr: fi_addr_t) {
        let guard = self.map.guard();
        self.map.insert(registration, fi_addr, &guard);
    }

    /// Unlink a registration. Writer only.
    pub(crate) fn unlink(&self, client: u64, identity: &[u8]) {
        let guard = self.map.guard();
        self.map.remove(&Lookup { client, identity }, &guard);
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}
