//! [`RailSet`]: one endpoint per NIC, and the calls that act on all of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::MAX_RAILS;
use super::group::{RailGroup, forward_to_group};
#[cfg(doc)]
use super::region::RailRegion;
use super::region::{RailRemoteRegion, RailSegment};
use super::resolve::RailLease;
#[cfg(doc)]
use super::resolve::RailPinned;
use super::stripe::{Transfers, plan};
use crate::configuration::Configuration;
use crate::endpoint::deadline::Deadline;
use crate::endpoint::engine::{JoinPart, Owner, Posted, Sink};
use crate::endpoint::wait::{MOST_SOURCES, Source};
use crate::endpoint::{
    Completion, LibfabricEndpoint, Operation, RemoteRegion, RmaCall, Segment, rma_calls,
};
use crate::error::DmaError;

/// How long a stripe's post retries backpressure before the transfer gives up on it, for
/// [`RailSet::write`] and [`RailSet::read`] (as for [`LibfabricEndpoint::write`]).
const POST_TIMEOUT: Duration = Duration::from_secs(1);

/// One [`LibfabricEndpoint`] per NIC, driven as one: a client is resolved and leased on every rail
/// at once, memory is registered on every rail, and large transfers are striped across the rails.
///
/// A host with several NICs (an AWS p5 has four EFA devices per GPU) drives one
/// [`LibfabricEndpoint`] per NIC, a *rail*. [`RailSet`] opens them together and makes a client's
/// rails one unit:
///
/// - [`RailSet::pin`] pins every rail's cache at once ([`RailPinned`]); [`RailPinned::resolve`]
///   turns a client's advertised rail addresses into a [`Peer`](crate::cache::Peer) on every rail
///   ([`RailPeers`](super::RailPeers)), all or nothing; [`RailPinned::lease`] and
///   [`RailSet::lease`] hold every rail's entry for the operations in flight ([`RailLease`]).
/// - [`RailSet::register`] registers one buffer in every rail's domain ([`RailRegion`]), whose
///   [`RailRemoteRegion`] carries one key per rail.
/// - [`RailSet::write`] and [`RailSet::read`] cut a transfer into stripes across the rails (see
///   [`MIN_STRIPE`](super::MIN_STRIPE)) and [`RailSet::poll_completions`] hands out one
///   [`Completion`] for it once every stripe has completed.
/// - [`RailCaches`](super::RailCaches) is the same rail logic over caches of any
///   [`AvBackend`](crate::av::AvBackend) (the model AV in tests): the code a `RailSet` runs,
///   without endpoints.
///
/// ```
/// use dma_libfabric::{Configuration, RailSet, SEAL_LEN};
///
/// let server = RailSet::open(&Configuration::default(), &["127.0.0.1", "127.0.0.2"])?;
/// let client = RailSet::open(&Configuration::default(), &["127.0.0.1", "127.0.0.2"])?;
/// let addresses = client.local_addresses(); // what a client sends its peers
/// let addresses: Vec<&[u8]> = addresses.iter().map(Vec::as_slice).collect();
///
/// let pinned = server.pin();
/// let peers = pinned.resolve(7, &addresses)?;
/// for rail in 0..server.len() {
///     let address = server.rail(rail).lookup(peers.rail(rail).fi_addr())?;
///     let provider_part = &addresses[rail][..addresses[rail].len() - SEAL_LEN];
///     assert_eq!(Some(provider_part), address.as_deref());
/// }
/// drop(pinned);
/// server.release(7);
/// server.quiesce();
/// assert!((0..server.len()).all(|rail| 0 == server.rail(rail).cache().stats().entries));
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
///
/// # Mapping
///
/// A peer advertises `m` rail addresses (its [`RailSet::local_addresses`]); this set has `n` rails.
/// Local rail `i` talks to the peer's rail `i mod m`, address and memory key alike:
///
/// - `m == n`: rail `i` to rail `i`, as aws-ofi-nccl and pplx-garden pair them;
/// - `m < n`: local rails `i`, `i + m`, ... share the peer's rail `i`;
/// - `m > n`: the peer's rails `n..m` are unused.
///
/// No full mesh: each local rail's AV holds one entry per client.
///
/// # Guarantees
///
/// 1. **One transfer, one incarnation.** Every stripe of one transfer is posted to an address of
///    the one address set its [`RailLease`] was resolved from, on every rail, and the entry it is
///    posted to maps to that address until the stripe's completion has been read.
/// 2. **All or nothing.** A resolve or lease covers the whole address set of that call on every
///    rail, or fails. A wrong number of addresses, or an address the rail using it would refuse
///    (wrong length, all zero bytes), is an error before any rail is asked anything, and changes
///    nothing. A failure on one rail (a full AV, a failed insert) queues a release of the client on
///    every rail before the call returns, after whatever that call registered on each rail: it is
///    never left half registered by a failure.
/// 3. **One incarnation per client.** An efa eviction of a client on one rail (a new incarnation
///    took its slot: its process is gone) releases it on every rail, and a later resolve registers
///    it anew on all of them.
/// 4. Everything each rail's [`AddressCache`](crate::cache::AddressCache) guarantees, per rail: no
///    ABA, one remove per insert, no removal under a pin or a lease, the AV empty once every client
///    is released and the set quiesced.
///
/// # Ordering across the rails' caches
///
/// Each rail's cache has its own writer and its own epochs; nothing orders one cache's writer
/// against another's. The argument therefore never relies on the caches agreeing with each other at
/// any moment, only on each cache's own guarantee 1 (a [`Peer`](crate::cache::Peer) maps to the
/// address it was resolved for while its pin lives, a [`Lease`](crate::cache::Lease) while it
/// lives) and on what the rail set holds.
///
/// **Guarantee 1.** A [`RailPeers`](super::RailPeers) is made only by [`RailPinned::resolve`],
/// from one call's address set `A`, and only once *every* rail has resolved: rail `i`'s peer comes
/// from cache `i` under pin `P_i`, for address `A[i mod m]`. All the `P_i` are taken before any
/// resolve (a `RailPinned` pins every rail when it is made) and are dropped together when it
/// drops, and the `RailPeers` borrows the `RailPinned`. So for the whole life of a `RailPeers`
/// every `P_i` is live, and by cache `i`'s guarantee 1 every peer `i` maps, in AV `i`, to
/// `A[i mod m]`. [`RailPinned::lease`] takes a [`Lease`](crate::cache::Lease) on each peer under its pin,
/// which extends the same guarantee past the pins, rail by rail, for as long as each lease lives; a
/// striped transfer moves rail `i`'s lease into rail `i`'s stripe, and the endpoint drops it only
/// once that stripe's completion has been read. So whatever the caches do meanwhile (release the
/// client, evict it, recycle its slot on one rail and park the new incarnation, run removals), no
/// stripe of the transfer can reach another incarnation: on efa a new incarnation on a slot enters
/// its AV only after the old entry's removal (cache guarantee 3), and that removal waits for `P_i`
/// and for rail `i`'s lease. Two incarnations in one transfer would need two address sets in one
/// `RailPeers`, and there is no way to build one: peers of different calls cannot be combined, and
/// a call that fails or must wait hands out no peer at all. (What an address set holds is the
/// caller's: the rail set takes one call's addresses as one advertisement, as the client sent
/// them.) Two threads resolving one client from two address sets at once (an old advertisement and
/// a new one) may leave its registrations mixed, each rail keeping the last address it was given;
/// each call's peers still come from its own set, and the next resolve of either set re-registers
/// whichever rails differ.
///
/// **Guarantee 2.** Addresses are checked against every rail before the first rail's writer sees a
/// request. Past that, rails are resolved in order, rail 0 first; on the first error other than
/// [`DmaError::WouldBlock`], the calling thread queues a release of the client on every rail before
/// it returns. Each cache applies its requests in the order they reached its inbox, and this
/// thread's release follows its own resolve there, so on every rail the release is applied after
/// whatever registration this call made. A concurrent resolve of the same client by another thread
/// may register it again afterwards (a registration is never lost, only repeated); its peers and
/// leases are unaffected by the release, as a release never affects peers under a pin or leases.
/// `WouldBlock` is not a failure: every rail's registration stays queued (rails after the waiting
/// one are still asked), so a resolve under a later pin finds them all.
///
/// **Guarantee 3.** A cache's writer, when an efa eviction drops a client from a live entry (a new
/// QKEY on its GID and QPN, advertised by another client), calls the rail set's hook for it on the
/// writer thread. The hook queues a release of the client in every other rail's inbox without
/// waiting (`try_send`, then that rail's doorbell): no lock, no queue of its own, no wait on
/// another writer (so two writers evicting at once cannot wait on each other). If a rail's inbox is
/// full, the evicting writer keeps the client, once, and hands it to the hook again every round
/// until every rail took it: bounded by the clients that writer held. So an eviction is released on
/// every rail as soon as their writers get to it, whether or not anyone calls the rail set (10,000
/// evictions driven on one rail's cache directly keep nothing: `tests/cache_bounds.rs`); a resolve
/// racing the release may still hit the old registration on another rail, and its peers are then
/// valid for their pin (guarantee 1 is untouched), and the next resolve after the release misses on
/// every rail and registers the client anew, from the addresses it is given then. `quiesce`
/// quiesces every rail again if an eviction was released during its first round, so after it no
/// rail holds a client evicted on another.
///
/// The test of the heart of this (`tests/rails_model.rs`) runs readers that resolve, lease and
/// check both rails' entries against one incarnation while another thread restarts the client and
/// recycles its slot on one rail, over the model AV with efa's rules.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::time::Duration;
/// use dma_libfabric::{Configuration, RailSet};
///
/// let configuration = Configuration { rma: true, ..Configuration::default() };
/// let server = RailSet::open(&configuration, &["127.0.0.1", "127.0.0.2"])?;
/// let client = RailSet::open(&configuration, &["127.0.0.1", "127.0.0.2"])?;
/// let memory = client.register(1 << 20)?;
/// let source = server.register(1 << 20)?;
/// source.write_bytes(0, &[7; 1 << 20])?;
///
/// let addresses = client.local_addresses();
/// let addresses: Vec<&[u8]> = addresses.iter().map(Vec::as_slice).collect();
/// // tcp progresses manually: the target polls while the source posts and waits.
/// let stop = AtomicBool::new(false);
/// let done = std::thread::scope(|scope| {
///     scope.spawn(|| {
///         while !stop.load(Ordering::Relaxed) {
///             client.progress();
///         }
///     });
///     let done = server.lease(1, &addresses).and_then(|lease| {
///         server.write(lease, source.segment(0, 1 << 20)?, memory.remote(), 42)?;
///         server.wait_for(42, Duration::from_secs(10))
///     });
///     stop.store(true, Ordering::Relaxed);
///     done
/// })?;
/// assert_eq!(Ok(()), done.result);
/// assert_eq!(2, server.bytes_per_rail().iter().filter(|bytes| **bytes > 0).count(), "striped");
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
pub struct RailSet {
    pub(super) group: RailGroup<LibfabricEndpoint>,
    addresses: Vec<Vec<u8>>,
    /// Shared with the slots of the stripes in flight, which hand their completions to it.
    transfers: Arc<Transfers>,
    /// Every rail's wait descriptors, or none if some rail polls (then a wait polls).
    sources: Vec<Source>,
    /// Bytes posted on each rail.
    bytes: [AtomicU64; MAX_RAILS],
}

