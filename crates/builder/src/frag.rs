//! Fragments (for stage 3, `place`): file tails and whole small files collected for the
//! packed inode (`-E fragments`, `-E all-fragments`, format doc §8.9).
//!
//! The data stage hands over each fragment in inode order; its bytes stay out of memory
//! (bounded whatever the tree holds) at a *place* of the [`Spool`]. A fragment of a file
//! of a scanned directory is not copied: its places are the file's own bytes, read
//! again where they are when the packed inode is compressed ([`Spool::refer`]; the
//! file must then still be as the scan saw it). Other fragments (tar and SquashFS
//! input, pieces the committer cuts) are copied to a spool file beside the output, by
//! the compression workers, each at a place reserved as soon as it has read it
//! ([`Spool::put`]). So the committing thread, which hands fragments over in order,
//! only records where their bytes are: the packed inode's data is the list of those
//! places ([`Packed::source`]). On the linux tree at lz4 this saves copying 1.2 GB to
//! tmpfs and reading it back: reopening 78,000 files costs about half of that. With dedupe, a fragment equal byte
//! for byte to an earlier one (found by a 128-bit hash, then compared) becomes a
//! reference to it (its spool bytes are left unused); so does one equal to the end of
//! an earlier, longer one (found by a hash of its last 64 bytes, then compared), when
//! that end lies further back than the packed inode's codec could find it itself.
//!
//! Fragments come in the order files are stored: inode order, which keeps the files of
//! one directory together, then its subdirectories' (format doc §10), so similar
//! content sits side by side and a directory's small files share pclusters. Measured
//! on linux/fs (2,078 files, 128 KiB pclusters), it packs better than grouping by file
//! type first (+0.4 % with zstd and lz4hc), by path (+0.2 %) or by directory then type
//! (+0.3 %). The exception is small files under a name many share (`copyright`,
//! `__init__.py`, `Makefile`): they come last, grouped by name
//! (`place::group_common_names`). Files alike in content are brought together too:
//! each whole-file fragment the workers read gets a sketch of its line starts, and
//! when all are in, [`FragStore::finish`] moves each cluster of alike fragments to
//! where its first member is ([`crate::similar`]); fragment ids follow their bytes.
//! The order is fixed by the tree alone, so the image does not depend on the thread
//! count (only where the spool holds each fragment does).

use crate::options::*;
use crate::similar::Sketch;
use crate::source::{Segment, Source};
use rustc_hash::FxHashMap as HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3;

/// The fragments' spool: a file written from any thread (each write goes to a place of
/// its own, reserved when it is made), and beyond [`IN_PLACE`] the scanned source
/// files whose fragment bytes are read again from where they are instead of copied
/// ([`Spool::refer`]). Places are only ever read back through [`Spool::read_at`].
#[derive(Debug)]
pub struct Spool {
    file: File,
    path: PathBuf,
    next: AtomicU64,
    /// Source files referred to, by their place (sorted: places grow under the lock).
    refs: std::sync::Mutex<Refs>,
}

/// Places from here on are bytes of a source file, read where they are.
pub const IN_PLACE: u64 = 1 << 62;

/// The source files a spool refers to.
#[derive(Debug, Default)]
struct Refs {
    /// The next free place (past [`IN_PLACE`]).
    next: u64,
    files: Vec<InPlace>,
    /// Open handles kept, and how many may be.
    kept: usize,
    keep_max: usize,
}

/// A source file whose bytes are places `[base, base + size)` of the spool.
#[derive(Debug)]
struct InPlace {
    base: u64,
    size: u64,
    src: Arc<Held>,
}

/// A source file referred to: its path and stamp as scanned (read again, it must still
/// be as the scan saw it), and the handle its first read opened, while the process may
/// keep that many open (else it is opened again by path).
#[derive(Debug)]
struct Held {
    path: PathBuf,
    stamp: crate::source::Stamp,
    file: Option<File>,
}

/// An open handle of a scanned file that the spool agreed to keep for its second read
/// ([`Spool::hold`]), counted against the limit from the moment it is held: a worker
/// holds one for each small file of its batch until the batch reaches the spool, and
/// a batch of a MiB of tiny files holds hundreds.
#[derive(Debug)]
pub struct Kept(File);

/// Open files the spool keeps at most: what the limit on open files leaves after a
/// reserve for everything else (workers' files, the output, other spools), and no more
/// than [`KEEP_MOST`].
fn keep_max() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let left = soft.saturating_sub(KEEP_RESERVE).saturating_sub(soft / 8);
    usize::try_from(left).unwrap_or(usize::MAX).min(KEEP_MOST)
}
/// Open files left to the rest of the process.
const KEEP_RESERVE: u64 = 256;
/// Most open files kept: each holds a `struct file` in the kernel (about 256 bytes) and
/// a slot of the table of open files, so 2^18 of them take about 70 MiB of kernel memory
/// at most (the linux source tree has 78,000 small files, a desktop rootfs 10,000-50,000).
const KEEP_MOST: usize = 1 << 18;

/// Most buffers one `pwritev` takes.
const IOV_MAX: usize = 1024;

impl Spool {
    fn new(file: File, path: PathBuf) -> Spool {
        Spool {
            file,
            path,
            next: AtomicU64::new(0),
            refs: std::sync::Mutex::new(Refs {
                next: IN_PLACE,
                files: Vec::new(),
                kept: 0,
                keep_max: keep_max(),
            }),
        }
    }

    /// Keep `file` open for a second read, if the limit on open files leaves room
    /// (else it is closed here, and the path is opened again for that read).
    pub fn hold(&self, file: File) -> Option<Kept> {
        let mut r = self.refs.lock().unwrap_or_else(|e| e.into_inner());
        (r.kept < r.keep_max).then(|| {
            r.kept += 1;
            Kept(file)
        })
    }

    /// Give a scanned file of `size` bytes (at `path`, with `stamp` as scanned) places
    /// of the spool, so that its fragment bytes need not be copied: byte `k` of the
    /// file is then place `base + k`. `file` is the handle that read it, if the spool
    /// agreed to keep it ([`Spool::hold`]); else the second read opens the path again.
    /// Returns `base`.
    pub fn refer(
        &self,
        path: &Path,
        size: u64,
        stamp: crate::source::Stamp,
        file: Option<Kept>,
    ) -> u64 {
        let mut r = self.refs.lock().unwrap_or_else(|e| e.into_inner());
        let base = r.next;
        // Places past u64 (2^62 bytes of files) are out of reach of any tree.
        r.next = r.next.saturating_add(size.max(1));
        let file = file.map(|k| k.0);
        r.files.push(InPlace {
            base,
            size,
            src: Arc::new(Held {
                path: path.to_path_buf(),
                stamp,
                file,
            }),
        });
        base
    }

