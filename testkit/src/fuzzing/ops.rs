//! The fuzz targets' structured inputs, decoded from raw bytes with `arbitrary`.

use arbitrary::Arbitrary;

/// How many operations of one input are run; the rest are ignored, so every input stays fast.
pub const MAX_OPS: usize = 64;
/// How many pins the harness holds at once at most; a `Pin` beyond it is ignored.
pub const MAX_PINS: usize = 4;
/// How many leases the harness holds at once at most; a lease beyond it is not taken.
pub const MAX_LEASES: usize = 4;
/// Clients are drawn from this many ids, so they collide and move between addresses often.
pub const CLIENTS: u64 = 6;

/// The input of the `address` target.
#[derive(Debug, Clone, Arbitrary)]
pub struct AddressInput {
    /// efa (true) or opaque.
    pub efa: bool,
    /// The provider's address length the bytes are checked against (its usual one when zero).
    pub address_len: u8,
    /// An `fi_info.addr_format` to classify.
    pub addr_format: u32,
    /// The advertised bytes.
    pub bytes: Vec<u8>,
}

/// An address as an operation names it. Each target turns it into bytes of its own format,
/// drawing the structured variants from a small space so that shared slots and recycled efa
/// QPNs are common.
#[derive(Debug, Clone, Arbitrary)]
pub enum Address {
    /// From a small space of fields: efa's GID (2), QPN (3) and QKEY (3); for sockaddrs, the
    /// family, port and host.
    Small {
        /// The GID, or the sockaddr's family.
        gid: u8,
        /// The QPN, or the port.
        qpn: u8,
        /// The QKEY, or the host and padding.
        qkey: u8,
    },
    /// Bytes of exactly the provider's length: the given ones, zero-padded or cut.
    Exact(Vec<u8>),
    /// Any bytes, of any length.
    Raw(Vec<u8>),
}

/// One step of an operation sequence.
#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// `pinned.resolve(client, address)` under pin `pin` (a temporary pin if it names none).
    Resolve {
        /// The client id (modulo [`CLIENTS`]).
        client: u8,
        /// What it advertises.
        address: Address,
        /// Which held pin to resolve under.
        pin: u8,
    },
    /// `pinned.try_resolve(client, address)`, followed by a `quiesce` so that the writer has
    /// applied it before the next step: single-threaded driving then has one order.
    TryResolve {
        /// The client id (modulo [`CLIENTS`]).
        client: u8,
        /// What it advertises.
        address: Address,
        /// Which held pin to resolve under.
        pin: u8,
    },
    /// `release(client)`, followed by a `quiesce` (see `TryResolve`).
    Release {
        /// The client id (modulo [`CLIENTS`]).
        client: u8,
    },
    /// Take a pin and hold it over later steps.
    Pin,
    /// Drop a held pin, and stop checking the peers resolved under it.
    Unpin {
        /// Which one.
        pin: u8,
    },
    /// `quiesce()`.
    Quiesce,
    /// `pinned.lease(peer)` on a peer the harness holds under a live pin, kept over later steps
    /// (at most [`MAX_LEASES`]): its entry must stay in the AV, mapping to its address, until
    /// the lease is dropped, whatever is released or unpinned meanwhile.
    Lease {
        /// Which held peer (modulo how many are held).
        peer: u8,
    },
    /// `lease.clone()` of a held lease: a second operation in flight on the same entry.
    CloneLease {
        /// Which held lease.
        lease: u8,
    },
    /// Drop a held lease: its entry's removal, if retired, may run.
    DropLease {
        /// Which held lease.
        lease: u8,
    },
    /// `cache.lease_within(client, address, ..)` with a short timeout, without a pin: it waits
    /// for a parked efa incarnation. Refused with `InvalidArgument` while the harness holds a
    /// pin. Followed by a `quiesce` when it times out, so the writer has applied it.
    LeaseDirect {
        /// The client id (modulo [`CLIENTS`]).
        client: u8,
        /// What it advertises.
        address: Address,
    },
    /// Make every `fi_av_remove` of the model AV fail (true) or succeed again (false): a failed
    /// removal keeps its entry in the AV, counted, and is retried. A no-op on a real AV.
    FailRemoves(bool),
}

