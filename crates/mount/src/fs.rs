//! The FUSE filesystem: node ids <-> nids, attributes, errno mapping, and the read path
//! (extent cache with single flight, read-ahead). No format logic: everything about
//! the image comes from `ferofs-reader`.

use crate::cache::{Cache, Key, Val};
use crate::record::Recorder;
use crate::source;
use ferofs_format::inode::{
    S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK,
};
use ferofs_reader::{DirEntry, Error, Image, Inode, ReadCtx, Source, SpanKind};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyXattr,
    Request,
};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

/// How long the kernel may keep entries and attributes: the image never changes.
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// FUSE's root node id.
const ROOT_ID: u64 = 1;

/// Most read-ahead jobs queued; more are dropped (read-ahead is only a hint).
const PREFETCH_QUEUE: usize = 16;

/// Most extents one read-ahead job decodes.
const PREFETCH_EXTENTS: usize = 64;

/// Extents smaller than this are not read ahead (see `Shared::prefetch`).
const PREFETCH_MIN_EXTENT: u64 = 64 << 10;

/// Read-ahead window after a sequential read (at least one extent).
const PREFETCH_BYTES: u64 = 512 << 10;

/// Directory read-ahead (see [`DirAhead`]): files asked for ahead of the reader, the
/// largest file that counts as small, and decoded bytes one job decodes at most.
const AHEAD_FILES: usize = 8;
const AHEAD_MAX_FILE: u64 = 1 << 20;
const AHEAD_BYTES: u64 = 2 << 20;

/// Small-file warm-up (see `Shared::warm`): files up to this size, stored bytes read
/// at once at most, extents looked at. With 4,000 random 4 KiB reads over the rootfs
/// files above 64 KiB (three quarters of them at most 256 KiB), cold: 3,285 device
/// reads without, 1,930 with (1 MiB: 1,420, but no faster).
const WARM_MAX_FILE: u64 = 256 << 10;
const WARM_MAX_STORED: u64 = 512 << 10;
const WARM_MAX_EXTENTS: usize = 1024;

/// Most bytes one FUSE read returns (the kernel asks for at most max_pages pages).
const MAX_READ: u32 = 16 << 20;

/// Settings for [`ErofsFs`].
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Threads decoding read-ahead.
    pub prefetch_threads: usize,
    /// Let the kernel check permissions (and POSIX ACLs) like a kernel mount.
    pub default_permissions: bool,
}

/// Everything the request threads and the read-ahead threads share.
pub(crate) struct Shared<S: Source> {
    pub(crate) img: Image<S>,
    pub(crate) cache: Cache,
    root: u64,
    blksz: u32,
    /// Inode numbers follow the kernel's metabox mapping.
    metabox: bool,
    verbose: bool,
}

