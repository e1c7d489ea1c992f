//! A peer whose connection the provider reports reset or refused is `DmaError::PeerUnreachable`,
//! naming the peer, in the operation's completion, as soon as the provider reports it: real
//! tcp;ofi_rxm endpoints on 127.0.0.1, the peer closed with writes in flight to it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::DmaError;
use testkit::{PATIENCE, rma_tcp, with_progress};

#[test]
fn writes_to_a_peer_that_closed_complete_with_peer_unreachable() {
    let server = rma_tcp();
    let len = 64 << 10;
    let source = server.register(len).unwrap();
    let client = rma_tcp();
    let target = client.register(128 * len).unwrap();
    let address = client.local_address().unwrap();
    let remote = target.remote();
    let fi_addr = with_progress(&client, || {
        let lease = server.peers().lease(1, &address).unwrap();
        let fi_addr = lease.fi_addr();
        server
            .write(
                lease,
                source.segment(0, len).unwrap(),
                remote.slice(0, len as u64).unwrap(),
                0,
            )
            .unwrap();
        server
            .wait_for(0, PATIENCE)
            .expect("connected")
            .result
            .unwrap();
        // More than the socket buffers hold without a reader: some are in flight at the close.
        for id in 1..128 {
            let lease = server.peers().lease(1, &address).unwrap();
            let slot = remote.slice(id * len as u64, len as u64).unwrap();
            server
                .write(lease, source.segment(0, len).unwrap(), slot, id)
                .unwrap();
        }
        fi_addr
    });
    drop(target);
    drop(client);
    let mut unreachable = 0;
    for id in 1..128 {
        let done = server.wait_for(id, PATIENCE).expect("every write resolves");
        match done.result {
            Ok(()) => {}
            Err(DmaError::PeerUnreachable { peer, reason }) => {
                assert_eq!(fi_addr, peer);
                assert!(reason.starts_with("fi_write"), "{reason}");
                unreachable += 1;
            }
            // libfabric 2.6.0 may cancel a write still queued on the closed connection with a
            // bare FI_ECANCELED, no provider error to say why: not mapped, and allowed here.
            Err(DmaError::Fabric {
                call: "fi_write",
                code: -125,
                message,
            }) if !message.contains("provider error") => {}
            Err(other) => panic!("write {id}: expected PeerUnreachable, got {other}"),
        }
    }
    eprintln!("{unreachable} of 127 writes answered PeerUnreachable");
    assert!(unreachable > 0, "no write was in flight at the close");
    assert_eq!(0, server.operations_in_flight());
    assert_eq!(0, server.peers().stats().leases);
}
