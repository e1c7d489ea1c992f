//! A real libfabric address vector as a cache backend, and the record of which indices it
//! has handed out.
//!
//! `fi_av_lookup` on an index the AV never handed out is not an error on libfabric 1.17's util
//! AV (tcp, rxm, ...): it reads an entry pool region that may not exist and crashes. So every
//! [`FabricAv`] on an endpoint's AV notes the indices `fi_av_insert` hands it in a [`HandedOut`]
//! record shared with the endpoint, and [`LibfabricEndpoint::lookup`] reads only below it.
//!
//! [`LibfabricEndpoint::lookup`]: crate::endpoint::LibfabricEndpoint::lookup

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::AvBackend;
use super::unreachable::Unreachable;
use crate::address::AddressFormat;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// Which indices of one address vector are safe to look up: below one past the highest index
/// `fi_av_insert` has handed a [`FabricAv`] on it, and below the AV's capacity.
///
/// Every index below the mark lies in memory the AV has allocated: libfabric's AV tables grow
/// and never shrink while the AV is open (a removed index keeps its slot, and the next insert
/// reuses it), so an index once handed out stays safe to look up until the AV closes.
#[derive(Debug)]
pub(crate) struct HandedOut {
    mark: AtomicU64,
    /// `fi_av_attr.count`; `u64::MAX` for an AV no endpoint registered.
    capacity: u64,
    /// Which indices the provider reported dead, per incarnation (the message path's).
    pub(crate) unreachable: Unreachable,
    /// The secret each live index's address was sealed with, and how many inserts hold it: one
    /// entry per live index, so at most the AV's capacity.
    seals: Mutex<HashMap<sys::fi_addr_t, Sealed>>,
    /// The rxm eager limit of the process that owns the AV (0: none, or not known), which a
    /// sealed address's must equal (see [`HandedOut::connectable`]).
    eager_limit: AtomicU32,
}

/// What holds one index: the secret its address was sealed with (`None`: bare), and how many
/// inserts of it are live (libfabric's util AV counts an address inserted twice, by two caches on
/// one AV, as one index used twice).
#[derive(Debug, Clone, Copy)]
struct Sealed {
    secret: Option<u64>,
    inserts: u32,
}

impl Default for HandedOut {
    fn default() -> Self {
        Self {
            mark: AtomicU64::new(0),
            capacity: u64::MAX,
            unreachable: Unreachable::default(),
            seals: Mutex::default(),
            eager_limit: AtomicU32::new(0),
        }
    }
}

impl HandedOut {
    /// Note this process's rxm eager limit (0: none, or not known), the one its endpoint's
    /// connections carry: from now on a sealed address of another is refused before it is
    /// inserted.
    pub(crate) fn expect_eager_limit(&self, limit: u32) {
        self.eager_limit.store(limit, Ordering::Relaxed);
    }

    /// Whether a peer whose seal says `seal` can connect to this process: refused when both
    /// know their rxm eager limits and they differ. rxm refuses such a connection
    /// (`rxm_verify_connreq`: "eager_limit mismatch") and says so only in its log, so every
    /// operation to the peer would answer `WouldBlock` and none would complete.
    ///
    /// # Errors
    /// [`DmaError::InvalidAddress`] naming both limits and the setting that makes them.
    fn connectable(&self, seal: crate::address::Seal) -> Result<(), DmaError> {
        let ours = self.eager_limit.load(Ordering::Relaxed);
        let theirs = seal.eager_limit;
        if 0 == ours || 0 == theirs || ours == theirs {
            return Ok(());
        }
        Err(DmaError::InvalidAddress(format!(
            "the peer's rxm eager limit is {theirs} bytes and this process's {ours}: rxm              refuses a connection between processes whose FI_OFI_RXM_BUFFER_SIZE differ, so              nothing could reach it; give both the same RxmSizing::buffer_size (applied before              libfabric initialises: Configuration::apply_rxm_environment, or              FI_OFI_RXM_BUFFER_SIZE in the environment)"
        )))
    }

