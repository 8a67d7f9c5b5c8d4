//! Metadata kept in the daemon from mount time (`-o preload=SIZE`, default
//! [`DEFAULT_PRELOAD_BYTES`]; `-o nopreload` or `preload=0`: off).
//!
//! Before the mount is reported ready, [`preload`] walks the whole tree through the
//! reader — every inode, every directory, symlink targets, xattrs, the map header and
//! first index entries of every compressed file — and every image block those reads
//! touch is kept in [`Pinned`], the source the reader reads through. Then the blocks
//! between kept ones are filled in where kept blocks are dense (see [`Building::fill`]):
//! in an image ferofs builds, the metadata is one region (records, shared xattrs,
//! directory and symlink blocks), so this fetches the blocks of the index of a big
//! file that hold no inode; in an image whose metadata lies between data (mkfs.erofs),
//! it reads only short gaps between metadata blocks. Then the set is frozen: reads
//! that fall in kept blocks are served from memory, without a lock, for the life of the
//! mount, so that lookups, getattr, readdir and index reads after a page-cache drop
//! never wait for the device. What does not fit the budget (checked block by block) is
//! read from the image on demand, as before.
//!
//! Nothing in the walk trusts the image: it is best effort (an inode or directory that
//! fails to load is skipped, the request that needs it reports the error), it visits
//! each nid once, and it ends after at most `budget / 32` inodes (an inode takes at
//! least 32 bytes) or when the budget is spent.
//!
//! The walk visits nids smallest first (a heap), so that it reads the image mostly
//! forwards and the kernel's read-ahead on the image file helps a cold mount.

use ferofs_reader::{Image, ReadCtx, Source};
use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::io;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Default `-o preload=SIZE`.
pub const DEFAULT_PRELOAD_BYTES: usize = 16 << 20;

/// Granularity of what is kept, bytes.
const BLOCK: u64 = 4096;
const BLOCK_USIZE: usize = 4096;

/// Blocks between two kept blocks that [`Building::fill`] reads at most.
const FILL_GAP_BLOCKS: u64 = 32;

/// Most inodes the walk visits, whatever the budget.
const MAX_WALK: u64 = 1 << 24;

thread_local! {
    /// This thread's reads are the preload walk's: keep the blocks they touch.
    static PINNING: Cell<bool> = const { Cell::new(false) };
}

fn pinning<T>(f: impl FnOnce() -> T) -> T {
    crate::source::with_flag(&PINNING, f)
}

/// Blocks being kept, during the walk.
#[derive(Default)]
struct Building {
    blocks: BTreeMap<u64, Box<[u8]>>,
    bytes: usize,
    /// Image bytes read to keep them (the walk's and the fill's).
    read: u64,
}

/// A [`Source`] that serves the blocks kept at mount from memory.
pub(crate) struct Pinned<S> {
    inner: S,
    size: u64,
    budget: usize,
    building: Mutex<Building>,
    frozen: OnceLock<BTreeMap<u64, Box<[u8]>>>,
}

/// What [`preload`] did (for `-v` and the tests).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PreloadStats {
    pub inodes: u64,
    pub dirs: u64,
    /// Bytes kept (whole blocks).
    pub bytes: usize,
    /// Of which read by the gap fill.
    pub filled: u64,
    /// The budget ran out before the walk ended.
    pub truncated: bool,
    pub took: Duration,
}

impl<S: Source> Pinned<S> {
    /// `inner`, keeping at most `budget` bytes (in blocks of [`BLOCK`] bytes, whatever
    /// the image's block size: the page size, what the kernel would read).
    pub(crate) fn new(inner: S, budget: usize) -> io::Result<Self> {
        let size = inner.size()?;
        Ok(Pinned {
            inner,
            size,
            budget,
            building: Mutex::new(Building::default()),
            frozen: OnceLock::new(),
        })
    }

