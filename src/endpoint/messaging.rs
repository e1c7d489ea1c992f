//! The message face: every call that sends or receives a message, with its guarantees in its
//! docs: copied sends (to a [`Peer`], or `unsafe` to a raw `fi_addr_t`), receives into the
//! endpoint's own buffers (`receive`, `receive_from`), messages of registered memory
//! (`send_from`, `receive_into`, through the engine), and `progress`. What they call is below
//! them: `sends` (the copy slab), `receiving` (reading the receive queue), `senders` (who sent),
//! `rma::messages` (registered messages), `credits::flow` (the credit protocol).
//!
//! How a send is bounded, reported and drained is on
//! [`send_within`](LibfabricEndpoint::send_within) ("Bounded, and never lost without an error");
//! that every wait is bounded, on [`LibfabricEndpoint`] ("Nothing waits for ever"). A send's slot
//! is `sends`'s, its sender's bookkeeping `senders`'s, the sleep between attempts `wait`'s.

use super::credits::flow;
#[cfg(doc)]
use super::engine::Operation;
use super::engine::Sink;
use super::memory::Segment;
use super::receiving;
use super::rma::messages;
use super::senders::Received;
use crate::cache::Lease;
use std::time::Duration;

use super::deadline::Deadline;
use super::{LibfabricEndpoint, sends};
#[cfg(doc)] // for the docs' links
use crate::av::FabricAv;
use crate::cache::Peer;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

impl LibfabricEndpoint {
    /// How long dropping an endpoint drives progress for its sends in flight before it counts
    /// them discarded ([`discarded_sends`](Self::discarded_sends)): a peer that has stopped
    /// reading never completes them, and a drop must not wait for it.
    pub const SEND_DRAIN_PATIENCE: Duration = Duration::from_millis(100);

    /// Send a copy of `message` to `peer`, retrying while every send slot is in flight or the
    /// provider asks for progress, for at most a second. See [`send_within`](Self::send_within)
    /// to choose the bound, and for how sends are bounded and their failures reported.
    ///
    /// `peer` borrows the [`Pinned`](crate::cache::Pinned) it was resolved under, so it cannot be
    /// used once that pin is dropped, when its index may have been removed and handed to another
    /// peer:
    ///
    /// ```compile_fail,E0505
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let server = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// let client = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// let pinned = server.cache().pin();
    /// let peer = pinned.resolve(1, &client.local_address()?)?;
    /// drop(pinned);
    /// server.cache().release(1);
    /// server.send(peer, b"stale")?; // error: `pinned` was dropped while `peer` borrowed it
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// Nor does a raw index stand in for a peer:
    ///
    /// ```compile_fail,E0308
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let server = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// server.send(5, b"x")?; // error: expected `Peer<'_>`, found integer
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// As `send_within`.
    pub fn send(&self, peer: Peer<'_>, message: &[u8]) -> Result<(), DmaError> {
        self.send_within(peer, message, Duration::from_secs(1))
    }

