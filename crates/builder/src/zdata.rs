//! Compressed file data. Files are cut into segments that compress independently on
//! all cores; an ordered committer then writes them in inode order, so the output is
//! the same bytes for any thread count.
//!
//! Per segment, extents are produced greedily: the compressor fills one pcluster
//! (`-C` bytes) from the longest input prefix it can. An extent whose compressed
//! blocks would not be smaller than its input is stored PLAIN instead (one block,
//! uncompressed). At the end of a file the last extent may be inlined behind the inode
//! (ztailpacking), and a file that does not shrink at all is stored uncompressed.

use crate::data::{DataWriter, FileData};
use crate::frag::FragStore;
use crate::options::*;
use crate::out::Out;
use crate::shift;
use crate::similar::Sketch;
use crate::source::Source;
use ferofs_compress::probe::{Probe, CHUNK};
use ferofs_compress::{new_compressor, CompressorSpec, FixedOutputCompressor};
use ferofs_format::zindex::{ExtentDesc, HeadKind};
use rustc_hash::FxHashMap as HashMap;
use std::path::Path;
use std::sync::Arc;

/// Compression settings for a build.
#[derive(Debug, Clone)]
pub struct Compression {
    /// Algorithms in hint-index order; index 0 is the default.
    pub algorithms: Vec<CompressorSpec>,
    /// Default pcluster size in bytes (a multiple of the block size, <= 1 MiB).
    pub pcluster_size: u32,
    /// Inline the compressed tail behind the inode.
    pub ztailpacking: bool,
    /// Per-file policy, first match wins.
    pub hints: Vec<Hint>,
    /// Most bytes a compressed extent may decode to (`--max-extent-bytes`, mkfs.erofs's
    /// option): a bound on what one random read decompresses; 0: the kernel's limit.
    pub max_extent: u32,
    /// Full (8-byte) lcluster indexes for every compressed file, never compact ones
    /// (mkfs.erofs's `-E legacy-compress`; encoded extents of the 48-bit layout still
    /// win where shorter, as there).
    pub full_index: bool,
}

impl Default for Compression {
    fn default() -> Self {
        Compression {
            algorithms: vec![
                CompressorSpec::parse("lz4hc,level=9").unwrap_or(CompressorSpec {
                    encoder: ferofs_compress::Encoder::Lz4hc,
                    level: 9,
                    dict_size: None,
                }),
            ],
            pcluster_size: 4096,
            ztailpacking: false,
            hints: Vec::new(),
            max_extent: 0,
            full_index: false,
        }
    }
}

impl Compression {
    /// Most input one compressed extent may take.
    fn extent_cap(&self) -> usize {
        match self.max_extent {
            0 => MAX_EXTENT_INPUT,
            n => usize::try_from(n).map_or(MAX_EXTENT_INPUT, |n| n.min(MAX_EXTENT_INPUT)),
        }
    }

    /// Largest pcluster any file may use (sizes the dictionaries in the superblock).
    pub fn max_pcluster(&self) -> u32 {
        std::iter::once(self.pcluster_size)
            .chain(self.hints.iter().map(|h| h.pcluster_size))
            .max()
            .unwrap_or(self.pcluster_size)
    }
}

/// One line of a hints file: `PCLUSTER_BYTES [ALGORITHM_INDEX] REGEX`.
#[derive(Debug, Clone)]
pub struct Hint {
    pub pcluster_size: u32,
    pub algorithm: usize,
    pub regex: regex::Regex,
    /// The matching files are stored uncompressed (`--sort-compress none`);
    /// `algorithm` and `pcluster_size` are then not used for them.
    pub uncompressed: bool,
}

/// Parse a hints file in mkfs.erofs's `--compress-hints` format.
pub fn parse_hints(text: &str, path: &Path) -> Result<Vec<Hint>> {
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |what: String| BuildError::Invalid {
            path: path.to_path_buf(),
            what: format!("line {}: {what}", i + 1),
        };
        let mut it = line.split_whitespace();
        let size: u32 = it
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("pcluster size expected".into()))?;
        let rest: Vec<&str> = it.collect();
        let (alg, re) = match rest.as_slice() {
            [re] => (0usize, *re),
            [a, re] => (
                a.parse()
                    .map_err(|_| bad(format!("algorithm index {a:?}")))?,
                *re,
            ),
            _ => return Err(bad("expected `SIZE [ALG] REGEX`".into())),
        };
        let regex = regex::Regex::new(re).map_err(|e| bad(format!("regex: {e}")))?;
        v.push(Hint {
            pcluster_size: size,
            algorithm: alg,
            regex,
            uncompressed: false,
        });
    }
    Ok(v)
}

/// Where a compressed file's data went.
#[derive(Debug, Clone)]
pub struct ZFile {
    /// On-disk algorithm id for HEAD1 lclusters.
    pub alg_id: u8,
    pub extents: Vec<ExtentDesc>,
    /// ztailpacking: the last extent's stored bytes, behind the inode.
    pub inline: Option<(Vec<u8>, bool)>,
    pub blocks: u64,
    /// The tail extent is a fragment: its id while data is placed, then its offset in
    /// the packed inode's data.
    pub fragment: Option<u64>,
    /// Full (8-byte) lcluster indexes instead of compact ones (shared pclusters,
    /// fragment offsets of 2^32 and more and `Compression::full_index` need them).
    pub full_index: bool,
    /// Some extent points into a pcluster stored for another extent (the dedupe
    /// feature).
    pub shared: bool,
}

/// Result of storing one regular file.
#[derive(Debug, Clone)]
pub enum Stored {
    Compressed(ZFile),
    /// Stored uncompressed (did not shrink, or has holes).
    Data(FileData),
    /// The whole file is a fragment: its id while data is placed, then its offset.
    Fragment(u64),
}

/// What part of a file goes to the packed inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragMode {
    None,
    /// The tail extent, when it does not fill a pcluster.
    Tail,
    /// The whole file.
    Whole,
}

/// One compressed piece of a segment.
#[derive(Clone)]
struct Piece {
    lstart: u64,
    /// Compressed stream (not padded), or raw bytes for PLAIN.
    bytes: Vec<u8>,
    plain: bool,
    /// Raw bytes for the packed inode (always the last piece of a file).
    frag: bool,
    /// For a fragment: what it compressed to when that is known, else its length (a
    /// bound for deciding whether the file shrinks).
    est: u64,
    /// Shifted dedupe: the piece is a reference to a pcluster already written.
    refer: Option<shift::Ref>,
    /// Shifted dedupe: how to find this piece's data again once it is written.
    sig: Option<shift::Sig>,
}

struct Job {
    file: usize,
    src: Source,
    /// The whole file's size.
    size: u64,
    start: u64,
    end: u64,
    alg: usize,
    pcluster: u32,
    /// The job covers the whole file: its bytes come back with the pieces, so a file
    /// that does not shrink is stored without reading it again.
    whole: bool,
    /// The job ends the file.
    last: bool,
    frag: FragMode,
    /// Shifted dedupe is on: hand back the segment's bytes and anchors.
    shift: bool,
    /// With fragments: the spool the worker writes the job's fragment bytes to.
    spool: Option<Arc<crate::frag::Spool>>,
    /// Dedupe is on: hash a fragment read whole (for [`FragStore`]'s dedupe).
    hash_frag: bool,
    /// A whole-file fragment that may move beside alike ones: sketch its contents.
    similar: bool,
}

/// What a worker hands the committer for one job.
struct SegOut {
    pieces: Vec<Piece>,
    raw: Option<Vec<u8>>,
    /// Shifted dedupe: the segment's bytes and anchors.
    shift: Option<(Vec<u8>, shift::Anchors)>,
    /// Input bytes handed to the compressor.
    fed: u64,
    /// With `Job::hash_frag`: the fragment piece's start, length and xxh3-128.
    frag_hash: Option<FragHash>,
    /// Where the worker wrote the fragment piece's bytes in the spool.
    spooled: Option<Spooled>,
    /// With `Job::similar`: the whole-file fragment's content sketch.
    sketch: Option<Sketch>,
    /// The file has holes: nothing compressed, the committer stores it as it is.
    holey: bool,
    /// The file, still open, when the job hands a fragment of a scanned file to the
    /// spool (which reads it again there: [`crate::frag::Spool::refer`]) and the spool
    /// agreed to keep it open.
    kept: Option<crate::frag::Kept>,
}

/// A fragment piece written to the spool by the worker: its start in the file, length
/// and place in the spool.
#[derive(Clone, Copy)]
struct Spooled {
    lstart: u64,
    len: usize,
    at: u64,
}

impl Spooled {
    /// Write the fragment pieces of a worker's consecutive jobs to the spool, one
    /// behind the other with one reservation (so they stay contiguous in the spool
    /// as in the packed inode), and note where in each `SegOut`.
    /// A scanned file's fragment is not copied: the spool refers to the file (and
    /// takes the handle that read it), whose bytes are read again where they are when
    /// the packed inode is compressed.
    fn put_batch(jobs: &[Job], outs: &mut [Result<SegOut>]) -> Result<()> {
        // A whole-fragment job's one piece, or a file's tail fragment.
        let frag_piece = |job: &Job, seg: &SegOut| matches!(seg.pieces.last(), Some(p) if p.frag && (job.frag == FragMode::Whole || job.last));
        for (job, out) in jobs.iter().zip(outs.iter_mut()) {
            let (Some(sp), Ok(seg), Source::Scanned { path, stamp }) = (&job.spool, out, &job.src)
            else {
                continue;
            };
            if frag_piece(job, seg) {
                let lstart = seg.pieces.last().map_or(0, |p| p.lstart);
                let base = sp.refer(path, job.size, *stamp, seg.kept.take());
                Spooled::note(job, seg, base + lstart);
            }
        }
        // The others: copied, in one write.
        let mut spool = None;
        let mut parts: Vec<&[u8]> = Vec::new();
        // Per job with a spool: its piece's place relative to the write.
        let mut at_rel = Vec::new();
        let mut rel = 0u64;
        for (job, out) in jobs.iter().zip(outs.iter()) {
            let (Some(sp), Ok(seg)) = (&job.spool, out) else {
                continue;
            };
            match seg.pieces.last() {
                Some(p) if seg.spooled.is_none() && frag_piece(job, seg) => {
                    spool = Some(sp);
                    parts.push(&p.bytes);
                    at_rel.push(Some(rel));
                    rel += p.bytes.len() as u64;
                }
                _ => at_rel.push(None),
            }
        }
        let Some(sp) = spool else {
            return Ok(());
        };
        let base = sp.put_all(&parts)?;
        let mut k = 0;
        for (job, out) in jobs.iter().zip(outs.iter_mut()) {
            let (Some(_), Ok(seg)) = (&job.spool, out) else {
                continue;
            };
            if let Some(r) = at_rel[k] {
                Spooled::note(job, seg, base + r);
            }
            k += 1;
        }
        Ok(())
    }

    /// Note in `seg` that its last piece's bytes are at place `at` of the spool.
    fn note(job: &Job, seg: &mut SegOut, at: u64) {
        if let Some(p) = seg.pieces.last_mut() {
            seg.spooled = Some(Spooled {
                lstart: p.lstart,
                len: p.bytes.len(),
                at,
            });
            // A whole-file fragment is now only a place in the spool: its bytes
            // need not wait for the committer in memory (see `held_bytes`).
            if job.frag == FragMode::Whole {
                p.bytes = Vec::new();
            }
        }
    }

