//! The `address` target: the checks live in `testkit::fuzzing::check_address`, so that
//! `cargo test` replays this target's corpus on stable.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    testkit::fuzzing::check_address(data);
});
