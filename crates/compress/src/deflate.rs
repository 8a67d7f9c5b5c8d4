//! Raw DEFLATE: libdeflate to compress (with a prefix search), miniz_oxide to inflate
//! (streaming, so a prefix can be decoded).

use crate::search::longest_prefix;
use crate::{Algorithm, FixedOutputCompressor};
use libdeflater::{CompressionLvl, Compressor};

pub struct Deflate {
    c: Compressor,
    ratio: f64,
    scratch: Vec<u8>,
}

impl Deflate {
    pub fn new(level: i32) -> Self {
        let lvl = CompressionLvl::new(level).unwrap_or_default();
        Deflate {
            c: Compressor::new(lvl),
            ratio: 3.0,
            scratch: Vec::new(),
        }
    }
}

impl FixedOutputCompressor for Deflate {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Deflate
    }
    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        let c = &mut self.c;
        let mut scratch = std::mem::take(&mut self.scratch);
        let bound = |n: usize| n + n / 16 + 1024;
        let r = longest_prefix(
            src.len(),
            dst,
            &mut self.ratio,
            512,
            &mut scratch,
            bound,
            |n, out| {
                match c.deflate_compress(&src[..n], out) {
                    // A stream starting with 0x00 (a stored block) would be mistaken for
                    // zero padding: treat it as not fitting.
                    Ok(w) if w > 0 && out[0] != 0 => Some(w),
                    // A leading stored block: count it as not fitting.
                    Ok(_) => Some(usize::MAX),
                    Err(_) => None,
                }
            },
        );
        self.scratch = scratch;
        r
    }
}

/// Inflate into `dst`, stopping when it is full. Returns bytes produced.
pub fn inflate(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    use miniz_oxide::inflate::core::{decompress, inflate_flags::*, DecompressorOxide};
    use miniz_oxide::inflate::TINFLStatus;
    let mut d = DecompressorOxide::new();
    let flags = TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF;
    let (status, _read, written) = decompress(&mut d, src, dst, 0, flags);
    match status {
        TINFLStatus::Done | TINFLStatus::HasMoreOutput => Some(written),
        TINFLStatus::NeedsMoreInput => Some(written),
        _ => None,
    }
}
