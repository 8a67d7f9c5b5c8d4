//! Zstandard (algorithm 3): one standard frame per pcluster, compressed by libzstd with
//! an explicit window (the window declared in the config record), no content size and
//! no checksum; decoded by libzstd's streaming decoder, which can stop as soon as the
//! requested prefix is produced.
//!
//! Filling a pcluster: libzstd has no fixed-output mode, so the compressor must find how
//! much input fits. Two ways:
//!
//! - **Pieces** (pclusters of [`STREAM_MIN_CAP`] and more): one frame written piece by
//!   piece through the buffer-less block API (`ffi::zstd`), each piece's exact output
//!   known as soon as it is compressed. Whole 128 KiB blocks go in while the ratio seen
//!   so far says they fit with a margin (one block a piece in pclusters under 256 KiB,
//!   see [`MULTI_BLOCK_MIN_CAP`]); then smaller pieces, each sized to use most of
//!   what is left, until less than a few dozen bytes remain. A piece that overflows is
//!   undone by compressing the frame's earlier pieces again (same input, same output)
//!   and trying a smaller one sized by the overflow's own ratio, unless less than
//!   [`SMALL_ROOM`] bytes were left: then the frame ends before it (an empty last raw
//!   block, 3 bytes), which the undo would cost a whole pcluster's work to fill. Each
//!   input byte is compressed 1.2-1.5 times (overflows included; the builder's `FEROFS_CODEC_STATS`
//!   prints the count), against about 5.5 for the prefix search. The price is the
//!   piece boundaries (a block header and entropy tables each, about 25 bytes): 0.1-0.2 %
//!   larger images at 128 KiB on source text and binaries, 0.0-0.1 % at 1 MiB
//!   (docs/benchmarks.md, "Zstandard pclusters filled piece by piece"). Smaller
//!   pclusters lose more (0.8 % on text at 32 KiB): they use the search.
//! - **Prefix search** ([`crate::search`]): one-shot compressions of prefixes until the
//!   longest that fits is found; also the fallback when pieces fail (codec error, or
//!   more than [`MAX_REDOS`] overflows) and, in pclusters under 512 KiB, for data that
//!   barely compresses ([`MIN_STREAM_RATIO`]).

use crate::ffi::zstd::{Frames, Setup};
use crate::search::PrefixSearch;
use crate::{Algorithm, DecompressError, ErrorKind, FixedOutputCompressor, SpecError};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use zstd_safe::{CCtx, CParameter, DCtx, DParameter, InBuffer, OutBuffer, ResetDirective};

/// The zstd frame magic, little-endian on disk: every stream starts `28 b5 2f fd`.
const MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// EROFS windows are at most 1 MiB (format doc §1.5).
const MAX_WINDOW_LOG: u32 = 20;

/// Pclusters at least this large are filled piece by piece.
pub const STREAM_MIN_CAP: usize = 128 << 10;
/// libzstd's largest block: whole pieces are multiples of it.
const BLOCK: usize = 128 << 10;
/// How far below the room a piece's predicted output must stay: for the first piece
/// of a frame (sized by earlier data's ratio), for later runs of whole blocks, and for
/// smaller pieces.
#[derive(Clone, Copy)]
struct Margins {
    first: f64,
    whole: f64,
    part: f64,
}

/// Pclusters under [`LARGE_MARGINS_MIN_CAP`] and refits: a piece that overflows costs
/// less to undo there (a pcluster holds a few blocks of input).
const SMALL_MARGINS: Margins = Margins {
    first: 1.3,
    whole: 1.3,
    part: 1.6,
};

/// Pclusters from [`LARGE_MARGINS_MIN_CAP`] up, where an overflow is dear: a frame holds
/// up to megabytes of input, and undoing a late piece compresses all of it again. The
/// first piece (sized by the ratio of earlier data, often other files) aims at half
/// the room, later pieces further below it. Measured on the rootfs, zstd 15, 1 MiB,
/// `-E smallest`, `-j 2`, against the small margins: overflows 73 -> 21, piece input
/// 817 -> 643 MB for 567 -> 560 MB consumed, the same image bytes (169,783,296).
const LARGE_MARGINS: Margins = Margins {
    first: 2.0,
    whole: 1.6,
    part: 2.0,
};

