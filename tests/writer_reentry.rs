//! Code that runs under the writer role and calls back into its cache: a `tracing` layer that
//! reacts to the writer's own events, on whichever thread holds the role. Every call answers at once (an error, or applied without
//! waiting); none deadlocks the writer. One test in its own binary, since it installs the
//! process's global subscriber.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::cell::Cell;
use std::sync::{Mutex, OnceLock};

use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
use testkit::efa;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Clients registered on one shared entry, more than the writer's inbox holds, whom the layer
/// releases from the writer thread.
const SHARED_CLIENTS: u64 = AddressCache::<ModelAv>::INBOX_BOUND as u64 + 10;
const FIRST_SHARED: u64 = 1_000;

static CACHE: OnceLock<&'static AddressCache<ModelAv>> = OnceLock::new();
/// What each call from the writer thread answered.
static ANSWERS: Mutex<Vec<String>> = Mutex::new(Vec::new());

std::thread_local! {
    /// Set while the layer is calling the cache, so the calls' own events do not call it again.
    static CALLING: Cell<bool> = const { Cell::new(false) };
}

/// On the writer's eviction warning, call every entry point of the cache from the writer thread.
struct CallsBack;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CallsBack {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        // The writer's own events are emitted under its role, by whichever thread holds it (the
        // background thread, or a caller whose miss won the role).
        let from_writer = event
            .metadata()
            .module_path()
            .is_some_and(|module| module.starts_with("dma_libfabric::cache::writer"));
        if !from_writer
            || *event.metadata().level() != tracing::Level::WARN
            || CALLING.with(Cell::get)
        {
            return;
        }
        let Some(cache) = CACHE.get() else {
            return;
        };
        CALLING.with(|calling| calling.set(true));
        let mut answers = Vec::new();
        cache.quiesce();
        answers.push("quiesce returned".to_string());
        answers.push(format!("lease: {:?}", cache.lease(10, &efa(9, 9, 9)).err()));
        answers.push(format!(
            "lease_within: {:?}",
            cache
                .lease_within(11, &efa(9, 9, 9), std::time::Duration::MAX)
                .err()
        ));
        answers.push(format!(
            "resolve: {:?}",
            cache.pin().resolve(12, &efa(8, 8, 8)).err()
        ));
        // More releases than the inbox holds, of clients that are really registered: none may
        // wait for the writer, and none may be lost (the end of the test finds the AV empty).
        for client in 0..SHARED_CLIENTS {
            cache.release(FIRST_SHARED + client);
        }
        answers.push("releases returned".to_string());
        answers.push(format!("stats: {}", cache.stats().entries));
        CALLING.with(|calling| calling.set(false));
        if let Ok(mut recorded) = ANSWERS.lock() {
            recorded.extend(answers);
        }
    }
}

#[test]
fn calls_from_the_writer_thread_answer_at_once_and_the_writer_goes_on() {
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(CallsBack))
        .expect("the only subscriber of this binary");
    let av = ModelAv::new(AddressFormat::Efa);
    let cache: &'static AddressCache<ModelAv> =
        Box::leak(Box::new(AddressCache::with_backend(av.clone())));
    CACHE.set(cache).expect("set once");
    {
        let shared = efa(6, 6, 6);
        let pinned = cache.pin();
        for client in FIRST_SHARED..FIRST_SHARED + SHARED_CLIENTS {
            pinned
                .resolve(client, &shared)
                .expect("a client of the shared entry");
        }
    }
    assert_eq!(SHARED_CLIENTS, cache.stats().clients);

    cache
        .pin()
        .resolve(1, &efa(1, 7, 1))
        .expect("the old incarnation");
    // A new QKEY on the same slot: the writer warns of the eviction, and the layer calls back.
    assert_eq!(
        Err(DmaError::WouldBlock),
        cache
            .pin()
            .resolve(2, &efa(1, 7, 2))
            .map(|peer| peer.fi_addr())
    );
    let answers = ANSWERS.lock().expect("answers").clone();
    assert_eq!(6, answers.len(), "{answers:?}");
    for (index, call) in [(1, "lease"), (2, "lease_within"), (3, "resolve")] {
        assert!(
            answers[index].starts_with(call) && answers[index].contains("writer thread"),
            "{call} from the writer thread answers InvalidArgument: {}",
            answers[index]
        );
    }

    // The writer goes on: the parked incarnation gets in, and new misses are answered.
    cache.quiesce();
    let peer = cache.lease(2, &efa(1, 7, 2)).expect("admitted");
    assert_eq!(Some(efa(1, 7, 2)), av.lookup(peer.fi_addr()));
    drop(peer);
    cache.pin().resolve(3, &efa(2, 1, 1)).expect("a later miss");
    for client in [2, 3] {
        cache.release(client);
    }
    cache.quiesce();
    assert_eq!(
        0,
        cache.stats().clients,
        "every release from the writer thread was applied"
    );
    assert!(av.is_empty(), "{:?}", av.events());
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}