/// The input of the `cache_ops` target.
#[derive(Debug, Clone, Arbitrary)]
pub struct CacheOps {
    /// efa addresses (true) or opaque ones.
    pub efa: bool,
    /// The AV's capacity: 1 to 8, or 4,096 when the top bit is set.
    pub capacity: u8,
    /// The steps.
    pub ops: Vec<Op>,
}

impl CacheOps {
    /// The capacity this input asks for.
    pub fn capacity(&self) -> usize {
        if 0 != self.capacity & 0x80 {
            4096
        } else {
            1 + usize::from(self.capacity % 8)
        }
    }
}

/// The input of the `tcp_av` target: steps against the one real endpoint of the process.
#[derive(Debug, Clone, Arbitrary)]
pub struct TcpOps {
    /// The steps.
    pub ops: Vec<Op>,
}

/// An efa address from the small space: GID `gid % 2`, QPN `qpn % 3`, QKEY `qkey % 3`; a fourth
/// of the QKEY space changes the pointer bytes instead, which is a new incarnation too.
pub fn efa_address(gid: u8, qpn: u8, qkey: u8) -> Vec<u8> {
    let mut bytes = vec![0_u8; dma_libfabric::EFA_ADDRESS_LEN];
    bytes[..16].fill(0xfe ^ (gid % 2));
    bytes[16..18].copy_from_slice(&u16::from(qpn % 3).to_ne_bytes());
    let qkey = qkey % 4;
    if 3 == qkey {
        bytes[20..24].copy_from_slice(&0x9bce_1061_u32.to_ne_bytes());
        bytes[24..32].fill(0x5a);
    } else {
        bytes[20..24].copy_from_slice(&(0x9bce_1061_u32 + u32::from(qkey)).to_ne_bytes());
    }
    bytes
}

/// An opaque address of `len` bytes from a small space of 12.
pub fn opaque_address(gid: u8, qpn: u8, qkey: u8, len: usize) -> Vec<u8> {
    let mut bytes = vec![0x11_u8; len];
    if let Some(first) = bytes.first_mut() {
        *first = gid % 2;
    }
    if let Some(second) = bytes.get_mut(1) {
        *second = qpn % 3;
    }
    if let Some(last) = bytes.last_mut() {
        *last = 0x40 | (qkey % 2);
    }
    bytes
}

/// A `sockaddr_in` from a small space: mostly well formed (AF_INET, 127.0.0.1, a port of 1 to
/// 5), with a bad family, port zero, host zero or garbage padding mixed in.
pub fn sockaddr(family: u8, port: u8, host: u8) -> Vec<u8> {
    let mut bytes = vec![0_u8; dma_libfabric::SOCKADDR_IN_LEN];
    let family: u16 = match family % 8 {
        0 => 0,
        1 => 10, // AF_INET6
        2 => 1,  // AF_UNIX
        _ => 2,  // AF_INET
    };
    bytes[0..2].copy_from_slice(&family.to_ne_bytes());
    bytes[2..4].copy_from_slice(&u16::from(port % 6).to_be_bytes());
    match host % 8 {
        0 => {}
        1 => bytes[4..8].copy_from_slice(&[127, 0, 0, 1]),
        2 => {
            bytes[4..8].copy_from_slice(&[127, 0, 0, 1]);
            bytes[8..16].fill(0xab);
        }
        _ => bytes[4..8].copy_from_slice(&[127, 0, 0, 1 + host % 3]),
    }
    bytes
}

/// `bytes`, zero-padded or cut to `len`.
pub fn exact(bytes: &[u8], len: usize) -> Vec<u8> {
    let mut exact = bytes.to_vec();
    exact.resize(len, 0);
    exact
}