    /// Send a copy of `message` to `peer` (counted until its completion: below), retrying while
    /// every send slot is in flight or the provider asks for progress, for at most `timeout` (a
    /// peer that has stopped never completes, and a posting thread should not wait long for it).
    /// Any `Duration` is accepted: one too long for a deadline (`Duration::MAX`) retries until
    /// the provider takes the message.
    ///
    /// # Bounded, and never lost without an error
    ///
    /// A send copies the message into a slot of the endpoint's own and posts it with `fi_send`,
    /// asking for a completion; it is counted until that completion has been read. At most
    /// [`Description::max_sends_in_flight`](super::Description::max_sends_in_flight) (the transmit
    /// queue's depth, `Configuration::tx_size`) are in flight: past it a send answers
    /// [`DmaError::WouldBlock`] and posts nothing, so a peer that stops reading holds at most that
    /// many, whatever the sender does. One peer holds at most its budget of operations
    /// of every kind ([`Configuration::max_operations_per_peer`](crate::configuration::Configuration::max_operations_per_peer),
    /// 32 by default), so a stopped peer does not block the others. On tcp every transmit asks for
    /// `FI_TRANSMIT_COMPLETE` by default, which tcp completes when the peer's provider
    /// acknowledges it: a send sitting in a socket is still in flight
    /// ([`Configuration::send_completion`](crate::configuration::Configuration::send_completion):
    /// [`SendCompletion::Local`](crate::configuration::SendCompletion::Local) completes it once in
    /// the socket, faster, at the price its docs state).
    ///
    /// The slots are one zeroed allocation made at `open`, which the kernel backs only as slots
    /// are used: as many as the transmit queue and its completion queue hold (at most
    /// [`MAX_SENDS`](super::MAX_SENDS)), each of
    /// [`Description::max_send_size`](super::Description::max_send_size) bytes (at most
    /// [`MAX_SEND_COPY`](super::MAX_SEND_COPY)). So the memory the message path holds for sends,
    /// in this crate and in the provider, is bounded whatever the peer does: a peer that stops
    /// reading stops completions, and sends past the count are refused.
    ///
    /// A send whose completion reports an error reaches the caller by the per-peer route: it is
    /// counted ([`failed_sends`](LibfabricEndpoint::failed_sends)) and logged at `warn` with its
    /// peer's `fi_addr_t`, and when the error says the peer is gone (refused, reset, not connected,
    /// unreachable) the peer is marked, so every later send to it answers
    /// [`DmaError::PeerUnreachable`] at once, without posting, until the peer is resolved anew (its
    /// entry released and inserted again). Dropping an endpoint with sends in flight drives
    /// progress for at most [`SEND_DRAIN_PATIENCE`](LibfabricEndpoint::SEND_DRAIN_PATIENCE), then
    /// logs how many it discarded at `warn` and adds them to
    /// [`discarded_sends`](LibfabricEndpoint::discarded_sends).
    ///
    /// A send's slot names its peer by index only: it holds no lease (a copying send borrows a pin,
    /// not an entry), so the entry may be removed while the send is in flight. tcp;ofi_rxm finishes
    /// such a send (each connection holds its own reference to the peer); efa RDM frees every
    /// pending operation of a removed peer without a completion (read in the 2.6.0 source;
    /// libfabric PR #11587 fixed crashes there), which would keep its slot counted for good. Send
    /// from registered memory against a lease ([`send_from`](LibfabricEndpoint::send_from)) where
    /// that matters. [`inject_within`](LibfabricEndpoint::inject_within) is the opt-in without a
    /// slot or a completion, for messages of at most the inject size, that gives up this section.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when `peer` was resolved by another endpoint's cache, or the
    /// message exceeds [`Description::max_send_size`](super::Description::max_send_size);
    /// [`DmaError::PeerUnreachable`] when the provider has reported `peer` gone (an earlier
    /// send's completion); [`DmaError::WouldBlock`] when every send slot was still in flight, or
    /// the provider still asked to retry, after `timeout`; [`DmaError::Fabric`] for any other
    /// failure. Nothing is posted on an error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint};
    ///
    /// let one = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// let two = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// let pinned = two.cache().pin();
    /// let peer_of_two = pinned.resolve(1, &one.local_address()?)?;
    /// assert!(matches!(
    ///     one.send_within(peer_of_two, b"x", Duration::from_millis(10)),
    ///     Err(DmaError::InvalidArgument(_)) // resolved by `two`'s cache, not `one`'s
    /// ));
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn send_within(
        &self,
        peer: Peer<'_>,
        message: &[u8],
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.check_peer(peer)?;
        // SAFETY: `peer` came from this endpoint's cache (checked above) under a pin that is
        // still alive (it borrows it), so its index is in this AV, mapped to the peer it was
        // resolved for, and not removed before the pin drops, which is after this call.
        unsafe { self.send_raw_within(peer.fi_addr(), message, timeout) }
            .map_err(|error| error.for_client(peer.client()))
    }

    /// One attempt to send a copy of `message` to `peer`: [`DmaError::WouldBlock`] when every
    /// send slot is in flight or the provider asks to retry after progress.
    ///
    /// # Errors
    /// As [`send_within`](Self::send_within), without the retrying.
    pub fn try_send(&self, peer: Peer<'_>, message: &[u8]) -> Result<(), DmaError> {
        self.check_peer(peer)?;
        // SAFETY: as in `send_within`.
        unsafe { self.try_send_raw(peer.fi_addr(), message) }
            .map_err(|error| error.for_client(peer.client()))
    }

