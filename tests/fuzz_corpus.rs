//! Replays every checked-in fuzz corpus file (regressions included) through the library's
//! checking functions, so CI exercises the fuzz targets on stable without nightly or cargo-fuzz.
//! A few hundred deterministic pseudo-random inputs per target go through them too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use testkit::fuzzing;

/// Counts the heap, so `cache_ops` inputs are checked against the cache's heap bound here too.
#[global_allocator]
static HEAP: fuzzing::heap::Counting = fuzzing::heap::Counting;

/// The tests of this binary take turns: the heap count is the whole process's.
fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every file of `fuzz/corpus/<target>/`, sorted, so failures name the same file every run.
fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no seeds", dir.display());
    files
}

fn replay(target: &str, check: fn(&[u8])) {
    let _turn = turn();
    for file in corpus(target) {
        let data = std::fs::read(&file).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(
            outcome.is_ok(),
            "{target}: {} fails; reproduce with `cargo +nightly fuzz run {target} {}`",
            file.display(),
            file.display()
        );
    }
}

/// Deterministic pseudo-random inputs (xorshift64*), of lengths up to `max_len`.
fn random(check: fn(&[u8]), seed: u64, count: usize, max_len: usize) {
    let _turn = turn();
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for _ in 0..count {
        let len = (next() % max_len as u64) as usize;
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "input {data:?} fails");
    }
}

#[test]
fn address_corpus() {
    replay("address", fuzzing::check_address);
}

#[test]
fn cache_ops_corpus() {
    replay("cache_ops", fuzzing::check_cache_ops);
}

#[test]
fn tcp_av_corpus() {
    replay("tcp_av", fuzzing::check_tcp_av);
}

#[test]
fn address_random_inputs() {
    random(fuzzing::check_address, 0x5eed_0001, 2000, 80);
}

#[test]
fn cache_ops_random_inputs() {
    random(fuzzing::check_cache_ops, 0x5eed_0002, 500, 400);
}

#[test]
fn tcp_av_random_inputs() {
    random(fuzzing::check_tcp_av, 0x5eed_0003, 200, 400);
}

/// `FUZZ_SHOW=<file>` prints what a `cache_ops` or `tcp_av` input does, step by step.
#[test]
fn show() {
    let Ok(file) = std::env::var("FUZZ_SHOW") else {
        return;
    };
    let data = std::fs::read(&file).unwrap();
    let log = if file.contains("tcp_av") {
        fuzzing::run_tcp_av(&data)
    } else {
        fuzzing::run_cache_ops(&data)
    };
    println!("{log}");
}
