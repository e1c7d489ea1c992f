//! What became of queued misses that failed.
//!
//! [`try_resolve`](super::Pinned::try_resolve) queues a miss and returns at once, so nobody waits
//! for the writer's answer. When that answer is an error (a full AV, a failed `fi_av_insert`), the
//! writer records it here, under the client, and the next `try_resolve` of the same client and
//! address takes it and returns it. A queued miss so never answers `WouldBlock` for ever: it
//! answers `WouldBlock` until the writer has tried, and then the writer's verdict.
//!
//! Memory is bounded: at most one record per client and at most [`Failures::BOUND`] in all,
//! **72 B a record whose error it shares with the record before it, 240 B a record with an error
//! of its own**, for addresses of up to 32 bytes (a longer one adds its length): at most
//! 288 KiB (0.29 MB) for 4,096 records that share their error (a full AV refuses every new
//! client with the same `Capacity`; a provider refuses a burst with the same text), 960 KiB if
//! each has its own. A record is a 56-byte slot of a ring of at most [`Failures::BOUND`] slots,
//! oldest first (the client, its address inline, its error shared by `Arc`); the clients' table
//! holds 4-byte positions in the ring (at most 8,192 buckets of 5 B for 4,096 records: 10 B a
//! record); an error of its own adds its `Arc` (64 B) and its text, cut to [`MESSAGE_LIMIT`]
//! bytes. A record taken or cleared leaves a hole, dropped once it reaches the front; a full ring
//! drops its oldest record, or is compacted if a quarter of it is holes (amortised O(1) a
//! record). Once no record is left the ring and the table give back all their memory.
//! `tests/cache_worst_case_bounds.rs` checks both terms at their worst case: 4,096 new clients
//! refused by a full 64-entry model AV, sharing their error, and each refused with a 4 KiB
//! provider text of its own (what it measured: `docs/benchmarks.md`, "Worst-case bounds" and
//! "Figures moved out of the module docs"). A record goes when its client resolves again
//! through the writer, is released, or reads it. Readers touch the lock only on a miss and only
//! while some record exists.

use std::collections::VecDeque;
// Plain std even under loom: bookkeeping beside the protocol, with no loom operation inside the
// lock (see `crate::sync`).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hashbrown::HashTable;

use super::stored::StoredAddress;
use crate::error::DmaError;
use crate::sync::lock;

/// One record: 56 B (`a_record_is_56_bytes`).
struct Failure {
    client: u64,
    /// Inline up to 32 bytes (efa's, a `sockaddr_in6`'s), as the cache stores every address.
    address: StoredAddress,
    /// `None` once the record is taken or cleared: a hole, dropped when it reaches the front.
    error: Option<Arc<DmaError>>,
}

#[derive(Default)]
struct Records {
    /// Every record, oldest first, holes included: at most [`Failures::BOUND`] slots.
    ring: VecDeque<Failure>,
    /// The sequence number of the ring's front slot (a slot's number is its position after it;
    /// wrapping, as the ring never holds 2³² slots).
    front: u32,
    /// The sequence number of each live record, found by its client.
    by_client: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    /// The last error recorded, which the next record shares if it fails the same way.
    last: Option<Arc<DmaError>>,
}

impl Records {
    fn slot(&self, sequence: u32) -> Option<&Failure> {
        self.ring.get(sequence.wrapping_sub(self.front) as usize)
    }

    /// Take `client`'s record out of the table and leave a hole in the ring: its error.
    fn remove(&mut self, client: u64) -> Option<Arc<DmaError>> {
        let hash = std::hash::BuildHasher::hash_one(&self.hasher, client);
        let Self {
            ring,
            front,
            by_client,
            ..
        } = self;
        let at = |sequence: &u32| sequence.wrapping_sub(*front) as usize;
        let entry = by_client
            .find_entry(hash, |sequence| {
                ring.get(at(sequence))
                    .is_some_and(|failure| failure.client == client)
            })
            .ok()?;
        let position = at(entry.get());
        entry.remove();
        ring.get_mut(position)?.error.take()
    }

