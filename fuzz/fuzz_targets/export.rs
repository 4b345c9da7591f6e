//! The export paths (`with_keep_alive`, derived types) and several threads dropping
//! hand-offs and flushing at once (see `handoff_fuzz::export`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| handoff_fuzz::export::fuzz_export(data));
