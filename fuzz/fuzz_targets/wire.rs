#![no_main]
//! See `sluice_fuzz::wire`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::wire(data));
