//! Zstandard (algorithm 3): one standard frame per pcluster, compressed by libzstd with
//! an explicit window (`ZSTD_c_windowLog` = the window declared in the config record)
//! and the prefix search to fill the pcluster; decoded by libzstd's streaming decoder,
//! which can stop as soon as the requested prefix is produced.

use crate::search::PrefixSearch;
use crate::{Algorithm, DecompressError, ErrorKind, FixedOutputCompressor, SpecError};
use std::cell::RefCell;
use zstd_safe::{CCtx, CParameter, DCtx, DParameter, InBuffer, OutBuffer, ResetDirective};

/// The zstd frame magic, little-endian on disk: every stream starts `28 b5 2f fd`.
const MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// EROFS windows are at most 1 MiB (format doc §1.5).
const MAX_WINDOW_LOG: u32 = 20;

pub struct Zstd {
    c: CCtx<'static>,
    search: PrefixSearch,
}

impl Zstd {
    /// `window` must be a power of two in 1 KiB..=1 MiB (see `CompressorSpec`).
    pub fn new(level: i32, window: u32) -> Result<Self, SpecError> {
        let bad = |what: &str| SpecError::Option(format!("zstd: {what}"));
        let mut c = CCtx::try_create().ok_or_else(|| bad("cannot allocate a context"))?;
        let wlog = window.max(1 << 10).ilog2().min(MAX_WINDOW_LOG);
        c.set_parameter(CParameter::CompressionLevel(level))
            .map_err(|_| bad("bad level"))?;
        c.set_parameter(CParameter::WindowLog(wlog))
            .map_err(|_| bad("bad window"))?;
        c.set_parameter(CParameter::ChecksumFlag(false))
            .map_err(|_| bad("checksum flag"))?;
        // No content size in the frame header: EROFS knows each pcluster's decoded size
        // from its index, and streaming decoders (the kernel's, erofs-utils', ours)
        // do not need it. Saves 1 byte per frame for inputs of 256 B..64 KiB and 3 for
        // longer ones (the header then has a window byte instead of a 2- or 4-byte size).
        c.set_parameter(CParameter::ContentSizeFlag(false))
            .map_err(|_| bad("content size flag"))?;
        Ok(Zstd {
            c,
            search: PrefixSearch::default(),
        })
    }
}

impl FixedOutputCompressor for Zstd {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Zstd
    }

    fn begin_stream(&mut self) {
        self.search.reset();
    }

    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        let c = &mut self.c;
        let bound = zstd_safe::compress_bound(src.len());
        self.search.run(src, dst, bound, |prefix, out| {
            match c.compress2(out, prefix) {
                Ok(w) if w > 0 => Some(w),
                _ => {
                    // A failed one-shot call leaves the context poisoned; clear it.
                    let _ = c.reset(ResetDirective::SessionOnly);
                    None
                }
            }
        })
    }
}

thread_local! {
    /// One decoder per thread, reused (its window buffer stays allocated, <= 1 MiB).
    static DECODER: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

/// Decode exactly `dst.len()` bytes (the frame must end there) or, with `partial`, the
/// first `dst.len()` bytes of a frame that may hold more.
pub fn decompress(src: &[u8], dst: &mut [u8], partial: bool) -> Result<(), DecompressError> {
    let err = |kind| DecompressError {
        alg: Algorithm::Zstd,
        kind,
    };
    // Only a standard frame is valid (no skippable or legacy frames).
    if !src.starts_with(&MAGIC) {
        return Err(err(ErrorKind::Corrupt("no zstd frame magic")));
    }
    DECODER.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok();
        let mut local = None;
        let slot: &mut Option<DCtx<'static>> = match guard.as_deref_mut() {
            Some(s) => s,
            None => &mut local,
        };
        if slot.is_none() {
            let mut d = DCtx::try_create().ok_or(err(ErrorKind::Internal("out of memory")))?;
            d.set_parameter(DParameter::WindowLogMax(MAX_WINDOW_LOG))
                .map_err(|_| err(ErrorKind::Internal("cannot configure decoder")))?;
            *slot = Some(d);
        }
        let Some(d) = slot.as_mut() else {
            return Err(err(ErrorKind::Internal("no decoder")));
        };
        run(d, src, dst, partial).map_err(err)
    })
}

fn run(d: &mut DCtx<'_>, src: &[u8], dst: &mut [u8], partial: bool) -> Result<(), ErrorKind> {
    d.reset(ResetDirective::SessionOnly)
        .map_err(|_| ErrorKind::Internal("cannot reset decoder"))?;
    let wanted = dst.len();
    let mut input = InBuffer::around(src);
    let mut output = OutBuffer::around(dst);
    loop {
        let before = (input.pos(), output.pos());
        let hint = d
            .decompress_stream(&mut output, &mut input)
            .map_err(|code| ErrorKind::Corrupt(zstd_safe::get_error_name(code)))?;
        let produced = output.pos();
        if hint == 0 {
            // The frame is complete.
            return if produced == wanted {
                Ok(())
            } else {
                Err(ErrorKind::Short { produced, wanted })
            };
        }
        if produced == wanted && partial {
            return Ok(());
        }
        if (input.pos(), output.pos()) == before {
            // No progress: either the output is full while the frame goes on, or the
            // input ended inside the frame.
            return Err(if produced == wanted {
                ErrorKind::TooLong
            } else {
                ErrorKind::Truncated
            });
        }
    }
}
