//! Multi-rail: one client, several NICs, one consistent incarnation.
//!
//! A host with several NICs (an AWS p5 has four EFA devices per GPU) drives one
//! [`LibfabricEndpoint`] per NIC, a *rail*. [`RailSet`] opens them together and makes a client's
//! rails one unit:
//!
//! - [`RailSet::pin`] pins every rail's cache at once ([`RailPinned`]);
//!   [`RailPinned::resolve`] turns a client's advertised rail addresses into a [`Peer`] on every
//!   rail ([`RailPeers`]), all or nothing; [`RailPinned::lease`] and [`RailSet::lease`] hold
//!   every rail's entry for the operations in flight ([`RailLease`]).
//! - [`RailSet::register`] registers one buffer in every rail's domain ([`RailRegion`]), whose
//!   [`RailRemoteRegion`] carries one key per rail.
//! - [`RailSet::write`] and [`RailSet::read`] cut a transfer into stripes across the rails (see
//!   [`MIN_STRIPE`]) and [`RailSet::poll_completions`] hands out one [`Completion`] for it once
//!   every stripe has completed.
//! - [`RailCaches`] is the same rail logic over caches of any [`AvBackend`](crate::av::AvBackend)
//!   (the model AV in tests): the code a `RailSet` runs, without endpoints.
//!
//! # Mapping
//!
//! A peer advertises `m` rail addresses (its [`RailSet::local_addresses`]); this set has `n`
//! rails. Local rail `i` talks to the peer's rail `i mod m`, address and memory key alike:
//!
//! - `m == n`: rail `i` to rail `i`, as aws-ofi-nccl and pplx-garden pair them;
//! - `m < n`: local rails `i`, `i + m`, ... share the peer's rail `i`;
//! - `m > n`: the peer's rails `n..m` are unused.
//!
//! No full mesh: each local rail's AV holds one entry per client.
//!
//! # Guarantees
//!
//! 1. **One transfer, one incarnation.** Every stripe of one transfer is posted to an address of
//!    the one address set its [`RailLease`] was resolved from, on every rail, and the entry it is
//!    posted to maps to that address until the stripe's completion has been read.
//! 2. **All or nothing.** A resolve or lease covers the whole address set of that call on every
//!    rail, or fails. A wrong number of addresses, or an address the rail using it would refuse
//!    (wrong length, all zero bytes), is an error before any rail is asked anything, and changes
//!    nothing. A failure on one rail (a full AV, a failed insert) queues a release of the client
//!    on every rail before the call returns, after whatever that call registered on each rail:
//!    it is never left half registered by a failure.
//! 3. **One incarnation per client.** An efa eviction of a client on one rail (a new incarnation
//!    took its slot: its process is gone) releases it on every rail, and a later resolve
//!    registers it anew on all of them.
//! 4. Everything each rail's [`AddressCache`](crate::cache::AddressCache) guarantees, per rail: no ABA,
//!    one remove per insert, no removal under a pin or a lease, the AV empty once every client is
//!    released and the set quiesced.
//!
//! # Ordering across the rails' caches
//!
//! Each rail's cache has its own writer and its own epochs; nothing orders one cache's writer
//! against another's. The argument therefore never relies on the caches agreeing with each other
//! at any moment, only on each cache's own guarantee 1 (a [`Peer`] maps to the address it was
//! resolved for while its pin lives, a [`Lease`] while it lives) and on what the rail set holds.
//!
//! **Guarantee 1.** A [`RailPeers`] is made only by [`RailPinned::resolve`], from one call's
//! address set `A`, and only once *every* rail has resolved: rail `i`'s peer comes from cache `i`
//! under pin `P_i`, for address `A[i mod m]`. All the `P_i` are taken before any resolve (a
//! `RailPinned` pins every rail when it is made) and are dropped together when it drops, and the
//! `RailPeers` borrows the `RailPinned`. So for the whole life of a `RailPeers` every `P_i` is
//! live, and by cache `i`'s guarantee 1 every peer `i` maps, in AV `i`, to `A[i mod m]`.
//! [`RailPinned::lease`] takes a [`Lease`] on each peer under its pin, which extends the same
//! guarantee past the pins, rail by rail, for as long as each lease lives; a striped transfer
//! moves rail `i`'s lease into rail `i`'s stripe, and the endpoint drops it only once that
//! stripe's completion has been read. So whatever the caches do meanwhile (release the client,
//! evict it, recycle its slot on one rail and park the new incarnation, run removals), no stripe
//! of the transfer can reach another incarnation: on efa a new incarnation on a slot enters its
//! AV only after the old entry's removal (cache guarantee 3), and that removal waits for `P_i`
//! and for rail `i`'s lease. Two incarnations in one transfer would need two address sets in one
//! `RailPeers`, and there is no way to build one: peers of different calls cannot be combined,
//! and a call that fails or must wait hands out no peer at all. (What an address set holds is
//! the caller's: the rail set takes one call's addresses as one advertisement, as the client sent
//! them.) Two threads resolving one client from two address sets at once (an old advertisement
//! and a new one) may leave its registrations mixed, each rail keeping the last address it was
//! given; each call's peers still come from its own set, and the next resolve of either set
//! re-registers whichever rails differ.
//!
//! **Guarantee 2.** Addresses are checked against every rail before the first rail's writer sees
//! a request. Past that, rails are resolved in order, rail 0 first; on the first error other than
//! [`DmaError::WouldBlock`], the calling thread queues a release of the client on every rail
//! before it returns. Each cache applies its requests in the order they reached its inbox, and
//! this thread's release follows its own resolve there, so on every rail the release is applied
//! after whatever registration this call made. A concurrent resolve of the same client by another
//! thread may register it again afterwards (a registration is never lost, only repeated); its
//! peers and leases are unaffected by the release, as a release never affects peers under a pin
//! or leases. `WouldBlock` is not a failure: every rail's registration stays queued (rails after
//! the waiting one are still asked), so a resolve under a later pin finds them all.
//!
//! **Guarantee 3.** A cache's writer, when an efa eviction drops a client from a live entry (a
//! new QKEY on its GID and QPN, advertised by another client), calls the rail set's hook for it
//! on the writer thread. The hook queues a release of the client in every other rail's inbox
//! without waiting (`try_send`, then that rail's doorbell): no lock, no queue of its own, no
//! wait on another writer (so two writers evicting at once cannot wait on each other). If a
//! rail's inbox is full, the evicting writer keeps the client, once, and hands it to the hook
//! again every round until every rail took it: bounded by the clients that writer held. So an
//! eviction is released on every rail as soon as their writers get to it, whether or not anyone
//! calls the rail set (10,000 evictions driven on one rail's cache directly keep nothing:
//! `tests/cache_bounds.rs`); a resolve racing the release may still hit the old registration on
//! another rail, and its peers are then valid for their pin (guarantee 1 is untouched), and the
//! next resolve after the release misses on every rail and registers the client anew, from the
//! addresses it is given then. `quiesce` quiesces every rail again if an eviction was released
//! during its first round, so after it no rail holds a client evicted on another.
//!
//! The test of the heart of this (`tests/rails_model.rs`) runs readers that resolve, lease and
//! check both rails' entries against one incarnation while another thread restarts the client
//! and recycles its slot on one rail, over the model AV with efa's rules.
//!
//! ```
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::time::Duration;
//! use dma_libfabric::{Configuration, RailSet};
//!
//! let configuration = Configuration { rma: true, ..Configuration::default() };
//! let server = RailSet::open(&configuration, &["127.0.0.1", "127.0.0.2"])?;
//! let client = RailSet::open(&configuration, &["127.0.0.1", "127.0.0.2"])?;
//! let memory = client.register(1 << 20)?;
//! let source = server.register(1 << 20)?;
//! source.write_bytes(0, &[7; 1 << 20])?;
//!
//! let addresses = client.local_addresses();
//! let addresses: Vec<&[u8]> = addresses.iter().map(Vec::as_slice).collect();
//! // tcp progresses manually: the target polls while the source posts and waits.
//! let stop = AtomicBool::new(false);
//! let done = std::thread::scope(|scope| {
//!     scope.spawn(|| {
//!         while !stop.load(Ordering::Relaxed) {
//!             client.progress();
//!         }
//!     });
//!     let done = server.lease(1, &addresses).and_then(|lease| {
//!         server.write(lease, source.segment(0, 1 << 20)?, memory.remote(), 42)?;
//!         server.wait_for(42, Duration::from_secs(10))
//!     });
//!     stop.store(true, Ordering::Relaxed);
//!     done
//! })?;
//! assert_eq!(Ok(()), done.result);
//! assert_eq!(2, server.bytes_per_rail().iter().filter(|bytes| **bytes > 0).count(), "striped");
//! # Ok::<(), dma_libfabric::DmaError>(())
//! ```

mod caches;
mod group;
mod region;
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