    /// Where `p`'s bytes are in the spool, when `s` was made from them.
    fn for_piece(s: Option<Spooled>, p: &Piece) -> Option<u64> {
        s.filter(|s| s.lstart == p.lstart && s.len == p.bytes.len())
            .map(|s| s.at)
    }

    /// Where a whole-file fragment's piece is in the spool, and its length (its bytes
    /// were dropped once written there).
    fn for_whole(s: Option<Spooled>, p: &Piece) -> Option<(u64, u64)> {
        s.filter(|s| s.lstart == p.lstart && p.bytes.is_empty())
            .map(|s| (s.at, s.len as u64))
    }
}

/// A fragment's start in its file, length and hash, computed by the worker.
#[derive(Clone, Copy)]
struct FragHash {
    lstart: u64,
    len: usize,
    hash: u128,
    /// The key of its end in the fragment store's search by end (when long enough).
    end: Option<u64>,
}

impl FragHash {
    fn of(p: &Piece) -> FragHash {
        FragHash {
            lstart: p.lstart,
            len: p.bytes.len(),
            hash: crate::frag::frag_hash(&p.bytes),
            end: p
                .bytes
                .len()
                .checked_sub(crate::frag::SUFFIX_KEY as usize)
                .map(|k| crate::frag::end_key_of(&p.bytes[k..])),
        }
    }

    /// The hash and end key, when they are those of `p`'s bytes.
    fn for_piece(h: Option<FragHash>, p: &Piece) -> Option<(u128, Option<u64>)> {
        h.filter(|h| h.lstart == p.lstart && h.len == p.bytes.len())
            .map(|h| (h.hash, h.end))
    }
}

/// A file's rest goes to the packed inode uncompressed when the last pcluster's
/// ratio says it compresses to less than 8/FRAG_GUESS_MARGIN of a pcluster.
/// Files larger than this are checked for holes before their jobs are made.
const HOLE_PROBE_MIN: u64 = 256 << 20;
const FRAG_GUESS_MARGIN: usize = 9;

/// Room of the LZ4 try for a rest that may fit one pcluster, in quarters of a
/// pcluster. The codecs that get the try (lz4hc, DEFLATE, zstd, lzma) compress a
/// quarter or more better than LZ4 at its fastest; a rest the codec then does not
/// fit into one pcluster just makes a longer fragment. 5/4 against one pcluster, at
/// 128 KiB: lz4hc 12 compresses 1.3 % (rootfs) and 1.7 % (linux) less, zstd 3 1.5 %
/// less (rootfs), for the same images (lz4hc 9 on the rootfs: +0.009 %); 6/4 cost
/// the rootfs 0.09 % at lz4hc 12 (and at zstd 3).
const FAST_TRY_ROOM_QUARTERS: usize = 5;
/// LZMA compresses about twice as well as LZ4 at its fastest: its room is two
/// pclusters. At 1 MiB on the rootfs, LZMA input thrown away drops from 47 MB to 4 MB
/// (580 -> 537 MB compressed in all; 6/4: 21 MB, 7/4: 12 MB), for the same image;
/// the linux tree (nothing thrown away there) gets 0.06 % bigger, drivers/net at
/// 4 KiB 0.03 %.
const FAST_TRY_ROOM_QUARTERS_LZMA: usize = 8;

/// Most input one extent may take: the kernel's limit on a decoded extent
/// (Z_EROFS_PCLUSTER_MAX_DSIZE, checked since kernel commit 7c3ca1838a78 of February
/// 2025; earlier kernels check none). Only data that compresses better than 12:1 into
/// a pcluster reaches it. mkfs.erofs stops at 8,000 KiB; 8 MiB here made the linux
/// tree's packed LZMA image 0.45 % larger (AMD register headers compress 100:1).
const MAX_EXTENT_INPUT: usize = ferofs_format::PCLUSTER_MAX_DSIZE as usize;
/// Segment size: a file compresses in independent pieces of this many bytes.
fn segment_size(pcluster: u32) -> u64 {
    (32 * u64::from(pcluster)).max(16 << 20)
}
/// The length of the segment that starts with `rest` bytes left to compress in the
/// pass: a whole segment while two or more remain, then about half of what is left,
/// down to an eighth of a segment (whole MiB; at least 1 MiB). The last jobs of a pass
/// are then short: with whole segments, one core compressed the last 32 MiB segment
/// alone while the others had nothing left (about 4 s each at the end of the files'
/// pass and of the packed inode's, LZMA at 1 MiB). Depends only on the tree, so the
/// image is the same for any `-j`; each extra cut costs a part-full pcluster (rootfs,
/// LZMA 1 MiB `-E smallest`: 16 KiB, 0.012 %), so only slow codecs taper
/// ([`slow_codec`]).
fn taper(seg: u64, rest: u64) -> u64 {
    if rest >= 2 * seg {
        return seg;
    }
    let floor = (seg / 8).max(1 << 20);
    let len = (rest / 2).next_multiple_of(1 << 20).clamp(floor, seg);
    if rest.saturating_sub(len) < floor {
        rest.clamp(1, seg)
    } else {
        len
    }
}
/// Codecs slow enough (under about 50 MB/s a core) for a whole last segment to keep
/// one core busy alone for a second or more; the fast ones (LZ4, zstd below level 10:
/// a 16 MiB segment in under 0.1 s) keep whole segments and their images.
fn slow_codec(s: &CompressorSpec) -> bool {
    use ferofs_compress::Encoder;
    match s.encoder {
        Encoder::Lz4 => false,
        Encoder::Zstd => s.level >= 10,
        Encoder::Lz4hc | Encoder::Lzma | Encoder::Deflate => true,
    }
}
/// Input bytes handed to the workers at once, at least.
const WINDOW_BYTES: u64 = 64 << 20;

/// Memory one compression worker's codec state takes, about. Measured on the rootfs
/// at 1 MiB pclusters (`-E smallest`, peak RSS from `-j 2` to `-j 8`): LZMA with its
/// 4 MiB dictionary adds about 40 MiB a worker (the match finder's tables are about ten
/// bytes a dictionary byte), zstd 15 about 36 MiB.
fn codec_state_bytes(s: &CompressorSpec, pcl: u32) -> u64 {
    let dict = u64::from(s.effective_dict(pcl));
    let pcl = u64::from(pcl);
    // Every codec: the worker's output and refit buffers and what it allocates per
    // batch (linux tree at 1 MiB pclusters, lz4 and deflate 6: 10-11 MiB more peak RSS
    // a worker from 16 to 25 workers).
    let buffers = 9 * pcl + (1 << 20);
    use ferofs_compress::Algorithm;
    buffers
        + match s.encoder.algorithm() {
            Algorithm::Lzma => 10 * dict,
            // From level 10 libzstd keeps a binary tree over a window of several
            // pclusters of input.
            Algorithm::Zstd if s.level >= 10 => 32 * pcl,
            // Below level 10 the context is small, but each worker keeps an output
            // buffer for a piece's worst case, several pclusters of input: zstd 3 at
            // 1 MiB pclusters, linux tree, peak RSS rose 14-30 MiB a worker past four
            // workers (480 MiB at `-j 8`, 531-542 at 12, 557-593 at 14; 18 MiB a
            // worker here: seven under 512 MiB, 434-482 MiB at `-j 8` and `-j 16`).
            Algorithm::Zstd => 8 * pcl,
            Algorithm::Lz4 | Algorithm::Deflate => 0,
        }
}

/// Compression workers for `threads` under a peak-memory `limit` (0: no limit): the
/// workers' codec states take at most a quarter of it (the rest is for the input in
/// flight, at most [`window_bytes`], the tree, the committer's own codec and the
/// fragment store). Never fewer than two workers (or `threads`, when it is less):
/// two is what the corpora's peak memory was measured at, under 512 MiB.
pub fn fit_workers(threads: usize, c: &Compression, limit: u64) -> usize {
    if limit == 0 || threads <= 2 {
        return threads;
    }
    let pcl = c.max_pcluster();
    let state = c
        .algorithms
        .iter()
        .map(|s| codec_state_bytes(s, pcl))
        .max()
        .unwrap_or(1)
        .max(1);
    let fit = usize::try_from(limit / 4 / state).unwrap_or(usize::MAX);
    threads.min(fit.max(2))
}

/// Memory the batches in flight between the workers and the committer may hold
/// ([`run_ordered`]): two segments a worker (one compressing, one done and waiting for
/// its turn), at least four segments (what two
/// workers have) and otherwise at most a quarter of the memory `limit` (0: no limit),
/// so that peak memory does not grow with `-j` past the limit (at 1 MiB pclusters a
/// worker's two segments are 64 MiB). Workers beyond the window still share it: small
/// files come in batches of [`BATCH_BYTES`].
fn window_bytes(c: &Compression, workers: usize, limit: u64) -> u64 {
    let seg = segment_size(c.max_pcluster());
    let floor = WINDOW_BYTES.max(4 * seg);
    let want = 2 * workers as u64 * seg;
    let cap = if limit == 0 { u64::MAX } else { limit / 4 };
    floor.max(want.min(cap))
}
/// Consecutive jobs a worker takes at once, up to this many input bytes (a bigger job
/// goes alone): one hand-off per batch instead of one per small file, whose thread
/// wake-ups cost more than compressing the file.
const BATCH_BYTES: u64 = 1 << 20;

/// What applies to one file: its first matching hint, or the defaults.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Index into [`Compression::algorithms`].
    pub algorithm: usize,
    pub pcluster: u32,
    /// Stored uncompressed (`--sort-compress none`).
    pub uncompressed: bool,
}

/// The policy of the file at `rel` (one regex match a hint, none without hints).
pub fn policy(c: &Compression, rel: &[u8]) -> Policy {
    let s = (!c.hints.is_empty()).then(|| String::from_utf8_lossy(rel));
    match s.and_then(|s| c.hints.iter().find(|h| h.regex.is_match(&s))) {
        Some(h) => Policy {
            algorithm: h.algorithm.min(c.algorithms.len().saturating_sub(1)),
            pcluster: h.pcluster_size,
            uncompressed: h.uncompressed,
        },
        None => Policy {
            algorithm: 0,
            pcluster: c.pcluster_size,
            uncompressed: false,
        },
    }
}

/// A worker's codec for one (algorithm, pcluster size), with its probe.
type Codecs = HashMap<(usize, u32), (Box<dyn FixedOutputCompressor>, Probe)>;

