//! What an endpoint tells about itself and its address vector: its cache, what the provider
//! chose, its own address, and the address the AV holds at an index.
//!
//! [`lookup`](LibfabricEndpoint::lookup) reads only indices this AV has handed out: libfabric
//! 1.17 crashes on the others.

use super::{Description, LibfabricEndpoint, check};
#[cfg(doc)] // for the docs' links
use crate::av::FabricAv;
use crate::cache::AddressCache;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

impl LibfabricEndpoint {
    /// The cache of address-vector entries that posting threads resolve peers through.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let endpoint = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
    /// assert_eq!(0, endpoint.cache().stats().entries);
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn cache(&self) -> &AddressCache {
        &self.peers
    }

    /// The endpoint's [`cache`](Self::cache), under its old name: it returns an
    /// [`AddressCache`], not a list of peers.
    #[deprecated(since = "0.2.0", note = "renamed to `cache()`")]
    pub fn peers(&self) -> &AddressCache {
        self.cache()
    }

    /// What the provider chose.
    pub fn describe(&self) -> &Description {
        &self.description
    }

    /// This endpoint's own address, to advertise to peers, which resolve it through their
    /// caches.
    ///
    /// On a credited endpoint (the default,
    /// [`PeerProtocol::Credited`](crate::configuration::PeerProtocol::Credited)) the address is
    /// *sealed*: the provider's name followed by [`SEAL_LEN`](crate::address::SEAL_LEN) bytes
    /// carrying the secret this endpoint drew at `open`. A peer that resolves it takes nothing
    /// from whoever answers at the provider's address until that one proves the secret (see
    /// `docs/guarantees.md`: a peer is who its address says). On a plain endpoint it is the provider's name, as
    /// `fi_getname` gives it.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, LibfabricEndpoint, PeerProtocol, SEAL_LEN};
    ///
    /// let credited = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
    /// let plain = LibfabricEndpoint::open(
    ///     &Configuration { peer_protocol: PeerProtocol::Plain, ..Configuration::default() },
    ///     Some("127.0.0.1"),
    /// )?;
    /// let sealed = credited.local_address()?;
    /// assert_eq!(plain.local_address()?.len() + SEAL_LEN, sealed.len());
    /// assert_eq!(sealed, credited.local_address()?, "drawn once, at open");
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// [`DmaError::Fabric`] if `fi_getname` fails, or still finds its buffer too small the second
    /// time.
    pub fn local_address(&self) -> Result<Vec<u8>, DmaError> {
        match self.credits.as_deref() {
            Some(credits) => Ok(credits.address().to_vec()),
            None => self.provider_name(),
        }
    }

    /// The provider's name for this endpoint (`fi_getname`).
    ///
    /// The buffer is sized from what `fi_getname` reports: a provider whose name is longer than
    /// `fi_info.src_addrlen` answers `-FI_ETOOSMALL` with the length it needs, and the call is
    /// made once more with that much room.
    pub(super) fn provider_name(&self) -> Result<Vec<u8>, DmaError> {
        sized_name(self.description.address_len, |buffer, len| {
            // SAFETY: the endpoint is open; `buffer` has room for `*len` bytes (`sized_name`
            // hands a slice of exactly that length) and fi_getname writes at most that many,
            // updating `*len` to the real length (also when it answers -FI_ETOOSMALL, having
            // written nothing).
            unsafe {
                sys::fi_getname(
                    &raw mut (*self.handles.ep).fid,
                    buffer.as_mut_ptr().cast(),
                    len,
                )
            }
        })
    }

    /// The address the real address vector holds at `fi_addr`, through `fi_av_lookup`, or `None`
    /// when the index is not one this AV has handed out.
    ///
    /// `None`, without a libfabric call, for an index at or past the AV's capacity
    /// (`Configuration::av_capacity`) or past the highest index `fi_av_insert` has given a
    /// [`FabricAv`] on this AV: the endpoint's own cache, or a [`FabricAv::from_raw`] backend on
    /// [`address_vector`](Self::address_vector). libfabric 1.17 crashes looking up any other
    /// index (its entry pool may have no memory there yet). Indices inserted by calling
    /// `fi_av_insert` on the raw AV directly are not recorded: insert through a `FabricAv` to
    /// look them up. Also `None` when the provider itself answers `-FI_EINVAL`.
    ///
    /// This is how tests see what libfabric itself holds, but it cannot show a removal on its
    /// own: on libfabric 1.17's tcp provider a removed index still reads back its old bytes, and
    /// a never-used index inside the table reads back zeros, both with success. A removal shows
    /// through reuse instead: the table hands out the lowest free index first.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, LibfabricEndpoint, SEAL_LEN};
    ///
    /// let endpoint = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// assert_eq!(None, endpoint.lookup(5)?, "nothing handed out yet");
    /// assert_eq!(None, endpoint.lookup(1 << 40)?, "far outside the table");
    /// let address = endpoint.local_address()?;
    /// let pinned = endpoint.cache().pin();
    /// let peer = pinned.resolve(1, &address)?;
    /// // The AV holds the provider's name; the seal after it stays with the cache.
    /// let provider_part = &address[..address.len() - SEAL_LEN];
    /// assert_eq!(Some(provider_part), endpoint.lookup(peer.fi_addr())?.as_deref());
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// [`DmaError::Fabric`] for any failure other than an index outside the table.
    pub fn lookup(&self, fi_addr: sys::fi_addr_t) -> Result<Option<Vec<u8>>, DmaError> {
        if !self.handed_out.contains(fi_addr) {
            return Ok(None);
        }
        let mut address = vec![0_u8; self.description.address_len.max(1)];
        let mut len = address.len();
        // SAFETY: the AV is open; `fi_addr` is below an index fi_av_insert handed out on it, so
        // it lies in table memory the AV allocated and keeps until it closes; `address` has room
        // for `len` bytes and fi_av_lookup copies at most that many, reporting the full length in
        // `len`.
        let code = unsafe {
            sys::fi_av_lookup(
                self.handles.av,
                fi_addr,
                address.as_mut_ptr().cast(),
                &raw mut len,
            )
        };
        if -(sys::FI_EINVAL as i32) == code {
            return Ok(None);
        }
        check("fi_av_lookup", code)?;
        address.truncate(len.min(address.len()));
        Ok(Some(address))
    }

    /// The raw address vector, for code that calls libfabric directly (benches of the bare
    /// `fi_av_insert`, for one). Nothing here stops such code from breaking the cache's
    /// accounting: it must remove exactly what it inserted. Indices it inserts directly are not
    /// recorded for [`lookup`](Self::lookup); a [`FabricAv::from_raw`] backend's are.
    pub fn address_vector(&self) -> *mut sys::fid_av {
        self.handles.av
    }
}

/// Call `getname` (`fi_getname`'s contract: fill the buffer, set the length) with a buffer of
/// `first_guess` bytes; when it answers `-FI_ETOOSMALL` with the length it needs, once more with
/// that many.
fn sized_name(
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
