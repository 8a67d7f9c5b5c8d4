//! The compressed index mapping: the fuzzer writes a compressed inode's map header and
//! indexes (full or compact, any flags) and the pcluster bytes; the target maps and
//! reads the file.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(img) = ferofs_fuzz::zmap_image(data) {
        ferofs_fuzz::zmap_exercise(&img);
    }
});
