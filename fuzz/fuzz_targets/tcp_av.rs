//! The `tcp_av` target: the checks live in `testkit::fuzzing::check_tcp_av`, so that
//! `cargo test` replays this target's corpus on stable.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    testkit::fuzzing::check_tcp_av(data);
});