fn compress_segment(
    job: &Job,
    comps: &mut Codecs,
    dst: &mut Vec<u8>,
    c: &Compression,
    bs: u64,
) -> Result<SegOut> {
    let len = (job.end - job.start) as usize;
    // Read into fresh capacity (no zeroing first: small files are most jobs).
    let mut data = Vec::with_capacity(len);
    let r = job.src.open(job.size)?;
    if r.segments().is_some() {
        return Ok(SegOut {
            pieces: Vec::new(),
            raw: None,
            shift: None,
            fed: 0,
            frag_hash: None,
            spooled: None,
            sketch: None,
            holey: true,
            kept: None,
        });
    }
    r.read_into(job.start, len, &mut data)?;
    r.unchanged()?;
    // The spool reads a scanned file's fragment again where it is, on this handle if
    // it may keep one more open.
    let keep = |r: crate::source::Reader| match (&job.spool, &job.src) {
        (Some(sp), Source::Scanned { .. }) => sp.hold(r.into_file()),
        _ => None,
    };
    if job.frag == FragMode::Whole {
        let piece = Piece {
            lstart: job.start,
            est: data.len() as u64,
            bytes: data,
            plain: false,
            frag: true,
            refer: None,
            sig: None,
        };
        // Only a fragment read by one job is hashed whole here.
        let frag_hash = (job.hash_frag && job.whole).then(|| FragHash::of(&piece));
        let sketch = (job.similar && job.whole)
            .then(|| crate::similar::sketch(&piece.bytes))
            .flatten();
        return Ok(SegOut {
            pieces: vec![piece],
            raw: None,
            shift: None,
            fed: 0,
            frag_hash,
            spooled: None,
            sketch,
            holey: false,
            kept: keep(r),
        });
    }
    let (pieces, fed) = compress_data(job, &data, comps, dst, c, bs)?;
    let frag_hash = match pieces.last() {
        Some(p) if p.frag && job.hash_frag && job.last => Some(FragHash::of(p)),
        _ => None,
    };
    let kept = match pieces.last() {
        Some(p) if p.frag && job.last => keep(r),
        _ => None,
    };
    if job.shift {
        // Matches keep clear of a fragment: no anchors there.
        let keep = match pieces.last() {
            Some(p) if p.frag => (p.lstart - job.start) as usize,
            _ => data.len(),
        };
        let anchors = shift::anchors(&data[..keep.min(data.len())]);
        return Ok(SegOut {
            pieces,
            raw: None,
            shift: Some((data, anchors)),
            fed,
            frag_hash,
            spooled: None,
            sketch: None,
            holey: false,
            kept,
        });
    }
    Ok(SegOut {
        pieces,
        raw: job.whole.then_some(data),
        shift: None,
        fed,
        frag_hash,
        spooled: None,
        sketch: None,
        holey: false,
        kept,
    })
}

/// The codec (and its probe) for an algorithm and pcluster size, made on first use.
fn codec<'c>(
    comps: &'c mut Codecs,
    c: &Compression,
    alg: usize,
    pcluster: u32,
) -> Result<&'c mut (Box<dyn FixedOutputCompressor>, Probe)> {
    match comps.entry((alg, pcluster)) {
        std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
        std::collections::hash_map::Entry::Vacant(e) => {
            let comp = new_compressor(&c.algorithms[alg], c.max_pcluster())
                .map_err(|e| BuildError::Options(e.to_string()))?;
            let probe = Probe::new(comp.algorithm());
            Ok(e.insert((comp, probe)))
        }
    }
}

/// The pieces of `data`, the bytes `[job.start, job.end)` of a file, and the input
/// bytes handed to the compressor.
fn compress_data(
    job: &Job,
    data: &[u8],
    comps: &mut Codecs,
    dst: &mut Vec<u8>,
    c: &Compression,
    bs: u64,
) -> Result<(Vec<Piece>, u64)> {
    let len = data.len();
    let (comp, probe) = codec(comps, c, job.alg, job.pcluster)?;
    // Each segment starts from the same compressor state, whichever worker ran what
    // before: the output must not depend on the thread count or on scheduling.
    comp.begin_stream();
    let pcl = job.pcluster as usize;
    // With fragments, what is left of a file once it fits one pcluster uncompressed
    // goes to the packed inode as it is (mkfs.erofs does the same).
    let frag_tail = job.last && job.frag == FragMode::Tail;
    // With a codec slower than LZ4 at its fastest, a rest that may fit one pcluster is
    // tried with that first (below), in a room of a few quarters of a pcluster (0: no
    // try).
    let try_room = match c.algorithms[job.alg].encoder {
        ferofs_compress::Encoder::Lz4 => 0,
        _ if !frag_tail => 0,
        ferofs_compress::Encoder::Lzma => pcl / 4 * FAST_TRY_ROOM_QUARTERS_LZMA,
        _ => pcl / 4 * FAST_TRY_ROOM_QUARTERS,
    };
    // The worker's output buffer, reused: zeroed only when it grows. Behind the room
    // for a pcluster (or the try), a pcluster's room for a refit, which may leave its
    // room in any state when it fails: the pcluster it would replace stays intact.
    let room = pcl.max(try_room);
    if dst.len() < room + pcl {
        dst.resize(room + pcl, 0);
    }
    let buf = &mut dst[..];
    let mut pieces = Vec::new();
    let mut pos = 0usize;
    let bsz = bs as usize;
    // `n` bytes from `pos` stored as they are, one block a piece.
    let plain = |pieces: &mut Vec<Piece>, pos: usize, n: usize| {
        for at in (pos..pos + n).step_by(bsz) {
            pieces.push(Piece {
                lstart: job.start + at as u64,
                bytes: data[at..(at + bsz).min(pos + n)].to_vec(),
                plain: true,
                frag: false,
                est: 0,
                refer: None,
                sig: None,
            });
        }
    };
    // At the end of a file, at most one block left takes one block compressed or not
    // (unless the compressed tail goes inline): store it as is, without compressing it
    // (as mkfs.erofs does).
    let plain_tail = job.last && !c.ztailpacking && !frag_tail;
    // Input bytes handed to the compressor.
    let mut fed = len as u64;
    // Input per output byte of the last pcluster this job compressed.
    let mut ratio: Option<f64> = None;
    // Bounded: every iteration consumes at least one byte.
    while pos < len {
        let rest = len - pos;
        // A rest that fits a pcluster raw, or that the last pcluster's ratio says
        // compresses well inside one, goes to the packed inode without being
        // compressed here first (it would be compressed there again).
        let mut guess = ratio.map(|r| (rest as f64 / r) as usize);
        // Whether LZ4 at its fastest fits all of the rest into the try's room.
        let mut fast_fit = false;
        if try_room > 0 && guess.is_none() && rest > pcl {
            // No pcluster of this job compressed yet. When LZ4 at its fastest fits the
            // rest into about a pcluster, the slower, stronger codec would fit it into
            // less than one, and the rest would then go to the packed inode below
            // with that work thrown away.
            if let Some(w) = ferofs_compress::lz4_fits(&data[pos..], &mut buf[..try_room - 1]) {
                guess = Some(w);
                fast_fit = true;
            }
        }
        if frag_tail
            && (rest <= job.pcluster as usize
                || fast_fit
                || guess.is_some_and(|w| {
                    w.saturating_mul(FRAG_GUESS_MARGIN) < job.pcluster as usize * 8
                }))
        {
            pieces.push(Piece {
                lstart: job.start + pos as u64,
                bytes: data[pos..].to_vec(),
                plain: false,
                frag: true,
                est: guess.unwrap_or(rest).min(rest) as u64,
                refer: None,
                sig: None,
            });
            fed -= rest as u64;
            break;
        }
        if plain_tail && (len - pos) as u64 <= bs {
            pieces.push(Piece {
                lstart: job.start + pos as u64,
                bytes: data[pos..].to_vec(),
                plain: true,
                frag: false,
                est: 0,
                refer: None,
                sig: None,
            });
            fed -= (len - pos) as u64;
            break;
        }
        // Data that clearly does not compress (random bytes, archives, media) is stored
        // as it is without asking the codec (see ferofs_compress::probe): all of a run
        // of it but the last pcluster, which the codec still sees with what follows
        // (that may repeat the run, as tables in binaries do). A run that reaches the
        // end of the segment is stored whole.
        let run = probe.incompressible_prefix(&data[pos..], len - pos);
        let skip = if pos + run + CHUNK > len {
            if frag_tail {
                // Whole blocks only: the last partial block becomes the fragment.
                run / bsz * bsz
            } else {
                run
            }
        } else {
            run.saturating_sub(job.pcluster as usize) / bsz * bsz
        };
        if skip > 0 {
            plain(&mut pieces, pos, skip);
            pos += skip;
            fed -= skip as u64;
            continue;
        }
        let (head, spare) = buf.split_at_mut(room);
        let dst = &mut head[..pcl];
        let src = &data[pos..len.min(pos + c.extent_cap())];
        let (mut consumed, mut written) = comp.compress_destsize(src, dst);
        let bu = bsz;
        if job.last
            && c.ztailpacking
            && !frag_tail
            && pos + consumed == len
            && written > bu
            && written % bu != 0
        {
            // The end of the file would leave its last block part empty: fill whole
            // blocks instead and leave the rest to an inline tail (mkfs.erofs does the
            // same). If that tail does not fit inline it takes the block saved here.
            let refit = &mut spare[..written / bu * bu];
            let (c2, w2) = comp.refit(&src[..consumed], refit, written);
            if c2 > 0 && w2 > 0 && c2 < consumed && (len - pos - c2) as u64 > 0 {
                if let (Some(to), Some(from)) = (dst.get_mut(..w2), refit.get(..w2)) {
                    to.copy_from_slice(from);
                    (consumed, written) = (c2, w2);
                }
            }
        }
        let stored = (written as u64).div_ceil(bs) * bs;
        if frag_tail && pos + consumed == len && written < job.pcluster as usize {
            // The rest of the file compresses into a pcluster it does not fill: it
            // goes to the packed inode instead, packed with other files' tails.
            pieces.push(Piece {
                lstart: job.start + pos as u64,
                bytes: data[pos..].to_vec(),
                plain: false,
                frag: true,
                est: written as u64,
                refer: None,
                sig: None,
            });
            break;
        }
        // With ztailpacking, a compressed end of file shorter than a block may go
        // inline behind the inode even when it saves no block (finish_file decides).
        let may_inline =
            job.last && c.ztailpacking && pos + consumed == len && (written as u64) < bs;
        if consumed > 0 && written > 0 && (stored < consumed as u64 || may_inline) {
            ratio = Some(consumed as f64 / written as f64);
            pieces.push(Piece {
                lstart: job.start + pos as u64,
                bytes: dst[..written].to_vec(),
                plain: false,
                frag: false,
                est: 0,
                refer: None,
                sig: None,
            });
            pos += consumed;
        } else {
            // No gain over the pcluster the codec examined: store that stretch as it
            // is (up to a chunk that clearly compresses), not one block and then the
            // same search again from the next block.
            let reach = (job.pcluster as usize).min(len - pos);
            let n = probe
                .until_compressible(&data[pos..], reach)
                .max(bsz.min(len - pos));
            plain(&mut pieces, pos, n);
            pos += n;
        }
    }
    Ok((pieces, fed))
}

/// The committer's codecs, for compressing stretches again around shifted matches.
struct Recompress<'a> {
    comps: &'a mut Codecs,
    dst: &'a mut Vec<u8>,
    c: &'a Compression,
    bs: u64,
}

