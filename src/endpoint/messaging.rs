//! Messaging: sends (to a [`Peer`], or `unsafe` to a raw `fi_addr_t`), receives into the
//! endpoint's own buffers, driving progress, and reading error completions.
//!
//! How a send is bounded, reported and drained is on
//! [`send_within`](LibfabricEndpoint::send_within) ("Bounded, and never lost without an error");
//! that every wait is bounded, on [`LibfabricEndpoint`] ("Nothing waits for ever"). A send's slot
//! is `sends`'s, its sender's bookkeeping `senders`'s, the sleep between attempts `wait`'s.

use std::ptr;
use std::time::Duration;

use super::credits::What;
use super::deadline::Deadline;
use super::error_entry::read_error_entry;
use super::receive::SlotArrival;
use super::senders::{self, Received};
use super::{LibfabricEndpoint, RECEIVE_POST_PATIENCE, sends};
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
    /// `FI_TRANSMIT_COMPLETE`, which tcp completes when the peer's provider acknowledges it: a send
    /// sitting in a socket is still in flight.
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
    /// that matters.
    ///
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
        let attempt = || match unsafe { self.try_send_raw(fi_addr, message) } {
            Err(DmaError::WouldBlock) => {
                self.progress();
                // The pass may have read what the send waits for (a completion freeing a slot,
                // a grant): try again before sleeping on queues it has emptied.
                // SAFETY: as above.
                match unsafe { self.try_send_raw(fi_addr, message) } {
                    Err(DmaError::WouldBlock) => None,
                    result => Some(result),
                }
            }
            result => Some(result),
        };
        self.wait_until(Deadline::after(timeout), attempt)
            .unwrap_or(Err(DmaError::WouldBlock))
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
        let sends = &self.operations.sends;
        if message.len() > sends.size() {
            return Err(DmaError::InvalidArgument(format!(
                "a {}-byte message exceeds the {} bytes send copies (Description::max_send_size): \
                 send larger ones from registered memory with send_from",
                message.len(),
                sends.size()
            )));
        }
        if let Some(code) = sends.dead(fi_addr) {
            return Err(sends::unreachable(fi_addr, code));
        }
        // Credit first (a credited endpoint's peer must have granted room for it); given back
        // if nothing is posted.
        let credit = self.take_credit(fi_addr, What::Message(message.len()))?;
        // Past the transmit queue's depth: nothing is posted.
        let Some((index, buffer, context)) = sends.prepare(fi_addr, message) else {
            self.give_back_credit(credit);
            return Err(DmaError::WouldBlock);
        };
        // SAFETY: the endpoint is open; the caller promises `fi_addr` is a live entry of this AV;
        // `buffer` is the slot's copy of `message`, which stays untouched until the slot's
        // completion is read (the slot is the provider's until then), and `context` is the
        // slot's, which lives as long as the endpoint's handles (the slab is dropped after them).
        // No descriptor: `open` refuses providers that require FI_MR_LOCAL.
        let code = unsafe {
            self.post_send(
                buffer.cast_const(),
                message.len(),
                ptr::null_mut(),
                fi_addr,
                context,
            )
        };
        if 0 == code {
            return Ok(());
        }
        // Not posted: the slot is still this thread's.
        sends.unprepare(index);
        self.give_back_credit(credit);
        if code == -(sys::FI_EAGAIN as isize) {
            // Nothing may signal when it would go through (a connection being set up): see `wait`.
            self.operations.waiter.retry_soon();
            return Err(DmaError::WouldBlock);
        }
        let positive = u32::try_from(code.unsigned_abs()).unwrap_or(0);
        if crate::av::unreachable::says_peer_is_gone(positive) {
            sends.mark_dead(fi_addr, positive);
            return Err(sends::unreachable(fi_addr, positive));
        }
        Err(DmaError::fabric("fi_send", code as i64))
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
        self.cancel_receives_into();
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

    /// Refuse a peer another cache resolved: its index means nothing in this AV.
    fn check_peer(&self, peer: Peer<'_>) -> Result<(), DmaError> {
        if self.peers.owns(peer) {
            Ok(())
        } else {
            Err(DmaError::InvalidArgument(format!(
                "peer {} was resolved by another cache than this endpoint's: its index means \
                 nothing in this endpoint's address vector",
                peer.fi_addr()
            )))
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
        self.repost_unposted();
        self.repost_controls();
        self.send_unsent_grants();
        if self.credits.is_some() {
            // Introductions and grants arrive on the receive queue, and a peer that only
            // progresses must still answer them (messages met there are set aside, at most one
            // per receive buffer, for `try_receive`).
            self.reap_receive_queue();
        } else {
            self.reap_receives_into();
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

    /// [`try_receive_from`](Self::try_receive_from)'s work: one received message and its sender.
    pub(super) fn take_received(&self) -> Result<Option<Received>, DmaError> {
        self.repost_unposted();
        match self.next_arrival()? {
            Some(arrival) => self.deliver(arrival),
            None => Ok(None),
        }
    }

    /// The oldest arrival: one set aside, else the next one the receive queue holds. Taken in
    /// the receive queue's order: the queue is read under the slab's order lock, by this and by
    /// [`reap_receive_queue`](Self::reap_receive_queue), so no arrival read before another is
    /// set aside after it.
    fn next_arrival(&self) -> Result<Option<SlotArrival>, DmaError> {
        let _order = self.receives.order();
        if let Some(arrival) = self.receives.take_arrived() {
            return Ok(Some(arrival));
        }
        // Each pass reads one entry; `receive_into` completions are handed on and the read goes
        // on, at most once per operation slot and receive buffer.
        for _ in 0..=MAX_RECEIVES_INTO {
            match self.read_arrival() {
                Arrival::Nothing => return Ok(None),
                Arrival::Operation => {}
                Arrival::Slot(arrival) => return Ok(Some(arrival)),
                Arrival::Failed(error) => return Err(error),
            }
        }
        Ok(None)
    }

    /// The message of the slot of `arrival`, whose completion this thread read (its length, or
    /// its error), and the slot posted again.
    fn deliver(&self, (index, outcome, sender): SlotArrival) -> Result<Option<Received>, DmaError> {
        let message = match (outcome, self.receives.get(index)) {
            (Ok(len), Some(slot)) => {
                // SAFETY: this thread read the slot's completion and has not re-posted it.
                unsafe { slot.received(len) }.map(|message| Some(Received { message, sender }))
            }
            (Ok(_), None) => Ok(None),
            (Err(error), _) => Err(error),
        };
        self.repost(index);
        message
    }

    /// Read one entry of the receive queue: a `receive_into`'s completion is handed to its
    /// operation; a receive buffer's is the caller's to deliver (it owns the slot now).
    fn read_arrival(&self) -> Arrival {
        let mut entry = sys::fi_cq_tagged_entry::default();
        let mut source = sys::FI_ADDR_NOTAVAIL;
        // SAFETY: the queue is open, `entry` has room for the one entry asked for and `source`
        // for its one source address (`FI_ADDR_NOTAVAIL` where the provider has none: fi_cq(3)).
        let read = unsafe {
            sys::fi_cq_readfrom(
                self.handles.rx_cq,
                (&raw mut entry).cast(),
                1,
                &raw mut source,
            )
        };
        let sender = senders::named(source);
        if read == -(sys::FI_EAGAIN as isize) {
            return Arrival::Nothing;
        }
        if read == -(sys::FI_EAVAIL as isize) {
            return self.read_error(self.handles.rx_cq);
        }
        if read < 0 {
            return Arrival::Failed(DmaError::fabric("fi_cq_readfrom", read as i64));
        }
        // A peer's write that notified (`fi_writedata`): set aside, not a message.
        if self.operations.notifications.accept(
            &sys::fi_cq_data_entry {
                op_context: entry.op_context,
                flags: entry.flags,
                len: entry.len,
                buf: entry.buf,
                data: entry.data,
            },
            sender,
        ) {
            return Arrival::Operation;
        }
        if let Some(index) = self.controls.index_of(entry.op_context) {
            self.control_arrived(index, Ok(entry.len));
            return Arrival::Operation;
        }
        let foreign = self.foreign_version(entry.tag);
        if foreign.is_none() {
            // Off the provider's queue and into a buffer of the endpoint's (at most one per
            // buffer waits there) or the application's: its sender's credit is paid back.
            self.consumed(Some(entry.tag), sender, What::Message(entry.len));
        }
        if self.operations.owns(entry.op_context) {
            let outcome = foreign.map_or(Ok(()), Err);
            self.operations
                .complete_receive(entry.op_context, entry.len, sender, outcome);
            return Arrival::Operation;
        }
        match self.receives.index_of(entry.op_context) {
            Some(index) => Arrival::Slot((index, foreign.map_or(Ok(entry.len), Err), sender)),
            None => Arrival::Failed(DmaError::InvalidArgument(
                "a receive completion named a context this endpoint never posted".into(),
            )),
        }
    }

    /// While `receive_into`s are posted, read the receive queue (for [`progress`](Self::progress),
    /// and so for `poll_completions` and `wait_for`): their completions are handed on, and the
    /// endpoint's own buffers' are set aside for the next `try_receive`, at most one per buffer.
    fn reap_receives_into(&self) {
        if 0 < self.operations.receives_into() {
            self.reap_receive_queue();
        }
    }

    /// Read the receive queue until it is empty, at most once per operation slot and receive
    /// buffer: `receive_into` completions and notifications are handed on, and the endpoint's own
    /// buffers' arrivals are set aside for the next `try_receive`, at most one per buffer.
    pub(crate) fn reap_receive_queue(&self) {
        let _order = self.receives.order();
        for _ in 0..=(MAX_RECEIVES_INTO + self.receives.len()) {
            match self.read_arrival() {
                Arrival::Nothing => return,
                Arrival::Operation => {}
                Arrival::Slot(arrival) => self.receives.set_aside(arrival),
                Arrival::Failed(error) => {
                    tracing::warn!(%error, "reading the receive queue failed");
                    return;
                }
            }
        }
    }

    /// Wait up to `timeout` for one received message, driving progress meanwhile. Any `Duration`
    /// is accepted: one too long for a deadline (`Duration::MAX`) waits until a message arrives.
    ///
    /// # Errors
    /// As [`try_receive`](Self::try_receive).
    pub fn receive(&self, timeout: Duration) -> Result<Option<Vec<u8>>, DmaError> {
        self.receive_with(timeout, || self.try_receive())
    }

    /// Wait up to `timeout` for what `take` finds (a message, or a message with its sender),
    /// sleeping on the queues between attempts and driving progress when it finds nothing; its
    /// error ends the wait.
    pub(super) fn receive_with<T>(
        &self,
        timeout: Duration,
        mut take: impl FnMut() -> Result<Option<T>, DmaError>,
    ) -> Result<Option<T>, DmaError> {
        let mut failed = None;
        let mut attempt = || match take() {
            Ok(Some(found)) => Some(Some(found)),
            Ok(None) => None,
            Err(error) => {
                failed = Some(error);
                Some(None)
            }
        };
        let received = self.wait_until(Deadline::after(timeout), || {
            attempt().or_else(|| {
                // Reading the transmit queue too is what moves a manual-progress provider; on a
                // credited endpoint the pass reads the receive queue as well, so what it set
                // aside is taken before the wait sleeps on queues it has emptied.
                self.progress();
                attempt()
            })
        });
        match failed {
            Some(error) => Err(error),
            None => Ok(received.flatten()),
        }
    }

    /// How many receive buffers are not posted now because their re-post failed; the next
    /// [`try_receive`](Self::try_receive) or [`progress`](Self::progress) tries them again.
    /// Zero in normal operation.
    pub fn unposted_receives(&self) -> usize {
        self.receives.unposted()
    }

    /// Post slot `index` at `open`, retrying `-FI_EAGAIN` with progress for at most
    /// [`RECEIVE_POST_PATIENCE`].
    pub(super) fn post_patiently(&self, index: usize) -> Result<(), DmaError> {
        let deadline = Deadline::after(RECEIVE_POST_PATIENCE);
        loop {
            match self.post_receive(index) {
                Err(DmaError::WouldBlock) if !deadline.passed() => {
                    self.progress();
                    std::thread::yield_now();
                }
                Err(DmaError::WouldBlock) => {
                    return Err(DmaError::Fabric {
                        call: "fi_recv",
                        code: -i64::from(sys::FI_EAGAIN),
                        message: format!(
                            "the provider still asked to retry after {RECEIVE_POST_PATIENCE:?}, with \
                             {index} of {} receive buffers posted",
                            self.receives.len()
                        ),
                    });
                }
                result => return result,
            }
        }
    }

    /// Post slot `index` again after its completion was read, once; if that fails, keep it for a
    /// later [`repost_unposted`](Self::repost_unposted). The caller owns the slot and hands it on.
    fn repost(&self, index: usize) {
        match self.post_receive(index) {
            Ok(()) => {}
            Err(error) => {
                if DmaError::WouldBlock != error {
                    tracing::warn!(%error, index, "could not re-post a receive buffer; will retry");
                }
                self.receives.defer_post(index);
            }
        }
    }

    /// Try once more to post every slot whose re-post failed.
    fn repost_unposted(&self) {
        for index in self.receives.take_unposted() {
            self.repost(index);
        }
    }

    /// One `fi_recv` of slot `index`: [`DmaError::WouldBlock`] for `-FI_EAGAIN`.
    fn post_receive(&self, index: usize) -> Result<(), DmaError> {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering;
            let fail = self
                .failing_posts
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            if fail.is_ok() {
                if self.posts_ask_to_retry.load(Ordering::Relaxed) {
                    return Err(DmaError::WouldBlock);
                }
                return Err(DmaError::fabric("fi_recv", -i64::from(sys::FI_EIO)));
            }
        }
        let Some(slot) = self.receives.get(index) else {
            return Ok(());
        };
        let (buffer, len) = slot.buffer();
        // SAFETY: the endpoint is open, and the slot's buffer and context live in the slab, which
        // outlives the endpoint's libfabric objects; this slot is not posted (it is new, its
        // completion was just read by this thread, or this thread took it from the unposted
        // list).
        let code = unsafe { self.post_data_receive(buffer, len, ptr::null_mut(), slot.context()) };
        match code {
            0 => Ok(()),
            code if code == -(sys::FI_EAGAIN as isize) => Err(DmaError::WouldBlock),
            code => Err(DmaError::fabric("fi_recv", code as i64)),
        }
    }

    /// Read the error entry an `FI_EAVAIL` announced, re-posting its buffer if it was a receive
    /// (or keeping it for a later re-post, as `try_receive` does).
    ///
    /// The provider's error data is copied into a buffer of this call's own (`err_data_size` > 0,
    /// API 1.5 and later): left at zero, libfabric hands back a buffer it shares per queue and
    /// frees at the next `fi_cq_readerr`, which another thread may call at any time.
    fn read_error(&self, cq: *mut sys::fid_cq) -> Arrival {
        let entry = match read_error_entry(cq) {
            Ok(Some(entry)) => entry,
            Ok(None) => return Arrival::Nothing,
            Err(error) => return Arrival::Failed(error),
        };
        if self.operations.owns(entry.op_context) {
            self.operations.complete_receive(
                entry.op_context,
                entry.len,
                None,
                Err(entry.error("fi_recv")),
            );
            return Arrival::Operation;
        }
        if let Some(index) = self.controls.index_of(entry.op_context) {
            self.control_arrived(index, Err(entry.error("fi_cq_readfrom")));
            return Arrival::Operation;
        }
        match self.receives.index_of(entry.op_context) {
            // This thread read the slot's (error) completion, so it owns the slot.
            Some(index) => Arrival::Slot((index, Err(entry.error("fi_cq_readfrom")), None)),
            None => Arrival::Failed(entry.error("fi_cq_readfrom")),
        }
    }
}

/// What one read of the receive queue found.
enum Arrival {
    /// Nothing (or another thread took the entry).
    Nothing,
    /// A `receive_into`'s completion, handed to its operation.
    Operation,
    /// A receive buffer's completion: its index, length or error, and sender. The reader owns
    /// the slot.
    Slot(SlotArrival),
    /// The read failed, or named a context nobody posted.
    Failed(DmaError),
}

/// The most `receive_into`s (operation slots) one read loop passes over before it stops.
const MAX_RECEIVES_INTO: usize = super::MAX_OPERATIONS;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use std::sync::atomic::Ordering;
    use std::sync::mpsc;

    use super::*;
    use crate::configuration::Configuration;

    /// A tcp endpoint on loopback with `receive_buffers` buffers of `receive_size` bytes.
    fn tcp(receive_buffers: usize, receive_size: usize) -> LibfabricEndpoint {
        let configuration = Configuration {
            receive_buffers,
            receive_size,
            ..Configuration::default()
        };
        LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint")
    }

    /// Run `body` while a fresh endpoint on its own thread sends `receiver` each message `body`
    /// hands it, driving its own progress in between (tcp progresses manually). The receiver
    /// accepts the connection while `body` polls it.
    fn sending_to<R>(
        receiver: &LibfabricEndpoint,
        body: impl FnOnce(&mpsc::Sender<Vec<u8>>) -> R,
    ) -> R {
        let sender = tcp(8, 4096);
        let address = receiver.local_address().expect("address");
        let (outbox, inbox) = mpsc::channel::<Vec<u8>>();
        std::thread::scope(|scope| {
            let sending = scope.spawn(move || {
                let pinned = sender.cache().pin();
                let peer = pinned.resolve(1, &address).expect("resolve");
                loop {
                    match inbox.try_recv() {
                        Ok(message) => sender
                            .send_within(peer, &message, Duration::from_secs(20))
                            .expect("send"),
                        Err(mpsc::TryRecvError::Empty) => {
                            sender.progress();
                            std::thread::yield_now();
                        }
                        Err(mpsc::TryRecvError::Disconnected) => break,
                    }
                }
            });
            let result = body(&outbox);
            drop(outbox);
            sending.join().expect("the sending thread");
            result
        })
    }

    /// A re-post that fails after a message was copied out loses neither the message nor the
    /// buffer: the next `try_receive` posts it again. With one buffer, a lost one would leave the
    /// second message undeliverable. (The failure is injected: tcp does not refuse a re-post.)
    #[test]
    fn a_failed_re_post_returns_the_message_and_posts_the_buffer_later() {
        let receiver = tcp(1, 4096);
        sending_to(&receiver, |outbox| {
            outbox.send(b"one".to_vec()).expect("to the sender");
            receiver.failing_posts.store(1, Ordering::Relaxed);
            assert_eq!(
                Some(b"one".to_vec()),
                receiver
                    .receive(Duration::from_secs(20))
                    .expect("the message, not the error")
            );
            assert_eq!(1, receiver.unposted_receives(), "kept for a later re-post");
            outbox.send(b"two".to_vec()).expect("to the sender");
            assert_eq!(
                Some(b"two".to_vec()),
                receiver.receive(Duration::from_secs(20)).expect("receive")
            );
            assert_eq!(0, receiver.unposted_receives());
        });
    }

    /// An error completion's buffer is re-posted too, later if the first re-post fails. The
    /// error carries libfabric's text for the code and the provider's, read from a buffer of the
    /// call's own. (tcp;ofi_rxm 1.17 delivers nothing more on a connection after it truncated a
    /// message, so the re-post shows in the count of unposted buffers, not in later traffic.)
    #[test]
    fn an_error_completions_buffer_is_posted_again_even_if_the_first_re_post_fails() {
        let receiver = tcp(1, 8);
        sending_to(&receiver, |outbox| {
            outbox.send(vec![7; 64]).expect("to the sender");
            receiver.failing_posts.store(1, Ordering::Relaxed);
            let error = match receiver.receive(Duration::from_secs(20)) {
                Err(error) => error,
                Ok(other) => panic!("expected a truncation error, got {other:?}"),
            };
            let DmaError::Fabric { code, message, .. } = &error else {
                panic!("expected a fabric error, got {error}");
            };
            assert_eq!(-i64::from(sys::FI_ETRUNC), *code, "{error}");
            assert!(message.contains("Truncation"), "{error}");
            assert_eq!(1, receiver.unposted_receives(), "kept for a later re-post");
            receiver.progress();
            assert_eq!(0, receiver.unposted_receives(), "posted again");
        });
    }

    /// A provider that answers `-FI_EAGAIN` for ever costs `open` a bounded wait and a clear
    /// error, not a spin at 100% CPU. (Injected: tcp accepts every post up to `rx_attr.size`,
    /// which `open` checks first.)
    #[test]
    fn posting_gives_up_on_a_provider_that_always_asks_to_retry() {
        let endpoint = tcp(1, 64);
        endpoint.posts_ask_to_retry.store(true, Ordering::Relaxed);
        endpoint.failing_posts.store(usize::MAX, Ordering::Relaxed);
        match endpoint.post_patiently(0) {
            Err(DmaError::Fabric {
                call,
                code,
                message,
            }) => {
                assert_eq!("fi_recv", call);
                assert_eq!(-i64::from(sys::FI_EAGAIN), code);
                assert!(message.contains("still asked to retry"), "{message}");
            }
            other => panic!("expected a fabric error, got {other:?}"),
        }
        endpoint.failing_posts.store(0, Ordering::Relaxed);
    }
}
