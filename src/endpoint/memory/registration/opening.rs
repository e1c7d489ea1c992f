//! Opening a registration of a region's memory: `fi_mr_reg` (or `fi_mr_regattr`) under random
//! keys, then what `mr_mode` asks (`fi_mr_bind`, `fi_mr_enable`), the descriptor and the key;
//! and [`Registration::rekey`], which opens a new registration of the same memory before it closes
//! the old one. An [`Opened`] registration not yet taken over is closed by its drop, so nothing is
//! left registered on an error.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::AtomicPtr;

use super::{Exposure, REGION_KEY_ATTEMPTS, Registration, check};
use crate::error::DmaError;
use dma_libfabric_sys as sys;

impl Registration {
    /// Register the same memory again under a fresh key, then close the registration it had:
    /// from the close on, the provider admits no new transfer under the old key (it is gone from
    /// the domain's key map; `MemoryRegion`'s docs, "Parking"), and the region is reached under
    /// the new one. On an error nothing changed: the old registration is still open.
    ///
    /// # Safety
    /// As [`register`](Self::register), for the domain and endpoint this registration was made
    /// in; and no operation of this endpoint holds the registration (the caller holds it alone:
    /// an operation in flight passes the old registration's descriptor).
    pub(crate) unsafe fn rekey(
        &mut self,
        ep: *mut sys::fid_ep,
        mr_mode: i32,
        keys: &mut dyn FnMut() -> u64,
    ) -> Result<(), DmaError> {
        // SAFETY: the caller's promise; the old registration stays open meanwhile, and two
        // registrations of one buffer are allowed (each has its own key).
        let opened = unsafe { self.open(ep, mr_mode, keys) }?;
        self.close_registration();
        self.install(opened, mr_mode);
        Ok(())
    }

    /// Take `opened` as this registration's own (its `Drop` closes it).
    pub(super) fn install(&mut self, mut opened: Opened, mr_mode: i32) {
        let mr = std::mem::replace(&mut opened.mr, ptr::null_mut());
        self.mr = AtomicPtr::new(mr);
        self.desc = opened.desc;
        self.key = opened.key;
        self.remote_base = if 0 != mr_mode & sys::FI_MR_VIRT_ADDR as i32 {
            self.buffer as u64
        } else {
            0
        };
    }

    /// A new registration of this registration's memory, which the caller takes over; nothing
    /// is left registered on an error.
    ///
    /// # Safety
    /// As [`register`](Self::register).
    pub(super) unsafe fn open(
        &self,
        ep: *mut sys::fid_ep,
        mr_mode: i32,
        keys: &mut dyn FnMut() -> u64,
    ) -> Result<Opened, DmaError> {
        let access = match self.exposure {
            Exposure::Remote => {
                u64::from(sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE)
            }
            // The local side of this endpoint's own RMA only: no flag a peer's transfer needs,
            // so the provider admits none (`-FI_EACCES`). Not FI_SEND or FI_RECV either: rxm
            // turns them into FI_REMOTE_READ and FI_REMOTE_WRITE, for its rendezvous protocol,
            // in which the peer reads or writes the buffer.
            Exposure::Local => u64::from(sys::FI_READ | sys::FI_WRITE),
        };
        let provider_keys = 0 != mr_mode & sys::FI_MR_PROV_KEY as i32;
        // SAFETY: the caller's promise.
        let (mr, requested_key) = unsafe { self.reg(access, provider_keys, keys) }?;
        let opened = Opened {
            mr,
            desc: ptr::null_mut(),
            key: 0,
        };
        // SAFETY: `mr` was just registered, and is closed by `opened`'s drop on an error below.
        unsafe { opened.finish(ep, mr_mode, self.exposure, provider_keys, requested_key) }
    }