thread_local! {
    static CTX: RefCell<ReadCtx> = RefCell::new(ReadCtx::new());
    /// Reply buffer of this request thread: it only grows (up to `REPLY_KEEP`), so a
    /// read does not zero a fresh buffer first; every byte of the part replied is
    /// written by `read_into` before it is sent.
    static REPLY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Reply buffers above this are released after the request.
const REPLY_KEEP: usize = 2 << 20;

/// Run `f` with this thread's reader context (a fresh one when it is busy); EIO only
/// if the thread is exiting.
fn with_ctx<T>(f: impl FnOnce(&mut ReadCtx) -> T) -> Result<T, i32> {
    CTX.try_with(|c| match c.try_borrow_mut() {
        Ok(mut g) => f(&mut g),
        Err(_) => f(&mut ReadCtx::new()),
    })
    .map_err(|_| libc_errno::EIO)
}

fn errno_of(e: &Error) -> i32 {
    match e {
        Error::Io { .. } | Error::Corrupt(_) => libc_errno::EIO,
        Error::Unsupported { .. } => libc_errno::EOPNOTSUPP,
        Error::NotFound { .. } => libc_errno::ENOENT,
        Error::NotADirectory { .. } => libc_errno::ENOTDIR,
        Error::WrongType { .. } => libc_errno::EINVAL,
    }
}

/// The errno values used here (Linux).
mod libc_errno {
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const ENXIO: i32 = 6;
    pub const ENOTDIR: i32 = 20;
    pub const EINVAL: i32 = 22;
    pub const EOPNOTSUPP: i32 = 95;
}

impl<S: Source> Shared<S> {
    pub(crate) fn new(img: Image<S>, cache_bytes: usize, verbose: bool) -> Self {
        // The reader keeps decoded extents of the packed and metabox inodes (shared by
        // many files) in its own cache: an eighth of the budget, the rest is ours.
        let reader_share = cache_bytes / 8;
        img.set_cache_budget(reader_share);
        let root = img.root_nid();
        let blksz = img.block_size();
        let img_has_metabox = img
            .superblock()
            .has_incompat(ferofs_format::sb::INCOMPAT_METABOX);
        Shared {
            img,
            cache: Cache::new(cache_bytes - reader_share),
            root,
            blksz,
            metabox: img_has_metabox,
            verbose,
        }
    }

    /// One line of cache counters (for `-v`).
    pub(crate) fn stats_line(&self) -> String {
        let st = &self.cache.stats;
        format!(
            "cache: {} hits, {} loads, {} loads joined another thread's (decoded once), {} of {} bytes held",
            st.hits.load(Ordering::Relaxed),
            st.misses.load(Ordering::Relaxed),
            st.joined.load(Ordering::Relaxed),
            self.cache.used(),
            self.cache.budget(),
        )
    }

    fn fail(&self, what: &str, nid: u64, e: &Error) -> i32 {
        if self.verbose {
            eprintln!("ferofs mount: {what} of nid {nid}: {e}");
        }
        errno_of(e)
    }

    pub(crate) fn inode(&self, nid: u64) -> Result<Arc<Inode>, i32> {
        let v = self.cache.get_or_load(Key::Inode(nid), true, || {
            self.img
                .inode(nid)
                .map(|i| Val::Inode(Arc::new(i)))
                .map_err(|e| self.fail("inode", nid, &e))
        })?;
        match v {
            Val::Inode(i) => Ok(i),
            _ => Err(libc_errno::EIO),
        }
    }

    fn dir(&self, ino: &Inode) -> Result<Arc<Vec<DirEntry>>, i32> {
        if !ino.is_dir() {
            return Err(libc_errno::ENOTDIR);
        }
        let v = self.cache.get_or_load(Key::Dir(ino.nid), true, || {
            self.img
                .read_dir(ino)
                .map(|d| Val::Dir(Arc::new(d)))
                .map_err(|e| self.fail("directory", ino.nid, &e))
        })?;
        match v {
            Val::Dir(d) => Ok(d),
            _ => Err(libc_errno::EIO),
        }
    }

    /// Decoded extent `[start, end)` of `ino`, through the cache (single flight).
    fn extent(&self, ino: &Inode, start: u64, end: u64, keep: bool) -> Result<Arc<Vec<u8>>, i32> {
        let v = self
            .cache
            .get_or_load(Key::Data(ino.nid, start), keep, || {
                let len = usize::try_from(end - start).map_err(|_| libc_errno::EIO)?;
                let mut buf = vec![0u8; len];
                let n = with_ctx(|c| self.img.read_at_with(c, ino, start, &mut buf))?
                    .map_err(|e| self.fail("read", ino.nid, &e))?;
                if n != len {
                    return Err(self.fail(
                        "read",
                        ino.nid,
                        &Error::short_read(ino.nid, start.saturating_add(n as u64), ino.size),
                    ));
                }
                Ok(Val::Data(Arc::new(buf)))
            })?;
        match v {
            Val::Data(d) => Ok(d),
            _ => Err(libc_errno::EIO),
        }
    }

    /// File bytes `[off, off + buf.len())` (the caller clamps to the size).
    fn read_into(&self, ino: &Inode, off: u64, buf: &mut [u8]) -> Result<(), i32> {
        let end = off.saturating_add(buf.len() as u64);
        let mut pos = off;
        // Bounded: every turn advances `pos` by at least one byte (a span holds `pos`).
        while pos < end {
            let span = with_ctx(|c| self.img.data_span(c, ino, pos))?
                .map_err(|e| self.fail("map", ino.nid, &e))?
                .ok_or(libc_errno::EIO)?;
            let s_end = span.end.min(end);
            let (a, b) = (to_idx(pos - off)?, to_idx(s_end - off)?);
            let dst = buf.get_mut(a..b).ok_or(libc_errno::EIO)?;
            match span.kind {
                SpanKind::Hole => dst.fill(0),
                SpanKind::Stored | SpanKind::Fragment => {
                    let n = self
                        .img
                        .read_at(ino, pos, dst)
                        .map_err(|e| self.fail("read", ino.nid, &e))?;
                    if n != dst.len() {
                        return Err(libc_errno::EIO);
                    }
                }
                SpanKind::Encoded { .. } if pos == span.start && span.end <= end => {
                    // Whole extents. One prefetched (or being decoded) is taken from
                    // the cache; otherwise this and the following whole extents nobody
                    // has are decoded straight into the reply, in one reader call (one
                    // read of their stored bytes). The kernel's page locks keep two
                    // buffered reads of the same pages apart, so nothing is decoded twice.
                    let key = Key::Data(ino.nid, span.start);
                    if self.cache.present(key) {
                        let v = match self.cache.take(key) {
                            Some(Val::Data(v)) => v,
                            _ => self.extent(ino, span.start, span.end, false)?,
                        };
                        dst.copy_from_slice(v.get(..dst.len()).ok_or(libc_errno::EIO)?);
                        pos = s_end;
                        continue;
                    }
                    let mut run_end = span.end;
                    // Bounded: each turn moves `run_end` forward by a non-empty span.
                    while run_end < end {
                        let next = with_ctx(|c| self.img.data_span(c, ino, run_end))?
                            .map_err(|e| self.fail("map", ino.nid, &e))?;
                        match next {
                            Some(n)
                                if matches!(n.kind, SpanKind::Encoded { .. })
                                    && n.start == run_end
                                    && n.end <= end
                                    && !self.cache.present(Key::Data(ino.nid, n.start)) =>
                            {
                                run_end = n.end
                            }
                            _ => break,
                        }
                    }
                    let (a, b) = (to_idx(pos - off)?, to_idx(run_end - off)?);
                    let dst = buf.get_mut(a..b).ok_or(libc_errno::EIO)?;
                    let n = with_ctx(|c| self.img.read_at_with(c, ino, pos, dst))?
                        .map_err(|e| self.fail("read", ino.nid, &e))?;
                    if n != dst.len() {
                        return Err(libc_errno::EIO);
                    }
                    pos = run_end;
                    continue;
                }
                SpanKind::Encoded { .. } => {
                    // Part of an extent: decoded whole once (single flight), kept for
                    // the rest of it; a read that ends it (the rest of a sequential
                    // read) takes it out again.
                    let key = Key::Data(ino.nid, span.start);
                    let v = match (pos > span.start && s_end == span.end)
                        .then(|| self.cache.take(key))
                        .flatten()
                    {
                        Some(Val::Data(v)) => v,
                        _ => self.extent(ino, span.start, span.end, true)?,
                    };
                    let from = to_idx(pos - span.start)?;
                    let src = v.get(from..from + dst.len()).ok_or(libc_errno::EIO)?;
                    dst.copy_from_slice(src);
                }
            }
            pos = s_end;
        }
        Ok(())
    }

    /// Read the stored bytes of small file `ino` in one read (into the kernel's page
    /// cache of the image), when they lie together (their span at most twice what is
    /// stored): the first random read of a small file pays one device read for the
    /// whole file instead of one for each later read of another part of it. Best
    /// effort: an error here is met again by the read itself.
    fn warm(&self, ino: &Inode) {
        let Ok(exts) = self.img.extents(ino) else {
            return;
        };
        let (mut lo, mut hi, mut stored) = (u64::MAX, 0u64, 0u64);
        for e in exts.iter().take(WARM_MAX_EXTENTS) {
            if let Some(p) = e.physical {
                lo = lo.min(p);
                hi = hi.max(p.saturating_add(e.stored));
                stored = stored.saturating_add(e.stored);
            }
        }
        let span = hi.saturating_sub(lo);
        if span == 0 || span > WARM_MAX_STORED || span > stored.saturating_mul(2) {
            return;
        }
        let Ok(n) = usize::try_from(span) else { return };
        let mut buf = vec![0u8; n];
        let _ = self.img.source().read_exact_at(&mut buf, lo);
    }

    /// Decode the extents of `[from, to)` into the cache (read-ahead).
    fn prefetch(&self, nid: u64, from: u64, to: u64) {
        let Ok(ino) = self.inode(nid) else { return };
        let mut pos = from;
        for _ in 0..PREFETCH_EXTENTS {
            if pos >= to.min(ino.size) {
                break;
            }
            let Ok(Ok(Some(span))) = with_ctx(|c| self.img.data_span(c, &ino, pos)) else {
                break;
            };
            if let SpanKind::Encoded { .. } = span.kind {
                // Small extents come whole in the kernel's own read-ahead requests,
                // served in parallel: decoding them ahead only races those requests.
                if span.end - span.start < PREFETCH_MIN_EXTENT {
                    break;
                }
                if !self.cache.present(Key::Data(nid, span.start))
                    && self.extent(&ino, span.start, span.end, true).is_err()
                {
                    break;
                }
            }
            pos = span.end;
        }
    }

    /// Decode the extents of the small compressed files at listing positions [from, to)
    /// of directory `dir` into the cache (directory read-ahead), at most
    /// `AHEAD_BYTES` of them.
    fn prefetch_files(&self, dir: u64, from: usize, to: usize) {
        let Ok(d) = self.inode(dir) else { return };
        let Ok(ents) = self.dir(&d) else { return };
        let mut budget = AHEAD_BYTES;
        for e in ents.iter().skip(from).take(to.saturating_sub(from)) {
            if e.file_type != 1 {
                continue;
            }
            let Ok(ino) = self.inode(e.nid) else { continue };
            if !ino.is_regular() || !ino.layout.is_compressed() || ino.size > AHEAD_MAX_FILE {
                continue;
            }
            let mut pos = 0;
            // Bounded: a file of at most AHEAD_MAX_FILE bytes, each turn moves `pos` on.
            while pos < ino.size && budget > 0 {
                let Ok(Ok(Some(span))) = with_ctx(|c| self.img.data_span(c, &ino, pos)) else {
                    break;
                };
                if span.end <= pos {
                    break;
                }
                if let SpanKind::Encoded { .. } = span.kind {
                    let key = Key::Data(e.nid, span.start);
                    if !self.cache.present(key)
                        && self.extent(&ino, span.start, span.end, true).is_err()
                    {
                        break;
                    }
                    budget = budget.saturating_sub(span.end - span.start);
                }
                pos = span.end;
            }
            if budget == 0 {
                break;
            }
        }
    }

    fn attr(&self, ino: &Inode, st_ino: u64) -> FileAttr {
        let t = if ino.mtime >= 0 {
            UNIX_EPOCH + Duration::new(ino.mtime.unsigned_abs(), ino.mtime_nsec.min(999_999_999))
        } else {
            UNIX_EPOCH
                .checked_sub(Duration::new(ino.mtime.unsigned_abs(), 0))
                .and_then(|t| {
                    t.checked_add(Duration::from_nanos(u64::from(
                        ino.mtime_nsec.min(999_999_999),
                    )))
                })
                .unwrap_or(UNIX_EPOCH)
        };
        // As the kernel: compressed files count their stored blocks, others their size
        // rounded up to blocks; in 512-byte units.
        let blocks = if ino.layout.is_compressed() {
            ino.startblk().saturating_mul(u64::from(self.blksz) / 512)
        } else {
            ino.size
                .div_ceil(u64::from(self.blksz))
                .saturating_mul(u64::from(self.blksz) / 512)
        };
        FileAttr {
            ino: INodeNo(st_ino),
            size: ino.size,
            blocks,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: kind_of(ino.mode),
            perm: ino.mode & 0o7777,
            nlink: ino.nlink,
            uid: ino.uid,
            gid: ino.gid,
            rdev: ino.rdev,
            blksize: self.blksz,
            flags: 0,
        }
    }

    fn ino64(&self, nid: u64) -> u64 {
        ino64(self.metabox, nid)
    }

    /// The node id the kernel gets for `nid`, which is also its st_ino: the inode
    /// number, except that the root is FUSE's 1 and inode numbers 0 and 1 of other
    /// inodes (not node ids FUSE allows) move to the top of the range, where no valid
    /// nid maps (a nid is below 2^59: its byte position must fit in 64 bits).
    fn node_of(&self, nid: u64) -> u64 {
        if nid == self.root {
            return ROOT_ID;
        }
        match self.ino64(nid) {
            i @ (0 | 1) => u64::MAX - i,
            i => i,
        }
    }

    fn nid_of(&self, node: u64) -> u64 {
        let ino = match node {
            ROOT_ID => return self.root,
            u64::MAX => 0,
            n if n == u64::MAX - 1 => 1,
            n => n,
        };
        nid_of_ino(self.metabox, ino)
    }

    /// st_ino (and d_ino) of `nid`, the root included.
    fn st_ino(&self, nid: u64) -> u64 {
        if nid == self.root {
            self.ino64(nid)
        } else {
            self.node_of(nid)
        }
    }
}

/// The inode number the kernel reports for `nid`: the nid, except in images with a
/// metabox, where the metabox bit (63) moves to bit 31 and nid bits 31..62 to 32..63.
fn ino64(metabox: bool, nid: u64) -> u64 {
    if !metabox {
        return nid;
    }
    ((nid << 1) & 0xFFFF_FFFF_0000_0000) | (nid & 0x7FFF_FFFF) | ((nid >> 63) << 31)
}

/// The nid of inode number `ino` (the inverse of [`ino64`]).
fn nid_of_ino(metabox: bool, ino: u64) -> u64 {
    if !metabox {
        return ino;
    }
    ((ino >> 1) & 0x7FFF_FFFF_8000_0000) | (ino & 0x7FFF_FFFF) | (((ino >> 31) & 1) << 63)
}

fn to_idx(v: u64) -> Result<usize, i32> {
    usize::try_from(v).map_err(|_| libc_errno::EIO)
}

fn kind_of(mode: u16) -> FileType {
    match mode & S_IFMT {
        S_IFDIR => FileType::Directory,
        S_IFLNK => FileType::Symlink,
        S_IFCHR => FileType::CharDevice,
        S_IFBLK => FileType::BlockDevice,
        S_IFIFO => FileType::NamedPipe,
        S_IFSOCK => FileType::Socket,
        S_IFREG => FileType::RegularFile,
        _ => FileType::RegularFile,
    }
}

/// On-disk dirent file type (EROFS_FT_*) to FUSE's; None for unknown.
fn kind_of_ft(ft: u8) -> Option<FileType> {
    Some(match ft {
        1 => FileType::RegularFile,
        2 => FileType::Directory,
        3 => FileType::CharDevice,
        4 => FileType::BlockDevice,
        5 => FileType::NamedPipe,
        6 => FileType::Socket,
        7 => FileType::Symlink,
        _ => return None,
    })
}

/// Run a request handler; a panic becomes EIO for this request, never a dead daemon.
fn guarded<T>(f: impl FnOnce() -> Result<T, i32>) -> Result<T, Errno> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Errno::from_i32(e)),
        Err(_) => Err(Errno::EIO),
    }
}