impl Recompress<'_> {
    /// The pieces of `data`, the file's bytes from `start`, compressed on their own.
    fn pieces(&mut self, job: &Job, data: &[u8], start: u64) -> Result<Vec<Piece>> {
        let sub = Job {
            file: job.file,
            src: job.src.clone(),
            size: job.size,
            start,
            end: start + data.len() as u64,
            alg: job.alg,
            pcluster: job.pcluster,
            whole: false,
            last: false,
            frag: FragMode::None,
            shift: false,
            hash_frag: false,
            similar: false,
            spool: None,
        };
        Ok(compress_data(&sub, data, self.comps, self.dst, self.c, self.bs)?.0)
    }

    /// `data` as one compressed piece, when it fits one pcluster: a stretch that does
    /// not compress then still takes one extent (with about the blocks it takes raw),
    /// where one block a piece would put two extent heads in one lcluster.
    fn one_piece(&mut self, job: &Job, data: &[u8], start: u64) -> Result<Option<Piece>> {
        if data.len() > self.c.extent_cap() {
            return Ok(None);
        }
        let (comp, _) = codec(self.comps, self.c, job.alg, job.pcluster)?;
        comp.begin_stream();
        let cap = job.pcluster as usize;
        if self.dst.len() < cap {
            self.dst.resize(cap, 0);
        }
        let (consumed, written) = comp.compress_destsize(data, &mut self.dst[..cap]);
        if consumed != data.len() || written == 0 {
            return Ok(None);
        }
        Ok(Some(Piece {
            lstart: start,
            bytes: self.dst[..written].to_vec(),
            plain: false,
            frag: false,
            est: 0,
            refer: None,
            sig: None,
        }))
    }
}

/// Blocks a piece writes.
fn piece_blocks(p: &Piece, bs: u64) -> u64 {
    if p.refer.is_some() || p.frag {
        0
    } else if p.plain {
        1
    } else {
        (p.bytes.len() as u64).div_ceil(bs)
    }
}

/// Can `run` (pieces in order, the next extent starting at `next`) be described by
/// lcluster indexes? Every extent starts in an lcluster of its own, and one whose
/// pcluster has several blocks spans a NONHEAD lcluster (which holds the block count).
fn heads_ok(run: &[Piece], next: u64, bits: u8) -> bool {
    run.iter().enumerate().all(|(i, q)| {
        let to = run.get(i + 1).map_or(next, |n| n.lstart);
        let (a, b) = (q.lstart >> bits, to >> bits);
        let blocks = q
            .refer
            .map_or(piece_blocks(q, 1 << bits), |r| u64::from(r.blocks));
        b > a && (blocks <= 1 || b >= a + 2)
    })
}

/// Matches against earlier pieces of the same segment: original piece `k` (signed
/// `sg`) and its successors, compared in memory. Every target ends before the match
/// starts, so it is written unchanged before the references to it.
#[allow(clippy::too_many_arguments)]
fn local_chain(
    slots: &[Option<Piece>],
    starts: &[usize],
    n: usize,
    k: usize,
    sg: shift::Sig,
    anchor_off: u32,
    data: &[u8],
    base: u64,
    q: usize,
    from: usize,
    limit: usize,
    bs: u64,
    min_len: &dyn Fn(u16) -> usize,
) -> Vec<shift::Match> {
    let bs_blocks = |p: &Piece| -> u16 { u16::try_from(piece_blocks(p, bs)).unwrap_or(u16::MAX) };
    let mut chain = Vec::new();
    let Some(start) = q.checked_sub(anchor_off as usize) else {
        return chain;
    };
    let end_of = |k: usize| starts.get(k + 1).copied().unwrap_or(n);
    if start < from || start >= limit {
        return chain;
    }
    let pre = shift::PRE.min(sg.len as usize);
    if start + pre > limit || xxhash_rust::xxh3::xxh3_64(&data[start..start + pre]) != sg.pre {
        return chain;
    }
    let mut pos = start;
    let mut j = k;
    // Bounded: each pass moves to the next piece or stops.
    while let Some(Some(t)) = slots.get(j) {
        let (ts, te) = (starts[j], end_of(j));
        if t.frag || te > start {
            break;
        }
        let want = (te - ts).min(limit - pos);
        let same = data[pos..pos + want]
            .iter()
            .zip(&data[ts..ts + want])
            .take_while(|(a, b)| a == b)
            .count();
        // `blocks` here only sizes the NONHEAD rule; the writer fills in the real one.
        let blocks = bs_blocks(t);
        if same < min_len(blocks) {
            break;
        }
        chain.push(shift::Match {
            start: base + pos as u64,
            len: same as u64,
            pcl: shift::Ref {
                blkaddr: 0,
                blocks,
                plain: t.plain,
                partial: same < te - ts,
                local: Some(j),
            },
        });
        pos += same;
        if same < te - ts {
            break;
        }
        j += 1;
    }
    chain
}

/// Shifted dedupe of one segment (see `shift`): its pieces with matched stretches
/// turned into references, each piece signed for later matches.
#[allow(clippy::too_many_arguments)]
fn rework(
    job: &Job,
    pieces: Vec<Piece>,
    data: &[u8],
    anchors: &[(u32, u64)],
    m: &PclMap,
    p: &Pending,
    files: &[FileReq],
    re: &mut Recompress,
) -> Result<Vec<Piece>> {
    let bs = re.bs;
    let bits = bs.trailing_zeros() as u8;
    let base = job.start;
    let n = data.len();
    let starts: Vec<usize> = pieces.iter().map(|q| (q.lstart - base) as usize).collect();
    let end_of = |k: usize| starts.get(k + 1).copied().unwrap_or(n);
    // Matches keep clear of fragments and of a file's last piece (it may go inline).
    let limit = match pieces.iter().position(|q| q.frag) {
        Some(k) => starts[k],
        None if job.last => starts.last().copied().unwrap_or(0),
        None => n,
    };
    let min_len = |blocks: u16| {
        if blocks > 1 {
            2 * bs as usize
        } else {
            bs as usize
        }
    };
    let mut ver = shift::Verifier::new(files);
    // Earlier pieces of this segment, by their first anchor (repeats inside a file).
    // Every piece is signed here, for later data to match it; pieces compressed
    // again around a match are signed at the end.
    let mut pieces = pieces;
    let mut local: HashMap<u64, Vec<(usize, u32, shift::Sig)>> = HashMap::default();
    for (k, q) in pieces.iter_mut().enumerate() {
        if q.frag {
            continue;
        }
        q.sig = shift::sig(data, starts[k], end_of(k) - starts[k]);
        if let (Some(sg), true) = (q.sig, end_of(k) <= limit) {
            for (off, h) in sg.keys() {
                let v = local.entry(h).or_default();
                if v.len() < shift::CANDIDATES {
                    v.push((k, off, sg));
                }
            }
        }
    }
    let mut slots: Vec<Option<Piece>> = pieces.into_iter().map(Some).collect();
    let mut out: Vec<Piece> = Vec::with_capacity(slots.len());
    // Where each original piece went in `out`.
    let mut pos_of: Vec<Option<usize>> = vec![None; slots.len()];
    // Pieces before `next` are in `out`.
    let mut next = 0usize;
    let mut shared = p.shared || p.full_index;
    for &(q, h) in anchors {
        let q = q as usize;
        if q >= limit {
            break;
        }
        let from = starts.get(next).copied().unwrap_or(n);
        if q < from {
            continue;
        }
        let mut chain = shift::find(
            &m.shift, &mut ver, data, base, q, h, from, limit, p.alg, &min_len,
        )?;
        if chain.is_empty() {
            // Bounded: at most CANDIDATES a hash.
            for &(k, off, sg) in local.get(&h).map_or(&[][..], Vec::as_slice) {
                chain = local_chain(
                    &slots, &starts, n, k, sg, off, data, base, q, from, limit, bs, &min_len,
                );
                if !chain.is_empty() {
                    break;
                }
            }
        }
        if chain.is_empty() {
            continue;
        }
        let mut chosen = None;
        // Sides compressed for this match: (from, to, as one piece) -> pieces.
        let mut sides: HashMap<(usize, usize, bool), Option<Vec<Piece>>> = HashMap::default();
        // The bytes around the match are compressed again up to the neighbouring piece
        // boundaries. Where data does not compress, one block a piece can put two
        // extent heads in one lcluster (the format allows one); then try, in turn:
        // each side as one compressed piece, the last reference shortened so the bytes
        // after it fill whole blocks, the stretch widened by a piece on either side,
        // and the match started one reference later.
        'variants: for (drop, trim) in [(0usize, false), (0, true), (1, false), (1, true)] {
            let chv: Vec<shift::Match> = chain.iter().skip(drop).copied().collect();
            let (Some(first), Some(last)) = (chv.first(), chv.last()) else {
                break;
            };
            let s = (first.start - base) as usize;
            let e0 = (last.start + last.len - base) as usize;
            // The pieces the match overlaps: a..=b.
            let a = starts.partition_point(|&x| x <= s).saturating_sub(1);
            let b = starts.partition_point(|&x| x < e0).saturating_sub(1);
            if a < next || b < a {
                break;
            }
            for back in 0..=1usize {
                let Some(a2) = a.checked_sub(back) else {
                    break;
                };
                // Local targets must lie before every piece the match replaces.
                if a2 < next || chv.iter().filter_map(|m| m.pcl.local).any(|k| k >= a2) {
                    break;
                }
                for fwd in 0..=1usize {
                    let b2 = b + fwd;
                    if b2 >= starts.len() || end_of(b2) > limit {
                        break;
                    }
                    let (sa, eb) = (starts[a2], end_of(b2));
                    let mut ch = chv.clone();
                    let mut e = e0;
                    if trim {
                        // Bounded: each pass shortens or drops the last reference.
                        while let Some(l) = ch.last_mut() {
                            let cut = ((bs - (eb - e) as u64 % bs) % bs) as usize;
                            if cut == 0 {
                                break;
                            }
                            if (l.len as usize).saturating_sub(cut) >= min_len(l.pcl.blocks) {
                                l.len -= cut as u64;
                                l.pcl.partial = true;
                                e -= cut;
                                break;
                            }
                            e = (l.start - base) as usize;
                            ch.pop();
                        }
                        if ch.is_empty() {
                            continue 'variants;
                        }
                    }
                    let old: u64 = slots[a2..=b2]
                        .iter()
                        .flatten()
                        .map(|q| piece_blocks(q, bs))
                        .sum();
                    // Blocks the match would save if the sides compressed as well as
                    // the pieces they come from (cut out of their context, they
                    // rarely do better). Under one block it is not worth compressing
                    // them to find out: on the linux tree at lz4hc 12 that skips 88 of
                    // 140 MB compressed on the committer, for the same image.
                    if (old as f64) * ((e - s) as f64) < (eb - sa) as f64 {
                        continue;
                    }
                    // Each side as the codec cuts it, or else as one compressed piece.
                    for single in 0..4u8 {
                        // The variants share most sides: each is compressed once per
                        // match (`sides`).
                        let mut side = |re: &mut Recompress,
                                        one: bool,
                                        from: usize,
                                        to: usize|
                         -> Result<Option<Vec<Piece>>> {
                            if from >= to {
                                return Ok(Some(Vec::new()));
                            }
                            if let Some(v) = sides.get(&(from, to, one)) {
                                return Ok(v.clone());
                            }
                            let v = if one {
                                let at = base + from as u64;
                                re.one_piece(job, &data[from..to], at)?.map(|q| vec![q])
                            } else {
                                Some(re.pieces(job, &data[from..to], base + from as u64)?)
                            };
                            sides.insert((from, to, one), v.clone());
                            Ok(v)
                        };
                        let (Some(mut run), Some(post)) = (
                            side(re, single & 1 != 0, sa, s)?,
                            side(re, single & 2 != 0, e, eb)?,
                        ) else {
                            continue;
                        };
                        run.extend(ch.iter().map(|mt| Piece {
                            lstart: mt.start,
                            bytes: Vec::new(),
                            plain: mt.pcl.plain,
                            frag: false,
                            est: 0,
                            refer: Some(mt.pcl),
                            sig: None,
                        }));
                        run.extend(post);
                        let new: u64 = run.iter().map(|q| piece_blocks(q, bs)).sum();
                        let worth = new < old
                            && (shared || (old - new) * bs > full_index_extra(p.lclusters));
                        if worth && heads_ok(&run, base + eb as u64, bits) {
                            chosen = Some((a2, b2, run));
                            break 'variants;
                        }
                        if !worth && single == 0 {
                            continue 'variants;
                        }
                    }
                }
            }
        }
        let Some((a, b, mut run)) = chosen else {
            continue;
        };
        // A local target must be a piece written before the match: one already in
        // `out`, or one between `next` and the match. A match over its own target (data
        // repeating itself within one stretch) is left alone.
        let targets_ok = run
            .iter()
            .all(|q| match q.refer.as_ref().and_then(|r| r.local) {
                Some(k) => k < a && (k >= next || pos_of.get(k).is_some_and(Option::is_some)),
                None => true,
            });
        if !targets_ok {
            continue;
        }
        for k in next..a {
            if let Some(q) = slots[k].take() {
                pos_of[k] = Some(out.len());
                out.push(q);
            }
        }
        for q in run.iter_mut() {
            if let Some(r) = q.refer.as_mut() {
                // Local targets lie before the match: they are in `out` now.
                if let Some(k) = r.local {
                    r.local = pos_of[k];
                    if r.local.is_none() {
                        return Err(BuildError::Options("internal: local dedupe target".into()));
                    }
                }
            }
        }
        out.extend(run);
        next = b + 1;
        shared = true;
    }
    let k = next.min(slots.len());
    out.extend(slots[k..].iter_mut().filter_map(Option::take));
    // Sign the pieces compressed again (an original piece keeps its extent, and its
    // signature; one without an anchor is looked at again, cheaply).
    for i in 0..out.len() {
        let s = (out[i].lstart - base) as usize;
        let e = out.get(i + 1).map_or(n, |q| (q.lstart - base) as usize);
        if out[i].sig.is_none() && out[i].refer.is_none() && !out[i].frag {
            out[i].sig = shift::sig(data, s, e - s);
        }
    }
    Ok(out)
}

