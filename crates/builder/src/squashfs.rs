//! SquashFS (4.0, little-endian) input: an image read directly, rootless, with no
//! temporary tree. Its metadata (inodes, directories, ids, xattrs, the fragment table)
//! becomes a [`Tree`]. A regular file with data blocks becomes a [`SquashFile`]
//! source: the build's workers decode the blocks a read covers as they read it (sparse
//! blocks stay holes). The tails SquashFS keeps in fragment blocks are decoded into one
//! spool file beside the output (all worker threads, the same bytes for any thread
//! count); a file of a tail only is a byte range of it ([`Source::Range`]). Hardlinks
//! are inodes with the same inode number; files SquashFS deduplicated (same blocks)
//! share one source.
//!
//! Compressors: gzip (zlib), lzo, xz, lz4, zstd. The old lzma compressor (id 2) is
//! refused. Every count, offset and length read from the image is checked against the
//! image's size, and every loop is bounded by a count the superblock or an inode gives.

use crate::options::*;
use crate::scan::{fix_nlinks, InodeId, Kind, Node, Tree};
use crate::source::Source;
use ferofs_format::inode::*;
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The magic at byte 0 of a SquashFS image.
pub const MAGIC: &[u8; 4] = b"hsqs";

/// Whether the file at `path` starts with the SquashFS magic.
pub fn is_squashfs(path: &Path) -> bool {
    let mut m = [0u8; 4];
    File::open(path)
        .and_then(|f| f.read_exact_at(&mut m, 0))
        .is_ok_and(|_| &m == MAGIC)
}

/// What a SquashFS scan holds on to until the image is written: the spool file.
pub struct SquashTree {
    pub tree: Tree,
    pub spool: tempfile::NamedTempFile,
}

const META_SIZE: usize = 8192;
const NO_FRAGMENT: u32 = 0xffff_ffff;
const NOT_SET: u64 = u64::MAX;
/// Deepest directory nesting accepted.
const MAX_DEPTH: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Comp {
    Gzip,
    Lzo,
    Xz,
    Lz4,
    Zstd,
}

struct Sb {
    inode_count: u32,
    block_size: u32,
    frag_count: u32,
    comp: Comp,
    flags: u16,
    id_count: u16,
    root_inode: u64,
    bytes_used: u64,
    id_table: u64,
    xattr_table: u64,
    inode_table: u64,
    dir_table: u64,
    frag_table: u64,
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn le64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// A table of fixed-size entries in metadata blocks, found through an index of block
/// pointers at `index`, read entry by entry ([`Img::table_entry`]): its count comes from
/// the superblock, so a hostile image may declare billions of entries that no file uses,
/// and reading it whole would allocate for all of them.
struct Table {
    index: u64,
    count: u64,
    entry: usize,
    what: &'static str,
}

/// The image file and its superblock: what reading and decoding a block needs,
/// shared with the files whose data blocks are read during the build ([`SquashFile`]).
struct Data {
    f: File,
    path: PathBuf,
    sb: Sb,
}

struct Img {
    data: Arc<Data>,
    /// Metadata blocks read so far: absolute position -> (contents, next block's position).
    meta: HashMap<u64, (Arc<Vec<u8>>, u64)>,
    /// Decoded bytes in `meta`; past [`META_CACHE_MAX`] it starts again empty.
    meta_bytes: usize,
}

impl std::ops::Deref for Img {
    type Target = Data;
    fn deref(&self) -> &Data {
        &self.data
    }
}

/// Most decoded metadata kept (the inode and directory tables of a large distribution
/// image take a few MiB): a hostile image whose metadata blocks decode to 8 KiB from a
/// few bytes each cannot make the cache grow with them.
const META_CACHE_MAX: usize = 64 << 20;

impl Data {
    fn bad(&self, what: String) -> BuildError {
        BuildError::Invalid {
            path: self.path.clone(),
            what: format!("squashfs: {what}"),
        }
    }

    fn read_at(&self, pos: u64, len: usize, what: &str) -> Result<Vec<u8>> {
        let end = pos
            .checked_add(len as u64)
            .filter(|&e| e <= self.sb.bytes_used)
            .ok_or_else(|| {
                self.bad(format!(
                    "{what} at byte {pos} (+{len}) lies beyond the image's end ({})",
                    self.sb.bytes_used
                ))
            })?;
        let _ = end;
        let mut v = vec![0u8; len];
        self.f.read_exact_at(&mut v, pos).map_err(|e| {
            self.bad(format!(
                "{what} at byte {pos} (+{len}): {e} (truncated image?)"
            ))
        })?;
        Ok(v)
    }

