//! The index under loom: one loom mutex over std maps, so the models see every probe and every
//! change of the index as an ordered step. It keeps [`RegistrationIndex`]'s contract, a probe
//! after an unlink misses, and never replaces its table.

use super::{Registration, RegistrationIndex};
use crate::cache::epoch::EpochPin;
use crate::cache::stored::StoredAddress;
use dma_libfabric_sys::fi_addr_t;

/// The index under loom: a loom mutex over std maps, so loom sees every probe and change.
pub(crate) struct LockedIndex {
    maps: loom::sync::Mutex<LockedMaps>,
}

/// The clients' registrations, under one lock.
#[derive(Default)]
struct LockedMaps {
    clients: std::collections::HashMap<u64, Registration>,
}

impl LockedIndex {
    pub(crate) fn with_capacity(_capacity: usize) -> Self {
        Self {
            maps: loom::sync::Mutex::new(LockedMaps::default()),
        }
    }

    fn locked(&self) -> loom::sync::MutexGuard<'_, LockedMaps> {
        crate::sync::lock_modelled(&self.maps)
    }
}

impl RegistrationIndex for LockedIndex {
    type Reader<'a> = std::marker::PhantomData<&'a ()>;

    fn reader(&self) -> Self::Reader<'_> {
        std::marker::PhantomData
    }

    unsafe fn probe<'a>(
        &'a self,
        _reader: &mut Self::Reader<'a>,
        client: u64,
        address: &[u8],
    ) -> Option<fi_addr_t> {
        self.locked().clients.get(&client)?.confirm(address)
    }

    fn registered(&self, client: u64) -> Option<fi_addr_t> {
        self.locked()
            .clients
            .get(&client)
            .map(Registration::fi_addr)
    }

    fn publish(&self, client: u64, fi_addr: fi_addr_t, address: &StoredAddress) {
        self.locked()
            .clients
            .insert(client, Registration::new(fi_addr, address));
    }

    fn unlink(&self, client: u64) -> Option<fi_addr_t> {
        self.locked()
            .clients
            .remove(&client)
            .map(|registration| registration.fi_addr())
    }

    fn len(&self, _pinned: &EpochPin) -> usize {
        self.locked().clients.len()
    }

    fn clients_at(&self, _pinned: &EpochPin, fi_addr: fi_addr_t) -> Vec<u64> {
        self.locked()
            .clients
            .iter()
            .filter(|(_, registration)| fi_addr == registration.fi_addr())
            .map(|(client, _)| *client)
            .collect()
    }

    /// A std map's memory is the loom models' least concern: never replaced.
    fn shrink(&self) -> bool {
        false
    }

    fn retired_uncovered(&self) -> bool {
        false
    }

    fn cover_retired(&self) {}

    fn readers_gone(&self) {}

    fn holds_retired(&self) -> bool {
        false
    }

    #[cfg(feature = "model")]
    fn replacements(&self) -> u64 {
        0
    }
}