    /// Send a copy of `message`, at most
    /// [`Description::inject_size`](super::Description::inject_size) bytes (64 on tcp;ofi_rxm,
    /// within [`max_send_size`](super::Description::max_send_size)), to `peer` with `fi_inject`,
    /// retrying while the provider asks for progress (a connection being set up, its queue full)
    /// for at most `timeout` (any `Duration`, as [`send_within`](Self::send_within)). Opt-in:
    /// [`send`](Self::send) never injects.
    ///
    /// # Not counted, and a failure is not reported
    ///
    /// The provider copies the message before this returns and gives no completion for it: no
    /// send slot is taken ([`sends_in_flight`](Self::sends_in_flight) does not count it), nor
    /// any of the peer's budget ([`peer_operations_in_flight`](Self::peer_operations_in_flight));
    /// a credited endpoint takes the peer's credit for it as for a send. So there is no
    /// completion to read, and on tcp no acknowledgement from the peer's provider (an inject
    /// asks for no `FI_TRANSMIT_COMPLETE`): one-way latency at 64 B is about half of `send`'s
    /// (docs/benchmarks.md). What that gives up against `send_within`'s "Bounded, and never lost
    /// without an error":
    ///
    /// - a message that does not arrive (its peer killed, its connection lost after this
    ///   returned) is not reported: libfabric's tcp provider (1.17 and 2.x) logs "inject
    ///   transfer failed" at its own warn level and nothing reaches the completion queue; it is
    ///   not in [`failed_sends`](Self::failed_sends);
    /// - nor does it mark its peer unreachable: injects to a peer that died answer `Ok` until
    ///   the provider has seen the connection go, then [`DmaError::WouldBlock`] (rxm connects
    ///   again, and the refusal is reported nowhere). A send posted after that meets the same
    ///   refused connection, not an error completion, so a peer that died while only injects
    ///   went to it may never answer [`DmaError::PeerUnreachable`];
    /// - injects to a peer that stops reading are bounded by its credit window (a credited
    ///   endpoint) and the provider's own queue and socket (`WouldBlock`), not by the send slots.
    ///
    /// A peer already marked unreachable (by an earlier send's failure) is refused at once, as
    /// by `send`. Use `send` where a message must not be lost without an error.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when `peer` was resolved by another endpoint's cache, or the
    /// message exceeds the inject size (or `max_send_size`); [`DmaError::PeerUnreachable`] when
    /// the peer is marked, or the provider refused the post saying the peer is gone;
    /// [`DmaError::WouldBlock`] when the peer's credit or the provider still pushed back after
    /// `timeout`; [`DmaError::Fabric`] for any other refusal (`-FI_ENOSYS` from a provider
    /// without a tagged inject). Nothing is posted on an error.
    pub fn inject_within(
        &self,
        peer: Peer<'_>,
        message: &[u8],
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.check_peer(peer)?;
        self.retry_until(Deadline::after(timeout), || {
            // SAFETY: `peer` came from this endpoint's cache (checked above) under a pin that is
            // still alive (it borrows it), so its index is a live entry of this AV for the call.
            unsafe { sends::try_inject(self, peer.fi_addr(), message) }
        })
        .map_err(|error| error.for_client(peer.client()))
    }

    /// One attempt of [`inject_within`](Self::inject_within): [`DmaError::WouldBlock`] when the
    /// peer's credit or the provider pushes back.
    ///
    /// # Errors
    /// As [`inject_within`](Self::inject_within), without the retrying.
    pub fn try_inject(&self, peer: Peer<'_>, message: &[u8]) -> Result<(), DmaError> {
        self.check_peer(peer)?;
        // SAFETY: as in `inject_within`.
        unsafe { sends::try_inject(self, peer.fi_addr(), message) }
            .map_err(|error| error.for_client(peer.client()))
    }

