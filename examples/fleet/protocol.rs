//! What the processes say to each other: the control messages (length-prefixed frames on a
//! 127.0.0.1 `TcpStream`) and the records the server writes into client memory.

use std::io::{ErrorKind, Read, Write};

use dma_libfabric::RemoteRegion;

/// An RMA record: client id, incarnation, sequence, checksum.
pub use testkit::demo::RECORD_LEN;
/// Record slots in each client's registered memory.
pub const CLIENT_SLOTS: usize = 64;
/// The largest control frame accepted.
const MAX_FRAME: usize = 4096;

/// The exit status of a client whose connections to the server failed during the run (a
/// partition that outlasted tcp's retransmissions): the supervisor starts a new incarnation.
pub const EXIT_LOST_SERVER: u8 = 3;

/// Where client `id` lives: 127.0.0.1, or inside the fleet's own network namespace an address
/// of its own (127.1.x.y, on the namespace's loopback), so that a partition can cut exactly its
/// packets off, its fabric connections and its control connection alike.
pub fn client_host(inside_netns: bool, id: u32) -> std::net::Ipv4Addr {
    if inside_netns {
        // 250 clients per /24; ids are far fewer than 250 * 256.
        std::net::Ipv4Addr::new(127, 1, (id / 250) as u8, (id % 250 + 1) as u8)
    } else {
        std::net::Ipv4Addr::LOCALHOST
    }
}

/// A control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Client → server, first: who it is and where to write.
    Hello {
        /// The client id.
        id: u32,
        /// Which process of that id.
        incarnation: u32,
        /// Its fabric address.
        address: Vec<u8>,
        /// Its record ring, `RemoteRegion::to_bytes()`.
        region: [u8; RemoteRegion::ENCODED_LEN],
    },
    /// Client → server: its counts so far (`last` before a clean exit).
    Counts(Counts),
    /// Client → server: stop writing to me, I am leaving.
    Leaving,
    /// Server → client: nothing is in flight to you any more.
    Drained,
}

/// What a client found in its memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Records read and checked.
    pub checked: u64,
    /// Records for another client or incarnation.
    pub misdirected: u64,
    /// Records whose checksum stayed bad.
    pub corrupt: u64,
    /// The client's last report, sent before a clean exit.
    pub last: bool,
}

fn word(bytes: &[u8], at: usize) -> Option<u64> {
    bytes
        .get(at..at + 8)
        .and_then(|word| word.try_into().ok())
        .map(u64::from_le_bytes)
}

impl Message {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        match self {
            Self::Hello {
                id,
                incarnation,
                address,
                region,
            } => {
                out.push(1);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&incarnation.to_le_bytes());
                out.extend_from_slice(region);
                out.extend_from_slice(address);
            }
            Self::Counts(counts) => {
                out.push(2);
                out.extend_from_slice(&counts.checked.to_le_bytes());
                out.extend_from_slice(&counts.misdirected.to_le_bytes());
                out.extend_from_slice(&counts.corrupt.to_le_bytes());
                out.push(u8::from(counts.last));
            }
            Self::Leaving => out.push(3),
            Self::Drained => out.push(4),
        }
        out
    }

    fn decode(frame: &[u8]) -> Option<Self> {
        let (&tag, body) = frame.split_first()?;
        match tag {
            1 => {
                let id = u32::from_le_bytes(body.get(0..4)?.try_into().ok()?);
                let incarnation = u32::from_le_bytes(body.get(4..8)?.try_into().ok()?);
                let region = body
                    .get(8..8 + RemoteRegion::ENCODED_LEN)?
                    .try_into()
                    .ok()?;
                let address = body.get(8 + RemoteRegion::ENCODED_LEN..)?.to_vec();
                Some(Self::Hello {
                    id,
                    incarnation,
                    address,
                    region,
                })
            }
            2 => Some(Self::Counts(Counts {
                checked: word(body, 0)?,
                misdirected: word(body, 8)?,
                corrupt: word(body, 16)?,
                last: *body.get(24)? != 0,
            })),
            3 => Some(Self::Leaving),
            4 => Some(Self::Drained),
            _ => None,
        }
    }
}

/// Write one frame: a 4-byte little-endian length, then the message.
pub fn send(stream: &mut impl Write, message: &Message) -> std::io::Result<()> {
    let body = message.encode();
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    stream.write_all(&frame)?;
    stream.flush()
}

/// Reassembles frames from a stream read with a timeout.
#[derive(Debug, Default)]
pub struct Framer {
    buffer: Vec<u8>,
}

/// What one [`Framer::poll`] found.
#[derive(Debug)]
pub enum Polled {
    /// A whole message.
    Message(Message),
    /// Nothing yet (the read timed out or would block).
    Nothing,
    /// The peer closed the connection, or it failed, or sent garbage: the reason.
    Closed(String),
}

impl Framer {
    /// Read what is available (up to the stream's timeout) and return the next whole message.
    pub fn poll(&mut self, stream: &mut impl Read) -> Polled {
        loop {
            if let Some(polled) = self.take() {
                return polled;
            }
            let mut chunk = [0_u8; 1024];
            match stream.read(&mut chunk) {
                Ok(0) => return Polled::Closed("end of stream".into()),
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    return Polled::Nothing;
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) => return Polled::Closed(error.to_string()),
            }
        }
    }

    fn take(&mut self) -> Option<Polled> {
        let len = u32::from_le_bytes(self.buffer.get(0..4)?.try_into().ok()?) as usize;
        if len > MAX_FRAME {
            return Some(Polled::Closed(format!("a {len}-byte frame")));
        }
        let frame = self.buffer.get(4..4 + len)?.to_vec();
        self.buffer.drain(..4 + len);
        Some(match Message::decode(&frame) {
            Some(message) => Polled::Message(message),
            None => Polled::Closed("an undecodable frame".into()),
        })
    }
}

pub use testkit::demo::{decode_record, encode_record};

/// A small deterministic generator (xorshift64*).
#[derive(Debug, Clone)]
pub struct Random(pub u64);

impl Random {
    /// A number in `0..bound` (0 for a bound of 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound.max(1)
    }

    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        self.below(1 << 53) as f64 / (1_u64 << 53) as f64
    }
}

/// Nanoseconds since the Unix epoch: the clock the server's samples and the supervisor's fault
/// windows share (one machine).
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos() as u64)
        .unwrap_or(0)
}

/// The unit of [`Sample::latency`]: 16 ns, so that a `u32` holds writes that wait seconds for a
/// partition to heal.
pub const LATENCY_UNIT_NANOS: u128 = 16;

/// One post-to-completion sample, as the server writes it: 16 bytes, little endian.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// When the write was posted ([`unix_nanos`]).
    pub posted: u64,
    /// Post to completion, in units of [`LATENCY_UNIT_NANOS`] (saturated, at about 68 s).
    pub latency: u32,
    /// The target client's id.
    pub client: u32,
}

impl Sample {
    /// Post to completion, in nanoseconds.
    pub fn latency_nanos(&self) -> u64 {
        u64::from(self.latency) * LATENCY_UNIT_NANOS as u64
    }

    /// Its bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0; 16];
        out[0..8].copy_from_slice(&self.posted.to_le_bytes());
        out[8..12].copy_from_slice(&self.latency.to_le_bytes());
        out[12..16].copy_from_slice(&self.client.to_le_bytes());
        out
    }

    /// From [`to_bytes`](Self::to_bytes).
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(Self {
            posted: word(bytes, 0)?,
            latency: u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?),
            client: u32::from_le_bytes(bytes.get(12..16)?.try_into().ok()?),
        })
    }
}
