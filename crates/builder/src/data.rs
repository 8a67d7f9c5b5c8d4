//! Uncompressed file data (for stage 3, `place`): regular-file contents go to the data
//! region, file by file in inode order, block aligned, streamed (a file is never held
//! in memory whole). Holes found with SEEK_DATA/SEEK_HOLE become null chunks of a
//! chunk-based layout.

use crate::options::*;
use crate::out::Out;
use crate::source::{Reader, Source};
use std::fs::File;

/// Where a file's data went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileData {
    /// No data blocks (empty file, or everything inline).
    Empty,
    /// `nblocks` contiguous blocks from `startblk`; `tail` (if any) is to be inlined.
    Flat {
        startblk: u64,
        nblocks: u64,
        tail: crate::layout::Tail,
    },
    /// Chunk-based: chunk size = blksz << `chunk_rel`; block map (u32::MAX = hole),
    /// written as 8-byte chunk indexes when `indexes`, on device `device` (0: the
    /// image; 1: the `--blobdev` blob, always with indexes).
    Chunked {
        chunk_rel: u8,
        map: Vec<u32>,
        indexes: bool,
        device: u16,
    },
}

/// A failed read of a source file's data: a file that ends early shrank while it was
/// being read.
pub(crate) fn read_err(path: &std::path::Path, e: std::io::Error) -> BuildError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        BuildError::Invalid {
            path: path.to_path_buf(),
            what: "file shrank while it was being read".into(),
        }
    } else {
        io_err(path, "data: read")(e)
    }
}

/// Writes file data at increasing block numbers.
pub struct DataWriter<'a> {
    pub out: &'a mut Out,
    pub blkszbits: u8,
    pub next_blk: u64,
    pub buf: Vec<u8>,
    /// `--chunksize`: every file goes through it (chunk-based, deduplicated).
    pub chunks: Option<&'a mut crate::chunks::ChunkStore>,
    /// `--dsunit`: a file's first data block goes to a multiple of this many blocks
    /// (0 or 1: anywhere).
    pub align: u64,
}

/// `blk` rounded up to a multiple of `align` blocks (0 or 1: `blk`).
pub fn align_blk(blk: u64, align: u64) -> u64 {
    if align > 1 {
        blk.div_ceil(align).saturating_mul(align)
    } else {
        blk
    }
}

/// Move `next_blk` to a multiple of `align` blocks (`--dsunit`), the blocks skipped
/// cleared on a device.
pub fn align_next(out: &mut Out, next_blk: &mut u64, align: u64, bits: u8) -> Result<()> {
    let to = align_blk(*next_blk, align);
    out.clear_blocks(*next_blk, to, bits)?;
    *next_blk = to;
    Ok(())
}

const IO_CHUNK: usize = 1 << 20;

