//! Any bytes as an EROFS image to re-encode (see `ferofs_fuzz::input`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ferofs_fuzz::input::run(ferofs_fuzz::input::Kind::Erofs, data));
