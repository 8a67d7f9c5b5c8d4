//! MicroLZMA: liblzma's encoder fills a fixed output natively.

use crate::ffi::lzma as f;
use crate::{Algorithm, FixedOutputCompressor};

pub struct MicroLzma {
    pub level: u32,
    pub dict: u32,
}

impl FixedOutputCompressor for MicroLzma {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Lzma
    }
    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        match f::microlzma_encode(src, dst, self.level, self.dict) {
            Some((c, n)) if n > 0 && dst[0] != 0 => (c, n),
            _ => (0, 0),
        }
    }
}