impl DataWriter<'_> {
    fn blksz(&self) -> u64 {
        1 << self.blkszbits
    }

    /// Copy `len` bytes of `f` from `off` to the next blocks (zero-padding the last one).
    fn copy(&mut self, f: &Reader, mut off: u64, len: u64) -> Result<u64> {
        let path = f.path();
        let start = self.next_blk;
        let mut pos = start << self.blkszbits;
        let end = off + len;
        self.buf.resize(IO_CHUNK, 0);
        while off < end {
            let n = (end - off).min(IO_CHUNK as u64) as usize;
            let buf = &mut self.buf[..n];
            f.read_exact_at(buf, off).map_err(|e| read_err(path, e))?;
            let padded = (n as u64).div_ceil(self.blksz()) * self.blksz();
            if padded as usize != n {
                self.buf.resize(padded as usize, 0);
                self.buf[n..].fill(0);
            }
            let chunk = std::mem::take(&mut self.buf);
            self.out.write_at(pos, &chunk[..padded as usize])?;
            self.buf = chunk;
            self.buf.resize(IO_CHUNK, 0);
            pos += padded;
            off += n as u64;
        }
        let nblocks = len.div_ceil(self.blksz());
        self.next_blk = start + nblocks;
        Ok(start)
    }

    /// Store one regular file. `inline_tail`: whether its tail may go behind the inode.
    pub fn store_file(&mut self, src: &Source, size: u64, inline_tail: bool) -> Result<FileData> {
        if size == 0 {
            return Ok(FileData::Empty);
        }
        let f = src.open(size)?;
        if let Some(cs) = self.chunks.as_deref_mut() {
            return cs.store(
                self.out,
                self.blkszbits,
                &mut self.next_blk,
                &f,
                size,
                inline_tail,
                self.align,
            );
        }
        let path = f.path();
        let bs = self.blksz();
        if let Some(segs) = f.segments() {
            if let Some(d) = self.store_chunked(&f, size, &segs)? {
                f.unchanged()?;
                return Ok(d);
            }
        }
        let tail_len = if inline_tail { size % bs } else { 0 };
        let body = size - tail_len;
        let startblk = if body > 0 {
            align_next(self.out, &mut self.next_blk, self.align, self.blkszbits)?;
            self.copy(&f, 0, body)?
        } else {
            0
        };
        let mut tail = vec![0u8; tail_len as usize];
        if tail_len > 0 {
            f.read_exact_at(&mut tail, body)
                .map_err(io_err(path, "data: read"))?;
        }
        f.unchanged()?;
        Ok(FileData::Flat {
            startblk,
            nblocks: body.div_ceil(bs),
            tail: self.out.keep_tail(tail)?,
        })
    }

    /// Store a whole file (no holes) from memory, as `store_file` would.
    pub fn store_bytes(&mut self, data: &[u8], inline_tail: bool) -> Result<FileData> {
        if data.is_empty() {
            return Ok(FileData::Empty);
        }
        let bs = self.blksz();
        let size = data.len() as u64;
        let tail_len = if inline_tail { size % bs } else { 0 };
        let (body, tail) = data.split_at((size - tail_len) as usize);
        let mut startblk = 0;
        if !body.is_empty() {
            align_next(self.out, &mut self.next_blk, self.align, self.blkszbits)?;
            startblk = self.next_blk;
            let padded = (body.len() as u64).div_ceil(bs) * bs;
            let whole = body.len() - body.len() % bs as usize;
            if whole > 0 {
                self.out
                    .write_at(startblk << self.blkszbits, &body[..whole])?;
            }
            if whole < body.len() {
                let mut last = vec![0u8; bs as usize];
                last[..body.len() - whole].copy_from_slice(&body[whole..]);
                self.out
                    .write_at((startblk << self.blkszbits) + whole as u64, &last)?;
            }
            self.next_blk += padded / bs;
        }
        Ok(FileData::Flat {
            startblk,
            nblocks: (body.len() as u64).div_ceil(bs),
            tail: self.out.keep_tail(tail.to_vec())?,
        })
    }

    /// Chunk-based layout when the file has holes of at least one chunk. Returns None
    /// when no chunk would be a hole (then a flat layout is better).
    fn store_chunked(
        &mut self,
        f: &Reader,
        size: u64,
        segs: &[(u64, u64)],
    ) -> Result<Option<FileData>> {
        let bits = self.blkszbits;
        let bs = self.blksz();
        let ext = block_extents(segs, bs);
        let rounded = size.div_ceil(bs) * bs;
        let rel = sparse_chunk_rel(&ext, size, bits, f.path())?;
        let cs = bs << rel;
        let nchunks = size.div_ceil(cs);
        let mut map = Vec::with_capacity(usize::try_from(nchunks).unwrap_or(0));
        let mut any_hole = false;
        let mut any_data = false;
        let mut k = 0usize;
        for c in 0..nchunks {
            let cstart = c * cs;
            let cend = (cstart + cs).min(rounded);
            while k < ext.len() && ext[k].1 <= cstart {
                k += 1;
            }
            let has_data = k < ext.len() && ext[k].0 < cend;
            if !has_data {
                any_hole = true;
                map.push(u32::MAX);
                continue;
            }
            let len = (cend.min(size)) - cstart;
            if !any_data {
                // The file's first data chunk.
                align_next(self.out, &mut self.next_blk, self.align, bits)?;
                any_data = true;
            }
            let blk = self.copy(f, cstart, len)?;
            let blk = u32::try_from(blk).map_err(|_| {
                BuildError::TooLarge("chunk block address beyond 2^32 blocks".into())
            })?;
            map.push(blk);
        }
        if !any_hole {
            // Undo: rewrite as flat (the blocks we wrote are contiguous anyway).
            let first = map.first().copied().unwrap_or(0);
            return Ok(Some(FileData::Flat {
                startblk: u64::from(first),
                nblocks: size.div_ceil(bs),
                tail: Default::default(),
            }));
        }
        Ok(Some(FileData::Chunked {
            chunk_rel: rel as u8,
            map,
            indexes: false,
            device: 0,
        }))
    }
}

