//! The `tcp_av` target: the checks live in `dma_libfabric::fuzzing::check_tcp_av`, so that
//! `cargo test` replays this target's corpus on stable.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dma_libfabric::fuzzing::check_tcp_av(data);
});