    /// Note that `fi_av_insert` returned `fi_addr`.
    fn note(&self, fi_addr: sys::fi_addr_t) {
        // Release: a reader that sees the new mark also sees the insert that allocated it.
        self.unreachable.inserted(fi_addr);
        self.mark
            .fetch_max(fi_addr.saturating_add(1), Ordering::Release);
    }

    /// Note that an insert of an address sealed with `secret` (`None`: bare) returned `fi_addr`,
    /// and answer whether it may hold the index. Where `exclusive` (an opaque format, whose index
    /// is the whole provider address) it may not, and nothing is noted, while the index is live
    /// under another seal: a second process claiming the port of a peer still in the AV under its
    /// own seal. Otherwise (efa, where the seal tells incarnations of one slot apart) the newest
    /// seal holds the index.
    fn hold(&self, fi_addr: sys::fi_addr_t, secret: Option<u64>, exclusive: bool) -> bool {
        let mut seals = crate::sync::lock(&self.seals);
        let held = seals
            .entry(fi_addr)
            .or_insert(Sealed { secret, inserts: 0 });
        match (held.secret, secret) {
            (Some(holder), Some(newcomer)) if holder != newcomer && exclusive => return false,
            (_, Some(_)) => held.secret = secret,
            (_, None) => {}
        }
        held.inserts = held.inserts.saturating_add(1);
        true
    }

    /// Note that one insert of `fi_addr` was removed.
    fn let_go(&self, fi_addr: sys::fi_addr_t) {
        let mut seals = crate::sync::lock(&self.seals);
        if let Some(held) = seals.get_mut(&fi_addr) {
            held.inserts = held.inserts.saturating_sub(1);
            if 0 == held.inserts {
                seals.remove(&fi_addr);
                // Give the memory back once the map has emptied well below its peak (more than
                // 64 slots, under a quarter full: cut to twice what it holds), so what it keeps
                // follows the live indices, not the most it ever held. Each cut halves at least,
                // and takes half the entries' removals to come again: O(1) a removal, amortized.
                if seals.capacity() > 64 && seals.capacity() > 4 * seals.len() {
                    let keep = 2 * seals.len();
                    seals.shrink_to(keep);
                }
            }
        }
    }

    /// The secret the address at live index `fi_addr` was sealed with: what a peer there must
    /// prove. `None` for a bare address, or an index not live.
    pub(crate) fn secret_at(&self, fi_addr: sys::fi_addr_t) -> Option<u64> {
        crate::sync::lock(&self.seals)
            .get(&fi_addr)
            .and_then(|held| held.secret)
    }

    /// Whether `fi_addr` is inside the AV's capacity and below the highest index handed out so
    /// far.
    pub(crate) fn contains(&self, fi_addr: sys::fi_addr_t) -> bool {
        fi_addr < self.capacity && fi_addr < self.mark.load(Ordering::Acquire)
    }
}

/// The records of the address vectors that endpoints hold open now, by AV pointer, so a
/// [`FabricAv::from_raw`] backend on an endpoint's AV counts its inserts in the endpoint's record.
/// Only pointer values are compared; nothing here is dereferenced.
static RECORDS: Mutex<Vec<(usize, Weak<HandedOut>)>> = Mutex::new(Vec::new());

/// A new record for `av`, which an endpoint has just opened for `capacity` entries.
pub(crate) fn register(av: *mut sys::fid_av, capacity: usize) -> Arc<HandedOut> {
    let record = Arc::new(HandedOut {
        mark: AtomicU64::new(0),
        capacity: u64::try_from(capacity).unwrap_or(u64::MAX),
        unreachable: Unreachable::with_capacity(capacity),
        seals: Mutex::default(),
        eager_limit: AtomicU32::new(0),
    });
    let mut records = crate::sync::lock(&RECORDS);
    records.retain(|(key, live)| *key != av as usize && live.strong_count() > 0);
    records.push((av as usize, Arc::downgrade(&record)));
    record
}

