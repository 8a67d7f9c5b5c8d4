//! `--chunksize` (for stage 3, `place`, uncompressed images): every regular file is
//! chunk-based. Its data is cut into chunks of the given size; a chunk that holds only
//! holes or zeros is stored as a hole (no blocks), and a chunk equal to one stored
//! before (same xxh3-64 of length and bytes, then the same bytes, compared with what
//! the image holds) points at that one instead of being written again. Then runs of chunks
//! that lie one after another on disk (or are all holes) merge into bigger chunks, so
//! a file stored in one piece takes one chunk entry, not one per chunk. Files are
//! stored in inode order, one at a time: the image does not depend on the thread count.

use crate::data::FileData;
use crate::options::*;
use crate::out::Out;
use crate::source::Reader;
use rustc_hash::FxHashMap as HashMap;
use xxhash_rust::xxh3::Xxh3;

/// Most chunks remembered for dedupe (16 bytes each and the table's overhead: about
/// 40 MiB). Past it, new chunks are still stored, only not offered to later files.
const MAX_REMEMBERED: usize = 1 << 21;
/// Most chunks one file may have: the chunk size grows for a file that would have more
/// (its map is built in memory; 2^24 entries take 64 MiB).
const MAX_CHUNKS: u64 = 1 << 24;
/// Reads and compares go in pieces of at most this much.
const PIECE: usize = 1 << 20;
/// Hole marker of a block map entry (and of a 32-bit chunk index).
const HOLE: u32 = u32::MAX;

/// What became of one chunk.
enum Chunk {
    /// Written now at this block.
    New(u32),
    /// Equal to the chunk stored at this block.
    Shared(u32),
    /// Zeros or holes only.
    Hole,
    /// The file's last chunk, written but for these bytes (its inline tail).
    Tail(Vec<u8>),
}

/// The chunks of one build.
pub struct ChunkStore {
    opts: ChunkOptions,
    /// Hash of a stored chunk's length and bytes -> its first block. (A hash match is
    /// only a candidate: the bytes are compared.)
    seen: HashMap<u64, u32>,
    buf: Vec<u8>,
    cmp: Vec<u8>,
    /// New chunk bytes not written yet, for image offset `pending_at`.
    pending: Vec<u8>,
    pending_at: u64,
    /// Bytes of chunks that point at a chunk stored before.
    pub deduped: u64,
    /// Bytes of data chunks that held only zeros (stored as holes).
    pub zeros: u64,
    /// The device the chunks go to: 0 the image; 1 a `--blobdev` blob, where every
    /// file is chunk-indexed (no flat files, no inline tails: those live in the image).
    device: u16,
}

impl ChunkStore {
    pub fn new(opts: ChunkOptions) -> Self {
        ChunkStore {
            opts,
            seen: HashMap::default(),
            buf: Vec::new(),
            cmp: Vec::new(),
            pending: Vec::new(),
            pending_at: 0,
            deduped: 0,
            zeros: 0,
            device: 0,
        }
    }

    /// Chunks for an extra device (`--blobdev`): written from its block 0 by the
    /// caller's `out`, every file chunk-indexed on device 1.
    pub fn for_blob(opts: ChunkOptions) -> Self {
        ChunkStore {
            opts: ChunkOptions {
                indexes: true,
                ..opts
            },
            device: 1,
            ..ChunkStore::new(opts)
        }
    }