/// A file's data segments widened to whole blocks of `bs` bytes.
pub(crate) fn block_extents(segs: &[(u64, u64)], bs: u64) -> Vec<(u64, u64)> {
    segs.iter()
        .map(|&(s, e)| (s / bs * bs, e.div_ceil(bs) * bs))
        .collect()
}

/// The chunk size for a sparse file with block-aligned data extents `ext`: the power
/// of two (`blksz << rel`, at least one block) that minimises what is stored, 4 bytes
/// of block map per chunk plus every chunk that holds any data, with at most
/// MAX_CHUNKS chunks (the map is built in memory). Returns (bytes stored, rel).
pub(crate) fn best_sparse_chunk(ext: &[(u64, u64)], size: u64, bits: u8) -> Option<(u64, u32)> {
    let bs = 1u64 << bits;
    let rounded = size.div_ceil(bs) * bs;
    let max_rel = 31u32.min(62 - u32::from(bits));
    let mut best: Option<(u64, u32)> = None;
    for rel in 0..=max_rel {
        let cs = bs << rel;
        let nchunks = size.div_ceil(cs);
        if nchunks > MAX_CHUNKS {
            continue;
        }
        let mut data_chunks = 0u64;
        let mut last: Option<u64> = None;
        for &(s, e) in ext {
            let (a, b) = (s / cs, (e - 1) / cs);
            let a = match last {
                Some(l) if l >= a => l + 1,
                _ => a,
            };
            if b >= a {
                data_chunks += b - a + 1;
            }
            last = Some(last.map_or(b, |l| l.max(b)));
        }
        let cost = nchunks * 4 + data_chunks * cs;
        if best.is_none_or(|(c, _)| cost < c) {
            best = Some((cost, rel));
        }
        if cs >= rounded {
            break;
        }
    }
    best
}

/// [`best_sparse_chunk`] for a file, or an error naming it when even that stores more
/// than sensible bounds: at most MAX_CHUNKS chunks, and at most MAX_SPARSE_STORED bytes
/// or 16 times the data.
pub(crate) fn sparse_chunk_rel(
    ext: &[(u64, u64)],
    size: u64,
    bits: u8,
    path: &std::path::Path,
) -> Result<u32> {
    let best = best_sparse_chunk(ext, size, bits);
    let data: u64 = ext.iter().map(|&(s, e)| e - s).sum();
    match best.filter(|&(cost, _)| cost <= MAX_SPARSE_STORED.max(data.saturating_mul(16))) {
        Some((_, rel)) => Ok(rel),
        // A file of holes so large that EROFS's chunk map (or the zeros its chunks
        // would store around the data) does not fit sensible bounds: e.g. 512 PiB of
        // hole around a few bytes, which a corrupt image or an XFS sparse file can
        // claim.
        None => Err(BuildError::TooLarge(format!(
            "{}: a sparse file of {size} bytes with {data} bytes of data: its chunk map \
             and stored chunks would take {} bytes (at most {MAX_CHUNKS} chunks, and at most \
             {MAX_SPARSE_STORED} bytes or 16 times the data)",
            path.display(),
            best.map_or(u64::MAX, |(c, _)| c)
        ))),
    }
}

/// Most chunks a chunk-based file may have (its map is held in memory: 64 MiB).
const MAX_CHUNKS: u64 = 1 << 24;
/// What a sparse file's chunk map and data chunks may store beyond 16 times its data.
const MAX_SPARSE_STORED: u64 = 1 << 30;

/// Data segments [start, end) of a file by SEEK_DATA/SEEK_HOLE, or None when the file
/// has no hole (or the filesystem cannot tell).
pub fn data_segments(f: &File, size: u64) -> Option<Vec<(u64, u64)>> {
    use rustix::fs::{seek, SeekFrom};
    let first_hole = seek(f, SeekFrom::Hole(0)).ok()?;
    if first_hole >= size {
        return None;
    }
    let mut segs = Vec::new();
    let mut pos = 0u64;
    // Bounded by the number of data segments, each iteration advances pos.
    while pos < size {
        let d = match seek(f, SeekFrom::Data(pos)) {
            Ok(d) => d,
            Err(_) => break, // ENXIO: no more data
        };
        if d >= size {
            break;
        }
        let h = seek(f, SeekFrom::Hole(d)).ok()?.min(size);
        if h <= d {
            return None;
        }
        segs.push((d, h));
        pos = h;
    }
    Some(segs)
}
