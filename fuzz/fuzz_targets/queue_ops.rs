//! cargo-fuzz entry point; the body is `graph_relay_fuzz::queue_ops`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| graph_relay_fuzz::queue_ops(data));