/// Per-file commit state.
struct Pending {
    extents: Vec<ExtentDesc>,
    /// Where the file's data began (before `--dsunit` moved its first pcluster): a
    /// roll-back to raw storage starts there again.
    first_blk: Option<u64>,
    /// `FileReq::align`.
    align: u64,
    blocks: u64,
    last: Option<Piece>,
    alg: usize,
    /// The file's bytes, when one job read it whole.
    raw: Option<Vec<u8>>,
    /// The whole file is going to the packed inode (a fragment is open).
    whole_frag: bool,
    /// Lclusters of the file (for the cost of full indexes).
    lclusters: u64,
    /// Some extent references another file's (or an earlier) pcluster.
    shared: bool,
    /// Full indexes whatever is shared (`Compression::full_index`).
    full_index: bool,
    /// Blocks referenced instead of written; bytes that could have been.
    reused: u64,
    potential: u64,
    /// Pcluster table entries this file added.
    inserted: Vec<PclKey>,
    /// The file's index in the stage's list.
    file: usize,
    /// Shifted-dedupe index entries this file added.
    shift_ids: Vec<u32>,
    /// The hash of the file's fragment, when a worker computed it.
    frag_hash: Option<FragHash>,
    /// Where a worker wrote the file's tail fragment in the spool.
    spooled: Option<Spooled>,
    /// The whole-file fragment's content sketch, from the worker.
    sketch: Option<Sketch>,
}

/// What the committer needs to know about each file to decide on inlining.
pub struct FileReq {
    pub id: usize,
    pub src: Source,
    pub size: u64,
    pub rel: Vec<u8>,
    /// Bytes the inode needs before the map header (core + xattrs).
    pub fixed_meta: u64,
    /// An uncompressed tail may go behind the inode.
    pub inline_tail: bool,
    /// What goes to the packed inode (never set without a `FragStore`).
    pub frag: FragMode,
    /// Stored elsewhere (a duplicate of another file): no data at all here; its
    /// result is a placeholder.
    pub skip: bool,
    /// Going whole to the packed inode, it may move there beside alike files
    /// ([`crate::similar`]).
    pub similar: bool,
    /// `--dsunit`: the file's first data block at a multiple of this many blocks (0 or
    /// 1: anywhere). A file whose first pcluster is shared with another is not moved.
    pub align: u64,
}

/// Compress every file in `files` (inode order) and write the data at `next_blk`, on
/// `threads` workers or fewer: as many as fit in `memory_limit` with `c`'s codecs
/// ([`fit_workers`]). Returns one `Stored` per file, the next free block and the input
/// bytes handed to the compressors.
#[allow(clippy::too_many_arguments)] // the stage's whole hand-off
pub fn store_all(
    files: &[FileReq],
    c: &Compression,
    out: &mut Out,
    bits: u8,
    mut next_blk: u64,
    threads: usize,
    memory_limit: u64,
    mut frags: Option<&mut FragStore>,
    mut pcl: Option<&mut PclMap>,
    progress: &crate::Progress,
) -> Result<(Vec<Stored>, u64, u64)> {
    let bs = 1u64 << bits;
    let threads = fit_workers(threads, c, memory_limit);
    let shift_on = pcl.is_some();
    // Workers write fragment bytes to the spool themselves (or hand it the scanned
    // files, kept open, which it then reads again where they are).
    let spool = frags.as_deref().map(FragStore::spool);
    if let Some(sp) = &spool {
        let scanned = files
            .iter()
            .filter(|f| f.frag != FragMode::None && matches!(f.src, Source::Scanned { .. }))
            .count();
        sp.expect(scanned);
    }
    let mut jobs = Vec::new();
    let frag_of = |f: &FileReq| {
        if frags.is_none() {
            FragMode::None
        } else {
            f.frag
        }
    };
    // A file of at most one block cannot shrink unless its compressed form goes
    // inline (ztailpacking): compressed it still takes a block, raw its bytes go
    // inline or take that one block. Not compressing it gives the same image.
    // Files with holes keep them (chunk-based, uncompressed): the worker that opens
    // one finds its holes and hands it back as `SegOut::holey`, to be stored here
    // as it is (one open a file instead of one more to look for holes first).
    // Files a hint stores uncompressed (`--sort-compress none`) have no jobs either.
    let policies: Vec<Policy> = files.iter().map(|f| policy(c, &f.rel)).collect();
    // Big files are looked at for holes here, not by their jobs: a sparse file of
    // terabytes would otherwise make millions of jobs (one a segment) before the first
    // worker finds its holes.
    let mut holey_big = vec![false; files.len()];
    for (fi, f) in files.iter().enumerate() {
        if !f.skip && f.size > HOLE_PROBE_MIN {
            holey_big[fi] = f.src.open(f.size)?.segments().is_some();
        }
    }
    let no_jobs = |fi: usize, f: &FileReq| {
        f.skip
            || f.size == 0
            || policies[fi].uncompressed
            || holey_big[fi]
            || (!c.ztailpacking && frag_of(f) == FragMode::None && f.size <= bs)
    };
    // What compressing each file and those after it costs, for the taper at the end.
    let mut cost_after = vec![0u64; files.len() + 1];
    for (fi, f) in files.iter().enumerate().rev() {
        let cost = if no_jobs(fi, f) || frag_of(f) == FragMode::Whole {
            0
        } else {
            f.size
        };
        cost_after[fi] = cost_after[fi + 1].saturating_add(cost);
    }
    for (fi, f) in files.iter().enumerate() {
        let frag = frag_of(f);
        if no_jobs(fi, f) {
            continue;
        }
        let Policy {
            algorithm: alg,
            pcluster: pcl,
            ..
        } = policies[fi];
        let seg = segment_size(pcl);
        // Whole-file fragments are only spooled here: nothing to taper.
        let tapers = frag != FragMode::Whole && slow_codec(&c.algorithms[alg]);
        let mut s = 0;
        // Bounded: every pass moves `s` on by at least one byte (`taper` >= 1 MiB).
        while s < f.size {
            let len = if tapers {
                taper(seg, cost_after[fi + 1].saturating_add(f.size - s))
            } else {
                seg
            };
            let e = (s + len).min(f.size);
            jobs.push(Job {
                file: fi,
                src: f.src.clone(),
                size: f.size,
                start: s,
                end: e,
                alg,
                pcluster: pcl,
                whole: s == 0 && e == f.size,
                last: e == f.size,
                frag,
                // Shifted matches need a few blocks on each side: small files are
                // left to whole-file and pcluster dedupe.
                shift: shift_on && f.size >= shift::MIN_FILE,
                hash_frag: shift_on,
                similar: f.similar,
                spool: spool.clone().filter(|_| frag != FragMode::None),
            });
            s = e;
        }
    }
    let mut results: Vec<Option<Stored>> = (0..files.len()).map(|_| None).collect();
    let mut pending: Option<(usize, Pending)> = None;
    // Files before `done_upto` are committed.
    let mut done_upto = 0usize;
    let mut fed = 0u64;
    // Shifted dedupe compresses again on the committer: its own codecs.
    let mut ccomps: Codecs = HashMap::default();
    let mut cdst = Vec::new();
    // The committer (this thread) takes results strictly in job order while the
    // workers run ahead, at most `window` input bytes past the last committed job.
    let mut commit = |job: &Job, seg: SegOut| -> Result<()> {
        let changed = || BuildError::Invalid {
            path: job.src.path().to_path_buf(),
            what: "changed while the build read it (holes appeared or went)".into(),
        };
        // A file's jobs are all holey or none is (else it changed while being read).
        if (seg.holey && pending.as_ref().is_some_and(|(f, _)| *f == job.file))
            || (!seg.holey && results[job.file].is_some())
        {
            return Err(changed());
        }
        if pending.as_ref().map(|(f, _)| *f) != Some(job.file) {
            if let Some((f, p)) = pending.take() {
                let fs = frags.as_deref_mut();
                let pm = pcl.as_deref_mut();
                let mut re = Recompress {
                    comps: &mut ccomps,
                    dst: &mut cdst,
                    c,
                    bs,
                };
                results[f] = Some(finish_file(
                    &files[f],
                    p,
                    c,
                    out,
                    bits,
                    &mut next_blk,
                    fs,
                    pm,
                    &mut re,
                )?);
                done_upto = f + 1;
            }
            // Files without jobs (holes, empty) between the last one and this one.
            for f in done_upto..job.file {
                results[f] = Some(store_jobless(&files[f], out, bits, &mut next_blk)?);
            }
            done_upto = job.file;
            if seg.holey {
                // Its first job stores the whole file; the others have nothing to add.
                if results[job.file].is_none() {
                    let f = &files[job.file];
                    results[job.file] = Some(store_jobless(f, out, bits, &mut next_blk)?);
                }
                done_upto = job.file + 1;
                return Ok(());
            }
            pending = Some((
                job.file,
                Pending {
                    extents: Vec::new(),
                    first_blk: None,
                    align: files[job.file].align,
                    blocks: 0,
                    last: None,
                    alg: job.alg,
                    raw: None,
                    whole_frag: job.frag == FragMode::Whole,
                    lclusters: files[job.file].size.div_ceil(bs),
                    shared: false,
                    full_index: c.full_index,
                    reused: 0,
                    potential: 0,
                    inserted: Vec::new(),
                    file: job.file,
                    shift_ids: Vec::new(),
                    frag_hash: None,
                    spooled: None,
                    sketch: None,
                },
            ));
            if job.frag == FragMode::Whole {
                if let Some(fs) = frags.as_deref_mut() {
                    fs.begin();
                }
            }
        }
        let Some((_, p)) = pending.as_mut() else {
            return Ok(());
        };
        p.raw = seg.raw;
        if seg.frag_hash.is_some() {
            p.frag_hash = seg.frag_hash;
        }
        if seg.sketch.is_some() {
            p.sketch = seg.sketch;
        }
        fed += seg.fed;
        if p.whole_frag {
            let fs = frags
                .as_deref_mut()
                .ok_or_else(|| BuildError::Options("internal: no fragment store".into()))?;
            for piece in seg.pieces {
                match Spooled::for_whole(seg.spooled, &piece) {
                    Some((at, len)) => fs.push_spooled(at, len)?,
                    None => fs.push(&piece.bytes)?,
                }
            }
            return Ok(());
        }
        if seg.spooled.is_some() {
            p.spooled = seg.spooled;
        }
        let mut pieces = seg.pieces;
        if let (Some((data, anchors)), Some(m)) = (seg.shift, pcl.as_deref_mut()) {
            let mut re = Recompress {
                comps: &mut ccomps,
                dst: &mut cdst,
                c,
                bs,
            };
            pieces = rework(job, pieces, &data, &anchors, m, p, files, &mut re)?;
            if job.whole {
                p.raw = Some(data);
            }
        }
        // Where this segment's pieces went (for references to earlier ones).
        let mut addrs: Vec<Option<(u32, u16)>> = vec![None; pieces.len()];
        // The segment's index of the piece held back in `p.last`, if it is one of them.
        let mut held: Option<usize> = None;
        for (i, mut piece) in pieces.into_iter().enumerate() {
            if let Some(prev) = p.last.take() {
                let len = piece.lstart - prev.lstart;
                let at = write_piece(prev, len, p, out, bits, &mut next_blk, pcl.as_deref_mut())?;
                if let Some(k) = held {
                    addrs[k] = Some(at);
                }
            }
            if let Some(r) = piece.refer.as_mut() {
                if let Some(k) = r.local.take() {
                    let (a, b) = addrs.get(k).copied().flatten().ok_or_else(|| {
                        BuildError::Options("internal: local dedupe target not written".into())
                    })?;
                    if b != r.blocks {
                        return Err(BuildError::Options(
                            "internal: local dedupe target changed size".into(),
                        ));
                    }
                    r.blkaddr = a;
                }
            }
            p.last = Some(piece);
            held = Some(i);
        }
        Ok(())
    };
    let window = window_bytes(c, threads, memory_limit);
    run_ordered(&jobs, threads, window, c, bs, progress, &mut commit)?;
    if let Some((f, p)) = pending.take() {
        let fs = frags;
        let pm = pcl;
        let mut re = Recompress {
            comps: &mut ccomps,
            dst: &mut cdst,
            c,
            bs,
        };
        results[f] = Some(finish_file(
            &files[f],
            p,
            c,
            out,
            bits,
            &mut next_blk,
            fs,
            pm,
            &mut re,
        )?);
        done_upto = f + 1;
    }
    for f in done_upto..files.len() {
        results[f] = Some(store_jobless(&files[f], out, bits, &mut next_blk)?);
    }
    let mut v = Vec::with_capacity(files.len());
    for r in results {
        v.push(r.ok_or_else(|| BuildError::Options("internal: file not stored".into()))?);
    }
    Ok((v, next_blk, fed))
}