    /// About `n` files will be referred to: make room for that many open files now,
    /// while few threads run. The kernel grows a process's table of open files by
    /// doubling it, and with other threads alive each growth waits for an RCU grace
    /// period (milliseconds): a dozen of them in the middle of a build cost more than
    /// the handles kept save on a tree of 15,000 files.
    pub fn expect(&self, n: usize) {
        let keep = {
            let r = self.refs.lock().unwrap_or_else(|e| e.into_inner());
            n.min(r.keep_max.saturating_sub(r.kept))
        };
        if keep == 0 {
            return;
        }
        // The lowest free descriptor from there on: the table grows once to hold it.
        let at = i32::try_from(keep.saturating_add(KEEP_RESERVE as usize)).unwrap_or(i32::MAX);
        // Nothing lost if refused: the table grows as files are kept instead.
        drop(rustix::io::fcntl_dupfd_cloexec(&self.file, at));
    }

    #[cfg(test)]
    fn set_keep_max(&self, n: usize) {
        self.refs.lock().unwrap_or_else(|e| e.into_inner()).keep_max = n;
    }

    /// The spool file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Call `each` on the parts of places `[at, at + len)`, in order: (None, place in
    /// the spool file, length) below [`IN_PLACE`], else (the file referred to, its
    /// offset there, length).
    fn parts(
        &self,
        at: u64,
        len: u64,
        mut each: impl FnMut(Option<&Held>, u64, u64) -> Result<()>,
    ) -> Result<()> {
        if at < IN_PLACE {
            return each(None, at, len);
        }
        let mut done = 0u64;
        // Bounded: each pass covers at least one byte of one file, or fails.
        while done < len {
            let pos = at.saturating_add(done);
            let (held, off, n) = {
                let r = self.refs.lock().unwrap_or_else(|e| e.into_inner());
                let k = r.files.partition_point(|f| f.base <= pos);
                let f = k
                    .checked_sub(1)
                    .map(|k| &r.files[k])
                    .filter(|f| pos - f.base < f.size)
                    .ok_or_else(|| {
                        BuildError::Options(format!(
                            "internal: spool place {pos} refers to no file"
                        ))
                    })?;
                let off = pos - f.base;
                (f.src.clone(), off, (f.size - off).min(len - done))
            };
            each(Some(&held), off, n)?;
            done += n;
        }
        Ok(())
    }

    /// Fill `buf` with the bytes at place `at` of the spool (of the spool file below
    /// [`IN_PLACE`], of the source files referred to beyond it).
    pub fn read_at(&self, buf: &mut [u8], at: u64) -> Result<()> {
        let mut done = 0usize;
        self.parts(at, buf.len() as u64, |file, off, n| {
            let dst = &mut buf[done..done + n as usize];
            done += n as usize;
            match file {
                None => self
                    .file
                    .read_exact_at(dst, off)
                    .map_err(io_err(&self.path, "fragments: read spool")),
                Some(held) => read_again(held, off, n, |f| f.read_exact_at(dst, off)),
            }
        })
    }

    /// Append the `len` bytes at place `at` of the spool to `data` (into fresh
    /// capacity, without zeroing it first). `own` is the caller's own handle of the
    /// spool file (reads here seek it, so no other thread may share it).
    pub fn read_into(&self, at: u64, len: u64, data: &mut Vec<u8>, own: &File) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let append = |mut f: &File, off: u64, n: u64, data: &mut Vec<u8>| {
            f.seek(SeekFrom::Start(off))?;
            let got = f.take(n).read_to_end(data)?;
            if got as u64 != n {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            Ok(())
        };
        self.parts(at, len, |file, off, n| match file {
            None => append(own, off, n, data).map_err(io_err(&self.path, "fragments: read spool")),
            // A kept handle may be read by two threads at once: positional reads only.
            Some(held) if held.file.is_some() => read_again(held, off, n, |f| {
                let before = data.len();
                data.resize(before + n as usize, 0);
                f.read_exact_at(&mut data[before..], off)
            }),
            Some(held) => read_again(held, off, n, |f| append(f, off, n, data)),
        })
    }

    /// Write `bytes` at a fresh place of the spool; returns where.
    pub fn put(&self, bytes: &[u8]) -> Result<u64> {
        self.put_all(&[bytes])
    }

    /// Write `parts` one behind the other at a fresh place of the spool (few system
    /// calls for many small fragments); returns where the first starts.
    pub fn put_all(&self, parts: &[&[u8]]) -> Result<u64> {
        use std::io::IoSlice;
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let at = self.next.fetch_add(total, Ordering::Relaxed);
        let err = |e: std::io::Error| io_err(&self.path, "fragments: write spool")(e);
        // The next part to write and how much of it is written.
        let (mut i, mut done_in, mut pos) = (0usize, 0usize, at);
        // Bounded: each pass writes at least one byte or fails.
        while i < parts.len() {
            if done_in == parts[i].len() {
                i += 1;
                done_in = 0;
                continue;
            }
            let mut iov = Vec::with_capacity((parts.len() - i).min(IOV_MAX));
            iov.push(IoSlice::new(&parts[i][done_in..]));
            iov.extend(
                parts[i + 1..]
                    .iter()
                    .take(IOV_MAX - 1)
                    .map(|p| IoSlice::new(p)),
            );
            let n = rustix::io::pwritev(&self.file, &iov, pos).map_err(|e| err(e.into()))?;
            if n == 0 {
                return Err(err(std::io::ErrorKind::WriteZero.into()));
            }
            pos += n as u64;
            // Advance over the parts written.
            let mut left = n;
            while left > 0 && i < parts.len() {
                let room = parts[i].len() - done_in;
                if left < room {
                    done_in += left;
                    left = 0;
                } else {
                    left -= room;
                    i += 1;
                    done_in = 0;
                }
            }
        }
        Ok(at)
    }
}

struct Entry {
    /// Where the fragment starts in the packed inode's data.
    off: u64,
    len: u64,
    /// Its xxh3-128 when the caller handed it in (workers hash what they read).
    hash: Option<u128>,
}

/// With dedupe: what is known of the fragments stored so far.
#[derive(Default)]
struct Seen {
    /// Length -> the entries of that length not hashed yet. Most lengths occur once,
    /// so a fragment is hashed only when another one has its length (then both are).
    unhashed: HashMap<u64, Vec<usize>>,
    /// (xxh3-128, length) -> hashed entries.
    hashed: HashMap<(u128, u64), Vec<usize>>,
    /// xxh3-64 of the last [`SUFFIX_KEY`] bytes -> the entries (at least that long)
    /// ending with them, the newest last (at most [`SUFFIX_CANDIDATES`] a key).
    ends: HashMap<u64, Vec<usize>>,
}

