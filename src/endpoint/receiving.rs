//! Receiving: the endpoint's own receive buffers and what reads the receive queue. Every read of
//! the queue is made under the slab's order lock (`ReceiveSlots::order`), so arrivals reach the
//! application in the queue's order whichever threads read it; a receive buffer's completion
//! hands the slot to the one thread that read it, which copies the message out and posts it
//! again (`receive`'s module docs); `receive_into` completions, notifications and the credit
//! protocol's control messages met on the way are handed on.
//!
//! Module functions on the endpoint, called by the message face (`messaging`) and by
//! `progress`; the calls a user makes are there.

use super::credits::flow;
use std::ptr;
use std::time::Duration;

use super::credits::What;
use super::deadline::Deadline;
use super::error_entry::read_error_entry;
use super::receive::SlotArrival;
use super::senders::{self, Received};
use super::{LibfabricEndpoint, RECEIVE_POST_PATIENCE};
use crate::error::DmaError;
use dma_libfabric_sys as sys;

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

/// [`try_receive_from`](LibfabricEndpoint::try_receive_from)'s work: one received message and its sender.
pub(super) fn take_received(endpoint: &LibfabricEndpoint) -> Result<Option<Received>, DmaError> {
    repost_unposted(endpoint);
    match next_arrival(endpoint)? {
        Some(arrival) => deliver(endpoint, arrival),
        None => Ok(None),
    }
}

