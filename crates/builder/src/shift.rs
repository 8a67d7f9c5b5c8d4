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
//! - Workers cut every segment at content-defined *anchors*. The segment is read as
//!   4-byte words, and a rolling hash runs over them (each step shifts the hash one
//!   bit and adds the word times an odd constant, so a hash depends on the last 64
//!   words: 256 bytes); a word end whose hash has its top 6 bits clear is an anchor
//!   (one in 64 words, one in 256 bytes). An anchor depends only on those 256 bytes,
//!   so repeated data has the same anchors wherever it sits, as long as it sits at
//!   the same offset modulo 4.
//! - Each written pcluster is indexed by its first anchor of each of the four word
//!   alignments (its data read as words from its 1st, 2nd, 3rd and 4th byte) and the
//!   xxh3 of its first 4 KiB: a repeat at any offset has one of the four where the
//!   segment's scan looks.
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
use rustc_hash::FxHashMap as HashMap;

/// Bytes hashed to filter a candidate before its source is read again.
pub const PRE: usize = 4096;
/// Anchors a segment may have at most, per byte (pathological data: every position).
const MAX_ANCHOR_DENSITY: usize = 64;
/// Files shorter than this are not searched for shifted matches (nor indexed).
pub const MIN_FILE: u64 = 16 << 10;
/// Entries the index holds at most (about 56 MiB).
const MAX_ENTRIES: usize = 1 << 20;

/// Bytes of a word of the rolling hash.
pub const WORD: usize = 4;
/// Words an anchor's hash depends on.
const WINDOW_WORDS: usize = 64;
/// Bytes of a piece scanned, per alignment, for its first anchor.
const SIG_SCAN: usize = 16 << 10;
/// Pclusters remembered per anchor hash (the first ones with it).
pub const CANDIDATES: usize = 4;

/// The multiplier of the rolling hash: odd, and such that no run of one byte (every
/// word the same) settles on an anchor (that would put an anchor at every word of a
/// run of zeros). A run of word w settles at t*(2^64-1) = -t, t its term.
fn word_k() -> u64 {
    static K: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        let mut k = 0x9e37_79b9_7f4a_7c15_u64;
        // Bounded: each candidate fails with probability about 256/64.
        for _ in 0..1000 {
            let runs_clear = (0..=255u64).all(|b| {
                let w = b * 0x0101_0101;
                !is_anchor(word_term(w, k).wrapping_neg())
            });
            if runs_clear {
                break;
            }
            k = k.wrapping_add(0x6a09_e667_f3bc_c908) | 1;
        }
        k
    })
}

/// What a word adds to the rolling hash (bit 32 set, so a zero word adds something).
fn word_term(w: u64, k: u64) -> u64 {
    (w | 1 << 32).wrapping_mul(k)
}

fn is_anchor(h: u64) -> bool {
    h >> 58 == 0
}

/// Anchor positions and hashes.
pub type Anchors = Vec<(u32, u64)>;

/// Anchors of `data[from..]` read as words from `from`: the positions (index of an
/// anchor's last byte, relative to `data`) and hashes, at most `cap`, in order.
fn scan(data: &[u8], from: usize, cap: usize) -> Anchors {
    let k = word_k();
    let mut v = Vec::new();
    let mut h = 0u64;
    let Some(body) = data.get(from..) else {
        return v;
    };
    for (i, c) in body.chunks_exact(WORD).enumerate() {
        let w = <[u8; WORD]>::try_from(c).map_or(0, u32::from_le_bytes);
        h = (h << 1).wrapping_add(word_term(u64::from(w), k));
        if i + 1 >= WINDOW_WORDS && is_anchor(h) {
            if v.len() >= cap {
                break;
            }
            v.push(((from + WORD * i + WORD - 1) as u32, h));
        }
    }
    v
}

/// Stretches [`anchors`] hashes side by side.
const LANES: usize = 4;

