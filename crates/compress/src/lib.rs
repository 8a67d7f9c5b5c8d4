//! # ferofs-compress — the codecs EROFS uses, behind two small interfaces
//!
//! What this crate owns: turning file data into compressed pcluster streams and back,
//! for the four on-disk algorithms (0 LZ4, 1 MicroLZMA, 2 DEFLATE, 3 Zstandard), plus
//! the per-algorithm config records of the superblock (format doc §1.5, §9).
//!
//! Data flow:
//!
//! - **Choosing**: a user string (`"lz4hc,level=12"`, `"zstd,15"`) parses into a
//!   [`CompressorSpec`] (an [`Encoder`] — lz4hc is an encoder writing algorithm 0 — plus
//!   level and dictionary/window). [`CompressorSpec::effective_dict`] fixes the
//!   dictionary for the largest pcluster; [`config_record`] encodes it for the
//!   superblock.
//! - **Writing**: [`new_compressor`] gives a [`FixedOutputCompressor`]: "fill at most N
//!   bytes of output from the longest prefix of this input you can, and tell me how
//!   much input you took". That is what lets EROFS store each extent in a whole number
//!   of blocks. LZ4/LZ4HC (`lz4.rs`) and MicroLZMA (`lzma.rs`) do it natively;
//!   DEFLATE (`deflate.rs`) and Zstandard (`zstd_codec.rs`) have no such API, so
//!   [`search`] finds the longest prefix that fits with a few trial compressions.
//! - **Reading**: [`decompress`] turns one stream into a caller-sized buffer, whole or
//!   as a prefix ("partial"), never panicking and never allocating from stream data.
//!
//! All C code comes from crates that bundle its sources (liblz4, liblzma, libdeflate,
//! libzstd); a plain `cargo build` needs only a C compiler. The only `unsafe` is in
//! `ffi` (liblz4, liblzma and libzstd calls, and glibc's `mallopt`). One cargo feature
//! per algorithm, all default.

mod ffi;
pub mod probe;
#[doc(hidden)]
pub mod search;

#[cfg(feature = "deflate")]
#[doc(hidden)]
pub mod deflate;
#[cfg(feature = "deflate")]
mod deflate_enc;
#[cfg(feature = "lz4")]
mod lz4;
#[cfg(feature = "lzma")]
mod lzma;
#[cfg(feature = "zstd")]
mod zstd_codec;
#[cfg(feature = "zstd")]
pub use zstd_codec::{
    GUIDE_BYTES, PIECE_BYTES, PIECE_CONSUMED, PIECE_EARLY_ENDS, PIECE_OVERFLOWS, PIECE_REPLAYED,
    STREAM_MIN_CAP,
};

use std::fmt;
use std::sync::atomic::AtomicU64;

/// Calls of the codecs that fill a pcluster natively (LZ4HC, MicroLZMA) in this
/// process, and the input bytes they consumed (for benchmarks; not part of the API).
/// Together with the zstd and search counters this is all the slow codecs' input.
pub static NATIVE_CALLS: AtomicU64 = AtomicU64::new(0);
pub static NATIVE_CONSUMED: AtomicU64 = AtomicU64::new(0);

pub(crate) fn count_native(consumed: usize) {
    use std::sync::atomic::Ordering::Relaxed;
    NATIVE_CALLS.fetch_add(1, Relaxed);
    NATIVE_CONSUMED.fetch_add(consumed as u64, Relaxed);
}

/// Bound the arenas glibc's malloc keeps to `n` (no-op on other C libraries); true
/// when set. Call before starting threads. glibc gives each new thread an arena of
/// its own, up to eight per core, and each keeps the memory freed in it: with many
/// compression workers each arena held its own high-water mark of results in flight,
/// and a build at `-j 8` took 540-620 MiB where its heap peaked near 310 MiB.
pub fn limit_malloc_arenas(n: u32) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        ffi::malloc::set_arena_max(n)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = n;
        false
    }
}

