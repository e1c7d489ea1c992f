//! What a peer advertises so that others may reach a region: [`RemoteRegion`], its 24-byte
//! encoding, and its checked slices. A descriptor read from the wire
//! ([`RemoteRegion::from_bytes`]) or cut from another ([`RemoteRegion::slice`]) is never empty and
//! its end never overflows, which libfabric's own check of a peer's range does not catch.

use crate::error::DmaError;

/// What a peer advertises so that others may write into or read from its memory: the address to
/// post against (the virtual address under `FI_MR_VIRT_ADDR`, else an offset from 0), the key,
/// and the length.
///
/// Encoded as 24 bytes, little-endian: address, key, length.
///
/// ```
/// use dma_libfabric::{DmaError, RemoteRegion};
///
/// let remote = RemoteRegion { address: 0x1000, key: 7, len: 64 };
/// let bytes = remote.to_bytes();
/// assert_eq!(remote, RemoteRegion::from_bytes(&bytes)?);
/// assert!(matches!(RemoteRegion::from_bytes(&bytes[..23]), Err(DmaError::InvalidArgument(_))));
///
/// let tail = remote.slice(60, 4)?; // the last four bytes
/// assert_eq!((0x1000 + 60, 4), (tail.address, tail.len));
/// assert!(remote.slice(61, 4).is_err());
/// # Ok::<(), DmaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The address of the first byte, as RMA calls take it.
    pub address: u64,
    /// The registration's key.
    pub key: u64,
    /// How many bytes may be written or read from `address`.
    pub len: u64,
}

impl RemoteRegion {
    /// The length of [`to_bytes`](Self::to_bytes).
    pub const ENCODED_LEN: usize = 24;

    /// The fixed little-endian layout: address, key, length.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut bytes = [0; Self::ENCODED_LEN];
        bytes[0..8].copy_from_slice(&self.address.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.key.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.len.to_le_bytes());
        bytes
    }

    /// Parse [`to_bytes`](Self::to_bytes)'s layout.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for anything but exactly
    /// [`ENCODED_LEN`](Self::ENCODED_LEN) bytes, an empty region, or one whose end overflows.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DmaError> {
        let Ok(bytes) = <&[u8; Self::ENCODED_LEN]>::try_from(bytes) else {
            return Err(DmaError::InvalidArgument(format!(
                "a remote region is {} bytes, not {}",
                Self::ENCODED_LEN,
                bytes.len()
            )));
        };
        let word = |at: usize| {
            let mut word = [0; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        let remote = Self {
            address: word(0),
            key: word(8),
            len: word(16),
        };
        if 0 == remote.len || remote.address.checked_add(remote.len).is_none() {
            return Err(DmaError::InvalidArgument(format!(
                "a remote region of {} bytes at {:#x} is empty or overflows",
                remote.len, remote.address
            )));
        }
        Ok(remote)
    }

    /// `len` bytes at `offset` of this region.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for an empty range, one that does not fit, or one whose
    /// address plus length overflows (libfabric's `ofi_mr_map_verify` adds them unchecked; see
    /// `docs/rma.md`, "libfabric's `ofi_mr_map_verify` does not check for overflow").
    ///
    /// ```
    /// use dma_libfabric::RemoteRegion;
    ///
    /// // Built by hand (the fields are public), so `from_bytes` never checked it.
    /// let wrapping = RemoteRegion { address: u64::MAX - 15, key: 1, len: 64 };
    /// assert!(wrapping.slice(0, 8).is_ok(), "ends below 2^64");
    /// assert!(wrapping.slice(8, 8).is_err(), "ends at 2^64: address + len overflows");
    /// assert!(wrapping.slice(16, 8).is_err(), "starts past the end of the address space");
    /// ```
    pub fn slice(&self, offset: u64, len: u64) -> Result<Self, DmaError> {
        let end = offset.checked_add(len);
        let address = self.address.checked_add(offset);
        match (end, address) {
            (Some(end), Some(address))
                if 0 < len && end <= self.len && address.checked_add(len).is_some() =>
            {
                Ok(Self {
                    address,
                    key: self.key,
                    len,
                })
            }
            _ => Err(DmaError::InvalidArgument(format!(
                "{len} bytes at offset {offset} do not fit a {}-byte remote region at {:#x}, or \
                 their end overflows",
                self.len, self.address
            ))),
        }
    }
}