    fn decompress(&self, data: &[u8], max: usize, at: u64) -> Result<Vec<u8>> {
        let fail = |e: String| self.bad(format!("{:?} block at byte {at}: {e}", self.sb.comp));
        let out = match self.sb.comp {
            Comp::Gzip => {
                let mut v = Vec::with_capacity(max);
                flate2::read::ZlibDecoder::new(data)
                    .take(max as u64 + 1)
                    .read_to_end(&mut v)
                    .map_err(|e| fail(e.to_string()))?;
                v
            }
            Comp::Xz => {
                let mut v = Vec::with_capacity(max);
                liblzma::read::XzDecoder::new(data)
                    .take(max as u64 + 1)
                    .read_to_end(&mut v)
                    .map_err(|e| fail(e.to_string()))?;
                v
            }
            Comp::Zstd => zstd::bulk::decompress(data, max).map_err(|e| fail(e.to_string()))?,
            Comp::Lz4 => {
                let mut v = vec![0u8; max];
                let n = lz4_flex::block::decompress_into(data, &mut v)
                    .map_err(|e| fail(e.to_string()))?;
                v.truncate(n);
                v
            }
            Comp::Lzo => crate::lzo::decompress(data, max).map_err(|e| fail(e.into()))?,
        };
        if out.len() > max {
            return Err(fail(format!("decodes to more than {max} bytes")));
        }
        Ok(out)
    }

    /// The data or fragment block at `pos` whose size word is `word` (the stored length
    /// in its low 24 bits, bit 24 set when it is stored uncompressed), decoded.
    fn block(&self, pos: u64, word: u32, what: &str) -> Result<Vec<u8>> {
        let raw = self.read_at(pos, (word & 0x00ff_ffff) as usize, what)?;
        if word & (1 << 24) != 0 {
            Ok(raw)
        } else {
            self.decompress(&raw, self.sb.block_size as usize, pos)
        }
    }
}

impl Img {
    /// The metadata block at absolute `pos`: its contents and the next block's position.
    fn meta_block(&mut self, pos: u64) -> Result<(Arc<Vec<u8>>, u64)> {
        if let Some(b) = self.meta.get(&pos) {
            return Ok(b.clone());
        }
        let h = self.read_at(pos, 2, "metadata block header")?;
        let h = le16(&h, 0);
        let len = (h & 0x7fff) as usize;
        if len == 0 || len > META_SIZE {
            return Err(self.bad(format!("metadata block at byte {pos}: bad length {len}")));
        }
        let raw = self.read_at(pos + 2, len, "metadata block")?;
        let data = if h & 0x8000 != 0 {
            raw
        } else {
            self.decompress(&raw, META_SIZE, pos)?
        };
        let next = pos + 2 + len as u64;
        let b = (Arc::new(data), next);
        if self.meta_bytes > META_CACHE_MAX {
            self.meta.clear();
            self.meta_bytes = 0;
        }
        self.meta_bytes += b.0.len();
        self.meta.insert(pos, b.clone());
        Ok(b)
    }

    /// `len` bytes of metadata from block `blk` (absolute), offset `off`; returns them
    /// and the position after them.
    fn meta_read(
        &mut self,
        mut blk: u64,
        mut off: usize,
        len: usize,
    ) -> Result<(Vec<u8>, u64, usize)> {
        let mut out = Vec::with_capacity(len);
        // Bounded: each round consumes at least one byte or fails.
        while out.len() < len {
            let (b, next) = self.meta_block(blk)?;
            if off >= b.len() {
                if off == b.len() {
                    blk = next;
                    off = 0;
                    continue;
                }
                return Err(self.bad(format!(
                    "metadata reference {blk}:{off} past its block's {} bytes",
                    b.len()
                )));
            }
            let n = (len - out.len()).min(b.len() - off);
            out.extend_from_slice(&b[off..off + n]);
            off += n;
            if off == b.len() {
                blk = next;
                off = 0;
            }
        }
        Ok((out, blk, off))
    }

    /// Entry `i` of table `t`, looked up alone: one pointer of the table's index, one
    /// metadata block (cached). Entries of 4 and 16 bytes never straddle a block.
    fn table_entry(&mut self, t: &Table, i: u64) -> Result<Vec<u8>> {
        if i >= t.count {
            return Err(self.bad(format!("{}: entry {i} of {}", t.what, t.count)));
        }
        // i < count <= u32::MAX and entry <= 16: no overflow.
        let off = i * t.entry as u64;
        let blk = off / META_SIZE as u64;
        let within = (off % META_SIZE as u64) as usize;
        let ptr = blk
            .checked_mul(8)
            .and_then(|o| t.index.checked_add(o))
            .ok_or_else(|| self.bad(format!("{}: index at byte {} overflows", t.what, t.index)))?;
        let p = self.read_at(ptr, 8, t.what)?;
        let (b, _) = self.meta_block(le64(&p, 0))?;
        b.get(within..within + t.entry)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| {
                self.bad(format!(
                    "{}: entry {i} past its metadata block's {} bytes",
                    t.what,
                    b.len()
                ))
            })
    }
}

