//! File data (like the kernel's data.c): one mapping function for every layout, and
//! `read_at` on top of it. Compressed layouts are mapped by `zmap`/`zdata`.

use crate::error::*;
use crate::image::Image;
use crate::inode::Inode;
use crate::source::Source;
use crate::zdata::ReadCtx;
use ferofs_format::chunk::*;
use ferofs_format::inode::DataLayout;
use ferofs_format::sb::INCOMPAT_48BIT;
use serde::Serialize;
use std::fmt;

/// Where a run of logical bytes comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Src {
    /// Zeros.
    Hole,
    /// Raw image bytes at this absolute byte position.
    Raw(u64),
    /// Bytes in the inode's own address space at this offset from the inode start.
    Inline(u64),
}

/// A mapped run: logical `[start, start+len)` from `src`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub start: u64,
    pub len: u64,
    pub src: Src,
}

/// One extent, for `stat`-style display.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Extent {
    pub logical: u64,
    pub length: u64,
    /// Absolute byte address in the image (None: hole, inline or fragment).
    pub physical: Option<u64>,
    /// Bytes stored (compressed length for compressed extents).
    pub stored: u64,
    pub kind: String,
    /// For a fragment: where its bytes start in the packed inode's data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fragment_offset: Option<u64>,
}

impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}..{} {}",
            self.logical,
            self.logical + self.length,
            self.kind
        )?;
        if let Some(p) = self.physical {
            write!(f, " @ {p} ({} bytes stored)", self.stored)?;
        }
        if let Some(o) = self.fragment_offset {
            write!(f, " @ packed {o}")?;
        }
        Ok(())
    }
}

/// Most mapping runs [`Image::hole_end`] merges in one call.
pub const MAX_HOLE_RUNS: usize = 1 << 16;
/// Mapping runs one [`Image::seek_data`] or [`Image::seek_hole`] looks at, at most
/// (a few seconds of chunk indexes on a hostile image).
pub const MAX_SEEK_RUNS: usize = 1 << 22;

/// [`Image::read_to_vec_limited`] grows its buffer this much at a time.
const READ_TO_VEC_STEP: u64 = 4 << 20;

/// Hard cap on extents listed for one file.
pub(crate) const MAX_EXTENTS_LISTED: usize = 1 << 20;

impl<S: Source> Image<S> {
    fn null_startblk(&self, ino: &Inode) -> bool {
        if self.sb.has_incompat(INCOMPAT_48BIT) && (ino.extended || ino.addr_hi != 0) {
            ino.startblk() == (1u64 << 48) - 1
        } else {
            ino.raw_u == u32::MAX
        }
    }

    /// Map the uncompressed run containing logical offset `pos` (< size).
    pub(crate) fn map_flat(&self, ino: &Inode, pos: u64) -> Result<Run> {
        let bits = self.blkszbits;
        let blksz = 1u64 << bits;
        match ino.layout {
            DataLayout::FlatPlain | DataLayout::FlatInline => {
                let nblocks = ino.size.div_ceil(blksz);
                let inline = ino.layout == DataLayout::FlatInline;
                let flat_blocks = if inline {
                    nblocks.saturating_sub(1)
                } else {
                    nblocks
                };
                let flat_end = flat_blocks << bits;
                if pos < flat_end {
                    if self.null_startblk(ino) {
                        return Ok(Run {
                            start: 0,
                            len: flat_end,
                            src: Src::Hole,
                        });
                    }
                    let phys = self.blk_pos(ino.startblk()).ok_or_else(|| {
                        corrupt(
                            CorruptKind::BadBlockAddress,
                            Some(ino.nid),
                            None,
                            Some(ino.startblk()),
                            "start block overflows",
                        )
                    })?;
                    let end = phys.checked_add(flat_end);
                    if end.is_none_or(|e| e > self.len) {
                        return Err(corrupt(
                            CorruptKind::BadBlockAddress,
                            Some(ino.nid),
                            Some(phys),
                            Some(ino.startblk()),
                            "data blocks beyond the end of the image",
                        ));
                    }
                    return Ok(Run {
                        start: 0,
                        len: flat_end,
                        src: Src::Raw(phys),
                    });
                }
                // The inline tail, right after the inode core and xattrs.
                let tail_len = ino.size - flat_end;
                let (ipos, _) = self.inode_pos(ino.nid)?;
                let tail_pos = ipos.saturating_add(ino.meta_size);
                if (tail_pos % blksz) + tail_len > blksz {
                    return Err(corrupt(
                        CorruptKind::BadInlineData,
                        Some(ino.nid),
                        Some(tail_pos),
                        Some(tail_len),
                        "inline data crosses a block boundary",
                    ));
                }
                Ok(Run {
                    start: flat_end,
                    len: tail_len,
                    src: Src::Inline(ino.meta_size),
                })
            }
            DataLayout::ChunkBased => self.map_chunk(ino, pos),
            _ => Err(unsupported(
                "compressed layout in flat mapping",
                Some(ino.nid),
            )),
        }
    }