/// A cheap sufficient test that data compresses into `out.len()` bytes: whether LZ4
/// at its fastest does (into `out`), and into how many bytes; every other codec
/// compresses about as well or better. Its cost is bounded by `out.len()`, not by
/// `src.len()`. Always None without LZ4 support.
pub fn lz4_fits(src: &[u8], out: &mut [u8]) -> Option<usize> {
    #[cfg(feature = "lz4")]
    return lz4::fast_fits(src, out);
    #[cfg(not(feature = "lz4"))]
    {
        let _ = (src, out);
        None
    }
}

/// How much of `src` LZ4 at its fastest fits into `out` (its cost is bounded by
/// `out.len()`); all of it without LZ4 support.
pub(crate) fn lz4_prefix(src: &[u8], out: &mut [u8]) -> usize {
    #[cfg(feature = "lz4")]
    return lz4::fast_prefix(src, out);
    #[cfg(not(feature = "lz4"))]
    {
        let _ = out;
        src.len()
    }
}

/// On-disk algorithm ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    Lz4 = 0,
    Lzma = 1,
    Deflate = 2,
    Zstd = 3,
}

impl Algorithm {
    pub fn id(self) -> u8 {
        self as u8
    }
    pub fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            0 => Self::Lz4,
            1 => Self::Lzma,
            2 => Self::Deflate,
            3 => Self::Zstd,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Lz4 => "lz4",
            Self::Lzma => "lzma",
            Self::Deflate => "deflate",
            Self::Zstd => "zstd",
        }
    }
    /// Whether this build can encode and decode the algorithm (cargo features).
    pub fn is_built(self) -> bool {
        match self {
            Self::Lz4 => cfg!(feature = "lz4"),
            Self::Lzma => cfg!(feature = "lzma"),
            Self::Deflate => cfg!(feature = "deflate"),
            Self::Zstd => cfg!(feature = "zstd"),
        }
    }
}

/// What a user picks: an encoder (lz4hc writes algorithm 0 too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoder {
    Lz4,
    Lz4hc,
    Lzma,
    Deflate,
    Zstd,
}

impl Encoder {
    pub fn algorithm(self) -> Algorithm {
        match self {
            Encoder::Lz4 | Encoder::Lz4hc => Algorithm::Lz4,
            Encoder::Lzma => Algorithm::Lzma,
            Encoder::Deflate => Algorithm::Deflate,
            Encoder::Zstd => Algorithm::Zstd,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Encoder::Lz4 => "lz4",
            Encoder::Lz4hc => "lz4hc",
            Encoder::Lzma => "lzma",
            Encoder::Deflate => "deflate",
            Encoder::Zstd => "zstd",
        }
    }
    /// Default level and the accepted range. MicroLZMA also accepts 100..=109, the
    /// "extreme" variants of 0..=9 (mkfs.erofs's convention; `9e` parses as 109).
    pub fn levels(self) -> (i32, std::ops::RangeInclusive<i32>) {
        match self {
            Encoder::Lz4 => (1, 1..=1),
            Encoder::Lz4hc => (9, 1..=12),
            Encoder::Lzma => (6, 0..=9),
            Encoder::Deflate => (6, 1..=12),
            Encoder::Zstd => (3, -131072..=22),
        }
    }
    fn level_ok(self, level: i32) -> bool {
        self.levels().1.contains(&level) || (self == Encoder::Lzma && (100..=109).contains(&level))
    }
}

/// An encoder with its settings, e.g. parsed from `lz4hc,level=12` or `zstd,15`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompressorSpec {
    pub encoder: Encoder,
    pub level: i32,
    /// LZMA dictionary size / zstd window in bytes (None: derived from the pcluster
    /// size as mkfs.erofs does). DEFLATE's window is always 32 KiB.
    pub dict_size: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("unknown compressor {0:?} (lz4, lz4hc, lzma, deflate, zstd)")]
    Unknown(String),
    #[error("{encoder}: level {level} out of range {range}")]
    Level {
        encoder: &'static str,
        level: i32,
        range: String,
    },
    #[error("bad compressor option {0:?}")]
    Option(String),
    #[error("{encoder}: dictionary size {size} invalid ({rule})")]
    Dict {
        encoder: &'static str,
        size: u32,
        rule: &'static str,
    },
    #[error("compressor {0} is not built in")]
    NotBuilt(&'static str),
}