/// Pclusters of at least this size take [`LARGE_MARGINS`]. At 256 KiB they cut the
/// rootfs's zstd 15 piece input by a quarter too (+0.007 % bytes), but they moved
/// make-tree's packed inode at 256 KiB so that one small `cat` from a remote image
/// fetched 745 KB instead of 311 KB (tests/remote.rs); kept at the small margins there.
const LARGE_MARGINS_MIN_CAP: usize = 512 << 10;

/// Pclusters at least this large take several whole blocks per piece; smaller ones one
/// block at a time. A 128 KiB pcluster holds two to four blocks of input, and the
/// ratio that sizes its first piece comes from earlier data: a two- or three-block
/// first piece that overflows wastes about a pcluster's work, while one block, once
/// compressed, sizes the rest on this data's own ratio. From two blocks of room up, a
/// piece of several blocks lets libzstd place block boundaries by content (its
/// pre-splitter acts only inside one call), which one-block pieces lose. Measured at
/// zstd 3, `-j 2`, codec input bytes and image bytes of one block per piece against
/// several: 128 KiB rootfs -7.5 % / -0.01 % (`-E smallest` -13.8 % / -0.02 %), linux
/// -3.9 % / +0.02 % (`-E smallest` -10.5 % / +0.06 %); 256 KiB rootfs `-E smallest`
/// -19 % but +0.22 % bytes, 1 MiB +0.69 %.
const MULTI_BLOCK_MIN_CAP: usize = 2 * BLOCK;
/// After an overflow, the retried piece aims at this share of the room, at the ratio
/// the overflowing piece showed.
const RETRY_SHARE: f64 = 0.9;
/// Output bytes kept back for a piece's block header and tables.
const PIECE_OVERHEAD: usize = 24;
/// No piece shorter than this: the frame ends instead.
const MIN_PIECE: usize = 32;
/// Overflows allowed in one pcluster before falling back to the prefix search.
pub const MAX_REDOS: u32 = 6;
/// Below this ratio the data is treated as barely compressible (prefix search, which
/// gives up on it in one or two trials), in pclusters under [`LARGE_MARGINS_MIN_CAP`].
/// From there up pieces fill every pcluster: a trial of the search compresses a whole
/// prefix, megabytes when the input is a packed inode's stream, and after a stretch of
/// incompressible fragments the data that follows is usually compressible again.
/// Measured at zstd 15, 1 MiB, `-j 2` (codec input, image bytes): the rootfs
/// `-E smallest` 713 -> 669 MB, the same bytes; make-incompressible's compressed files
/// `-E smallest` 70 -> 27 MB (1.01 -> 0.46 CPU s), the same bytes; no change on the
/// linux tree or without fragments. At 128 KiB the rootfs `-E smallest` would take
/// 7.7 % less input but gain 0.07 % in bytes (the search fills a pcluster exactly).
const MIN_STREAM_RATIO: f64 = 1.1;
/// The ratio assumed at the start of a stream.
const START_RATIO: f64 = 3.0;
/// From this level up, each piece is first compressed by LZ4 at its fastest into the
/// room left, and cut to what LZ4 fits there: libzstd's output for a piece is at most
/// about LZ4's (on the rootfs at zstd 15, 1 MiB: 0.2-0.8 of it for pieces of 16 KiB
/// and up, at most 1.03 on pieces of a few hundred bytes; both store data that does
/// not compress), so the piece nearly never overflows and no frame is compressed
/// again to undo one. The piece's ratio guess stays the first limit; LZ4 only cuts
/// the pieces it says would not fit, where the data changes kind (text, then
/// binaries or compressed files) within the frame. LZ4 costs about 1 ns a byte: at
/// levels from 10 up (lazy2 and slower, 25 ns a byte and more) that is a few percent
/// of what an overflow costs; at lower levels it would cost more than the overflows.
/// Measured at zstd 15, 1 MiB, `-E smallest`, `-j 2` (piece input for consumed):
/// rootfs 717 -> 577 MB for 577 MB, 42 -> 0 overflows, +0.06 % image bytes; linux
/// tree 1,402 -> 1,326 MB for 1,326 MB, 12 -> 0 overflows, +0.007 %.
const GUIDE_MIN_LEVEL: i32 = 10;