    /// Make room for one record: drop the holes at the front of the ring; if it is still full,
    /// compact it when a quarter of it is holes (so a compaction, O([`Failures::BOUND`]), comes
    /// at most once every `BOUND / 4` records), and otherwise drop its oldest record.
    fn make_room(&mut self) {
        self.drop_front_holes();
        if self.ring.len() < Failures::BOUND {
            return;
        }
        if self.ring.len() - self.by_client.len() >= Failures::BOUND / 4 {
            self.compact();
        } else if let Some(oldest) = self.ring.front().map(|failure| failure.client) {
            self.remove(oldest);
            self.drop_front_holes();
        }
    }

    fn drop_front_holes(&mut self) {
        while self
            .ring
            .front()
            .is_some_and(|failure| failure.error.is_none())
        {
            self.ring.pop_front();
            self.front = self.front.wrapping_add(1);
        }
    }

    /// Drop every hole and number the records again from 0, in the same order.
    fn compact(&mut self) {
        self.ring.retain(|failure| failure.error.is_some());
        self.front = 0;
        let Self {
            ring,
            by_client,
            hasher,
            ..
        } = self;
        by_client.clear();
        for (position, failure) in ring.iter().enumerate() {
            let hash = std::hash::BuildHasher::hash_one(&*hasher, failure.client);
            by_client.insert_unique(hash, position as u32, |sequence| {
                let client = ring
                    .get(*sequence as usize)
                    .map_or(0, |failure| failure.client);
                std::hash::BuildHasher::hash_one(&*hasher, client)
            });
        }
    }

    /// `error`, shared with the last record if it is the same.
    fn shared(&mut self, error: DmaError) -> Arc<DmaError> {
        match &self.last {
            Some(last) if **last == error => Arc::clone(last),
            _ => {
                let error = Arc::new(error);
                self.last = Some(Arc::clone(&error));
                error
            }
        }
    }

    fn push(&mut self, client: u64, address: StoredAddress, error: Arc<DmaError>) {
        let sequence = self.front.wrapping_add(self.ring.len() as u32);
        self.ring.push_back(Failure {
            client,
            address,
            error: Some(error),
        });
        let Self {
            ring,
            front,
            by_client,
            hasher,
            ..
        } = self;
        let hash = std::hash::BuildHasher::hash_one(&*hasher, client);
        by_client.insert_unique(hash, sequence, |sequence| {
            let client = ring
                .get(sequence.wrapping_sub(*front) as usize)
                .map_or(0, |failure| failure.client);
            std::hash::BuildHasher::hash_one(&*hasher, client)
        });
    }
}

/// Failed outcomes of queued misses, by client.
#[derive(Default)]
pub(crate) struct Failures {
    /// How many records exist: readers skip the lock while it is zero.
    len: AtomicUsize,
    records: Mutex<Records>,
}

impl Failures {
    /// The most records kept at once: the inbox's bound, as many misses as may be queued.
    pub(crate) const BOUND: usize = super::budget::INBOX_BOUND;

    /// Writer: the queued miss of `client` for `address` failed with `error`.
    pub(crate) fn record(&self, client: u64, address: &[u8], error: DmaError) {
        let mut records = lock(&self.records);
        records.remove(client);
        records.make_room();
        let error = records.shared(cut(error));
        records.push(client, StoredAddress::new(address, address.len()), error);
        self.settle(&mut records);
    }

    /// Writer: `client` resolved through the writer again, or was released.
    pub(crate) fn clear(&self, client: u64) {
        if 0 == self.len.load(Ordering::Relaxed) {
            return;
        }
        let mut records = lock(&self.records);
        if records.remove(client).is_some() {
            self.settle(&mut records);
        }
    }

    /// Reader, on a miss: the failure recorded for `client` on exactly `address`, taken.
    pub(crate) fn take(&self, client: u64, address: &[u8]) -> Option<DmaError> {
        // Relaxed is enough: a record missed here is found by the next miss, and the lock orders
        // the record itself.
        if 0 == self.len.load(Ordering::Relaxed) {
            return None;
        }
        let mut records = lock(&self.records);
        let hash = std::hash::BuildHasher::hash_one(&records.hasher, client);
        let sequence = *records.by_client.find(hash, |sequence| {
            records
                .slot(*sequence)
                .is_some_and(|failure| failure.client == client)
        })?;
        if records
            .slot(sequence)
            .is_none_or(|failure| failure.address.bytes() != address)
        {
            return None;
        }
        let error = records.remove(client)?;
        self.settle(&mut records);
        Some(Arc::unwrap_or_clone(error))
    }

