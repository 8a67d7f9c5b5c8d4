//! `export`: an image (or a subtree) as a PAX tar stream, plain, gzip or zstd.
//!
//! Three kinds of thread share the work, so that memory stays bounded whatever the
//! image holds:
//! - one *walker* visits the tree depth-first in name order (the order `tar
//!   --sort=name` gives; EROFS directories are sorted), builds each entry's headers
//!   (metadata, xattrs, symlink target, sparse map: no file data) and cuts every regular
//!   file's data runs into segments of at most [`SEGMENT`] bytes;
//! - *workers* read (decompress) segments ahead, each with its own read context;
//! - the *writer* (the calling thread) takes headers and segments in walk order and
//!   writes them to the output, through the compressor.
//!
//! Segments in flight hold at most [`BUDGET`] bytes of data (the walker waits for the
//! writer to free some), and the walk itself holds one directory block per level, so
//! memory does not grow with the image. Hardlinks: the first path of an inode (in walk
//! order) carries the data, later ones are hardlink entries naming it (the walker keeps
//! one path per inode with more than one link). Sockets cannot be stored in a tar: they
//! are left out with a warning on stderr, as GNU tar does.

use crate::fmt::bytes_display;
use crate::list::open;
use crate::source::Image;
use crate::tarw::{self, Kind};
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use ferofs_format::inode::*;
use ferofs_reader::{Inode, ReadCtx};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

#[derive(Args)]
pub struct ExportArgs {
    /// The image: a file or a URL (http://, https://, s3://bucket/key).
    image: PathBuf,
    /// Output tar: `OUT.tar`, `OUT.tar.gz`/`.tgz`, `OUT.tar.zst`/`.tzst`, or `-` for
    /// standard output.
    #[arg(long, value_name = "OUT")]
    tar: PathBuf,
    /// Compression (default: from the output name; none for `-`).
    #[arg(long, value_enum)]
    compress: Option<Compression>,
    /// Compression level (gzip 0-9, default 6; zstd 1-19, default 3).
    #[arg(long)]
    level: Option<i32>,
    /// Export only this path of the image (its contents, relative to it).
    #[arg(long, default_value = "/")]
    path: String,
    /// Worker threads reading file data (0 = all cores).
    #[arg(short = 'j', long, default_value_t = 0)]
    threads: usize,
}

/// Largest piece of file data a worker reads at once.
const SEGMENT: u64 = 2 << 20;
/// Most file data read ahead of the writer.
const BUDGET: u64 = 16 << 20;
/// Most items (headers and segments) queued ahead of the writer.
const QUEUE: usize = 4096;

/// What the writer writes next, in order.
enum Item {
    /// Header bytes (PAX + ustar + sparse map).
    Header(Vec<u8>),
    /// A data segment being read by a worker; `pad` zeros follow it when it is the
    /// last of its file.
    Data {
        rx: Receiver<Result<Vec<u8>>>,
        len: u64,
        pad: usize,
    },
}

struct Job {
    ino: Arc<Inode>,
    path: Arc<Vec<u8>>,
    off: u64,
    len: u64,
    tx: SyncSender<Result<Vec<u8>>>,
}

/// Bytes of file data read ahead (queued, being read, or read and not yet written),
/// and whether the writer has stopped. The walker waits while [`BUDGET`] is in flight.
struct Budget {
    state: Mutex<(u64, bool)>,
    cv: Condvar,
}

impl Budget {
    fn take(&self, n: u64) -> bool {
        let Ok(mut g) = self.state.lock() else {
            return false;
        };
        // Bounded: each wake-up re-checks; the writer returns budget or closes.
        loop {
            if g.1 {
                return false;
            }
            // A segment larger than the whole budget (one compressed extent of up to
            // 12 MiB) goes when nothing else is in flight.
            if g.0 == 0 || g.0.saturating_add(n) <= BUDGET {
                g.0 = g.0.saturating_add(n);
                return true;
            }
            g = match self.cv.wait(g) {
                Ok(g) => g,
                Err(_) => return false,
            };
        }
    }
    fn give(&self, n: u64) {
        if let Ok(mut g) = self.state.lock() {
            g.0 = g.0.saturating_sub(n);
        }
        self.cv.notify_all();
    }
    fn close(&self) {
        if let Ok(mut g) = self.state.lock() {
            g.1 = true;
        }
        self.cv.notify_all();
    }
}