    /// Copy `[offset, offset + buf.len())` out of `blocks`; false when one is missing.
    fn copy_from(&self, blocks: &BTreeMap<u64, Box<[u8]>>, buf: &mut [u8], offset: u64) -> bool {
        if blocks.is_empty() {
            return false;
        }
        let mut pos = offset;
        let mut done = 0usize;
        // Bounded by the buffer: every turn copies at least one byte or returns.
        while done < buf.len() {
            let blk = pos / BLOCK;
            let Some(b) = blocks.get(&blk) else {
                return false;
            };
            let Ok(within) = usize::try_from(pos % BLOCK) else {
                return false;
            };
            let Some(src) = b.get(within..) else {
                return false;
            };
            let Some(dst) = buf.get_mut(done..) else {
                return false;
            };
            let n = src.len().min(dst.len());
            if n == 0 {
                return false;
            }
            if let (Some(d), Some(s)) = (dst.get_mut(..n), src.get(..n)) {
                d.copy_from_slice(s);
            }
            done += n;
            pos += n as u64;
        }
        true
    }

    /// The walk's read: served from kept blocks, or read as whole blocks and kept while
    /// the budget lasts.
    fn read_pinning(&self, buf: &mut [u8], offset: u64, end: u64) -> io::Result<()> {
        let Ok(mut g) = self.building.lock() else {
            return self.inner.read_exact_at(buf, offset);
        };
        if self.copy_from(&g.blocks, buf, offset) {
            return Ok(());
        }
        let first = offset / BLOCK;
        let last = (end - 1) / BLOCK;
        let from = first * BLOCK;
        let to = last.saturating_add(1).saturating_mul(BLOCK).min(self.size);
        let n = usize::try_from(to - from).map_err(|_| io::ErrorKind::InvalidInput)?;
        if g.bytes.saturating_add(n) > self.budget {
            drop(g);
            return self.inner.read_exact_at(buf, offset);
        }
        let mut whole = vec![0u8; n];
        self.inner.read_exact_at(&mut whole, from)?;
        g.read = g.read.saturating_add(n as u64);
        for (i, chunk) in whole.chunks(BLOCK_USIZE).enumerate() {
            let blk = first + i as u64;
            if !g.blocks.contains_key(&blk) {
                g.bytes += chunk.len();
                g.blocks.insert(blk, chunk.into());
            }
        }
        let at = usize::try_from(offset - from).map_err(|_| io::ErrorKind::InvalidInput)?;
        let src = at
            .checked_add(buf.len())
            .and_then(|e| whole.get(at..e))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }

    /// Keep the blocks between kept blocks less than [`FILL_GAP_BLOCKS`] apart, in runs
    /// whose kept blocks are at least half of them, while the budget lasts. Returns the
    /// bytes read.
    fn fill(&self) -> u64 {
        let Ok(mut g) = self.building.lock() else {
            return 0;
        };
        let kept: Vec<u64> = g.blocks.keys().copied().collect();
        // Runs of kept blocks with gaps below the limit: (first, last, blocks kept).
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        for &b in &kept {
            match runs.last_mut() {
                Some((_, last, n)) if b - *last <= FILL_GAP_BLOCKS => {
                    *last = b;
                    *n += 1;
                }
                _ => runs.push((b, b, 1)),
            }
        }
        let mut read = 0u64;
        for (first, last, n) in runs {
            let span = last - first + 1;
            if n * 2 < span {
                continue;
            }
            // Bounded by the run's span; one read per gap.
            let mut b = first;
            while b <= last {
                if g.blocks.contains_key(&b) {
                    b += 1;
                    continue;
                }
                let mut e = b;
                while e < last && !g.blocks.contains_key(&(e + 1)) {
                    e += 1;
                }
                let from = b * BLOCK;
                let to = (e + 1).saturating_mul(BLOCK).min(self.size);
                let Ok(len) = usize::try_from(to.saturating_sub(from)) else {
                    return read;
                };
                if len == 0 || g.bytes.saturating_add(len) > self.budget {
                    return read;
                }
                let mut whole = vec![0u8; len];
                if self.inner.read_exact_at(&mut whole, from).is_err() {
                    return read;
                }
                read += len as u64;
                for (i, chunk) in whole.chunks(BLOCK_USIZE).enumerate() {
                    g.bytes += chunk.len();
                    g.blocks.insert(b + i as u64, chunk.into());
                }
                b = e + 1;
            }
        }
        g.read = g.read.saturating_add(read);
        read
    }