/// How a fragment that is not a duplicate is recorded once it is stored: by its length
/// alone or by its hash and length (whole-fragment dedupe), and by the key of its end
/// when it takes part in the search by end (read once, for the search and the record).
struct Record {
    hash: Option<u128>,
    end: Option<u64>,
}

/// Bytes at the end of a fragment that key the search for an earlier fragment it is
/// the end of (mkfs.erofs keys the same search by its last 64 bytes).
pub const SUFFIX_KEY: u64 = 64;
/// Earlier fragments compared a key, the newest first: a bound on the work per
/// fragment when many end alike.
const SUFFIX_CANDIDATES: usize = 8;

/// Collects fragments.
pub struct FragStore {
    /// Keeps the spool file (removed when dropped).
    tmp: tempfile::NamedTempFile,
    spool: Arc<Spool>,
    /// Bytes of the packed inode's data so far.
    len: u64,
    /// Where they are in the spool, in order, covering `[0, len)`.
    segs: Vec<Segment>,
    entries: Vec<Entry>,
    /// Per handed-out fragment id: its offset in the packed inode's data (with dedupe
    /// several ids point into one entry: at its start, or at the start of its end).
    ids: Vec<u64>,
    /// Where the fragment being written starts.
    open: Option<u64>,
    seen: Option<Seen>,
    /// Fragment bytes handed in (duplicates counted each time).
    pub bytes_in: u64,
    /// Bytes not stored again thanks to dedupe.
    pub deduped: u64,
    /// Of those, bytes of fragments found as the end of a longer one.
    pub suffix_deduped: u64,
    /// The end of a longer fragment is used only from further back than this (bytes
    /// of packed data): how far back the packed inode's codec finds matches.
    suffix_reach: u64,
    /// Content sketches of stored entries (entry index, sketch), in entry order: alike
    /// ones are put side by side when the store is finished ([`crate::similar`]).
    sketches: Vec<(u32, Sketch)>,
}

/// The packed inode's data, laid out.
pub struct Packed {
    /// The spool (removed when dropped).
    pub file: tempfile::NamedTempFile,
    pub size: u64,
    /// Per fragment id: its offset in the packed inode's data.
    pub offsets: Vec<u64>,
    /// Where the data is in the spool.
    segs: Arc<[Segment]>,
    spool: Arc<Spool>,
}

impl Packed {
    /// Append `bytes` behind the fragments, 4-byte aligned (zeros between); returns
    /// where they start in the packed inode's data (the long xattr prefix table).
    pub fn append_aligned(&mut self, bytes: &[u8]) -> Result<u64> {
        let at = self.size.div_ceil(4) * 4;
        let mut buf = vec![0u8; (at - self.size) as usize];
        buf.extend_from_slice(bytes);
        let place = self.spool.put(&buf)?;
        let mut segs = self.segs.to_vec();
        segs.push(Segment {
            start: self.size,
            len: buf.len() as u64,
            at: place,
        });
        self.segs = segs.into();
        self.size += buf.len() as u64;
        Ok(at)
    }

    /// The packed inode's data as a source.
    pub fn source(&self) -> Source {
        Source::Spooled {
            spool: self.spool.clone(),
            segs: self.segs.clone(),
        }
    }
}

/// A value dropped on another thread (e.g. the spool, whose removal frees its page
/// cache), joined when this guard is dropped.
pub struct DropBeside(Option<std::thread::JoinHandle<()>>);

impl DropBeside {
    pub fn new<T: Send + 'static>(v: Option<T>) -> Self {
        // Without a thread (none to be had), the value is dropped right here.
        DropBeside(v.and_then(|v| {
            std::thread::Builder::new()
                .name("ferofs-drop".into())
                .spawn(move || drop(v))
                .ok()
        }))
    }
}

impl Drop for DropBeside {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            // A drop that panicked has nothing left to clean up here.
            let _ = h.join();
        }
    }
}

/// The key of a fragment's end (its last [`SUFFIX_KEY`] bytes) in the search by end.
pub fn end_key_of(end: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(end)
}

/// The hash fragment dedupe keys fragments by (with their length).
pub fn frag_hash(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytes)
}

/// Most bytes compared or hashed at once.
const CMP_CHUNK: u64 = 1 << 20;

impl FragStore {
    /// Collect into `spool` (an empty scratch file). With `dedupe`, a fragment equal to
    /// an earlier one, or to the end of an earlier one further back than
    /// `suffix_reach`, is not stored again.
    pub fn new(spool: tempfile::NamedTempFile, dedupe: bool, suffix_reach: u64) -> Result<Self> {
        let path = spool.path().to_path_buf();
        let file = spool
            .reopen()
            .map_err(io_err(&path, "fragments: open spool"))?;
        Ok(FragStore {
            tmp: spool,
            spool: Arc::new(Spool::new(file, path)),
            len: 0,
            segs: Vec::new(),
            entries: Vec::new(),
            ids: Vec::new(),
            open: None,
            seen: dedupe.then(Seen::default),
            bytes_in: 0,
            deduped: 0,
            suffix_deduped: 0,
            suffix_reach,
            sketches: Vec::new(),
        })
    }

    /// The spool, for workers to write fragments to ([`FragStore::push_spooled`]).
    pub fn spool(&self) -> Arc<Spool> {
        self.spool.clone()
    }

    /// Start a fragment.
    pub fn begin(&mut self) {
        self.open = Some(self.len);
    }

    /// Append bytes to the open fragment.
    pub fn push(&mut self, bytes: &[u8]) -> Result<()> {
        if self.open.is_none() {
            return Err(BuildError::Options("internal: no open fragment".into()));
        }
        let at = self.spool.put(bytes)?;
        self.push_spooled(at, bytes.len() as u64)
    }

    /// Append to the open fragment the `len` bytes already written at `at` of the spool
    /// (by [`Spool::put`]).
    pub fn push_spooled(&mut self, at: u64, len: u64) -> Result<()> {
        if self.open.is_none() {
            return Err(BuildError::Options("internal: no open fragment".into()));
        }
        if len == 0 {
            return Ok(());
        }
        match self.segs.last_mut() {
            Some(l) if l.at + l.len == at => l.len += len,
            _ => self.segs.push(Segment {
                start: self.len,
                len,
                at,
            }),
        }
        self.len += len;
        self.bytes_in += len;
        Ok(())
    }

