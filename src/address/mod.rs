//! Peer addresses: how many of their bytes name the peer, and which lengths are acceptable.
//!
//! What a user relies on (which addresses are refused before any libfabric call, and what an
//! efa address's identity is) is on [`AddressFormat`], where a user reads it.

mod seal;

pub use self::seal::SEAL_LEN;
pub(crate) use self::seal::{SEALED_SECRET_MASK, Seal, seal, seal_of, secret_of};

use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// `sizeof(struct efa_ep_addr)`: `raw[16]`, `qpn: u16`, `pad: u16`, `qkey: u32`, `next: ptr`.
pub const EFA_ADDRESS_LEN: usize = 32;
/// The GID and the QPN: the part of an efa address that names the endpoint slot.
pub const EFA_IDENTITY_LEN: usize = 18;
/// A `struct sockaddr_in`, which is what tcp on IPv4 advertises.
pub const SOCKADDR_IN_LEN: usize = 16;

/// How a provider lays out an address.
///
/// `fi_av_insert` reads as many bytes as the provider's address length whatever slice it is
/// given, so every address is checked against that length before any libfabric call: an address
/// of any other length (empty included) is [`DmaError::InvalidAddress`]. So is an address of
/// all zero bytes, on every format: it is what a peer advertises before `fi_getname` has run
/// (seen during rolling restarts), never a real peer, and on efa it would be inserted as one.
///
/// On efa an address is not only an identifier: it is `raw[16]` (the GID), `qpn: u16`,
/// `pad: u16`, `qkey: u32` and 8 bytes of pointer. The device hands a closed endpoint's QPN to the
/// next endpoint on the card, and efa's reverse address vector keys entries by GID and QPN, so
/// those 18 bytes are the peer's *identity* and the QKEY only tells incarnations of one slot
/// apart. Every other provider's identity is the whole address.
///
/// ```
/// use dma_libfabric::AddressFormat;
///
/// let efa = [7_u8; 32];
/// assert_eq!(18, AddressFormat::Efa.identity(&efa, 32)?.len());
/// assert!(AddressFormat::Efa.identity(&efa[..31], 32).is_err());
/// assert_eq!(16, AddressFormat::Opaque.identity(&[1; 16], 16)?.len());
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressFormat {
    /// efa: the GID and QPN name a slot the device recycles; the QKEY tells its incarnations
    /// apart. The identity is the first [`EFA_IDENTITY_LEN`] bytes of [`EFA_ADDRESS_LEN`].
    Efa,
    /// Every other provider: the address is the identity.
    Opaque,
}

impl AddressFormat {
    /// The format of `fi_info.addr_format`.
    pub fn from_fi(addr_format: u32) -> Self {
        if sys::FI_ADDR_EFA == addr_format {
            Self::Efa
        } else {
            Self::Opaque
        }
    }

    /// The address length a provider of this format uses when it does not say: 32 for efa, a
    /// `sockaddr_in` otherwise.
    pub fn default_len(self) -> usize {
        match self {
            Self::Efa => EFA_ADDRESS_LEN,
            Self::Opaque => SOCKADDR_IN_LEN,
        }
    }

    /// The identity of `address`, a prefix of it, after checking that it is `address_len` bytes
    /// long (and, for efa, that the provider's length is efa's).
    ///
    /// # Errors
    /// [`DmaError::InvalidAddress`] for an empty address, one of any other length, or one of all
    /// zero bytes.
    ///
    /// An address may also be *sealed*: `address_len` bytes and a [`SEAL_LEN`]-byte seal, as a
    /// credited endpoint advertises it. A sealed address's identity takes the seal in (every byte,
    /// on an opaque format), so two processes that claim one port in turn are two peers; on efa
    /// the identity stays the GID and QPN, the seal telling incarnations apart as the QKEY does.
    ///
    /// ```
    /// use dma_libfabric::{AddressFormat, SEAL_LEN};
    ///
    /// let mut sealed = vec![7_u8; 16 + SEAL_LEN];
    /// sealed[16 + 7] = 1; // the seal's version
    /// assert_eq!(16 + SEAL_LEN, AddressFormat::Opaque.identity(&sealed, 16)?.len());
    /// sealed[16 + 7] = 9;
    /// assert!(AddressFormat::Opaque.identity(&sealed, 16).is_err(), "an unknown seal");
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn identity(self, address: &[u8], address_len: usize) -> Result<&[u8], DmaError> {
        let identity_len = self.identity_len(address, address_len)?;
        Ok(&address[..identity_len])
    }

