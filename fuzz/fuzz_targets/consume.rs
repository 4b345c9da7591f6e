//! Foreign DLPack tensors (NULL deleters included) read by the consumers of a validated
//! tensor: `Elements::<T>::adopt` + `as_slice`, the ndarray view (see `handoff_fuzz::consume`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| handoff_fuzz::consume::fuzz_consume(data));