    /// Forget the packed data from `off` on (a fragment found to be a duplicate).
    fn truncate(&mut self, off: u64) {
        // Bounded: each pass pops a segment or ends.
        while let Some(l) = self.segs.last_mut() {
            if l.start >= off {
                self.segs.pop();
                continue;
            }
            l.len = l.len.min(off - l.start);
            break;
        }
        self.len = off;
    }

    /// Close the open fragment; returns its id.
    pub fn end(&mut self) -> Result<usize> {
        self.end_hashed(None)
    }

    /// Close the open fragment, whose xxh3-128 is `hash` when known; returns its id.
    pub fn end_hashed(&mut self, hash: Option<u128>) -> Result<usize> {
        self.end_known(hash, None, None)
    }

    /// Close the open fragment, whose xxh3-128 is `hash` when known; with a `sketch`
    /// of its contents, it may move beside alike fragments when the store is
    /// finished.
    /// `end` is the key of its end ([`end_key_of`] of its last [`SUFFIX_KEY`] bytes)
    /// when the caller knows it (the worker that read the bytes): else it is read back
    /// from the spool. Returns its id.
    pub fn end_known(
        &mut self,
        hash: Option<u128>,
        end: Option<u64>,
        sketch: Option<Sketch>,
    ) -> Result<usize> {
        let Some(off) = self.open.take() else {
            return Err(BuildError::Options("internal: no open fragment".into()));
        };
        let len = self.len - off;
        let entry = self.entries.len();
        // Only a fragment stored as an entry of its own (not a duplicate) keeps it.
        let sketched = sketch
            .filter(|_| len > 0)
            .and_then(|s| Some((u32::try_from(entry).ok()?, s)));
        let Some(mut seen) = self.seen.take() else {
            self.entries.push(Entry { off, len, hash });
            self.sketches.extend(sketched);
            self.ids.push(off);
            return Ok(self.ids.len() - 1);
        };
        let found = self.find(&mut seen, off, len, hash, end);
        let found = match found {
            Ok(Ok((at, suffix))) => {
                self.truncate(off);
                self.deduped += len;
                if suffix {
                    self.suffix_deduped += len;
                }
                Ok(at)
            }
            Ok(Err(record)) => {
                self.sketches.extend(sketched);
                Ok(self.record(&mut seen, record, entry, off, len, hash))
            }
            Err(e) => Err(e),
        };
        self.seen = Some(seen);
        self.ids.push(found?);
        Ok(self.ids.len() - 1)
    }

    /// Where an earlier fragment equal to packed range `[off, off+len)` starts, or the
    /// end of a longer one (true), or how to record the range if there is none.
    fn find(
        &self,
        seen: &mut Seen,
        off: u64,
        len: u64,
        hash: Option<u128>,
        known_end: Option<u64>,
    ) -> Result<std::result::Result<(u64, bool), Record>> {
        let hash = match self.dedupe(seen, off, len, hash)? {
            Ok(at) => return Ok(Ok((at, false))),
            Err(h) => h,
        };
        let end = match known_end {
            Some(k) if self.by_end(len) => Some(k),
            _ => self.end_key(off, len)?,
        };
        if let Some(key) = end {
            if let Some(at) = self.suffix_of(seen, off, len, key)? {
                return Ok(Ok((at, true)));
            }
        }
        Ok(Err(Record { hash, end }))
    }

    /// Where an earlier fragment equal to spool range `[off, off+len)` starts, or the
    /// range's hash if it was needed (None: no earlier fragment has its length).
    fn dedupe(
        &self,
        seen: &mut Seen,
        off: u64,
        len: u64,
        hash: Option<u128>,
    ) -> Result<std::result::Result<u64, Option<u128>>> {
        let Some(waiting) = seen.unhashed.get_mut(&len) else {
            return Ok(Err(None));
        };
        for e in std::mem::take(waiting) {
            let h = match self.entries[e].hash {
                Some(h) => h,
                None => self.hash_range(self.entries[e].off, len)?,
            };
            seen.hashed.entry((h, len)).or_default().push(e);
        }
        let h = match hash {
            Some(h) => h,
            None => self.hash_range(off, len)?,
        };
        for &c in seen.hashed.get(&(h, len)).map_or(&[][..], Vec::as_slice) {
            if self.same(self.entries[c].off, off, len)? {
                return Ok(Ok(self.entries[c].off));
            }
        }
        Ok(Err(Some(h)))
    }

    /// Where the end of an earlier, longer fragment equal to spool range
    /// `[off, off+len)` starts, if there is one (mkfs.erofs finds the same: two
    /// versions of a file, static libraries built from the same objects).
    /// `key` is the range's [`FragStore::end_key`].
    fn suffix_of(&self, seen: &Seen, off: u64, len: u64, key: u64) -> Result<Option<u64>> {
        for &c in seen
            .ends
            .get(&key)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .rev()
        {
            let e = &self.entries[c];
            // Only a longer fragment (an equal one is a duplicate, found before).
            if e.len <= len {
                continue;
            }
            let at = e.off + e.len - len;
            // Within the codec's reach the copy costs next to nothing where it is;
            // taking it out only moves later pcluster boundaries.
            if off - at > self.suffix_reach && self.same(at, off, len)? {
                return Ok(Some(at));
            }
        }
        Ok(None)
    }

    /// The longest end of `bytes` that an earlier stored fragment also ends with (at
    /// least [`SUFFIX_KEY`] bytes, else 0), and how far before the end of the packed
    /// data that fragment ends. Without dedupe by suffix: (0, 0).
    pub fn common_end(&self, bytes: &[u8]) -> Result<(u64, u64)> {
        let n = bytes.len() as u64;
        let Some(seen) = self.seen.as_ref().filter(|_| self.by_end(n)) else {
            return Ok((0, 0));
        };
        let key = end_key_of(&bytes[(n - SUFFIX_KEY) as usize..]);
        let mut best = (0, 0);
        let mut buf = Vec::new();
        for &c in seen.ends.get(&key).map_or(&[][..], Vec::as_slice) {
            let e = &self.entries[c];
            let most = e.len.min(n);
            let mut k = 0u64;
            let mut chunk = CMP_CHUNK.min(4096);
            // Bounded: each pass adds a whole chunk to `k` or ends.
            while k < most {
                let step = (most - k).min(chunk);
                chunk = (chunk * 2).min(CMP_CHUNK);
                buf.resize(step as usize, 0);
                self.read_at(&mut buf, e.off + e.len - k - step)?;
                let mine = &bytes[(n - k - step) as usize..(n - k) as usize];
                let same = buf
                    .iter()
                    .rev()
                    .zip(mine.iter().rev())
                    .take_while(|(a, b)| a == b)
                    .count() as u64;
                k += same;
                if same < step {
                    break;
                }
            }
            if k > best.0 {
                best = (k, self.len.saturating_sub(e.off + e.len));
            }
        }
        Ok(best)
    }

