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
use crate::source::Source;
use ferofs_compress::probe::{Probe, CHUNK};
use ferofs_compress::{new_compressor, CompressorSpec, FixedOutputCompressor};
use ferofs_format::zindex::{ExtentDesc, HeadKind};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;

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
        }
    }
}

impl Compression {
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
    /// Full (8-byte) lcluster indexes instead of compact ones (fragment offsets of
    /// 2^32 and more need them).
    pub full_index: bool,
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
}

struct Job {
    file: usize,
    src: Source,
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
}

/// What a worker hands the committer for one job.
struct SegOut {
    pieces: Vec<Piece>,
    raw: Option<Vec<u8>>,
    /// Input bytes handed to the compressor.
    fed: u64,
}

/// Most input one extent may take (the kernel accepts up to 12 MiB decoded).
const MAX_EXTENT_INPUT: usize = 8 << 20;
/// Segment size: a file compresses in independent pieces of this many bytes.
fn segment_size(pcluster: u32) -> u64 {
    (32 * u64::from(pcluster)).max(16 << 20)
}
/// Input bytes handed to the workers at once.
const WINDOW_BYTES: u64 = 64 << 20;

/// The pcluster size and algorithm index for a file.
pub fn policy(c: &Compression, rel: &[u8]) -> (usize, u32) {
    let s = String::from_utf8_lossy(rel);
    for h in &c.hints {
        if h.regex.is_match(&s) {
            return (
                h.algorithm.min(c.algorithms.len().saturating_sub(1)),
                h.pcluster_size,
            );
        }
    }
    (0, c.pcluster_size)
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
    job.src
        .open(job.end)?
        .read_into(job.start, len, &mut data)?;
    if job.frag == FragMode::Whole {
        return Ok(SegOut {
            pieces: vec![Piece {
                lstart: job.start,
                est: data.len() as u64,
                bytes: data,
                plain: false,
                frag: true,
            }],
            raw: None,
            fed: 0,
        });
    }
    let key = (job.alg, job.pcluster);
    if let std::collections::hash_map::Entry::Vacant(e) = comps.entry(key) {
        let spec = &c.algorithms[job.alg];
        let comp = new_compressor(spec, c.max_pcluster())
            .map_err(|e| BuildError::Options(e.to_string()))?;
        let probe = Probe::new(comp.algorithm());
        e.insert((comp, probe));
    }
    let (comp, probe) = comps
        .get_mut(&key)
        .ok_or_else(|| BuildError::Options("internal: compressor".into()))?;
    // Each segment starts from the same compressor state, whichever worker ran what
    // before: the output must not depend on the thread count or on scheduling.
    comp.begin_stream();
    // The worker's output buffer, reused: zeroed only when it grows.
    if dst.len() < job.pcluster as usize {
        dst.resize(job.pcluster as usize, 0);
    }
    let dst = &mut dst[..job.pcluster as usize];
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
            });
        }
    };
    // At the end of a file, at most one block left takes one block compressed or not
    // (unless the compressed tail goes inline): store it as is, without compressing it
    // (as mkfs.erofs does).
    // With fragments, what is left of a file once it fits one pcluster uncompressed
    // goes to the packed inode as it is (mkfs.erofs does the same).
    let frag_tail = job.last && job.frag == FragMode::Tail;
    let plain_tail = job.last && !c.ztailpacking && !frag_tail;
    // Input bytes handed to the compressor.
    let mut fed = len as u64;
    // Bounded: every iteration consumes at least one byte.
    while pos < len {
        if frag_tail && len - pos <= job.pcluster as usize {
            pieces.push(Piece {
                lstart: job.start + pos as u64,
                bytes: data[pos..].to_vec(),
                plain: false,
                frag: true,
                est: (len - pos) as u64,
            });
            fed -= (len - pos) as u64;
            break;
        }
        if plain_tail && (len - pos) as u64 <= bs {
            pieces.push(Piece {
                lstart: job.start + pos as u64,
                bytes: data[pos..].to_vec(),
                plain: true,
                frag: false,
                est: 0,
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
        let src = &data[pos..len.min(pos + MAX_EXTENT_INPUT)];
        let (consumed, written) = comp.compress_destsize(src, dst);
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
            });
            break;
        }
        if consumed > 0 && written > 0 && stored < consumed as u64 {
            pieces.push(Piece {
                lstart: job.start + pos as u64,
                bytes: dst[..written].to_vec(),
                plain: false,
                frag: false,
                est: 0,
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
    Ok(SegOut {
        pieces,
        raw: job.whole.then_some(data),
        fed,
    })
}

/// Per-file commit state.
struct Pending {
    extents: Vec<ExtentDesc>,
    first_blk: Option<u64>,
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
    /// Blocks referenced instead of written; bytes that could have been.
    reused: u64,
    potential: u64,
    /// Pcluster table entries this file added.
    inserted: Vec<PclKey>,
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
}

/// Compress every file in `files` (inode order) and write the data at `next_blk`.
/// Returns one `Stored` per file, the next free block and the input bytes handed to
/// the compressors.
#[allow(clippy::too_many_arguments)] // the stage's whole hand-off
pub fn store_all(
    files: &[FileReq],
    c: &Compression,
    out: &mut Out,
    bits: u8,
    mut next_blk: u64,
    threads: usize,
    mut frags: Option<&mut FragStore>,
    mut pcl: Option<&mut PclMap>,
    progress: &crate::Progress,
) -> Result<(Vec<Stored>, u64, u64)> {
    let bs = 1u64 << bits;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| BuildError::Options(format!("thread pool: {e}")))?;
    // Files with holes keep them (chunk-based, uncompressed); the rest compress.
    let holey: Vec<bool> = pool.install(|| {
        files
            .par_iter()
            .map(|f| !f.skip && f.src.open(f.size).ok().and_then(|h| h.segments()).is_some())
            .collect()
    });
    let mut jobs = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        // A file of at most one block cannot shrink unless its compressed form goes
        // inline (ztailpacking): compressed it still takes a block, raw its bytes go
        // inline or take that one block. Not compressing it gives the same image.
        let frag = if holey[fi] || frags.is_none() {
            FragMode::None
        } else {
            f.frag
        };
        if holey[fi]
            || f.skip
            || f.size == 0
            || (!c.ztailpacking && frag == FragMode::None && f.size <= bs)
        {
            continue;
        }
        let (alg, pcl) = policy(c, &f.rel);
        let seg = segment_size(pcl);
        let mut s = 0;
        while s < f.size {
            let e = (s + seg).min(f.size);
            jobs.push(Job {
                file: fi,
                src: f.src.clone(),
                start: s,
                end: e,
                alg,
                pcluster: pcl,
                whole: s == 0 && e == f.size,
                last: e == f.size,
                frag,
            });
            s = e;
        }
    }
    let mut results: Vec<Option<Stored>> = (0..files.len()).map(|_| None).collect();
    let mut pending: Option<(usize, Pending)> = None;
    // Files before `done_upto` are committed.
    let mut done_upto = 0usize;
    let mut fed = 0u64;
    // The committer (this thread) takes results strictly in job order while the
    // workers run ahead, at most `window` input bytes past the last committed job.
    let mut commit = |job: &Job, seg: SegOut| -> Result<()> {
        if pending.as_ref().map(|(f, _)| *f) != Some(job.file) {
            if let Some((f, p)) = pending.take() {
                let fs = frags.as_deref_mut();
                let pm = pcl.as_deref_mut();
                results[f] = Some(finish_file(
                    &files[f],
                    p,
                    c,
                    out,
                    bits,
                    &mut next_blk,
                    fs,
                    pm,
                )?);
                done_upto = f + 1;
            }
            // Files without jobs (holes, empty) between the last one and this one.
            for f in done_upto..job.file {
                results[f] = Some(store_jobless(&files[f], out, bits, &mut next_blk)?);
            }
            done_upto = job.file;
            pending = Some((
                job.file,
                Pending {
                    extents: Vec::new(),
                    first_blk: None,
                    blocks: 0,
                    last: None,
                    alg: job.alg,
                    raw: None,
                    whole_frag: job.frag == FragMode::Whole,
                    lclusters: files[job.file].size.div_ceil(bs),
                    shared: false,
                    reused: 0,
                    potential: 0,
                    inserted: Vec::new(),
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
        fed += seg.fed;
        if p.whole_frag {
            let fs = frags
                .as_deref_mut()
                .ok_or_else(|| BuildError::Options("internal: no fragment store".into()))?;
            for piece in seg.pieces {
                fs.push(&piece.bytes)?;
            }
            return Ok(());
        }
        for piece in seg.pieces {
            if let Some(prev) = p.last.take() {
                let len = piece.lstart - prev.lstart;
                write_piece(prev, len, p, out, bits, &mut next_blk, pcl.as_deref_mut())?;
            }
            p.last = Some(piece);
        }
        Ok(())
    };
    let window = WINDOW_BYTES.max(2 * threads as u64 * segment_size(c.max_pcluster()));
    run_ordered(&jobs, threads, window, c, bs, progress, &mut commit)?;
    if let Some((f, p)) = pending.take() {
        let fs = frags;
        let pm = pcl;
        results[f] = Some(finish_file(
            &files[f],
            p,
            c,
            out,
            bits,
            &mut next_blk,
            fs,
            pm,
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

/// Run `jobs` on `threads` workers and hand each result to `commit` in job order, on
/// the calling thread. Workers take jobs in order and start job `i` only while it lies
/// less than `window` input bytes past the first uncommitted job, so memory stays
/// bounded while compression and commits overlap. The first error stops everything.
fn run_ordered(
    jobs: &[Job],
    threads: usize,
    window: u64,
    c: &Compression,
    bs: u64,
    progress: &crate::Progress,
    commit: &mut dyn FnMut(&Job, SegOut) -> Result<()>,
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{mpsc, Condvar, Mutex};
    // Input bytes before each job.
    let mut cum = Vec::with_capacity(jobs.len() + 1);
    let mut acc = 0u64;
    for j in jobs {
        cum.push(acc);
        acc += j.end - j.start;
    }
    cum.push(acc);
    let next = AtomicUsize::new(0);
    let committed = Mutex::new(0u64);
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
    let (tx, rx) = mpsc::channel::<(usize, Result<SegOut>)>();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            let tx = tx.clone();
            let (next, committed, moved, stop, cum, halt) =
                (&next, &committed, &moved, &stop, &cum, &halt);
            s.spawn(move || {
                let _guard = OnPanic(halt);
                let mut comps = HashMap::new();
                let mut dst = Vec::new();
                // Bounded: every iteration takes a new job index.
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= jobs.len() || stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let mut done = committed.lock().unwrap_or_else(|e| e.into_inner());
                    while cum[i] >= *done + window && !stop.load(Ordering::SeqCst) {
                        done = moved.wait(done).unwrap_or_else(|e| e.into_inner());
                    }
                    drop(done);
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let r = compress_segment(&jobs[i], &mut comps, &mut dst, c, bs);
                    progress.add_done(jobs[i].end - jobs[i].start);
                    if tx.send((i, r)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut early: std::collections::BTreeMap<usize, Result<SegOut>> = Default::default();
        let mut k = 0usize;
        let res = (|| -> Result<()> {
            // Bounded: each pass commits job k or receives one result.
            while k < jobs.len() {
                let Some(r) = early.remove(&k) else {
                    let (i, r) = rx.recv().map_err(|_| {
                        BuildError::Options("internal: compression workers stopped".into())
                    })?;
                    early.insert(i, r);
                    continue;
                };
                commit(&jobs[k], r?)?;
                k += 1;
                let mut done = committed.lock().unwrap_or_else(|e| e.into_inner());
                *done = cum[k];
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
) -> Result<()> {
    let bs = 1u64 << bits;
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
                let worth = p.shared || p.potential > full_index_extra(p.lclusters);
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
                    });
                    p.shared = true;
                    p.reused += blocks;
                    m.saved += blocks * bs;
                    return Ok(());
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
    }
    out.write_at(*next_blk << bits, &buf)?;
    p.extents.push(ExtentDesc {
        lstart: piece.lstart,
        kind,
        blkaddr,
        blocks: blocks as u16,
    });
    p.first_blk.get_or_insert(*next_blk);
    p.blocks += blocks;
    *next_blk += blocks;
    Ok(())
}

/// Undo what a file rolled back to uncompressed put in the pcluster table: its
/// blocks are about to be overwritten.
fn forget(p: &Pending, pcl: Option<&mut PclMap>, bs: u64) {
    if let Some(m) = pcl {
        for k in &p.inserted {
            m.map.remove(k);
        }
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
    if p.shared {
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
) -> Result<Stored> {
    let bs = 1u64 << bits;
    if p.whole_frag {
        let fs = frags.ok_or_else(|| BuildError::Options("internal: no fragment store".into()))?;
        return Ok(Stored::Fragment(fs.end()? as u64));
    }
    let bytes = p.raw.take();
    let Some(last) = p.last.take() else {
        return store_raw(f, bytes.as_deref(), out, bits, next_blk);
    };
    if last.frag {
        return finish_with_fragment(f, p, last, bytes, c, out, bits, next_blk, frags, pcl);
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
        full_index: p.shared,
    })
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
    pcl: Option<&mut PclMap>,
) -> Result<Stored> {
    let fs = frags.ok_or_else(|| BuildError::Options("internal: no fragment store".into()))?;
    if p.extents.is_empty() && last.lstart == 0 {
        return Ok(Stored::Fragment(fs.add(&last.bytes)? as u64));
    }
    // The fragment counts at what it compressed to alone, or its raw size (at most a
    // pcluster) when it was not compressed: in the packed inode it will take about
    // that or less.
    if !shrinks(f, &p, last.est, bits) {
        return roll_back(f, &p, bytes, out, bits, next_blk, pcl);
    }
    let id = fs.add(&last.bytes)?;
    // The tail head's block address is never read (the extent is a fragment); like
    // the sentinel, it carries the running value so compact packs stay consecutive.
    let blkaddr = u32::try_from(*next_blk).unwrap_or(u32::MAX);
    p.extents.push(ExtentDesc {
        lstart: last.lstart,
        kind: HeadKind::Head1,
        blkaddr,
        blocks: 0,
    });
    Ok(compressed(c, p, None, Some(id as u64)))
}