    /// How many leading bytes of a checked `address` name its peer: every check a new address
    /// takes before it goes near the AV (the writer runs it on each miss, `FabricAv::insert`
    /// again), the all-zero refusal included.
    pub(crate) fn identity_len(
        self,
        address: &[u8],
        address_len: usize,
    ) -> Result<usize, DmaError> {
        let identity_len = self.layout_identity_len(address, address_len)?;
        refuse_unset(&address[..address_len])?;
        secret_of(address, address_len)?;
        Ok(identity_len)
    }

    /// [`identity_len`](Self::identity_len) by length alone, whatever the bytes: what every
    /// address of `address_len` bytes gets, so the cache can work it out once, with a probe.
    pub(crate) fn layout_identity_len(
        self,
        address: &[u8],
        address_len: usize,
    ) -> Result<usize, DmaError> {
        if address.is_empty() {
            return Err(DmaError::InvalidAddress("the address is empty".into()));
        }
        if address.len() != address_len && address.len() != address_len + SEAL_LEN {
            return Err(DmaError::InvalidAddress(format!(
                "the address is {} bytes, and this provider's addresses are {address_len} \
                 ({} sealed)",
                address.len(),
                address_len + SEAL_LEN
            )));
        }
        match self {
            Self::Efa if EFA_ADDRESS_LEN != address_len => Err(DmaError::InvalidAddress(format!(
                "efa addresses are {EFA_ADDRESS_LEN} bytes, not {address_len}"
            ))),
            Self::Efa => Ok(EFA_IDENTITY_LEN),
            Self::Opaque => Ok(address.len()),
        }
    }
}

/// Refuse an address of all zero bytes: what a peer advertises before `fi_getname` has run
/// (Mooncake saw it during rolling restarts), never a real peer on any provider. On efa it would
/// be a GID of zeros, inserted as a peer; on tcp a `sockaddr` of family 0.
///
/// Cheap on a real address: the scan stops at its first non-zero byte (a `sockaddr`'s family, an
/// efa GID's `fe80` prefix).
///
/// # Errors
/// [`DmaError::InvalidAddress`] when every byte of `address` is zero.
pub(crate) fn refuse_unset(address: &[u8]) -> Result<(), DmaError> {
    if address.iter().all(|&byte| byte == 0) {
        Err(DmaError::InvalidAddress(format!(
            "the address is {} zero bytes: a peer that has not been given its address yet \
             (fi_getname has not run), not a peer",
            address.len()
        )))
    } else {
        Ok(())
    }
}

/// `AF_INET` and `AF_INET6` as Linux numbers them; `sa_family` is in host byte order.
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
/// A `struct sockaddr_in6`.
const SOCKADDR_IN6_LEN: usize = 28;

