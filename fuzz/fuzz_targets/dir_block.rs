//! One directory block: parse, and every name within its bounds.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ents) = ferofs_reader::dir::parse_dir_block(data, 7, 4096) {
        for e in &ents {
            assert!(!e.name.is_empty() && e.name.len() <= 255, "bad name length");
        }
        assert!(
            ents.len() * 12 < data.len().max(1),
            "more dirents than the block holds"
        );
    }
});
