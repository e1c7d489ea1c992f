//! A real libfabric address vector as a cache backend.

use super::AvBackend;
use crate::address::AddressFormat;
use crate::error::DmaError;
use crate::sys;

/// The real libfabric address vector of a [`LibfabricEndpoint`](crate::LibfabricEndpoint), as the
/// cache's writer thread drives it: the only caller of `fi_av_insert` and `fi_av_remove` on it.
#[derive(Debug)]
pub struct FabricAv {
    av: *mut sys::fid_av,
    /// `fi_info.addr_format`, for the checks libfabric itself does not make.
    addr_format: u32,
    format: AddressFormat,
    address_len: usize,
    capacity: usize,
}

// SAFETY: the domain is FI_THREAD_SAFE, so the AV may be called from the writer thread while
// other threads post; the endpoint drops the cache (and so this backend and its thread) before it
// closes the AV, so the pointer is valid for as long as this exists.
unsafe impl Send for FabricAv {}

impl FabricAv {
    /// A backend over an address vector opened elsewhere, for a second cache on an endpoint's AV
    /// (tests and benches that compare against the endpoint's own cache).
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
        Self::new(av, addr_format, address_len, capacity)
    }

    pub(crate) fn new(
        av: *mut sys::fid_av,
        addr_format: u32,
        address_len: usize,
        capacity: usize,
    ) -> Self {
        Self {
            av,
            addr_format,
            format: AddressFormat::from_fi(addr_format),
            address_len,
            capacity,
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
            1 if fi_addr != sys::FI_ADDR_NOTAVAIL => Ok(fi_addr),
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
