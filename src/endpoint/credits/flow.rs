//! The credit protocol on a live endpoint: taking credit before a post, introducing this
//! endpoint, answering introductions, reading grants, and granting as the application reads;
//! module functions on the endpoint, which the message and RMA faces call.
//!
//! Every control message goes out through a send slot outside the per-peer budget
//! (`Sends::prepare_control`), to an index that is live while it is posted: a sender's
//! introduction to the index its caller's `Peer` or lease holds, a grant to the index a pin
//! resolves the introduced client to. A grant that finds no free slot is kept
//! (`Credits::unsent`) and sent, as it then stands, by the next `progress`.

use std::ptr;

use super::wire::{self, CONTROL_SIZE, Control, Kind};
use super::{Admission, GrantDue, What, introduced_client};
use crate::endpoint::LibfabricEndpoint;
use crate::endpoint::deadline::Deadline;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// How many receives of the credit protocol's own an endpoint keeps posted: the control receives
/// (introductions and grants: a control message that finds none waits in the provider until one
/// is posted again, which every read of the receive queue does), and the stray receives.
pub(in crate::endpoint) const CONTROL_RECEIVES: usize = 8;

/// Of the [`CONTROL_RECEIVES`], how many take plain (untagged) messages: a peer that does not
/// speak the protocol (`PeerProtocol::Plain`, a C client) would otherwise fill the provider's
/// queue of unexpected untagged messages, which nothing here reads. Each such message is counted
/// ([`CreditStats::stray_messages`]), logged once at `warn`, and dropped.
const STRAY_RECEIVES: usize = 2;

/// Credit taken for one post: given back if the provider refuses the post.
#[derive(Debug, Clone, Copy)]
pub(in crate::endpoint) struct Taken {
    fi_addr: sys::fi_addr_t,
    incarnation: u32,
    what: What,
}

/// Take credit for `what` to `fi_addr` (a live index of this AV: the caller's `Peer`, lease
/// or promise keeps it), introducing this endpoint first where it has no grant yet. `None`
/// for a plain endpoint, which takes no credit.
///
/// # Errors
/// [`DmaError::WouldBlock`] when the peer has not granted enough yet: the caller waits, with
/// progress, and asks again.
pub(in crate::endpoint) fn take_credit(
    endpoint: &LibfabricEndpoint,
    fi_addr: sys::fi_addr_t,
    what: What,
) -> Result<Option<Taken>, DmaError> {
    let Some(credits) = endpoint.credits.as_deref() else {
        return Ok(None);
    };
    let incarnation = endpoint.operations.peers.unreachable.incarnation(fi_addr);
    for attempt in 0..2 {
        match credits.admit(fi_addr, incarnation, what) {
            Admission::Admitted => {
                return Ok(Some(Taken {
                    fi_addr,
                    incarnation,
                    what,
                }));
            }
            Admission::Introduce(introduction) => {
                if let Err(error) = send_control(endpoint, fi_addr, &introduction) {
                    tracing::debug!(%error, peer = fi_addr, "an introduction was not sent");
                    credits.introduction_failed(fi_addr, incarnation);
                }
            }
            Admission::Wait => {}
        }
        if 0 == attempt {
            // A grant may be waiting in the receive queue.
            endpoint.reap_receive_queue();
        }
    }
    // A grant wakes the queues' waiters; the nap bounds a wait for one that is lost.
    endpoint.operations.waiter.retry_soon();
    Err(DmaError::WouldBlock)
}

/// [`take_credit`](LibfabricEndpoint::take_credit), waiting (with progress) until `deadline` for the
/// grant.
///
/// # Errors
/// [`DmaError::WouldBlock`] when no grant came by `deadline`.
pub(in crate::endpoint) fn wait_for_credit(
    endpoint: &LibfabricEndpoint,
    fi_addr: sys::fi_addr_t,
    what: What,
    deadline: Deadline,
) -> Result<Option<Taken>, DmaError> {
    if endpoint.credits.is_none() {
        return Ok(None);
    }
    endpoint
        .wait_until(deadline, || {
            take_credit(endpoint, fi_addr, what).ok().or_else(|| {
                // The pass may read the grant: take it before sleeping on emptied queues.
                endpoint.progress();
                take_credit(endpoint, fi_addr, what).ok()
            })
        })
        .ok_or(DmaError::WouldBlock)
}

/// Give back credit taken for a post the provider refused.
pub(in crate::endpoint) fn give_back_credit(endpoint: &LibfabricEndpoint, taken: Option<Taken>) {
    if let (Some(credits), Some(taken)) = (endpoint.credits.as_deref(), taken) {
        credits.give_back(taken.fi_addr, taken.incarnation, taken.what);
    }
}

