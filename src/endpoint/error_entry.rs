//! Error completions: one `fi_cq_err_entry` read with `fi_cq_readerr` into a buffer of the
//! reader's own, and described with `fi_cq_strerror`, for the receive path (`messaging`), the
//! transmit path (`completions`) and the send slab (`sends`).
//!
//! # Guarantees
//!
//! - The provider-specific error data is copied into the reading call's own buffer: libfabric's
//!   shared one is overwritten, or freed, by the next read on any thread.
//! - An entry another thread took first reads as `None`, never as an error.

use std::ffi::CStr;

use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// The bytes of provider-specific error data asked of `fi_cq_readerr` for each error completion.
const ERR_DATA_LEN: usize = 256;

/// An error completion, read into a buffer of the reader's own.
pub(super) struct ErrorEntry {
    /// The operation's context, as it was posted.
    pub(super) op_context: *mut std::ffi::c_void,
    /// `fi_cq_err_entry.err`: a positive `FI_E*` code.
    pub(super) err: i32,
    /// `fi_cq_err_entry.prov_errno`: the provider's own code (an errno on tcp).
    pub(super) prov_errno: i32,
    /// `fi_cq_err_entry.len`: the bytes transferred (received, for a truncated receive).
    pub(super) len: usize,
    /// `fi_strerror`'s text, and the provider's where it gave one.
    message: String,
}

impl ErrorEntry {
    /// The error, as `call`'s failure.
    pub(super) fn error(&self, call: &'static str) -> DmaError {
        DmaError::Fabric {
            call,
            code: (-self.err).into(),
            message: self.message.clone(),
        }
    }
}

/// Read one error entry of `cq` with `fi_cq_readerr`, into an `err_data` buffer of this call's
/// own (libfabric's shared one is overwritten, or freed, by the next read on any thread), and
/// describe it with `fi_cq_strerror`. `None` when there was none (another thread took it).
pub(super) fn read_error_entry(cq: *mut sys::fid_cq) -> Result<Option<ErrorEntry>, DmaError> {
    let mut err_data = [0_u8; ERR_DATA_LEN];
    let mut entry = sys::fi_cq_err_entry {
        err_data: err_data.as_mut_ptr().cast(),
        err_data_size: err_data.len(),
        ..Default::default()
    };
    // SAFETY: the queue is open, `entry` is a valid error entry to fill, and its `err_data`
    // points at `err_data_size` writable bytes that live across the call.
    let read = unsafe { sys::fi_cq_readerr(cq, &raw mut entry, 0) };
    if 0 == read || -(sys::FI_EAGAIN as isize) == read {
        return Ok(None);
    }
    if read < 0 {
        return Err(DmaError::fabric("fi_cq_readerr", read as i64));
    }
    let mut text = [0 as std::ffi::c_char; 256];
    // SAFETY: the queue is open; `err_data` is this call's own buffer, which the provider
    // filled (nobody else can touch it), and `text` has room for `text.len()` bytes. The
    // returned pointer is to `text` or to a static string, read before either goes away.
    let message = unsafe {
        let provider_text = sys::fi_cq_strerror(
            cq,
            entry.prov_errno,
            err_data.as_ptr().cast(),
            text.as_mut_ptr(),
            text.len(),
        );
        let text = crate::error::strerror(entry.err.into());
        if provider_text.is_null() || 0 == entry.prov_errno {
            text
        } else {
            let provider_text = CStr::from_ptr(provider_text).to_string_lossy();
            format!(
                "{text} (provider error {}: {provider_text})",
                entry.prov_errno
            )
        }
    };
    Ok(Some(ErrorEntry {
        op_context: entry.op_context,
        err: entry.err,
        prov_errno: entry.prov_errno,
        len: entry.len,
        message,
    }))
}
