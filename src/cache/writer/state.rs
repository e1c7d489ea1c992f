//! The writer's state, entry by entry: holders, entries, where each client is, parked
//! incarnations and pending removals.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::Hasher;
use crate::cache::reply::Answer;
use crate::cache::stored::StoredAddress;
use crate::error::DmaError;
use dma_libfabric_sys::fi_addr_t;

/// The clients that hold a live entry, as a set: a release removes one by hash, in O(1) with no
/// pause (a list compacted now and then would make an unrelated miss wait behind a compaction
/// of every holder). The index (or, for a holder an admission has not published
/// yet, the writer's `unindexed` map) says the same from the client's side.
/// Nearly every entry has one, so one is stored inline.
#[derive(Default)]
pub(super) enum Holders {
    #[default]
    None,
    One(u64),
    // Boxed so that `Holders` stays 16 bytes in every entry; a set is rare.
    #[allow(clippy::box_collection)]
    Many(Box<HashSet<u64, Hasher>>),
}

impl Holders {
    /// Add `client`; whether it was new.
    pub(super) fn insert(&mut self, client: u64) -> bool {
        match self {
            Self::None => {
                *self = Self::One(client);
                true
            }
            Self::One(held) if *held == client => false,
            Self::One(held) => {
                let mut many = HashSet::with_capacity_and_hasher(2, Hasher::default());
                many.insert(*held);
                many.insert(client);
                *self = Self::Many(Box::new(many));
                true
            }
            Self::Many(many) => many.insert(client),
        }
    }

    /// Drop `client`; whether it was there.
    pub(super) fn remove(&mut self, client: u64) -> bool {
        match self {
            Self::None => false,
            Self::One(held) if *held == client => {
                *self = Self::None;
                true
            }
            Self::One(_) => false,
            Self::Many(many) => {
                let removed = many.remove(&client);
                if many.len() <= 1 {
                    *self = many.iter().next().map_or(Self::None, |&one| Self::One(one));
                }
                removed
            }
        }
    }

    /// The holders of an admitted incarnation: every client parked on it, the set taken over
    /// whole rather than rebuilt client by client, which would cost O(clients) in one step of
    /// the writer's.
    pub(super) fn from_set(set: HashSet<u64, Hasher>) -> Self {
        match set.len() {
            0 => Self::None,
            1 => set.iter().next().map_or(Self::None, |&one| Self::One(one)),
            _ => Self::Many(Box::new(set)),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Self::None)
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Self::None => 0,
            Self::One(_) => 1,
            Self::Many(many) => many.len(),
        }
    }

    pub(super) fn to_vec(&self) -> Vec<u64> {
        match self {
            Self::None => Vec::new(),
            Self::One(held) => vec![*held],
            Self::Many(many) => many.iter().copied().collect(),
        }
    }
}

/// The ticket of an entry that is published, not awaiting removal.
pub(super) const LIVE: u64 = u64::MAX;

/// An incarnation in the AV, at its own index.
pub(super) struct Entry {
    pub(super) address: StoredAddress,
    pub(super) holders: Holders,
    /// [`LIVE`] while published; once retired, the ticket of its pending removal.
    pub(super) removal: u64,
}

impl Entry {
    pub(super) fn is_live(&self) -> bool {
        LIVE == self.removal
    }
}

/// Where a client is: holding the live entry at an index, or waiting on the incarnation parked
/// behind the removing entry at an index. Kept in the writer's `unindexed` map only for the
/// clients the index does not hold (parked, or enrolled by an admission and not yet published):
/// a published holder's entry is the one its registration names.
#[derive(Clone, Copy)]
pub(super) struct Holding(u64);

impl Holding {
    const PARKED: u64 = 1 << 63;

    pub(super) fn live(fi_addr: fi_addr_t) -> Self {
        Self(fi_addr)
    }

    pub(super) fn parked(fi_addr: fi_addr_t) -> Self {
        Self(fi_addr | Self::PARKED)
    }

    pub(super) fn fi_addr(self) -> fi_addr_t {
        self.0 & !Self::PARKED
    }

    pub(super) fn is_parked(self) -> bool {
        0 != self.0 & Self::PARKED
    }
}

/// A newer incarnation waiting for the removal of the entry it is parked behind.
pub(super) struct Parked {
    pub(super) address: StoredAddress,
    pub(super) clients: HashSet<u64, Hasher>,
    /// Callers of `AddressCache::lease` waiting for this incarnation to enter the AV, by client:
    /// at most one each (a newer request from the same client answers the older one), found and
    /// removed by hash, so parking and releasing `n` of them costs O(n) in all.
    pub(super) waiters: HashMap<u64, Waiter, Hasher>,
}

/// A caller of `AddressCache::lease` waiting for a parked incarnation, until its deadline.
pub(super) struct Waiter {
    pub(super) answer: Answer,
    pub(super) deadline: Instant,
}

/// The writer's waiters, by deadline: `(deadline, client, index of the removing entry the
/// client's incarnation is parked behind)`, one per [`Waiter`].
pub(super) type Deadlines = BTreeSet<(Instant, u64, fi_addr_t)>;

impl Parked {
    /// Tell `client`'s waiter (every waiter, for `None`) that this incarnation, parked behind
    /// the entry at `at`, will not get in for them: they resolve again.
    pub(super) fn turn_away(
        &mut self,
        at: fi_addr_t,
        client: Option<u64>,
        deadlines: &mut Deadlines,
    ) {
        let mut turn_away = |client: u64, waiter: Waiter| {
            deadlines.remove(&(waiter.deadline, client, at));
            waiter.answer.send(Err(DmaError::WouldBlock));
        };
        match client {
            Some(client) => {
                if let Some(waiter) = self.waiters.remove(&client) {
                    turn_away(client, waiter);
                }
            }
            None => {
                for (client, waiter) in self.waiters.drain() {
                    turn_away(client, waiter);
                }
            }
        }
    }
}

/// Why a retired entry has not been removed yet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Readers pinned at its unlink may still be pinned: the epoch deferral has not reported.
    Readers,
    /// Its readers are gone; removed once its leases are dropped (`awaited`: the last one's drop
    /// reports it) and any retry is due (`retry_at`, also in the writer's `retries`).
    Held {
        retry_at: Option<Instant>,
        backoff: Duration,
        awaited: bool,
    },
}

/// A retired entry awaiting `fi_av_remove`; its address stays in its [`Entry`] until then.
pub(super) struct Pending {
    pub(super) fi_addr: fi_addr_t,
    pub(super) wait: Wait,
    /// When it was retired: what an `OutOfPatience` error reports as `held_for`.
    pub(super) since: Instant,
}

/// The entry at `fi_addr` in `entries`.
pub(super) fn entry_in(entries: &[Option<Entry>], fi_addr: fi_addr_t) -> Option<&Entry> {
    usize::try_from(fi_addr)
        .ok()
        .and_then(|index| entries.get(index))
        .and_then(Option::as_ref)
}

/// The identity of the entry at `fi_addr`: what `slots` hashes and compares.
pub(super) fn identity_at(entries: &[Option<Entry>], fi_addr: fi_addr_t) -> &[u8] {
    entry_in(entries, fi_addr).map_or(&[], |entry| entry.address.identity())
}