/// A read-ahead job.
enum Job {
    /// Extents of file `nid` over bytes [from, to).
    Extents(u64, u64, u64),
    /// The small files at listing positions [from, to) of directory `dir`.
    Files { dir: u64, from: usize, to: usize },
}

/// Directory read-ahead. A reader that reads a small file whole, from its start, in a
/// directory it listed, is likely to read the next files of that listing next (a tree
/// walk, `tar`, `cp -r`): their extents are decoded ahead, on the read-ahead threads,
/// while the reader is busy with this one. Both maps are forgotten once they grow past
/// their bound (read-ahead is only a hint).
#[derive(Default)]
struct DirAhead {
    /// Regular file nid -> (directory nid, its position in the listing).
    pos: Mutex<HashMap<u64, (u64, usize)>>,
    /// Directory nid -> listing position up to which files have been asked for.
    asked: Mutex<HashMap<u64, usize>>,
}

const DIR_AHEAD_FILES_KEPT: usize = 1 << 16;
const DIR_AHEAD_DIRS_KEPT: usize = 1 << 12;

impl DirAhead {
    fn listed(&self, dir: u64, at: usize, file: u64) {
        if let Ok(mut g) = self.pos.lock() {
            if g.len() >= DIR_AHEAD_FILES_KEPT {
                g.clear();
            }
            g.insert(file, (dir, at));
        }
    }

