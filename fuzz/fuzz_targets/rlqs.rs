#![no_main]
//! See `sluice_fuzz::rlqs`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::rlqs(data));