/// Segment buffers written out, for the workers to reuse (fresh megabyte buffers
/// cost page faults each time).
struct Pool(Mutex<Vec<Vec<u8>>>);

impl Pool {
    fn get(&self) -> Vec<u8> {
        self.0
            .lock()
            .ok()
            .and_then(|mut v| v.pop())
            .unwrap_or_default()
    }
    fn put(&self, b: Vec<u8>) {
        if b.capacity() > 2 * SEGMENT as usize {
            return;
        }
        if let Ok(mut v) = self.0.lock() {
            // Kept at its length: the next reader overwrites what it needs, so only
            // growth is zero-filled.
            if v.len() < (BUDGET / SEGMENT) as usize {
                v.push(b);
            }
        }
    }
}

fn compression_of(a: &ExportArgs) -> Compression {
    if let Some(c) = a.compress {
        return c;
    }
    let name = a.tar.to_string_lossy();
    if name.ends_with(".zst") || name.ends_with(".tzst") {
        Compression::Zstd
    } else if name.ends_with(".gz") || name.ends_with(".tgz") {
        Compression::Gzip
    } else {
        Compression::None
    }
}

/// The output: a temporary file renamed into place on success, stdout, or a file
/// that is not a regular one (a FIFO, a character or block device such as /dev/null
/// or a tape) written as it is: renaming over it would replace the device node.
enum Sink {
    File {
        tmp: PathBuf,
        dst: PathBuf,
        f: std::io::BufWriter<std::fs::File>,
    },
    Stdout(std::io::BufWriter<std::io::Stdout>),
    Device(std::io::BufWriter<std::fs::File>),
}

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::File { f, .. } | Sink::Device(f) => f.write(b),
            Sink::Stdout(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::File { f, .. } | Sink::Device(f) => f.flush(),
            Sink::Stdout(s) => s.flush(),
        }
    }
}

/// Removes the temporary output unless the export finished.
struct TmpGuard(Option<PathBuf>);
impl Drop for TmpGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn open_sink(out: &Path) -> Result<Sink> {
    if out == Path::new("-") {
        return Ok(Sink::Stdout(std::io::BufWriter::with_capacity(
            1 << 20,
            std::io::stdout(),
        )));
    }
    let out = match ferofs_builder::outfile::resolve(out)? {
        // A FIFO or device: written in place (renaming would replace the node).
        ferofs_builder::outfile::Target::Node(p, _) => {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .with_context(|| format!("open {}", p.display()))?;
            return Ok(Sink::Device(std::io::BufWriter::with_capacity(1 << 20, f)));
        }
        ferofs_builder::outfile::Target::File(p) => p,
    };
    let (f, tmp) = ferofs_builder::outfile::temp_beside(&out)?;
    Ok(Sink::File {
        tmp,
        dst: out.to_path_buf(),
        f: std::io::BufWriter::with_capacity(1 << 20, f),
    })
}

/// Counts what goes out (for the record-size padding of the trailer).
struct Counter<W: Write> {
    w: W,
    n: u64,
}
impl<W: Write> Write for Counter<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let k = self.w.write(b)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

