//! Directories (like the kernel's dir.c and namei.c): readdir per block, binary-search
//! lookup, path resolution, and a bounded depth-first walk.

use crate::error::*;
use crate::image::Image;
use crate::inode::Inode;
use crate::source::Source;
use ferofs_format::dirent::*;
use std::collections::HashSet;

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub nid: u64,
    pub file_type: u8,
}

/// Deepest path we follow (the kernel has PATH_MAX = 4096 → at most 2048 levels).
pub const MAX_DEPTH: usize = 2048;

impl<S: Source> Image<S> {
    fn dir_check(&self, dir: &Inode) -> Result<()> {
        if !dir.is_dir() {
            return Err(Error::NotADirectory {
                path: format!("nid {}", dir.nid),
            });
        }
        Ok(())
    }

    /// Number of directory blocks.
    fn dir_blocks(&self, dir: &Inode) -> u64 {
        dir.size.div_ceil(u64::from(self.block_size()))
    }

    /// Read directory block `i` and parse it into entries.
    fn dir_block(&self, dir: &Inode, i: u64) -> Result<Vec<DirEntry>> {
        let bs = u64::from(self.block_size());
        let start = i * bs;
        let len = (dir.size - start).min(bs) as usize;
        let mut buf = vec![0u8; len];
        let n = self.read_at(dir, start, &mut buf)?;
        if n != len {
            return Err(Error::short_read(dir.nid, start, dir.size));
        }
        parse_dir_block(&buf, dir.nid, start)
    }

    /// All entries of a directory, in on-disk order ("." and ".." included as stored).
    pub fn read_dir(&self, dir: &Inode) -> Result<Vec<DirEntry>> {
        self.dir_check(dir)?;
        let mut cur = DirCursor::new(self, dir);
        let mut out = Vec::new();
        while let Some(e) = cur.next_entry(self)? {
            out.push(e);
        }
        Ok(out)
    }

    /// Look up `name` in `dir` by binary search (blocks by first name, then entries),
    /// as the kernel does.
    pub fn lookup_child(&self, dir: &Inode, name: &[u8]) -> Result<Option<u64>> {
        self.dir_check(dir)?;
        if name == b"." && dir.dot_omitted {
            return Ok(Some(dir.nid));
        }
        if name.is_empty() || name.len() > ferofs_format::MAX_NAME_LEN {
            return Ok(None);
        }
        let nblocks = self.dir_blocks(dir);
        if nblocks == 0 {
            return Ok(None);
        }
        // Last block whose first name is <= name.
        let (mut lo, mut hi) = (0u64, nblocks);
        let mut cand = 0u64;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let ents = self.dir_block(dir, mid)?;
            match ents.first() {
                Some(first) if first.name.as_slice() <= name => {
                    cand = mid;
                    lo = mid + 1;
                }
                Some(_) => hi = mid,
                None => {
                    return Err(corrupt(
                        CorruptKind::BadDirent,
                        Some(dir.nid),
                        Some(mid),
                        None,
                        "empty directory block",
                    ))
                }
            }
        }
        let ents = self.dir_block(dir, cand)?;
        Ok(ents
            .binary_search_by(|e| e.name.as_slice().cmp(name))
            .ok()
            .and_then(|i| ents.get(i))
            .map(|e| e.nid))
    }

    /// Resolve a path ("/a/b" or "a/b") from the root without following symlinks.
    pub fn lookup(&self, path: &[u8]) -> Result<Inode> {
        let mut stack: Vec<Inode> = vec![self.inode(self.root_nid)?];
        let shown = || String::from_utf8_lossy(path).into_owned();
        for comp in path.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
            if stack.len() > MAX_DEPTH {
                return Err(corrupt(
                    CorruptKind::TooDeep,
                    None,
                    None,
                    Some(stack.len() as u64),
                    "path too deep",
                ));
            }
            let cur = stack
                .last()
                .cloned()
                .ok_or_else(|| Error::NotFound { path: shown() })?;
            if !cur.is_dir() {
                return Err(Error::NotADirectory { path: shown() });
            }
            if comp.len() > ferofs_format::MAX_NAME_LEN {
                // No entry can have this name: not found without reading anything.
                return Err(Error::NotFound { path: shown() });
            }
            match comp {
                b"." => continue,
                b".." => {
                    if stack.len() > 1 {
                        stack.pop();
                    }
                    continue;
                }
                _ => {}
            }
            let nid = self
                .lookup_child(&cur, comp)?
                .ok_or_else(|| Error::NotFound { path: shown() })?;
            stack.push(self.inode(nid)?);
        }
        stack.pop().ok_or_else(|| Error::NotFound { path: shown() })
    }

    /// Depth-first walk of the whole tree from the root, children in name order.
    /// `f` gets the path ("/" for the root, "/a/b" below) and the inode. "." and ".."
    /// are skipped. A directory that contains one of its ancestors is `DirectoryLoop`;
    /// a directory deeper than [`MAX_DEPTH`] is `TooDeep`.
    ///
    /// The walk keeps its own stack on the heap (no recursion), holding one directory
    /// block's entries per level: at most [`MAX_DEPTH`] blocks' worth of entries at any
    /// time, whatever the image claims. It visits every path, so a hostile image whose
    /// directories share subdirectories (a DAG, which is not a loop) can make it visit
    /// far more paths than the image has inodes: `f` bounds the work by returning an
    /// error to stop the walk.
    pub fn walk(&self, f: impl FnMut(&[u8], &Inode) -> Result<()>) -> Result<()> {
        let root = self.inode(self.root_nid)?;
        self.walk_from(&root, f)
    }

    /// Like [`Image::walk`] from any directory; paths are relative to it ("/" for it).
    pub fn walk_from(
        &self,
        top: &Inode,
        mut f: impl FnMut(&[u8], &Inode) -> Result<()>,
    ) -> Result<()> {
        f(b"/", top)?;
        if !top.is_dir() {
            return Ok(());
        }
        let mut ancestors: HashSet<u64> = HashSet::new();
        ancestors.insert(top.nid);
        let mut path = Vec::new();
        // (cursor over the directory, length of its path)
        let mut stack: Vec<(DirCursor, usize)> = vec![(DirCursor::new(self, top), 0)];
        // Bounded: every step consumes one entry of a directory whose entries are read
        // block by block; a level is popped when its directory ends.
        while let Some((cur, plen)) = stack.last_mut() {
            let plen = *plen;
            let Some(e) = cur.next_entry(self)? else {
                if let Some((done, _)) = stack.pop() {
                    ancestors.remove(&done.dir.nid);
                }
                continue;
            };
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let parent = cur.dir.nid;
            let child = self.inode(e.nid)?;
            path.truncate(plen);
            path.push(b'/');
            path.extend_from_slice(&e.name);
            f(&path, &child)?;
            if child.is_dir() {
                let depth = stack.len() + 1;
                if depth > MAX_DEPTH {
                    return Err(corrupt(
                        CorruptKind::TooDeep,
                        Some(child.nid),
                        None,
                        Some(depth as u64),
                        "directory tree too deep",
                    ));
                }
                if !ancestors.insert(child.nid) {
                    return Err(corrupt(
                        CorruptKind::DirectoryLoop,
                        Some(child.nid),
                        None,
                        Some(parent),
                        "directory contains its own ancestor",
                    ));
                }
                stack.push((DirCursor::new(self, &child), path.len()));
            }
        }
        Ok(())
    }
}