fn superblock(f: &File, path: &Path) -> Result<Sb> {
    let bad = |what: String| BuildError::Invalid {
        path: path.to_path_buf(),
        what: format!("squashfs: {what}"),
    };
    let len = ferofs_reader::source::file_len(f).map_err(io_err(path, "squashfs: stat"))?;
    let mut b = [0u8; 96];
    f.read_exact_at(&mut b, 0)
        .map_err(|e| bad(format!("superblock: {e} (image of {len} bytes)")))?;
    if &b[0..4] != MAGIC {
        return Err(bad("no SquashFS magic (hsqs) at byte 0".into()));
    }
    let (major, minor) = (le16(&b, 28), le16(&b, 30));
    if (major, minor) != (4, 0) {
        return Err(bad(format!("version {major}.{minor}; only 4.0 is read")));
    }
    let comp = match le16(&b, 20) {
        1 => Comp::Gzip,
        3 => Comp::Lzo,
        4 => Comp::Xz,
        5 => Comp::Lz4,
        6 => Comp::Zstd,
        2 => return Err(bad("the lzma compressor (id 2) is not supported".into())),
        c => return Err(bad(format!("unknown compressor id {c}"))),
    };
    let block_size = le32(&b, 12);
    let block_log = le16(&b, 22);
    if !(12..=20).contains(&block_log) || block_size != 1 << block_log {
        return Err(bad(format!(
            "block size {block_size} (log {block_log}) is not a power of two in 4K..1M"
        )));
    }
    let sb = Sb {
        inode_count: le32(&b, 4),
        block_size,
        frag_count: le32(&b, 16),
        comp,
        flags: le16(&b, 24),
        id_count: le16(&b, 26),
        root_inode: le64(&b, 32),
        bytes_used: le64(&b, 40),
        id_table: le64(&b, 48),
        xattr_table: le64(&b, 56),
        inode_table: le64(&b, 64),
        dir_table: le64(&b, 72),
        frag_table: le64(&b, 80),
    };
    if sb.bytes_used > len {
        return Err(bad(format!(
            "truncated: the superblock says {} bytes, the file has {len}",
            sb.bytes_used
        )));
    }
    for (name, t) in [
        ("inode table", sb.inode_table),
        ("directory table", sb.dir_table),
        ("id table", sb.id_table),
    ] {
        if t >= sb.bytes_used {
            return Err(bad(format!("{name} at byte {t}, past the image's end")));
        }
    }
    Ok(sb)
}

/// One inode, as read.
struct SqInode {
    kind: SqKind,
    mode: u16,
    uid: u32,
    gid: u32,
    mtime: u32,
    number: u32,
    xattr: u32,
}

/// Where a regular file's data is.
struct FileLoc {
    start: u64,
    size: u64,
    frag: u32,
    frag_off: u32,
    /// Size words of the data blocks; shared with the file's [`SquashFile`] and its
    /// dedupe key.
    blocks: Arc<[u32]>,
}

/// Where a directory's listing is: (start block, offset, size).
type DirLoc = (u32, u16, u32);

type DedupeKey = (u64, u64, u32, u32, Arc<[u32]>);

enum SqKind {
    Dir { start: u32, offset: u16, size: u32 },
    File(FileLoc),
    Symlink(Vec<u8>),
    Device(u32),
    Fifo,
    Socket,
}

