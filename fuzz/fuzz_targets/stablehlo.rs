//! StableHLO text and bytecode into handoff-xla up to where it parses anything itself:
//! `Source::from_bytes`, `Program::text`, `hlo::parameters` (see `handoff_fuzz::xla`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| handoff_fuzz::xla::fuzz_stablehlo(data));
