//! # ferofs-compress — the codecs EROFS uses, behind two small interfaces
//!
//! - **Fixed-output compression** ([`FixedOutputCompressor`]): "fill at most N bytes
//!   of output from the longest prefix of this input you can, and tell me how much
//!   input you took". This is what lets EROFS store each extent in a whole number of
//!   blocks. LZ4/LZ4HC and MicroLZMA do it natively (liblz4's destSize functions,
//!   liblzma's MicroLZMA encoder); DEFLATE and Zstandard have no such API, so
//!   [`search`] finds the longest prefix that fits with a few trial compressions.
//! - **Decompression** ([`decompress`]): a stream into a caller-sized buffer, fully or
//!   as a prefix ("partial"), never panicking and never allocating from stream data.
//!
//! On-disk algorithm ids: 0 LZ4, 1 MicroLZMA, 2 DEFLATE, 3 Zstandard. All C code comes
//! from crates that bundle its sources; the only `unsafe` is in [`ffi`].

mod ffi;
pub mod search;

#[cfg(feature = "deflate")]
mod deflate;
#[cfg(feature = "lz4")]
mod lz4;
#[cfg(feature = "lzma")]
mod lzma;
#[cfg(feature = "zstd")]
mod zstd_codec;

use std::fmt;

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
    /// Default level and the accepted range.
    pub fn levels(self) -> (i32, std::ops::RangeInclusive<i32>) {
        match self {
            Encoder::Lz4 => (1, 1..=1),
            Encoder::Lz4hc => (9, 1..=12),
            Encoder::Lzma => (6, 0..=9),
            Encoder::Deflate => (6, 1..=12),
            Encoder::Zstd => (3, -22..=22),
        }
    }
}

/// An encoder with its settings, e.g. parsed from `lz4hc,level=12` or `zstd,15`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompressorSpec {
    pub encoder: Encoder,
    pub level: i32,
    /// LZMA dictionary size / zstd and deflate window in bytes (None: derived from the
    /// pcluster size as mkfs.erofs does).
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
    #[error("compressor {0} is not built in")]
    NotBuilt(&'static str),
}