/// Anchor positions of `data` (index of the anchor's last byte: 3 modulo 4, at least
/// 255) and their hashes, in order; at most one in `MAX_ANCHOR_DENSITY` bytes.
///
/// A hash depends on the 64 words before it only, so `data` is cut into [`LANES`]
/// stretches hashed side by side, each started 63 words early: independent chains,
/// which the CPU runs in parallel, with the result of one.
pub fn anchors(data: &[u8]) -> Anchors {
    let cap = data.len() / MAX_ANCHOR_DENSITY + 16;
    let words = data.len() / WORD;
    if words < WINDOW_WORDS {
        return Vec::new();
    }
    let k = word_k();
    let word = |i: usize| -> u64 {
        data.get(WORD * i..WORD * i + WORD)
            .and_then(|c| <[u8; WORD]>::try_from(c).ok())
            .map_or(0, |c| u64::from(u32::from_le_bytes(c)))
    };
    // Anchor candidates: words 63..words, cut into LANES stretches (the last ones may
    // be shorter, or empty).
    let first = WINDOW_WORDS - 1;
    let per = (words - first).div_ceil(LANES);
    let starts: [usize; LANES] = std::array::from_fn(|l| (first + l * per).min(words));
    let ends: [usize; LANES] = std::array::from_fn(|l| (first + (l + 1) * per).min(words));
    let mut h = [0u64; LANES];
    for l in 0..LANES {
        for i in starts[l] + 1 - WINDOW_WORDS..starts[l] {
            h[l] = (h[l] << 1).wrapping_add(word_term(word(i), k));
        }
    }
    let mut found: [Anchors; LANES] = Default::default();
    let lane = |l: usize| data.get(WORD * starts[l]..WORD * ends[l]).unwrap_or(&[]);
    // All lanes side by side for as many words as the shortest has.
    let n = (0..LANES).map(|l| ends[l] - starts[l]).min().unwrap_or(0);
    let (s0, s1, s2, s3) = (lane(0), lane(1), lane(2), lane(3));
    let w = |c: &[u8]| u64::from(<[u8; WORD]>::try_from(c).map_or(0, u32::from_le_bytes));
    for (i, (((c0, c1), c2), c3)) in s0
        .chunks_exact(WORD)
        .zip(s1.chunks_exact(WORD))
        .zip(s2.chunks_exact(WORD))
        .zip(s3.chunks_exact(WORD))
        .take(n)
        .enumerate()
    {
        h[0] = (h[0] << 1).wrapping_add(word_term(w(c0), k));
        h[1] = (h[1] << 1).wrapping_add(word_term(w(c1), k));
        h[2] = (h[2] << 1).wrapping_add(word_term(w(c2), k));
        h[3] = (h[3] << 1).wrapping_add(word_term(w(c3), k));
        if is_anchor(h[0].min(h[1]).min(h[2].min(h[3]))) {
            for (l, &hl) in h.iter().enumerate() {
                // Each stretch keeps at most `cap`: the first `cap` of all lie among those.
                if is_anchor(hl) && found[l].len() < cap {
                    found[l].push(((WORD * (starts[l] + i) + WORD - 1) as u32, hl));
                }
            }
        }
    }
    // The longer stretches finish alone.
    for (l, hl) in h.iter_mut().enumerate() {
        for i in starts[l] + n..ends[l] {
            *hl = (*hl << 1).wrapping_add(word_term(word(i), k));
            if is_anchor(*hl) && found[l].len() < cap {
                found[l].push(((WORD * i + WORD - 1) as u32, *hl));
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

/// How to recognise a written piece's data: its first anchor of each word alignment
/// and its first bytes.
#[derive(Debug, Clone, Copy)]
pub struct Sig {
    /// Per alignment (the piece read as words from its byte 0, 1, 2, 3): the offset
    /// from the piece's start and the hash of its first anchor, if its first bytes
    /// have one.
    pub anchors: [Option<(u32, u64)>; WORD],
    pub pre: u64,
    /// Logical bytes of the piece.
    pub len: u32,
}

impl Sig {
    /// The anchors a piece is found by: (offset from its start, hash).
    pub fn keys(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.anchors.iter().flatten().copied()
    }
}

/// The signature of the piece `data[start..start + len]`, if it has an anchor of its
/// own within its first `SIG_SCAN` bytes.
pub fn sig(data: &[u8], start: usize, len: usize) -> Option<Sig> {
    let end = start.checked_add(len)?;
    if end > data.len() || len < 2 * PRE.min(64) {
        return None;
    }
    let stop = end.min(start.saturating_add(SIG_SCAN));
    let piece = &data[start..stop];
    let mut found: [Option<(u32, u64)>; WORD] = [None; WORD];
    for (r, slot) in found.iter_mut().enumerate() {
        *slot = scan(piece, r, 1).first().copied();
    }
    if found.iter().all(Option::is_none) {
        return None;
    }
    Some(Sig {
        anchors: found,
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
    /// Anchor hash -> (entry, the anchor's offset from the pcluster's start).
    by_anchor: HashMap<u64, Vec<(u32, u32)>>,
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
        // The first pclusters with an anchor keep it: deterministic, and the oldest
        // data is the likeliest to be repeated.
        for (off, h) in sig.keys() {
            let v = self.by_anchor.entry(h).or_default();
            if v.len() < CANDIDATES {
                v.push((id, off));
            }
        }
        Some(id)
    }

    /// Forget entries (their file was rolled back: its blocks are rewritten).
    pub fn remove(&mut self, ids: &[u32]) {
        for &id in ids {
            if let Some(e) = self.entries.get_mut(id as usize) {
                e.alive = false;
                for (_, h) in e.sig.keys() {
                    if let Some(v) = self.by_anchor.get_mut(&h) {
                        v.retain(|x| x.0 != id);
                    }
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
    let Some(cands) = idx.by_anchor.get(&h) else {
        return Ok(Vec::new());
    };
    // Bounded: at most CANDIDATES entries a hash.
    for &(first, anchor_off) in cands {
        let chain = find_from(
            idx, ver, data, base, q, first, anchor_off, from, limit, alg, min_len,
        )?;
        if !chain.is_empty() {
            return Ok(chain);
        }
    }
    Ok(Vec::new())
}

/// [`find`] for one candidate: entry `first`, whose anchor lies `anchor_off` bytes
/// into its data.
#[allow(clippy::too_many_arguments)]
fn find_from(
    idx: &Index,
    ver: &mut Verifier,
    data: &[u8],
    base: u64,
    q: usize,
    first: u32,
    anchor_off: u32,
    from: usize,
    limit: usize,
    alg: usize,
    min_len: &dyn Fn(u16) -> usize,
) -> Result<Vec<Match>> {
    let mut chain = Vec::new();
    let Some(e) = idx.entries.get(first as usize) else {
        return Ok(chain);
    };
    let Some(start) = q.checked_sub(anchor_off as usize) else {
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
    fn anchors_depend_only_on_the_last_256_bytes_at_one_alignment() {
        let data = ferofs_testkit::noise(200_000, 1);
        // A copy shifted by a multiple of 4 has the same anchors past its first 256 bytes.
        let a = anchors(&data[1000..]);
        let b = anchors(&data[4..]);
        let shifted: Vec<(u32, u64)> = b
            .iter()
            .filter(|&&(p, _)| p as usize >= 996 + 255)
            .map(|&(p, h)| (p - 996, h))
            .collect();
        assert_eq!(a, shifted);
        // About one in 256 bytes.
        assert!(a.len() > 500 && a.len() < 1100, "{} anchors", a.len());
        // A piece's signature finds its data at any shift: the anchor of the
        // alignment the scan uses is one of the piece's keys.
        for s in 1000..1004usize {
            let sg = sig(&data, s, 20_000).expect("signed");
            let seg = &data[s - 600..];
            let hit = anchors(seg).into_iter().any(|(q, h)| {
                sg.keys().any(|(off, k)| {
                    k == h && q as usize >= off as usize && q as usize - off as usize == 600
                })
            });
            assert!(hit, "shift {s}");
        }
    }

    #[test]
    fn stretches_side_by_side_give_the_serial_anchors() {
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
            0, 3, 255, 256, 259, 260, 261, 263, 264, 267, 268, 271, 272, 1000, 4099, 65_536,
            300_000,
        ] {
            let cap = len / MAX_ANCHOR_DENSITY + 16;
            assert_eq!(
                anchors(&data[..len]),
                scan(&data[..len], 0, cap),
                "len {len}"
            );
        }
        let dense: Vec<u8> = (0..50_000u32).map(|i| (i % 12) as u8).collect();
        let cap = dense.len() / MAX_ANCHOR_DENSITY + 16;
        assert_eq!(anchors(&dense), scan(&dense, 0, cap));
    }

    #[test]
    #[ignore]
    fn anchors_speed() {
        let mut x = 99u64;
        let data: Vec<u8> = (0..(64 << 20))
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 40) as u8
            })
            .collect();
        let t = std::time::Instant::now();
        let mut n = 0;
        for _ in 0..5 {
            n += anchors(&data).len();
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "anchors: {:.2} GB/s ({n})",
            5.0 * data.len() as f64 / s / 1e9
        );
    }

    #[test]
    fn runs_of_one_byte_have_no_anchors() {
        for b in 0..=255u8 {
            assert!(anchors(&[b; 10_000]).is_empty(), "byte {b}");
        }
    }
}
