//! Shifted dedupe (part of `-E dedupe`): data that repeats an earlier pcluster's
//! data at another offset (a binary linked twice with different headers, one archive
//! inside another) references that pcluster instead of being stored again.
//!
//! The format allows an extent to decode the *start* of any pcluster written before
//! (with `Z_EROFS_LI_PARTIAL_REF` when it uses only a prefix, full indexes only), at
//! any byte offset of the file. So a match must begin exactly where an earlier
//! pcluster's data begins.
//!
//! How matches are found:
//! - Workers cut every segment at content-defined *anchors*: positions where a gear
//!   rolling hash of the 64 bytes before them has its top 8 bits clear (one in 256).
//!   An anchor depends only on those 64 bytes, so repeated data has the same anchors
//!   wherever it sits.
//! - Each written pcluster is indexed by the hash of its first anchor (with its offset
//!   from the pcluster's start) and the xxh3 of its first 4 KiB.
//! - The committer, in job order, looks every anchor of a new segment up. A hit gives
//!   a candidate start; the 4 KiB hash filters it; the candidate's source bytes,
//!   read again, confirm the match byte for byte and give its exact length. A match
//!   that ends at the end of its pcluster continues with the next pcluster written
//!   from the same file.
//! - The pieces the match covers are replaced by references, and the bytes before
//!   and after it, up to the neighbouring piece boundaries, are compressed again. The
//!   change is kept only when it saves blocks (and, for a file that shares nothing
//!   yet, more than the full index it then needs).
//!
//! Everything happens on the committer in job order, so the image does not depend on
//! the thread count.

use crate::options::{io_err, Result};
use crate::source::Reader;
use crate::zdata::FileReq;
use std::collections::HashMap;

/// Bytes hashed to filter a candidate before its source is read again.
pub const PRE: usize = 4096;
/// Anchors a segment may have at most, per byte (pathological data: every position).
const MAX_ANCHOR_DENSITY: usize = 64;
/// Files shorter than this are not searched for shifted matches (nor indexed).
pub const MIN_FILE: u64 = 16 << 10;
/// Entries the index holds at most (about 56 MiB).
const MAX_ENTRIES: usize = 1 << 20;

/// The gear table: 256 fixed pseudo-random words (splitmix64 of a constant), none of
/// which makes a run of one repeated byte an anchor (that would put an anchor at every
/// position of a run of zeros).
fn gear() -> &'static [u64; 256] {
    static TABLE: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0u64; 256];
        let mut x = 0x6665_726f_6673_u64;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for v in t.iter_mut() {
            // A run of byte b settles at sum(G[b] << k) = G[b] * (2^64 - 1) = -G[b].
            // Bounded: each draw fails with probability 1/256.
            for _ in 0..64 {
                *v = next();
                if !is_anchor(v.wrapping_neg()) {
                    break;
                }
            }
        }
        t
    })
}

fn is_anchor(h: u64) -> bool {
    h >> 56 == 0
}

/// Anchor positions and hashes.
pub type Anchors = Vec<(u32, u64)>;

/// Anchor positions of `data` (index of the anchor's last byte, at least 63) and their
/// hashes, in order.
///
/// The hash at a position depends on the 64 bytes ending there only (each step shifts
/// older bytes one bit further out), so four stretches of `data` are hashed side by
/// side, each started 63 bytes early: one chain of dependent shift-and-adds a stretch,
/// which the CPU runs in parallel (2.5-3x faster than one chain), with the same result.
pub fn anchors(data: &[u8]) -> Anchors {
    const LANES: usize = 4;
    let cap = data.len() / MAX_ANCHOR_DENSITY + 16;
    let n = data.len();
    if n < 64 {
        return Vec::new();
    }
    // Positions 63..n are split into LANES stretches of `step` (the last one shorter).
    let step = (n - 63).div_ceil(LANES);
    let g = gear();
    let mut found: [Vec<(u32, u64)>; LANES] = Default::default();
    let mut h = [0u64; LANES];
    let mut at = [0usize; LANES];
    let mut end = [0usize; LANES];
    for l in 0..LANES {
        let from = (63 + l * step).min(n);
        end[l] = (from + step).min(n);
        // Warm up on the 63 bytes before the stretch.
        for &b in &data[from - 63..from] {
            h[l] = (h[l] << 1).wrapping_add(g[usize::from(b)]);
        }
        at[l] = from;
    }
    // The lanes advance together while all have bytes left, then each finishes alone.
    let common = (0..LANES).map(|l| end[l] - at[l]).min().unwrap_or(0);
    for k in 0..common {
        for l in 0..LANES {
            let i = at[l] + k;
            h[l] = (h[l] << 1).wrapping_add(g[usize::from(data[i])]);
            // Each lane keeps at most `cap`: the first `cap` of all lie among those.
            if is_anchor(h[l]) && found[l].len() < cap {
                found[l].push((i as u32, h[l]));
            }
        }
    }
    for l in 0..LANES {
        for i in at[l] + common..end[l] {
            h[l] = (h[l] << 1).wrapping_add(g[usize::from(data[i])]);
            if is_anchor(h[l]) && found[l].len() < cap {
                found[l].push((i as u32, h[l]));
            }
        }
    }
    let mut v: Anchors = Vec::with_capacity(found.iter().map(Vec::len).sum::<usize>().min(cap));
    for f in found {
        v.extend(f);
    }
    v.truncate(cap);
    v
}

