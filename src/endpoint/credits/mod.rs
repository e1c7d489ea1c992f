//! Credits: what a receiver lets each peer make it hold, and what a sender may send
//! ([`PeerProtocol::Credited`](crate::configuration::PeerProtocol::Credited)).
//!
//! # The protocol
//!
//! 1. A sender's first message (or notifying write) to a peer incarnation finds no credit, and
//!    sends an introduction instead ([`wire::Control::Introduction`]): its secret, its own
//!    address, and `reply_to`, its name for the receiver (the index and its incarnation). The
//!    post answers `WouldBlock` until a grant arrives, within its patience. An introduction
//!    unanswered for [`REINTRODUCE_AFTER`] is sent again.
//! 2. The receiver resolves the sender's address into its own address vector under a client id of
//!    the library's ([`introduced_client`]: the top bit set, the secret below), and grants it a
//!    first window ([`wire::Control::Grant`]), echoing `reply_to`.
//! 3. Every data message's tag carries the sender's secret, by which the receiver finds whose
//!    credit it consumes when the application reads it; a notification is found by the index the
//!    provider names (`FI_SOURCE`). Once a peer has consumed half a window of any kind, the
//!    receiver grants it up to a whole window past what it consumed. Grants are cumulative, so a
//!    grant sent twice, or late, grants nothing twice.
//!
//! # Guarantees
//!
//! - **What one peer can make this endpoint hold** is its window: `messages` messages,
//!   `bytes` bytes plus one message, `notifications` notifications, counted from what it sent
//!   to what the application read.
//! - **What all of them can** is `receive_memory_limit`: every grant is paid for, before it is
//!   sent, out of one pool of that size ([`ReceiveWindow::cost`]), and paid back as the
//!   application reads. A peer whose grant does not fit waits in a queue, first come first
//!   served, for what the next reads free. A first grant is an eighth of the window (at least one
//!   of each), so idle peers hold little; the window opens whole once the peer has been read.
//! - **A newcomer on a reused index** starts afresh: the sender's counts belong to the
//!   incarnation it resolved, the receiver's to the sender's secret, and a sender introduced on
//!   an index that another secret held replaces it (that one's client is released).
//!
//! # Bounds
//!
//! One entry per peer this endpoint sends to (by index: at most the AV's capacity), one per
//! peer introduced to it (by index too: an introduction on an index replaces the entry there),
//! and the queue of waiting grants holds each introduced peer at most once.

pub(in crate::endpoint) mod flow;
mod granting;
pub(crate) mod wire;

pub(in crate::endpoint) use self::flow::CONTROL_RECEIVES;

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use self::wire::{Control, Counts};
use crate::configuration::ReceiveWindow;
use crate::sync::lock;

/// How long a sender waits for the grant that answers its introduction before it introduces
/// itself again (the first was lost with a connection, or the receiver could not resolve it).
pub(crate) const REINTRODUCE_AFTER: Duration = Duration::from_secs(1);

/// The top bit: client ids with it set are the library's, one per introduced sender.
pub(crate) const INTRODUCED: u64 =
    crate::cache::AddressCache::<crate::av::FabricAv>::INTRODUCED_CLIENTS;

/// The client id a sender of `secret` is resolved under by the receivers it introduces itself to.
pub(crate) fn introduced_client(secret: u64) -> u64 {
    INTRODUCED | wire::tagged_secret(secret)
}