pub fn run(a: ExportArgs) -> Result<()> {
    let img = open(&a.image)?;
    let top = img
        .lookup(a.path.as_bytes())
        .with_context(|| format!("{}: lookup failed", a.path))?;
    let threads = if a.threads == 0 {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    } else {
        a.threads
    };
    let comp = compression_of(&a);
    let mut sink = open_sink(&a.tar)?;
    let mut guard = TmpGuard(match &sink {
        Sink::File { tmp, .. } => Some(tmp.clone()),
        Sink::Stdout(_) | Sink::Device(_) => None,
    });
    let what = a.tar.display().to_string();
    match comp {
        Compression::None => {
            let mut c = Counter { w: &mut sink, n: 0 };
            stream(&img, &top, &a.path, threads, &mut c)?;
        }
        Compression::Gzip => {
            let lvl = u32::try_from(a.level.unwrap_or(6).clamp(0, 9)).unwrap_or(6);
            let enc = flate2::write::GzEncoder::new(&mut sink, flate2::Compression::new(lvl));
            let mut c = Counter { w: enc, n: 0 };
            stream(&img, &top, &a.path, threads, &mut c)?;
            c.w.finish().with_context(|| format!("write {what}"))?;
        }
        Compression::Zstd => {
            let mut enc = zstd::stream::write::Encoder::new(&mut sink, a.level.unwrap_or(3))
                .context("zstd encoder")?;
            // Compression runs on its own threads beside the workers.
            enc.multithread(u32::try_from(threads).unwrap_or(1))
                .context("zstd threads")?;
            let mut c = Counter { w: enc, n: 0 };
            stream(&img, &top, &a.path, threads, &mut c)?;
            c.w.finish().with_context(|| format!("write {what}"))?;
        }
    }
    sink.flush().with_context(|| format!("write {what}"))?;
    if let Sink::File { tmp, dst, f } = sink {
        let file = f
            .into_inner()
            .map_err(|e| anyhow!("write {what}: {}", e.error()))?;
        file.sync_data().ok();
        drop(file);
        std::fs::rename(&tmp, &dst)
            .with_context(|| format!("rename {} to {}", tmp.display(), dst.display()))?;
        guard.0 = None;
    }
    Ok(())
}

/// Walk, read and write the archive to `out` (trailer included).
fn stream<W: Write>(
    img: &Image,
    top: &Inode,
    top_path: &str,
    threads: usize,
    out: &mut Counter<W>,
) -> Result<()> {
    let budget = Budget {
        state: Mutex::new((0, false)),
        cv: Condvar::new(),
    };
    let pool = Pool(Mutex::new(Vec::new()));
    let (item_tx, item_rx) = sync_channel::<Item>(QUEUE);
    let (job_tx, job_rx) = channel::<Job>();
    let job_rx = Mutex::new(job_rx);
    out.write_all(&tarw::global_header())
        .context("write the archive")?;
    std::thread::scope(|s| -> Result<()> {
        let budget = &budget;
        let job_rx = &job_rx;
        let pool = &pool;
        let walker = s.spawn(move || walk(img, top, top_path, budget, item_tx, job_tx));
        for _ in 0..threads.max(1) {
            s.spawn(move || worker(img, job_rx, pool));
        }
        let res = write_items(item_rx, budget, pool, out);
        // Stop the walker if it still waits for budget (after an error).
        budget.close();
        let walked = walker
            .join()
            .map_err(|_| anyhow!("the tree walk panicked"))?;
        // The walker's own error explains a writer stopped by a closed queue.
        walked?;
        res
    })?;
    let t = tarw::trailer(out.n);
    out.write_all(&t).context("write the archive trailer")?;
    Ok(())
}

fn write_items<W: Write>(
    rx: Receiver<Item>,
    budget: &Budget,
    pool: &Pool,
    out: &mut W,
) -> Result<()> {
    let zeros = [0u8; tarw::BLOCK];
    for item in rx {
        match item {
            Item::Header(h) => out.write_all(&h).context("write the archive")?,
            Item::Data { rx, len, pad } => {
                let data = rx
                    .recv()
                    .map_err(|_| anyhow!("a reader thread stopped"))??;
                if data.len() as u64 != len {
                    bail!("internal: segment of {} bytes, {len} expected", data.len());
                }
                out.write_all(&data).context("write the archive")?;
                pool.put(data);
                budget.give(len);
                out.write_all(&zeros[..pad]).context("write the archive")?;
            }
        }
    }
    Ok(())
}

