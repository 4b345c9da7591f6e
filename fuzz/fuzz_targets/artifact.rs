//! Bytes, and mutations of real `jax.export` artifacts, into `Artifact::from_bytes` and,
//! for what parses, `Kernel::compile` on the CPU plugin (see `handoff_fuzz::xla`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| handoff_fuzz::xla::fuzz_artifact(data));