/// What a credited endpoint's receiving side holds
/// ([`LibfabricEndpoint::credit_stats`](crate::endpoint::LibfabricEndpoint::credit_stats)): all
/// zero for a plain one.
///
/// ```
/// use dma_libfabric::{Configuration, LibfabricEndpoint};
///
/// let endpoint = LibfabricEndpoint::open(&Configuration::default(), None)?;
/// let stats = endpoint.credit_stats();
/// assert_eq!((0, 0), (stats.introduced_senders, stats.reserved_bytes));
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreditStats {
    /// Senders that introduced themselves, each resolved under a client of the endpoint's own
    /// ([`AddressCache::INTRODUCED_CLIENTS`](crate::cache::AddressCache::INTRODUCED_CLIENTS)): at
    /// most the AV's capacity.
    pub introduced_senders: usize,
    /// What the receive pool has granted and the application not yet read, in bytes (a message
    /// or notification counted as its bytes plus
    /// [`ReceiveWindow::MESSAGE_OVERHEAD`](crate::configuration::ReceiveWindow::MESSAGE_OVERHEAD)):
    /// at most [`Configuration::receive_memory_limit`](crate::configuration::Configuration::receive_memory_limit).
    pub reserved_bytes: u64,
    /// Notifications granted to writers and not yet polled: at most
    /// [`Configuration::cq_size`](crate::configuration::Configuration::cq_size).
    pub granted_notifications: u64,
    /// Senders whose grant waits for the pool to be paid back.
    pub waiting_grants: usize,
    /// Plain (untagged) messages that arrived, from peers that do not speak the credit protocol:
    /// each was dropped.
    pub stray_messages: u64,
    /// Grants this endpoint, as a sender, refused: they came from a peer that did not prove the
    /// secret sealed in the address this endpoint resolved (whoever answers at a port another
    /// process advertised). Nothing is sent on them.
    pub refused_grants: u64,
    /// Introductions this endpoint, as a receiver, refused: the sender's address was not sealed
    /// with the secret it introduced itself with, or its port is in this address vector already
    /// under another process's seal. Such a sender is granted nothing, so nothing of it is
    /// received.
    pub refused_introductions: u64,
}

/// What a credit is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum What {
    /// A message of this many bytes.
    Message(usize),
    /// A notifying write.
    Notification,
}

/// What a sender may do now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Credit was taken: post, or give it back.
    Admitted,
    /// No grant yet: send this introduction, then wait for the grant.
    Introduce(Control),
    /// Out of credit: wait for a grant.
    Wait,
}

/// A grant to send: to whom (the introduced client, at its address), and what.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct GrantDue {
    pub(crate) client: u64,
    pub(crate) address: Vec<u8>,
    pub(crate) grant: Control,
}

/// What this endpoint, as a sender, holds of one peer incarnation's grants.
#[derive(Debug, Default)]
struct Outbound {
    incarnation: u32,
    /// The granter's secret, once a grant came.
    granter: Option<u64>,
    granted: Counts,
    sent: Counts,
    introduced_at: Option<Instant>,
}

/// What this endpoint, as a receiver, granted one introduced sender.
#[derive(Debug)]
struct Inbound {
    fi_addr: u64,
    client: u64,
    address: Vec<u8>,
    reply_to: u64,
    granted: Counts,
    consumed: Counts,
    /// In the queue of grants waiting for the pool.
    waiting: bool,
}

/// The receiver's side, behind one lock: the pool is shared by every peer.
#[derive(Debug, Default)]
struct Receiving {
    /// By the sender's tagged secret.
    peers: HashMap<u64, Inbound>,
    /// AV index to the tagged secret introduced on it.
    by_index: HashMap<u64, u64>,
    /// Paid out of the pool and not yet paid back.
    reserved: u64,
    /// Notifications granted and not yet polled, of every peer.
    notifications: u64,
    waiting: VecDeque<u64>,
    /// Grants that could not be sent (no send slot): sent again by `progress`.
    unsent: Vec<u64>,
}

/// Number of locks the senders' side is split over.
const SHARDS: usize = 16;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Credits {
    secret: u64,
    /// This endpoint's address, for its introductions.
    address: Vec<u8>,
    window: ReceiveWindow,
    limit: u64,
    /// The most notifications granted and not yet polled, of every peer: what the endpoint
    /// keeps waiting for the application (`cq_size`), so none is dropped.
    notification_limit: u64,
    sending: Box<[Mutex<HashMap<u64, Outbound>>]>,
    receiving: Mutex<Receiving>,
    /// Plain messages dropped.
    strays: std::sync::atomic::AtomicU64,
    /// Grants and introductions refused for want of proof.
    refused_grants: std::sync::atomic::AtomicU64,
    refused_introductions: std::sync::atomic::AtomicU64,
}

