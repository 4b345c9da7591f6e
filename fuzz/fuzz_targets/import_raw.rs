//! Arbitrary foreign `DLManagedTensorVersioned` / `DLManagedTensor` descriptors fed
//! to `Handoff::from_raw` / `from_raw_legacy` (see `handoff_fuzz` for what is fuzzed
//! and why that is sound).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| handoff_fuzz::fuzz_import(data));
