//! The credit protocol on the wire: the tag every credited message carries, and the two control
//! messages (a sender's introduction, a receiver's grant).
//!
//! # The tag
//!
//! Every credited message is a tagged message (`fi_tsend`, `fi_trecv`), so a message carries no
//! header in its bytes: a receive buffer, a `receive_into` destination and a `send_from` source
//! hold the application's bytes alone. The 64-bit tag is:
//!
//! | bits | what |
//! |---|---|
//! | 63..60 | the protocol's version, [`VERSION`] |
//! | 59..56 | the kind: [`Kind::Data`] (the application's), [`Kind::Control`] (the library's) |
//! | 55..0 | the sender's secret, its low 56 bits |
//!
//! Data receives and control receives are posted with the kind exact and the other bits ignored,
//! so the two never take each other's messages, and a message of another version is still
//! received, and refused with an error that names both versions.
//!
//! # Control messages
//!
//! Little-endian, at most [`CONTROL_SIZE`] bytes:
//!
//! | bytes | introduction ([`Control::Introduction`]) | grant ([`Control::Grant`]) |
//! |---|---|---|
//! | 0 | [`VERSION`] | [`VERSION`] |
//! | 1 | 1 | 2 |
//! | 2..4 | 0 | 0 |
//! | 4..8 | the address's length | 0 |
//! | 8..16 | the sender's secret | the granter's secret |
//! | 16..24 | `reply_to`: the sender's own name for the receiver | `reply_to`, echoed |
//! | 24.. | the sender's address | messages, bytes, notifications granted (3 × u64, cumulative) |
//!
//! Decoding checks every length and refuses what does not fit: a control message is read from
//! the network and may be anything.

/// The protocol's version: a peer of another version is refused with an error naming both.
pub(crate) const VERSION: u8 = 1;

/// The largest address an introduction carries (efa's is 32 bytes, tcp's 16 or 28).
pub(crate) const MAX_ADDRESS: usize = 64;

/// The largest control message: the fixed part and the largest address.
pub(crate) const CONTROL_SIZE: usize = 24 + MAX_ADDRESS;

const VERSION_SHIFT: u32 = 60;
const KIND_SHIFT: u32 = 56;
const SECRET_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// Whose a tagged message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The application's message.
    Data = 1,
    /// The library's: an introduction or a grant.
    Control = 2,
}

/// The tag a message of `kind` from an endpoint with `secret` carries.
pub(crate) fn tag(kind: Kind, secret: u64) -> u64 {
    (u64::from(VERSION) << VERSION_SHIFT) | ((kind as u64) << KIND_SHIFT) | (secret & SECRET_MASK)
}

/// The tag and ignore mask a receive for messages of `kind` is posted with: the kind exact.
pub(crate) fn receive_tag(kind: Kind) -> (u64, u64) {
    ((kind as u64) << KIND_SHIFT, !(0xF << KIND_SHIFT))
}

/// The version a received tag carries.
pub(crate) fn version_of(tag: u64) -> u8 {
    (tag >> VERSION_SHIFT) as u8
}

/// The sender's secret as a tag carries it (its low 56 bits).
pub(crate) fn secret_of(tag: u64) -> u64 {
    tag & SECRET_MASK
}

/// The low 56 bits of `secret`: what a tag carries of it, and what receivers key senders by.
pub(crate) fn tagged_secret(secret: u64) -> u64 {
    secret & SECRET_MASK
}

/// Messages, bytes and notifications: granted, sent or consumed, counted from a peer's
/// introduction on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Counts {
    pub(crate) messages: u64,
    pub(crate) bytes: u64,
    pub(crate) notifications: u64,
}

/// A control message, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Control {
    /// A sender introduces itself: who it is, and how to reach it.
    Introduction {
        secret: u64,
        reply_to: u64,
        address: Vec<u8>,
    },
    /// A receiver grants credit, cumulative since the introduction it answers.
    Grant {
        secret: u64,
        reply_to: u64,
        granted: Counts,
    },
}

/// Why a control message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Malformed {
    /// Another version of the protocol.
    Version(u8),
    /// Too short, too long, an unknown type, or an address of a length past [`MAX_ADDRESS`].
    Shape(&'static str),
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Version(version) => write!(
                formatter,
                "a control message of protocol version {version}, where this endpoint speaks {VERSION}"
            ),
            Self::Shape(what) => write!(formatter, "a malformed control message: {what}"),
        }
    }
}

