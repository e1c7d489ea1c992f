//! The keys an endpoint requests where the provider does not choose them (no `FI_MR_PROV_KEY`):
//! [`Keys`], one keyed hash of a counter per endpoint, never `FI_KEY_NOTAVAIL`, unpredictable to
//! anyone without the hash's key, which never leaves the process; and how many keys one
//! registration tries ([`REGION_KEY_ATTEMPTS`]). Why keys are random and how they are drawn is on
//! [`register`](crate::endpoint::LibfabricEndpoint::register) ("Keys").

#[cfg(test)]
use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
#[cfg(test)]
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many random keys registration tries when the provider answers `-FI_ENOKEY` (the key is
/// in use in the domain) before it gives up with that error.
pub const REGION_KEY_ATTEMPTS: usize = 8;

/// The keys an endpoint requests where the provider does not choose them (no
/// `FI_MR_PROV_KEY`): each is `hasher.hash_one(counter)`, a SipHash of a counter under a key
/// `std` drew from the operating system's random source (see
/// [`register`](crate::endpoint::LibfabricEndpoint::register), "Keys").
pub(crate) struct Keys {
    hasher: RandomState,
    /// The counter `hasher` hashes: a new input for every key drawn.
    next: AtomicU64,
    /// Keys a test wants requested first, in order.
    #[cfg(test)]
    pub(crate) forced: Mutex<VecDeque<u64>>,
}

impl Keys {
    /// A fresh source, under a key of its own.
    pub(crate) fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            next: AtomicU64::new(0),
            #[cfg(test)]
            forced: Mutex::new(VecDeque::new()),
        }
    }

    /// A fresh random key to request (never `FI_KEY_NOTAVAIL`, `u64::MAX`).
    pub(crate) fn draw(&self) -> u64 {
        #[cfg(test)]
        if let Some(key) = crate::sync::lock(&self.forced).pop_front() {
            return key;
        }
        loop {
            let key = self
                .hasher
                .hash_one(self.next.fetch_add(1, Ordering::Relaxed));
            if u64::MAX != key {
                return key;
            }
        }
    }
}
