//! The registry's by-name conversion (`registry::convert`, `Adapter::import`) with
//! random adapter names, values and foreign descriptors, on the host and the mock
//! device only (CPU). See `handoff_fuzz::registry` for the oracle.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| handoff_fuzz::registry::fuzz_convert(data));
