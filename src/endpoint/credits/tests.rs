#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use super::*;

impl Credits {
    /// What this endpoint may still send `fi_addr` of `incarnation`: messages, notifications.
    fn available(&self, fi_addr: u64, incarnation: u32) -> (u64, u64) {
        let shard = lock(&self.sending[shard_of(fi_addr)]);
        match shard.get(&fi_addr) {
            Some(peer) if peer.incarnation == incarnation => (
                peer.granted.messages.saturating_sub(peer.sent.messages),
                peer.granted
                    .notifications
                    .saturating_sub(peer.sent.notifications),
            ),
            _ => (0, 0),
        }
    }
}

const WINDOW: ReceiveWindow = ReceiveWindow {
    messages: 16,
    bytes: 1 << 20,
    notifications: 8,
};

/// A sender's introduction, taken by a receiver, answered by a grant the sender takes.
fn introduce(sender: &Credits, receiver: &Credits, fi_addr: u64) -> GrantDue {
    let Admission::Introduce(Control::Introduction {
        secret, reply_to, ..
    }) = sender.admit(fi_addr, 1, What::Message(10))
    else {
        panic!("the first admission introduces");
    };
    assert_eq!(
        Admission::Wait,
        sender.admit(fi_addr, 1, What::Message(10)),
        "introduced: wait for the grant"
    );
    let (grant, replaced) =
        receiver.introduce(secret, reply_to, 5, introduced_client(secret), b"a");
    assert_eq!(None, replaced);
    let grant = grant.expect("a first grant");
    take(sender, &grant);
    grant
}

fn take(sender: &Credits, due: &GrantDue) {
    let Control::Grant {
        secret,
        reply_to,
        granted,
    } = &due.grant
    else {
        panic!("a grant");
    };
    assert!(sender.granted(*secret, *reply_to, *granted));
}

#[test]
fn a_sender_sends_its_window_and_no_more_until_the_receiver_reads() {
    let sender = Credits::new(1, b"address".to_vec(), WINDOW, 64 << 20, 512);
    let receiver = Credits::new(2, b"address".to_vec(), WINDOW, 64 << 20, 512);
    introduce(&sender, &receiver, 3);
    // The first grant is an eighth of the window.
    assert_eq!((2, 1), sender.available(3, 1));
    for _ in 0..2 {
        assert_eq!(Admission::Admitted, sender.admit(3, 1, What::Message(10)));
    }
    assert_eq!(Admission::Wait, sender.admit(3, 1, What::Message(10)));
    // The receiver reads one: half its (first) window is spent, so a whole window is granted.
    let (_, grants) = receiver.consumed(Some(wire::tagged_secret(1)), 5, What::Message(10));
    assert_eq!(1, grants.len());
    take(&sender, &grants[0]);
    assert_eq!((15, 8), sender.available(3, 1), "17 granted, 2 sent");
    // Given back, a refused post's credit is there again.
    assert_eq!(Admission::Admitted, sender.admit(3, 1, What::Message(10)));
    sender.give_back(3, 1, What::Message(10));
    assert_eq!((15, 8), sender.available(3, 1));
}

#[test]
fn a_new_incarnation_starts_afresh_and_a_stale_grant_grants_nothing() {
    let sender = Credits::new(1, b"address".to_vec(), WINDOW, 64 << 20, 512);
    let receiver = Credits::new(2, b"address".to_vec(), WINDOW, 64 << 20, 512);
    let old = introduce(&sender, &receiver, 3);
    assert!(matches!(
        sender.admit(3, 2, What::Message(1)),
        Admission::Introduce(_)
    ));
    let Control::Grant {
        secret,
        reply_to,
        granted,
    } = old.grant
    else {
        panic!("a grant");
    };
    assert!(
        !sender.granted(secret, reply_to, granted),
        "for incarnation 1"
    );
    assert_eq!((0, 0), sender.available(3, 2));
}