/// The oldest arrival: one set aside, else the next one the receive queue holds. Taken in
/// the receive queue's order: the queue is read under the slab's order lock, by this and by
/// [`reap_receive_queue`](LibfabricEndpoint::reap_receive_queue), so no arrival read before another is
/// set aside after it.
fn next_arrival(endpoint: &LibfabricEndpoint) -> Result<Option<SlotArrival>, DmaError> {
    let _order = endpoint.receives.order();
    if let Some(arrival) = endpoint.receives.take_arrived() {
        return Ok(Some(arrival));
    }
    // Each pass reads one entry; `receive_into` completions are handed on and the read goes
    // on, at most once per operation slot and receive buffer.
    for _ in 0..=MAX_RECEIVES_INTO {
        match read_arrival(endpoint) {
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
fn deliver(
    endpoint: &LibfabricEndpoint,
    (index, outcome, sender): SlotArrival,
) -> Result<Option<Received>, DmaError> {
    let message = match (outcome, endpoint.receives.get(index)) {
        (Ok(len), Some(slot)) => {
            // SAFETY: this thread read the slot's completion and has not re-posted it.
            unsafe { slot.received(len) }.map(|message| Some(Received { message, sender }))
        }
        (Ok(_), None) => Ok(None),
        (Err(error), _) => Err(error),
    };
    repost(endpoint, index);
    message
}

/// Read one entry of the receive queue: a `receive_into`'s completion is handed to its
/// operation; a receive buffer's is the caller's to deliver (it owns the slot now).
fn read_arrival(endpoint: &LibfabricEndpoint) -> Arrival {
    let mut entry = sys::fi_cq_tagged_entry::default();
    let mut source = sys::FI_ADDR_NOTAVAIL;
    // SAFETY: the queue is open, `entry` has room for the one entry asked for and `source`
    // for its one source address (`FI_ADDR_NOTAVAIL` where the provider has none: fi_cq(3)).
    let read = unsafe {
        sys::fi_cq_readfrom(
            endpoint.handles.rx_cq,
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
        return read_error(endpoint, endpoint.handles.rx_cq);
    }
    if read < 0 {
        return Arrival::Failed(DmaError::fabric("fi_cq_readfrom", read as i64));
    }
    // A peer's write that notified (`fi_writedata`): set aside, not a message.
    if endpoint.operations.notifications.accept(
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
    if let Some(index) = endpoint.controls.index_of(entry.op_context) {
        flow::control_arrived(endpoint, index, Ok(entry.len));
        return Arrival::Operation;
    }
    let foreign = flow::foreign_version(endpoint, entry.tag);
    let sender = if foreign.is_none() {
        // Off the provider's queue and into a buffer of the endpoint's (at most one per
        // buffer waits there) or the application's: its sender's credit is paid back, and
        // the sender is the one that proved the tag's secret.
        flow::consumed(endpoint, Some(entry.tag), sender, What::Message(entry.len))
    } else {
        sender
    };
    if endpoint.operations.owns(entry.op_context) {
        let outcome = foreign.map_or(Ok(()), Err);
        endpoint
            .operations
            .complete_receive(entry.op_context, entry.len, sender, outcome);
        return Arrival::Operation;
    }
    match endpoint.receives.index_of(entry.op_context) {
        Some(index) => Arrival::Slot((index, foreign.map_or(Ok(entry.len), Err), sender)),
        None => Arrival::Failed(DmaError::InvalidArgument(
            "a receive completion named a context this endpoint never posted".into(),
        )),
    }
}

/// While `receive_into`s are posted, read the receive queue (for [`progress`](LibfabricEndpoint::progress),
/// and so for `poll_completions` and `wait_for`): their completions are handed on, and the
/// endpoint's own buffers' are set aside for the next `try_receive`, at most one per buffer.
pub(super) fn reap_receives_into(endpoint: &LibfabricEndpoint) {
    if 0 < endpoint.operations.receives_into() {
        endpoint.reap_receive_queue();
    }
}

/// Wait up to `timeout` for what `take` finds (a message, or a message with its sender),
/// sleeping on the queues between attempts and driving progress when it finds nothing; its
/// error ends the wait.
pub(super) fn receive_with<T>(
    endpoint: &LibfabricEndpoint,
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
    let received = endpoint.wait_until_spinning_first(Deadline::after(timeout), || {
        attempt().or_else(|| {
            // Reading the transmit queue too is what moves a manual-progress provider; on a
            // credited endpoint the pass reads the receive queue as well, so what it set
            // aside is taken before the wait sleeps on queues it has emptied.
            endpoint.progress();
            attempt()
        })
    });
    match failed {
        Some(error) => Err(error),
        None => Ok(received.flatten()),
    }
}

/// Post slot `index` at `open`, retrying `-FI_EAGAIN` with progress for at most
/// [`RECEIVE_POST_PATIENCE`].
pub(super) fn post_patiently(endpoint: &LibfabricEndpoint, index: usize) -> Result<(), DmaError> {
    let deadline = Deadline::after(RECEIVE_POST_PATIENCE);
    let attempt = || {
        let posted = post_receive(endpoint, index);
        if let Err(DmaError::WouldBlock) = posted {
            // `-FI_EAGAIN`: what the wait is for is the provider's own progress.
            endpoint.operations.waiter.retry_soon();
        }
        posted
    };
    match endpoint.retry_until(deadline, attempt) {
        Err(DmaError::WouldBlock) => Err(DmaError::Fabric {
            call: "fi_recv",
            code: -i64::from(sys::FI_EAGAIN),
            message: format!(
                "the provider still asked to retry after {RECEIVE_POST_PATIENCE:?}, with \
                 {index} of {} receive buffers posted",
                endpoint.receives.len()
            ),
        }),
        result => result,
    }
}

/// Post slot `index` again after its completion was read, once; if that fails, keep it for a
/// later [`repost_unposted`](LibfabricEndpoint::repost_unposted). The caller owns the slot and hands it on.
fn repost(endpoint: &LibfabricEndpoint, index: usize) {
    match post_receive(endpoint, index) {
        Ok(()) => {}
        Err(error) => {
            if DmaError::WouldBlock != error {
                tracing::warn!(%error, index, "could not re-post a receive buffer; will retry");
            }
            endpoint.receives.defer_post(index);
        }
    }
}

/// Try once more to post every slot whose re-post failed.
pub(super) fn repost_unposted(endpoint: &LibfabricEndpoint) {
    for index in endpoint.receives.take_unposted() {
        repost(endpoint, index);
    }
}

/// One `fi_recv` of slot `index`: [`DmaError::WouldBlock`] for `-FI_EAGAIN`.
fn post_receive(endpoint: &LibfabricEndpoint, index: usize) -> Result<(), DmaError> {
    #[cfg(test)]
    {
        use std::sync::atomic::Ordering;
        let fail = endpoint
            .failing_posts
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if fail.is_ok() {
            if endpoint.posts_ask_to_retry.load(Ordering::Relaxed) {
                return Err(DmaError::WouldBlock);
            }
            return Err(DmaError::fabric("fi_recv", -i64::from(sys::FI_EIO)));
        }
    }
    let Some(slot) = endpoint.receives.get(index) else {
        return Ok(());
    };
    let (buffer, len) = slot.buffer();
    // SAFETY: the endpoint is open, and the slot's buffer and context live in the slab, which
    // outlives the endpoint's libfabric objects; this slot is not posted (it is new, its
    // completion was just read by this thread, or this thread took it from the unposted
    // list).
    let code =
        unsafe { flow::post_data_receive(endpoint, buffer, len, ptr::null_mut(), slot.context()) };
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
fn read_error(endpoint: &LibfabricEndpoint, cq: *mut sys::fid_cq) -> Arrival {
    let entry = match read_error_entry(cq) {
        Ok(Some(entry)) => entry,
        Ok(None) => return Arrival::Nothing,
        Err(error) => return Arrival::Failed(error),
    };
    if endpoint.operations.owns(entry.op_context) {
        endpoint.operations.complete_receive(
            entry.op_context,
            entry.len,
            None,
            Err(entry.error("fi_recv")),
        );
        return Arrival::Operation;
    }
    if let Some(index) = endpoint.controls.index_of(entry.op_context) {
        flow::control_arrived(endpoint, index, Err(entry.error("fi_cq_readfrom")));
        return Arrival::Operation;
    }
    match endpoint.receives.index_of(entry.op_context) {
        // This thread read the slot's (error) completion, so it owns the slot.
        Some(index) => Arrival::Slot((index, Err(entry.error("fi_cq_readfrom")), None)),
        None => Arrival::Failed(entry.error("fi_cq_readfrom")),
    }
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
pub(super) fn reap_queue(endpoint: &LibfabricEndpoint) {
    let order = endpoint.receives.order();
    let mut took = false;
    for _ in 0..=(MAX_RECEIVES_INTO + endpoint.receives.len()) {
        match read_arrival(endpoint) {
            Arrival::Nothing => break,
            Arrival::Operation => took = true,
            Arrival::Slot(arrival) => {
                endpoint.receives.set_aside(arrival);
                took = true;
            }
            Arrival::Failed(error) => {
                tracing::warn!(%error, "reading the receive queue failed");
                break;
            }
        }
    }
    drop(order);
    if took {
        endpoint.operations.waiter.ring();
    }
}

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
        match post_patiently(&endpoint, 0) {
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