/// Forget `av`'s record: its endpoint is about to close it (and the pointer may be reused).
pub(crate) fn unregister(av: *mut sys::fid_av) {
    let mut records = crate::sync::lock(&RECORDS);
    records.retain(|(key, live)| *key != av as usize && live.strong_count() > 0);
}

/// The endpoint's record for `av`, or a record of its own for an AV no endpoint registered.
fn record_for(av: *mut sys::fid_av) -> Arc<HandedOut> {
    let records = crate::sync::lock(&RECORDS);
    records
        .iter()
        .find(|(key, _)| *key == av as usize)
        .and_then(|(_, record)| record.upgrade())
        .unwrap_or_default()
}

/// The real libfabric address vector of a [`LibfabricEndpoint`](crate::endpoint::LibfabricEndpoint), as the
/// cache's writer thread drives it: the only caller of `fi_av_insert` and `fi_av_remove` on it.
#[derive(Debug)]
pub struct FabricAv {
    av: *mut sys::fid_av,
    /// `fi_info.addr_format`, for the checks libfabric itself does not make.
    addr_format: u32,
    format: AddressFormat,
    address_len: usize,
    capacity: usize,
    /// Shared with the endpoint that owns the AV, when one does.
    handed_out: Arc<HandedOut>,
}

// SAFETY: the domain is FI_THREAD_SAFE, so the AV may be called from the writer thread while
// other threads post; the endpoint drops the cache (and so this backend and its thread) before it
// closes the AV, so the pointer is valid for as long as this exists.
unsafe impl Send for FabricAv {}

impl FabricAv {
    /// A backend over an address vector opened elsewhere, for a second cache on an endpoint's AV
    /// (tests and benches that compare against the endpoint's own cache).
    ///
    /// When `av` is a [`LibfabricEndpoint`](crate::endpoint::LibfabricEndpoint)'s
    /// [`address_vector`](crate::endpoint::LibfabricEndpoint::address_vector), the indices this backend
    /// inserts count in that endpoint's record, so its
    /// [`lookup`](crate::endpoint::LibfabricEndpoint::lookup) reads them. Indices inserted by calling
    /// `fi_av_insert` directly do not count.
    ///
    /// # Safety
    /// `av` is an open address vector of a `FI_THREAD_SAFE` domain that stays open until the cache
    /// built on this backend has been dropped, with addresses of `address_len` bytes; nothing else
    /// removes the entries this backend inserts.
    pub unsafe fn from_raw(
        av: *mut sys::fid_av,
        addr_format: u32,
        address_len: usize,
        capacity: usize,
    ) -> Self {
        Self::new(av, addr_format, address_len, capacity, record_for(av))
    }

    pub(crate) fn new(
        av: *mut sys::fid_av,
        addr_format: u32,
        address_len: usize,
        capacity: usize,
        handed_out: Arc<HandedOut>,
    ) -> Self {
        Self {
            av,
            addr_format,
            format: AddressFormat::from_fi(addr_format),
            address_len,
            capacity,
            handed_out,
        }
    }
}

impl AvBackend for FabricAv {
    fn format(&self) -> AddressFormat {
        self.format
    }