/// The tag a data message of this endpoint's carries: `None` for a plain endpoint.
pub(in crate::endpoint) fn data_tag(endpoint: &LibfabricEndpoint) -> Option<u64> {
    endpoint
        .credits
        .as_deref()
        .map(|credits| wire::tag(Kind::Data, credits.secret()))
}

/// Post `len` bytes at `buffer` (with `desc`) to `fi_addr`: `fi_tsend` with this endpoint's
/// data tag where it is credited, `fi_send` where it is plain.
///
/// # Safety
/// As `fi_send`: the endpoint is open, `fi_addr` a live index of its AV, `buffer` `len`
/// readable bytes (registered, with `desc`, where the provider needs it) and `context` the
/// operation's, all untouched until the completion is read.
pub(in crate::endpoint) unsafe fn post_send(
    endpoint: &LibfabricEndpoint,
    buffer: *const std::ffi::c_void,
    len: usize,
    desc: *mut std::ffi::c_void,
    fi_addr: sys::fi_addr_t,
    context: *mut std::ffi::c_void,
) -> isize {
    match data_tag(endpoint) {
        // SAFETY: the caller's promises are `fi_tsend`'s.
        Some(tag) => unsafe {
            sys::fi_tsend(
                endpoint.handles.ep,
                buffer,
                len,
                desc,
                fi_addr,
                tag,
                context,
            )
        },
        // SAFETY: the caller's promises are `fi_send`'s.
        None => unsafe { sys::fi_send(endpoint.handles.ep, buffer, len, desc, fi_addr, context) },
    }
}

/// Post a receive of the application's messages into `len` bytes at `buffer`: `fi_trecv`
/// for data-tagged messages where the endpoint is credited, `fi_recv` where it is plain.
///
/// # Safety
/// As `fi_recv`: the endpoint is open, `buffer` `len` writable bytes (registered, with
/// `desc`, where the provider needs it) and `context` the operation's, all untouched by
/// anything else until the completion is read.
pub(in crate::endpoint) unsafe fn post_data_receive(
    endpoint: &LibfabricEndpoint,
    buffer: *mut std::ffi::c_void,
    len: usize,
    desc: *mut std::ffi::c_void,
    context: *mut std::ffi::c_void,
) -> isize {
    if endpoint.credits.is_some() {
        let (tag, ignore) = wire::receive_tag(Kind::Data);
        // SAFETY: the caller's promises are `fi_trecv`'s.
        unsafe {
            sys::fi_trecv(
                endpoint.handles.ep,
                buffer,
                len,
                desc,
                sys::FI_ADDR_UNSPEC,
                tag,
                ignore,
                context,
            )
        }
    } else {
        // SAFETY: the caller's promises are `fi_recv`'s.
        unsafe {
            sys::fi_recv(
                endpoint.handles.ep,
                buffer,
                len,
                desc,
                sys::FI_ADDR_UNSPEC,
                context,
            )
        }
    }
}

/// Send `control` to `fi_addr`, a live index of this AV, outside the per-peer budget.
///
/// # Errors
/// [`DmaError::WouldBlock`] when every send slot is in flight or the provider asks to retry;
/// [`DmaError::Fabric`] when `fi_tsend` failed. Nothing is posted on an error.
fn send_control(
    endpoint: &LibfabricEndpoint,
    fi_addr: sys::fi_addr_t,
    control: &Control,
) -> Result<(), DmaError> {
    let Some(credits) = endpoint.credits.as_deref() else {
        return Ok(());
    };
    let mut bytes = [0; CONTROL_SIZE];
    let len = control.encode(&mut bytes);
    let sends = &endpoint.operations.sends;
    let prepared = sends.prepare_control(fi_addr, &bytes[..len]).or_else(|| {
        // A receiver that only reads (`poll_notifications`, `try_receive`) never reads its
        // transmit queue, where its earlier grants' completions wait with their slots.
        endpoint.operations.reap(endpoint.handles.tx_cq);
        sends.prepare_control(fi_addr, &bytes[..len])
    });
    let Some((index, buffer, context)) = prepared else {
        return Err(DmaError::WouldBlock);
    };
    let tag = wire::tag(Kind::Control, credits.secret());
    // SAFETY: the endpoint is open; the caller promises `fi_addr` is live; `buffer` is the
    // slot's copy of the message and `context` the slot's, untouched until its completion
    // is read (the slab outlives the endpoint's handles).
    let code = unsafe {
        sys::fi_tsend(
            endpoint.handles.ep,
            buffer,
            len,
            ptr::null_mut(),
            fi_addr,
            tag,
            context,
        )
    };
    if 0 == code {
        return Ok(());
    }
    sends.unprepare(index);
    if code == -(sys::FI_EAGAIN as isize) {
        return Err(DmaError::WouldBlock);
    }
    Err(DmaError::fabric("fi_tsend", code as i64))
}