/// Read the inode at metadata reference `r` (block << 16 | offset, block relative to
/// the inode table).
fn read_inode(img: &mut Img, r: u64, ids: &[u32]) -> Result<SqInode> {
    let blk = img
        .sb
        .inode_table
        .checked_add(r >> 16)
        .ok_or_else(|| img.bad(format!("inode reference {r:#x}")))?;
    let off = (r & 0xffff) as usize;
    let (h, blk, off) = img.meta_read(blk, off, 16)?;
    let ty = le16(&h, 0);
    let perm = le16(&h, 2) & 0o7777;
    let id = |i: u16| -> Result<u32> {
        ids.get(i as usize)
            .copied()
            .ok_or_else(|| img.bad(format!("inode {r:#x}: id index {i} out of the id table")))
    };
    let (uid, gid) = (id(le16(&h, 4))?, id(le16(&h, 6))?);
    let mtime = le32(&h, 8);
    let number = le32(&h, 12);
    let bs = img.sb.block_size as u64;
    let mut xattr = NO_FRAGMENT;
    let file_blocks = |size: u64, frag: u32| -> u64 {
        if frag == NO_FRAGMENT {
            size.div_ceil(bs)
        } else {
            size / bs
        }
    };
    let (kind, fmt) = match ty {
        1 | 8 => {
            let (start, offset, size) = if ty == 1 {
                let (b, _, _) = img.meta_read(blk, off, 16)?;
                (le32(&b, 0), le16(&b, 10), le16(&b, 8) as u32)
            } else {
                let (b, _, _) = img.meta_read(blk, off, 24)?;
                xattr = le32(&b, 20);
                (le32(&b, 8), le16(&b, 18), le32(&b, 4))
            };
            (
                SqKind::Dir {
                    start,
                    offset,
                    size,
                },
                S_IFDIR,
            )
        }
        2 | 9 => {
            let (start, size, frag, frag_off, blk, off) = if ty == 2 {
                let (b, blk, off) = img.meta_read(blk, off, 16)?;
                (
                    le32(&b, 0) as u64,
                    le32(&b, 12) as u64,
                    le32(&b, 4),
                    le32(&b, 8),
                    blk,
                    off,
                )
            } else {
                let (b, blk, off) = img.meta_read(blk, off, 40)?;
                xattr = le32(&b, 36);
                (
                    le64(&b, 0),
                    le64(&b, 8),
                    le32(&b, 28),
                    le32(&b, 32),
                    blk,
                    off,
                )
            };
            let n = file_blocks(size, frag);
            // Each block takes 4 bytes of inode table: no more than the image holds.
            if n.checked_mul(4).is_none_or(|b| b > img.sb.bytes_used) {
                return Err(img.bad(format!("inode {number}: file size {size} is implausible")));
            }
            let (b, _, _) = img.meta_read(blk, off, n as usize * 4)?;
            let blocks: Arc<[u32]> = (0..n as usize).map(|i| le32(&b, i * 4)).collect();
            (
                SqKind::File(FileLoc {
                    start,
                    size,
                    frag,
                    frag_off,
                    blocks,
                }),
                S_IFREG,
            )
        }
        3 | 10 => {
            let (b, blk, off) = img.meta_read(blk, off, 8)?;
            let len = le32(&b, 4) as usize;
            if len > 65536 {
                return Err(img.bad(format!("inode {number}: symlink of {len} bytes")));
            }
            let (t, blk, off) = img.meta_read(blk, off, len)?;
            if ty == 10 {
                let (x, _, _) = img.meta_read(blk, off, 4)?;
                xattr = le32(&x, 0);
            }
            (SqKind::Symlink(t), S_IFLNK)
        }
        4 | 5 | 11 | 12 => {
            let (b, _, _) = img.meta_read(blk, off, if ty > 10 { 12 } else { 8 })?;
            if ty > 10 {
                xattr = le32(&b, 8);
            }
            let fmt = if ty == 4 || ty == 11 {
                S_IFBLK
            } else {
                S_IFCHR
            };
            (SqKind::Device(le32(&b, 4)), fmt)
        }
        6 | 7 | 13 | 14 => {
            if ty > 10 {
                let (b, _, _) = img.meta_read(blk, off, 8)?;
                xattr = le32(&b, 4);
            }
            if ty == 6 || ty == 13 {
                (SqKind::Fifo, S_IFIFO)
            } else {
                (SqKind::Socket, S_IFSOCK)
            }
        }
        t => return Err(img.bad(format!("inode {number} at {r:#x}: unknown type {t}"))),
    };
    Ok(SqInode {
        kind,
        mode: fmt | perm,
        uid,
        gid,
        mtime,
        number,
        xattr,
    })
}

/// The entries of a directory: (name, inode reference), in the image's order.
fn read_dir(img: &mut Img, start: u32, offset: u16, size: u32) -> Result<Vec<(Vec<u8>, u64)>> {
    // The listing is `size - 3` bytes (the size counts "." and "..").
    let len = (size as usize).saturating_sub(3);
    let blk = img.sb.dir_table + start as u64;
    let (b, _, _) = img.meta_read(blk, offset as usize, len)?;
    let mut out = Vec::new();
    let mut p = 0usize;
    let short = |img: &Img| {
        img.bad(format!(
            "directory at {start}:{offset}: listing ends mid-entry"
        ))
    };
    // Bounded: each header and entry consumes bytes of the listing.
    while p < len {
        if p + 12 > len {
            return Err(short(img));
        }
        let count = le32(&b, p) as usize + 1;
        let iblk = le32(&b, p + 4) as u64;
        p += 12;
        if count > 256 {
            return Err(img.bad(format!(
                "directory at {start}:{offset}: header of {count} entries"
            )));
        }
        for _ in 0..count {
            if p + 8 > len {
                return Err(short(img));
            }
            let ioff = le16(&b, p) as u64;
            let nlen = le16(&b, p + 6) as usize + 1;
            p += 8;
            if p + nlen > len {
                return Err(short(img));
            }
            let name = b[p..p + nlen].to_vec();
            p += nlen;
            if name.contains(&b'/') || name == b"." || name == b".." {
                return Err(img.bad(format!(
                    "directory at {start}:{offset}: bad name {:?}",
                    String::from_utf8_lossy(&name)
                )));
            }
            out.push((name, (iblk << 16) | ioff));
        }
    }
    Ok(out)
}