/// Compress consecutive jobs in order, up to the first error, and write the batch's
/// fragments to the spool in one write (an error there replaces the results).
fn compress_batch(
    batch: &[Job],
    comps: &mut Codecs,
    dst: &mut Vec<u8>,
    c: &Compression,
    bs: u64,
    progress: &crate::Progress,
) -> Vec<Result<SegOut>> {
    let mut rs = Vec::with_capacity(batch.len());
    for job in batch {
        let r = compress_segment(job, comps, dst, c, bs);
        progress.add_done(job.end - job.start);
        let failed = r.is_err();
        rs.push(r);
        if failed {
            break;
        }
    }
    if let Err(e) = Spooled::put_batch(batch, &mut rs) {
        rs.clear();
        rs.push(Err(e));
    }
    rs
}

/// Memory a job's result holds until it is committed, in bytes, about: its pieces,
/// the input kept for a file that may not shrink or for shifted dedupe, and next to
/// nothing for a whole-file fragment, whose bytes are in the spool by then.
fn held_bytes(r: &Result<SegOut>) -> u64 {
    let Ok(s) = r else { return 0 };
    let pieces: usize = s
        .pieces
        .iter()
        .map(|p| p.bytes.capacity() + std::mem::size_of::<Piece>())
        .sum();
    let raw = s.raw.as_ref().map_or(0, |b| b.capacity());
    let shift = s.shift.as_ref().map_or(0, |(b, a)| {
        b.capacity() + a.capacity() * std::mem::size_of::<(u32, u64)>()
    });
    (std::mem::size_of::<SegOut>() + pieces + raw + shift) as u64
}

/// The batches in flight: the first not committed, and what they hold in memory.
struct Flow {
    first: usize,
    held: u64,
}

impl Flow {
    /// Whether batch `b`, of `input` bytes, may start: when it is the next to commit
    /// (so the build always moves on), or when its input fits in the window.
    fn may_start(&self, b: usize, input: u64, window: u64) -> bool {
        self.first == b || self.held.saturating_add(input) <= window
    }
}