    /// End the walk: from now on the kept blocks are read without a lock.
    fn freeze(&self) -> usize {
        let blocks = match self.building.lock() {
            Ok(mut g) => std::mem::take(&mut g.blocks),
            Err(_) => BTreeMap::new(),
        };
        let n = blocks.values().map(|b| b.len()).sum();
        let _ = self.frozen.set(blocks);
        n
    }
}

impl<S: Source> Source for Pinned<S> {
    #[inline]
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = match offset.checked_add(buf.len() as u64) {
            Some(e) if e <= self.size && !buf.is_empty() => e,
            _ => return self.inner.read_exact_at(buf, offset),
        };
        if let Some(blocks) = self.frozen.get() {
            if self.copy_from(blocks, buf, offset) {
                return Ok(());
            }
            return self.inner.read_exact_at(buf, offset);
        }
        if PINNING.with(Cell::get) {
            return self.read_pinning(buf, offset, end);
        }
        self.inner.read_exact_at(buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.size)
    }
}

/// Walk the image and keep the metadata blocks the walk reads in `img`'s source (see
/// the module doc), then freeze them. Best effort: never fails.
pub(crate) fn preload<S: Source>(img: &Image<Pinned<S>>) -> PreloadStats {
    let t = Instant::now();
    let src = img.source();
    let mut st = PreloadStats::default();
    if src.budget == 0 {
        let _ = src.frozen.set(BTreeMap::new());
        return st;
    }
    let max_walk = (u64::try_from(src.budget).unwrap_or(u64::MAX) / 32).clamp(1, MAX_WALK);
    pinning(|| {
        let mut heap = BinaryHeap::new();
        let mut seen = HashSet::new();
        let root = img.root_nid();
        heap.push(Reverse(root));
        seen.insert(root);
        // Bounded: each nid enters the heap once (`seen`), at most `max_walk` visits.
        while let Some(Reverse(nid)) = heap.pop() {
            if st.inodes >= max_walk || src.full() {
                st.truncated = true;
                break;
            }
            st.inodes += 1;
            let Ok(ino) = img.inode(nid) else { continue };
            if ino.xattr_icount > 0 {
                let _ = img.xattrs(&ino);
            }
            if ino.is_dir() {
                st.dirs += 1;
                let Ok(ents) = img.read_dir(&ino) else {
                    continue;
                };
                for e in ents {
                    if e.name != b"." && e.name != b".." && seen.insert(e.nid) {
                        heap.push(Reverse(e.nid));
                    }
                }
            } else if ino.is_symlink() {
                let _ = img.read_link(&ino);
            } else if ino.is_regular() && ino.layout.is_compressed() && ino.size > 0 {
                // The map header and the first index entries (a fresh context reads only
                // the blocks it needs).
                let _ = img.data_span(&mut ReadCtx::new(), &ino, 0);
            }
        }
    });
    st.filled = src.fill();
    st.bytes = src.freeze();
    st.took = t.elapsed();
    st
}

impl<S> Pinned<S> {
    fn full(&self) -> bool {
        self.building
            .lock()
            .map_or(true, |g| g.bytes.saturating_add(4096) > self.budget)
    }
}