/// Parse a byte count with an optional k/m suffix (binary units).
fn parse_size(v: &str) -> Option<u32> {
    let v = v.trim();
    let (num, mul) = match v.chars().last()? {
        'k' | 'K' => (&v[..v.len() - 1], 1u32 << 10),
        'm' | 'M' => (&v[..v.len() - 1], 1 << 20),
        _ => (v, 1),
    };
    num.parse::<u32>().ok()?.checked_mul(mul)
}

impl CompressorSpec {
    /// Parse `ALG[,level=N|,N][,dictsize=BYTES]` (BYTES may end in k or m).
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let mut parts = s.split(',');
        let name = parts.next().unwrap_or("").trim();
        let encoder = match name {
            "lz4" => Encoder::Lz4,
            "lz4hc" => Encoder::Lz4hc,
            "lzma" | "microlzma" => Encoder::Lzma,
            "deflate" | "libdeflate" => Encoder::Deflate,
            "zstd" => Encoder::Zstd,
            other => return Err(SpecError::Unknown(other.to_string())),
        };
        let (mut level, range) = encoder.levels();
        let mut dict_size = None;
        for p in parts {
            let (k, v) = match p.split_once('=') {
                Some((k, v)) => (k.trim(), v.trim()),
                None => ("level", p.trim()),
            };
            let bad = || SpecError::Option(p.to_string());
            match k {
                "level" => {
                    level = match v.strip_suffix('e') {
                        Some(n) if encoder == Encoder::Lzma => {
                            let n: i32 = n.parse().map_err(|_| bad())?;
                            if !(0..=9).contains(&n) {
                                return Err(bad());
                            }
                            100 + n
                        }
                        _ => v.parse().map_err(|_| bad())?,
                    }
                }
                "dictsize" | "window" => dict_size = Some(parse_size(v).ok_or_else(bad)?),
                _ => return Err(bad()),
            }
        }
        if !encoder.level_ok(level) {
            return Err(SpecError::Level {
                encoder: encoder.name(),
                level,
                range: match encoder {
                    Encoder::Lzma => "0..=9 or 100..=109 (extreme, also written 0e..9e)".into(),
                    _ => format!("{}..={}", range.start(), range.end()),
                },
            });
        }
        if let Some(size) = dict_size {
            let dict_err = |rule| SpecError::Dict {
                encoder: encoder.name(),
                size,
                rule,
            };
            match encoder.algorithm() {
                Algorithm::Lz4 => return Err(dict_err("LZ4 has a fixed 64 KiB window")),
                Algorithm::Lzma if !(4096..=8 << 20).contains(&size) => {
                    return Err(dict_err("MicroLZMA needs 4 KiB..=8 MiB"))
                }
                Algorithm::Deflate if size != 32 << 10 => {
                    return Err(dict_err("libdeflate always uses a 32 KiB window"))
                }
                Algorithm::Zstd if !size.is_power_of_two() || !(1024..=1 << 20).contains(&size) => {
                    return Err(dict_err("zstd needs a power of two in 1 KiB..=1 MiB"))
                }
                _ => {}
            }
        }
        Ok(CompressorSpec {
            encoder,
            level,
            dict_size,
        })
    }

    /// The dictionary/window used for pclusters of at most `max_pcluster` bytes, as
    /// declared in the config record: the user's value, else mkfs.erofs's default
    /// (LZMA `clamp(pcluster * 4, 32 KiB, 8 MiB)`, zstd `min(1 MiB, pow2floor(pcluster *
    /// 8))`, DEFLATE 32 KiB, LZ4 65535), always within the kernel's limits.
    pub fn effective_dict(&self, max_pcluster: u32) -> u32 {
        match self.encoder.algorithm() {
            Algorithm::Lz4 => 65535,
            Algorithm::Lzma => self
                .dict_size
                .unwrap_or(max_pcluster.saturating_mul(4).max(32 << 10))
                .clamp(4096, 8 << 20),
            Algorithm::Deflate => 32 << 10,
            Algorithm::Zstd => {
                let w = self
                    .dict_size
                    .unwrap_or(max_pcluster.saturating_mul(8))
                    .clamp(1 << 10, 1 << 20);
                1 << w.ilog2()
            }
        }
    }
}

