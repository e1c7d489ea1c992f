//! The writer's structured events, captured by a global subscriber (the writer is another
//! thread, so a thread-local default would not see them). Its own test binary for that reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use std::sync::{Arc, Mutex};

use common::efa;
use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

#[derive(Debug, Clone)]
struct Captured {
    level: Level,
    thread: String,
    fields: String,
}

struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().expect("capture").push(Captured {
            level: *event.metadata().level(),
            thread: std::thread::current().name().unwrap_or("").to_string(),
            fields: fields.0,
        });
    }
}

#[test]
fn the_writer_reports_inserts_evictions_removals_and_failures_and_hits_report_nothing() {
    let events = Arc::new(Mutex::new(Vec::new()));
    tracing_subscriber::registry()
        .with(Capture(Arc::clone(&events)))
        .with(tracing_subscriber::filter::LevelFilter::DEBUG)
        .init();

    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone());
    let old = efa(1, 7, 1);
    cache.pin().resolve(1, &old).expect("insert");
    cache.pin().resolve(2, &old).expect("share");
    assert_eq!(
        Err(DmaError::WouldBlock),
        cache
            .pin()
            .resolve(3, &efa(1, 7, 2))
            .map(|peer| peer.fi_addr())
    );
    cache.quiesce();

    // Hits, on this thread, must log nothing.
    let hits_before = events.lock().expect("capture").len();
    {
        let pinned = cache.pin();
        for _ in 0..1000 {
            pinned.resolve(3, &efa(1, 7, 2)).expect("a hit");
        }
    }
    let during_hits: Vec<Captured> = events.lock().expect("capture")[hits_before..].to_vec();
    assert!(
        during_hits
            .iter()
            .all(|event| event.thread == "dma-av-writer"),
        "the hit path logged: {during_hits:?}"
    );

    av.fail_next_remove(DmaError::Fabric {
        call: "fi_av_remove",
        code: -22,
        message: "injected".into(),
    });
    cache.release(3);
    cache.quiesce();
    // A queued miss that fails is logged, and kept for the next try_resolve.
    av.fail_next_insert(DmaError::Fabric {
        call: "fi_av_insert",
        code: -12,
        message: "injected".into(),
    });
    let queued = || {
        cache
            .pin()
            .try_resolve(9, &efa(4, 4, 4))
            .map(|peer| peer.fi_addr())
    };
    assert_eq!(Err(DmaError::WouldBlock), queued());
    cache.quiesce();
    assert!(matches!(queued(), Err(DmaError::Fabric { code: -12, .. })));
    drop(cache);

    let events = events.lock().expect("capture").clone();
    // The writer's events come from whichever thread holds its role: the background thread, or
    // this one, whose misses serve themselves.
    let here = std::thread::current().name().unwrap_or("").to_string();
    let writer = |needle: &str, level: Level| {
        events.iter().any(|event| {
            (event.thread == "dma-av-writer" || event.thread == here)
                && event.level == level
                && event.fields.contains(needle)
        })
    };
    assert!(writer("op=\"insert\"", Level::DEBUG), "insert: {events:#?}");
    assert!(
        writer("op=\"evict\" client=3 evicted=2", Level::WARN),
        "eviction with its count: {events:#?}"
    );
    assert!(
        writer("op=\"remove\"", Level::DEBUG),
        "removal: {events:#?}"
    );
    assert!(
        writer("op=\"remove_failed\"", Level::WARN),
        "failed removal: {events:#?}"
    );
    assert!(
        writer("op=\"queued_miss_failed\" client=9", Level::WARN),
        "failed queued miss: {events:#?}"
    );
}