    /// `file` was read whole from its start: the job to queue, if any.
    fn read_whole(&self, file: u64) -> Option<Job> {
        let (dir, at) = *self.pos.lock().ok()?.get(&file)?;
        let mut g = self.asked.lock().ok()?;
        if g.len() >= DIR_AHEAD_DIRS_KEPT {
            g.clear();
        }
        let asked = g.entry(dir).or_insert(0);
        let from = (at + 1).max(*asked);
        // Ask again only when the reader is halfway into what was asked for.
        if from > at + 1 + AHEAD_FILES / 2 {
            return None;
        }
        let to = at + 1 + AHEAD_FILES;
        *asked = to;
        Some(Job::Files { dir, from, to })
    }
}

/// Per file (node id): where the last read ended, for sequential-read detection. Opens
/// are zero-message (see `open`), so there is no handle and no release to key on: each
/// shard forgets everything once it holds `STREAMS_PER_SHARD` files, which bounds it.
#[derive(Default)]
struct Streams {
    shards: [Mutex<HashMap<u64, u64>>; 16],
    /// Files whose stored bytes were read whole at their first random read.
    warmed: [Mutex<HashSet<u64>>; 16],
}

const WARMED_PER_SHARD: usize = 4096;

const STREAMS_PER_SHARD: usize = 256;

