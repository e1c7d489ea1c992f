//! Which peers the provider has reported dead, per address-vector index and incarnation.
//!
//! A send or an RMA operation whose completion says the peer refused, reset or dropped its
//! connection marks the peer's index here; every later send or RMA post to that index answers
//! [`DmaError::PeerUnreachable`](crate::error::DmaError::PeerUnreachable) at once, without posting,
//! until the index is inserted anew (`fi_av_insert` handed it out again: a new peer, or the same
//! peer resolved anew after its release). Each index carries an incarnation, bumped by every
//! insert, and a mark names the incarnation it was made for: a late error completion of a send
//! to the index's previous holder does not mark its new one.
//!
//! # Bounds
//!
//! One `AtomicU64` per AV entry (`Configuration::av_capacity`), allocated at `open`: 32 KiB for
//! the default 4,096 entries, 8 MiB at `MAX_AV_CAPACITY`. Reading a mark is one relaxed load.

use std::sync::atomic::{AtomicU64, Ordering};

/// The low half of a word: the positive `FI_E*` code the peer was marked dead with, or 0.
const CODE: u64 = u32::MAX as u64;

/// One word per AV index: incarnation in the high 32 bits, the dead mark's error code in the low.
#[derive(Debug, Default)]
pub(crate) struct Unreachable {
    words: Box<[AtomicU64]>,
}

impl Unreachable {
    /// Room for indices `0..capacity` (none past `u32::MAX`: a larger capacity is refused by
    /// `Configuration::validate` long before).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            words: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// `fi_addr` was just handed out by `fi_av_insert`: a new incarnation, alive.
    pub(crate) fn inserted(&self, fi_addr: u64) {
        if let Some(word) = self.word(fi_addr) {
            let incarnation = (word.load(Ordering::Acquire) >> 32).wrapping_add(1);
            word.store(incarnation << 32, Ordering::Release);
        }
    }

    /// The incarnation `fi_addr` holds now, to be handed back to [`mark`](Self::mark).
    pub(crate) fn incarnation(&self, fi_addr: u64) -> u32 {
        self.word(fi_addr)
            .map_or(0, |word| (word.load(Ordering::Acquire) >> 32) as u32)
    }

    /// Mark `fi_addr` dead with `code` (a positive `FI_E*`), if it still holds `incarnation`.
    /// Returns whether this call marked it.
    pub(crate) fn mark(&self, fi_addr: u64, incarnation: u32, code: u32) -> bool {
        let Some(word) = self.word(fi_addr) else {
            return false;
        };
        let alive = u64::from(incarnation) << 32;
        word.compare_exchange(
            alive,
            alive | u64::from(code.max(1)),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
    }

    /// The code `fi_addr` was marked dead with, if it is.
    pub(crate) fn dead(&self, fi_addr: u64) -> Option<u32> {
        let code = self.word(fi_addr)?.load(Ordering::Acquire) & CODE;
        (0 != code).then_some(code as u32)
    }

    fn word(&self, fi_addr: u64) -> Option<&AtomicU64> {
        self.words.get(usize::try_from(fi_addr).ok()?)
    }
}

/// Whether an error code says the peer is gone: its connection was refused, reset, aborted or
/// shut down, timed out, or its host or network cannot be reached. The one list for every path:
/// a send's completion (its `err` and its `prov_errno`), an RMA operation's (its `prov_errno`)
/// and a refused post. `code` is a positive `FI_E*` or a provider's errno (tcp's are errnos, and
/// libfabric's `FI_E*` values are the errno values on Linux): `ECONNREFUSED`, `ECONNRESET`,
/// `ECONNABORTED`, `ENOTCONN`, `EPIPE`, `EHOSTDOWN`, `EHOSTUNREACH`, `ENETUNREACH`,
/// `ESHUTDOWN`, `ETIMEDOUT`.
pub(crate) fn says_peer_is_gone(code: u32) -> bool {
    use dma_libfabric_sys as sys;
    /// Linux's `EPIPE`: libfabric's `FI_EPIPE` is commented out of `fi_errno.h`, but tcp reports
    /// a write to a closed socket with it.
    const EPIPE: u32 = 32;
    [
        sys::FI_ECONNREFUSED,
        sys::FI_ECONNRESET,
        sys::FI_ECONNABORTED,
        sys::FI_ENOTCONN,
        EPIPE,
        sys::FI_EHOSTDOWN,
        sys::FI_EHOSTUNREACH,
        sys::FI_ENETUNREACH,
        sys::FI_ESHUTDOWN,
        sys::FI_ETIMEDOUT,
    ]
    .contains(&code)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use super::*;

    #[test]
    fn a_mark_holds_until_the_index_is_inserted_anew_and_a_stale_one_is_ignored() {
        let peers = Unreachable::with_capacity(4);
        peers.inserted(2);
        let first = peers.incarnation(2);
        assert_eq!(None, peers.dead(2));
        assert!(peers.mark(2, first, 104));
        assert_eq!(Some(104), peers.dead(2));
        assert!(!peers.mark(2, first, 111), "marked once");
        peers.inserted(2);
        assert_eq!(None, peers.dead(2), "a new incarnation is alive");
        assert!(!peers.mark(2, first, 104), "a late error of the old one");
        assert_eq!(None, peers.dead(2));
        assert!(!peers.mark(9, 0, 104), "past the capacity: nothing");
        assert_eq!(None, peers.dead(u64::MAX));
    }

    /// The list names the connection errors by their Linux errno values, as tcp reports them in
    /// `prov_errno`, and nothing that says a peer is alive.
    #[test]
    fn the_dead_peer_list_is_the_connection_errnos() {
        for errno in [
            libc::ECONNREFUSED,
            libc::ECONNRESET,
            libc::ECONNABORTED,
            libc::ENOTCONN,
            libc::EPIPE,
            libc::EHOSTDOWN,
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
            libc::ESHUTDOWN,
            libc::ETIMEDOUT,
        ] {
            assert!(says_peer_is_gone(errno.unsigned_abs()), "{errno}");
        }
        for other in [0, libc::EAGAIN, libc::EINTR, libc::ENOMEM, libc::ECANCELED] {
            assert!(!says_peer_is_gone(other.unsigned_abs()), "{other}");
        }
    }
}
