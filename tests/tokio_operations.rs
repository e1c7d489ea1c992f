//! Every operation of the sync face on the async face, with its names and arguments less `id`
//! and patience (issue 41, item 2), on real tcp;ofi_rxm endpoints on 127.0.0.1: `send` to a
//! `Peer`, `send_from` and `receive_into` of any size, `receive_from` naming its sender,
//! `write_with_data` and the target's `notification`, `write_gather` and `read_scatter` past
//! the provider's pieces per message (one completion for the whole transfer).
#![cfg(feature = "tokio")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::Arc;

use dma_libfabric::asynchronous::AsyncEndpoint;
use dma_libfabric::{Configuration, LibfabricEndpoint, Operation};
use testkit::PATIENCE;

fn open(receive_buffers: usize) -> AsyncEndpoint {
    let configuration = Configuration {
        rma: true,
        receive_buffers,
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
    AsyncEndpoint::new(Arc::new(endpoint)).unwrap()
}

async fn bounded<F: std::future::Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} never resolved"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_any_size_from_and_into_registered_memory_name_their_sender() {
    let server = open(64);
    // One buffer of its own: receives match in the order they were posted, so the endpoint's own
    // buffer takes the first message and `receive_into`'s destination the next.
    let client = open(1);
    let client_address = client.endpoint().local_address().unwrap();
    let server_address = server.endpoint().local_address().unwrap();
    let len = 200_000; // past the copying send's size and rxm's eager limit
    let source = server.endpoint().register(len).unwrap();
    let pattern: Vec<u8> = (0..len).map(|at| (at % 251) as u8).collect();
    source.write_bytes(0, &pattern).unwrap();
    let landing = client.endpoint().register(len).unwrap();

    // The client resolves the server too, so its receives name it.
    let server_on_client = bounded("a lease", client.lease(7, &server_address))
        .await
        .unwrap();
    let lease = bounded("a lease", server.lease(1, &client_address))
        .await
        .unwrap();
    // `join!` polls the receive first: it is posted before anything is sent.
    let (received, (from, sent)) = tokio::join!(
        bounded(
            "a receive_into",
            client.receive_into(landing.segment(0, len).unwrap())
        ),
        async {
            // A copying send to a `Peer`, which the client's own buffer takes, named by
            // `receive_from`; then a message from registered memory, which lands in `landing`.
            {
                let pinned = server.endpoint().cache().pin();
                let peer = pinned.resolve(1, &client_address).unwrap();
                bounded("a send", server.send(peer, b"to a peer"))
                    .await
                    .unwrap();
            }
            let from = bounded("a receive_from", client.receive_from()).await;
            let sent = bounded(
                "a send_from",
                server.send_from(lease.lease(), source.segment(0, len).unwrap()),
            )
            .await;
            (from, sent)
        }
    );
    let from = from.unwrap();
    assert_eq!(b"to a peer".to_vec(), from.message);
    assert_eq!(Some(server_on_client.fi_addr()), from.sender);
    let sent = sent.unwrap();
    assert_eq!(
        (Operation::Send, len, Ok(())),
        (sent.operation, sent.len, sent.result)
    );
    let received = received.unwrap();
    assert_eq!(
        (Operation::Receive, len, Ok(())),
        (received.operation, received.len, received.result)
    );
    assert_eq!(Some(server_on_client.fi_addr()), received.sender);
    let mut seen = vec![0; len];
    landing.read_bytes(0, &mut seen).unwrap();
    assert!(seen == pattern, "receive_into's bytes");
    drop(server_on_client);
    drop(lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_notify_gathers_and_scatters_resolve_to_one_completion() {
    let server = open(64);
    let client = open(64);
    let client_address = client.endpoint().local_address().unwrap();
    let pieces = 3 * server.endpoint().pieces_per_message() + 1; // split into 4 messages
    let piece = 4096;
    let source = server.endpoint().register(pieces * piece).unwrap();
    for at in 0..pieces {
        source
            .write_bytes(at * piece, &vec![at as u8 + 1; piece])
            .unwrap();
    }
    let target = client.endpoint().register(pieces * piece).unwrap();
    let lease = bounded("a lease", server.lease(1, &client_address))
        .await
        .unwrap();

    // A gather of every other piece's neighbour: the pieces in reverse, back to back.
    let sources: Vec<_> = (0..pieces)
        .rev()
        .map(|at| source.segment(at * piece, piece).unwrap())
        .collect();
    let done = bounded(
        "a write_gather",
        server.write_gather(lease.lease(), &sources, target.remote()),
    )
    .await
    .unwrap();
    assert_eq!(
        (Operation::Write, pieces * piece, Ok(())),
        (done.operation, done.len, done.result)
    );
    let mut landed = vec![0; pieces * piece];
    target.read_bytes(0, &mut landed).unwrap();
    for (at, chunk) in landed.chunks(piece).enumerate() {
        assert!(
            chunk.iter().all(|&byte| byte == (pieces - at) as u8),
            "gathered piece {at}"
        );
    }

    // A scatter of the target back into the source's pieces, in order.
    let back = server.endpoint().register(pieces * piece).unwrap();
    let destinations: Vec<_> = (0..pieces)
        .map(|at| back.segment(at * piece, piece).unwrap())
        .collect();
    let done = bounded(
        "a read_scatter",
        server.read_scatter(lease.lease(), &destinations, target.remote()),
    )
    .await
    .unwrap();
    assert_eq!((Operation::Read, Ok(())), (done.operation, done.result));
    let mut scattered = vec![0; pieces * piece];
    back.read_bytes(0, &mut scattered).unwrap();
    assert!(scattered == landed, "the scatter read back the gather");

    // Writes that notify: the target's `notification` resolves to each one's data, in order.
    for data in 1..=20_u64 {
        let done = bounded(
            "a write_with_data",
            server.write_with_data(
                lease.lease(),
                source.segment(0, 64).unwrap(),
                target.remote(),
                data,
            ),
        )
        .await
        .unwrap();
        assert_eq!(Ok(()), done.result);
        let notification = bounded("a notification", client.notification()).await;
        assert_eq!(data, notification.data);
    }
    assert_eq!(0, client.endpoint().dropped_notifications());
    assert_eq!(0, server.endpoint().operations_in_flight());
}