impl CompressorSpec {
    /// Parse `ALG[,level=N|,N][,dictsize=BYTES]`.
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let mut parts = s.split(',');
        let name = parts.next().unwrap_or("");
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
                Some((k, v)) => (k, v),
                None => ("level", p),
            };
            match k {
                "level" => level = v.parse().map_err(|_| SpecError::Option(p.to_string()))?,
                "dictsize" | "window" => {
                    let v = v.trim();
                    let (num, mul) = match v.chars().last() {
                        Some('k' | 'K') => (&v[..v.len() - 1], 1024),
                        Some('m' | 'M') => (&v[..v.len() - 1], 1 << 20),
                        _ => (v, 1),
                    };
                    let n: u32 = num.parse().map_err(|_| SpecError::Option(p.to_string()))?;
                    dict_size = Some(
                        n.checked_mul(mul)
                            .ok_or_else(|| SpecError::Option(p.to_string()))?,
                    );
                }
                _ => return Err(SpecError::Option(p.to_string())),
            }
        }
        if !range.contains(&level) {
            return Err(SpecError::Level {
                encoder: encoder.name(),
                level,
                range: format!("{}..={}", range.start(), range.end()),
            });
        }
        Ok(CompressorSpec {
            encoder,
            level,
            dict_size,
        })
    }

    /// The dictionary/window actually used for a maximum pcluster size (mkfs.erofs's
    /// defaults, clamped to what the kernel accepts).
    pub fn effective_dict(&self, max_pcluster: u32) -> u32 {
        match self.encoder.algorithm() {
            Algorithm::Lz4 => 65535,
            Algorithm::Lzma => self
                .dict_size
                .unwrap_or(max_pcluster.saturating_mul(8))
                .clamp(32 << 10, 8 << 20),
            Algorithm::Deflate => self
                .dict_size
                .unwrap_or(32 << 10)
                .clamp(256, 32 << 10)
                .next_power_of_two(),
            Algorithm::Zstd => {
                let w = self.dict_size.unwrap_or(max_pcluster.saturating_mul(8));
                w.clamp(1 << 10, 1 << 20).next_power_of_two().min(1 << 20)
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
    /// `dst.len()`). Returns (consumed, written); (0, 0) when nothing useful fits (the
    /// caller stores the data uncompressed). A stream never starts with a zero byte.
    fn compress_destsize(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize);
}

/// A compressor for `spec`, for pclusters of at most `max_pcluster` bytes.
pub fn new_compressor(
    spec: &CompressorSpec,
    max_pcluster: u32,
) -> Result<Box<dyn FixedOutputCompressor>, SpecError> {
    let dict = spec.effective_dict(max_pcluster);
    match spec.encoder {
        #[cfg(feature = "lz4")]
        Encoder::Lz4 => Ok(Box::new(lz4::Lz4Fast)),
        #[cfg(feature = "lz4")]
        Encoder::Lz4hc => Ok(Box::new(lz4::Lz4Hc::new(spec.level))),
        #[cfg(feature = "lzma")]
        Encoder::Lzma => Ok(Box::new(lzma::MicroLzma {
            level: spec.level as u32,
            dict,
        })),
        #[cfg(feature = "deflate")]
        Encoder::Deflate => Ok(Box::new(deflate::Deflate::new(spec.level))),
        #[cfg(feature = "zstd")]
        Encoder::Zstd => Ok(Box::new(zstd_codec::Zstd::new(spec.level, dict)?)),
        #[allow(unreachable_patterns)]
        e => Err(SpecError::NotBuilt(e.name())),
    }
}

/// The configuration record payload (after the u16 length) for the superblock's
/// compression configs (format doc §1.5).
pub fn config_record(alg: Algorithm, dict: u32, max_pcluster_blocks: u16) -> Vec<u8> {
    match alg {
        Algorithm::Lz4 => {
            let mut v = vec![0u8; 14];
            v[0..2].copy_from_slice(&0xFFFFu16.to_le_bytes());
            v[2..4].copy_from_slice(&max_pcluster_blocks.to_le_bytes());
            v
        }
        Algorithm::Lzma => {
            let mut v = vec![0u8; 14];
            v[0..4].copy_from_slice(&dict.to_le_bytes());
            v
        }
        Algorithm::Deflate => {
            let mut v = vec![0u8; 6];
            v[0] = dict.trailing_zeros() as u8;
            v
        }
        Algorithm::Zstd => {
            let mut v = vec![0u8; 6];
            v[1] = (dict.trailing_zeros().saturating_sub(10)) as u8;
            v
        }
    }
}

/// What a decoder needs from the superblock.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecompressConfig {
    /// LZMA dictionary size from the config record (bytes).
    pub lzma_dict: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{alg:?}: {what}")]
pub struct DecompressError {
    pub alg: Algorithm,
    pub what: &'static str,
}

/// Decompress `src` (the exact stream) into `dst`. Without `partial`, the stream must
/// produce exactly `dst.len()` bytes; with it, at least `dst.len()` bytes (only the
/// first `dst.len()` are produced).
pub fn decompress(
    alg: Algorithm,
    src: &[u8],
    dst: &mut [u8],
    partial: bool,
    cfg: &DecompressConfig,
) -> Result<(), DecompressError> {
    let err = |what| DecompressError { alg, what };
    if src.is_empty() {
        return Err(err("empty stream"));
    }
    let produced = match alg {
        #[cfg(feature = "lz4")]
        Algorithm::Lz4 => {
            ffi::lz4::decompress_partial(src, dst).ok_or(err("corrupt LZ4 stream"))?
        }
        #[cfg(feature = "lzma")]
        Algorithm::Lzma => ffi::lzma::microlzma_decode(src, dst, !partial, cfg.lzma_dict.max(4096))
            .ok_or(err("corrupt MicroLZMA stream"))?,
        #[cfg(feature = "deflate")]
        Algorithm::Deflate => deflate::inflate(src, dst).ok_or(err("corrupt DEFLATE stream"))?,
        #[cfg(feature = "zstd")]
        Algorithm::Zstd => {
            zstd_codec::decompress(src, dst).ok_or(err("corrupt Zstandard stream"))?
        }
        #[allow(unreachable_patterns)]
        _ => return Err(err("algorithm not built in")),
    };
    let _ = cfg;
    if produced != dst.len() {
        return Err(err("stream shorter than the extent"));
    }
    Ok(())
}