/// Check what libfabric's socket-address AVs do not: that a `sockaddr` claims the family its
/// format and length say. Other formats pass unchanged (their length was checked already).
///
/// # Errors
/// [`DmaError::InvalidAddress`] naming the family found and the one expected.
pub(crate) fn check_sockaddr(addr_format: u32, address: &[u8]) -> Result<(), DmaError> {
    let family = match address {
        [low, high, ..] => u16::from_ne_bytes([*low, *high]),
        _ => return Ok(()),
    };
    let expected = match (addr_format, address.len()) {
        (sys::FI_SOCKADDR_IN, _) | (sys::FI_SOCKADDR, SOCKADDR_IN_LEN) => AF_INET,
        (sys::FI_SOCKADDR_IN6, _) | (sys::FI_SOCKADDR, SOCKADDR_IN6_LEN) => AF_INET6,
        _ => return Ok(()),
    };
    if family == expected {
        Ok(())
    } else {
        Err(DmaError::InvalidAddress(format!(
            "a {}-byte socket address of family {family}, where this provider takes family {expected}",
            address.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An efa address with a fixed GID.
    fn efa(qpn: u16, qkey: u32) -> Vec<u8> {
        let mut bytes = vec![0xfe; EFA_ADDRESS_LEN];
        bytes[16..18].copy_from_slice(&qpn.to_ne_bytes());
        bytes[18..20].fill(0);
        bytes[20..24].copy_from_slice(&qkey.to_ne_bytes());
        bytes
    }

    #[test]
    fn efa_addresses_differing_only_in_qkey_share_an_identity() {
        let old = efa(0, 0x9bce_1061);
        let new = efa(0, 0x961f_0203);
        assert_ne!(old, new);
        assert_eq!(
            AddressFormat::Efa.identity(&old, 32).ok(),
            AddressFormat::Efa.identity(&new, 32).ok()
        );
    }

    #[test]
    fn efa_addresses_with_different_qpns_are_different_identities() {
        assert_ne!(
            AddressFormat::Efa.identity(&efa(0, 1), 32).ok(),
            AddressFormat::Efa.identity(&efa(1, 1), 32).ok()
        );
    }

    #[test]
    fn efa_rejects_every_length_but_32() {
        for len in [0, 1, 17, 18, 31, 33, 64] {
            let address = vec![0; len];
            let error = AddressFormat::Efa.identity(&address, 32);
            assert!(
                matches!(error, Err(DmaError::InvalidAddress(_))),
                "{len} bytes: {error:?}"
            );
        }
        assert!(AddressFormat::Efa.identity(&[7; 32], 32).is_ok());
        assert!(
            AddressFormat::Efa.identity(&[7; 16], 16).is_err(),
            "efa is 32 bytes whatever the provider says"
        );
    }

    #[test]
    fn opaque_addresses_are_checked_against_the_providers_length() {
        assert!(AddressFormat::Opaque.identity(&[], 16).is_err());
        assert!(AddressFormat::Opaque.identity(&[1; 15], 16).is_err());
        assert!(AddressFormat::Opaque.identity(&[1; 17], 16).is_err());
        assert_eq!(
            Some(&[1_u8; 16][..]),
            AddressFormat::Opaque.identity(&[1; 16], 16).ok()
        );
    }

    #[test]
    fn an_all_zero_address_is_refused_on_every_format() {
        for (format, len) in [
            (AddressFormat::Efa, EFA_ADDRESS_LEN),
            (AddressFormat::Opaque, SOCKADDR_IN_LEN),
            (AddressFormat::Opaque, SOCKADDR_IN6_LEN),
            (AddressFormat::Opaque, 1),
        ] {
            let zero = vec![0; len];
            match format.identity(&zero, len) {
                Err(DmaError::InvalidAddress(why)) => assert!(why.contains("zero"), "{why}"),
                other => panic!("{format:?}, {len} zero bytes: {other:?}"),
            }
            // One byte set anywhere makes it an address; the layout alone never refuses it.
            for set in [0, len - 1] {
                let mut address = zero.clone();
                address[set] = 1;
                assert!(
                    format.identity(&address, len).is_ok(),
                    "{format:?} byte {set}"
                );
            }
            assert!(format.layout_identity_len(&zero, len).is_ok());
        }
    }

    #[test]
    fn opaque_identity_is_every_byte() {
        assert_ne!(
            AddressFormat::Opaque.identity(&[1, 2, 3], 3).ok(),
            AddressFormat::Opaque.identity(&[1, 2, 4], 3).ok()
        );
    }

    #[test]
    fn socket_addresses_must_claim_their_family() {
        let mut address = [0_u8; 16];
        address[0..2].copy_from_slice(&AF_INET.to_ne_bytes());
        assert!(check_sockaddr(sys::FI_SOCKADDR_IN, &address).is_ok());
        assert!(check_sockaddr(sys::FI_SOCKADDR, &address).is_ok());
        for family in [0_u16, 1, AF_INET6, 0xffff] {
            address[0..2].copy_from_slice(&family.to_ne_bytes());
            let checked = check_sockaddr(sys::FI_SOCKADDR_IN, &address);
            assert!(
                matches!(checked, Err(DmaError::InvalidAddress(_))),
                "{family}: {checked:?}"
            );
        }
        let mut six = [0_u8; 28];
        six[0..2].copy_from_slice(&AF_INET6.to_ne_bytes());
        assert!(check_sockaddr(sys::FI_SOCKADDR_IN6, &six).is_ok());
        assert!(check_sockaddr(sys::FI_SOCKADDR, &six).is_ok());
        assert!(
            check_sockaddr(sys::FI_ADDR_EFA, &[0; 32]).is_ok(),
            "not a sockaddr"
        );
    }

    #[test]
    fn the_format_comes_from_fi_info() {
        assert_eq!(AddressFormat::Efa, AddressFormat::from_fi(sys::FI_ADDR_EFA));
        assert_eq!(
            AddressFormat::Opaque,
            AddressFormat::from_fi(sys::FI_SOCKADDR_IN)
        );
    }
}
