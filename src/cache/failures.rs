//! What became of queued misses that failed.
//!
//! [`try_resolve`](super::Pinned::try_resolve) queues a miss and returns at once, so nobody waits
//! for the writer's answer. When that answer is an error (a full AV, a failed `fi_av_insert`), the
//! writer records it here, under the client, and the next `try_resolve` of the same client and
//! address takes it and returns it. A queued miss so never answers `WouldBlock` for ever: it
//! answers `WouldBlock` until the writer has tried, and then the writer's verdict.
//!
//! Memory is bounded: at most one record per client, at most [`Failures::BOUND`] in all (the
//! oldest goes first), each within 240 B with the tables' slack, for an address of up to 32 bytes
//! (a longer one adds its length): its map bucket at the map's largest (8,192 buckets of 17 B
//! for 4,096 records: 34 B), the boxed record (88 B: the address inline and the error), the
//! error's text cut to [`MESSAGE_LIMIT`] bytes, and its place in the order queue (whose buffer
//! stays within 8,192 clients: 16 B). `tests/cache_bounds.rs` checks it at the worst case: 4,096
//! refused clients on a full AV, each refused with a 4 KiB provider text (+926 KB kept, 226 B a
//! record; the records of `6095657` kept the whole text, over 16 MB, and those of the 256 B
//! statement before this one took 282 B a record). A record goes when its client resolves again
//! through the writer, is released, or reads it. Readers touch the lock only on a miss and only while
//! some record exists.

use std::collections::{HashMap, VecDeque};
// Plain std even under loom: bookkeeping beside the protocol, with no loom operation inside the
// lock (see `crate::sync`).
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::stored::StoredAddress;
use crate::error::DmaError;
use crate::sync::lock;

/// One record: 88 B, boxed so that the map's slack costs 16 B a bucket rather than a record's
/// size (`a_record_is_88_bytes`).
struct Failure {
    /// Inline up to 32 bytes (efa's, a `sockaddr_in6`'s), as the cache stores every address.
    address: StoredAddress,
    error: DmaError,
}

#[derive(Default)]
struct Records {
    by_client: HashMap<u64, Box<Failure>>,
    /// Clients in the order their records were made, for dropping the oldest.
    order: VecDeque<u64>,
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
        let failure = Box::new(Failure {
            address: StoredAddress::new(address, address.len()),
            error: cut(error),
        });
        if records.by_client.insert(client, failure).is_none() {
            records.order.push_back(client);
        }
        while records.by_client.len() > Self::BOUND {
            let Some(oldest) = records.order.pop_front() else {
                break;
            };
            records.by_client.remove(&oldest);
        }
        self.settle(&mut records);
    }

    /// Writer: `client` resolved through the writer again, or was released.
    pub(crate) fn clear(&self, client: u64) {
        if 0 == self.len.load(Ordering::Relaxed) {
            return;
        }
        let mut records = lock(&self.records);
        if records.by_client.remove(&client).is_some() {
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
        if records
            .by_client
            .get(&client)
            .is_none_or(|failure| failure.address.bytes() != address)
        {
            return None;
        }
        let failure = records.by_client.remove(&client)?;
        self.settle(&mut records);
        Some(failure.error)
    }

    /// Keep `order` within half as many again as the records (so its buffer stays within 8,192
    /// clients, 64 KiB, at [`Self::BOUND`]), at an amortised O(1) a record, and publish the count.
    fn settle(&self, records: &mut Records) {
        let records_now = records.by_client.len();
        if records.order.len() > records_now + records_now / 2 + 64 {
            let Records { by_client, order } = records;
            order.retain(|client| by_client.contains_key(client));
        }
        self.len.store(records.by_client.len(), Ordering::Relaxed);
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
            text.shrink_to_fit();
        }
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
        DmaError::PeerUnreachable { peer, reason } => DmaError::PeerUnreachable {
            peer,
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

    /// What the per-record term of the byte bound counts on (the module docs).
    #[test]
    fn a_record_is_88_bytes() {
        assert_eq!(88, std::mem::size_of::<Failure>());
    }
}