    /// How far back the packed inode's codec finds a copy itself (see [`FragStore::new`]).
    pub fn suffix_reach(&self) -> u64 {
        self.suffix_reach
    }

    /// Whether fragments of `len` bytes take part in the search by end.
    fn by_end(&self, len: u64) -> bool {
        len >= SUFFIX_KEY && self.suffix_reach != u64::MAX
    }

    /// The key of the end of packed range `[off, off+len)`, when it takes part in the
    /// search by end.
    fn end_key(&self, off: u64, len: u64) -> Result<Option<u64>> {
        if !self.by_end(len) {
            return Ok(None);
        }
        let mut b = [0u8; SUFFIX_KEY as usize];
        self.read_at(&mut b, off + len - SUFFIX_KEY)?;
        Ok(Some(end_key_of(&b)))
    }

    /// Store range `[off, off+len)` as entry `entry`, known to dedupe as `record` says;
    /// returns its offset.
    fn record(
        &mut self,
        seen: &mut Seen,
        record: Record,
        entry: usize,
        off: u64,
        len: u64,
        hash: Option<u128>,
    ) -> u64 {
        match record.hash {
            None => seen.unhashed.entry(len).or_default().push(entry),
            Some(h) => seen.hashed.entry((h, len)).or_default().push(entry),
        }
        if let Some(key) = record.end {
            let v = seen.ends.entry(key).or_default();
            if v.len() == SUFFIX_CANDIDATES {
                v.remove(0);
            }
            v.push(entry);
        }
        self.entries.push(Entry { off, len, hash });
        off
    }

    /// Store a whole fragment.
    pub fn add(&mut self, bytes: &[u8]) -> Result<usize> {
        self.add_hashed(bytes, None)
    }

    /// Store a whole fragment whose xxh3-128 is `hash` when known.
    pub fn add_hashed(&mut self, bytes: &[u8], hash: Option<u128>) -> Result<usize> {
        self.begin();
        self.push(bytes)?;
        self.end_hashed(hash)
    }

    /// Store a whole fragment already written at `at` of the spool (`len` bytes,
    /// xxh3-128 `hash` when known).
    pub fn add_spooled(
        &mut self,
        at: u64,
        len: u64,
        hash: Option<u128>,
        end: Option<u64>,
    ) -> Result<usize> {
        self.begin();
        self.push_spooled(at, len)?;
        self.end_known(hash, end, None)
    }

    /// Fill `buf` with the packed data from `off` (inside `[0, len)`).
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let end = off + buf.len() as u64;
        let mut pos = off;
        for (a, b, at) in spool_ranges(&self.segs, off, end) {
            let dst = &mut buf[(a - off) as usize..(b - off) as usize];
            self.spool.read_at(dst, at)?;
            pos = b;
        }
        if pos < end {
            return Err(BuildError::Options(
                "internal: fragment past the packed data".into(),
            ));
        }
        Ok(())
    }

    /// xxh3-128 of the packed data `[off, off+len)`.
    fn hash_range(&self, off: u64, len: u64) -> Result<u128> {
        let mut h = Xxh3::new();
        let mut buf = vec![0u8; len.min(CMP_CHUNK) as usize];
        let mut done = 0u64;
        // Bounded: each pass advances `done` by at least one byte (len > done).
        while done < len {
            let n = (len - done).min(CMP_CHUNK) as usize;
            self.read_at(&mut buf[..n], off + done)?;
            h.update(&buf[..n]);
            done += n as u64;
        }
        Ok(h.digest128())
    }

    /// Whether the packed data's `[a, a+len)` and `[b, b+len)` hold the same bytes.
    fn same(&self, a: u64, b: u64, len: u64) -> Result<bool> {
        let mut x = vec![0u8; len.min(CMP_CHUNK) as usize];
        let mut y = x.clone();
        let mut done = 0u64;
        // The first pieces small: ranges that differ mostly differ early.
        let mut chunk = CMP_CHUNK.min(4096);
        // Bounded: each pass advances `done` by at least one byte (len > done).
        while done < len {
            let n = (len - done).min(chunk) as usize;
            chunk = (chunk * 2).min(CMP_CHUNK);
            self.read_at(&mut x[..n], a + done)?;
            self.read_at(&mut y[..n], b + done)?;
            if x[..n] != y[..n] {
                return Ok(false);
            }
            done += n as u64;
        }
        Ok(true)
    }

    /// Whether any fragment was stored.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The packed inode's data: ranges of the spool, with alike sketched fragments
    /// side by side.
    pub fn finish(mut self) -> Packed {
        if let Some(order) = crate::similar::order(self.entries.len(), &self.sketches) {
            self.reorder(&order);
        }
        Packed {
            size: self.len,
            offsets: self.ids,
            file: self.tmp,
            segs: self.segs.into(),
            spool: self.spool,
        }
    }

    /// For [`FragStore::finish`]: lay the entries out in `order` (a permutation of
    /// their indexes): the packed data's segments follow, and every fragment id keeps
    /// pointing at the same bytes (the entries' own offsets are left as they were).
    /// Leaves everything as it is when the entries are not back to back from 0 (they
    /// always are) or `order` is no permutation.
    fn reorder(&mut self, order: &[u32]) {
        let n = self.entries.len();
        let mut pos = 0u64;
        for e in &self.entries {
            if e.off != pos {
                return;
            }
            pos += e.len;
        }
        if pos != self.len || order.len() != n {
            return;
        }
        let mut seen = vec![false; n];
        for &i in order {
            match seen.get_mut(i as usize) {
                Some(s) if !*s => *s = true,
                _ => return,
            }
        }
        // New offset of each entry.
        let mut new_off = vec![0u64; n];
        let mut at = 0u64;
        for &i in order {
            new_off[i as usize] = at;
            at += self.entries[i as usize].len;
        }
        for x in &mut self.ids {
            // The entry holding offset x (an empty fragment's offset needs no move).
            let k = self.entries.partition_point(|e| e.off + e.len <= *x);
            if let Some(e) = self.entries.get(k).filter(|e| e.off <= *x) {
                *x = new_off[k] + (*x - e.off);
            }
        }
        let mut segs: Vec<Segment> = Vec::with_capacity(self.segs.len() + n);
        let mut start = 0u64;
        for &i in order {
            let e = &self.entries[i as usize];
            for (a, b, spool_at) in spool_ranges(&self.segs, e.off, e.off + e.len) {
                match segs.last_mut() {
                    Some(l) if l.at + l.len == spool_at => l.len += b - a,
                    _ => segs.push(Segment {
                        start,
                        len: b - a,
                        at: spool_at,
                    }),
                }
                start += b - a;
            }
        }
        self.segs = segs;
    }
}

