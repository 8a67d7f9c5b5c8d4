//! The deflate decoder with a fixed output length (input format: `ferofs_fuzz::decompress_fixed`).
#![no_main]
use ferofs_compress::Algorithm;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ferofs_fuzz::decompress_fixed(Algorithm::Deflate, data));
