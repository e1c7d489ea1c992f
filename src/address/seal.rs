//! The seal: the eight bytes a credited endpoint appends to the address it advertises
//! ([`LibfabricEndpoint::local_address`](crate::endpoint::LibfabricEndpoint::local_address)), so
//! that the address names a process and not only a port.
//!
//! A seal is the endpoint's secret (56 bits, drawn at `open`) below a version byte, little-endian.
//! An address of the provider's length plus [`SEAL_LEN`] is sealed; one of the provider's length
//! is bare (a plain endpoint's, a C peer's, one built by hand). What the seal proves, and against
//! whom, is the credit protocol's business (`endpoint::credits`): here it is only bytes, checked
//! for their version before any libfabric call, and never read by `fi_av_insert`, which reads the
//! provider's length and no more.

use crate::error::DmaError;

/// The bytes a seal adds to a provider's address.
pub const SEAL_LEN: usize = 8;

/// The seal's layout version, in its top byte: another one is refused, naming both.
const SEAL_VERSION: u8 = 1;

/// The secret's bits: the 56 below the version byte.
pub(crate) const SEALED_SECRET_MASK: u64 = (1 << 56) - 1;

/// `name` (the provider's address) sealed with `secret` (its low 56 bits).
pub(crate) fn seal(name: &[u8], secret: u64) -> Vec<u8> {
    let seal = (u64::from(SEAL_VERSION) << 56) | (secret & SEALED_SECRET_MASK);
    let mut sealed = Vec::with_capacity(name.len() + SEAL_LEN);
    sealed.extend_from_slice(name);
    sealed.extend_from_slice(&seal.to_le_bytes());
    sealed
}

/// The secret `address` is sealed with, `None` for a bare address (of `address_len` bytes, the
/// provider's). The caller checked the length is one of the two.
///
/// # Errors
/// [`DmaError::InvalidAddress`] for a seal of another version.
pub(crate) fn secret_of(address: &[u8], address_len: usize) -> Result<Option<u64>, DmaError> {
    let Some(trailer) = address
        .get(address_len..)
        .filter(|rest| SEAL_LEN == rest.len())
    else {
        return Ok(None);
    };
    let mut bytes = [0; SEAL_LEN];
    bytes.copy_from_slice(trailer);
    let seal = u64::from_le_bytes(bytes);
    let version = (seal >> 56) as u8;
    if SEAL_VERSION == version {
        Ok(Some(seal & SEALED_SECRET_MASK))
    } else {
        Err(DmaError::InvalidAddress(format!(
            "a sealed address ({} bytes: the provider's {address_len} and a seal) of seal version \
             {version}, where this release reads version {SEAL_VERSION}: the peer runs another \
             release of dma-libfabric",
            address.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seal_carries_the_secret_and_is_refused_in_another_version() {
        let sealed = seal(&[9; 16], u64::MAX);
        assert_eq!(16 + SEAL_LEN, sealed.len());
        assert_eq!(Ok(Some(SEALED_SECRET_MASK)), secret_of(&sealed, 16));
        assert_eq!(Ok(None), secret_of(&sealed[..16], 16), "bare");
        let mut foreign = sealed.clone();
        foreign[16 + 7] = 2;
        match secret_of(&foreign, 16) {
            Err(DmaError::InvalidAddress(why)) => assert!(why.contains("version 2"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(Ok(Some(0)), secret_of(&seal(&[9; 16], 0), 16));
    }
}
