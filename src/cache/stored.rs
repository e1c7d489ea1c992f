//! An address as the cache keeps it: its bytes, inline when short, with the length of the
//! identity that leads them.
//!
//! Every address the cache holds (an index registration, the writer's entry per AV index, a
//! request in the writer's inbox) is one of these, so an efa address (32 bytes), a `sockaddr_in6`
//! (28) or a `sockaddr_in` (16) costs no allocation of its own: a hit reads the bytes from the
//! node papaya already loaded, and a miss sends them to the writer without a `Box`. Longer
//! addresses (none of the providers the cache is tested on) go on the heap.

/// Addresses up to this long are stored inline.
pub(crate) const INLINE_ADDRESS: usize = 32;

/// An address's bytes and the length of its identity prefix. 40 bytes, inline or not.
#[derive(Clone, Debug)]
pub(crate) enum StoredAddress {
    Inline {
        len: u8,
        identity_len: u8,
        bytes: [u8; INLINE_ADDRESS],
    },
    Heap {
        identity_len: usize,
        bytes: Box<[u8]>,
    },
}

impl StoredAddress {
    /// `address`, whose first `identity_len` bytes (capped at its length) are its identity.
    pub(crate) fn new(address: &[u8], identity_len: usize) -> Self {
        let identity_len = identity_len.min(address.len());
        match (u8::try_from(address.len()), u8::try_from(identity_len)) {
            (Ok(len), Ok(identity)) if address.len() <= INLINE_ADDRESS => {
                let mut bytes = [0; INLINE_ADDRESS];
                bytes[..address.len()].copy_from_slice(address);
                Self::Inline {
                    len,
                    identity_len: identity,
                    bytes,
                }
            }
            _ => Self::Heap {
                identity_len,
                bytes: address.into(),
            },
        }
    }

    /// The whole address.
    #[inline]
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes, .. } => &bytes[..usize::from(*len)],
            Self::Heap { bytes, .. } => bytes,
        }
    }

    /// Its identity: the leading bytes that name the peer.
    #[inline]
    pub(crate) fn identity(&self) -> &[u8] {
        match self {
            Self::Inline {
                identity_len,
                bytes,
                ..
            } => &bytes[..usize::from(*identity_len)],
            Self::Heap {
                identity_len,
                bytes,
            } => &bytes[..*identity_len],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_and_heap_read_back_the_same() {
        for len in [1, 16, 28, 32, 33, 64] {
            let address: Vec<u8> = (0..len as u8).collect();
            let stored = StoredAddress::new(&address, 18);
            assert_eq!(address, stored.bytes());
            assert_eq!(&address[..18.min(len)], stored.identity());
            assert_eq!(
                len <= INLINE_ADDRESS,
                matches!(stored, StoredAddress::Inline { .. })
            );
        }
    }

    #[test]
    fn forty_bytes() {
        assert_eq!(40, std::mem::size_of::<StoredAddress>());
    }
}