/// The xattrs of id `idx` (full names, sorted).
fn read_xattrs(
    img: &mut Img,
    idx: u32,
    ids: &Table,
    kv_start: u64,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let e = img.table_entry(ids, u64::from(idx))?;
    let r = le64(&e, 0);
    let count = le32(&e, 8);
    if count > 65536 {
        return Err(img.bad(format!("xattr id {idx}: {count} xattrs")));
    }
    let mut blk = kv_start
        .checked_add(r >> 16)
        .ok_or_else(|| img.bad(format!("xattr id {idx}: reference {r:#x}")))?;
    let mut off = (r & 0xffff) as usize;
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (h, b2, o2) = img.meta_read(blk, off, 4)?;
        let ty = le16(&h, 0);
        let nlen = le16(&h, 2) as usize;
        let (name, b2, o2) = img.meta_read(b2, o2, nlen)?;
        let prefix: &[u8] = match ty & 0xff {
            0 => b"user.",
            1 => b"trusted.",
            2 => b"security.",
            p => return Err(img.bad(format!("xattr id {idx}: unknown prefix {p}"))),
        };
        let (vh, b2, o2) = img.meta_read(b2, o2, 4)?;
        let vlen = le32(&vh, 0) as usize;
        if vlen > 65536 {
            return Err(img.bad(format!("xattr id {idx}: value of {vlen} bytes")));
        }
        let (v, b2, o2) = img.meta_read(b2, o2, vlen)?;
        let value = if ty & 0x100 != 0 {
            if vlen != 8 {
                return Err(img.bad(format!(
                    "xattr id {idx}: out-of-line reference of {vlen} bytes"
                )));
            }
            let vr = le64(&v, 0);
            let vblk = kv_start
                .checked_add(vr >> 16)
                .ok_or_else(|| img.bad(format!("xattr id {idx}: value reference {vr:#x}")))?;
            let (vh, vb, vo) = img.meta_read(vblk, (vr & 0xffff) as usize, 4)?;
            let n = le32(&vh, 0) as usize;
            if n > 65536 {
                return Err(img.bad(format!("xattr id {idx}: value of {n} bytes")));
            }
            img.meta_read(vb, vo, n)?.0
        } else {
            v
        };
        let mut full = prefix.to_vec();
        full.extend_from_slice(&name);
        out.push((full, value));
        (blk, off) = (b2, o2);
    }
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
}

/// The tails of files that SquashFS keeps in fragment blocks go to the spool. The scan
/// only plans it (each tail's place, the [`Work`] that fills it); [`decode_all`] then
/// decodes the fragment blocks on all worker threads. Data blocks are not spooled: a
/// file that has some is a [`SquashFile`], whose blocks the build's workers decode as
/// they read it.
struct Spool {
    file: Arc<File>,
    path: Arc<Path>,
    len: u64,
    /// Deduplicated files: (first block, size, fragment, fragment offset, block list)
    /// -> source. The block list tells apart files at one position with other holes
    /// (an all-sparse file and the next file's data can share a first block).
    seen: HashMap<DedupeKey, Source>,
    /// What fills the spool, in spool order.
    work: Vec<Work>,
}

/// One file's tail in a fragment block, with where it goes in the spool.
struct Work {
    /// The file's path (error messages).
    rel: Arc<[u8]>,
    frag: u32,
    /// The fragment block's image position and size word.
    block: u64,
    word: u32,
    off: usize,
    len: usize,
    at: u64,
}

/// Tails one batch of work holds at most (a thread's share at a time).
const BATCH_TAILS: usize = 2048;

/// A regular file of the SquashFS image with data blocks: read during the build,
/// decoding the blocks a read needs (on the worker that reads), its tail (if it has
/// one in a fragment block) from the spool.
pub struct SquashFile {
    data: Arc<Data>,
    /// The file's path (error messages).
    rel: Arc<[u8]>,
    size: u64,
    /// Size words of the blocks, and each block's image position.
    blocks: Arc<[u32]>,
    pos: Box<[u64]>,
    /// The tail: spool file and position (its length is the size past the blocks).
    tail: Option<(Arc<File>, u64)>,
}

impl std::fmt::Debug for SquashFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SquashFile({}: /{}, {} bytes)",
            self.data.path.display(),
            String::from_utf8_lossy(&self.rel),
            self.size
        )
    }
}

impl SquashFile {
    /// The image the blocks are read from.
    pub fn image_path(&self) -> &Path {
        &self.data.path
    }

    fn err(&self, e: BuildError) -> std::io::Error {
        let what = match e {
            BuildError::Invalid { what, .. } => what,
            e => e.to_string(),
        };
        std::io::Error::other(format!("/{}: {what}", String::from_utf8_lossy(&self.rel)))
    }

