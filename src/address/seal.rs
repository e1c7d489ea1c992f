//! The seal: the [`SEAL_LEN`] bytes a credited endpoint appends to the address it advertises
//! ([`LibfabricEndpoint::local_address`](crate::endpoint::LibfabricEndpoint::local_address)), so
//! that the address names a process and not only a port, and says how the process's rxm is sized.
//!
//! A seal is, little-endian, a `u64` holding the endpoint's secret (56 bits, drawn at `open`)
//! below a version byte, then a `u32`: the process's rxm eager limit (`FI_OFI_RXM_BUFFER_SIZE`
//! as rxm read it), or 0 where there is none or it is not known. An address of the provider's
//! length plus [`SEAL_LEN`] is sealed; one of the provider's length is bare (a plain endpoint's,
//! a C peer's, one built by hand). What the secret proves, and against whom, is the credit
//! protocol's business (`endpoint::credits`); the eager limit is compared with this process's
//! before `fi_av_insert` (`av::fabric`), because rxm refuses a connection between processes
//! whose limits differ and says so only in its log. Here a seal is only bytes, checked for their
//! version before any libfabric call, and never read by `fi_av_insert`, which reads the
//! provider's length and no more.

use crate::error::DmaError;

/// The bytes a seal adds to a provider's address: the secret under its version (8), then the
/// rxm eager limit (4).
pub const SEAL_LEN: usize = 12;

/// The seal's layout version, in the top byte of its first eight: another one is refused,
/// naming both.
const SEAL_VERSION: u8 = 1;

/// The secret's bits: the 56 below the version byte.
pub(crate) const SEALED_SECRET_MASK: u64 = (1 << 56) - 1;

/// What a sealed address carries beyond the provider's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seal {
    /// The endpoint's secret, 56 bits.
    pub(crate) secret: u64,
    /// The process's rxm eager limit, 0 where it has none or does not know it.
    pub(crate) eager_limit: u32,
}

/// `name` (the provider's address) sealed with `seal` (the secret's low 56 bits).
pub(crate) fn seal(name: &[u8], seal: Seal) -> Vec<u8> {
    let head = (u64::from(SEAL_VERSION) << 56) | (seal.secret & SEALED_SECRET_MASK);
    let mut sealed = Vec::with_capacity(name.len() + SEAL_LEN);
    sealed.extend_from_slice(name);
    sealed.extend_from_slice(&head.to_le_bytes());
    sealed.extend_from_slice(&seal.eager_limit.to_le_bytes());
    sealed
}

/// The seal `address` carries, `None` for a bare address (of `address_len` bytes, the
/// provider's). The caller checked the length is one of the two.
///
/// # Errors
/// [`DmaError::InvalidAddress`] for a seal of another version.
pub(crate) fn seal_of(address: &[u8], address_len: usize) -> Result<Option<Seal>, DmaError> {
    let Some((head, limit)) = address
        .get(address_len..)
        .filter(|rest| SEAL_LEN == rest.len())
        .and_then(|rest| Some((rest.first_chunk::<8>()?, rest.last_chunk::<4>()?)))
    else {
        return Ok(None);
    };
    let head = u64::from_le_bytes(*head);
    let version = (head >> 56) as u8;
    if SEAL_VERSION == version {
        Ok(Some(Seal {
            secret: head & SEALED_SECRET_MASK,
            eager_limit: u32::from_le_bytes(*limit),
        }))
    } else {
        Err(DmaError::InvalidAddress(format!(
            "a sealed address ({} bytes: the provider's {address_len} and a seal) of seal version \
             {version}, where this release reads version {SEAL_VERSION}: the peer runs another \
             release of dma-libfabric",
            address.len()
        )))
    }
}

/// The secret `address` is sealed with, `None` for a bare address: [`seal_of`]'s secret.
///
/// # Errors
/// As [`seal_of`].
pub(crate) fn secret_of(address: &[u8], address_len: usize) -> Result<Option<u64>, DmaError> {
    Ok(seal_of(address, address_len)?.map(|seal| seal.secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seal_carries_the_secret_and_the_eager_limit_and_is_refused_in_another_version() {
        let sealed = seal(
            &[9; 16],
            Seal {
                secret: u64::MAX,
                eager_limit: u32::MAX,
            },
        );
        assert_eq!(16 + SEAL_LEN, sealed.len());
        let expected = Seal {
            secret: SEALED_SECRET_MASK,
            eager_limit: u32::MAX,
        };
        assert_eq!(Ok(Some(expected)), seal_of(&sealed, 16));
        assert_eq!(Ok(Some(SEALED_SECRET_MASK)), secret_of(&sealed, 16));
        assert_eq!(Ok(None), seal_of(&sealed[..16], 16), "bare");
        assert_eq!(
            Ok(None),
            seal_of(&sealed[..16 + 8], 16),
            "too short to be a seal"
        );
        let mut foreign = sealed.clone();
        foreign[16 + 7] = 2;
        match seal_of(&foreign, 16) {
            Err(DmaError::InvalidAddress(why)) => assert!(why.contains("version 2"), "{why}"),
            other => panic!("{other:?}"),
        }
        let zero = Seal {
            secret: 0,
            eager_limit: 0,
        };
        assert_eq!(Ok(Some(zero)), seal_of(&seal(&[9; 16], zero), 16));
    }
}
