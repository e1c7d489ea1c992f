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

    /// A sender introduced itself and was resolved at `fi_addr` under `client`. Returns the
    /// grant to send it (its first, or the current one again for a repeated introduction), and
    /// the client of another sender it replaced on that index, to release.
    pub(crate) fn introduce(
        &self,
        secret: u64,
        reply_to: u64,
        fi_addr: u64,
        client: u64,
        address: &[u8],
    ) -> (Option<GrantDue>, Option<u64>) {
        let tagged = wire::tagged_secret(secret);
        let mut receiving = lock(&self.receiving);
        let mut replaced = None;
        if let Some(previous) = receiving.by_index.insert(fi_addr, tagged) {
            if previous != tagged {
                replaced = self.forget(&mut receiving, previous);
            }
        }
        let fresh = match receiving.peers.get_mut(&tagged) {
            // The same sender again: its first introduction's grant is re-sent, unless it now
            // names us anew (it resolved us again): then its counts start afresh.
            Some(peer) if peer.reply_to == reply_to && peer.fi_addr == fi_addr => false,
            _ => true,
        };
        if fresh {
            if let Some(stale) = receiving.peers.remove(&tagged) {
                Self::pay_back(&mut receiving, self.owed(&stale), &stale);
            }
            receiving.peers.insert(
                tagged,
                Inbound {
                    fi_addr,
                    client,
                    address: address.to_vec(),
                    reply_to,
                    granted: Counts::default(),
                    consumed: Counts::default(),
                    waiting: false,
                },
            );
            let grant = self.extend(&mut receiving, tagged);
            return (grant, replaced);
        }
        let grant = receiving.peers.get(&tagged).map(|peer| self.grant_of(peer));
        (grant, replaced)
    }

    /// The application read a message of the sender whose tagged secret is `tagged`, or a
    /// notification of the sender introduced at `fi_addr` (`tagged` `None`). Returns the index
    /// of the sender that proved the secret (`None`: nobody introduced with it), and the grants
    /// now due: this sender's, once it consumed half a window, and those of waiting senders the
    /// freed pool now pays for.
    pub(crate) fn consumed(
        &self,
        tagged: Option<u64>,
        fi_addr: u64,
        what: What,
    ) -> (Option<u64>, Vec<GrantDue>) {
        let mut receiving = lock(&self.receiving);
        let found = tagged
            .or_else(|| receiving.by_index.get(&fi_addr).copied())
            .or_else(|| (What::Notification == what).then(|| Self::most_notified(&receiving))?);
        let Some(tagged) = found else {
            return (None, Vec::new());
        };
        let Some(peer) = receiving.peers.get_mut(&tagged) else {
            return (None, Vec::new());
        };
        let proven = peer.fi_addr;
        let before = self.owed(peer);
        match what {
            What::Message(len) => {
                peer.consumed.messages += 1;
                peer.consumed.bytes = peer.consumed.bytes.saturating_add(len as u64);
            }
            What::Notification => peer.consumed.notifications += 1,
        }
        let after = self.owed(peer);
        let due = self.half_spent(peer);
        receiving.reserved = receiving
            .reserved
            .saturating_sub(before - after.min(before));
        if What::Notification == what {
            receiving.notifications = receiving.notifications.saturating_sub(1);
        }
        let mut grants = Vec::new();
        // Waiting peers first: they were refused before this one asked.
        while let Some(&first) = receiving.waiting.front() {
            match self.extend(&mut receiving, first) {
                Some(grant) => {
                    receiving.waiting.pop_front();
                    grants.push(grant);
                }
                None if receiving.peers.get(&first).is_none_or(|peer| !peer.waiting) => {
                    receiving.waiting.pop_front();
                }
                None => break,
            }
        }
        if due {
            grants.extend(self.extend(&mut receiving, tagged));
        }
        (Some(proven), grants)
    }

    /// The peer with the most notifications granted and not yet polled: whose a notification
    /// is taken to be when the provider does not name its writer (tcp;ofi_rxm reports a remote
    /// write's data without `FI_SOURCE` on its direct path, `rxm_handle_remote_write`). With one
    /// writer that is exact; with several, the pool's bound holds all the same, and the peer that
    /// holds the most is paid back first.
    fn most_notified(receiving: &Receiving) -> Option<u64> {
        receiving
            .peers
            .iter()
            .map(|(&tagged, peer)| {
                let owed = peer
                    .granted
                    .notifications
                    .saturating_sub(peer.consumed.notifications);
                (owed, tagged)
            })
            .filter(|&(owed, _)| 0 < owed)
            .max()
            .map(|(_, tagged)| tagged)
    }

    /// Grants that could not be sent: kept to be sent again (the latest state is sent: grants
    /// are cumulative).
    pub(crate) fn unsent(&self, client: u64) {
        let mut receiving = lock(&self.receiving);
        let tagged = wire::tagged_secret(client);
        if !receiving.unsent.contains(&tagged) {
            receiving.unsent.push(tagged);
        }
    }

    /// The grants to send again, as they stand now.
    pub(crate) fn take_unsent(&self) -> Vec<GrantDue> {
        let mut receiving = lock(&self.receiving);
        if receiving.unsent.is_empty() {
            return Vec::new();
        }
        let unsent = std::mem::take(&mut receiving.unsent);
        unsent
            .into_iter()
            .filter_map(|tagged| receiving.peers.get(&tagged).map(|peer| self.grant_of(peer)))
            .collect()
    }

    /// Count a grant refused: its granter did not prove the secret sealed in the address it
    /// was sent for. Returns how many there were before it.
    pub(crate) fn refuse_grant(&self) -> u64 {
        self.refused_grants
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Count an introduction refused; returns how many there were before it.
    pub(crate) fn refuse_introduction(&self) -> u64 {
        self.refused_introductions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Count a stray (plain) message; returns how many there were before it.
    pub(crate) fn stray(&self) -> u64 {
        self.strays
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// What the receiving side holds now.
    pub(crate) fn stats(&self) -> CreditStats {
        let receiving = lock(&self.receiving);
        CreditStats {
            introduced_senders: receiving.peers.len(),
            reserved_bytes: receiving.reserved,
            granted_notifications: receiving.notifications,
            waiting_grants: receiving.waiting.len(),
            stray_messages: self.strays.load(std::sync::atomic::Ordering::Relaxed),
            refused_grants: self
                .refused_grants
                .load(std::sync::atomic::Ordering::Relaxed),
            refused_introductions: self
                .refused_introductions
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Forget the sender `tagged` (another took its index): pay its reservation back; returns
    /// its client, to release.
    fn forget(&self, receiving: &mut Receiving, tagged: u64) -> Option<u64> {
        let peer = receiving.peers.remove(&tagged)?;
        Self::pay_back(receiving, self.owed(&peer), &peer);
        receiving.unsent.retain(|&unsent| unsent != tagged);
        Some(peer.client)
    }

    /// Pay back to the pool what a forgotten peer held: `owed`, and its notifications.
    fn pay_back(receiving: &mut Receiving, owed: u64, peer: &Inbound) {
        receiving.reserved = receiving.reserved.saturating_sub(owed);
        let notifications = peer
            .granted
            .notifications
            .saturating_sub(peer.consumed.notifications);
        receiving.notifications = receiving.notifications.saturating_sub(notifications);
    }

    /// Whether `peer` has consumed half a window (of any kind) since its last grant.
    fn half_spent(&self, peer: &Inbound) -> bool {
        let left = |granted: u64, consumed: u64| granted.saturating_sub(consumed);
        left(peer.granted.messages, peer.consumed.messages) <= u64::from(self.window.messages) / 2
            || left(peer.granted.bytes, peer.consumed.bytes) <= self.window.bytes / 2
            || left(peer.granted.notifications, peer.consumed.notifications)
                <= u64::from(self.window.notifications) / 2
    }

    /// Extend `tagged`'s grant to a whole window past what it consumed (an eighth for its first
    /// grant), if the pool pays for it; else queue it. Returns the grant to send.
    fn extend(&self, receiving: &mut Receiving, tagged: u64) -> Option<GrantDue> {
        let first = receiving
            .peers
            .get(&tagged)
            .is_some_and(|peer| peer.granted == Counts::default());
        let window = if first {
            ReceiveWindow {
                messages: (self.window.messages / 8).max(1),
                bytes: (self.window.bytes / 8).max(1),
                notifications: (self.window.notifications / 8).max(1),
            }
        } else {
            self.window
        };
        let reserved = receiving.reserved;
        let peer = receiving.peers.get_mut(&tagged)?;
        let target = Counts {
            messages: peer.consumed.messages + u64::from(window.messages),
            bytes: peer.consumed.bytes.saturating_add(window.bytes),
            notifications: peer.consumed.notifications + u64::from(window.notifications),
        };
        let next = Counts {
            messages: target.messages.max(peer.granted.messages),
            bytes: target.bytes.max(peer.granted.bytes),
            notifications: target.notifications.max(peer.granted.notifications),
        };
        let before = self.owed(peer);
        let after = self.owed_at(next, peer.consumed);
        let cost = after.saturating_sub(before);
        let notifications = next.notifications - peer.granted.notifications;
        if reserved.saturating_add(cost) > self.limit
            || receiving.notifications + notifications > self.notification_limit
        {
            if !peer.waiting {
                peer.waiting = true;
                receiving.waiting.push_back(tagged);
            }
            return None;
        }
        peer.waiting = false;
        if next == peer.granted {
            return None;
        }
        peer.granted = next;
        let grant = self.grant_of(peer);
        receiving.reserved = reserved.saturating_add(cost);
        receiving.notifications += notifications;
        Some(grant)
    }

    /// The grant `peer` holds now, addressed to it.
    fn grant_of(&self, peer: &Inbound) -> GrantDue {
        GrantDue {
            client: peer.client,
            address: peer.address.clone(),
            grant: Control::Grant {
                secret: self.secret,
                reply_to: peer.reply_to,
                granted: peer.granted,
            },
        }
    }

    /// What `peer`'s grant costs the pool now: granted and not consumed.
    fn owed(&self, peer: &Inbound) -> u64 {
        self.owed_at(peer.granted, peer.consumed)
    }

    fn owed_at(&self, granted: Counts, consumed: Counts) -> u64 {
        let units = granted.messages.saturating_sub(consumed.messages)
            + granted.notifications.saturating_sub(consumed.notifications);
        granted
            .bytes
            .saturating_sub(consumed.bytes)
            .saturating_add(units.saturating_mul(ReceiveWindow::MESSAGE_OVERHEAD))
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