    /// `fi_mr_reg` (or `fi_mr_regattr`) with `access`, under random keys while the domain
    /// answers `-FI_ENOKEY`: the new object and the key requested.
    ///
    /// # Safety
    /// As [`register`](Self::register).
    unsafe fn reg(
        &self,
        access: u64,
        provider_keys: bool,
        keys: &mut dyn FnMut() -> u64,
    ) -> Result<(*mut sys::fid_mr, u64), DmaError> {
        let (domain, buffer, len, interface) = (self.domain, self.buffer, self.len, self.interface);
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        for attempt in 1..=REGION_KEY_ATTEMPTS {
            let requested_key = if provider_keys { 0 } else { keys() };
            // SAFETY: the domain is open (the caller's promise); `buffer` holds at least `len`
            // bytes, owned by `self` until it drops, which closes the registration first and
            // then only parks them; `mr` receives one object, which the caller takes over.
            let code = unsafe {
                match interface.hmem() {
                    None => sys::fi_mr_reg(
                        domain,
                        buffer.cast_const().cast(),
                        len,
                        access,
                        0,
                        requested_key,
                        0,
                        &raw mut mr,
                        ptr::null_mut(),
                    ),
                    // `fi_mr_regattr` through the shim, which builds the `fi_mr_attr` (its
                    // layout differs between libfabric 1.x and 2.x).
                    Some((iface, device)) => sys::fi_mr_reg_iface(
                        domain,
                        buffer.cast_const().cast(),
                        len,
                        access,
                        requested_key,
                        iface,
                        device,
                        &raw mut mr,
                    ),
                }
            };
            if 0 == code {
                return Ok((mr, requested_key));
            }
            if code != -(sys::FI_ENOKEY as i32) || provider_keys || REGION_KEY_ATTEMPTS == attempt {
                let call = match interface.hmem() {
                    None => "fi_mr_reg",
                    Some(_) => "fi_mr_regattr",
                };
                return Err(DmaError::fabric(call, code.into()));
            }
        }
        Err(DmaError::fabric("fi_mr_reg", -i64::from(sys::FI_ENOKEY)))
    }
}

/// A registration just opened by `Registration::open`, closed on drop unless taken over.
pub(super) struct Opened {
    mr: *mut sys::fid_mr,
    desc: *mut c_void,
    key: u64,
}

impl Opened {
    /// Bind and enable it where `mr_mode` asks, and read its descriptor and key.
    ///
    /// # Safety
    /// `self.mr` was just registered in the domain of `ep`, which is open.
    unsafe fn finish(
        mut self,
        ep: *mut sys::fid_ep,
        mr_mode: i32,
        exposure: Exposure,
        provider_keys: bool,
        requested_key: u64,
    ) -> Result<Self, DmaError> {
        let mr = self.mr;
        if 0 != mr_mode & sys::FI_MR_ENDPOINT as i32 {
            // SAFETY: `mr` was just registered and `ep` is open in the same domain (the caller's
            // promise); binding and enabling take no pointers beyond them.
            unsafe {
                check("fi_mr_bind", sys::fi_mr_bind(mr, &raw mut (*ep).fid, 0))?;
                check("fi_mr_enable", sys::fi_mr_enable(mr))?;
            }
        }
        // SAFETY: `mr` is open; both calls read fields of it.
        let (desc, key) = unsafe { (sys::fi_mr_desc(mr), sys::fi_mr_key(mr)) };
        self.desc = desc;
        self.key = if provider_keys { key } else { requested_key };
        if Exposure::Local == exposure {
            // No key a peer could use: libfabric's own software registration gives none
            // (FI_KEY_NOTAVAIL) to a registration without remote access.
            self.key = u64::MAX;
        } else if u64::MAX == self.key {
            // FI_KEY_NOTAVAIL is `(uint64_t) -1`, a cast bindgen does not evaluate.
            return Err(DmaError::InvalidArgument(
                "a Remote region was registered, and the provider gave it no 64-bit key \
                 (fi_mr_key answered FI_KEY_NOTAVAIL), so no peer could reach it: register it \
                 Exposure::Local, or use a provider that gives keys"
                    .into(),
            ));
        }
        Ok(self)
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if self.mr.is_null() {
            return;
        }
        // SAFETY: `mr` is open and owned by this value alone (taken over values are nulled).
        let code = unsafe { sys::fi_close(&raw mut (*self.mr).fid) };
        if 0 != code {
            tracing::warn!(error = %DmaError::fabric("fi_close", code.into()), "closing a memory registration failed");
        }
    }
}