/// How to recognise a written piece's data: its first anchor and first bytes.
#[derive(Debug, Clone, Copy)]
pub struct Sig {
    pub anchor: u64,
    /// Offset of the anchor from the piece's start.
    pub anchor_off: u32,
    pub pre: u64,
    /// Logical bytes of the piece.
    pub len: u32,
}

/// The signature of the piece `data[start..start + len]` (positions relative to the
/// segment whose `anchors` are given), if it has an anchor of its own.
pub fn sig(data: &[u8], anchors: &[(u32, u64)], start: usize, len: usize) -> Option<Sig> {
    let end = start.checked_add(len)?;
    if end > data.len() || len < 2 * PRE.min(64) {
        return None;
    }
    let from = start + 63;
    let i = anchors.partition_point(|&(p, _)| (p as usize) < from);
    let &(p, h) = anchors.get(i)?;
    if p as usize >= end {
        return None;
    }
    Some(Sig {
        anchor: h,
        anchor_off: (p as usize - start) as u32,
        pre: xxhash_rust::xxh3::xxh3_64(&data[start..start + PRE.min(len)]),
        len: u32::try_from(len).ok()?,
    })
}

/// A reference to a written pcluster (what a matched piece becomes).
#[derive(Debug, Clone, Copy)]
pub struct Ref {
    pub blkaddr: u32,
    pub blocks: u16,
    pub plain: bool,
    /// Only a prefix of the pcluster's data is used.
    pub partial: bool,
    /// The pcluster is an earlier piece of the same segment, not written yet: its
    /// index in the segment's pieces (`blkaddr` is filled in once it is written).
    pub local: Option<usize>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Index of the file in the stage's file list.
    file: u32,
    /// Offset of the pcluster's data in that file.
    off: u64,
    sig: Sig,
    pcl: Ref,
    alg: u16,
    alive: bool,
}

/// Every written pcluster with a signature, in write order.
#[derive(Default)]
pub struct Index {
    by_anchor: HashMap<u64, u32>,
    entries: Vec<Entry>,
}

impl Index {
    /// Record a pcluster written for `file` (its data from `off`, algorithm `alg`);
    /// returns its id when it was added.
    pub fn insert(&mut self, sig: Sig, file: usize, off: u64, pcl: Ref, alg: usize) -> Option<u32> {
        if self.entries.len() >= MAX_ENTRIES {
            return None;
        }
        let id = u32::try_from(self.entries.len()).ok()?;
        self.entries.push(Entry {
            file: u32::try_from(file).ok()?,
            off,
            sig,
            pcl: Ref {
                partial: false,
                local: None,
                ..pcl
            },
            alg: u16::try_from(alg).ok()?,
            alive: true,
        });
        // The first pcluster with an anchor keeps it: deterministic, and the oldest
        // data is the likeliest to be repeated.
        self.by_anchor.entry(sig.anchor).or_insert(id);
        Some(id)
    }

    /// Forget entries (their file was rolled back: its blocks are rewritten).
    pub fn remove(&mut self, ids: &[u32]) {
        for &id in ids {
            if let Some(e) = self.entries.get_mut(id as usize) {
                e.alive = false;
                if self.by_anchor.get(&e.sig.anchor) == Some(&id) {
                    self.by_anchor.remove(&e.sig.anchor);
                }
            }
        }
    }
}

/// One matched stretch: `len` bytes from `start` (absolute file offset) decode from the
/// start of `pcl`.
#[derive(Debug, Clone, Copy)]
pub struct Match {
    pub start: u64,
    pub len: u64,
    pub pcl: Ref,
}

/// Reads candidates' source bytes again, keeping the last file open.
pub struct Verifier<'a> {
    files: &'a [FileReq],
    open: Option<(usize, Reader<'a>)>,
    buf: Vec<u8>,
}

impl<'a> Verifier<'a> {
    pub fn new(files: &'a [FileReq]) -> Self {
        Verifier {
            files,
            open: None,
            buf: Vec::new(),
        }
    }

