//! What an endpoint tells about itself and its address vector: how a name is read from libfabric
//! (`sized_name`, asked again with the length it says) and how `fi_getinfo`'s choice is
//! described; the calls (`local_address`, `lookup`, `describe`) are beside `open`.
//!
//! [`lookup`](LibfabricEndpoint::lookup) reads only indices this AV has handed out: libfabric
//! 1.17 crashes on the others.

use super::{Description, check};
#[cfg(doc)] // for the docs' links
use crate::av::FabricAv;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// Call `getname` (`fi_getname`'s contract: fill the buffer, set the length) with a buffer of
/// `first_guess` bytes; when it answers `-FI_ETOOSMALL` with the length it needs, once more with
/// that many.
pub(super) fn sized_name(
    first_guess: usize,
    mut getname: impl FnMut(&mut [u8], &mut usize) -> i32,
) -> Result<Vec<u8>, DmaError> {
    let mut address = vec![0_u8; first_guess.max(1)];
    for _ in 0..2 {
        let mut len = address.len();
        let code = getname(&mut address, &mut len);
        if -(sys::FI_ETOOSMALL as i32) == code && len > address.len() {
            address.resize(len, 0);
            continue;
        }
        check("fi_getname", code)?;
        address.truncate(len);
        return Ok(address);
    }
    Err(DmaError::fabric(
        "fi_getname",
        -i64::from(sys::FI_ETOOSMALL),
    ))
}

/// Copy what the first entry of `info` says into owned strings.
///
/// # Safety
/// `info` is a non-null `fi_info` returned by `fi_getinfo`.
pub(super) unsafe fn describe(info: *const sys::fi_info) -> Description {
    // SAFETY: fi_getinfo fills every attribute pointer of each entry it returns, and its name
    // strings are NUL-terminated or null.
    unsafe {
        let text = |raw: *const std::ffi::c_char| {
            if raw.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(raw).to_string_lossy().into_owned()
            }
        };
        let fabric = &*(*info).fabric_attr;
        let domain = &*(*info).domain_attr;
        Description {
            provider: text(fabric.prov_name),
            fabric: text(fabric.name),
            domain: text(domain.name),
            addr_format: (*info).addr_format,
            address_len: (*info).src_addrlen,
            threading: domain.threading,
            av_type: domain.av_type,
            inject_size: (*(*info).tx_attr).inject_size,
            reports_senders: 0 != (*info).caps & sys::FI_SOURCE,
            // Set once the send slab is sized.
            max_send_size: 0,
            max_sends_in_flight: 0,
            max_sends_in_flight_per_peer: 0,
            max_operations_per_peer: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use super::*;

    /// A name longer than `src_addrlen` (shm's was, and `local_address` failed with -257) is
    /// read in full with the length `fi_getname` asked for; a provider that keeps asking for more
    /// is an error, not a loop.
    #[test]
    fn a_name_longer_than_the_first_guess_is_read_with_the_length_asked_for() {
        let name = b"fi_shm://4242_000000001\0";
        let mut calls = 0;
        let read = sized_name(15, |buffer, len| {
            calls += 1;
            if buffer.len() < name.len() {
                *len = name.len();
                return -(sys::FI_ETOOSMALL as i32);
            }
            buffer[..name.len()].copy_from_slice(name);
            *len = name.len();
            0
        });
        assert_eq!(Ok(name.to_vec()), read);
        assert_eq!(2, calls);

        let greedy = sized_name(16, |buffer, len| {
            *len = buffer.len() + 1;
            -(sys::FI_ETOOSMALL as i32)
        });
        assert!(
            matches!(
                greedy,
                Err(DmaError::Fabric {
                    call: "fi_getname",
                    code: -257,
                    ..
                })
            ),
            "{greedy:?}"
        );
    }
}
