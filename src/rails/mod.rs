//! Multi-rail: one client, several NICs, one consistent incarnation.
//!
//! A host with several NICs drives one [`LibfabricEndpoint`] per NIC, a *rail*; [`RailSet`]
//! drives them as one. What a user relies on (what the rail set does, the mapping of local rails
//! to a peer's, the four guarantees, and the argument for them across the rails' caches, with an
//! example) is on [`RailSet`], where a user reads it. The rooms: `group` (the rail logic over any
//! cache, [`RailCaches`]), `resolve` (a client on every rail), `region` (memory on every rail),
//! `stripe` (cutting a transfer), `shape` (the address checks both sides use), `set` (the
//! endpoints).

mod caches;
mod group;
mod region;
mod registering;
mod resolve;
mod set;
mod shape;
mod stripe;

pub use self::caches::RailCaches;
pub use self::region::{RailRegion, RailRemoteRegion, RailSegment};
#[allow(deprecated)] // the old name itself, re-exported where it was
pub use self::resolve::RailsPinned;
pub use self::resolve::{RailLease, RailPeers, RailPinned};
pub use self::set::RailSet;
pub use self::stripe::{MIN_STRIPE, STRIPE_ALIGN};

#[cfg(doc)]
use crate::{
    cache::Lease, cache::Peer, endpoint::Completion, endpoint::LibfabricEndpoint, error::DmaError,
};

/// The most rails a rail set has (and the most a peer may advertise). aws-ofi-nccl uses at most
/// 4; a p5 host has 4 EFA devices per GPU.
pub const MAX_RAILS: usize = 8;