    /// How many leading bytes of `want` equal file `file`'s bytes at `off`.
    fn common_prefix(&mut self, file: usize, off: u64, want: &[u8]) -> Result<usize> {
        let files: &'a [FileReq] = self.files;
        let Some(req) = files.get(file) else {
            return Ok(0);
        };
        if self.open.as_ref().map(|(f, _)| *f) != Some(file) {
            self.open = Some((file, req.src.open(req.size)?));
        }
        let Some((_, h)) = self.open.as_ref() else {
            return Ok(0);
        };
        let path = h.path();
        const STEP: usize = 64 << 10;
        let mut done = 0usize;
        // Bounded: each pass compares up to STEP more bytes or stops.
        while done < want.len() {
            // What the file holds from here (a read never goes past its size).
            let left = req.size.saturating_sub(off + done as u64);
            let n = (STEP.min(want.len() - done) as u64).min(left) as usize;
            if n == 0 {
                break;
            }
            self.buf.resize(n, 0);
            h.read_exact_at(&mut self.buf[..n], off + done as u64)
                .map_err(io_err(path, "dedupe: read"))?;
            let got = n;
            let same = self.buf[..got]
                .iter()
                .zip(&want[done..done + got])
                .take_while(|(a, b)| a == b)
                .count();
            done += same;
            if same < n {
                break;
            }
        }
        Ok(done)
    }
}

/// The longest chain of matches starting exactly at `data[at]` (absolute offset
/// `base + at`), for the anchor hash `h` found at `q`, none reaching past `limit`
/// (relative to `data`). Each match is at least `min_len(blocks)` long.
#[allow(clippy::too_many_arguments)]
pub fn find(
    idx: &Index,
    ver: &mut Verifier,
    data: &[u8],
    base: u64,
    q: usize,
    h: u64,
    from: usize,
    limit: usize,
    alg: usize,
    min_len: &dyn Fn(u16) -> usize,
) -> Result<Vec<Match>> {
    let mut chain = Vec::new();
    let Some(&first) = idx.by_anchor.get(&h) else {
        return Ok(chain);
    };
    let Some(e) = idx.entries.get(first as usize) else {
        return Ok(chain);
    };
    let Some(start) = q.checked_sub(e.sig.anchor_off as usize) else {
        return Ok(chain);
    };
    if start < from || start >= limit {
        return Ok(chain);
    }
    let pre = PRE.min(e.sig.len as usize);
    if start + pre > limit || xxhash_rust::xxh3::xxh3_64(&data[start..start + pre]) != e.sig.pre {
        return Ok(chain);
    }
    let mut pos = start;
    let mut id = first as usize;
    // Bounded: each pass moves to the next entry or stops.
    while let Some(e) = idx.entries.get(id) {
        if !e.alive || usize::from(e.alg) != alg {
            break;
        }
        let want = (e.sig.len as usize).min(limit - pos);
        let k = ver.common_prefix(e.file as usize, e.off, &data[pos..pos + want])?;
        if k < min_len(e.pcl.blocks) {
            break;
        }
        chain.push(Match {
            start: base + pos as u64,
            len: k as u64,
            pcl: Ref {
                partial: k < e.sig.len as usize,
                ..e.pcl
            },
        });
        pos += k;
        if k < e.sig.len as usize {
            break;
        }
        match idx.entries.get(id + 1) {
            Some(n) if n.file == e.file && n.off == e.off + u64::from(e.sig.len) => id += 1,
            _ => break,
        }
    }
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_give_the_serial_anchors() {
        // One chain over the whole input, as the definition reads.
        fn serial(data: &[u8]) -> Anchors {
            let g = gear();
            let cap = data.len() / MAX_ANCHOR_DENSITY + 16;
            let (mut h, mut v) = (0u64, Vec::new());
            for (i, &b) in data.iter().enumerate() {
                h = (h << 1).wrapping_add(g[usize::from(b)]);
                if i >= 63 && is_anchor(h) {
                    if v.len() >= cap {
                        break;
                    }
                    v.push((i as u32, h));
                }
            }
            v
        }
        let mut x = 12345u64;
        let data: Vec<u8> = (0..300_000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 33) as u8
            })
            .collect();
        for len in [
            0, 1, 63, 64, 65, 66, 67, 100, 127, 128, 1000, 4099, 65_536, 300_000,
        ] {
            assert_eq!(anchors(&data[..len]), serial(&data[..len]), "len {len}");
        }
        // Dense anchors (a table-hitting pattern) stop at the cap, in order.
        let dense: Vec<u8> = (0..50_000u32).map(|i| (i % 7) as u8).collect();
        assert_eq!(anchors(&dense), serial(&dense));
    }

    #[test]
    fn anchors_depend_only_on_the_last_64_bytes() {
        let mut x = 1u64;
        let data: Vec<u8> = (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let a = anchors(&data[1000..]);
        let b = anchors(&data[3..]);
        // Every anchor of the shorter copy is an anchor of the longer one, shifted.
        let shifted: Vec<(u32, u64)> = b
            .iter()
            .filter(|&&(p, _)| p as usize >= 997 + 63)
            .map(|&(p, h)| (p - 997, h))
            .collect();
        assert_eq!(a, shifted);
        // About one in 256 positions.
        assert!(a.len() > 400 && a.len() < 1200, "{} anchors", a.len());
    }

    #[test]
    fn runs_of_one_byte_have_no_anchors() {
        for b in 0..=255u8 {
            assert!(anchors(&[b; 10_000]).is_empty(), "byte {b}");
        }
    }
}