    /// Publish the count; once no record is left, give back the ring's and the table's memory.
    fn settle(&self, records: &mut Records) {
        let live = records.by_client.len();
        if 0 == live {
            *records = Records::default();
        }
        self.len.store(live, Ordering::Relaxed);
    }
}

/// The most bytes of an error's text a record keeps.
pub(crate) const MESSAGE_LIMIT: usize = 96;

/// `error` with its text cut to [`MESSAGE_LIMIT`] bytes (at a character boundary), so a record's
/// size is bounded whatever a provider's message says.
fn cut(error: DmaError) -> DmaError {
    fn short(mut text: String) -> String {
        if text.len() > MESSAGE_LIMIT {
            let mut end = MESSAGE_LIMIT;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        // A text with slack would keep it in the record.
        text.shrink_to_fit();
        text
    }
    match error {
        DmaError::Fabric {
            call,
            code,
            message,
        } => DmaError::Fabric {
            call,
            code,
            message: short(message),
        },
        DmaError::NoProvider { tried } => DmaError::NoProvider {
            tried: short(tried),
        },
        DmaError::InvalidAddress(why) => DmaError::InvalidAddress(short(why)),
        DmaError::Unsupported(why) => DmaError::Unsupported(short(why)),
        DmaError::InvalidArgument(why) => DmaError::InvalidArgument(short(why)),
        DmaError::PeerUnreachable {
            peer,
            client,
            reason,
        } => DmaError::PeerUnreachable {
            peer,
            client,
            reason: short(reason),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let long = "é".repeat(200);
        let DmaError::InvalidArgument(kept) = cut(DmaError::InvalidArgument(long)) else {
            panic!("the same variant");
        };
        assert!(kept.len() <= MESSAGE_LIMIT && kept.len() >= MESSAGE_LIMIT - 1);
        assert!(kept.chars().all(|c| c == 'é'));
        assert_eq!(DmaError::Closed, cut(DmaError::Closed));
    }

    #[test]
    fn the_oldest_record_goes_past_the_bound_and_each_is_taken_once() {
        let failures = Failures::default();
        let address = [7_u8; 16];
        let total = Failures::BOUND as u64 + 10;
        for client in 0..total {
            failures.record(client, &address, DmaError::Capacity { capacity: 1 });
        }
        assert_eq!(Failures::BOUND, failures.len.load(Ordering::Relaxed));
        assert!(
            failures.take(5, &address).is_none(),
            "among the oldest, dropped"
        );
        assert!(failures.take(30, &[8; 16]).is_none(), "another address");
        let full = Some(DmaError::Capacity { capacity: 1 });
        assert_eq!(full, failures.take(20, &address));
        assert!(failures.take(20, &address).is_none(), "taken once");
        // A client recorded again keeps one record, the newest.
        failures.record(21, &address, DmaError::Closed);
        assert_eq!(Some(DmaError::Closed), failures.take(21, &address));
        failures.clear(30);
        assert!(failures.take(30, &address).is_none(), "cleared");
        for client in 10..total {
            failures.clear(client);
        }
        assert_eq!(0, failures.len.load(Ordering::Relaxed));
        assert_eq!(
            0,
            lock(&failures.records).ring.capacity(),
            "memory given back"
        );
    }

    #[test]
    fn a_full_ring_of_holes_is_compacted_and_keeps_every_record() {
        let failures = Failures::default();
        let address = [7_u8; 16];
        let bound = Failures::BOUND as u64;
        for client in 0..bound {
            failures.record(client, &address, DmaError::Closed);
        }
        // Holes in the middle: the oldest stays at the front.
        for client in 1..=bound / 2 {
            assert_eq!(Some(DmaError::Closed), failures.take(client, &address));
        }
        failures.record(bound, &address, DmaError::Closed);
        assert!(lock(&failures.records).ring.capacity() <= Failures::BOUND);
        for client in (0..1).chain(bound / 2 + 1..=bound) {
            assert_eq!(
                Some(DmaError::Closed),
                failures.take(client, &address),
                "{client}"
            );
        }
        assert_eq!(0, failures.len.load(Ordering::Relaxed));
    }

    /// What the per-record term of the byte bound counts on (the module docs).
    #[test]
    fn a_record_is_56_bytes() {
        assert_eq!(56, std::mem::size_of::<Failure>());
    }
}