/// The length of `piece`, or of the prefix of it that LZ4 at its fastest fits into
/// `room` bytes (whole blocks when that is one block or more; 0 when under
/// [`MIN_PIECE`]). Costs at most what LZ4 needs to fill `room`.
fn lz4_cut(piece: &[u8], room: usize, scratch: &mut Vec<u8>) -> usize {
    if room < MIN_PIECE {
        return piece.len();
    }
    if scratch.len() < room {
        scratch.resize(room, 0);
    }
    let fits = crate::lz4_prefix(piece, &mut scratch[..room]);
    GUIDE_BYTES.fetch_add(fits as u64, Ordering::Relaxed);
    if fits >= piece.len() {
        piece.len()
    } else if fits >= BLOCK {
        fits / BLOCK * BLOCK
    } else if fits >= MIN_PIECE {
        fits
    } else {
        0
    }
}

/// Refits (cutting a file's last pcluster back to whole blocks for ztailpacking) into
/// at least this much room are filled piece by piece, smaller ones by the prefix
/// search. Measured at zstd 3, 128 KiB, `-E ztailpacking`, 2 threads, against every
/// refit by search: linux tree 6.61 s -> 5.78 s for 0.05 % more image bytes, rootfs
/// 0.01 % fewer. From 16 KiB: faster again (-8 %) but 0.25 % larger on the linux tree
/// (a piece's block header and tables cost more than the search leaves unused).
const REFIT_PIECES_MIN: usize = 32 << 10;

/// Output room below which an overflowing piece ends the frame instead of being
/// undone: the undo compresses the whole pcluster's input again for at most this many
/// bytes. Measured at zstd 3, 128 KiB, `-E smallest`: 13.5 % less codec work on the
/// linux tree and 6 % on the rootfs, for 0.03-0.04 % more image bytes.
const SMALL_ROOM: usize = 2048;

/// Input bytes compressed by piece-by-piece fills, redone pieces included, and input
/// bytes those fills consumed (for benchmarks; not part of the API).
pub static PIECE_BYTES: AtomicU64 = AtomicU64::new(0);
pub static PIECE_CONSUMED: AtomicU64 = AtomicU64::new(0);
/// Input bytes LZ4 fitted while cutting pieces ([`GUIDE_MIN_LEVEL`]).
pub static GUIDE_BYTES: AtomicU64 = AtomicU64::new(0);
/// Frames ended before an overflowing piece, with less than [`SMALL_ROOM`] left.
pub static PIECE_EARLY_ENDS: AtomicU64 = AtomicU64::new(0);
/// Pieces that overflowed, and input bytes compressed again to undo them.
pub static PIECE_OVERFLOWS: AtomicU64 = AtomicU64::new(0);
pub static PIECE_REPLAYED: AtomicU64 = AtomicU64::new(0);

