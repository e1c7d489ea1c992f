//! The `cache_ops` target: the checks live in `testkit::fuzzing::check_cache_ops`, so that
//! `cargo test` replays this target's corpus on stable.
#![no_main]

/// Counts the heap, so every input is checked against the cache's heap bound.
#[global_allocator]
static HEAP: testkit::fuzzing::heap::Counting = testkit::fuzzing::heap::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    testkit::fuzzing::check_cache_ops(data);
});