fn worker(img: &Image, jobs: &Mutex<Receiver<Job>>, pool: &Pool) {
    let mut ctx = ReadCtx::new();
    // Bounded: ends when the walker drops the job queue.
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        let r = read_segment(img, &mut ctx, &job, pool.get());
        // The writer may have stopped; nothing to do then.
        let _ = job.tx.send(r);
    }
}

fn read_segment(img: &Image, ctx: &mut ReadCtx, job: &Job, mut buf: Vec<u8>) -> Result<Vec<u8>> {
    let len = usize::try_from(job.len)?;
    // Every byte up to `len` is read below (or the segment fails).
    buf.resize(len, 0);
    let mut done = 0usize;
    // Bounded: each read returns at least one byte or fails.
    while done < len {
        let off = job.off + done as u64;
        let n = img
            .read_at_with(ctx, &job.ino, off, &mut buf[done..])
            .with_context(|| format!("{}: read at offset {off}", bytes_display(&job.path)))?;
        if n == 0 {
            bail!(
                "{}: image data ends at {off}, size is {}",
                bytes_display(&job.path),
                job.ino.size
            );
        }
        done += n;
    }
    Ok(buf)
}

/// The error that stops a walk from its callback (the real cause is kept aside by the
/// caller; `ls -R` uses it too).
pub(crate) fn stop() -> ferofs_reader::Error {
    ferofs_reader::Error::Io {
        offset: 0,
        error: std::io::Error::other("export stopped"),
    }
}