impl Control {
    /// The message's bytes, written into `out` (at least [`CONTROL_SIZE`]); returns the length.
    /// An introduction's address is cut to [`MAX_ADDRESS`] (`open` refuses longer ones).
    pub(crate) fn encode(&self, out: &mut [u8; CONTROL_SIZE]) -> usize {
        out.fill(0);
        out[0] = VERSION;
        match self {
            Self::Introduction {
                secret,
                reply_to,
                address,
            } => {
                let len = address.len().min(MAX_ADDRESS);
                out[1] = 1;
                out[4..8].copy_from_slice(&(len as u32).to_le_bytes());
                out[8..16].copy_from_slice(&secret.to_le_bytes());
                out[16..24].copy_from_slice(&reply_to.to_le_bytes());
                out[24..24 + len].copy_from_slice(&address[..len]);
                24 + len
            }
            Self::Grant {
                secret,
                reply_to,
                granted,
            } => {
                out[1] = 2;
                out[8..16].copy_from_slice(&secret.to_le_bytes());
                out[16..24].copy_from_slice(&reply_to.to_le_bytes());
                out[24..32].copy_from_slice(&granted.messages.to_le_bytes());
                out[32..40].copy_from_slice(&granted.bytes.to_le_bytes());
                out[40..48].copy_from_slice(&granted.notifications.to_le_bytes());
                48
            }
        }
    }

    /// Decode `bytes`, refusing anything that is not exactly one well-formed control message.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, Malformed> {
        let word = |at: usize| -> Result<u64, Malformed> {
            bytes
                .get(at..at + 8)
                .and_then(|field| field.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or(Malformed::Shape("shorter than its fixed part"))
        };
        let version = *bytes.first().ok_or(Malformed::Shape("empty"))?;
        if VERSION != version {
            return Err(Malformed::Version(version));
        }
        let secret = word(8)?;
        let reply_to = word(16)?;
        match bytes.get(1) {
            Some(1) => {
                let len = bytes
                    .get(4..8)
                    .and_then(|field| field.try_into().ok())
                    .map(u32::from_le_bytes)
                    .ok_or(Malformed::Shape("shorter than its fixed part"))?
                    as usize;
                if len > MAX_ADDRESS || 0 == len {
                    return Err(Malformed::Shape("an address of no length or past 64 bytes"));
                }
                let address =
                    bytes
                        .get(24..)
                        .filter(|rest| rest.len() == len)
                        .ok_or(Malformed::Shape(
                            "an address of another length than it says",
                        ))?;
                Ok(Self::Introduction {
                    secret,
                    reply_to,
                    address: address.to_vec(),
                })
            }
            Some(2) => {
                if bytes.len() != 48 {
                    return Err(Malformed::Shape("a grant of another length than 48 bytes"));
                }
                Ok(Self::Grant {
                    secret,
                    reply_to,
                    granted: Counts {
                        messages: word(24)?,
                        bytes: word(32)?,
                        notifications: word(40)?,
                    },
                })
            }
            _ => Err(Malformed::Shape("an unknown type")),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use super::*;

    #[test]
    fn control_messages_round_trip() {
        let introduction = Control::Introduction {
            secret: u64::MAX,
            reply_to: 7,
            address: vec![3; 16],
        };
        let grant = Control::Grant {
            secret: 1,
            reply_to: u64::MAX,
            granted: Counts {
                messages: 64,
                bytes: u64::MAX,
                notifications: 0,
            },
        };
        for message in [introduction, grant] {
            let mut out = [0; CONTROL_SIZE];
            let len = message.encode(&mut out);
            assert_eq!(Ok(message.clone()), Control::decode(&out[..len]));
            // Every shorter or longer cut is refused.
            for cut in 0..len {
                assert!(Control::decode(&out[..cut]).is_err(), "{cut} of {len}");
            }
            assert!(Control::decode(&out[..len + 1]).is_err());
        }
    }

    #[test]
    fn another_version_is_named() {
        let mut out = [0; CONTROL_SIZE];
        let len = Control::Grant {
            secret: 1,
            reply_to: 2,
            granted: Counts::default(),
        }
        .encode(&mut out);
        out[0] = 9;
        let refused = Control::decode(&out[..len]).expect_err("another version");
        assert_eq!(Malformed::Version(9), refused);
        assert!(refused.to_string().contains("version 9"), "{refused}");
    }

    #[test]
    fn tags_keep_the_kind_exact_and_carry_version_and_secret() {
        let secret = 0xFFFF_FFFF_FFFF_FFFF;
        let data = tag(Kind::Data, secret);
        let control = tag(Kind::Control, secret);
        assert_eq!(VERSION, version_of(data));
        assert_eq!(tagged_secret(secret), secret_of(data));
        let matches = |tag: u64, (want, ignore): (u64, u64)| (tag & !ignore) == (want & !ignore);
        assert!(matches(data, receive_tag(Kind::Data)));
        assert!(!matches(data, receive_tag(Kind::Control)));
        assert!(matches(control, receive_tag(Kind::Control)));
        assert!(!matches(control, receive_tag(Kind::Data)));
    }
}
