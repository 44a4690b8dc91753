#![no_main]
//! See `sluice_fuzz::evaluate`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::evaluate(data));
