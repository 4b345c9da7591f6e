//! Deferred releases through the reaper on a fake device whose streams complete late,
//! when told, or never, and whose calls fail (see `handoff_fuzz::reaper_faults`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| handoff_fuzz::reaper_faults::fuzz_reaper(data));