fn walk(
    img: &Image,
    top: &Inode,
    top_path: &str,
    budget: &Budget,
    items: SyncSender<Item>,
    jobs: std::sync::mpsc::Sender<Job>,
) -> Result<()> {
    let mut first: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut ctx = ReadCtx::new();
    let mut failed: Option<anyhow::Error> = None;
    let single = !top.is_dir();
    // The last path visited, to say where a walk error struck.
    let mut last: Vec<u8> = Vec::new();
    let r = img.walk_from(top, |rel, ino| {
        last.clear();
        last.extend_from_slice(rel);
        let path: Vec<u8> = if single {
            let name = top_path.trim_end_matches('/').rsplit('/').next();
            let mut p = b"./".to_vec();
            p.extend_from_slice(name.unwrap_or("file").as_bytes());
            p
        } else {
            let mut p = b".".to_vec();
            p.extend_from_slice(rel);
            p
        };
        match entry(img, &mut ctx, &mut first, path, ino, budget, &items, &jobs) {
            Ok(true) => Ok(()),
            Ok(false) => Err(stop()),
            Err(e) => {
                failed = Some(e);
                Err(stop())
            }
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    // A closed queue means the writer stopped: its error is the one to report.
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.to_string().contains("export stopped") => Ok(()),
        Err(e) => Err(anyhow::Error::new(e)
            .context(format!("walk the image (after {})", bytes_display(&last)))),
    }
}

/// Queue one entry; Ok(false) when the writer has stopped.
#[allow(clippy::too_many_arguments)]
fn entry(
    img: &Image,
    ctx: &mut ReadCtx,
    first: &mut HashMap<u64, Vec<u8>>,
    mut path: Vec<u8>,
    ino: &Inode,
    budget: &Budget,
    items: &SyncSender<Item>,
    jobs: &std::sync::mpsc::Sender<Job>,
) -> Result<bool> {
    let shown_s = bytes_display(path.get(1..).unwrap_or(&[]));
    let shown = || shown_s.clone();
    let mut kind = match ino.mode & S_IFMT {
        S_IFREG => Kind::File,
        S_IFDIR => Kind::Dir,
        S_IFLNK => Kind::Symlink,
        S_IFCHR => Kind::Char,
        S_IFBLK => Kind::Block,
        S_IFIFO => Kind::Fifo,
        S_IFSOCK => {
            eprintln!(
                "ferofs: warning: {}: socket not exported (tar cannot hold sockets)",
                shown()
            );
            return Ok(true);
        }
        _ => bail!("{}: unknown file type {:o}", shown(), ino.mode),
    };
    let mut link = Vec::new();
    if kind == Kind::Dir && !path.ends_with(b"/") {
        path.push(b'/');
    }
    if kind != Kind::Dir && ino.nlink > 1 {
        match first.get(&ino.nid) {
            Some(p) => {
                kind = Kind::HardLink;
                link = p.clone();
            }
            None => {
                first.insert(ino.nid, path.clone());
            }
        }
    }
    if kind == Kind::Symlink {
        link = img
            .read_link(ino)
            .with_context(|| format!("{}: read symlink", shown()))?;
    }
    let xattrs = if kind == Kind::HardLink || ino.xattr_icount == 0 {
        Vec::new()
    } else {
        img.xattrs(ino)
            .with_context(|| format!("{}: read xattrs", shown()))?
            .into_iter()
            .map(|x| (x.name, x.value))
            .collect()
    };
    let segs = if kind == Kind::File {
        segments(img, ctx, ino).with_context(|| format!("{}: map data", shown()))?
    } else {
        Vec::new()
    };
    let runs = data_runs(&segs);
    // Sparse when the mapping has a hole (a file of holes only has no data runs).
    let sparse = (kind == Kind::File && ino.size > 0 && runs != [(0, ino.size)])
        .then(|| sparse_runs(&runs, ino.size));
    let e = tarw::Entry {
        path,
        kind,
        mode: u32::from(ino.mode & 0o7777),
        uid: ino.uid,
        gid: ino.gid,
        mtime: ino.mtime,
        mtime_nsec: ino.mtime_nsec,
        size: if kind == Kind::File { ino.size } else { 0 },
        link,
        dev: if matches!(kind, Kind::Char | Kind::Block) {
            ino.rdev_major_minor()
        } else {
            (0, 0)
        },
        xattrs,
        sparse,
    };
    let mut h = Vec::new();
    e.encode(&mut h);
    if items.send(Item::Header(h)).is_err() {
        return Ok(false);
    }
    if kind != Kind::File {
        return Ok(true);
    }
    let pad = tarw::padding(e.data_len());
    let ino = Arc::new(ino.clone());
    let path = Arc::new(e.path);
    let last = segs.len().saturating_sub(1);
    for (k, &(off, n)) in segs.iter().enumerate() {
        if !budget.take(n) {
            return Ok(false);
        }
        let (tx, rx) = sync_channel(1);
        let job = Job {
            ino: ino.clone(),
            path: path.clone(),
            off,
            len: n,
            tx,
        };
        if jobs.send(job).is_err() {
            return Ok(false);
        }
        let item = Item::Data {
            rx,
            len: n,
            pad: if k == last { pad } else { 0 },
        };
        if items.send(item).is_err() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A file's data as read segments `(offset, length)`, holes left out, without reading
/// data: consecutive data runs are gathered up to [`SEGMENT`] bytes, cut only between
/// extents of a compressed file (so no two workers decode the same extent; an extent
/// larger than a segment, up to the largest a pcluster decodes to, is one segment) and
/// anywhere in stored data or a longer run.
fn segments(img: &Image, ctx: &mut ReadCtx, ino: &Inode) -> Result<Vec<(u64, u64)>> {
    let compressed = ino.layout.is_compressed();
    let mut segs: Vec<(u64, u64)> = Vec::new();
    let mut cur: Option<(u64, u64)> = None;
    let mut pos = 0u64;
    // Bounded: `run_end` returns an end beyond `pos` or fails.
    while pos < ino.size {
        let (end, hole) = img.run_end(ctx, ino, pos)?;
        if hole {
            segs.extend(cur.take());
        } else {
            // An extent is one segment (decoded once) when it can be one decoded
            // pcluster; a longer run (a fragment of a large file, or a hostile map) is
            // cut like stored data, so no segment's buffer passes the larger bound.
            let whole = compressed && end - pos <= ferofs_reader::limits::MAX_EXTENT_BYTES;
            let mut at = pos;
            // Bounded: each step takes at least one byte of the run, or flushes.
            while at < end {
                let (start, len) = cur.unwrap_or((at, 0));
                let room = SEGMENT.saturating_sub(len);
                let take = if whole {
                    end - at
                } else {
                    (end - at).min(room)
                };
                if take == 0 || (whole && len >= SEGMENT) {
                    segs.extend(cur.take());
                    continue;
                }
                cur = Some((start, len + take));
                at += take;
            }
        }
        pos = end;
    }
    segs.extend(cur);
    Ok(segs)
}

/// Data runs: segments that touch merged.
fn data_runs(segs: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &(o, l) in segs {
        match runs.last_mut() {
            Some(last) if last.0 + last.1 == o => last.1 += l,
            _ => runs.push((o, l)),
        }
    }
    runs
}

/// The sparse map tar stores: the data runs, plus an empty run at the end of a file
/// that ends in a hole (as GNU tar writes it, so that extraction sets the size).
fn sparse_runs(runs: &[(u64, u64)], size: u64) -> Vec<(u64, u64)> {
    let mut v = runs.to_vec();
    match v.last() {
        Some(&(o, l)) if o + l == size => {}
        _ => v.push((size, 0)),
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferofs_builder::{BuildOptions, Compression, Fragments};

    /// A 20 MiB file held whole as one fragment (all-fragments) is one extent longer
    /// than any pcluster decodes to: it is cut into segments of at most [`SEGMENT`],
    /// and the tar holds its bytes. A mutated image whose map made one extent of 256
    /// TiB had export allocate a buffer that long (an abort; found by torture-cli).
    #[test]
    fn runs_longer_than_an_extent_are_cut() {
        let d = tempfile::tempdir().expect("tempdir");
        let src = d.path().join("t");
        std::fs::create_dir(&src).expect("mkdir");
        let mut data = Vec::with_capacity(20 << 20);
        let mut x = 7u64;
        while data.len() < 20 << 20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            data.extend_from_slice(format!("line {} of many\n", x % 1000).as_bytes());
        }
        data.truncate(20 << 20);
        std::fs::write(src.join("big"), &data).expect("write");
        let img_path = d.path().join("t.erofs");
        let opts = BuildOptions {
            compression: Some(Compression {
                algorithms: vec![ferofs_compress::CompressorSpec::parse("lz4").expect("lz4")],
                pcluster_size: 4096,
                ztailpacking: false,
                hints: Vec::new(),
                max_extent: 0,
                full_index: false,
            }),
            fragments: Fragments::All { pcluster_size: 0 },
            threads: 1,
            ..Default::default()
        };
        ferofs_builder::build_from_dir(&src, &img_path, &opts).expect("build");
        let img = open(&img_path).expect("open");
        let ino = img.lookup(b"/big").expect("lookup");
        let mut ctx = ReadCtx::new();
        let (end, hole) = img.run_end(&mut ctx, &ino, 0).expect("map");
        assert!(!hole);
        assert!(
            end > ferofs_reader::limits::MAX_EXTENT_BYTES,
            "one extent of {end} bytes expected (a fragment)"
        );
        let segs = segments(&img, &mut ctx, &ino).expect("segments");
        assert!(segs.iter().all(|&(_, n)| n <= SEGMENT), "{segs:?}");
        assert_eq!(segs.iter().map(|s| s.1).sum::<u64>(), data.len() as u64);
        let mut out = Counter {
            w: Vec::new(),
            n: 0,
        };
        let top = img.lookup(b"/").expect("root");
        stream(&img, &top, "/", 2, &mut out).expect("export");
        let tar = out.w;
        let at = tar
            .windows(32)
            .position(|w| w == &data[..32])
            .expect("the file's bytes in the tar");
        assert_eq!(&tar[at..at + data.len()], &data[..]);
    }
}