impl Streams {
    /// True the first time `node` is read at random (bounded as `sequential`).
    fn first_random(&self, node: u64) -> bool {
        let Some(Ok(mut g)) = self.warmed.get((node % 16) as usize).map(|m| m.lock()) else {
            return false;
        };
        if g.len() >= WARMED_PER_SHARD {
            g.clear();
        }
        g.insert(node)
    }

    /// Record a read of [off, end) of `node`; true when it continued the previous one
    /// (or starts the file).
    fn sequential(&self, node: u64, off: u64, end: u64) -> bool {
        let Some(Ok(mut g)) = self.shards.get((node % 16) as usize).map(|m| m.lock()) else {
            return false;
        };
        if g.len() >= STREAMS_PER_SHARD && !g.contains_key(&node) {
            g.clear();
        }
        let last = g.insert(node, end);
        off == 0 || last == Some(off)
    }
}

/// The FUSE filesystem over one image.
pub struct ErofsFs<S: Source + 'static> {
    shared: Arc<Shared<S>>,
    record: Option<Arc<Recorder>>,
    prefetch: Option<SyncSender<Job>>,
    dir_ahead: DirAhead,
    streams: Streams,
    default_permissions: bool,
}

impl<S: Source + 'static> ErofsFs<S> {
    pub(crate) fn new(
        shared: Arc<Shared<S>>,
        record: Option<Arc<Recorder>>,
        o: &FsOptions,
    ) -> std::io::Result<Self> {
        let prefetch = if o.prefetch_threads > 0 {
            let (tx, rx) = sync_channel::<Job>(PREFETCH_QUEUE);
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..o.prefetch_threads {
                let (sh, rx) = (shared.clone(), rx.clone());
                std::thread::Builder::new()
                    .name(format!("ferofs-ra-{i}"))
                    .spawn(move || prefetch_loop(&sh, &rx))?;
            }
            Some(tx)
        } else {
            None
        };
        Ok(ErofsFs {
            shared,
            record,
            prefetch,
            streams: Streams::default(),
            dir_ahead: DirAhead::default(),
            default_permissions: o.default_permissions,
        })
    }

    fn node_attr(&self, nid: u64) -> Result<(Arc<Inode>, FileAttr), i32> {
        let ino = self.shared.inode(nid)?;
        let a = self.shared.attr(&ino, self.shared.st_ino(nid));
        Ok((ino, a))
    }

    /// Walk the listing of directory `ino` from `offset` (with "." first when the image
    /// omits it): `add(dir nid, next offset, name, entry nid, file type)` returns true
    /// when the reply buffer is full, which ends the walk.
    fn walk_dir(
        &self,
        ino: INodeNo,
        offset: u64,
        mut add: impl FnMut(u64, u64, &[u8], u64, u8) -> Result<bool, i32>,
    ) -> Result<(), i32> {
        let sh = &self.shared;
        let nid = sh.nid_of(ino.0);
        let dir = sh.inode(nid)?;
        let ents = sh.dir(&dir)?;
        let dot = usize::from(dir.dot_omitted);
        let total = ents.len() + dot;
        let mut i = to_idx(offset)?;
        // Bounded by the listing; stops when the reply buffer is full.
        while i < total {
            let (name, enid, ft): (&[u8], u64, u8) = if dot == 1 && i == 0 {
                (b".", nid, 2)
            } else {
                let e = ents.get(i - dot).ok_or(libc_errno::EIO)?;
                if e.file_type == 1 {
                    self.dir_ahead.listed(nid, i - dot, e.nid);
                }
                (&e.name, e.nid, e.file_type)
            };
            if add(nid, (i + 1) as u64, name, enid, ft)? {
                break;
            }
            i += 1;
        }
        Ok(())
    }

    /// Attributes for an entry reply: `ino` doubles as the node id.
    fn entry_attr(&self, nid: u64) -> Result<FileAttr, i32> {
        let ino = self.shared.inode(nid)?;
        Ok(self.shared.attr(&ino, self.shared.node_of(nid)))
    }

    /// Read into `buf` (grown as needed); returns how many bytes of it are the reply.
    fn do_read(&self, node: u64, off: u64, size: u32, buf: &mut Vec<u8>) -> Result<usize, i32> {
        let sh = &self.shared;
        let nid = sh.nid_of(node);
        let ino = sh.inode(nid)?;
        if ino.is_dir() {
            return Err(21); // EISDIR
        }
        if off >= ino.size {
            return Ok(0);
        }
        let n = u64::from(size.min(MAX_READ)).min(ino.size - off);
        let len = to_idx(n)?;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let buf = buf.get_mut(..len).ok_or(libc_errno::EIO)?;
        if let Some(r) = &self.record {
            if ino.is_regular() {
                r.read(nid);
            }
        }
        let end = off + n;
        let sequential = self.streams.sequential(node, off, end);
        if sequential {
            sh.read_into(&ino, off, buf)?;
        } else {
            source::random_reads(|| {
                if ino.size <= WARM_MAX_FILE && self.streams.first_random(node) {
                    sh.warm(&ino);
                }
                sh.read_into(&ino, off, buf)
            })?;
        }
        if off == 0 && end == ino.size && ino.is_regular() {
            if let (Some(tx), Some(job)) = (&self.prefetch, self.dir_ahead.read_whole(nid)) {
                let _ = tx.try_send(job);
            }
        }
        if ino.layout.is_compressed() && end < ino.size && sequential {
            if let Some(tx) = &self.prefetch {
                // Only big extents are worth a read-ahead thread (see `Shared::prefetch`);
                // asking here saves waking one for every small file.
                let next = with_ctx(|c| sh.img.data_span(c, &ino, end));
                if let Ok(Ok(Some(s))) = next {
                    if matches!(s.kind, SpanKind::Encoded { .. })
                        && s.end - s.start >= PREFETCH_MIN_EXTENT
                        && !sh.cache.present(Key::Data(nid, s.start))
                    {
                        let _ = tx.try_send(Job::Extents(
                            nid,
                            end,
                            end.saturating_add(PREFETCH_BYTES.max(n)),
                        ));
                    }
                }
            }
        }
        Ok(len)
    }
}