#[test]
fn the_pool_pays_for_every_grant_and_waiting_peers_are_served_first() {
    // Room for the first grants of two peers (an eighth of the window each), not three.
    let first = ReceiveWindow {
        messages: 2,
        bytes: 1 << 17,
        notifications: 1,
    }
    .cost();
    let receiver = Credits::new(9, b"address".to_vec(), WINDOW, 2 * first, 512);
    let mut grants = Vec::new();
    for peer in 1..=3_u64 {
        let (grant, _) = receiver.introduce(peer, 0, peer, introduced_client(peer), b"a");
        grants.push(grant);
    }
    assert!(grants[0].is_some() && grants[1].is_some());
    assert!(grants[2].is_none(), "the pool is spent");
    assert!(receiver.stats().reserved_bytes <= 2 * first);
    // Peers 1 and 2 are read: what that frees goes to peer 3 first, once it is enough, though
    // peers 1 and 2 have spent half their windows.
    let mut served = Vec::new();
    for peer in [1, 2] {
        for _ in 0..2 {
            served.extend(
                receiver
                    .consumed(Some(peer), peer, What::Message(1 << 16))
                    .1,
            );
        }
    }
    assert_eq!(introduced_client(3), served[0].client, "{served:?}");
    assert!(
        receiver.stats().reserved_bytes <= 2 * first,
        "{}",
        receiver.stats().reserved_bytes
    );
    assert!(
        served.iter().any(|due| due.client == introduced_client(3)),
        "{served:?}"
    );
}

#[test]
fn an_introduction_on_an_index_another_secret_holds_replaces_it() {
    let receiver = Credits::new(9, b"address".to_vec(), WINDOW, 64 << 20, 512);
    let (_, replaced) = receiver.introduce(1, 0, 7, introduced_client(1), b"a");
    assert_eq!(None, replaced);
    let reserved = receiver.stats().reserved_bytes;
    assert!(0 < reserved);
    let (grant, replaced) = receiver.introduce(2, 0, 7, introduced_client(2), b"b");
    assert!(grant.is_some());
    assert_eq!(Some(introduced_client(1)), replaced);
    assert_eq!(1, receiver.stats().introduced_senders);
    assert_eq!(
        reserved,
        receiver.stats().reserved_bytes,
        "the old one paid back, the new one paid"
    );
    // The same sender again gets the same grant, and pays nothing more.
    let (again, _) = receiver.introduce(2, 0, 7, introduced_client(2), b"b");
    assert_eq!(grant, again);
    assert_eq!(reserved, receiver.stats().reserved_bytes);
}

/// A lying receiver (issue 40, hostile input): a grant for an index or incarnation this sender
/// never introduced itself to is not taken, whatever it claims; and a grant of every count at
/// `u64::MAX` from the receiver the sender did introduce itself to is taken without wrapping
/// anything: the liar can only let the sender flood the liar itself.
#[test]
fn a_lying_grant_is_not_taken_or_costs_only_the_liar() {
    let sender = Credits::new(1, b"address".to_vec(), WINDOW, 64 << 20, 512);
    let receiver = Credits::new(2, b"address".to_vec(), WINDOW, 64 << 20, 512);
    let grant = introduce(&sender, &receiver, 3);
    let Control::Grant { secret, .. } = grant.grant else {
        panic!("a grant");
    };
    let everything = Counts {
        messages: u64::MAX,
        bytes: u64::MAX,
        notifications: u64::MAX,
    };
    for forged in [reply_to(4, 1), reply_to(3, 2), reply_to(3, 0), u64::MAX, 0] {
        assert!(
            !sender.granted(secret, forged, everything),
            "a grant for reply_to {forged:#x}, never asked for, was taken"
        );
    }
    assert_eq!((2, 1), sender.available(3, 1), "the first grant, unchanged");
    assert_eq!((0, 0), sender.available(4, 1), "no peer at index 4");

    assert!(sender.granted(secret, reply_to(3, 1), everything));
    for _ in 0..1000 {
        assert_eq!(Admission::Admitted, sender.admit(3, 1, What::Message(4096)));
        assert_eq!(Admission::Admitted, sender.admit(3, 1, What::Notification));
    }
    assert_eq!(
        (u64::MAX - 1000, u64::MAX - 1000),
        sender.available(3, 1),
        "counted against the lie, never wrapped"
    );
    // A message of usize::MAX bytes is admitted while any byte is granted, and its count
    // saturates at the grant: the next one waits, rather than the sum wrapping to room.
    assert_eq!(
        Admission::Admitted,
        sender.admit(3, 1, What::Message(usize::MAX))
    );
    assert_eq!(Admission::Wait, sender.admit(3, 1, What::Message(1)));
}
