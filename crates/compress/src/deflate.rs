//! Raw DEFLATE (algorithm 2). Levels 1-9 compress with our fixed-output encoder
//! (deflate_enc.rs: one parse, cut where the pcluster is full); levels 10-12 with
//! libdeflate's near-optimal parser and the prefix search (libdeflate has no
//! fixed-output mode). libdeflate inflates whole streams and miniz_oxide inflates
//! prefixes (it can stop when the output buffer is full).
//!
//! Window: both encoders use the full 32 KiB DEFLATE window, so the config record
//! declares windowbits 15 (what the kernel also assumes).

use crate::deflate_enc::DeflateEncoder;
use crate::search::PrefixSearch;
use crate::{Algorithm, DecompressError, ErrorKind, FixedOutputCompressor};
use libdeflater::{CompressionLvl, Compressor, DecompressionError, Decompressor};
use std::cell::RefCell;

pub enum Deflate {
    /// Levels 1-9.
    Own(Box<DeflateEncoder>),
    /// Levels 10-12: libdeflate and the prefix search.
    Lib { c: Compressor, search: PrefixSearch },
}

/// Highest level our own encoder serves.
pub const OWN_MAX_LEVEL: i32 = 9;

impl Deflate {
    /// `level` 1..=12 (validated by the spec parser; out-of-range falls back to 6).
    pub fn new(level: i32) -> Self {
        let level = if (1..=12).contains(&level) { level } else { 6 };
        if level <= OWN_MAX_LEVEL {
            return Deflate::Own(Box::new(DeflateEncoder::new(level)));
        }
        Self::libdeflate(level)
    }

    /// libdeflate at `level` with the prefix search, whatever the level (the
    /// benchmark example compares the two encoders with it).
    pub fn libdeflate(level: i32) -> Self {
        let lvl = CompressionLvl::new(level).unwrap_or_default();
        Deflate::Lib {
            c: Compressor::new(lvl),
            // Up to max(16 B, cap/512) of each pcluster may stay unused: on text at
            // 4 KiB..1 MiB this costs ~0.1-0.2 % in size and saves 25-45 % of the time.
            search: PrefixSearch::with_slack(9, 16),
        }
    }
}

/// Make a stream that opens with a non-final stored block start with a non-zero byte:
/// its first byte holds BFINAL=0, BTYPE=00 and five padding bits that every inflater
/// skips (RFC 1951 §3.2.4), so set one of the padding bits. A zero first byte would be
/// taken for the pcluster's zero padding (format doc §9.1).
fn fix_leading_zero(stream: &mut [u8]) {
    if let Some(b) = stream.first_mut() {
        if *b == 0 {
            *b = 1 << 3;
        }
    }
}

impl FixedOutputCompressor for Deflate {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Deflate
    }

    fn begin_stream(&mut self) {
        if let Deflate::Lib { search, .. } = self {
            search.reset();
        }
    }

    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        match self {
            Deflate::Own(e) => {
                let (n, w) = e.compress(src, dst);
                fix_leading_zero(&mut dst[..w]);
                (n, w)
            }
            Deflate::Lib { c, search } => {
                let bound = c.deflate_compress_bound(src.len());
                search.run(src, dst, bound, |prefix, out| lib_trial(c, prefix, out))
            }
        }
    }

    fn refit(&mut self, src: &[u8], dst: &mut [u8], whole_size: usize) -> (usize, usize) {
        match self {
            Deflate::Own(_) => self.compress_destsize(src, dst),
            Deflate::Lib { c, search } => {
                let bound = c.deflate_compress_bound(src.len());
                search.refit(src, dst, bound, whole_size, |prefix, out| {
                    lib_trial(c, prefix, out)
                })
            }
        }
    }
}

/// One libdeflate compression of `prefix` into `out`: a trial of the prefix search.
fn lib_trial(c: &mut Compressor, prefix: &[u8], out: &mut [u8]) -> Option<usize> {
    let w = c.deflate_compress(prefix, out).ok()?;
    fix_leading_zero(&mut out[..w]);
    Some(w)
}

thread_local! {
    static INFLATER: RefCell<Decompressor> = RefCell::new(Decompressor::new());
}

/// Inflate exactly `dst.len()` bytes (the stream must end there) or, with `partial`,
/// the first `dst.len()` bytes of a stream that may hold more.
pub fn decompress(src: &[u8], dst: &mut [u8], partial: bool) -> Result<(), DecompressError> {
    let err = |kind| DecompressError {
        alg: Algorithm::Deflate,
        kind,
    };
    if !partial {
        // libdeflate: fast, and fails unless the final block ends within `dst`.
        let r = INFLATER.with(|d| match d.try_borrow_mut() {
            Ok(mut d) => d.deflate_decompress(src, dst),
            Err(_) => Decompressor::new().deflate_decompress(src, dst),
        });
        return match r {
            Ok(n) if n == dst.len() => Ok(()),
            Ok(n) => Err(err(ErrorKind::Short {
                produced: n,
                wanted: dst.len(),
            })),
            Err(DecompressionError::InsufficientSpace) => Err(err(ErrorKind::TooLong)),
            Err(DecompressionError::BadData) => Err(err(ErrorKind::Corrupt("bad DEFLATE data"))),
        };
    }
    use miniz_oxide::inflate::core::{decompress, inflate_flags, DecompressorOxide};
    use miniz_oxide::inflate::TINFLStatus;
    let mut d = Box::<DecompressorOxide>::default();
    // The whole stream is in `src`; `dst` is the complete output buffer from offset 0.
    let flags = inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF;
    let (status, _read, written) = decompress(&mut d, src, dst, 0, flags);
    match status {
        TINFLStatus::Done | TINFLStatus::HasMoreOutput if written == dst.len() => Ok(()),
        TINFLStatus::Done | TINFLStatus::HasMoreOutput => Err(err(ErrorKind::Short {
            produced: written,
            wanted: dst.len(),
        })),
        TINFLStatus::FailedCannotMakeProgress | TINFLStatus::NeedsMoreInput => {
            Err(err(ErrorKind::Truncated))
        }
        _ => Err(err(ErrorKind::Corrupt("bad DEFLATE data"))),
    }
}