/// The pieces of packed range `[off, end)` that `segs` hold, in order: (packed start,
/// packed end, where the start is in the spool).
fn spool_ranges(
    segs: &[Segment],
    off: u64,
    end: u64,
) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
    let first = segs.partition_point(|s| s.start + s.len <= off);
    // Bounded by the number of segments.
    segs[first..]
        .iter()
        .take_while(move |s| s.start < end)
        .map(move |s| {
            let a = s.start.max(off);
            (a, (s.start + s.len).min(end), s.at + (a - s.start))
        })
}

/// `read` bytes `[off, off + n)` of a scanned file again (on the handle kept, else
/// opened again); an error naming it if it is gone, shorter, or no longer as the scan
/// saw it.
fn read_again(
    held: &Held,
    off: u64,
    n: u64,
    read: impl FnOnce(&File) -> std::io::Result<()>,
) -> Result<()> {
    let (path, stamp) = (held.path.as_path(), held.stamp);
    let opened;
    let f = match &held.file {
        Some(f) => f,
        None => {
            opened =
                crate::source::open_scanned(path).map_err(io_err(path, "fragments: open again"))?;
            &opened
        }
    };
    let changed = || BuildError::Invalid {
        path: path.to_path_buf(),
        what: format!(
            "changed while the build read it (bytes {off}..{} read again)",
            off.saturating_add(n)
        ),
    };
    read(f).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => changed(),
        _ => io_err(path, "fragments: read again")(e),
    })?;
    let m = f.metadata().map_err(io_err(path, "fragments: stat"))?;
    if crate::source::stamp(&m) != stamp {
        return Err(changed());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferofs_testkit::noise;

    /// A fragment store on a spool in a fresh temporary directory (kept alive by the
    /// returned guard).
    fn store(dedupe: bool) -> Result<(tempfile::TempDir, FragStore)> {
        store_reach(dedupe, 0)
    }

    fn store_reach(dedupe: bool, reach: u64) -> Result<(tempfile::TempDir, FragStore)> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("."), "tempdir"))?;
        let spool =
            tempfile::NamedTempFile::new_in(dir.path()).map_err(io_err(dir.path(), "spool"))?;
        let s = FragStore::new(spool, dedupe, reach)?;
        Ok((dir, s))
    }

    #[test]
    fn a_fragment_equal_to_the_end_of_an_earlier_one_points_into_it() -> Result<()> {
        let (_dir, mut s) = store(true)?;
        let a = noise(1000, 1);
        let other = noise(300, 2);
        s.add(&a)?;
        s.add(&other)?;
        // The last 200 bytes of a; then the last 100 (a suffix of that suffix, found
        // in a, the fragment stored); then 64 bytes, the shortest end searched for.
        s.add(&a[800..])?;
        s.add(&a[900..])?;
        s.add(&a[936..])?;
        // 63 bytes are not searched for; a fragment differing in its first byte from
        // a's end is no suffix; a's first 500 bytes are no end of anything.
        s.add(&a[937..])?;
        let mut almost = a[700..].to_vec();
        almost[0] ^= 1;
        s.add(&almost)?;
        s.add(&a[..500])?;
        assert_eq!(s.suffix_deduped, 200 + 100 + 64);
        assert_eq!(s.deduped, 200 + 100 + 64);
        let p = s.finish();
        assert_eq!(p.offsets[..5], [0, 1000, 800, 900, 936]);
        assert_eq!(p.offsets[5..], [1300, 1363, 1663]);
        let mut want = a.clone();
        want.extend(&other);
        want.extend(&a[937..]);
        want.extend(&almost);
        want.extend(&a[..500]);
        assert_eq!(packed_bytes(&p)?, want);
        Ok(())
    }

    #[test]
    fn a_longer_fragment_ending_like_a_shorter_earlier_one_is_stored() -> Result<()> {
        // The earlier fragment is a's end: the same key, but too short to hold a (a
        // length taken from it once underflowed, found by the build_roundtrip fuzzer).
        let (_dir, mut s) = store(true)?;
        let a = noise(1000, 4);
        s.add(&a[900..])?;
        s.add(&a)?;
        assert_eq!((s.deduped, s.suffix_deduped), (0, 0));
        assert_eq!(s.finish().offsets, vec![0, 100]);
        Ok(())
    }

    #[test]
    fn the_longest_end_shared_with_an_earlier_fragment_is_found() -> Result<()> {
        let (_dir, mut s) = store(true)?;
        let a = noise(10_000, 5);
        let b = noise(5_000, 6);
        s.add(&a)?;
        s.add(&b)?;
        // 300 other bytes, then a's last 7,000 (longer than the 4 KiB first compared).
        let mut x = noise(300, 7);
        x.extend_from_slice(&a[3_000..]);
        assert_eq!(s.common_end(&x)?, (7_000, 5_000));
        // Its end shared with b, which ends the packed data.
        let mut y = noise(100, 8);
        y.extend_from_slice(&b[4_000..]);
        assert_eq!(s.common_end(&y)?, (1_000, 0));
        // Fewer than 64 bytes in common: none found.
        let mut z = noise(100, 9);
        z.extend_from_slice(&b[4_937..]);
        assert_eq!(s.common_end(&z)?, (0, 0));
        let (_dir, mut s) = store(false)?;
        s.add(&a)?;
        assert_eq!(s.common_end(&x)?, (0, 0));
        Ok(())
    }

    #[test]
    fn ends_within_the_codecs_reach_are_kept_and_none_without_dedupe() -> Result<()> {
        let a = noise(1000, 3);
        // Reach 250: an end of a starting 300 bytes back from where the fragment would
        // go is beyond the reach (the fragment points into a); 100 bytes back is within
        // it (the fragment is stored again).
        let (_dir, mut s) = store_reach(true, 250)?;
        s.add(&a)?;
        s.add(&a[700..])?;
        s.add(&a[900..])?;
        assert_eq!(s.suffix_deduped, 300);
        let p = s.finish();
        assert_eq!(p.offsets, vec![0, 700, 1000]);
        assert_eq!(p.size, 1100);
        let (_dir, mut s) = store(false)?;
        s.add(&a)?;
        s.add(&a[700..])?;
        assert_eq!((s.deduped, s.suffix_deduped), (0, 0));
        assert_eq!(s.finish().offsets, vec![0, 1000]);
        Ok(())
    }

    #[test]
    fn equal_fragments_are_stored_once_with_dedupe() -> Result<()> {
        let (_dir, mut s) = store(true)?;
        let a = s.add(b"hello")?;
        let b = s.add(b"int x;")?;
        s.begin();
        s.push(b"hel")?;
        s.push(b"lo")?;
        let c = s.end()?;
        let d = s.add(b"hellO")?;
        assert_eq!((a, b, c, d), (0, 1, 2, 3));
        assert_eq!(s.deduped, 5);
        assert_eq!(s.bytes_in, 21);
        let p = s.finish();
        assert_eq!(p.offsets, vec![0, 5, 0, 11]);
        assert_eq!(p.size, 16);
        assert_eq!(packed_bytes(&p)?, b"helloint x;hellO");
        // The duplicate's bytes stay in the spool, unused.
        let spool = std::fs::read(p.file.path()).map_err(io_err(p.file.path(), "read"))?;
        assert_eq!(spool, b"helloint x;hellohellO");
        Ok(())
    }

    /// The packed inode's data, read as the builder reads it.
    fn packed_bytes(p: &Packed) -> Result<Vec<u8>> {
        let src = p.source();
        let mut v = Vec::new();
        src.open(p.size)?.read_into(0, p.size as usize, &mut v)?;
        Ok(v)
    }

    /// Store `bytes` as one fragment with its sketch; returns its id.
    fn add_sketched(s: &mut FragStore, bytes: &[u8]) -> Result<usize> {
        s.begin();
        s.push(bytes)?;
        s.end_known(None, None, crate::similar::sketch(bytes))
    }

    #[test]
    fn alike_fragments_move_beside_their_first_like_and_ids_follow_their_bytes() -> Result<()> {
        use ferofs_testkit::text_lines as text;
        let (_dir, mut s) = store_reach(true, 0)?;
        let a = text(200, 100);
        let mut a2 = a.clone();
        a2[50] = b'#';
        let b = text(150, 200);
        let mut b2 = b.clone();
        b2.extend(b"one more line\n");
        let x = noise(300, 7);
        // a, x (no sketch), b, a again (a duplicate), a2, a2's last 200 bytes (the end
        // of a2, found by suffix), b2, x's first 100 bytes (no sketch).
        let ids = [
            add_sketched(&mut s, &a)?,
            s.add(&x)?,
            add_sketched(&mut s, &b)?,
            add_sketched(&mut s, &a)?,
            add_sketched(&mut s, &a2)?,
            add_sketched(&mut s, &a2[a2.len() - 200..])?,
            add_sketched(&mut s, &b2)?,
            s.add(&x[..100])?,
        ];
        let frags: [&[u8]; 8] = [&a, &x, &b, &a, &a2, &a2[a2.len() - 200..], &b2, &x[..100]];
        let p = s.finish();
        // a2 moves behind a, b2 behind b; x and x's start keep their places.
        let want = [&a[..], &a2, &x, &b, &b2, &x[..100]].concat();
        let got = packed_bytes(&p)?;
        assert_eq!(got, want);
        let (la, lx, lb) = (a.len() as u64, x.len() as u64, b.len() as u64);
        assert_eq!(
            p.offsets,
            vec![
                0,
                2 * la,
                2 * la + lx,
                0,
                la,
                2 * la - 200,
                2 * la + lx + lb,
                2 * la + lx + lb + b2.len() as u64
            ]
        );
        for (&id, f) in ids.iter().zip(frags) {
            let at = p.offsets[id] as usize;
            assert_eq!(&got[at..at + f.len()], f, "fragment {id}");
        }
        Ok(())
    }

    #[test]
    fn many_parts_go_to_the_spool_one_behind_the_other() -> Result<()> {
        let (_dir, s) = store(false)?;
        let sp = s.spool();
        // More parts than one pwritev takes, some empty.
        let parts: Vec<Vec<u8>> = (0..3000u32)
            .map(|i| vec![(i % 251) as u8; (i % 7) as usize])
            .collect();
        let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        let head = sp.put(b"head")?;
        let at = sp.put_all(&refs)?;
        let tail = sp.put(b"tail")?;
        let all = parts.concat();
        assert_eq!((head, at, tail), (0, 4, 4 + all.len() as u64));
        let spool = std::fs::read(sp.path()).map_err(io_err(sp.path(), "read"))?;
        assert_eq!(&spool[4..4 + all.len()], &all[..]);
        assert_eq!(&spool[4 + all.len()..], b"tail");
        Ok(())
    }

    #[test]
    fn fragments_of_scanned_files_are_read_again_where_they_are() -> Result<()> {
        let (dir, mut s) = store(true)?;
        let sp = s.spool();
        let a = noise(1000, 11);
        let b = noise(300, 12);
        let c = noise(100, 14);
        let (pa, pb, pc) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        let scanned = |p: &Path, bytes: &[u8]| -> Result<crate::source::Stamp> {
            std::fs::write(p, bytes).map_err(io_err(p, "write"))?;
            let m = std::fs::metadata(p).map_err(io_err(p, "stat"))?;
            Ok(crate::source::stamp(&m))
        };
        let (sa, sb, sc) = (scanned(&pa, &a)?, scanned(&pb, &b)?, scanned(&pc, &c)?);
        let open = |p: &Path| File::open(p).map_err(io_err(p, "open"));
        // a's handle is kept; b has none; c's is not kept (over the limit), so b and
        // c are opened again by path.
        let base_a = sp.refer(&pa, 1000, sa, sp.hold(open(&pa)?));
        let base_b = sp.refer(&pb, 300, sb, None);
        sp.set_keep_max(1);
        let held_c = sp.hold(open(&pc)?);
        assert!(held_c.is_none(), "a second handle over a limit of one");
        let base_c = sp.refer(&pc, 100, sc, held_c);
        assert_eq!(
            (base_a, base_b, base_c),
            (IN_PLACE, IN_PLACE + 1000, IN_PLACE + 1300)
        );
        // a's tail (its end key handed in, as a worker does), b whole, and bytes of
        // no file of their own, copied to the spool.
        let key = end_key_of(&a[1000 - SUFFIX_KEY as usize..]);
        let ta = s.add_spooled(base_a + 200, 800, Some(frag_hash(&a[200..])), Some(key))?;
        let tb = s.add_spooled(base_b, 300, None, None)?;
        let tx = s.add(b"xyz")?;
        // A place range across the two files reads both.
        let mut across = vec![0u8; 150];
        sp.read_at(&mut across, base_a + 900)?;
        assert_eq!(across, [&a[900..], &b[..50]].concat());
        // Only the copied bytes are in the spool file.
        let spool = std::fs::read(sp.path()).map_err(io_err(sp.path(), "read"))?;
        assert_eq!(spool, b"xyz");
        let p = s.finish();
        assert_eq!(
            [ta, tb, tx].map(|i| p.offsets[i]),
            [0, 800, 1100],
            "fragment offsets"
        );
        assert_eq!(packed_bytes(&p)?, [&a[200..], &b[..], b"xyz"].concat());
        // A file removed: an error naming it (on a kept handle, its ctime moved).
        for f in [&pa, &pb, &pc] {
            std::fs::remove_file(f).map_err(io_err(f, "rm"))?;
        }
        let mut buf = vec![0u8; 10];
        match sp.read_at(&mut buf, base_a) {
            Err(BuildError::Invalid { path, .. }) => assert_eq!(path, pa),
            other => panic!("read of a removed file on its handle: {other:?}"),
        }
        for (base, path) in [(base_b, &pb), (base_c, &pc)] {
            match sp.read_at(&mut buf, base) {
                Err(BuildError::Io { path: p, .. }) => assert_eq!(&p, path),
                other => panic!("read of a removed file: {other:?}"),
            }
        }
        // A file changed since the scan: its places no longer read, and the error
        // names it (the kept handle sees the change as well).
        std::thread::sleep(std::time::Duration::from_millis(20));
        scanned(&pb, &noise(300, 13))?;
        match sp.read_at(&mut buf, base_b) {
            Err(BuildError::Invalid { path, what }) => {
                assert_eq!(path, pb);
                assert!(what.contains("changed while the build read it"), "{what}");
            }
            other => panic!("read of a changed file: {other:?}"),
        }
        // A place no file has.
        assert!(matches!(
            sp.read_at(&mut buf, IN_PLACE + 5000),
            Err(BuildError::Options(_))
        ));
        Ok(())
    }

    #[test]
    fn a_kept_handle_sees_its_file_changed() -> Result<()> {
        let (dir, s) = store(false)?;
        let sp = s.spool();
        let pa = dir.path().join("a");
        std::fs::write(&pa, noise(500, 1)).map_err(io_err(&pa, "write"))?;
        let m = std::fs::metadata(&pa).map_err(io_err(&pa, "stat"))?;
        let f = File::open(&pa).map_err(io_err(&pa, "open"))?;
        let base = sp.refer(&pa, 500, crate::source::stamp(&m), sp.hold(f));
        std::thread::sleep(std::time::Duration::from_millis(20));
        // Rewritten in place (same inode): the kept handle reads new bytes, and the
        // stamp tells.
        std::fs::write(&pa, noise(500, 2)).map_err(io_err(&pa, "write"))?;
        let mut buf = vec![0u8; 100];
        match sp.read_at(&mut buf, base) {
            Err(BuildError::Invalid { path, .. }) => assert_eq!(path, pa),
            other => panic!("read of a changed file: {other:?}"),
        }
        let mut v = Vec::new();
        let own = File::open(sp.path()).map_err(io_err(sp.path(), "open"))?;
        assert!(matches!(
            sp.read_into(base, 100, &mut v, &own),
            Err(BuildError::Invalid { .. })
        ));
        Ok(())
    }

    #[test]
    fn fragments_written_by_workers_out_of_order_read_back_in_order() -> Result<()> {
        let (_dir, mut s) = store(true)?;
        let sp = s.spool();
        // Workers wrote "two", then "one", then "one" again; the store takes them in
        // its own order, and "three" after it was written.
        let two = sp.put(b"two")?;
        let one = sp.put(b"one")?;
        let one_again = sp.put(b"one")?;
        let a = s.add_spooled(one, 3, None, None)?;
        let b = s.add_spooled(two, 3, None, None)?;
        // A fragment of two parts, the second written elsewhere by the committer.
        s.begin();
        s.push_spooled(one_again, 3)?;
        s.push(b"+")?;
        let c = s.end()?;
        let d = s.add_spooled(one_again, 3, Some(frag_hash(b"one")), None)?;
        let three = sp.put(b"three")?;
        let e = s.add_spooled(three, 5, None, None)?;
        assert_eq!((a, b, c, d, e), (0, 1, 2, 3, 4));
        assert_eq!(s.deduped, 3);
        let p = s.finish();
        assert_eq!(p.offsets, vec![0, 3, 6, 0, 10]);
        assert_eq!(packed_bytes(&p)?, b"onetwoone+three");
        Ok(())
    }

    #[test]
    fn fragments_of_one_length_are_hashed_when_they_meet() -> Result<()> {
        let (_dir, mut s) = store(true)?;
        // "abc" waits unhashed until "xyz" has its length; the third meets the first.
        let ids = [
            s.add(b"abc")?,
            s.add(b"xyz")?,
            s.add(b"abc")?,
            s.add(b"xyz")?,
        ];
        let ids2 = [s.add(b"q")?, s.add(b"abcd")?, s.add(b"q")?];
        assert_eq!(ids, [0, 1, 2, 3]);
        assert_eq!(ids2, [4, 5, 6]);
        assert_eq!(s.deduped, 7);
        let p = s.finish();
        assert_eq!(p.offsets, vec![0, 3, 0, 3, 6, 7, 6]);
        assert_eq!(p.size, 11);
        Ok(())
    }

    #[test]
    fn handed_in_hashes_meet_hashes_read_from_the_spool() -> Result<()> {
        let (_dir, mut s) = store(true)?;
        // Longer than one spool read, so the spool's hash is computed in chunks.
        let big: Vec<u8> = (0..(CMP_CHUNK as usize + 12_345))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let a = s.add(&big)?; // hashed from the spool when the next one comes
        let b = s.add_hashed(&big, Some(frag_hash(&big)))?;
        let mut other = big.clone();
        other[5] ^= 1;
        let c = s.add_hashed(&other, Some(frag_hash(&other)))?;
        let d = s.add(&other)?;
        assert_eq!((a, b, c, d), (0, 1, 2, 3));
        assert_eq!(s.deduped, 2 * big.len() as u64);
        let p = s.finish();
        let n = big.len() as u64;
        assert_eq!(p.offsets, vec![0, 0, n, n]);
        Ok(())
    }

    #[test]
    fn without_dedupe_equal_fragments_are_stored_twice() -> Result<()> {
        let (_dir, mut s) = store(false)?;
        s.add(b"same")?;
        s.add(b"same")?;
        let p = s.finish();
        assert_eq!((p.size, p.offsets), (8, vec![0, 4]));
        Ok(())
    }
}
