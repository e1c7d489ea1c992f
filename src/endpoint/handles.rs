//! The libfabric objects behind an endpoint, closed in the order libfabric requires.

use std::ptr;

use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// Raw objects, each null until opened. Dropping closes whichever are open: the endpoint first,
/// then what it was bound to (completion queues, address vector), then the domain and the
/// fabric, and last frees the `fi_info` they were opened from. `open` fills them in one by one,
/// so a failure part-way closes exactly what had been opened.
#[derive(Debug)]
pub(super) struct Handles {
    pub(super) info: *mut sys::fi_info,
    pub(super) fabric: *mut sys::fid_fabric,
    pub(super) domain: *mut sys::fid_domain,
    pub(super) av: *mut sys::fid_av,
    pub(super) tx_cq: *mut sys::fid_cq,
    pub(super) rx_cq: *mut sys::fid_cq,
    pub(super) ep: *mut sys::fid_ep,
}

impl Handles {
    pub(super) fn new() -> Self {
        Self {
            info: ptr::null_mut(),
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            av: ptr::null_mut(),
            tx_cq: ptr::null_mut(),
            rx_cq: ptr::null_mut(),
            ep: ptr::null_mut(),
        }
    }
}

impl Handles {
    /// Close the endpoint now, ahead of the rest (for abandoned RMA operations: see `rma`).
    pub(super) fn close_endpoint(&mut self) {
        if !self.ep.is_null() {
            // SAFETY: the endpoint is open and is nulled here, so `Drop` does not close it again;
            // the caller uses it no more.
            unsafe { close("endpoint", &raw mut (*self.ep).fid) };
            self.ep = ptr::null_mut();
        }
    }
}

/// Close one object, logging rather than failing: nothing useful can be done with a failed
/// close, and `Drop` cannot return it.
///
/// # Safety
/// `fid` is null or an open libfabric object that nothing uses any more.
unsafe fn close(what: &'static str, fid: *mut sys::fid) {
    if fid.is_null() {
        return;
    }
    // SAFETY: the caller promises `fid` is open and unused; fi_close is called once per object
    // because `Handles::drop` nulls nothing twice and runs once.
    let code = unsafe { sys::fi_close(fid) };
    if 0 != code {
        tracing::warn!(object = what, code, error = %DmaError::fabric("fi_close", code.into()), "fi_close failed");
    }
}

impl Drop for Handles {
    fn drop(&mut self) {
        // SAFETY: each pointer is null or was opened by `LibfabricEndpoint::open` and is closed
        // only here. The owner drops the address cache (the only other user of `av`) before
        // these handles, and no send or receive can run because `&self` borrows have ended. The
        // `fid` field is the first member of each of these structs, as libfabric defines them,
        // so `&raw mut (*x).fid` is the object's fid.
        unsafe {
            if !self.ep.is_null() {
                close("endpoint", &raw mut (*self.ep).fid);
            }
            if !self.av.is_null() {
                close("address vector", &raw mut (*self.av).fid);
            }
            if !self.tx_cq.is_null() {
                close("transmit completion queue", &raw mut (*self.tx_cq).fid);
            }
            if !self.rx_cq.is_null() {
                close("receive completion queue", &raw mut (*self.rx_cq).fid);
            }
            if !self.domain.is_null() {
                close("domain", &raw mut (*self.domain).fid);
            }
            if !self.fabric.is_null() {
                close("fabric", &raw mut (*self.fabric).fid);
            }
            if !self.info.is_null() {
                sys::fi_freeinfo(self.info);
            }
        }
    }
}
