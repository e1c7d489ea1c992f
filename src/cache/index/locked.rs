//! The index under loom: one loom mutex over std maps, so the models see every probe and every
//! change of the index as an ordered step. It keeps [`RegistrationIndex`]'s contract, a probe
//! after an unlink misses, and never replaces its table.

use super::{RegistrationIndex, same_bytes};
use crate::cache::epoch::EpochPin;
use crate::cache::stored::StoredAddress;
use dma_libfabric_sys::fi_addr_t;

/// The index under loom: a loom mutex over std maps, so loom sees every probe and change.
pub(crate) struct LockedIndex {
    maps: loom::sync::Mutex<LockedMaps>,
}

/// The clients' registrations and the entries' addresses, under one lock.
#[derive(Default)]
struct LockedMaps {
    clients: std::collections::HashMap<u64, fi_addr_t>,
    addresses: std::collections::HashMap<fi_addr_t, Box<[u8]>>,
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
        let maps = self.locked();
        let fi_addr = *maps.clients.get(&client)?;
        let registered = maps.addresses.get(&fi_addr)?;
        same_bytes(registered, address).then_some(fi_addr)
    }

    fn install(&self, fi_addr: fi_addr_t, address: &StoredAddress) {
        self.locked()
            .addresses
            .insert(fi_addr, address.bytes().into());
    }

    fn registered(&self, client: u64) -> Option<fi_addr_t> {
        self.locked().clients.get(&client).copied()
    }

    fn publish(&self, client: u64, fi_addr: fi_addr_t) {
        self.locked().clients.insert(client, fi_addr);
    }

    fn unlink(&self, client: u64) -> Option<fi_addr_t> {
        self.locked().clients.remove(&client)
    }

    fn len(&self, _pinned: &EpochPin) -> usize {
        self.locked().clients.len()
    }

    fn clients_at(&self, _pinned: &EpochPin, fi_addr: fi_addr_t) -> Vec<u64> {
        self.locked()
            .clients
            .iter()
            .filter(|(_, index)| fi_addr == **index)
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
