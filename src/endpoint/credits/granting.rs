//! The receiver's side of the credit protocol: introductions answered with grants, each paid out
//! of the pool before it is sent and paid back as the application reads (see the parent module,
//! "Guarantees"), and the grants kept for want of a send slot.

use super::wire::{self, Control, Counts};
use super::{CreditStats, Credits, GrantDue, Inbound, Receiving, What};
use crate::configuration::ReceiveWindow;
use crate::sync::lock;

impl Credits {
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
