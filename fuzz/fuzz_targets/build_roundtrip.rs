//! Build a described tree (tar input, any compressor and layout options) and read it
//! back: everything must come back as described (format: `ferofs_fuzz::roundtrip`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ferofs_fuzz::roundtrip::run(data));