impl Credits {
    /// Credits for an endpoint at `address` whose secret is `secret`, granting `window` per peer
    /// out of `limit` bytes and `notification_limit` notifications.
    pub(crate) fn new(
        secret: u64,
        address: Vec<u8>,
        window: ReceiveWindow,
        limit: u64,
        notification_limit: usize,
    ) -> Self {
        Self {
            secret,
            address,
            window,
            limit,
            notification_limit: notification_limit as u64,
            sending: (0..SHARDS).map(|_| Mutex::default()).collect(),
            receiving: Mutex::default(),
            strays: std::sync::atomic::AtomicU64::new(0),
            refused_grants: std::sync::atomic::AtomicU64::new(0),
            refused_introductions: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// This endpoint's secret.
    pub(crate) fn secret(&self) -> u64 {
        self.secret
    }

    /// This endpoint's address, sealed with its secret.
    pub(crate) fn address(&self) -> &[u8] {
        &self.address
    }

    /// Take credit for `what` to `fi_addr` of `incarnation`.
    pub(crate) fn admit(&self, fi_addr: u64, incarnation: u32, what: What) -> Admission {
        let mut shard = lock(&self.sending[shard_of(fi_addr)]);
        let peer = shard.entry(fi_addr).or_default();
        if peer.incarnation != incarnation {
            *peer = Outbound {
                incarnation,
                ..Outbound::default()
            };
        }
        if peer.granter.is_none() {
            let due = peer
                .introduced_at
                .is_none_or(|at| at.elapsed() >= REINTRODUCE_AFTER);
            if !due {
                return Admission::Wait;
            }
            peer.introduced_at = Some(Instant::now());
            return Admission::Introduce(Control::Introduction {
                secret: self.secret,
                reply_to: reply_to(fi_addr, incarnation),
                address: self.address.clone(),
            });
        }
        let (sent, granted) = (&mut peer.sent, &peer.granted);
        match what {
            What::Message(len) => {
                if sent.messages >= granted.messages || sent.bytes >= granted.bytes {
                    return Admission::Wait;
                }
                sent.messages += 1;
                sent.bytes = sent.bytes.saturating_add(len as u64);
            }
            What::Notification => {
                if sent.notifications >= granted.notifications {
                    return Admission::Wait;
                }
                sent.notifications += 1;
            }
        }
        Admission::Admitted
    }

    /// Give back credit [`admit`](Self::admit) took for a post the provider refused.
    pub(crate) fn give_back(&self, fi_addr: u64, incarnation: u32, what: What) {
        let mut shard = lock(&self.sending[shard_of(fi_addr)]);
        let Some(peer) = shard.get_mut(&fi_addr) else {
            return;
        };
        if peer.incarnation != incarnation {
            return;
        }
        match what {
            What::Message(len) => {
                peer.sent.messages = peer.sent.messages.saturating_sub(1);
                peer.sent.bytes = peer.sent.bytes.saturating_sub(len as u64);
            }
            What::Notification => {
                peer.sent.notifications = peer.sent.notifications.saturating_sub(1);
            }
        }
    }

    /// An introduction whose send failed: the next admission introduces again at once.
    pub(crate) fn introduction_failed(&self, fi_addr: u64, incarnation: u32) {
        let mut shard = lock(&self.sending[shard_of(fi_addr)]);
        if let Some(peer) = shard.get_mut(&fi_addr) {
            if peer.incarnation == incarnation && peer.granter.is_none() {
                peer.introduced_at = None;
            }
        }
    }

    /// A grant arrived: `reply_to` says for which peer incarnation (ours, echoed), `granter`
    /// who granted it. A grant for an incarnation that is gone grants nothing; one from a new
    /// granter on the same incarnation (the peer's process was replaced at that address) starts
    /// the counts afresh. Returns whether it was taken.
    pub(crate) fn granted(&self, granter: u64, reply_to: u64, granted: Counts) -> bool {
        let (fi_addr, incarnation) = from_reply_to(reply_to);
        let mut shard = lock(&self.sending[shard_of(fi_addr)]);
        let Some(peer) = shard.get_mut(&fi_addr) else {
            return false;
        };
        if peer.incarnation != incarnation {
            return false;
        }
        if peer.granter.is_some_and(|known| known != granter) {
            peer.sent = Counts::default();
            peer.granted = Counts::default();
        }
        peer.granter = Some(granter);
        peer.granted = Counts {
            messages: peer.granted.messages.max(granted.messages),
            bytes: peer.granted.bytes.max(granted.bytes),
            notifications: peer.granted.notifications.max(granted.notifications),
        };
        true
    }
}

/// A sender's name for its receiver: the index, and the index's incarnation above it.
fn reply_to(fi_addr: u64, incarnation: u32) -> u64 {
    (u64::from(incarnation) << 32) | (fi_addr & u64::from(u32::MAX))
}

pub(crate) fn from_reply_to(reply_to: u64) -> (u64, u32) {
    (reply_to & u64::from(u32::MAX), (reply_to >> 32) as u32)
}

fn shard_of(fi_addr: u64) -> usize {
    (fi_addr as usize) % SHARDS
}

#[cfg(test)]
mod tests;
