//! A real libfabric address vector as a cache backend, and the record of which indices it
//! has handed out.
//!
//! `fi_av_lookup` on an index the AV never handed out is not an error on libfabric 1.17's util
//! AV (tcp, rxm, ...): it reads an entry pool region that may not exist and crashes. So every
//! [`FabricAv`] on an endpoint's AV notes the indices `fi_av_insert` hands it in a [`HandedOut`]
//! record shared with the endpoint, and [`LibfabricEndpoint::lookup`] reads only below it.
//!
//! [`LibfabricEndpoint::lookup`]: crate::endpoint::LibfabricEndpoint::lookup

use std::sync::atomic::{AtomicU64, Ordering};
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
}

impl Default for HandedOut {
    fn default() -> Self {
        Self {
            mark: AtomicU64::new(0),
            capacity: u64::MAX,
            unreachable: Unreachable::default(),
        }
    }
}

impl HandedOut {
    /// Note that `fi_av_insert` returned `fi_addr`.
    fn note(&self, fi_addr: sys::fi_addr_t) {
        // Release: a reader that sees the new mark also sees the insert that allocated it.
        self.unreachable.inserted(fi_addr);
        self.mark
            .fetch_max(fi_addr.saturating_add(1), Ordering::Release);
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
        crate::address::check_sockaddr(self.addr_format, address)?;
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
                Ok(fi_addr)
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