    fn address_len(&self) -> usize {
        self.address_len
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn insert(&mut self, address: &[u8]) -> Result<sys::fi_addr_t, DmaError> {
        // The cache checked this already; it is repeated here because a short slice would be a
        // read past its end inside libfabric.
        self.format.identity_len(address, self.address_len)?;
        crate::address::check_sockaddr(self.addr_format, &address[..self.address_len])?;
        let seal = crate::address::seal_of(address, self.address_len)?;
        if let Some(seal) = seal {
            self.handed_out.connectable(seal)?;
        }
        let secret = seal.map(|seal| seal.secret);
        let mut fi_addr = sys::FI_ADDR_NOTAVAIL;
        // SAFETY: the AV is open (see `Send` above); `address` holds exactly the provider's
        // address length, which is all fi_av_insert reads for one address; `fi_addr` has room for
        // the one index it writes.
        let inserted = unsafe {
            sys::fi_av_insert(
                self.av,
                address.as_ptr().cast(),
                1,
                &raw mut fi_addr,
                0,
                std::ptr::null_mut(),
            )
        };
        match inserted {
            1 if fi_addr != sys::FI_ADDR_NOTAVAIL => {
                self.handed_out.note(fi_addr);
                let exclusive = AddressFormat::Opaque == self.format;
                if self.handed_out.hold(fi_addr, secret, exclusive) {
                    return Ok(fi_addr);
                }
                // Undo this insert: the util AV counted it as a second use of the index. The
                // holder's secret stays out of the text: an error is for logs.
                let _ = self.remove_index(fi_addr);
                Err(DmaError::InvalidAddress(format!(
                    "index {fi_addr} holds this provider address already, sealed by another \
                     process: a peer that took the port of one still in this address vector; \
                     release that one's clients first (a restarted peer), or this one is not \
                     who it says"
                )))
            }
            code if code < 0 => Err(DmaError::fabric("fi_av_insert", code.into())),
            _ => Err(DmaError::Fabric {
                call: "fi_av_insert",
                code: inserted.into(),
                message: format!("inserted {inserted} of 1 addresses: the provider rejected it"),
            }),
        }
    }

    fn remove(&mut self, fi_addr: sys::fi_addr_t) -> Result<(), DmaError> {
        self.remove_index(fi_addr)?;
        self.handed_out.let_go(fi_addr);
        Ok(())
    }
}

impl FabricAv {
    /// `fi_av_remove` of one index.
    fn remove_index(&mut self, fi_addr: sys::fi_addr_t) -> Result<(), DmaError> {
        let mut fi_addr = fi_addr;
        // SAFETY: the AV is open; `fi_addr` is one index this backend inserted and has not yet
        // removed (the writer removes each entry once).
        let code = unsafe { sys::fi_av_remove(self.av, &raw mut fi_addr, 1, 0) };
        if 0 == code {
            Ok(())
        } else {
            Err(DmaError::fabric("fi_av_remove", code.into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seals_give_their_memory_back_once_their_indices_are_let_go() {
        let record = register(std::ptr::null_mut(), 10_000);
        for fi_addr in 0..10_000 {
            assert!(record.hold(fi_addr, Some(fi_addr + 1), false));
        }
        let peak = crate::sync::lock(&record.seals).capacity();
        assert!(peak >= 10_000);
        for fi_addr in 0..10_000 {
            record.let_go(fi_addr);
        }
        let seals = crate::sync::lock(&record.seals);
        assert!(seals.is_empty());
        assert!(
            seals.capacity() <= 64,
            "{} slots kept of a peak of {peak}",
            seals.capacity()
        );
    }

    #[test]
    fn a_seal_held_twice_outlives_the_shrinks_around_it_until_both_holds_go() {
        let record = register(std::ptr::null_mut(), 10_001);
        let kept = 10_000;
        assert!(record.hold(kept, Some(7), false));
        assert!(record.hold(kept, Some(7), false));
        for fi_addr in 0..kept {
            assert!(record.hold(fi_addr, Some(fi_addr + 1), false));
        }
        // Every other index goes, the map shrinking under the held one many times over.
        for fi_addr in 0..kept {
            record.let_go(fi_addr);
        }
        assert_eq!(Some(7), record.secret_at(kept));
        record.let_go(kept);
        assert_eq!(Some(7), record.secret_at(kept), "one hold is left");
        record.let_go(kept);
        assert_eq!(None, record.secret_at(kept));
        assert!(crate::sync::lock(&record.seals).capacity() <= 64);
    }
}