/// Run `jobs` on `threads` workers and hand each result to `commit` in job order, on
/// the calling thread. Workers take batches of consecutive jobs (about `BATCH_BYTES`
/// of input) in order. The memory the batches in flight hold, counted as their input
/// while they are compressed and as their results ([`held_bytes`]) once done, stays
/// under `window`: a batch starts only when its input fits, or when it is the next to
/// commit. So memory stays bounded while compression and commits overlap (counting
/// each job as its input undercounted a whole file kept with its compressed pieces
/// beside it, and overcounted a whole-file fragment). The first error stops everything.
/// With one thread (`-j 1`) there are no workers: the calling thread compresses each
/// job and commits it, so the build uses one core, with the same output.
fn run_ordered(
    jobs: &[Job],
    threads: usize,
    window: u64,
    c: &Compression,
    bs: u64,
    progress: &crate::Progress,
    commit: &mut dyn FnMut(&Job, SegOut) -> Result<()>,
) -> Result<()> {
    // Input bytes before each job.
    let mut cum = Vec::with_capacity(jobs.len() + 1);
    let mut acc = 0u64;
    for j in jobs {
        cum.push(acc);
        acc += j.end - j.start;
    }
    cum.push(acc);
    // Batch b is jobs `bounds[b]..bounds[b + 1]`.
    let mut bounds = vec![0usize];
    for i in 1..=jobs.len() {
        if i == jobs.len() || cum[i] - cum[bounds[bounds.len() - 1]] >= BATCH_BYTES {
            bounds.push(i);
        }
    }
    if threads <= 1 {
        // Batches here too: one spool write for a batch's fragments, as on workers.
        let mut comps = HashMap::default();
        let mut dst = Vec::new();
        for w in bounds.windows(2) {
            let batch = &jobs[w[0]..w[1]];
            let rs = compress_batch(batch, &mut comps, &mut dst, c, bs, progress);
            for (job, r) in batch.iter().zip(rs) {
                commit(job, r?)?;
            }
        }
        return Ok(());
    }
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{mpsc, Condvar, Mutex};
    let next = AtomicUsize::new(0);
    let committed = Mutex::new(Flow { first: 0, held: 0 });
    let moved = Condvar::new();
    let stop = AtomicBool::new(false);
    let halt = || {
        stop.store(true, Ordering::SeqCst);
        let _g = committed.lock().unwrap_or_else(|e| e.into_inner());
        moved.notify_all();
    };
    /// Stops the others if a worker unwinds.
    struct OnPanic<'a>(&'a dyn Fn());
    impl Drop for OnPanic<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                (self.0)();
            }
        }
    }
    // Per batch: the results of its jobs, in order, up to the first error.
    type Batch = Vec<Result<SegOut>>;
    let (tx, rx) = mpsc::channel::<(usize, Batch, u64)>();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            let tx = tx.clone();
            let (next, committed, moved, stop, cum, halt, bounds) =
                (&next, &committed, &moved, &stop, &cum, &halt, &bounds);
            s.spawn(move || {
                let _guard = OnPanic(halt);
                let mut comps = HashMap::default();
                let mut dst = Vec::new();
                // Bounded: every iteration takes a new batch index.
                loop {
                    let b = next.fetch_add(1, Ordering::SeqCst);
                    if b + 1 >= bounds.len() || stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let (first, end) = (bounds[b], bounds[b + 1]);
                    let input = cum[end] - cum[first];
                    let mut flow = committed.lock().unwrap_or_else(|e| e.into_inner());
                    while !flow.may_start(b, input, window) && !stop.load(Ordering::SeqCst) {
                        flow = moved.wait(flow).unwrap_or_else(|e| e.into_inner());
                    }
                    flow.held = flow.held.saturating_add(input);
                    drop(flow);
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let batch =
                        compress_batch(&jobs[first..end], &mut comps, &mut dst, c, bs, progress);
                    let kept: u64 = batch.iter().map(held_bytes).sum();
                    {
                        let mut flow = committed.lock().unwrap_or_else(|e| e.into_inner());
                        flow.held = flow.held.saturating_sub(input) + kept;
                        if kept < input {
                            moved.notify_all();
                        }
                    }
                    if tx.send((b, batch, kept)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut early: std::collections::BTreeMap<usize, (Batch, u64)> = Default::default();
        let mut b = 0usize;
        let res = (|| -> Result<()> {
            // Bounded: each pass commits batch b or receives one batch.
            while b + 1 < bounds.len() {
                let Some((rs, kept)) = early.remove(&b) else {
                    let (i, rs, kept) = rx.recv().map_err(|_| {
                        BuildError::Options("internal: compression workers stopped".into())
                    })?;
                    early.insert(i, (rs, kept));
                    continue;
                };
                let (first, end) = (bounds[b], bounds[b + 1]);
                if rs.len() > end - first {
                    return Err(BuildError::Options("internal: batch too long".into()));
                }
                let n = rs.len();
                for (job, r) in jobs[first..first + n].iter().zip(rs) {
                    commit(job, r?)?;
                }
                if n < end - first {
                    return Err(BuildError::Options("internal: batch cut short".into()));
                }
                b += 1;
                let mut flow = committed.lock().unwrap_or_else(|e| e.into_inner());
                flow.first = b;
                flow.held = flow.held.saturating_sub(kept);
                moved.notify_all();
            }
            Ok(())
        })();
        if res.is_err() {
            halt();
        }
        res
    })
}

/// A file without jobs: a duplicate stored elsewhere (placeholder), or stored as it is.
fn store_jobless(f: &FileReq, out: &mut Out, bits: u8, next_blk: &mut u64) -> Result<Stored> {
    if f.skip {
        return Ok(Stored::Data(FileData::Empty));
    }
    store_raw(f, None, out, bits, next_blk)
}

/// Store a file uncompressed at `next_blk` (flat, inline tail, or chunks for holes),
/// from `raw` when a worker already read the whole file.
fn store_raw(
    f: &FileReq,
    raw: Option<&[u8]>,
    out: &mut Out,
    bits: u8,
    next_blk: &mut u64,
) -> Result<Stored> {
    let mut dw = DataWriter {
        out,
        blkszbits: bits,
        next_blk: *next_blk,
        buf: Vec::new(),
        chunks: None,
        align: f.align,
    };
    let d = match raw {
        Some(bytes) if bytes.len() as u64 == f.size => dw.store_bytes(bytes, f.inline_tail)?,
        _ => dw.store_file(&f.src, f.size, f.inline_tail)?,
    };
    *next_blk = dw.next_blk;
    Ok(Stored::Data(d))
}

/// Pcluster dedupe (`-E dedupe`): every pcluster written so far, by content, so that
/// an identical one (same stored bytes, algorithm and logical length: it decodes to
/// the same data) is referenced instead of written again. The table is filled by the
/// committer in job order, so what is shared does not depend on the thread count.
#[derive(Default)]
pub struct PclMap {
    map: HashMap<PclKey, (u32, u16)>,
    /// Written pclusters by their data, for shifted matches.
    shift: shift::Index,
    /// Bytes of pclusters referenced instead of written.
    pub saved: u64,
}

/// (xxh3-128 of the stored bytes, their length, logical length, PLAIN, algorithm).
type PclKey = (u128, usize, u64, bool, usize);

/// Entries the table holds at most (about 60 MiB): later pclusters are still shared
/// when they match, but no longer added.
const PCL_MAP_MAX: usize = 1 << 20;

/// Index bytes a file of `n` lclusters gains with full instead of compact indexes.
fn full_index_extra(n: u64) -> u64 {
    6 * n + 8
}

/// Write one piece (logical length `len`) behind the data, or with `pcl` reference an
/// identical pcluster already written: once what the file would save that way
/// outweighs the full index it then needs (compact indexes cannot point back).
fn write_piece(
    piece: Piece,
    len: u64,
    p: &mut Pending,
    out: &mut Out,
    bits: u8,
    next_blk: &mut u64,
    pcl: Option<&mut PclMap>,
) -> Result<(u32, u16)> {
    let bs = 1u64 << bits;
    if let Some(r) = piece.refer {
        p.extents.push(ExtentDesc {
            lstart: piece.lstart,
            kind: if r.plain {
                HeadKind::Plain
            } else {
                HeadKind::Head1
            },
            blkaddr: r.blkaddr,
            blocks: r.blocks,
            partial: r.partial,
        });
        p.shared = true;
        p.reused += u64::from(r.blocks);
        if let Some(m) = pcl {
            m.saved += u64::from(r.blocks) * bs;
        }
        return Ok((r.blkaddr, r.blocks));
    }
    let blocks = if piece.plain {
        1
    } else {
        (piece.bytes.len() as u64).div_ceil(bs)
    };
    let kind = if piece.plain {
        HeadKind::Plain
    } else {
        HeadKind::Head1
    };
    let mut buf = vec![0u8; (blocks * bs) as usize];
    if piece.plain {
        buf[..piece.bytes.len()].copy_from_slice(&piece.bytes);
    } else {
        // Right-aligned behind zero padding (ZERO_PADDING).
        let off = buf.len() - piece.bytes.len();
        buf[off..].copy_from_slice(&piece.bytes);
    }
    // `--dsunit`: the file's first pcluster at a multiple of the unit (undone below
    // when it turns out to be shared).
    let unaligned = *next_blk;
    if p.extents.is_empty() {
        crate::data::align_next(out, next_blk, p.align, bits)?;
    }
    let blkaddr = u32::try_from(*next_blk)
        .map_err(|_| BuildError::TooLarge("compressed data beyond 2^32 blocks".into()))?;
    let mut new_key = None;
    if let Some(m) = pcl {
        let key = (
            xxhash_rust::xxh3::xxh3_128(&piece.bytes),
            piece.bytes.len(),
            len,
            piece.plain,
            p.alg,
        );
        match m.map.get(&key) {
            Some(&(at, b)) if u64::from(b) == blocks => {
                p.potential += blocks * bs;
                // Byte for byte (the hash only finds the candidate), once sharing pays.
                let worth = p.shared || p.full_index || p.potential > full_index_extra(p.lclusters);
                let mut old = Vec::new();
                if worth {
                    old.resize(buf.len(), 0);
                    out.read_at(u64::from(at) << bits, &mut old)?;
                }
                if worth && old == buf {
                    p.extents.push(ExtentDesc {
                        lstart: piece.lstart,
                        kind,
                        blkaddr: at,
                        blocks: b,
                        partial: false,
                    });
                    p.shared = true;
                    p.reused += blocks;
                    m.saved += blocks * bs;
                    *next_blk = unaligned;
                    return Ok((at, b));
                }
            }
            Some(_) => {}
            None if m.map.len() < PCL_MAP_MAX => new_key = Some(key),
            None => {}
        }
        if let Some(k) = new_key {
            m.map.insert(k, (blkaddr, blocks as u16));
            p.inserted.push(k);
        }
        if let Some(sig) = piece.sig {
            let written = shift::Ref {
                blkaddr,
                blocks: blocks as u16,
                plain: piece.plain,
                partial: false,
                local: None,
            };
            let id = m.shift.insert(sig, p.file, piece.lstart, written, p.alg);
            p.shift_ids.extend(id);
        }
    }
    out.write_at(*next_blk << bits, &buf)?;
    p.extents.push(ExtentDesc {
        lstart: piece.lstart,
        kind,
        blkaddr,
        blocks: blocks as u16,
        partial: false,
    });
    p.first_blk.get_or_insert(unaligned);
    p.blocks += blocks;
    *next_blk += blocks;
    Ok((blkaddr, blocks as u16))
}

/// Undo what a file rolled back to uncompressed put in the pcluster table: its
/// blocks are about to be overwritten.
fn forget(p: &Pending, pcl: Option<&mut PclMap>, bs: u64) {
    if let Some(m) = pcl {
        for k in &p.inserted {
            m.map.remove(k);
        }
        m.shift.remove(&p.shift_ids);
        m.saved -= p.reused * bs;
    }
}

/// Upper bound of the index area (compact 2B, any alignment) for `size` bytes.
pub fn max_index_bytes(size: u64, bits: u8) -> u64 {
    let n = size.div_ceil(1 << bits) as usize;
    (0..4u64)
        .map(|a| ferofs_format::zindex::compact_size(n, a * 8, true) as u64)
        .max()
        .unwrap_or(0)
}

/// Index bytes of a file (compact unless it shares pclusters: full).
fn index_bytes(p: &Pending, size: u64, bits: u8) -> u64 {
    if p.shared || p.full_index {
        8 + 8 * size.div_ceil(1 << bits)
    } else {
        max_index_bytes(size, bits)
    }
}

#[allow(clippy::too_many_arguments)]
fn finish_file(
    f: &FileReq,
    mut p: Pending,
    c: &Compression,
    out: &mut Out,
    bits: u8,
    next_blk: &mut u64,
    frags: Option<&mut FragStore>,
    mut pcl: Option<&mut PclMap>,
    re: &mut Recompress,
) -> Result<Stored> {
    let bs = 1u64 << bits;
    if p.whole_frag {
        let fs = frags.ok_or_else(|| BuildError::Options("internal: no fragment store".into()))?;
        return Ok(Stored::Fragment(fs.end_known(
            p.frag_hash.map(|h| h.hash),
            p.frag_hash.and_then(|h| h.end),
            p.sketch,
        )? as u64));
    }
    let bytes = p.raw.take();
    let Some(last) = p.last.take() else {
        return store_raw(f, bytes.as_deref(), out, bits, next_blk);
    };
    if last.frag {
        return finish_with_fragment(f, p, last, bytes, c, out, bits, next_blk, frags, pcl, re);
    }
    // ztailpacking: the last extent behind the inode when the record fits one block.
    let meta_before = f.fixed_meta.div_ceil(8) * 8 + 8 + index_bytes(&p, f.size, bits);
    let inline_ok = c.ztailpacking
        && (last.bytes.len() as u64) < bs
        && meta_before + last.bytes.len() as u64 <= bs;
    let mut inline = None;
    if inline_ok {
        let blkaddr = u32::try_from(*next_blk).unwrap_or(u32::MAX);
        p.extents.push(ExtentDesc {
            lstart: last.lstart,
            kind: if last.plain {
                HeadKind::Plain
            } else {
                HeadKind::Head1
            },
            blkaddr,
            blocks: 0,
            partial: false,
        });
        inline = Some((last.bytes, last.plain));
    } else {
        let len = f.size - last.lstart;
        write_piece(last, len, &mut p, out, bits, next_blk, pcl.as_deref_mut())?;
    }
    let inline_len = inline.as_ref().map_or(0, |(b, _)| b.len() as u64);
    if !shrinks(f, &p, inline_len, bits) {
        return roll_back(f, &p, bytes, out, bits, next_blk, pcl);
    }
    Ok(compressed(c, p, inline, None))
}

/// Does the file shrink? Its stored blocks, `tail` bytes kept elsewhere (inline or in
/// the packed inode) and its index against what it takes uncompressed (its exact size
/// when the tail can go inline, like mkfs.erofs; whole blocks otherwise). A tie goes to
/// uncompressed: it reads faster.
fn shrinks(f: &FileReq, p: &Pending, tail: u64, bits: u8) -> bool {
    let bs = 1u64 << bits;
    let stored = p.blocks * bs + tail + index_bytes(p, f.size, bits) + 8;
    let raw = if f.inline_tail {
        f.size
    } else {
        f.size.div_ceil(bs) * bs
    };
    stored < raw
}

/// Undo a file that does not shrink (nothing was written after it) and store it raw.
fn roll_back(
    f: &FileReq,
    p: &Pending,
    bytes: Option<Vec<u8>>,
    out: &mut Out,
    bits: u8,
    next_blk: &mut u64,
    pcl: Option<&mut PclMap>,
) -> Result<Stored> {
    forget(p, pcl, 1 << bits);
    if let Some(first) = p.first_blk {
        *next_blk = first;
    }
    store_raw(f, bytes.as_deref(), out, bits, next_blk)
}

/// The compressed layout of a finished file.
fn compressed(
    c: &Compression,
    p: Pending,
    inline: Option<(Vec<u8>, bool)>,
    fragment: Option<u64>,
) -> Stored {
    Stored::Compressed(ZFile {
        alg_id: c.algorithms[p.alg].encoder.algorithm().id(),
        extents: p.extents,
        inline,
        blocks: p.blocks + p.reused,
        fragment,
        full_index: p.shared || p.full_index,
        shared: p.shared,
    })
}

/// Least length of a fragment's end shared with an earlier fragment for which the rest
/// of the fragment goes to pclusters of the file's own.
const SPLIT_MIN_SHARED: u64 = 16 << 10;

/// A fragment (`last`) that ends like an earlier one, but is longer than the end they
/// share, can still share it: its head goes to pclusters of the file's own and its
/// rest is the end of the earlier fragment (mkfs.erofs does the same). Two versions of
/// a header or a static library, for example. The last pcluster of the head takes in
/// as much of the shared end as fits its blocks, so no block is left part empty.
/// Returns the head's pieces and where in `last` the rest starts, when the blocks
/// they take are fewer than what the shared rest would take in the packed inode.
fn split_at_common_end(
    f: &FileReq,
    last: &Piece,
    c: &Compression,
    re: &mut Recompress,
    fs: &FragStore,
    bits: u8,
) -> Result<Option<(Vec<Piece>, usize)>> {
    let m = last.bytes.len() as u64;
    if m < 2 * SPLIT_MIN_SHARED {
        return Ok(None);
    }
    let (shared, gap) = fs.common_end(&last.bytes)?;
    if shared < SPLIT_MIN_SHARED || shared >= m {
        return Ok(None);
    }
    let head_len = (m - shared) as usize;
    let p = policy(c, &f.rel);
    let (comp, _) = codec(re.comps, c, p.algorithm, p.pcluster)?;
    let bs = 1usize << bits;
    let pcl = p.pcluster as usize;
    if re.dst.len() < pcl {
        re.dst.resize(pcl, 0);
    }
    let bytes = &last.bytes;
    let mut pieces = Vec::new();
    // Input taken, blocks written, compressed bytes.
    let (mut pos, mut written, mut packed) = (0usize, 0usize, 0usize);
    // Bounded: each pass consumes at least one byte of the head or returns.
    while pos < head_len {
        comp.begin_stream();
        let cap = c.extent_cap();
        let (c1, w1) =
            comp.compress_destsize(&bytes[pos..head_len.min(pos + cap)], &mut re.dst[..pcl]);
        if c1 == 0 || w1 == 0 {
            return Ok(None);
        }
        let mut out = (c1, re.dst[..w1].to_vec());
        if pos + c1 == head_len {
            // The head's last pcluster: fill its blocks from the shared end too.
            let room = w1.div_ceil(bs) * bs;
            comp.begin_stream();
            let end = bytes.len().min(pos + cap);
            let (c2, w2) = comp.compress_destsize(&bytes[pos..end], &mut re.dst[..room]);
            if c2 > c1 && w2 > 0 {
                out = (c2, re.dst[..w2].to_vec());
            }
        }
        if out.1.len().div_ceil(bs) * bs >= out.0 {
            // Not smaller in blocks than the input it took.
            return Ok(None);
        }
        written += out.1.len().div_ceil(bs) * bs;
        packed += out.1.len();
        pieces.push(Piece {
            lstart: last.lstart + pos as u64,
            bytes: out.1,
            plain: false,
            frag: false,
            est: 0,
            refer: None,
            sig: None,
        });
        pos += out.0;
    }
    let rest = m - pos as u64;
    // The fragment store finds the rest by its last 64 bytes, and only beyond the
    // packed codec's reach (within it the rest would be stored again).
    if rest < crate::frag::SUFFIX_KEY || gap + rest <= fs.suffix_reach() {
        return Ok(None);
    }
    // What the head takes against what it and the shared rest would take in the
    // packed inode (at the ratio of the head's own pclusters).
    let packed_cost = m as f64 * packed as f64 / pos as f64;
    if written as f64 + bs as f64 >= packed_cost
        || !heads_ok(&pieces, last.lstart + pos as u64, bits)
    {
        return Ok(None);
    }
    Ok(Some((pieces, pos)))
}

/// Finish a file whose last piece is a fragment: the fragment goes to the packed inode
/// (the whole file, when nothing else of it was written), unless the file as a whole
/// does not shrink: then it is stored as it is.
#[allow(clippy::too_many_arguments)]
fn finish_with_fragment(
    f: &FileReq,
    mut p: Pending,
    last: Piece,
    bytes: Option<Vec<u8>>,
    c: &Compression,
    out: &mut Out,
    bits: u8,
    next_blk: &mut u64,
    frags: Option<&mut FragStore>,
    mut pcl: Option<&mut PclMap>,
    re: &mut Recompress,
) -> Result<Stored> {
    let fs = frags.ok_or_else(|| BuildError::Options("internal: no fragment store".into()))?;
    let mut last = last;
    if let Some((head, at)) = split_at_common_end(f, &last, c, re, fs, bits)? {
        // The head of the fragment goes to pclusters of the file's own; the rest is the
        // end of an earlier fragment, which the fragment store finds below.
        let ends: Vec<u64> = head
            .iter()
            .skip(1)
            .map(|q| q.lstart)
            .chain(std::iter::once(last.lstart + at as u64))
            .collect();
        for (piece, end) in head.into_iter().zip(ends) {
            let len = end - piece.lstart;
            write_piece(piece, len, &mut p, out, bits, next_blk, pcl.as_deref_mut())?;
        }
        last = Piece {
            lstart: last.lstart + at as u64,
            bytes: last.bytes[at..].to_vec(),
            plain: false,
            frag: true,
            est: 0,
            refer: None,
            sig: None,
        };
    }
    let hash = FragHash::for_piece(p.frag_hash, &last);
    // The bytes are in the spool already when a worker wrote them there.
    let add = |fs: &mut FragStore| match Spooled::for_piece(p.spooled, &last) {
        Some(at) => fs.add_spooled(
            at,
            last.bytes.len() as u64,
            hash.map(|h| h.0),
            hash.and_then(|h| h.1),
        ),
        None => fs.add_hashed(&last.bytes, hash.map(|h| h.0)),
    };
    if p.extents.is_empty() && last.lstart == 0 {
        return Ok(Stored::Fragment(add(fs)? as u64));
    }
    // The fragment counts at what it compressed to alone, or its raw size (at most a
    // pcluster) when it was not compressed: in the packed inode it will take about
    // that or less.
    if !shrinks(f, &p, last.est, bits) {
        return roll_back(f, &p, bytes, out, bits, next_blk, pcl);
    }
    let id = add(fs)?;
    // The tail head's block address is never read (the extent is a fragment); like
    // the sentinel, it carries the running value so compact packs stay consecutive.
    let blkaddr = u32::try_from(*next_blk).unwrap_or(u32::MAX);
    p.extents.push(ExtentDesc {
        lstart: last.lstart,
        kind: HeadKind::Head1,
        blkaddr,
        blocks: 0,
        partial: false,
    });
    Ok(compressed(c, p, None, Some(id as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comp(spec: &str, pcluster: u32) -> Compression {
        Compression {
            algorithms: vec![CompressorSpec::parse(spec).expect("spec")],
            pcluster_size: pcluster,
            ..Compression::default()
        }
    }

    #[test]
    fn big_codec_states_get_fewer_workers_under_the_memory_limit() {
        let limit = crate::options::DEFAULT_MEMORY_LIMIT;
        // LZMA at 1 MiB: a 4 MiB dictionary, 50 MiB a worker; a quarter of 512 MiB
        // holds two.
        let lzma = comp("lzma,level=6", 1 << 20);
        assert_eq!(codec_state_bytes(&lzma.algorithms[0], 1 << 20), 50 << 20);
        assert_eq!(fit_workers(8, &lzma, limit), 2);
        assert_eq!(fit_workers(8, &lzma, 2 << 30), 8);
        assert_eq!(fit_workers(8, &lzma, 0), 8);
        // zstd 15 at 1 MiB: 41 MiB a worker, three fit; zstd 3 (18 MiB) seven, lz4
        // (10 MiB) twelve; at 128 KiB sixteen or more for every codec.
        assert_eq!(fit_workers(8, &comp("zstd,level=15", 1 << 20), limit), 3);
        assert_eq!(fit_workers(8, &comp("zstd,level=3", 1 << 20), limit), 7);
        assert_eq!(fit_workers(16, &comp("zstd,level=3", 128 << 10), limit), 16);
        assert_eq!(fit_workers(32, &comp("lz4", 1 << 20), limit), 12);
        assert_eq!(fit_workers(32, &comp("lz4", 128 << 10), limit), 32);
        for alg in [
            "lzma,level=6",
            "zstd,level=15",
            "zstd,level=3",
            "lz4hc,level=12",
        ] {
            assert!(fit_workers(64, &comp(alg, 128 << 10), limit) >= 16, "{alg}");
        }
        // Small pclusters and light codecs: the thread count as asked.
        assert_eq!(fit_workers(8, &comp("lzma,level=6", 128 << 10), limit), 8);
        assert_eq!(
            fit_workers(16, &comp("lz4hc,level=12", 128 << 10), limit),
            16
        );
        // Never fewer than two, nor more than asked.
        assert_eq!(fit_workers(8, &lzma, 1 << 20), 2);
        assert_eq!(fit_workers(1, &lzma, 1 << 20), 1);
        assert_eq!(fit_workers(2, &lzma, limit), 2);
    }

    #[test]
    fn a_batch_starts_only_when_its_input_fits_in_the_window_or_it_is_next() {
        let f = Flow { first: 3, held: 60 };
        assert!(f.may_start(4, 40, 100));
        assert!(!f.may_start(4, 41, 100));
        assert!(!f.may_start(9, 41, 100));
        // The next batch to commit runs whatever it holds.
        assert!(f.may_start(3, 1 << 40, 100));
        let f = Flow {
            first: 0,
            held: u64::MAX,
        };
        assert!(!f.may_start(1, 1, 100));
    }

    #[test]
    fn the_window_grows_with_threads_up_to_a_quarter_of_the_limit() {
        let limit = crate::options::DEFAULT_MEMORY_LIMIT;
        let lzma = comp("lzma,level=6", 1 << 20);
        let lz4hc = comp("lz4hc,level=12", 128 << 10);
        // Two workers: four segments (32 MiB at 1 MiB pclusters, 16 MiB below).
        assert_eq!(window_bytes(&lzma, 2, limit), 128 << 20);
        assert_eq!(window_bytes(&lz4hc, 2, limit), 64 << 20);
        // More workers: two segments each, up to a quarter of the limit.
        assert_eq!(window_bytes(&lz4hc, 3, limit), 96 << 20);
        assert_eq!(window_bytes(&lz4hc, 8, limit), 128 << 20);
        assert_eq!(window_bytes(&lzma, 8, limit), 128 << 20);
        assert_eq!(window_bytes(&lz4hc, 8, 0), 256 << 20);
        assert_eq!(window_bytes(&lzma, 8, 2 << 30), 512 << 20);
    }

    #[test]
    fn segments_taper_at_the_end_of_a_pass() {
        const M: u64 = 1 << 20;
        let seg = 32 * M;
        // Segment lengths for `rest` bytes left, as store_all cuts one file.
        let cuts = |mut rest: u64| {
            let mut v = Vec::new();
            // Bounded: taper is at least 1 MiB or the rest.
            while rest > 0 {
                let len = taper(seg, rest).min(rest);
                v.push(len / M);
                rest -= len;
            }
            v
        };
        assert_eq!(cuts(128 * M), [32, 32, 32, 16, 8, 4, 4]);
        assert_eq!(cuts(33 * M), [17, 8, 4, 4]);
        assert_eq!(cuts(7 * M), [7]);
        assert_eq!(cuts(3 * M), [3]);
        // Nothing tapers while two segments or more remain.
        assert_eq!(taper(seg, 64 * M), seg);
        assert_eq!(taper(seg, u64::MAX), seg);
        // Small pclusters: 16 MiB segments, down to 2 MiB.
        assert_eq!(taper(16 * M, 20 * M), 10 * M);
        assert_eq!(taper(16 * M, 5 * M), 3 * M);
        assert_eq!(taper(16 * M, 3 * M), 3 * M);
    }
}
