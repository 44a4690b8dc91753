#![no_main]
//! See `sluice_fuzz::rls`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::rls(data));