    fn map_chunk(&self, ino: &Inode, pos: u64) -> Result<Run> {
        let bits = self.blkszbits;
        let fmt = (ino.raw_u & 0xFFFF) as u16;
        if fmt & !CHUNK_FORMAT_ALL != 0 {
            return Err(unsupported(format!("chunk format {fmt:#x}"), Some(ino.nid)));
        }
        let chunkbits = u32::from(bits) + u32::from(fmt & CHUNK_FORMAT_BLKBITS_MASK);
        if chunkbits > 48 {
            return Err(corrupt(
                CorruptKind::BadChunk,
                Some(ino.nid),
                None,
                Some(u64::from(chunkbits)),
                "chunk size too large",
            ));
        }
        let cs = 1u64 << chunkbits;
        let idx = pos >> chunkbits;
        let indexes = fmt & CHUNK_FORMAT_INDEXES != 0;
        let unit: u64 = if indexes {
            CHUNK_INDEX_SIZE as u64
        } else {
            BLOCK_MAP_ENTRY_SIZE as u64
        };
        let (ipos, _) = self.inode_pos(ino.nid)?;
        let e = ipos + ino.meta_size;
        let arr = e.div_ceil(unit) * unit - ipos;
        let off = arr + idx * unit;
        let start = idx << chunkbits;
        let round_size = ino.size.div_ceil(1 << bits) << bits;
        let len = cs.min(round_size - start);
        let (blk, dev) = if indexes {
            let mut b = [0u8; CHUNK_INDEX_SIZE];
            self.read_inode_meta(ino.nid, off, &mut b)?;
            let ci = ChunkIndex::parse(&b);
            let mask: u64 = if fmt & CHUNK_FORMAT_48BIT != 0 {
                (1 << 48) - 1
            } else {
                u64::from(u32::MAX)
            };
            let blk = ((u64::from(ci.startblk_hi) << 32) | u64::from(ci.startblk_lo)) & mask;
            if blk == mask {
                return Ok(Run {
                    start,
                    len,
                    src: Src::Hole,
                });
            }
            let devmask = (u32::from(self.sb.extra_devices) + 1).next_power_of_two() - 1;
            (blk, u32::from(ci.device_id) & devmask)
        } else {
            let mut b = [0u8; 4];
            self.read_inode_meta(ino.nid, off, &mut b)?;
            let blk = u32::from_le_bytes(b);
            if blk == BLOCK_MAP_HOLE {
                return Ok(Run {
                    start,
                    len,
                    src: Src::Hole,
                });
            }
            (u64::from(blk), 0)
        };
        let base = if dev == 0 {
            0
        } else {
            let d = self.devices.get(dev as usize - 1).ok_or_else(|| {
                corrupt(
                    CorruptKind::BadChunk,
                    Some(ino.nid),
                    Some(off),
                    Some(u64::from(dev)),
                    "chunk on a device that does not exist",
                )
            })?;
            d.uniaddr()
        };
        let phys = base
            .checked_add(blk)
            .and_then(|b| self.blk_pos(b))
            .ok_or_else(|| {
                corrupt(
                    CorruptKind::BadChunk,
                    Some(ino.nid),
                    Some(off),
                    Some(blk),
                    "chunk address overflows",
                )
            })?;
        if phys.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(corrupt(
                CorruptKind::BadChunk,
                Some(ino.nid),
                Some(off),
                Some(blk),
                "chunk beyond the end of the image",
            ));
        }
        Ok(Run {
            start,
            len,
            src: Src::Raw(phys),
        })
    }

    /// Read file data at `offset` into `buf`; returns the bytes read (short only at EOF).
    ///
    /// Safe to call from many threads at once. Compressed extents a read needs only in
    /// part are kept in the image's shared cache (see [`Image::set_cache_budget`]); for
    /// whole files, [`Image::read_at_with`] and a context per thread is cheaper.
    pub fn read_at(&self, ino: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let want = Self::clamp_read(ino, offset, buf.len());
        if want == 0 {
            return Ok(0);
        }
        if ino.layout.is_compressed() {
            return self.z_read_at(ino, offset, &mut buf[..want]);
        }
        self.flat_read(ino, offset, &mut buf[..want])
    }

    /// Like [`Image::read_at`], with a caller-owned context (keep one per thread and
    /// reuse it across files): compressed extents the read covers whole are decoded
    /// straight into `buf`, the one a read ends inside is kept in `ctx` for the next
    /// read, and nothing goes through the shared cache or its locks. For sequential
    /// whole-file reads (`extract`, `check`).
    pub fn read_at_with(
        &self,
        ctx: &mut ReadCtx,
        ino: &Inode,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let want = Self::clamp_read(ino, offset, buf.len());
        if want == 0 {
            return Ok(0);
        }
        if ino.layout.is_compressed() {
            return self.z_read(ctx, false, ino, offset, &mut buf[..want]);
        }
        self.flat_read(ino, offset, &mut buf[..want])
    }

    /// If logical offset `pos` lies in a hole of the file's mapping (chunks or extents
    /// with no data, or a flat file with no blocks), the end of that hole (consecutive
    /// holes merged, up to [`MAX_HOLE_RUNS`] of them per call). Data that merely decodes
    /// to zeros is not a hole.
    pub fn hole_end(&self, ctx: &mut ReadCtx, ino: &Inode, pos: u64) -> Result<Option<u64>> {
        let mut end = pos;
        for _ in 0..MAX_HOLE_RUNS {
            if end >= ino.size {
                break;
            }
            let next = if ino.layout.is_compressed() {
                self.z_hole_end(ctx, ino, end)
            } else {
                self.map_flat(ino, end).map(|run| match run.src {
                    Src::Hole => Some(run.start.saturating_add(run.len)),
                    _ => None,
                })
            };
            // A mapping that fails after a hole: the hole so far, and the error is the
            // next read's (callers read there, so it is not lost). Returning it now
            // would make a caller read the whole hole to reach it.
            let next = match next {
                Ok(n) => n,
                Err(_) if end > pos => break,
                Err(e) => return Err(e),
            };
            match next {
                Some(e) if e > end => end = e.min(ino.size),
                _ => break,
            }
        }
        Ok((end > pos).then_some(end))
    }

    /// `lseek(SEEK_DATA)`: the first offset at or after `pos` that is not in a hole,
    /// None when only holes follow (or `pos` is at or past the end). After
    /// [`MAX_SEEK_RUNS`] mapping runs the offset reached is called data (reads there
    /// return what is there: holes may always be reported as data).
    pub fn seek_data(&self, ctx: &mut ReadCtx, ino: &Inode, pos: u64) -> Result<Option<u64>> {
        let mut at = pos;
        // Each call merges up to MAX_HOLE_RUNS runs.
        for _ in 0..MAX_SEEK_RUNS / MAX_HOLE_RUNS {
            if at >= ino.size {
                return Ok(None);
            }
            match self.hole_end(ctx, ino, at)? {
                Some(e) if e > at => at = e,
                _ => return Ok(Some(at)),
            }
        }
        Ok(Some(at))
    }

    /// `lseek(SEEK_HOLE)`: the first offset at or after `pos` (< size) in a hole, or the
    /// size (the end of a file counts as a hole). After [`MAX_SEEK_RUNS`] runs of data
    /// the size is answered (the rest is then read as data, which it may be).
    pub fn seek_hole(&self, ctx: &mut ReadCtx, ino: &Inode, pos: u64) -> Result<u64> {
        let mut at = pos;
        for _ in 0..MAX_SEEK_RUNS {
            if at >= ino.size {
                return Ok(ino.size);
            }
            let (end, hole) = self.run_end(ctx, ino, at)?;
            if hole {
                return Ok(at);
            }
            at = end;
        }
        Ok(ino.size)
    }

    /// The mapping run that holds logical offset `pos` (< size): its end (at most the
    /// file size) and whether it is a hole. A run is one extent of a compressed file
    /// (data decoded together), one chunk or block run of a flat or chunk-based one.
    /// Lists a file's data and holes without reading data (e.g. for a tar sparse map),
    /// and says where reads can be cut without decoding an extent twice.
    pub fn run_end(&self, ctx: &mut ReadCtx, ino: &Inode, pos: u64) -> Result<(u64, bool)> {
        if pos >= ino.size {
            return Err(corrupt(
                CorruptKind::BadLayout,
                Some(ino.nid),
                Some(pos),
                Some(ino.size),
                "mapping asked beyond the end of the file",
            ));
        }
        let (end, hole) = if ino.layout.is_compressed() {
            self.z_run_end(ctx, ino, pos)?
        } else {
            let run = self.map_flat(ino, pos)?;
            (run.start.saturating_add(run.len), run.src == Src::Hole)
        };
        if end <= pos {
            return Err(corrupt(
                CorruptKind::BadLayout,
                Some(ino.nid),
                Some(pos),
                None,
                "empty mapping",
            ));
        }
        Ok((end.min(ino.size), hole))
    }

    /// Bytes a read of `len` at `offset` returns.
    fn clamp_read(ino: &Inode, offset: u64, len: usize) -> usize {
        if offset >= ino.size {
            return 0;
        }
        usize::try_from(ino.size - offset).map_or(len, |left| left.min(len))
    }

    fn flat_read(&self, ino: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let want = buf.len();
        let mut done = 0usize;
        // Bounded: every iteration makes progress of at least one byte.
        while done < want {
            let pos = offset + done as u64;
            let run = self.map_flat(ino, pos)?;
            let into = pos - run.start;
            let n = ((run.len - into) as usize).min(want - done);
            if n == 0 {
                return Err(corrupt(
                    CorruptKind::BadLayout,
                    Some(ino.nid),
                    Some(pos),
                    None,
                    "empty mapping",
                ));
            }
            let dst = &mut buf[done..done + n];
            match run.src {
                Src::Hole => dst.fill(0),
                Src::Raw(p) => self.read_raw(dst, p + into)?,
                Src::Inline(rel) => self.read_inode_meta(ino.nid, rel + into, dst)?,
            }
            done += n;
        }
        Ok(want)
    }

    /// Whole content of a file, refusing anything larger than `limit` bytes.
    pub fn read_to_vec_limited(&self, ino: &Inode, limit: u64) -> Result<Vec<u8>> {
        if ino.size > limit {
            return Err(corrupt(
                CorruptKind::BadInodeSize,
                Some(ino.nid),
                None,
                Some(ino.size),
                "larger than the caller's limit",
            ));
        }
        // Grown as the data arrives (READ_TO_VEC_STEP at a time), so a size the image
        // cannot back fails before it is allocated.
        let mut v: Vec<u8> = Vec::new();
        let mut ctx = ReadCtx::new();
        while (v.len() as u64) < ino.size {
            let at = v.len();
            let step = (ino.size - at as u64).min(READ_TO_VEC_STEP) as usize;
            v.resize(at + step, 0);
            let n = self.read_at_with(&mut ctx, ino, at as u64, &mut v[at..])?;
            if n != step {
                return Err(Error::short_read(ino.nid, (at + n) as u64, ino.size));
            }
        }
        Ok(v)
    }

    /// Whole content of a file (up to 1 GiB; use `read_at` for larger files).
    pub fn read_to_vec(&self, ino: &Inode) -> Result<Vec<u8>> {
        self.read_to_vec_limited(ino, 1 << 30)
    }

    /// Symlink target.
    pub fn read_link(&self, ino: &Inode) -> Result<Vec<u8>> {
        if !ino.is_symlink() {
            return Err(Error::WrongType {
                nid: ino.nid,
                what: "not a symlink",
            });
        }
        if ino.size > crate::limits::MAX_SYMLINK_LEN {
            return Err(corrupt(
                CorruptKind::BadInodeSize,
                Some(ino.nid),
                None,
                Some(ino.size),
                "symlink target longer than 4096",
            ));
        }
        self.read_to_vec_limited(ino, crate::limits::MAX_SYMLINK_LEN)
    }

    /// The physical extents of a file (for display).
    pub fn extents(&self, ino: &Inode) -> Result<Vec<Extent>> {
        if ino.layout.is_compressed() {
            return self.z_extents(ino);
        }
        let mut v = Vec::new();
        let mut pos = 0u64;
        while pos < ino.size && v.len() < MAX_EXTENTS_LISTED {
            let run = self.map_flat(ino, pos)?;
            let len = (run.start + run.len).min(ino.size) - pos;
            if len == 0 {
                break;
            }
            let (physical, kind) = match run.src {
                Src::Hole => (None, "hole"),
                Src::Raw(p) => (Some(p + (pos - run.start)), "plain"),
                Src::Inline(_) => (None, "inline"),
            };
            // Merge physically contiguous runs of the same kind.
            if let Some(last) = v.last_mut() {
                let l: &mut Extent = last;
                let contiguous = match (l.physical, physical) {
                    (Some(a), Some(b)) => a + l.length == b,
                    (None, None) => l.kind == kind,
                    _ => false,
                };
                if contiguous && l.kind == kind {
                    l.length += len;
                    l.stored += if physical.is_some() { len } else { 0 };
                    pos += len;
                    continue;
                }
            }
            v.push(Extent {
                logical: pos,
                length: len,
                physical,
                stored: if kind == "hole" { 0 } else { len },
                kind: kind.to_string(),
                fragment_offset: None,
            });
            pos += len;
        }
        Ok(v)
    }
}
