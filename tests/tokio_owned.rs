//! Tasks own what they use (issue 41, item 3), on real tcp;ofi_rxm endpoints: the accepting side
//! takes each client's lease (`AsyncEndpoint::lease`, an `OwnedLease`) and registers its pages
//! (`AsyncEndpoint::register_buffer`, a `MemoryRegion<'static, Vec<u8>>`), moves them into a
//! task of the client's own with `tokio::spawn`, and a pool of regions is shared between tasks.
//! Both hold the endpoint by `Arc`: the server's last `AsyncEndpoint` may go first.
#![cfg(feature = "tokio")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::Arc;

use dma_libfabric::asynchronous::{AsyncEndpoint, OwnedLease};
use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint, MemoryRegion, Operation};
use testkit::PATIENCE;

fn open() -> AsyncEndpoint {
    let configuration = Configuration {
        rma: true,
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
    AsyncEndpoint::new(Arc::new(endpoint)).unwrap()
}

/// Compiles only for what a spawned task may own.
fn owned_by_a_task<T: Send + 'static>(_: &T) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_per_client_owns_its_lease_and_pages_and_shares_a_pool() {
    const CLIENTS: usize = 8;
    const PAGE: usize = 4096;
    let server = open();
    let clients: Vec<AsyncEndpoint> = (0..CLIENTS).map(|_| open()).collect();
    let inboxes: Vec<_> = clients
        .iter()
        .map(|client| {
            client
                .register_buffer(vec![0_u8; 2 * PAGE], Exposure::Remote)
                .unwrap()
        })
        .collect();
    // A pool of pages every task reads from.
    let pool: Arc<Vec<MemoryRegion<'static, Vec<u8>>>> = Arc::new(
        (0..4)
            .map(|page| {
                server
                    .register_buffer(vec![0xa0 + page as u8; PAGE], Exposure::Local)
                    .unwrap()
            })
            .collect(),
    );
    let mut tasks = Vec::new();
    for (id, (client, inbox)) in clients.iter().zip(&inboxes).enumerate() {
        let address = client.endpoint().local_address().unwrap();
        let lease: OwnedLease = server.lease(id as u64, &address).await.unwrap();
        let own = server
            .register_buffer(vec![id as u8 + 1; PAGE], Exposure::Local)
            .unwrap();
        owned_by_a_task(&lease);
        owned_by_a_task(&own);
        let (server, pool, target) = (server.clone(), Arc::clone(&pool), inbox.remote());
        tasks.push(tokio::spawn(async move {
            let first = server
                .write(
                    lease.lease(),
                    own.segment(0, PAGE)?,
                    target.slice(0, PAGE as u64)?,
                )
                .await?;
            let shared = &pool[id % pool.len()];
            let second = server
                .write(
                    lease.lease(),
                    shared.segment(0, PAGE)?,
                    target.slice(PAGE as u64, PAGE as u64)?,
                )
                .await?;
            Ok::<_, dma_libfabric::DmaError>((first, second))
        }));
    }
    // The server's own handle goes first: the tasks' leases and pages keep the endpoint.
    let endpoint = Arc::downgrade(server.endpoint());
    drop(server);
    for task in tasks {
        let (first, second) = tokio::time::timeout(PATIENCE, task)
            .await
            .expect("a client's task never finished")
            .expect("the task")
            .unwrap();
        for done in [first, second] {
            assert_eq!(
                (Operation::Write, PAGE, Ok(())),
                (done.operation, done.len, done.result)
            );
        }
    }
    for (id, inbox) in inboxes.iter().enumerate() {
        let mut seen = vec![0; 2 * PAGE];
        inbox.read_bytes(0, &mut seen).unwrap();
        assert!(
            seen[..PAGE].iter().all(|&byte| byte == id as u8 + 1),
            "client {id}'s own page"
        );
        let pooled = 0xa0 + (id % 4) as u8;
        assert!(
            seen[PAGE..].iter().all(|&byte| byte == pooled),
            "client {id}'s pooled page"
        );
    }
    assert!(
        endpoint.upgrade().is_some(),
        "the pool still holds the endpoint"
    );
    drop(pool);
}