fn prefetch_loop<S: Source>(sh: &Shared<S>, rx: &Mutex<Receiver<Job>>) {
    // Ends when the filesystem (the sender) is dropped.
    loop {
        let job = match rx.lock() {
            Ok(g) => g.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        let _ = catch_unwind(AssertUnwindSafe(|| match job {
            Job::Extents(nid, from, to) => sh.prefetch(nid, from, to),
            Job::Files { dir, from, to } => sh.prefetch_files(dir, from, to),
        }));
    }
}

impl<S: Source + 'static> Filesystem for ErofsFs<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let mut want = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_MAX_PAGES;
        if self.default_permissions {
            want |= InitFlags::FUSE_POSIX_ACL;
        }
        let _ = config.add_capabilities(want & config.capabilities());
        let _ = config.set_max_background(64);
        let _ = config
            .set_max_readahead(u32::MAX)
            .or_else(|max| config.set_max_readahead(max));
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = guarded(|| {
            let sh = &self.shared;
            let pnid = sh.nid_of(parent.0);
            let dir = sh.inode(pnid)?;
            let name = name.as_bytes();
            let nid = if name == b"." && dir.dot_omitted {
                pnid
            } else {
                let ents = sh.dir(&dir)?;
                let i = ents
                    .binary_search_by(|e| e.name.as_slice().cmp(name))
                    .map_err(|_| libc_errno::ENOENT)?;
                ents.get(i).ok_or(libc_errno::EIO)?.nid
            };
            if let Some(r) = &self.record {
                r.link(pnid, name, nid);
            }
            self.entry_attr(nid)
        });
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            // A negative entry the kernel may cache as long as the others.
            Err(e) if e == Errno::ENOENT => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match guarded(|| self.node_attr(self.shared.nid_of(ino.0))) {
            Ok((_, a)) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = guarded(|| {
            let sh = &self.shared;
            let nid = sh.nid_of(ino.0);
            let i = sh.inode(nid)?;
            sh.img
                .read_link(&i)
                .map_err(|e| sh.fail("readlink", nid, &e))
        });
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    /// Zero-message opens: ENOSYS tells the kernel (FUSE_NO_OPEN_SUPPORT, Linux 4.20+) to
    /// stop sending OPEN and RELEASE, and to open every file with FOPEN_KEEP_CACHE, which
    /// is what this read-only image wants anyway. That saves two round trips per open.
    /// Writes never get here: the mount is read-only (MS_RDONLY), so the kernel refuses
    /// them with EROFS first.
    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.error(Errno::ENOSYS)
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Fails only when the thread is exiting: the reply is then dropped, which
        // answers EIO.
        let _ = REPLY.try_with(|cell| {
            let mut fresh = Vec::new();
            let mut held = cell.try_borrow_mut();
            let buf = match held.as_mut() {
                Ok(b) => &mut **b,
                Err(_) => &mut fresh,
            };
            match guarded(|| self.do_read(ino.0, offset, size, buf)) {
                Ok(n) => match buf.get(..n) {
                    Some(b) => reply.data(b),
                    None => reply.error(Errno::EIO),
                },
                Err(e) => reply.error(e),
            }
            if buf.capacity() > REPLY_KEEP {
                *buf = Vec::new();
            }
        });
    }

    /// SEEK_DATA and SEEK_HOLE by the file's map (the kernel answers the other
    /// whences itself): `cp`, `tar --sparse` and `qemu-img` skip holes instead of
    /// reading their zeros.
    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        const SEEK_DATA: i32 = 3;
        const SEEK_HOLE: i32 = 4;
        let r = guarded(|| {
            let sh = &self.shared;
            let nid = sh.nid_of(ino.0);
            let i = sh.inode(nid)?;
            // As the kernel (iomap): a negative offset, or one at or past the end, is ENXIO.
            let off = u64::try_from(offset).map_err(|_| libc_errno::ENXIO)?;
            if !i.is_regular() || !matches!(whence, SEEK_DATA | SEEK_HOLE) {
                return Err(libc_errno::EINVAL);
            }
            if off >= i.size {
                return Err(libc_errno::ENXIO);
            }
            let at = with_ctx(|c| {
                if whence == SEEK_DATA {
                    sh.img.seek_data(c, &i, off)
                } else {
                    sh.img.seek_hole(c, &i, off).map(Some)
                }
            })?
            .map_err(|e| sh.fail("lseek", nid, &e))?
            .ok_or(libc_errno::ENXIO)?;
            i64::try_from(at).map_err(|_| libc_errno::EINVAL)
        });
        match r {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        // ENOSYS: the kernel stops sending FLUSH on every close (nothing to flush).
        reply.error(Errno::ENOSYS);
    }

    /// Zero-message opendir, as `open`: the kernel then opens directories with
    /// FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR (its listing cache) and sends no RELEASEDIR.
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS)
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = guarded(|| {
            let sh = &self.shared;
            self.walk_dir(ino, offset, |_, next, name, enid, ft| {
                let kind = match kind_of_ft(ft) {
                    Some(k) => k,
                    None => kind_of(sh.inode(enid)?.mode),
                };
                Ok(reply.add(
                    INodeNo(sh.st_ino(enid)),
                    next,
                    kind,
                    OsStr::from_bytes(name),
                ))
            })
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = guarded(|| {
            let sh = &self.shared;
            self.walk_dir(ino, offset, |nid, next, name, enid, _| {
                let special = name == b"." || name == b"..";
                let a = if special {
                    // The kernel does not link "." and "..": their ino is only d_ino.
                    let ino = sh.inode(enid)?;
                    sh.attr(&ino, sh.st_ino(enid))
                } else {
                    if let Some(r) = &self.record {
                        r.link(nid, name, enid);
                    }
                    self.entry_attr(enid)?
                };
                Ok(reply.add(
                    a.ino,
                    next,
                    OsStr::from_bytes(name),
                    &TTL,
                    &a,
                    Generation(0),
                ))
            })
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let info = self.shared.img.info();
        let bs = info.block_size;
        // As the kernel (6.x): no free blocks; f_files all ones, f_ffree what the
        // superblock's inode count leaves of it.
        reply.statfs(
            info.blocks,
            0,
            0,
            u64::MAX,
            u64::MAX - info.inodes,
            bs,
            255,
            bs,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = guarded(|| {
            let sh = &self.shared;
            let nid = sh.nid_of(ino.0);
            let i = sh.inode(nid)?;
            sh.img
                .get_xattr(&i, name.as_bytes())
                .map_err(|e| sh.fail("getxattr", nid, &e))?
                .ok_or(61) // ENODATA
        });
        match r {
            Ok(v) => xattr_reply(reply, size, &v),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let r = guarded(|| {
            let sh = &self.shared;
            let nid = sh.nid_of(ino.0);
            let i = sh.inode(nid)?;
            let xs = sh
                .img
                .xattrs(&i)
                .map_err(|e| sh.fail("listxattr", nid, &e))?;
            let mut out = Vec::new();
            for x in xs {
                // As the kernel: trusted.* is listed only for the privileged.
                if x.name.starts_with(b"trusted.") && req.uid() != 0 {
                    continue;
                }
                out.extend_from_slice(&x.name);
                out.push(0);
            }
            Ok(out)
        });
        match r {
            Ok(v) => xattr_reply(reply, size, &v),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if mask.contains(AccessFlags::W_OK) {
            return reply.error(Errno::EROFS);
        }
        match guarded(|| self.shared.inode(self.shared.nid_of(ino.0))) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    // Every change is refused: the image is read-only.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _r: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _t: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(&self, _req: &Request, _i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _wf: fuser::WriteFlags,
        _flags: OpenFlags,
        _lo: Option<LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _n: &OsStr,
        _v: &[u8],
        _f: i32,
        _p: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _d: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }
}

/// The attributes of a negative entry (node id 0).
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, v: &[u8]) {
    let Ok(len) = u32::try_from(v.len()) else {
        return reply.error(Errno::ERANGE);
    };
    if size == 0 {
        reply.size(len)
    } else if len > size {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(j: Option<Job>) -> Option<(u64, usize, usize)> {
        match j {
            Some(Job::Files { dir, from, to }) => Some((dir, from, to)),
            _ => None,
        }
    }

    #[test]
    fn directory_read_ahead_asks_ahead_of_the_reader_once() {
        let d = DirAhead::default();
        for i in 0..40 {
            d.listed(7, i, 100 + i as u64);
        }
        // Unlisted file: nothing.
        assert!(files(d.read_whole(99)).is_none());
        // First file read: the next AHEAD_FILES.
        assert_eq!(files(d.read_whole(100)), Some((7, 1, 1 + AHEAD_FILES)));
        // Still well inside what was asked for: nothing new.
        assert!(files(d.read_whole(101)).is_none());
        assert!(files(d.read_whole(103)).is_none());
        // Halfway: the next window, from where the last one ended.
        let at = AHEAD_FILES / 2;
        assert_eq!(
            files(d.read_whole(100 + at as u64)),
            Some((7, 1 + AHEAD_FILES, at + 1 + AHEAD_FILES))
        );
        // A reader jumping back to the start asks for nothing already asked for.
        assert!(files(d.read_whole(100)).is_none());
    }

    #[test]
    fn sequential_detection_is_per_node_and_bounded() {
        let s = Streams::default();
        assert!(s.sequential(3, 0, 4096));
        assert!(s.sequential(3, 4096, 8192));
        assert!(!s.sequential(3, 65536, 69632));
        assert!(!s.sequential(4, 4096, 8192));
        for n in 0..10_000u64 {
            s.sequential(n * 16, 0, 1);
        }
        assert!(s.first_random(5));
        assert!(!s.first_random(5));
        for n in 0..100_000u64 {
            s.first_random(n * 16);
        }
        let warmed: usize = s
            .warmed
            .iter()
            .map(|m| m.lock().map_or(0, |g| g.len()))
            .sum();
        assert!(warmed <= 16 * WARMED_PER_SHARD, "{warmed}");
        let held: usize = s
            .shards
            .iter()
            .map(|m| m.lock().map_or(0, |g| g.len()))
            .sum();
        assert!(held <= 16 * STREAMS_PER_SHARD, "{held}");
    }

    #[test]
    fn inode_numbers_round_trip() {
        // A metabox nid as the kernel shows it (seen on a mkfs.erofs -m image).
        assert_eq!(ino64(true, (1 << 63) | 0x80), 0x8000_0080);
        for nid in [
            0u64,
            1,
            36,
            0x7FFF_FFFF,
            0x8000_0000,
            0x0123_4567_89AB,
            (1 << 58) + 5,
        ] {
            for mb in [false, true] {
                let n = if mb { nid | (1 << 63) } else { nid };
                assert_eq!(nid_of_ino(true, ino64(true, n)), n, "{n:#x}");
                assert_eq!(nid_of_ino(false, ino64(false, nid)), nid);
            }
            // Plain nids below 2^31 keep their number in metabox images too.
            if nid < 1 << 31 {
                assert_eq!(ino64(true, nid), nid);
            }
        }
    }
}