impl fmt::Display for CompressorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},level={}", self.encoder.name(), self.level)?;
        if let Some(d) = self.dict_size {
            write!(f, ",dictsize={d}")?;
        }
        Ok(())
    }
}

/// Fixed-output compression of a prefix.
pub trait FixedOutputCompressor: Send {
    fn algorithm(&self) -> Algorithm;
    /// Compress the longest prefix of `src` whose stream fits in `dst` (capacity =
    /// `dst.len()`). Returns (consumed, written) with the stream in `dst[..written]`.
    /// A stream never starts with a zero byte. Returns (0, 0) only when `src` or `dst`
    /// is empty or no useful prefix fits: for `src` longer than `dst`, none longer
    /// than `dst.len()` bytes (storing the data uncompressed is then at least as good);
    /// for a shorter `src`, not the whole of it. Internal codec failures also give
    /// (0, 0), so the caller falls back to storing the data.
    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize);
    /// Forget what earlier inputs taught the compressor (the prefix search's ratio
    /// estimate), so the streams for the next inputs depend on those inputs alone. The
    /// builder calls this before every independently scheduled segment: that is what
    /// makes images byte-identical for any thread count.
    fn begin_stream(&mut self) {}
    /// Compress a prefix of `src` again into `dst`, smaller than the `whole_size` bytes
    /// all of `src` compressed to: for ending a file's pclusters on a block boundary
    /// and storing the rest inline (ztailpacking). Same contract as
    /// [`FixedOutputCompressor::compress_destsize`], except that the prefix may leave
    /// a little more of `dst` unused (the rest of the input is not lost: the caller
    /// compresses it into the tail). Codecs with a native fixed-output mode need
    /// nothing else; searching ones start from the known size and stop sooner.
    fn refit(&mut self, src: &[u8], dst: &mut [u8], whole_size: usize) -> (usize, usize) {
        let _ = whole_size;
        self.compress_destsize(src, dst)
    }
}

/// A compressor for `spec`, for pclusters of at most `max_pcluster` bytes (which
/// sizes the default dictionary/window, see [`CompressorSpec::effective_dict`]).
pub fn new_compressor(
    spec: &CompressorSpec,
    max_pcluster: u32,
) -> Result<Box<dyn FixedOutputCompressor>, SpecError> {
    let dict = spec.effective_dict(max_pcluster);
    let _ = dict;
    match spec.encoder {
        #[cfg(feature = "lz4")]
        Encoder::Lz4 => Ok(Box::new(lz4::Lz4Fast)),
        #[cfg(feature = "lz4")]
        Encoder::Lz4hc => Ok(Box::new(lz4::Lz4Hc::new(spec.level))),
        #[cfg(feature = "lzma")]
        Encoder::Lzma => Ok(Box::new(lzma::MicroLzma::new(spec.level, dict)?)),
        #[cfg(feature = "deflate")]
        Encoder::Deflate => Ok(Box::new(deflate::Deflate::new(spec.level))),
        #[cfg(feature = "zstd")]
        Encoder::Zstd => Ok(Box::new(zstd_codec::Zstd::new(spec.level, dict)?)),
        #[allow(unreachable_patterns)]
        e => Err(SpecError::NotBuilt(e.name())),
    }
}