    /// [`send`](Self::send) to a raw `fi_addr_t`, for code that inserts into
    /// [`address_vector`](Self::address_vector) itself.
    ///
    /// # Safety
    /// `fi_addr` was returned by `fi_av_insert` on this endpoint's address vector (directly, or
    /// through a [`FabricAv`] on it) and is not removed until this call has returned: an index
    /// the AV never handed out, or one already removed, makes libfabric dereference a cleared or
    /// missing entry (a crash on tcp;ofi_rxm and efa). It must also still name the peer meant:
    /// `FI_AV_TABLE` hands a removed index to the next insert at once, and a send to it goes to
    /// that newcomer. An index from this endpoint's own cache meets this only while the
    /// [`Pinned`](crate::cache::Pinned) it was resolved under lives; use [`send`](Self::send) for those.
    ///
    /// # Errors
    /// As [`send_within`](Self::send_within), except that no peer is checked.
    pub unsafe fn send_raw(&self, fi_addr: sys::fi_addr_t, message: &[u8]) -> Result<(), DmaError> {
        // SAFETY: the caller's promise is this function's.
        unsafe { self.send_raw_within(fi_addr, message, Duration::from_secs(1)) }
    }

    /// [`send_within`](Self::send_within) to a raw `fi_addr_t`.
    ///
    /// # Safety
    /// As [`send_raw`](Self::send_raw).
    ///
    /// # Errors
    /// As [`send_within`](Self::send_within), except that no peer is checked.
    pub unsafe fn send_raw_within(
        &self,
        fi_addr: sys::fi_addr_t,
        message: &[u8],
        timeout: Duration,
    ) -> Result<(), DmaError> {
        // SAFETY: the caller's promise is this function's.
        self.retry_until(Deadline::after(timeout), || unsafe {
            self.try_send_raw(fi_addr, message)
        })
    }

    /// [`try_send`](Self::try_send) to a raw `fi_addr_t`.
    ///
    /// # Safety
    /// As [`send_raw`](Self::send_raw).
    ///
    /// # Errors
    /// As [`try_send`](Self::try_send), except that no peer is checked.
    pub unsafe fn try_send_raw(
        &self,
        fi_addr: sys::fi_addr_t,
        message: &[u8],
    ) -> Result<(), DmaError> {
        // SAFETY: the caller's promise is this function's.
        unsafe { sends::try_send(self, fi_addr, message) }
    }

    /// How many sends are in flight: posted, completion not yet read. At most
    /// [`Description::max_sends_in_flight`](super::Description::max_sends_in_flight).
    pub fn sends_in_flight(&self) -> usize {
        self.operations.sends.outstanding()
    }

    /// How many operations of every kind `peer` has in flight (posted, completion not yet read
    /// by the provider's queue): at most
    /// [`Configuration::max_operations_per_peer`](crate::configuration::Configuration::max_operations_per_peer)
    /// (see there). Counted for the peer's incarnation: a peer resolved anew on an index that its
    /// predecessor left operations in flight on has none of them. 0 for a peer of another
    /// endpoint's cache.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let server = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// let client = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// let pinned = server.cache().pin();
    /// let peer = pinned.resolve(1, &client.local_address()?)?;
    /// assert_eq!(0, server.peer_operations_in_flight(peer));
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn peer_operations_in_flight(&self, peer: Peer<'_>) -> usize {
        if self.check_peer(peer).is_err() {
            return 0;
        }
        let fi_addr = peer.fi_addr();
        let incarnation = self.operations.peers.unreachable.incarnation(fi_addr);
        self.operations.sends.budget.in_flight(fi_addr, incarnation)
    }

    /// How many sends of this endpoint completed with an error, since it opened: each was also
    /// logged at `warn` with its peer, and a peer whose error says it is gone answers the next
    /// send with [`DmaError::PeerUnreachable`].
    pub fn failed_sends(&self) -> u64 {
        self.operations.sends.failures()
    }

    /// How many sends endpoints of this process discarded because they were dropped with the
    /// sends still in flight (each drop also logs its count at `warn`).
    pub fn discarded_sends() -> u64 {
        sends::DISCARDED.load(std::sync::atomic::Ordering::Acquire)
    }