    /// Store a regular file of `size` (> 0) bytes from `f`, writing new chunks from
    /// block `*next_blk` on. A file whose chunks all turn out new (none shared, none a
    /// hole) lies in one piece: it is stored flat instead, its tail behind the inode
    /// when `inline_tail` (a chunk-based inode has no inline tail, so small files would
    /// otherwise take a block each). The file's first new chunk starts at a multiple of
    /// `align` blocks (`--dsunit`).
    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &mut self,
        out: &mut Out,
        bits: u8,
        next_blk: &mut u64,
        f: &Reader,
        size: u64,
        inline_tail: bool,
        align: u64,
    ) -> Result<FileData> {
        let r = self.store_chunks(out, bits, next_blk, f, size, inline_tail, align);
        // Whatever happened, what was written reaches the image before anyone else
        // writes or reads it.
        self.flush(out)?;
        r
    }

    /// New chunks of a file lie one after another: they go out in writes of up to
    /// PIECE bytes, not one a chunk.
    fn put(&mut self, out: &mut Out, pos: u64, data: &[u8]) -> Result<()> {
        let joins = self.pending_at + self.pending.len() as u64 == pos;
        if !joins || self.pending.len() + data.len() > PIECE {
            self.flush(out)?;
        }
        if self.pending.is_empty() {
            self.pending_at = pos;
        }
        if data.len() >= PIECE {
            return out.write_at(pos, data);
        }
        self.pending.extend_from_slice(data);
        Ok(())
    }

    fn flush(&mut self, out: &mut Out) -> Result<()> {
        if !self.pending.is_empty() {
            out.write_at(self.pending_at, &self.pending)?;
            self.pending.clear();
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn store_chunks(
        &mut self,
        out: &mut Out,
        bits: u8,
        next_blk: &mut u64,
        f: &Reader,
        size: u64,
        inline_tail: bool,
        mut align: u64,
    ) -> Result<FileData> {
        let path = f.path();
        let bs = 1u64 << bits;
        let segs = f.segments();
        // The chunk size asked for, or bigger when the file would need too many; for a
        // sparse file, smaller when that stores less (chunks around a little data in a
        // wide hole would store the hole's zeros).
        let mut cbits = u32::from(self.opts.bits).max(u32::from(bits));
        let max_bits = u32::from(bits) + 31;
        while cbits < max_bits && size.div_ceil(1 << cbits) > MAX_CHUNKS {
            cbits += 1;
        }
        if let Some(s) = &segs {
            let ext = crate::data::block_extents(s, bs);
            let rel = crate::data::sparse_chunk_rel(&ext, size, bits, path)?;
            cbits = cbits.min(u32::from(bits) + rel);
        }
        let cs = 1u64 << cbits;
        let n = size.div_ceil(cs);
        if n > MAX_CHUNKS {
            return Err(BuildError::TooLarge(format!(
                "{}: {size} bytes take more than {MAX_CHUNKS} chunks",
                path.display()
            )));
        }
        let tail_len = if inline_tail && self.device == 0 {
            size % bs
        } else {
            0
        };
        // Every chunk so far written now, one after another.
        let mut fresh = true;
        let mut map: Vec<u32> = Vec::with_capacity(n as usize);
        let mut seg = 0usize;
        // Bounded: one pass per chunk (at most MAX_CHUNKS).
        for c in 0..n {
            let start = c * cs;
            let end = (start + cs).min(size);
            let has_data = match &segs {
                None => true,
                Some(s) => {
                    while seg < s.len() && s[seg].1 <= start {
                        seg += 1;
                    }
                    seg < s.len() && s[seg].0 < end
                }
            };
            let keep = if fresh && c + 1 == n { tail_len } else { 0 };
            let got = if has_data {
                self.chunk(out, bits, next_blk, f, start, end - start, keep, align)?
            } else {
                Chunk::Hole
            };
            if matches!(got, Chunk::New(_) | Chunk::Tail(_)) {
                // `--dsunit`: the file's first written chunk is aligned, the rest
                // follow it.
                align = 0;
            }
            match got {
                Chunk::New(b) => map.push(b),
                Chunk::Shared(b) => {
                    fresh = false;
                    map.push(b);
                }
                Chunk::Hole => {
                    fresh = false;
                    map.push(HOLE);
                }
                Chunk::Tail(tail) => {
                    f.unchanged()?;
                    // Every chunk was written, one after another, up to here.
                    let nblocks = (size - tail_len) / bs;
                    return Ok(FileData::Flat {
                        startblk: if nblocks > 0 { *next_blk - nblocks } else { 0 },
                        nblocks,
                        tail: out.keep_tail(tail)?,
                    });
                }
            }
        }
        f.unchanged()?;
        if fresh && self.device == 0 {
            return Ok(FileData::Flat {
                startblk: *next_blk - size.div_ceil(bs),
                nblocks: size.div_ceil(bs),
                tail: Default::default(),
            });
        }
        let base_rel = (cbits - u32::from(bits)) as u8;
        let (chunk_rel, map) = merge(map, base_rel);
        Ok(FileData::Chunked {
            chunk_rel,
            map,
            indexes: self.opts.indexes,
            device: self.device,
        })
    }

    /// One chunk of `len` bytes at `start` of `f`: a hole when it holds only zeros,
    /// else the chunk stored before that it equals, else stored now. With `keep` > 0
    /// (the file's last chunk, its tail to go inline), a new chunk is written but for
    /// its last `keep` bytes, which come back, and is not offered to later files. A
    /// chunk written now starts at a multiple of `align` blocks (`--dsunit`).
    #[allow(clippy::too_many_arguments)]
    fn chunk(
        &mut self,
        out: &mut Out,
        bits: u8,
        next_blk: &mut u64,
        f: &Reader,
        start: u64,
        len: u64,
        keep: u64,
        align: u64,
    ) -> Result<Chunk> {
        let path = f.path();
        let read = |buf: &mut [u8], off: u64| {
            f.read_exact_at(buf, off)
                .map_err(|e| crate::data::read_err(path, e))
        };
        // A chunk up to PIECE bytes stays in `buf`; a bigger one is read again to be
        // written or compared.
        let whole = len <= PIECE as u64;
        self.buf.resize(PIECE.min(len as usize), 0);
        let mut h = Xxh3::new();
        let mut zero = true;
        let mut at = 0u64;
        // Bounded: each pass reads up to PIECE bytes of the chunk.
        while at < len {
            let k = (len - at).min(PIECE as u64) as usize;
            read(&mut self.buf[..k], start + at)?;
            zero = zero && self.buf[..k].iter().all(|&b| b == 0);
            h.update(&self.buf[..k]);
            at += k as u64;
        }
        if zero {
            self.zeros += len;
            return Ok(Chunk::Hole);
        }
        // Chunks of one build have one size but a file's last: the length is hashed.
        h.update(&len.to_le_bytes());
        let key = h.digest();
        if self.opts.dedupe {
            if let Some(&blk) = self.seen.get(&key) {
                // The chunk it matched may still be waiting to be written.
                self.flush(out)?;
                if self.same_as_stored(out, bits, blk, start, len, whole, &read)? {
                    self.deduped += len;
                    return Ok(Chunk::Shared(blk));
                }
            }
        }
        if len > keep {
            crate::data::align_next(out, next_blk, align, bits)?;
        }
        let blk = u32::try_from(*next_blk)
            .ok()
            .filter(|&b| b != HOLE)
            .ok_or_else(|| BuildError::TooLarge("chunk block address beyond 2^32 blocks".into()))?;
        let bs = 1u64 << bits;
        let body = len - keep;
        let mut pos = *next_blk << bits;
        if whole {
            let mut tail = Vec::new();
            if keep > 0 {
                tail = self.buf[body as usize..len as usize].to_vec();
            }
            let padded = body.div_ceil(bs) * bs;
            self.buf.resize(padded.max(len) as usize, 0);
            self.buf[body as usize..padded as usize].fill(0);
            if padded > 0 {
                let b = std::mem::take(&mut self.buf);
                let r = self.put(out, pos, &b[..padded as usize]);
                self.buf = b;
                r?;
            }
            *next_blk += body.div_ceil(bs);
            if keep > 0 {
                return Ok(Chunk::Tail(tail));
            }
        } else {
            let mut at = 0u64;
            // Bounded as above; PIECE is a multiple of every block size.
            while at < body {
                let k = (body - at).min(PIECE as u64) as usize;
                read(&mut self.buf[..k], start + at)?;
                let padded = (k as u64).div_ceil(bs) * bs;
                self.buf.resize(padded.max(PIECE as u64) as usize, 0);
                self.buf[k..padded as usize].fill(0);
                let b = std::mem::take(&mut self.buf);
                let r = self.put(out, pos, &b[..padded as usize]);
                self.buf = b;
                r?;
                pos += padded;
                at += k as u64;
            }
            *next_blk += body.div_ceil(bs);
            if keep > 0 {
                let mut tail = vec![0u8; keep as usize];
                read(&mut tail, start + body)?;
                return Ok(Chunk::Tail(tail));
            }
        }
        if self.opts.dedupe && self.seen.len() < MAX_REMEMBERED {
            self.seen.entry(key).or_insert(blk);
        }
        Ok(Chunk::New(blk))
    }

    /// Whether the chunk of `len` bytes at `start` of the file (`read`) equals the one stored at
    /// block `blk` (a hash match, checked byte for byte).
    #[allow(clippy::too_many_arguments)]
    fn same_as_stored(
        &mut self,
        out: &Out,
        bits: u8,
        blk: u32,
        start: u64,
        len: u64,
        whole: bool,
        read: &dyn Fn(&mut [u8], u64) -> Result<()>,
    ) -> Result<bool> {
        let base = u64::from(blk) << bits;
        let mut at = 0u64;
        self.cmp.resize(PIECE.min(len as usize), 0);
        // Bounded: each pass compares up to PIECE bytes.
        while at < len {
            let k = (len - at).min(PIECE as u64) as usize;
            out.read_at(base + at, &mut self.cmp[..k])?;
            if !whole {
                read(&mut self.buf[..k], start + at)?;
            }
            let mine = if whole {
                &self.buf[at as usize..at as usize + k]
            } else {
                &self.buf[..k]
            };
            if mine != &self.cmp[..k] {
                return Ok(false);
            }
            at += k as u64;
        }
        Ok(true)
    }
}

/// Merge runs of chunks: the biggest chunk size (at most 2^31 blocks) at which every
/// chunk is all holes or lies contiguously on disk. Returns the new `chunk_rel` and map.
fn merge(map: Vec<u32>, rel: u8) -> (u8, Vec<u32>) {
    let mergeable = |m: u32| -> bool {
        let group = 1usize << m;
        let per = 1u64 << rel;
        map.chunks(group).all(|g| {
            if g[0] == HOLE {
                return g.iter().all(|&b| b == HOLE);
            }
            g.iter()
                .enumerate()
                .all(|(i, &b)| b != HOLE && u64::from(b) == u64::from(g[0]) + i as u64 * per)
        })
    };
    let mut m = 0u32;
    // Bounded: at most 31 - rel steps.
    while u32::from(rel) + m < 31 && (1usize << m) < map.len() && mergeable(m + 1) {
        m += 1;
    }
    if m == 0 {
        return (rel, map);
    }
    let merged = map.chunks(1 << m).map(|g| g[0]).collect();
    (rel + m as u8, merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_joins_contiguous_runs_and_holes_only() {
        // Four chunks of one block each, contiguous: one chunk of four blocks.
        assert_eq!(merge(vec![10, 11, 12, 13], 0), (2, vec![10]));
        // Three contiguous (the last group short): one chunk of four blocks.
        assert_eq!(merge(vec![10, 11, 12], 0), (2, vec![10]));
        // A deduped chunk in the middle: pairs where they stay contiguous.
        assert_eq!(merge(vec![10, 11, 4, 5], 0), (1, vec![10, 4]));
        assert_eq!(merge(vec![10, 11, 5, 6, 12], 0), (1, vec![10, 5, 12]));
        // A hole beside data does not merge with it.
        assert_eq!(
            merge(vec![10, HOLE, 11, 12], 0),
            (0, vec![10, HOLE, 11, 12])
        );
        assert_eq!(merge(vec![HOLE, HOLE, 7, 8], 0), (1, vec![HOLE, 7]));
        // All holes: one chunk.
        assert_eq!(merge(vec![HOLE; 5], 1), (4, vec![HOLE]));
        // Contiguity counts in the chunk's own blocks (rel 2: 4 blocks a chunk).
        assert_eq!(merge(vec![0, 4, 8, 12], 2), (4, vec![0]));
        assert_eq!(merge(vec![0, 1, 2, 3], 2), (2, vec![0, 1, 2, 3]));
        // Never past 2^31 blocks a chunk.
        assert_eq!(merge(vec![0, 1 << 30], 30), (31, vec![0]));
        assert_eq!(merge(vec![0, 1 << 31, 0], 31), (31, vec![0, 1 << 31, 0]));
        // A single chunk stays as it is.
        assert_eq!(merge(vec![3], 0), (0, vec![3]));
    }
}
