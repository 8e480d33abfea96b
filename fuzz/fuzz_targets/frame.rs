//! cargo-fuzz entry for `relay_fuzz::frame` (see fuzz/targets/src/lib.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| relay_fuzz::frame(data));