    /// Fill `buf` with the file's bytes from `off` (zeros in sparse blocks). A read past
    /// the end is `UnexpectedEof`; a block that does not decode to its length is an
    /// error naming the file and the block's position.
    pub fn read_exact_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        let bs = u64::from(self.data.sb.block_size);
        let in_blocks = self.in_blocks();
        let mut p = off;
        // Bounded: each turn moves `p` on by at least one byte, or ends.
        while p < end {
            let dst = &mut buf[(p - off) as usize..];
            if p >= in_blocks {
                let (spool, at) = self
                    .tail
                    .as_ref()
                    .ok_or(std::io::ErrorKind::UnexpectedEof)?;
                spool.read_exact_at(&mut dst[..(end - p) as usize], at + (p - in_blocks))?;
                break;
            }
            let i = (p / bs) as usize;
            let start = i as u64 * bs;
            let want = (self.size - start).min(bs);
            let n = (end.min(start + want) - p) as usize;
            let word = self.blocks[i];
            if word & 0x00ff_ffff == 0 {
                dst[..n].fill(0);
            } else {
                let pos = self.pos[i];
                let data = self
                    .data
                    .block(pos, word, "data block")
                    .map_err(|e| self.err(e))?;
                if data.len() as u64 != want {
                    return Err(self.err(self.data.bad(format!(
                        "data block at byte {pos}: {} bytes, {want} expected",
                        data.len()
                    ))));
                }
                let from = (p - start) as usize;
                dst[..n].copy_from_slice(&data[from..from + n]);
            }
            p += n as u64;
        }
        Ok(())
    }

    /// How many of the file's bytes its blocks hold (the rest is its tail).
    fn in_blocks(&self) -> u64 {
        let bs = u64::from(self.data.sb.block_size);
        (self.blocks.len() as u64).saturating_mul(bs).min(self.size)
    }

    /// Data segments `[start, end)` when the file has sparse blocks, else None.
    pub fn segments(&self) -> Option<Vec<(u64, u64)>> {
        if self.blocks.iter().all(|w| w & 0x00ff_ffff != 0) {
            return None;
        }
        let bs = u64::from(self.data.sb.block_size);
        let mut v: Vec<(u64, u64)> = Vec::new();
        for (i, w) in self.blocks.iter().enumerate() {
            if w & 0x00ff_ffff == 0 {
                continue;
            }
            let (a, b) = (i as u64 * bs, ((i as u64 + 1) * bs).min(self.size));
            match v.last_mut() {
                Some(l) if l.1 == a => l.1 = b,
                _ => v.push((a, b)),
            }
        }
        let in_blocks = self.in_blocks();
        if self.tail.is_some() && in_blocks < self.size {
            match v.last_mut() {
                Some(l) if l.1 == in_blocks => l.1 = self.size,
                _ => v.push((in_blocks, self.size)),
            }
        }
        Some(v)
    }
}

/// Plan file `loc` (at `rel`): its source, and the work that spools its tail.
fn read_file(
    img: &mut Img,
    sp: &mut Spool,
    frags: &Table,
    loc: &FileLoc,
    rel: &[u8],
) -> Result<Source> {
    let FileLoc {
        start,
        size,
        frag,
        frag_off,
        ref blocks,
    } = *loc;
    let key = (start, size, frag, frag_off, blocks.clone());
    if let Some(s) = sp.seen.get(&key) {
        return Ok(s.clone());
    }
    let bs = img.sb.block_size as u64;
    let mut pos = Vec::with_capacity(blocks.len());
    let mut p = start;
    for (i, &w) in blocks.iter().enumerate() {
        let len = u64::from(w & 0x00ff_ffff);
        if len > bs {
            return Err(img.bad(format!("data block at byte {p}: {len} bytes stored")));
        }
        if len > 0 && size.saturating_sub(i as u64 * bs) == 0 {
            return Err(img.bad(format!("data block at byte {p}: past the file's size")));
        }
        pos.push(p);
        p = p
            .checked_add(len)
            .ok_or_else(|| img.bad(format!("data block at byte {p}: past 2^64")))?;
    }
    let rel: Arc<[u8]> = Arc::from(rel);
    let mut tail = None;
    if frag != NO_FRAGMENT {
        let len = (size % bs) as usize;
        let e = img.table_entry(frags, u64::from(frag))?;
        let (block, word) = (le64(&e, 0), le32(&e, 8));
        if (word & 0x00ff_ffff) as u64 > bs {
            return Err(img.bad(format!(
                "fragment {frag}: {} bytes stored",
                word & 0x00ff_ffff
            )));
        }
        let at = sp.len;
        sp.len += len as u64;
        sp.work.push(Work {
            rel: rel.clone(),
            frag,
            block,
            word,
            off: frag_off as usize,
            len,
            at,
        });
        tail = Some(at);
    }
    let src = if blocks.is_empty() {
        match tail {
            // Only a tail (or nothing): bytes of the spool.
            Some(at) => Source::Range {
                file: sp.path.clone(),
                at,
            },
            None if size == 0 => Source::Range {
                file: sp.path.clone(),
                at: 0,
            },
            // A size but no block and no fragment: all of it a hole.
            None => Source::Sparse {
                file: sp.path.clone(),
                segs: Arc::from([]),
            },
        }
    } else {
        Source::Squash(Arc::new(SquashFile {
            data: img.data.clone(),
            rel,
            size,
            blocks: blocks.clone(),
            pos: pos.into(),
            tail: tail.map(|at| (sp.file.clone(), at)),
        }))
    };
    sp.seen.insert(key, src.clone());
    Ok(src)
}