    /// At drop: drive progress for sends in flight for at most [`SEND_DRAIN_PATIENCE`](Self::SEND_DRAIN_PATIENCE), then
    /// count what is left as discarded.
    pub(super) fn shut_down_sends(&self) {
        messages::cancel_receives_into(self);
        // Nothing in flight: no progress at all. A progress pass here would accept a peer's
        // pending connection that the close then leaks inside libfabric (rxm's connection request,
        // 64 B on 2.6.0 and 376 B on 1.17, seen by AddressSanitizer).
        if 0 == self.sends_in_flight() {
            return;
        }
        // Sleeping between reads where the queues have a wait object (see `wait`).
        let _drained = self.wait_until(Deadline::after(Self::SEND_DRAIN_PATIENCE), || {
            self.progress();
            (0 == self.sends_in_flight()).then_some(())
        });
        let discarded = self.sends_in_flight();
        if 0 < discarded {
            sends::DISCARDED.fetch_add(discarded as u64, std::sync::atomic::Ordering::AcqRel);
            tracing::warn!(
                discarded,
                "the endpoint was dropped with sends in flight: they were discarded"
            );
        }
    }

    /// Drive the provider's progress on the transmit side, reporting any transmit error, and
    /// post again any receive buffer whose earlier re-post failed.
    ///
    /// Reading the transmit queue frees the slots of completed sends and reports failed ones
    /// (see [`send_within`](Self::send_within): counted, logged, and their peer marked
    /// unreachable where the error says so); it is also what makes a manual-progress provider such as tcp move data.
    ///
    /// RMA operations complete into the same queue: their completions are handed to them (and
    /// their leases dropped) here too, ready for [`poll_completions`](Self::poll_completions).
    ///
    /// On a credited endpoint ([`PeerProtocol::Credited`](crate::configuration::PeerProtocol::Credited))
    /// it reads the receive queue too: peers' introductions are answered and their grants taken
    /// here, and the messages met there are set aside, in order, for
    /// [`try_receive`](Self::try_receive) (at most one per receive buffer).
    pub fn progress(&self) {
        receiving::repost_unposted(self);
        flow::repost_controls(self);
        flow::send_unsent_grants(self);
        if self.credits.is_some() {
            // Introductions and grants arrive on the receive queue, and a peer that only
            // progresses must still answer them (messages met there are set aside, at most one
            // per receive buffer, for `try_receive`).
            self.reap_receive_queue();
        } else {
            receiving::reap_receives_into(self);
        }
        self.operations.reap(self.handles.tx_cq);
    }

    /// Take one received message, if one has arrived. Its buffer is posted again before this
    /// returns; if that post fails, the message is returned all the same and the buffer is kept
    /// for the next `try_receive` or [`progress`](Self::progress) to post (see
    /// [`unposted_receives`](Self::unposted_receives)). [`try_receive_from`](Self::try_receive_from)
    /// says who sent it too.
    ///
    /// # Errors
    /// [`DmaError::Fabric`] for an error completion (its buffer is posted again too) or a failed
    /// read.
    pub fn try_receive(&self) -> Result<Option<Vec<u8>>, DmaError> {
        Ok(self.try_receive_from()?.map(|received| received.message))
    }

    /// Wait up to `timeout` for one received message, driving progress meanwhile. Any `Duration`
    /// is accepted: one too long for a deadline (`Duration::MAX`) waits until a message arrives.
    ///
    /// # Errors
    /// As [`try_receive`](Self::try_receive).
    pub fn receive(&self, timeout: Duration) -> Result<Option<Vec<u8>>, DmaError> {
        receiving::receive_with(self, timeout, || self.try_receive())
    }

    /// How many receive buffers are not posted now because their re-post failed; the next
    /// [`try_receive`](Self::try_receive) or [`progress`](Self::progress) tries them again.
    /// Zero in normal operation.
    pub fn unposted_receives(&self) -> usize {
        self.receives.unposted()
    }

    /// [`try_receive`](Self::try_receive), with who sent the message: see [`Received::sender`].
    ///
    /// # Errors
    /// As [`try_receive`](Self::try_receive).
    pub fn try_receive_from(&self) -> Result<Option<Received>, DmaError> {
        receiving::take_received(self)
    }