impl std::fmt::Debug for RailSet {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RailSet")
            .field("rails", &self.group.len())
            .field("transfers_in_flight", &self.transfers.in_flight())
            .finish_non_exhaustive()
    }
}

impl RailSet {
    /// Open one endpoint per node of `nodes` with `configuration`, rail 0 first: on this machine,
    /// tcp rails bound to `127.0.0.1`, `127.0.0.2`, and so on; on an efa host, one per device.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for no nodes or more than [`MAX_RAILS`](super::MAX_RAILS);
    /// whatever [`LibfabricEndpoint::open`] or `local_address` answers for a node (the rails
    /// opened before it are closed).
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError, RailSet};
    ///
    /// let rails = RailSet::open(&Configuration::default(), &["127.0.0.1", "127.0.0.2"])?;
    /// assert_eq!(2, rails.len());
    /// assert!(matches!(RailSet::open(&Configuration::default(), &[]), Err(DmaError::InvalidArgument(_))));
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn open(configuration: &Configuration, nodes: &[&str]) -> Result<Self, DmaError> {
        if nodes.is_empty() || nodes.len() > MAX_RAILS {
            return Err(DmaError::InvalidArgument(format!(
                "a rail set has 1 to {MAX_RAILS} rails, not {}",
                nodes.len()
            )));
        }
        let mut rails = Vec::with_capacity(nodes.len());
        let mut addresses = Vec::with_capacity(nodes.len());
        for node in nodes {
            let rail = LibfabricEndpoint::open(configuration, Some(node))?;
            addresses.push(rail.local_address()?);
            rails.push(rail);
        }
        const _: () = assert!(MAX_RAILS <= MOST_SOURCES, "a wait sleeps on every rail");
        let mut sources: Vec<Source> = rails
            .iter()
            .flat_map(|rail| rail.wait_sources().iter().copied())
            .collect();
        if sources.len() != rails.len() {
            sources.clear();
        }
        Ok(Self {
            group: RailGroup::new(rails)?,
            addresses,
            transfers: Arc::default(),
            sources,
            bytes: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }

    forward_to_group! {
        rail: LibfabricEndpoint;
        /// Rail `rail`'s endpoint: for sends and receives on it. RMA on a rail goes through the set
        /// ([`write`](Self::write), [`read`](Self::read)), whose
        /// [`poll_completions`](Self::poll_completions) reads every rail's completions.
        ///
        /// # Panics
        /// If `rail >= len()`, as slice indexing does.
        fn rail;
        /// A [`RailLease`] on `client` on every rail, without a pin: registers it on every rail (on
        /// a miss, through each rail's writer) and leases it there. Blocks as
        /// [`AddressCache::lease`](crate::cache::AddressCache::lease) does, rail by rail, holding
        /// no lease of its own while a rail waits; all or nothing.
        ///
        /// # Errors
        /// As [`RailPinned::resolve`], except `WouldBlock`; and as
        /// [`AddressCache::lease`](crate::cache::AddressCache::lease) for each rail (refused at
        /// once under the calling thread's own pin; [`DmaError::OutOfPatience`] once rail 0's
        /// cache's patience has passed, in all). On an error `client` is released on every rail
        /// (bad input aside, which changes nothing).
        ///
        /// ```
        /// use dma_libfabric::{Configuration, RailSet, SEAL_LEN};
        ///
        /// let server = RailSet::open(&Configuration::default(), &["127.0.0.1", "127.0.0.2"])?;
        /// let client = RailSet::open(&Configuration::default(), &["127.0.0.1", "127.0.0.2"])?;
        /// let addresses = client.local_addresses();
        /// let addresses: Vec<&[u8]> = addresses.iter().map(Vec::as_slice).collect();
        /// let lease = server.lease(1, &addresses)?;
        /// server.release(1);
        /// server.quiesce();
        /// // Released, but the lease holds both rails' entries in their AVs until it is dropped.
        /// let provider_part = &addresses[1][..addresses[1].len() - SEAL_LEN];
        /// assert_eq!(Some(provider_part), server.rail(1).lookup(lease.rail(1).fi_addr())?.as_deref());
        /// assert_eq!(1, server.rail(1).cache().stats().removals_awaiting_leases);
        /// drop(lease);
        /// server.quiesce();
        /// assert_eq!(0, server.rail(1).cache().stats().entries);
        /// # Ok::<(), dma_libfabric::DmaError>(())
        /// ```
        fn lease;
    }

    /// Every rail's address, rail 0 first: what a client sends its peers, which give it to
    /// [`RailPinned::resolve`] or [`lease`](Self::lease).
    pub fn local_addresses(&self) -> Vec<Vec<u8>> {
        self.addresses.clone()
    }

    rma_calls! {
        lease: RailLease<'_>, local: RailSegment<'_>, remote: RailRemoteRegion,
        patience: POST_TIMEOUT;
        /// `fi_write` of `source` into the peer's `target`, striped across the rails (see
        /// [`MIN_STRIPE`](super::MIN_STRIPE)): rail `i`'s stripe goes to the peer's rail `i mod
        /// target.len()` under rail `i`'s lease, which it holds until its completion has been read.
        /// [`poll_completions`](Self::poll_completions) gives one [`Completion`] with `id` once
        /// every stripe has completed, carrying the first stripe error if any.
        ///
        /// # Errors
        /// Nothing is posted on an error: [`DmaError::InvalidArgument`] for a lease of another rail
        /// count, a target whose rail count is not the lease's peer's, a source longer than the
        /// target, or a segment of another rail set; otherwise as
        /// [`LibfabricEndpoint::write_within`] for the first stripe. Once a stripe is posted the
        /// call returns `Ok`: a later stripe that cannot be posted (backpressure past the timeout,
        /// a failed `fi_write`) is the transfer's completion error, handed out once the posted
        /// stripes have completed.
        ///
        /// `src/rails/mod.rs` has an example.
        fn write;
        /// [`write`](Self::write), each stripe's post retrying backpressure for at most `timeout`
        /// (any `Duration`, as for [`LibfabricEndpoint::write_within`]).
        ///
        /// # Errors
        /// As [`write`](Self::write).
        fn write_within;
        /// `fi_read` of the peer's `source` into `destination`, striped as [`write`](Self::write).
        ///
        /// # Errors
        /// As [`write`](Self::write).
        fn read;
        /// [`read`](Self::read), each stripe's post retrying backpressure for at most `timeout`.
        ///
        /// # Errors
        /// As [`write`](Self::write).
        fn read_within;
    }

    /// The one path of [`write_within`](Self::write_within) and [`read_within`](Self::read_within)
    /// (see `rma_calls!`): the transfer cut into stripes, each posted on its rail.
    fn transfer(
        &self,
        call: RmaCall<RailLease<'_>, RailSegment<'_>, RailRemoteRegion>,
    ) -> Result<(), DmaError> {
        let (lease, local, remote) = (call.lease, call.local, call.remote);
        let rails = self.len();
        check_shapes(&lease, &local, &remote, rails)?;
        let stripes = plan(local.len(), rails, self.transfers.next_rail(rails));
        // Every stripe's pieces first, so a bad one posts nothing.
        let mut posts: Vec<(usize, Segment<'_>, RemoteRegion)> = Vec::with_capacity(stripes.len());
        for stripe in &stripes {
            posts.push((
                stripe.rail,
                local.on_rail(stripe.rail, stripe.offset, stripe.len)?,
                remote
                    .rail(stripe.rail % remote.len())
                    .slice(stripe.offset as u64, stripe.len as u64)?,
            ));
        }
        let mut leases: Vec<_> = lease.leases.into_iter().map(Some).collect();
        let join = self
            .transfers
            .begin(call.id, call.operation, local.len(), stripes.len());
        let sink = Sink::Owner(Arc::clone(&self.transfers) as Owner);
        for (posted, (rail, segment, target)) in posts.into_iter().enumerate() {
            let endpoint = self.group.rail(rail);
            let len = segment.len();
            let unposted = stripes.len() - posted;
            let part = JoinPart {
                join: Arc::clone(&join),
                unposted,
                first: 0 == posted,
            };
            let result = match leases.get_mut(rail).and_then(Option::take) {
                Some(lease) => match call.operation {
                    operation @ (Operation::Write | Operation::Read) => {
                        let stripe = RmaCall {
                            operation,
                            lease,
                            local: segment,
                            remote: target,
                            id: call.id,
                            timeout: call.timeout,
                        };
                        endpoint.post_for(stripe, sink.clone(), Some(part))
                    }
                    Operation::Send | Operation::Receive => Err(DmaError::InvalidArgument(
                        "a rail set stripes writes and reads, not messages".into(),
                    )),
                },
                None => Err(DmaError::InvalidArgument(format!(
                    "no lease for rail {rail}"
                ))),
            };
            match result {
                Ok(Posted::Posted) => {
                    if let Some(bytes) = self.bytes.get(rail) {
                        bytes.fetch_add(len as u64, Ordering::Relaxed);
                    }
                }
                // The engine counted the stripes not posted into the join.
                Ok(Posted::Abandoned) => return Ok(()),
                Err(error) if 0 == posted => {
                    self.transfers.abandon(stripes.len());
                    return Err(error);
                }
                Err(error) => {
                    self.transfers.give_up(&join, unposted, error);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Read every rail's completions and move into `out` the completion of each transfer whose
    /// last stripe has completed (one per transfer, with the `id` it was posted with), and those
    /// of operations posted on a rail's endpoint directly. Any thread may call it; each
    /// completion is handed out once. A stripe's completion reaches its transfer whichever thread
    /// reads the rail's queue: this call, a rail's own `poll_completions` or `progress`, another
    /// thread's [`wait_for`](Self::wait_for). Returns how many it added.
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::poll_completions`].
    pub fn poll_completions(&self, out: &mut Vec<Completion>) -> Result<usize, DmaError> {
        let mut added = 0;
        for rail in self.group.rails() {
            added += rail.poll_completions(out)?;
        }
        Ok(added + self.transfers.take_ready(out))
    }

    /// Wait up to `timeout` for the completion of the transfer posted with `id`, driving
    /// progress on every rail and sleeping on their queues between reads (as
    /// [`LibfabricEndpoint::wait_for`]). It takes only that transfer's completion: every other
    /// stays for [`poll_completions`](Self::poll_completions) or another waiter, also while this
    /// one waits. An operation posted on a rail directly is waited for on that rail
    /// ([`LibfabricEndpoint::wait_for`]). A completion an earlier read already set aside is
    /// answered at once, without driving progress. Any `Duration` is accepted (`Duration::MAX`
    /// waits until the completion arrives).
    ///
    /// # Errors
    /// [`DmaError::WouldBlock`] when it has not completed within `timeout` (it is still in
    /// flight).
    pub fn wait_for(&self, id: u64, timeout: Duration) -> Result<Completion, DmaError> {
        // A pass reads every rail's queues: not for a completion that is already here.
        if let Some(done) = self.transfers.take(id) {
            return Ok(done);
        }
        self.transfers
            .waiter
            .wait(&self.sources, Deadline::after(timeout), || {
                self.progress();
                self.transfers.take(id)
            })
            .ok_or(DmaError::WouldBlock)
    }

    /// Drive progress on every rail: a tcp target progresses the transfers into its memory only
    /// while it calls libfabric.
    pub fn progress(&self) {
        for rail in self.group.rails() {
            rail.progress();
        }
    }

    /// Bytes posted on each rail so far, rail 0 first.
    pub fn bytes_per_rail(&self) -> Vec<u64> {
        self.bytes[..self.len()]
            .iter()
            .map(|bytes| bytes.load(Ordering::Relaxed))
            .collect()
    }

    /// How many transfers were cut into more than one stripe so far.
    pub fn striped_transfers(&self) -> u64 {
        self.transfers.striped()
    }

    /// How many transfers are in flight: posted, completion not yet handed out.
    pub fn transfers_in_flight(&self) -> usize {
        self.transfers.in_flight()
    }
}

/// Refuse a transfer whose lease, local memory and remote region do not fit each other or the
/// `rails` of the set, before anything is planned or posted.
fn check_shapes(
    lease: &RailLease<'_>,
    local: &RailSegment<'_>,
    remote: &RailRemoteRegion,
    rails: usize,
) -> Result<(), DmaError> {
    if lease.len() != rails || local.rails() != rails {
        return Err(DmaError::InvalidArgument(format!(
            "a lease of {} rails and a segment of {} rails, for a rail set of {rails}",
            lease.len(),
            local.rails()
        )));
    }
    if remote.len() != lease.remote_rails() {
        return Err(DmaError::InvalidArgument(format!(
            "the remote region names {} rails; the peer advertised {}",
            remote.len(),
            lease.remote_rails()
        )));
    }
    if local.len() as u64 > remote.region_len() {
        return Err(DmaError::InvalidArgument(format!(
            "{} local bytes do not fit the {}-byte remote region",
            local.len(),
            remote.region_len()
        )));
    }
    Ok(())
}