/// Reads a directory's entries block by block, checking that names increase across
/// the whole directory. Holds one block's entries at a time.
struct DirCursor {
    dir: Inode,
    nblocks: u64,
    next_block: u64,
    ents: std::vec::IntoIter<DirEntry>,
    prev: Option<Vec<u8>>,
}

impl DirCursor {
    fn new<S: Source>(img: &Image<S>, dir: &Inode) -> Self {
        DirCursor {
            dir: dir.clone(),
            nblocks: img.dir_blocks(dir),
            next_block: 0,
            ents: Vec::new().into_iter(),
            prev: None,
        }
    }

    fn next_entry<S: Source>(&mut self, img: &Image<S>) -> Result<Option<DirEntry>> {
        // Bounded: each turn reads the next block; a block has at least one entry.
        loop {
            if let Some(e) = self.ents.next() {
                if let Some(p) = &self.prev {
                    if p.as_slice() >= e.name.as_slice() {
                        return Err(corrupt(
                            CorruptKind::UnsortedDirectory,
                            Some(self.dir.nid),
                            Some((self.next_block - 1) * u64::from(img.block_size())),
                            None,
                            "names not in increasing order",
                        ));
                    }
                }
                self.prev = Some(e.name.clone());
                return Ok(Some(e));
            }
            if self.next_block >= self.nblocks {
                return Ok(None);
            }
            self.ents = img.dir_block(&self.dir, self.next_block)?.into_iter();
            self.next_block += 1;
        }
    }
}

/// Parse one directory block (`buf` = the block's valid bytes; `nid` and `blk_off`, the
/// block's offset in the directory, only label errors). Checks every nameoff and name
/// length (1..=255 bytes) and file type; not the order of names (see [`Image::read_dir`]).
pub fn parse_dir_block(buf: &[u8], nid: u64, blk_off: u64) -> Result<Vec<DirEntry>> {
    let bad = |off: usize, v: u64, what: &'static str| {
        corrupt(
            CorruptKind::BadNameoff,
            Some(nid),
            Some(blk_off + off as u64),
            Some(v),
            what,
        )
    };
    if buf.len() < DIRENT_SIZE {
        return Err(bad(
            0,
            buf.len() as u64,
            "directory block shorter than one dirent",
        ));
    }
    let first = u16::from_le_bytes([buf[8], buf[9]]) as usize;
    if first < DIRENT_SIZE || !first.is_multiple_of(DIRENT_SIZE) || first >= buf.len() {
        return Err(bad(8, first as u64, "first nameoff out of range"));
    }
    let n = first / DIRENT_SIZE;
    let mut ents = Vec::with_capacity(n);
    let mut raw = Vec::with_capacity(n);
    for i in 0..n {
        let mut d = [0u8; DIRENT_SIZE];
        d.copy_from_slice(&buf[i * DIRENT_SIZE..(i + 1) * DIRENT_SIZE]);
        raw.push(Dirent::parse(&d));
    }
    for i in 0..n {
        let start = usize::from(raw[i].nameoff);
        let end = if i + 1 < n {
            usize::from(raw[i + 1].nameoff)
        } else {
            // The last name ends at the first NUL or at the end of the valid bytes.
            let tail = buf.get(start..).unwrap_or(&[]);
            start + tail.iter().position(|&c| c == 0).unwrap_or(tail.len())
        };
        if start < first
            || end <= start
            || end > buf.len()
            || end - start > ferofs_format::MAX_NAME_LEN
        {
            return Err(bad(
                i * DIRENT_SIZE + 8,
                start as u64,
                "nameoff out of range",
            ));
        }
        if raw[i].file_type >= FT_MAX {
            return Err(corrupt(
                CorruptKind::BadDirent,
                Some(nid),
                Some(blk_off + (i * DIRENT_SIZE) as u64),
                Some(u64::from(raw[i].file_type)),
                "bad file type",
            ));
        }
        ents.push(DirEntry {
            name: buf[start..end].to_vec(),
            nid: raw[i].nid,
            file_type: raw[i].file_type,
        });
    }
    Ok(ents)
}