pub struct Zstd {
    c: CCtx<'static>,
    search: PrefixSearch,
    frames: Option<Frames>,
    level: i32,
    wlog: u32,
    /// Input per output byte of the last pcluster.
    ratio: f64,
    /// Scratch output of one piece.
    out: Vec<u8>,
    /// Ends of the pieces written so far (for replaying them after an overflow).
    cuts: Vec<usize>,
    /// Pieces are cut to what LZ4 fits before libzstd sees them ([`GUIDE_MIN_LEVEL`]).
    guide: bool,
    /// Scratch output of that LZ4 check.
    lz4_out: Vec<u8>,
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
            // Up to 4 unused bytes a pcluster (the default stop leaves at most 1 under
            // 32 KiB): the last trials of a search chase single bytes. Measured at
            // zstd 3, 4 KiB, `-j 2` (trials, CPU s, image bytes): bigtext 222,157 ->
            // 189,654, 7.7 -> 6.8 s, +0.03 %; linux 303,712 -> 263,659, 10.9 -> 9.8 s,
            // +0.01 %; rootfs 249,278 -> 212,992, 7.6 -> 6.6 s, +0.04 % (`-E smallest`
            // +0.08 %). 8 bytes took 22-24 % of the trials away, but put bigtext's
            // image 4 KiB above mkfs.erofs 1.9.3's.
            search: PrefixSearch::with_slack(13, 4),
            frames: Frames::new(),
            level,
            wlog,
            ratio: START_RATIO,
            out: Vec::new(),
            cuts: Vec::new(),
            guide: cfg!(feature = "lz4") && level >= GUIDE_MIN_LEVEL,
            lz4_out: Vec::new(),
        })
    }

    /// One-shot compression of `prefix` into `out`: a trial of the prefix search.
    fn one_shot(c: &mut CCtx<'static>, prefix: &[u8], out: &mut [u8]) -> Option<usize> {
        match c.compress2(out, prefix) {
            Ok(w) if w > 0 => Some(w),
            _ => {
                // A failed one-shot call leaves the context poisoned; clear it.
                let _ = c.reset(ResetDirective::SessionOnly);
                None
            }
        }
    }

    /// Fill `dst` piece by piece (module doc). None: fall back to the prefix search.
    /// `one_block`: whole blocks go one a piece (see [`MULTI_BLOCK_MIN_CAP`]).
    fn fill(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        one_block: bool,
        m: Margins,
    ) -> Option<(usize, usize)> {
        let cap = dst.len();
        let setup = Setup {
            level: self.level,
            window_log: self.wlog,
            size_hint: ((cap as f64 * self.ratio) as u64).min(src.len() as u64),
        };
        let guide = self.guide;
        let (frames, out, cuts) = (self.frames.as_mut()?, &mut self.out, &mut self.cuts);
        let lz4_out = &mut self.lz4_out;
        cuts.clear();
        let mut frame = frames.frame(src, setup)?;
        let mut produced = 0usize;
        let mut last_ratio = self.ratio;
        let mut redos = 0u32;
        let mut forced: Option<usize> = None;
        // Bounded: every round either commits a piece (at least MIN_PIECE bytes, or
        // ends the frame) or counts an overflow (at most MAX_REDOS).
        loop {
            let pos = frame.pos();
            let budget = cap.saturating_sub(produced + 3);
            let room = budget.saturating_sub(PIECE_OVERHEAD) as f64;
            let left = src.len() - pos;
            let est = if produced > 0 {
                last_ratio.min(pos as f64 / produced as f64)
            } else {
                last_ratio
            };
            let p = match forced.take() {
                Some(p) => p,
                None if left == 0 => 0,
                None => {
                    let wm = if produced == 0 { m.first } else { m.whole };
                    let whole = (room * est / wm) as usize;
                    let guess = if whole >= BLOCK {
                        let blocks = if one_block { 1 } else { whole / BLOCK };
                        (blocks * BLOCK).min(left)
                    } else {
                        let p = (room * est / m.part) as usize;
                        if p < MIN_PIECE {
                            0
                        } else {
                            p.min(left)
                        }
                    };
                    // A guessed piece (not a retry sized by an overflow) goes
                    // through the LZ4 cut.
                    if guide && guess > 0 {
                        lz4_cut(&src[pos..pos + guess], room as usize, lz4_out)
                    } else {
                        guess
                    }
                }
            };
            let end = p == 0 || p == left;
            let w = frame.piece(p, end, out)?;
            PIECE_BYTES.fetch_add(p as u64, Ordering::Relaxed);
            let limit = if end { cap } else { cap - 3 };
            if produced + w > limit {
                PIECE_OVERFLOWS.fetch_add(1, Ordering::Relaxed);
                redos += 1;
                if redos > MAX_REDOS {
                    return None;
                }
                if produced > 0 && budget < SMALL_ROOM {
                    // Little room left: end the frame before this piece (an empty last
                    // raw block) rather than compressing everything again for it.
                    dst.get_mut(produced..produced + 3)?
                        .copy_from_slice(&[1, 0, 0]);
                    produced += 3;
                    PIECE_CONSUMED.fetch_add(pos as u64, Ordering::Relaxed);
                    PIECE_EARLY_ENDS.fetch_add(1, Ordering::Relaxed);
                    self.ratio = pos as f64 / produced.max(1) as f64;
                    return Some((pos, produced));
                }
                // Undo the piece: the same earlier pieces again give the same bytes.
                PIECE_REPLAYED.fetch_add(pos as u64, Ordering::Relaxed);
                frame = frames.frame(src, setup)?;
                let mut again = 0usize;
                let mut from = 0usize;
                for &cut in cuts.iter() {
                    let n = frame.piece(cut - from, false, out)?;
                    PIECE_BYTES.fetch_add((cut - from) as u64, Ordering::Relaxed);
                    if dst.get(again..again + n)? != out.get(..n)? {
                        return None;
                    }
                    again += n;
                    from = cut;
                }
                if again != produced {
                    return None;
                }
                let retry = (p as f64 * room / w.max(1) as f64 * RETRY_SHARE) as usize;
                forced = Some(if retry < MIN_PIECE {
                    0
                } else {
                    retry.min(p.saturating_sub(1))
                });
                continue;
            }
            dst.get_mut(produced..produced + w)?
                .copy_from_slice(out.get(..w)?);
            produced += w;
            if p > 4096 && w > 0 {
                last_ratio = p as f64 / w as f64;
            }
            if end {
                let consumed = frame.pos();
                PIECE_CONSUMED.fetch_add(consumed as u64, Ordering::Relaxed);
                self.ratio = consumed as f64 / produced.max(1) as f64;
                return Some((consumed, produced));
            }
            cuts.push(frame.pos());
        }
    }
}

