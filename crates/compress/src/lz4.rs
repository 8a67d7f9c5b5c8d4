//! LZ4 (algorithm 0), raw block format: liblz4's `LZ4_compress_destSize` (fast) and
//! `LZ4_compress_HC_destSize` (HC, levels 1..=12) fill the pcluster natively; match
//! distances stay within liblz4's 64 KiB window (max_distance 65535, the EROFS
//! default). Decoding uses `LZ4_decompress_safe` (whole stream) and
//! `LZ4_decompress_safe_partial` (prefix), as the kernel does.

use crate::ffi::lz4 as f;
use crate::{Algorithm, DecompressError, ErrorKind, FixedOutputCompressor};

/// Validate a destSize result: the first token of a non-empty LZ4 block carries at
/// least one literal, so a stream never starts with 0x00; check anyway.
fn accept(dst: &[u8], consumed: usize, written: usize) -> (usize, usize) {
    if consumed == 0 || written == 0 || written > dst.len() || dst[0] == 0 {
        (0, 0)
    } else {
        (consumed, written)
    }
}

pub struct Lz4Fast;

/// Whether liblz4 at its fastest compresses all of `src` into `out`, and into how
/// many bytes. It stops once `out` is full, so the cost is bounded by `out.len()`,
/// whatever `src.len()`.
pub fn fast_fits(src: &[u8], out: &mut [u8]) -> Option<usize> {
    if src.is_empty() || out.is_empty() {
        return None;
    }
    let (c, n) = f::compress_dest_size(src, out);
    let (c, n) = accept(out, c, n);
    (c == src.len() && n > 0).then_some(n)
}

/// How much of `src` liblz4 at its fastest fits into `out` (0 when either is empty).
pub fn fast_prefix(src: &[u8], out: &mut [u8]) -> usize {
    if src.is_empty() || out.is_empty() {
        return 0;
    }
    f::compress_dest_size(src, out).0
}

impl FixedOutputCompressor for Lz4Fast {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Lz4
    }
    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        if src.is_empty() || dst.is_empty() {
            return (0, 0);
        }
        let (c, n) = f::compress_dest_size(src, dst);
        accept(dst, c, n)
    }
}

pub struct Lz4Hc {
    state: f::HcState,
    level: i32,
}

/// Lowest level handed to liblz4. Since liblz4 1.10, levels 1 and 2 use its "lz4mid"
/// strategy, which fills fixed-size outputs worse than plain LZ4 does (512 MiB of
/// text at 4 KiB pclusters: ratio 2.18 vs 2.37; 1.9.4's levels 1-2, which mkfs.erofs
/// on Debian 12 links, give 2.28). So levels 1 and 2 run as 3: hash chains, smaller
/// than all of those, at about half lz4mid's speed.
const MIN_HC_LEVEL: i32 = 3;

impl Lz4Hc {
    pub fn new(level: i32) -> Self {
        Lz4Hc {
            state: f::HcState::new(),
            level: level.clamp(MIN_HC_LEVEL, 12),
        }
    }
}

impl FixedOutputCompressor for Lz4Hc {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Lz4
    }
    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        if src.is_empty() || dst.is_empty() {
            return (0, 0);
        }
        let (c, n) = self.state.compress_dest_size(src, dst, self.level);
        crate::count_native(c);
        accept(dst, c, n)
    }
}

/// Decode exactly `dst.len()` bytes (the stream must end there) or, with `partial`,
/// the first `dst.len()` bytes.
pub fn decompress(src: &[u8], dst: &mut [u8], partial: bool) -> Result<(), DecompressError> {
    let err = |kind| DecompressError {
        alg: Algorithm::Lz4,
        kind,
    };
    let produced = if partial {
        f::decompress_partial(src, dst)
    } else {
        f::decompress_full(src, dst)
    };
    match produced {
        Some(n) if n == dst.len() => Ok(()),
        Some(n) => Err(err(ErrorKind::Short {
            produced: n,
            wanted: dst.len(),
        })),
        // liblz4 reports every failure alike (bad offset, overrun, truncation).
        None => Err(err(ErrorKind::Corrupt(
            "bad LZ4 block (or longer than the extent)",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_fits_says_whether_all_of_the_input_fits_and_into_how_much() {
        let text: Vec<u8> = b"a line of source text, repeated with a counter: "
            .iter()
            .copied()
            .cycle()
            .take(300 << 10)
            .collect();
        let mut out = vec![0u8; (128 << 10) - 1];
        let n = fast_fits(&text, &mut out).expect("300 KiB of repeated text fits");
        assert!(n < 4096, "{n}");
        let mut back = vec![0u8; text.len()];
        decompress(&out[..n], &mut back, false).expect("decodes");
        assert!(back == text);

        // Random bytes (xorshift): 200 KiB cannot fit 128 KiB.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let random: Vec<u8> = (0..200 << 10)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        assert_eq!(fast_fits(&random, &mut out), None);
        // What does fit, exactly: the first 100 KiB of them.
        let n = fast_fits(&random[..100 << 10], &mut out).expect("100 KiB fits raw");
        assert!(n > 100 << 10 && n < out.len(), "{n}");
        assert_eq!(fast_fits(&[], &mut out), None);
        assert_eq!(fast_fits(&text, &mut []), None);
    }
}
