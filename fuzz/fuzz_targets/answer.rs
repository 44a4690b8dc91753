#![no_main]
//! See `sluice_fuzz::answer`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::answer(data));