/// The config record payload (what follows the u16 length) for the superblock's
/// compression configs (format doc §1.5): `dict` as from
/// [`CompressorSpec::effective_dict`] (ignored for LZ4, whose max_distance is 65535),
/// `max_pcluster_blocks` only used by LZ4.
pub fn config_record(alg: Algorithm, dict: u32, max_pcluster_blocks: u16) -> Vec<u8> {
    // log2 rounded up, so the declared window is never smaller than the one used.
    let log2_ceil = |v: u32| v.max(1).next_power_of_two().trailing_zeros();
    match alg {
        Algorithm::Lz4 => {
            let mut v = vec![0u8; 14];
            v[0..2].copy_from_slice(&0xFFFFu16.to_le_bytes());
            v[2..4].copy_from_slice(&max_pcluster_blocks.to_le_bytes());
            v
        }
        Algorithm::Lzma => {
            let mut v = vec![0u8; 14];
            v[0..4].copy_from_slice(&dict.clamp(4096, 8 << 20).to_le_bytes());
            v
        }
        Algorithm::Deflate => {
            let mut v = vec![0u8; 6];
            v[0] = log2_ceil(dict).clamp(9, 15) as u8;
            v
        }
        Algorithm::Zstd => {
            let mut v = vec![0u8; 6];
            v[1] = log2_ceil(dict).clamp(10, 20) as u8 - 10;
            v
        }
    }
}

/// What a decoder needs from the superblock.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecompressConfig {
    /// LZMA dictionary size from the config record (bytes; 0: unknown, 8 MiB assumed).
    pub lzma_dict: u32,
}

/// Why a stream did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The stream is empty.
    Empty,
    /// The codec rejected the data (the reason is the codec's).
    Corrupt(&'static str),
    /// The stream ended inside the data.
    Truncated,
    /// The stream decodes to fewer bytes than requested.
    Short { produced: usize, wanted: usize },
    /// A whole-stream decode: the stream holds more than the requested output.
    TooLong,
    /// The config record's parameters are unusable.
    BadConfig(&'static str),
    /// This algorithm is not compiled in (cargo feature off).
    NotBuilt,
    /// The codec could not set up (allocation or configuration failure).
    Internal(&'static str),
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Empty => write!(f, "empty stream"),
            ErrorKind::Corrupt(why) => write!(f, "corrupt stream: {why}"),
            ErrorKind::Truncated => write!(f, "truncated stream"),
            ErrorKind::Short { produced, wanted } => {
                write!(f, "stream decodes to {produced} bytes, {wanted} wanted")
            }
            ErrorKind::TooLong => write!(f, "stream holds more than the extent"),
            ErrorKind::BadConfig(why) => write!(f, "bad config: {why}"),
            ErrorKind::NotBuilt => write!(f, "algorithm not built in"),
            ErrorKind::Internal(why) => write!(f, "decoder failure: {why}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {kind}", .alg.name())]
pub struct DecompressError {
    pub alg: Algorithm,
    pub kind: ErrorKind,
}

/// Decompress `src` (exactly the stream, zero padding removed) into `dst`.
///
/// Without `partial`, the stream must decode to exactly `dst.len()` bytes and end
/// there (as the kernel checks for a whole extent). With `partial`, only the first
/// `dst.len()` bytes are produced; the stream may hold more, and decoding stops early.
/// Either way fewer bytes than `dst.len()` is an error. Never panics on bad data;
/// memory use is bounded by `dst` plus the codec's fixed state (at most the 1 MiB zstd
/// window or an LZMA dictionary capped at `min(dst.len(), 8 MiB)` rounded up).
pub fn decompress(
    alg: Algorithm,
    src: &[u8],
    dst: &mut [u8],
    partial: bool,
    cfg: &DecompressConfig,
) -> Result<(), DecompressError> {
    if src.is_empty() {
        return Err(DecompressError {
            alg,
            kind: ErrorKind::Empty,
        });
    }
    let _ = (&dst, partial, cfg);
    match alg {
        #[cfg(feature = "lz4")]
        Algorithm::Lz4 => lz4::decompress(src, dst, partial),
        #[cfg(feature = "lzma")]
        Algorithm::Lzma => lzma::decompress(src, dst, partial, cfg.lzma_dict),
        #[cfg(feature = "deflate")]
        Algorithm::Deflate => deflate::decompress(src, dst, partial),
        #[cfg(feature = "zstd")]
        Algorithm::Zstd => zstd_codec::decompress(src, dst, partial),
        #[allow(unreachable_patterns)]
        _ => Err(DecompressError {
            alg,
            kind: ErrorKind::NotBuilt,
        }),
    }
}
