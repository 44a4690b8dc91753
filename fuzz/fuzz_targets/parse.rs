#![no_main]
//! See `sluice_fuzz::parse`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::parse(data));
