//! Zstandard: one frame per pcluster with an explicit window; prefix search to fill.

use crate::search::longest_prefix;
use crate::{Algorithm, FixedOutputCompressor, SpecError};

pub struct Zstd {
    c: zstd::bulk::Compressor<'static>,
    ratio: f64,
    scratch: Vec<u8>,
}

impl Zstd {
    pub fn new(level: i32, window: u32) -> Result<Self, SpecError> {
        let mut c = zstd::bulk::Compressor::new(level)
            .map_err(|_| SpecError::Option(format!("zstd level {level}")))?;
        let wlog = window.trailing_zeros().max(10);
        c.set_parameter(zstd::zstd_safe::CParameter::WindowLog(wlog))
            .map_err(|_| SpecError::Option("zstd window".into()))?;
        c.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(false))
            .map_err(|_| SpecError::Option("zstd checksum".into()))?;
        Ok(Zstd {
            c,
            ratio: 3.0,
            scratch: Vec::new(),
        })
    }
}

impl FixedOutputCompressor for Zstd {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Zstd
    }
    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        let c = &mut self.c;
        let mut scratch = std::mem::take(&mut self.scratch);
        let bound = |n: usize| zstd::zstd_safe::compress_bound(n);
        let r = longest_prefix(
            src.len(),
            dst,
            &mut self.ratio,
            512,
            &mut scratch,
            bound,
            |n, out| c.compress_to_buffer(&src[..n], out).ok().filter(|&w| w > 0),
        );
        self.scratch = scratch;
        r
    }
}

/// Decode into `dst`, stopping when it is full. Returns bytes produced.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};
    let mut d = Decoder::new().ok()?;
    d.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(24))
        .ok()?;
    let mut input = InBuffer::around(src);
    let mut output = OutBuffer::around(dst);
    // Bounded: each round consumes input or produces output, else we stop.
    for _ in 0..(src.len() + 16) {
        let before = (input.pos(), output.pos());
        let hint = d.run(&mut input, &mut output).ok()?;
        if output.pos() == output.capacity() || hint == 0 {
            break;
        }
        if (input.pos(), output.pos()) == before {
            break;
        }
    }
    Some(output.pos())
}
