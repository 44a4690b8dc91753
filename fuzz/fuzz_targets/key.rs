#![no_main]
//! See `sluice_fuzz::key`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::key(data));