    /// [`receive`](Self::receive), with who sent the message: see [`Received::sender`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let server = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
    /// let client = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
    /// // The server knows the client as client 7: its address is in the server's AV.
    /// let pinned = server.cache().pin();
    /// let client_index = pinned.resolve(7, &client.local_address()?)?.fi_addr();
    /// let received = std::thread::scope(|scope| {
    ///     let receiving = scope.spawn(|| server.receive_from(Duration::from_secs(20)));
    ///     let pinned = client.cache().pin();
    ///     let to_server = pinned.resolve(1, &server.local_address()?)?;
    ///     client.send_within(to_server, b"hello", Duration::from_secs(20))?;
    ///     // The client's provider progresses while it waits for the reply that never comes.
    ///     let _ = client.receive(Duration::from_millis(200));
    ///     receiving.join().expect("the receiving thread")
    /// })?
    /// .expect("a message");
    /// assert_eq!(b"hello".to_vec(), received.message);
    /// // The default provider, tcp;ofi_rxm, names a sender that is in the AV.
    /// assert_eq!(Some(client_index), received.sender);
    /// assert_eq!(vec![7], server.cache().clients_at(client_index));
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// As [`receive`](Self::receive).
    pub fn receive_from(&self, timeout: Duration) -> Result<Option<Received>, DmaError> {
        receiving::receive_with(self, timeout, || receiving::take_received(self))
    }

    /// Read the receive queue until it is empty, at most once per operation slot and receive
    /// buffer: `receive_into` completions and notifications are handed on, and the endpoint's own
    /// buffers' arrivals are set aside for the next `try_receive`, at most one per buffer.
    ///
    /// Whatever it took off the queue, it wakes the thread asleep in this endpoint's wait (a
    /// blocked `receive`, the async driver, whose pass then wakes the async receivers): the
    /// reading thread may be another (a send looking for a grant, a `progress`), and the
    /// sleeper's descriptors no longer show what it took, so without the ring the one waiting
    /// for it would sleep its whole sleep.
    pub(crate) fn reap_receive_queue(&self) {
        receiving::reap_queue(self);
    }

    /// `fi_send` of `source` to the lease's peer, from the registered memory itself (no copy),
    /// retrying backpressure for up to a second. The message is received like any other (by
    /// [`receive`](Self::receive), into a buffer of `receive_size`: a longer one is a truncation
    /// error there). The completion, with `id` and [`Operation::Send`], comes from
    /// [`poll_completions`](Self::poll_completions) or [`wait_for`](Self::wait_for); until it has
    /// been read the endpoint holds the lease and the source's memory. On tcp the completion
    /// means the peer's provider has the message (`FI_TRANSMIT_COMPLETE`), unless the endpoint
    /// was opened with
    /// [`SendCompletion::Local`](crate::configuration::SendCompletion::Local).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint, Operation};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let sender = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let receiver = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let region = sender.register(4096)?;
    /// region.write_bytes(0, &[7; 4096])?;
    /// let message = std::thread::scope(|scope| {
    ///     // The receiver progresses inside `receive`: rxm connects on the first send.
    ///     let receiving = scope.spawn(|| receiver.receive(Duration::from_secs(20)));
    ///     let lease = sender.cache().lease(1, &receiver.local_address()?)?;
    ///     sender.send_from_within(lease, region.segment(0, 4096)?, 42, Duration::from_secs(20))?;
    ///     assert_eq!(1, sender.cache().stats().leases, "held until the completion is read");
    ///     let completion = sender.wait_for(42, Duration::from_secs(20))?;
    ///     assert_eq!((Operation::Send, 4096, Ok(())), (completion.operation, completion.len, completion.result));
    ///     assert_eq!(0, sender.cache().stats().leases);
    ///     receiving.join().expect("the receiving thread")
    /// })?;
    /// assert_eq!(Some(vec![7; 4096]), message);
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// As [`send_from_within`](Self::send_from_within).
    pub fn send_from(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        id: u64,
    ) -> Result<(), DmaError> {
        self.send_from_within(lease, source, id, Duration::from_secs(1))
    }