/// Send each grant to its introduced client, at the index a pin resolves it to now; one that
/// cannot go now is kept for `progress`. A client released meanwhile gets nothing.
fn send_grants(endpoint: &LibfabricEndpoint, grants: Vec<GrantDue>) {
    let Some(credits) = endpoint.credits.as_deref() else {
        return;
    };
    if grants.is_empty() {
        return;
    }
    let pinned = endpoint.peers.pin();
    for due in grants {
        let Some(peer) = pinned.probe(due.client, &due.address) else {
            continue;
        };
        if send_control(endpoint, peer.fi_addr(), &due.grant).is_err() {
            credits.unsent(due.client);
        }
    }
}

/// Send the grants kept for lack of a slot (for `progress`).
pub(in crate::endpoint) fn send_unsent_grants(endpoint: &LibfabricEndpoint) {
    if let Some(credits) = endpoint.credits.as_deref() {
        let unsent = credits.take_unsent();
        send_grants(endpoint, unsent);
    }
}

/// The application read a message of `len` bytes whose tag is `tag` (or, `tag` `None`, a
/// notification from the sender at `sender`): pay its credit back to the pool and send the
/// grants that are due. Returns who sent it: on a credited endpoint the index of the sender
/// that proved the secret the tag carries (`None`: no introduced sender holds it), elsewhere
/// `sender` as the provider named it.
pub(in crate::endpoint) fn consumed(
    endpoint: &LibfabricEndpoint,
    tag: Option<u64>,
    sender: Option<sys::fi_addr_t>,
    what: What,
) -> Option<sys::fi_addr_t> {
    let Some(credits) = endpoint.credits.as_deref() else {
        return sender;
    };
    let tagged = tag.map(wire::secret_of);
    let (proven, grants) = credits.consumed(tagged, sender.unwrap_or(sys::FI_ADDR_UNSPEC), what);
    send_grants(endpoint, grants);
    proven
}

/// The error a data message of another protocol version answers, where the endpoint is
/// credited (`None` where the version is ours, or the endpoint plain).
pub(in crate::endpoint) fn foreign_version(
    endpoint: &LibfabricEndpoint,
    tag: u64,
) -> Option<DmaError> {
    endpoint.credits.as_ref()?;
    let version = wire::version_of(tag);
    (wire::VERSION != version).then(|| DmaError::Fabric {
        call: "fi_cq_readfrom",
        code: -i64::from(sys::FI_EINVAL),
        message: format!(
            "a message of protocol version {version}, where this endpoint speaks {}: the \
             peer runs another release of dma-libfabric (PeerProtocol::Credited); the \
             message was dropped",
            wire::VERSION
        ),
    })
}

/// A control message arrived in control slot `index` (its length, or its error): act on it,
/// and post the slot again. The caller read its completion and owns the slot.
pub(in crate::endpoint) fn control_arrived(
    endpoint: &LibfabricEndpoint,
    index: usize,
    outcome: Result<usize, DmaError>,
) {
    if index >= CONTROL_RECEIVES - STRAY_RECEIVES {
        stray_arrived(endpoint, index);
        return;
    }
    let bytes = match (outcome, endpoint.controls.get(index)) {
        // SAFETY: this thread read the slot's completion and has not re-posted it.
        (Ok(len), Some(slot)) => unsafe { slot.received(len) },
        (Ok(_), None) => return,
        (Err(error), _) => Err(error),
    };
    match bytes.map(|bytes| Control::decode(&bytes)) {
        Ok(Ok(Control::Introduction {
            secret,
            reply_to,
            address,
        })) => introduced(endpoint, secret, reply_to, &address),
        Ok(Ok(Control::Grant {
            secret,
            reply_to,
            granted,
        })) => grant_arrived(endpoint, secret, reply_to, granted),
        Ok(Err(malformed)) => tracing::warn!(%malformed, "a control message was refused"),
        Err(error) => tracing::warn!(%error, "a control receive failed"),
    }
    if let Err(error) = post_control(endpoint, index) {
        tracing::warn!(%error, index, "could not re-post a control receive; will retry");
        endpoint.controls.defer_post(index);
    }
}

/// A plain message arrived in stray slot `index` (the caller owns it): counted, dropped, and
/// the slot posted again.
fn stray_arrived(endpoint: &LibfabricEndpoint, index: usize) {
    if let Some(credits) = endpoint.credits.as_deref() {
        if 0 == credits.stray() {
            tracing::warn!(
                "a plain (untagged) message arrived at a credited endpoint: the peer does not \
                 speak the credit protocol (PeerProtocol::Plain on one side only?); it was \
                 dropped, and so will every such message be (CreditStats::stray_messages)"
            );
        }
    }
    if let Err(error) = post_control(endpoint, index) {
        tracing::warn!(%error, index, "could not re-post a stray receive; will retry");
        endpoint.controls.defer_post(index);
    }
}