impl Work {
    /// Decode this tail's fragment block (unless `frag` holds it: the one this thread
    /// decoded last) and write the tail into the spool.
    fn run(&self, img: &Data, sp: &Spool, frag: &mut Option<(u32, Vec<u8>)>) -> Result<()> {
        if frag.as_ref().is_none_or(|(i, _)| *i != self.frag) {
            *frag = Some((
                self.frag,
                img.block(self.block, self.word, "fragment block")?,
            ));
        }
        let d = frag.as_ref().map_or(&[][..], |(_, d)| d.as_slice());
        let (idx, off, len) = (self.frag, self.off, self.len);
        let piece = d
            .get(off..off + len)
            .ok_or_else(|| img.bad(format!("fragment {idx}: {len} bytes at {off} past its end")))?;
        sp.file
            .write_all_at(piece, self.at)
            .map_err(io_err(&sp.path, "squashfs: write spool"))
    }
}

/// Fill the spool: the tails in batches of [`BATCH_TAILS`] on `threads` threads. The
/// spool's bytes do not depend on the thread count; the error reported is the one of
/// the first failing tail in spool order, named by its file's path.
fn decode_all(img: &Data, sp: &Spool, threads: usize) -> Result<()> {
    use rayon::prelude::*;
    let batches: Vec<&[Work]> = sp.work.chunks(BATCH_TAILS).collect();
    let run = |ws: &&[Work]| -> Result<()> {
        let mut frag = None;
        for w in ws.iter() {
            w.run(img, sp, &mut frag).map_err(|e| name_err(e, &w.rel))?;
        }
        Ok(())
    };
    let results: Vec<Result<()>> = if threads > 1 && batches.len() > 1 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| BuildError::Options(format!("thread pool: {e}")))?;
        pool.install(|| batches.par_iter().map(run).collect())
    } else {
        batches.iter().map(run).collect()
    };
    results.into_iter().collect()
}