    /// [`send_from`](Self::send_from), retrying backpressure for at most `timeout` (any
    /// `Duration`: one too long for a deadline, `Duration::MAX`, retries until the post is taken).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] (nothing posted) for an endpoint without RMA, a lease of
    /// another endpoint's cache or a segment of another endpoint's memory;
    /// [`DmaError::PeerUnreachable`] when the provider has reported the peer gone (an earlier
    /// send's completion, see [`send`](Self::send)); [`DmaError::WouldBlock`] when the provider or
    /// the slab still pushed back after `timeout` (nothing posted); [`DmaError::Busy`] when a
    /// slice or copy of a `Local` source region stayed lent for the whole `timeout` (the post
    /// waits for them, refusing new ones meanwhile; nothing posted); [`DmaError::Fabric`] when
    /// `fi_send` failed (a message past the provider's `max_msg_size` included).
    pub fn send_from_within(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        id: u64,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        messages::send_from_to(self, lease, source, id, timeout, Sink::Application)
    }

    /// Post a receive into `destination`, registered memory of this endpoint: the next message
    /// to arrive that no earlier-posted receive takes lands there, with no copy. Receives match
    /// in the order they were posted, the endpoint's own buffers (posted at `open` and again after
    /// each message) included. The completion, with `id`, [`Operation::Receive`] and `len` the
    /// length received, comes from [`poll_completions`](Self::poll_completions) or
    /// [`wait_for`](Self::wait_for) (or is set aside by [`try_receive`](Self::try_receive) for
    /// them); until then the endpoint holds the destination's memory. A message longer than
    /// `destination` completes with `-FI_ETRUNC`. The completion's
    /// [`sender`](crate::endpoint::Completion::sender) names who sent the message where the provider says
    /// (tcp;ofi_rxm, for a sender in this endpoint's AV: see
    /// [`receive_from`](Self::receive_from)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint, Operation};
    ///
    /// let configuration = Configuration { rma: true, receive_buffers: 1, ..Configuration::default() };
    /// let receiver = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let sender = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let landing = receiver.register(64 << 10)?;
    /// receiver.receive_into(landing.segment(0, 64 << 10)?, 9)?;
    /// let source = sender.register(10_000)?;
    /// source.write_bytes(0, &[4; 10_000])?;
    /// std::thread::scope(|scope| {
    ///     // The endpoint's own buffer takes the first message; `landing` the second.
    ///     let receiving = scope.spawn(|| {
    ///         let first = receiver.receive(Duration::from_secs(20));
    ///         (first, receiver.wait_for(9, Duration::from_secs(20)))
    ///     });
    ///     let pinned = sender.cache().pin();
    ///     let peer = pinned.resolve(1, &receiver.local_address()?)?;
    ///     sender.send_within(peer, b"first", Duration::from_secs(20))?;
    ///     drop(pinned);
    ///     let lease = sender.cache().lease(1, &receiver.local_address()?)?;
    ///     sender.send_from_within(lease, source.segment(0, 10_000)?, 1, Duration::from_secs(20))?;
    ///     sender.wait_for(1, Duration::from_secs(20))?;
    ///     let (first, landed) = receiving.join().expect("the receiving thread");
    ///     assert_eq!(Some(b"first".to_vec()), first?);
    ///     let landed = landed?;
    ///     assert_eq!((Operation::Receive, 10_000, Ok(())), (landed.operation, landed.len, landed.result));
    ///     let mut bytes = vec![0; 10_000];
    ///     landing.read_bytes(0, &mut bytes)?;
    ///     assert_eq!(vec![4; 10_000], bytes);
    ///     Ok::<(), dma_libfabric::DmaError>(())
    /// })?;
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] (nothing posted) for an endpoint without RMA or a segment of
    /// another endpoint's memory; [`DmaError::WouldBlock`] when every operation slot is in flight
    /// or the provider asks to retry (nothing posted); [`DmaError::Busy`], at once, while a
    /// slice or copy of a `Local` destination region is lent (a receive has no patience to wait
    /// for it; nothing posted); [`DmaError::Fabric`] when `fi_recv` failed.
    pub fn receive_into(&self, destination: Segment<'_>, id: u64) -> Result<(), DmaError> {
        messages::receive_into_to(self, destination, id, Sink::Application)
    }
}
