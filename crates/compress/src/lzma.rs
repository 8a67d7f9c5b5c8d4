//! MicroLZMA (algorithm 1): liblzma's MicroLZMA encoder fills a fixed output natively
//! (it stops when the output is full and reports the input it used); the stream is an
//! LZMA1 range-coded stream without header or end marker whose first byte is the
//! bitwise NOT of the properties byte (format doc §9.3). Decoding needs the exact
//! compressed size, the output size and the dictionary size.

use crate::ffi::lzma::{self as f, Stream};
use crate::{Algorithm, DecompressError, ErrorKind, FixedOutputCompressor, SpecError};
use std::cell::RefCell;

/// Kernel limits on the dictionary (format doc §1.5).
pub const MIN_DICT: u32 = 4096;
pub const MAX_DICT: u32 = 8 << 20;

pub struct MicroLzma {
    /// Reused across calls so liblzma keeps its match finder allocations.
    enc: f::Encoder,
}

impl MicroLzma {
    /// `level` 0..=9, or 100..=109 for the "extreme" variants (mkfs.erofs convention).
    pub fn new(level: i32, dict: u32) -> Result<Self, SpecError> {
        let preset = match level {
            0..=9 => level as u32,
            100..=109 => (level - 100) as u32 | f::LZMA_PRESET_EXTREME,
            _ => return Err(SpecError::Option(format!("lzma level {level}"))),
        };
        let enc = f::Encoder::new(preset, dict.clamp(MIN_DICT, MAX_DICT))
            .ok_or_else(|| SpecError::Option(format!("lzma level {level}")))?;
        Ok(MicroLzma { enc })
    }
}

impl FixedOutputCompressor for MicroLzma {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Lzma
    }

    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        if src.is_empty() || dst.is_empty() {
            return (0, 0);
        }
        let r = self.enc.encode(src, dst);
        crate::count_native(r.map_or(0, |(c, _)| c));
        match r {
            // Byte 0 is !props, never 0 for valid properties; check anyway.
            Some((c, n)) if c > 0 && n > 0 && dst[0] != 0 => (c, n),
            _ => (0, 0),
        }
    }
}

thread_local! {
    /// One decoder stream per thread; liblzma reuses its dictionary buffer when the
    /// next stream asks for the same size.
    static DECODER: RefCell<Stream> = RefCell::new(Stream::new());
}

/// Decode exactly `dst.len()` bytes or, with `partial`, the first `dst.len()` bytes.
/// `dict` is the dictionary size from the config record (0: unknown, take the maximum).
pub fn decompress(
    src: &[u8],
    dst: &mut [u8],
    partial: bool,
    dict: u32,
) -> Result<(), DecompressError> {
    let err = |kind| DecompressError {
        alg: Algorithm::Lzma,
        kind,
    };
    let declared = if dict == 0 { MAX_DICT } else { dict };
    if !(MIN_DICT..=MAX_DICT).contains(&declared) {
        return Err(err(ErrorKind::BadConfig(
            "LZMA dictionary size out of range",
        )));
    }
    // No match reaches further back than the output produced so far, so a dictionary
    // larger than the output is never needed: cap the allocation (rounded to a power
    // of two so the thread's decoder can keep its buffer) at the output size.
    let want = u32::try_from(dst.len()).unwrap_or(u32::MAX);
    let dict = want
        .max(MIN_DICT)
        .checked_next_power_of_two()
        .unwrap_or(MAX_DICT)
        .min(declared);
    let produced = DECODER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => s.microlzma_decode(src, dst, !partial, dict),
        Err(_) => Stream::new().microlzma_decode(src, dst, !partial, dict),
    });
    match produced {
        Some(n) if n == dst.len() => Ok(()),
        Some(n) => Err(err(ErrorKind::Short {
            produced: n,
            wanted: dst.len(),
        })),
        None => Err(err(ErrorKind::Corrupt("bad MicroLZMA stream"))),
    }
}
