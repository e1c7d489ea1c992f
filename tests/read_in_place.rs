//! Reading a `Remote` region in place after a notification (issue 42 item 7), with real tcp
//! peers: a peer's `write_with_data` lands, the target reads the notification, rekeys the region
//! and views the bytes where they lie; a peer that writes under the revoked key while the view
//! lives is refused, every time, and the view's bytes stay the notified write's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{DmaError, Exposure, LibfabricEndpoint, MemoryRegion, Notification};
use testkit::{PATIENCE, rma_tcp, wait_until, with_progress};

const LEN: usize = 64 << 10;

fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN).map(|at| (at % 251) as u8 ^ seed).collect()
}

/// `client` writes `pattern(seed)` into `remote` of `target` with `data`, and answers the
/// write's result (or the post's error).
fn write_with_data(
    client: &LibfabricEndpoint,
    target: &LibfabricEndpoint,
    remote: dma_libfabric::RemoteRegion,
    seed: u8,
    data: u64,
) -> Result<(), DmaError> {
    let source = client.register(LEN).expect("client memory");
    source.write_bytes(0, &pattern(seed)).expect("fits");
    let lease = client
        .cache()
        .lease(1, &target.local_address().expect("an address"))
        .expect("a lease");
    with_progress(target, || {
        client.write_with_data(
            lease,
            source.segment(0, LEN).expect("segment"),
            remote,
            data,
            data,
        )?;
        client.wait_for(data, PATIENCE).expect("completed").result
    })
}

/// Wait for the notification carrying `data` on `target`.
fn notified(target: &LibfabricEndpoint, data: u64) {
    let mut seen: Vec<Notification> = Vec::new();
    wait_until("the write's notification", || {
        target.poll_notifications(&mut seen);
        seen.iter().any(|notification| data == notification.data)
    });
}

/// The notified write's bytes, viewed where they lie: the view's address is the `Vec`'s, and its
/// bytes are the pattern. Fails if the view copies, or reads other bytes.
#[test]
fn a_notified_write_is_viewed_in_place() {
    let target = rma_tcp();
    let client = rma_tcp();
    let buffer = vec![0_u8; LEN];
    let address = buffer.as_ptr() as usize;
    let mut region = target
        .register_buffer(buffer, Exposure::Remote)
        .expect("registered");
    assert_eq!(
        Ok(()),
        write_with_data(&client, &target, region.remote(), 7, 70)
    );
    notified(&target, 70);
    target.rekey(&mut region).expect("rekeyed");
    let view = region.view(0, LEN).expect("in range");
    assert_eq!(address, view.as_ptr() as usize, "the buffer's own bytes");
    assert!(view.matches(&pattern(7)));
    let mismatched = view.bytes().zip(pattern(7)).filter(|(a, b)| a != b).count();
    assert_eq!(0, mismatched);
    let tail = region.view(LEN - 3, 3).expect("in range");
    assert_eq!(pattern(7)[LEN - 3..], tail.bytes().collect::<Vec<u8>>());
}

/// A hostile peer that keeps the old key and writes while the target views: every one of its
/// writes is refused (the write's completion is an error, or, once the provider reported the
/// connection dropped, the post answers `PeerUnreachable`), none lands, no notification of its
/// arrives, and the view still reads the notified write's bytes. The new key then takes a
/// well-behaved peer's write. Fails if a view can be taken with the old key still open (checked
/// by hand: `rekey` without its close lets all 8 writes land, and the view reads them).
#[test]
fn a_peer_writing_under_the_revoked_key_while_viewed_is_refused() {
    const ATTEMPTS: u64 = 8;
    let target = rma_tcp();
    let hostile = rma_tcp();
    let mut region: MemoryRegion<'_, Vec<u8>> = target
        .register_buffer(vec![0_u8; LEN], Exposure::Remote)
        .expect("registered");
    let old = region.remote();
    assert_eq!(Ok(()), write_with_data(&hostile, &target, old, 1, 10));
    notified(&target, 10);
    target.rekey(&mut region).expect("rekeyed");
    {
        // The view lives until the end of this block: the writes are made while it does.
        let view = region.view(0, LEN).expect("in range");
        let (mut refused, mut landed) = (0, 0);
        for attempt in 0..ATTEMPTS {
            match write_with_data(&hostile, &target, old, 0xee, 100 + attempt) {
                Ok(()) => landed += 1,
                Err(_) => refused += 1,
            }
        }
        let mut seen = Vec::new();
        target.poll_notifications(&mut seen);
        let hostile_notifications = seen.iter().filter(|n| 100 <= n.data).count();
        let mismatched = view.bytes().zip(pattern(1)).filter(|(a, b)| a != b).count();
        println!(
            "{ATTEMPTS} writes under the revoked key while viewed: {refused} refused, {landed} \
             landed, {hostile_notifications} notified; {mismatched} bytes of the view changed"
        );
        assert_eq!((ATTEMPTS, 0), (refused, landed));
        assert_eq!(0, hostile_notifications);
        assert_eq!(0, mismatched);
        assert!(view.matches(&pattern(1)));
    }

    let fresh = rma_tcp();
    assert_eq!(
        Ok(()),
        write_with_data(&fresh, &target, region.remote(), 2, 20)
    );
    notified(&target, 20);
    assert!(region.view(0, LEN).expect("in range").matches(&pattern(2)));
}
