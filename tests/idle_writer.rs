//! Removals held by leases cost the writer nothing while it waits: it parks until the last lease
//! of one is dropped, instead of waking on a tick to look at them all again. One test in its own
//! binary, so that the process has one writer thread to watch.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
use testkit::sockaddr;

/// The writer thread's id, found by its name.
fn writer_thread() -> String {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
    let writers: Vec<String> = tasks
        .filter_map(Result::ok)
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.trim() == "dma-av-writer")
        })
        .map(|task| task.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(1, writers.len(), "one writer in this process: {writers:?}");
    writers[0].clone()
}

/// The thread's scheduler state (`S` while parked) and how many times it has been switched in.
fn scheduling(thread: &str) -> (char, u64) {
    let status = std::fs::read_to_string(format!("/proc/self/task/{thread}/status"))
        .expect("the writer's status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
            .expect("a status field")
            .to_string()
    };
    let state = field("State:").chars().next().expect("a state");
    let switches = field("voluntary_ctxt_switches:")
        .parse::<u64>()
        .expect("a count")
        + field("nonvoluntary_ctxt_switches:")
            .parse::<u64>()
            .expect("a count");
    (state, switches)
}

#[test]
fn a_writer_with_only_lease_held_removals_stays_parked() {
    let av = ModelAv::new(AddressFormat::Opaque);
    let cache = AddressCache::with_backend(av.clone());
    let leases: Vec<_> = (0..1_000)
        .map(|client| {
            cache
                .lease(client, &sockaddr(client as u32))
                .expect("a lease")
        })
        .collect();
    let live = sockaddr(5_000);
    cache
        .pin()
        .resolve(5_000, &live)
        .expect("a live entry to hit");
    for client in 0..1_000 {
        cache.release(client);
    }
    cache.quiesce_with_patience(std::time::Duration::ZERO);
    assert_eq!(1_000, cache.stats().removals_awaiting_leases);

    // Wait for the writer to park once its poll after the last request runs out.
    let writer = writer_thread();
    while scheduling(&writer).0 != 'S' {
        std::thread::yield_now();
    }
    let (_, before) = scheduling(&writer);

    // Traffic that never reaches the writer: hits. The old writer woke on a tick (up to 10 ms)
    // for as long as removals were held, and rescanned every one of them each time.
    let mut checksum = 0;
    for _ in 0..200_000 {
        let pinned = cache.pin();
        checksum ^= pinned.resolve(5_000, &live).expect("a hit").fi_addr();
    }
    std::hint::black_box(checksum);
    let (state, after) = scheduling(&writer);
    assert_eq!(
        ('S', before),
        (state, after),
        "the writer woke {} times while only leases held its removals",
        after - before
    );

    drop(leases);
    cache.release(5_000);
    cache.quiesce();
    assert!(av.is_empty());
    assert_eq!(0, cache.stats().removals_awaiting_leases);
}
