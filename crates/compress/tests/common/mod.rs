//! Shared inputs and helpers for the codec tests.
#![allow(dead_code)]

use ferofs_compress::{CompressorSpec, DecompressConfig};

/// Deterministic xorshift64 stream.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Text-like, compressible (about 3-5x): words from a vocabulary with numbers and
/// punctuation, so the ratio resembles source code rather than a repeated pattern.
pub fn text(n: usize, seed: u64) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "erofs",
        "pcluster",
        "kernel",
        "compress",
        "block",
        "read-only",
        "image",
        "fixed",
        "inode",
        "superblock",
        "the",
        "a",
        "of",
        "to",
        "and",
        "is",
        "in",
        "for",
        "return",
        "struct",
        "static",
        "int",
        "unsigned",
        "const",
        "if",
        "else",
        "while",
        "err",
        "offset",
        "length",
        "buffer",
        "page",
        "folio",
        "map",
        "lcluster",
        "decompress",
    ];
    let mut r = Rng(seed | 1);
    let mut v = Vec::with_capacity(n + 32);
    while v.len() < n {
        let w = WORDS[r.below(WORDS.len())];
        v.extend_from_slice(w.as_bytes());
        match r.below(12) {
            0 => v.extend_from_slice(format!("({})", r.below(100_000)).as_bytes()),
            1 => v.extend_from_slice(b";\n\t"),
            2 => v.push(b','),
            3 => v.extend_from_slice(format!("_{:x}", r.below(4096)).as_bytes()),
            _ => {}
        }
        v.push(b' ');
    }
    v.truncate(n);
    v
}

/// Incompressible.
pub fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    (0..n).map(|_| r.next() as u8).collect()
}

/// Runs of text, random bytes and zeros.
pub fn mixed(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let mut v = Vec::with_capacity(n + 8192);
    while v.len() < n {
        let len = 500 + r.below(6000);
        match r.below(3) {
            0 => v.extend_from_slice(&text(len, r.next())),
            1 => v.extend_from_slice(&random(len, r.next())),
            _ => v.resize(v.len() + len, 0),
        }
    }
    v.truncate(n);
    v
}

pub fn inputs(cap: usize) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("text", text(cap * 12, 1)),
        ("random", random(cap * 2, 2)),
        ("zeros", vec![0u8; cap * 4]),
        ("mixed", mixed(cap * 8, 3)),
    ]
}

pub fn spec(s: &str) -> CompressorSpec {
    CompressorSpec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

pub fn cfg(spec: &CompressorSpec, max_pcluster: usize) -> DecompressConfig {
    DecompressConfig {
        lzma_dict: spec.effective_dict(max_pcluster as u32),
    }
}

/// Every encoder at a representative set of levels.
pub const SPECS: [&str; 11] = [
    "lz4",
    "lz4hc",
    "lz4hc,12",
    "lzma,6",
    "lzma,0",
    "deflate,6",
    "deflate,1",
    "deflate,12",
    "zstd,3",
    "zstd,15",
    "zstd,-5",
];

pub const CAPS: [usize; 4] = [4096, 16384, 65536, 1 << 20];