/// Scan the SquashFS image at `image` into a tree; file contents go to a spool file in
/// `spool_dir`.
pub fn scan_squashfs(image: &Path, spool_dir: &Path, opts: &BuildOptions) -> Result<SquashTree> {
    let f = File::open(image).map_err(io_err(image, "squashfs: open"))?;
    let sb = superblock(&f, image)?;
    let mut img = Img {
        data: Arc::new(Data {
            f,
            path: image.to_path_buf(),
            sb,
        }),
        meta: HashMap::new(),
        meta_bytes: 0,
    };
    // At most 65,535 ids (a 16-bit count), each read through the shared entry lookup.
    let id_table = Table {
        index: img.sb.id_table,
        count: u64::from(img.sb.id_count),
        entry: 4,
        what: "id table",
    };
    let ids: Vec<u32> = (0..id_table.count)
        .map(|i| img.table_entry(&id_table, i).map(|e| le32(&e, 0)))
        .collect::<Result<_>>()?;
    let frags = Table {
        index: img.sb.frag_table,
        count: if img.sb.frag_table != NOT_SET {
            u64::from(img.sb.frag_count)
        } else {
            0
        },
        entry: 16,
        what: "fragment table",
    };
    let (xids, kv_start) = if img.sb.xattr_table != NOT_SET && img.sb.flags & 0x200 == 0 {
        let h = img.read_at(img.sb.xattr_table, 16, "xattr table header")?;
        let xids = Table {
            index: img.sb.xattr_table + 16,
            count: u64::from(le32(&h, 8)),
            entry: 16,
            what: "xattr id table",
        };
        (xids, le64(&h, 0))
    } else {
        let none = Table {
            index: 0,
            count: 0,
            entry: 16,
            what: "xattr id table",
        };
        (none, 0)
    };

    let t = crate::cleanup::scratch(spool_dir, ".ferofs-spool-")
        .map_err(io_err(spool_dir, "squashfs: create spool"))?;
    let file = t
        .reopen()
        .map_err(io_err(t.path(), "squashfs: open spool"))?;
    let mut sp = Spool {
        file: Arc::new(file),
        path: Arc::from(t.path()),
        len: 0,
        seen: HashMap::new(),
        work: Vec::new(),
    };

    let excl = crate::scan::Excludes::new(opts);
    let excluded = |rel: &[u8]| excl.matches(rel);

    let max_nodes = img.sb.inode_count as usize;
    let mut nodes: Vec<Node> = Vec::new();
    // Inode number -> node, for hardlinks (and to refuse directory loops).
    let mut by_number: HashMap<u32, InodeId> = HashMap::new();
    let mk = |img: &mut Img,
              sp: &mut Spool,
              nodes: &mut Vec<Node>,
              ino: SqInode,
              rel: Vec<u8>|
     -> Result<(InodeId, Option<DirLoc>)> {
        if nodes.len() >= max_nodes.max(1) {
            return Err(img.bad(format!(
                "more inodes reached than the superblock's {max_nodes}"
            )));
        }
        let mut dir = None;
        let kind = match ino.kind {
            SqKind::Dir {
                start,
                offset,
                size,
            } => {
                dir = Some((start, offset, size));
                Kind::Dir {
                    entries: Vec::new(),
                    parent: 0,
                }
            }
            SqKind::File(loc) => Kind::File {
                src: read_file(img, sp, &frags, &loc, &rel).map_err(|e| name_err(e, &rel))?,
                size: loc.size,
            },
            SqKind::Symlink(t) => Kind::Symlink { target: t },
            SqKind::Device(rdev) => Kind::Device { rdev },
            SqKind::Fifo => Kind::Fifo,
            SqKind::Socket => Kind::Socket,
        };
        let xattrs = if ino.xattr != NO_FRAGMENT && xids.count > 0 {
            read_xattrs(img, ino.xattr, &xids, kv_start).map_err(|e| name_err(e, &rel))?
        } else {
            Vec::new()
        };
        nodes.push(Node {
            kind,
            mode: ino.mode,
            uid: opts
                .force_uid
                .unwrap_or(if opts.all_root { 0 } else { ino.uid }),
            gid: opts
                .force_gid
                .unwrap_or(if opts.all_root { 0 } else { ino.gid }),
            mtime: ino.mtime as i64,
            mtime_nsec: 0,
            nlink: 0,
            xattrs,
            rel,
        });
        Ok((nodes.len() - 1, dir))
    };

    let root_ref = img.sb.root_inode;
    let root_ino = read_inode(&mut img, root_ref, &ids)?;
    if !matches!(root_ino.kind, SqKind::Dir { .. }) {
        return Err(img.bad("the root inode is not a directory".into()));
    }
    by_number.insert(root_ino.number, 0);
    let (root, rdir) = mk(&mut img, &mut sp, &mut nodes, root_ino, Vec::new())?;
    // (node, directory location, relative path, depth); depth-first pre-order.
    let mut stack = vec![(root, rdir, Vec::<u8>::new(), 0usize)];
    // Bounded: each directory is pushed once (a directory inode number seen twice is refused).
    while let Some((tid, loc, rel, depth)) = stack.pop() {
        let Some((start, offset, size)) = loc else {
            continue;
        };
        if depth > MAX_DEPTH {
            return Err(img.bad(format!(
                "{}: nested deeper than {MAX_DEPTH}",
                String::from_utf8_lossy(&rel)
            )));
        }
        let mut list = read_dir(&mut img, start, offset, size).map_err(|e| name_err(e, &rel))?;
        list.sort_by(|a, b| a.0.cmp(&b.0));
        list.dedup_by(|a, b| a.0 == b.0);
        let mut entries = Vec::with_capacity(list.len());
        let mut subdirs = Vec::new();
        for (name, r) in list {
            let crel = crate::scan::child_rel(&rel, &name);
            if excluded(&crel) {
                continue;
            }
            let ino = read_inode(&mut img, r, &ids).map_err(|e| name_err(e, &crel))?;
            let is_dir = matches!(ino.kind, SqKind::Dir { .. });
            let cid = match by_number.get(&ino.number) {
                Some(_) if is_dir => {
                    return Err(img.bad(format!(
                        "{}: directory inode {} appears twice (a loop)",
                        String::from_utf8_lossy(&crel),
                        ino.number
                    )));
                }
                Some(&c) => c,
                None => {
                    let n = ino.number;
                    let (c, dloc) = mk(&mut img, &mut sp, &mut nodes, ino, crel.clone())?;
                    by_number.insert(n, c);
                    if is_dir {
                        if let Kind::Dir { parent, .. } = &mut nodes[c].kind {
                            *parent = tid;
                        }
                        subdirs.push((c, dloc, crel, depth + 1));
                    }
                    c
                }
            };
            entries.push((name, cid));
        }
        if let Kind::Dir { entries: e, .. } = &mut nodes[tid].kind {
            *e = entries;
        }
        stack.extend(subdirs.into_iter().rev());
    }
    decode_all(&img, &sp, opts.worker_threads())?;
    let mut tree = Tree {
        nodes,
        root,
        packed: None,
        devices: Vec::new(),
    };
    if opts.ovlfs_strip {
        crate::tarball::strip_overlay(&mut tree);
    }
    fix_nlinks(&mut tree);
    Ok(SquashTree { tree, spool: t })
}

/// Prefix an error about the image with the path of the entry being read.
fn name_err(e: BuildError, rel: &[u8]) -> BuildError {
    match e {
        BuildError::Invalid { path, what } => BuildError::Invalid {
            path,
            what: format!("/{}: {what}", String::from_utf8_lossy(rel)),
        },
        e => e,
    }
}