impl FixedOutputCompressor for Zstd {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Zstd
    }

    fn begin_stream(&mut self) {
        self.search.reset();
        self.ratio = START_RATIO;
    }

    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        let large = dst.len() >= LARGE_MARGINS_MIN_CAP;
        if dst.len() >= STREAM_MIN_CAP
            && src.len() > dst.len()
            && (large || self.ratio >= MIN_STREAM_RATIO)
        {
            let one_block = dst.len() < MULTI_BLOCK_MIN_CAP;
            let m = if large { LARGE_MARGINS } else { SMALL_MARGINS };
            if let Some((consumed, written)) = self.fill(src, dst, one_block, m) {
                // Nothing longer than the pcluster fitted: storing is as good.
                if consumed > dst.len() {
                    return (consumed, written);
                }
                self.ratio = 1.0;
                return (0, 0);
            }
        }
        let c = &mut self.c;
        let bound = zstd_safe::compress_bound(src.len());
        let (consumed, written) = self.search.run(src, dst, bound, |prefix, out| {
            Zstd::one_shot(c, prefix, out)
        });
        self.ratio = if written > 0 {
            consumed as f64 / written as f64
        } else {
            1.0
        };
        (consumed, written)
    }

    fn refit(&mut self, src: &[u8], dst: &mut [u8], whole_size: usize) -> (usize, usize) {
        // From REFIT_PIECES_MIN up, piece by piece, starting from the whole's ratio.
        if dst.len() >= REFIT_PIECES_MIN && src.len() > dst.len() {
            self.ratio = src.len() as f64 / whole_size.max(1) as f64;
            // The whole's ratio sizes the first piece well, and the room is not the
            // pcluster's: several blocks a piece. (One-block pieces here moved ends of
            // files that were inline into blocks of their own.)
            if let Some((consumed, written)) = self.fill(src, dst, false, SMALL_MARGINS) {
                if consumed > dst.len() && consumed < src.len() {
                    return (consumed, written);
                }
            }
        }
        // Smaller rooms (pieces would cost more in block headers than the search leaves
        // unused), and pieces that failed: one-shot trials.
        let c = &mut self.c;
        let bound = zstd_safe::compress_bound(src.len());
        self.search
            .refit(src, dst, bound, whole_size, |prefix, out| {
                Zstd::one_shot(c, prefix, out)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The next state of a xorshift64 generator.
    fn xorshift(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    /// Bytes from a 16-letter alphabet, uniformly: about 2:1 everywhere.
    fn half_entropy(len: usize, mut seed: u64) -> Vec<u8> {
        (0..len)
            .map(|_| b'a' + (xorshift(&mut seed) >> 40) as u8 % 16)
            .collect()
    }

    // The only test in this crate's unit tests that runs piece-by-piece fills, so the
    // global counter's difference is this test's own work.
    #[test]
    fn fills_after_better_data_waste_little() {
        let mut z = Zstd::new(3, 1 << 20).expect("zstd context");
        let mut dst = vec![0u8; STREAM_MIN_CAP];
        // Text that compresses about 30:1 leaves a ratio the next data will not reach.
        let easy: Vec<u8> = b"an earlier pcluster of text that repeats itself\n"
            .iter()
            .copied()
            .cycle()
            .take(4 << 20)
            .collect();
        let (consumed, _) = z.compress_destsize(&easy, &mut dst);
        assert!(z.ratio > 10.0, "ratio after easy data: {}", z.ratio);
        assert!(consumed > 1 << 20);

        let src = half_entropy(1 << 20, 0x9e37_79b9_7f4a_7c15);
        let before = PIECE_BYTES.load(Ordering::Relaxed);
        let (consumed, written) = z.compress_destsize(&src, &mut dst);
        let work = PIECE_BYTES.load(Ordering::Relaxed) - before;
        // About 2:1: well over a pcluster's worth, filled to within a few dozen bytes.
        assert!(
            consumed > 200 << 10 && consumed < 300 << 10,
            "consumed {consumed}"
        );
        assert!(
            written > dst.len() - 64 && written <= dst.len(),
            "written {written}"
        );
        // Several whole blocks as the first piece (the old sizing) overflow and are
        // thrown away: at least 512 KiB of work beyond what was consumed.
        assert!(
            work - consumed as u64 <= BLOCK as u64,
            "{work} bytes compressed for {consumed} consumed"
        );
        let mut back = vec![0u8; consumed];
        decompress(&dst[..written], &mut back, false).expect("decodes");
        assert!(back == src[..consumed]);

        // 1 MiB pclusters (in this test too, for the counter): data of about 1.7:1
        // with a run of bytes that do not compress every 512 KiB, after a stream start
        // (ratio 3.0). With the small margins the first piece (18 blocks) overflows and
        // later pieces are undone by compressing the frame again (3.3x the input
        // consumed, measured); the large margins size the first piece at 12 blocks and
        // waste nothing here.
        let mut mixed = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for i in 0..16u64 {
            mixed.extend_from_slice(&half_entropy(512 << 10, 0x9e37_79b9 + i));
            mixed.extend((0..96 << 10).map(|_| (xorshift(&mut seed) >> 32) as u8));
        }
        let mut big = vec![0u8; 1 << 20];
        let mut work_of = |m: Margins| {
            let mut z = Zstd::new(3, 1 << 20).expect("zstd context");
            z.ratio = START_RATIO;
            let before = PIECE_BYTES.load(Ordering::Relaxed);
            let (consumed, written) = z.fill(&mixed, &mut big, false, m).expect("fills");
            let work = PIECE_BYTES.load(Ordering::Relaxed) - before;
            assert!(
                written > big.len() - 2048 && written <= big.len(),
                "written {written}"
            );
            let mut back = vec![0u8; consumed];
            decompress(&big[..written], &mut back, false).expect("decodes");
            assert!(back == mixed[..consumed]);
            (work, consumed as u64)
        };
        let (small_work, small_consumed) = work_of(SMALL_MARGINS);
        let (large_work, large_consumed) = work_of(LARGE_MARGINS);
        assert!(
            large_work - large_consumed < (small_work - small_consumed) / 2,
            "large margins: {large_work} for {large_consumed}; small: {small_work} for {small_consumed}"
        );

        // At zstd 15 each piece is first cut to what LZ4 fits into the room left
        // (GUIDE_MIN_LEVEL): text that compresses far better than the stream start's
        // ratio, then the same alternation of 2:1 data and bytes that do not compress.
        // Without the cut, a piece sized by the text's ratio runs into the hard data,
        // overflows and the frame is compressed again; with it no byte is compressed
        // twice, for a pcluster filled as full and the same bytes back.
        let mut hard = b"text of about thirty to one, repeated line after line\n"
            .iter()
            .copied()
            .cycle()
            .take(2 << 20)
            .collect::<Vec<u8>>();
        hard.extend_from_slice(&mixed);
        let mut guided_work = |guide: bool| {
            let mut z = Zstd::new(15, 1 << 20).expect("zstd context");
            assert!(z.guide, "zstd 15 is cut by LZ4");
            z.guide = guide;
            let before = PIECE_BYTES.load(Ordering::Relaxed);
            let (consumed, written) = z
                .fill(&hard, &mut big, false, LARGE_MARGINS)
                .expect("fills");
            let work = PIECE_BYTES.load(Ordering::Relaxed) - before;
            assert!(
                written > big.len() - 2048 && written <= big.len(),
                "guide {guide}: written {written}"
            );
            let mut back = vec![0u8; consumed];
            decompress(&big[..written], &mut back, false).expect("decodes");
            assert!(back == hard[..consumed], "guide {guide}");
            (work, consumed as u64)
        };
        let (unguided_work, unguided_consumed) = guided_work(false);
        let (work, consumed) = guided_work(true);
        assert!(
            unguided_work > unguided_consumed + (256 << 10),
            "without LZ4: {unguided_work} bytes compressed for {unguided_consumed}"
        );
        assert_eq!(work, consumed, "with LZ4: every byte compressed once");
        assert!(
            consumed + 4096 >= unguided_consumed,
            "{consumed} against {unguided_consumed}"
        );
        assert!(
            !Zstd::new(GUIDE_MIN_LEVEL - 1, 1 << 20)
                .expect("zstd context")
                .guide
        );

        // After data that barely compressed (ratio under MIN_STREAM_RATIO) a 128 KiB
        // pcluster is filled by the prefix search (no pieces), a 1 MiB one by pieces.
        let text = half_entropy(4 << 20, 0x1234_5678);
        for (cap, pieces) in [
            (STREAM_MIN_CAP, false),
            (LARGE_MARGINS_MIN_CAP, true),
            (1 << 20, true),
        ] {
            let mut z = Zstd::new(15, 1 << 20).expect("zstd context");
            z.ratio = 1.02;
            let mut dst = vec![0u8; cap];
            let before = PIECE_BYTES.load(Ordering::Relaxed);
            let (consumed, written) = z.compress_destsize(&text, &mut dst);
            let work = PIECE_BYTES.load(Ordering::Relaxed) - before;
            assert_eq!(work > 0, pieces, "{cap}: {work} bytes of pieces");
            assert!(
                consumed > cap && written <= cap && written > cap - 2048,
                "{cap}: {consumed} in {written}"
            );
            let mut back = vec![0u8; consumed];
            decompress(&dst[..written], &mut back, false).expect("decodes");
            assert!(back == text[..consumed], "{cap}");
        }
    }
}
