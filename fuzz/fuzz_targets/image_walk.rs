//! Open any bytes as an image and walk every reader API over it.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(img) = ferofs_reader::Image::new(data.to_vec()) {
        ferofs_fuzz::walk_all(&img, data.len() as u64);
    }
});
