//! The zstd decoder with a fixed output length: 3 bytes of output length (up to 1 MiB),
//! 1 byte of flags (bit 0: partial), 4 bytes of LZMA dictionary size, then the stream.
#![no_main]
use ferofs_compress::{decompress, Algorithm, DecompressConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let n = (usize::from(data[0]) | usize::from(data[1]) << 8 | usize::from(data[2]) << 16)
        % (1 << 20)
        + 1;
    let partial = data[3] & 1 != 0;
    let cfg = DecompressConfig {
        lzma_dict: u32::from_le_bytes([data[4], data[5], data[6], data[7]]),
    };
    let mut out = vec![0u8; n];
    let _ = decompress(Algorithm::Zstd, &data[8..], &mut out, partial, &cfg);
});