impl PreloadStats {
    /// One line for `-v`.
    pub(crate) fn line(&self) -> String {
        format!(
            "preload: {} inodes, {} directories walked, {} KiB of metadata blocks kept ({} KiB by gap fill){} in {:.1} ms",
            self.inodes,
            self.dirs,
            self.bytes / 1024,
            self.filled / 1024,
            if self.truncated { ", budget reached" } else { "" },
            self.took.as_secs_f64() * 1000.0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// An image of `n` blocks, block `b` filled with `b as u8`, counting reads.
    struct Counting {
        data: Vec<u8>,
        reads: AtomicU64,
    }

    impl Counting {
        fn new(blocks: usize) -> Self {
            let data = (0..blocks)
                .flat_map(|b| std::iter::repeat_n(b as u8, BLOCK_USIZE))
                .collect();
            Counting {
                data,
                reads: AtomicU64::new(0),
            }
        }
    }

    impl Source for Counting {
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.data.read_exact_at(buf, offset)
        }
        fn size(&self) -> io::Result<u64> {
            self.data.size()
        }
    }

    fn read(p: &Pinned<Counting>, at: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        p.read_exact_at(&mut b, at).expect("read");
        b
    }

    fn reads(p: &Pinned<Counting>) -> u64 {
        p.inner.reads.load(Ordering::Relaxed)
    }

    #[test]
    fn kept_blocks_are_served_without_the_source() {
        let p = Pinned::new(Counting::new(64), 1 << 20).expect("pinned");
        // The walk reads parts of blocks 3 and 4..=5 (a read across a boundary).
        let a = pinning(|| read(&p, 3 * BLOCK + 100, 32));
        let b = pinning(|| read(&p, 5 * BLOCK - 8, 16));
        assert_eq!(a, vec![3; 32]);
        assert_eq!(b, [vec![4; 8], vec![5; 8]].concat());
        // A second walk read within them is served from what is kept.
        let before = reads(&p);
        assert_eq!(pinning(|| read(&p, 4 * BLOCK, 10)), vec![4; 10]);
        assert_eq!(reads(&p), before);
        // Reads outside the walk are not kept.
        assert_eq!(read(&p, 9 * BLOCK, 10), vec![9; 10]);
        assert_eq!(p.freeze(), 3 * BLOCK_USIZE);
        let before = reads(&p);
        for (at, len) in [
            (3 * BLOCK, 4096),
            (3 * BLOCK + 4000, 8000),
            (5 * BLOCK + 4095, 1),
        ] {
            let want: Vec<u8> = (at..at + len as u64).map(|x| (x / BLOCK) as u8).collect();
            assert_eq!(read(&p, at, len), want);
        }
        assert_eq!(reads(&p), before, "kept blocks read from the source again");
        // Partly kept, or not kept: from the source, and right.
        let want: Vec<u8> = (5 * BLOCK..7 * BLOCK).map(|x| (x / BLOCK) as u8).collect();
        assert_eq!(read(&p, 5 * BLOCK, 2 * BLOCK_USIZE), want);
        assert_eq!(read(&p, 9 * BLOCK, 1), vec![9]);
        assert_eq!(reads(&p), before + 2);
        // Frozen: a walk-style read keeps nothing more.
        pinning(|| read(&p, 20 * BLOCK, 1));
        assert_eq!(read(&p, 20 * BLOCK, 1), vec![20]);
        assert_eq!(reads(&p), before + 4);
    }

    #[test]
    fn the_budget_holds_and_reads_past_the_end_fail() {
        let p = Pinned::new(Counting::new(64), 2 * BLOCK_USIZE).expect("pinned");
        pinning(|| {
            for b in 0..10u64 {
                assert_eq!(read(&p, b * BLOCK, 1), vec![b as u8]);
            }
        });
        assert!(p.full());
        assert_eq!(p.fill(), 0);
        assert_eq!(p.freeze(), 2 * BLOCK_USIZE);
        let mut b = [0u8; 2];
        assert!(p.read_exact_at(&mut b, 64 * BLOCK - 1).is_err());
        assert!(pinning(|| p.read_exact_at(&mut b, u64::MAX)).is_err());
    }

    #[test]
    fn gaps_are_filled_in_dense_runs_only() {
        let p = Pinned::new(Counting::new(400), 1 << 20).expect("pinned");
        pinning(|| {
            // Dense: 7 of blocks 10..=22 kept; the gap 14..=19 is filled.
            for b in [10u64, 11, 12, 13, 20, 21, 22] {
                read(&p, b * BLOCK, 1);
            }
            // Sparse: one block every 30 (close enough to chain, too few to fill).
            for b in (100..400u64).step_by(30) {
                read(&p, b * BLOCK, 1);
            }
        });
        let filled = p.fill();
        assert_eq!(filled, 6 * BLOCK);
        p.freeze();
        let before = reads(&p);
        let want: Vec<u8> = (10..=22u8).flat_map(|b| vec![b; BLOCK_USIZE]).collect();
        assert_eq!(read(&p, 10 * BLOCK, 13 * BLOCK_USIZE), want);
        assert_eq!(reads(&p), before);
        read(&p, 101 * BLOCK, 1);
        assert_eq!(reads(&p), before + 1, "a sparse gap was filled");
    }
}
