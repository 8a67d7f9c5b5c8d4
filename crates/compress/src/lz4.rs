//! LZ4 and LZ4HC: liblz4's destSize functions fill the pcluster natively.

use crate::ffi::lz4 as f;
use crate::{Algorithm, FixedOutputCompressor};

pub struct Lz4Fast;

impl FixedOutputCompressor for Lz4Fast {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Lz4
    }
    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        let (c, n) = f::compress_dest_size(src, dst);
        if n == 0 || dst.first() == Some(&0) {
            (0, 0)
        } else {
            (c, n)
        }
    }
}

pub struct Lz4Hc {
    state: f::HcState,
    level: i32,
}

impl Lz4Hc {
    pub fn new(level: i32) -> Self {
        Lz4Hc {
            state: f::HcState::new(),
            level,
        }
    }
}

impl FixedOutputCompressor for Lz4Hc {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Lz4
    }
    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        let (c, n) = self.state.compress_dest_size(src, dst, self.level);
        if n == 0 || dst.first() == Some(&0) {
            (0, 0)
        } else {
            (c, n)
        }
    }
}