/// A grant arrived for the peer incarnation `reply_to` names: taken if its granter proved
/// the secret sealed in the address this endpoint resolved there (or that address was bare),
/// refused and counted otherwise.
fn grant_arrived(endpoint: &LibfabricEndpoint, secret: u64, reply_to: u64, granted: wire::Counts) {
    let Some(credits) = endpoint.credits.as_deref() else {
        return;
    };
    let (fi_addr, _) = super::from_reply_to(reply_to);
    match endpoint.operations.peers.secret_at(fi_addr) {
        Some(sealed) if sealed != wire::tagged_secret(secret) => {
            if 0 == credits.refuse_grant() {
                tracing::warn!(
                    peer = fi_addr,
                    "a grant came from a peer that did not prove the secret sealed in the \
                     address resolved at its index (another process at that port?): \
                     refused, and nothing is sent to it (CreditStats::refused_grants)"
                );
            }
        }
        _ => {
            credits.granted(secret, reply_to, granted);
        }
    }
}

/// A sender introduced itself: check that its address is sealed with the secret it
/// introduced itself with, resolve it under its client, grant it its first window, and
/// release the sender it replaced on that index.
fn introduced(endpoint: &LibfabricEndpoint, secret: u64, reply_to: u64, address: &[u8]) {
    let Some(credits) = endpoint.credits.as_deref() else {
        return;
    };
    let sealed = crate::address::secret_of(address, endpoint.peers.address_len());
    if Ok(Some(wire::tagged_secret(secret))) != sealed {
        if 0 == credits.refuse_introduction() {
            tracing::warn!(
                "an introduction's address was not sealed with its secret: refused, no grant \
                 (CreditStats::refused_introductions)"
            );
        }
        return;
    }
    let client = introduced_client(secret);
    let pinned = endpoint.peers.pin();
    let fi_addr = match pinned.resolve(client, address) {
        Ok(peer) => peer.fi_addr(),
        Err(error) => {
            credits.refuse_introduction();
            tracing::warn!(%error, "an introduced sender could not be resolved: no grant");
            return;
        }
    };
    let (grant, replaced) = credits.introduce(secret, reply_to, fi_addr, client, address);
    if let Some(grant) = grant {
        if send_control(endpoint, fi_addr, &grant.grant).is_err() {
            credits.unsent(client);
        }
    }
    drop(pinned);
    if let Some(replaced) = replaced {
        endpoint.peers.release(replaced);
    }
}

/// Post control slot `index` (the caller owns it).
pub(in crate::endpoint) fn post_control(
    endpoint: &LibfabricEndpoint,
    index: usize,
) -> Result<(), DmaError> {
    let Some(slot) = endpoint.controls.get(index) else {
        return Ok(());
    };
    let (buffer, len) = slot.buffer();
    if index >= CONTROL_RECEIVES - STRAY_RECEIVES {
        // SAFETY: as below, for an untagged receive.
        let code = unsafe {
            sys::fi_recv(
                endpoint.handles.ep,
                buffer,
                len,
                ptr::null_mut(),
                sys::FI_ADDR_UNSPEC,
                slot.context(),
            )
        };
        return match code {
            0 => Ok(()),
            code if code == -(sys::FI_EAGAIN as isize) => Err(DmaError::WouldBlock),
            code => Err(DmaError::fabric("fi_recv", code as i64)),
        };
    }
    let (tag, ignore) = wire::receive_tag(Kind::Control);
    // SAFETY: the endpoint is open, and the slot's buffer and context live in the slab,
    // which outlives the endpoint's libfabric objects; this slot is not posted (new, or its
    // completion was read by this thread, or taken from the unposted list).
    let code = unsafe {
        sys::fi_trecv(
            endpoint.handles.ep,
            buffer,
            len,
            ptr::null_mut(),
            sys::FI_ADDR_UNSPEC,
            tag,
            ignore,
            slot.context(),
        )
    };
    match code {
        0 => Ok(()),
        code if code == -(sys::FI_EAGAIN as isize) => Err(DmaError::WouldBlock),
        code => Err(DmaError::fabric("fi_trecv", code as i64)),
    }
}

/// Post again every control slot whose re-post failed.
pub(in crate::endpoint) fn repost_controls(endpoint: &LibfabricEndpoint) {
    for index in endpoint.controls.take_unposted() {
        if post_control(endpoint, index).is_err() {
            endpoint.controls.defer_post(index);
        }
    }
}
