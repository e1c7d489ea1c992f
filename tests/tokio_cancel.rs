//! Cancel safety of the async API, attacked: thousands of RMA write and read futures dropped at
//! random points (never polled, once, a few times, or awaited to the end) against a peer whose
//! memory is checked byte by byte afterwards, on real tcp;ofi_rxm endpoints on 127.0.0.1, on the
//! current-thread and the multi-thread runtime.
//!
//! Each write has its own 256-byte slot at the peer and its own freshly registered source, dropped
//! right after its future: were a dropped future's buffer freed or reused while the provider still
//! read it, the next registration (which reuses parked memory of its size class) would overwrite
//! it, and the slot would hold another write's bytes. After the endpoint drains: every slot holds
//! its own pattern or nothing (0 torn, 0 misdirected), `operations_in_flight() == 0`, no lease
//! is left, and the heap (every thread's, counted by this binary's global allocator) is back to
//! where it was after a warm-up, but for the dropped regions' buffers the endpoint parks.
#![cfg(feature = "tokio")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use dma_libfabric::asynchronous::AsyncEndpoint;
use dma_libfabric::{Configuration, LibfabricEndpoint};
use testkit::fuzzing::heap;
use testkit::{PATIENCE, Random};

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

/// The heap count is the process's: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What the heap may hold after the run beyond the warm-up's, parked buffers aside: far less than
/// one leaked future state (about 100 B) per dropped future.
const HEAP_SLACK: isize = 128 << 10;

const SLOT: usize = 256;

fn rma_endpoint() -> AsyncEndpoint {
    let configuration = Configuration {
        rma: true,
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
    AsyncEndpoint::new(Arc::new(endpoint)).unwrap()
}

/// Slot `index`'s bytes: different in every slot and at every offset, never all zero.
fn pattern(index: usize) -> Vec<u8> {
    (0..SLOT)
        .map(|at| ((index * 131 + at * 7) % 255) as u8 + 1)
        .collect()
}

/// Poll `future` once, from inside the task.
async fn poll_once<F: Future>(mut future: std::pin::Pin<&mut F>) -> Option<F::Output> {
    std::future::poll_fn(|context| {
        Poll::Ready(match future.as_mut().poll(context) {
            Poll::Ready(output) => Some(output),
            Poll::Pending => None,
        })
    })
    .await
}

/// How far to take a future: never polled, polled 1 to 3 times (yielding in between), or to
/// its end.
fn polls(rng: &mut Random) -> Option<u64> {
    match rng.below(5) {
        4 => None,
        n => Some(n),
    }
}

async fn drop_at_random(operations: usize, seed: u64) {
    let server = rma_endpoint();
    let client = rma_endpoint();
    let targets = client.endpoint().register(operations * SLOT).unwrap();
    let sources = client.endpoint().register(operations * SLOT).unwrap();
    for index in 0..operations {
        sources.write_bytes(index * SLOT, &pattern(index)).unwrap();
    }
    let address = client.endpoint().local_address().unwrap();
    // Warm-up: the connection, the runtime's and the endpoints' own structures at their size.
    for round in 0..64 {
        let local = server.endpoint().register(SLOT).unwrap();
        let lease = server.lease(1, &address).await.unwrap();
        let slot = targets.remote().slice(0, SLOT as u64).unwrap();
        let done = server
            .write(lease.lease(), local.segment(0, SLOT).unwrap(), slot)
            .await
            .unwrap();
        assert_eq!(Ok(()), done.result, "warm-up {round}");
    }
    tokio::task::yield_now().await;
    let (live, parked) = (heap::live(), server.endpoint().parked_memory() as isize);
    let mut rng = Random::new(seed);
    let (mut awaited_writes, mut awaited_reads, mut dropped) = (Vec::new(), 0, 0);
    for index in 0..operations {
        let write = 0 == index % 2;
        let local = server.endpoint().register(SLOT).unwrap();
        if write {
            local.write_bytes(0, &pattern(index)).unwrap();
        }
        let lease = server.lease(1, &address).await.unwrap();
        let slot = (index * SLOT) as u64;
        let segment = local.segment(0, SLOT).unwrap();
        let polls = polls(&mut rng);
        {
            let mut future = pin!(async {
                if write {
                    server
                        .write(
                            lease.lease(),
                            segment,
                            targets.remote().slice(slot, SLOT as u64).unwrap(),
                        )
                        .await
                } else {
                    server
                        .read(
                            lease.lease(),
                            segment,
                            sources.remote().slice(slot, SLOT as u64).unwrap(),
                        )
                        .await
                }
            });
            match polls {
                None => {
                    let done = tokio::time::timeout(PATIENCE, future)
                        .await
                        .expect("an awaited operation never resolved")
                        .unwrap();
                    assert_eq!(Ok(()), done.result, "operation {index}");
                    if write {
                        awaited_writes.push(index);
                    } else {
                        let mut seen = vec![0; SLOT];
                        local.read_bytes(0, &mut seen).unwrap();
                        assert_eq!(pattern(index), seen, "read {index} fetched other bytes");
                        awaited_reads += 1;
                    }
                }
                Some(count) => {
                    for _ in 0..count {
                        if poll_once(future.as_mut()).await.is_some() {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                    dropped += 1;
                }
            }
        }
        drop(local); // parked by the endpoint, and reused by a later registration
    }
    assert!(dropped > operations / 2 && awaited_reads > 0 && !awaited_writes.is_empty());

    // Drain: the drivers reap every dropped future's operation.
    let deadline = Instant::now() + PATIENCE;
    while 0 < server.endpoint().operations_in_flight() {
        assert!(Instant::now() < deadline, "operations never completed");
        tokio::task::yield_now().await;
    }
    assert_eq!(
        0,
        server.endpoint().cache().stats().leases,
        "a lease outlived its operation"
    );
    let grown = heap::live() - live - (server.endpoint().parked_memory() as isize - parked);
    eprintln!("heap: {grown} B over {dropped} dropped futures, parked buffers aside");
    assert!(
        grown < HEAP_SLACK,
        "the heap grew by {grown} B over {dropped} dropped futures, parked buffers aside"
    );

    // Every slot holds its own write's bytes or none: wait for the peer to land what it was sent.
    let deadline = Instant::now() + PATIENCE;
    let mut seen = vec![0; SLOT];
    let mut torn = Vec::new();
    for index in (0..operations).step_by(2) {
        loop {
            targets.read_bytes(index * SLOT, &mut seen).unwrap();
            let whole = seen == pattern(index);
            if whole || (seen.iter().all(|&byte| 0 == byte) && !awaited_writes.contains(&index)) {
                break;
            }
            if Instant::now() >= deadline {
                torn.push(index);
                break;
            }
            tokio::task::yield_now().await;
        }
    }
    assert!(torn.is_empty(), "torn or misdirected slots: {torn:?}");
    drop((sources, targets));
}

#[test]
fn dropped_futures_on_the_current_thread_runtime() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(drop_at_random(6_000, 1));
}

#[test]
fn dropped_futures_on_the_multi_thread_runtime() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(drop_at_random(4_000, 2));
}
