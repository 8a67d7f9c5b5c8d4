//! Helpers shared by the fuzz targets: a complete walk of an image through every reader
//! API (bounded, errors ignored: the fuzzer looks for panics, hangs and huge
//! allocations), and the small synthetic image the `zmap` target wraps its input in.

use ferofs_format::inode::{DataLayout, InodeCore};
use ferofs_format::sb::*;
use ferofs_reader::{Image, Inode, ReadCtx, Source};
use std::collections::HashSet;

/// Inodes a walk visits at most.
const MAX_ENTRIES: usize = 2000;
/// File bytes a walk reads at most (sequential part per file, and in total).
const PER_FILE: u64 = 1 << 20;
const PER_WALK: u64 = 16 << 20;

struct W<'a, S: Source> {
    img: &'a Image<S>,
    seen: HashSet<u64>,
    entries: usize,
    bytes: u64,
    ctx: ReadCtx,
    buf: Vec<u8>,
    seed: u64,
}

impl<S: Source> W<'_, S> {
    fn rnd(&mut self, n: u64) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        if n == 0 {
            0
        } else {
            self.seed % n
        }
    }

    fn visit(&mut self, path: &[u8], ino: &Inode, depth: usize) {
        let img = self.img;
        if self.entries >= MAX_ENTRIES {
            return;
        }
        self.entries += 1;
        let _ = img.extents(ino);
        if let Ok(xs) = img.xattrs(ino) {
            if let Some(x) = xs.first() {
                let _ = img.get_xattr(ino, &x.name);
            }
        }
        let _ = img.get_xattr(ino, b"user.missing");
        let _ = img.fingerprint(ino);
        if ino.is_dir() {
            if depth > 64 || !self.seen.insert(ino.nid) {
                return;
            }
            let _ = img.lookup_child(ino, b"zz");
            let Ok(ents) = img.read_dir(ino) else { return };
            for e in ents {
                let _ = img.lookup_child(ino, &e.name);
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let mut p = path.to_vec();
                p.push(b'/');
                p.extend_from_slice(&e.name);
                if self.rnd(8) == 0 {
                    let _ = img.lookup(&p);
                }
                if let Ok(c) = img.inode(e.nid) {
                    self.visit(&p, &c, depth + 1);
                }
            }
        } else if ino.is_regular() {
            self.file(ino);
        } else {
            let _ = img.read_link(ino);
        }
    }

    fn file(&mut self, ino: &Inode) {
        let img = self.img;
        let stop = ino
            .size
            .min(PER_FILE)
            .min(PER_WALK.saturating_sub(self.bytes));
        let mut off = 0;
        while off < stop {
            let n = ((stop - off) as usize).min(self.buf.len());
            match img.read_at_with(&mut self.ctx, ino, off, &mut self.buf[..n]) {
                Ok(got) if got > 0 => off += got as u64,
                _ => break,
            }
        }
        self.bytes += off;
        for _ in 0..2 {
            let at = self.rnd(ino.size.saturating_add(1));
            let n = (self.rnd(40_000) as usize + 1).min(self.buf.len());
            if let Ok(got) = img.read_at(ino, at, &mut self.buf[..n]) {
                self.bytes += got as u64;
            }
            let _ = img.hole_end(&mut self.ctx, ino, at);
            let _ = img.seek_data(&mut self.ctx, ino, at);
            let _ = img.seek_hole(&mut self.ctx, ino, at);
        }
    }
}

/// Walk every API over `img`: the root tree (readdir, lookup, stat, xattrs, readlink,
/// file data sequentially and at pseudo-random offsets), the library's own walk, and a
/// few inodes by number.
pub fn walk_all<S: Source>(img: &Image<S>, seed: u64) {
    let _ = img.info();
    let _ = img.xattr_prefixes();
    let _ = img.fingerprint_name();
    let mut w = W {
        img,
        seen: HashSet::new(),
        entries: 0,
        bytes: 0,
        ctx: ReadCtx::new(),
        buf: vec![0u8; 64 << 10],
        seed: seed | 1,
    };
    if let Ok(root) = img.inode(img.root_nid()) {
        w.visit(b"", &root, 0);
    }
    let mut n = 0;
    let _ = img.walk(|_, _| {
        n += 1;
        if n > MAX_ENTRIES {
            return Err(ferofs_reader::Error::NotFound {
                path: "fuzz: entry limit".into(),
            });
        }
        Ok(())
    });
    let _ = img.lookup(b"/a/../b/./c");
    for nid in [0u64, 1, 2, 36, 64] {
        if let Ok(ino) = img.inode(nid) {
            w.visit(b"/x", &ino, 1);
        }
    }
}

/// Layout of the `zmap` target's image: block size 512..4096 (from a flags byte), the
/// superblock with all four algorithms and their config records, the inode under test
/// at byte 4096 (nid 0) followed by the fuzzer's map header and indexes, a packed
/// inode (nid 64, flat, its data at byte 8192) for fragments, then the fuzzer's
/// pcluster bytes from byte 8192 on.
pub const ZMAP_META: usize = 4096;
pub const ZMAP_DATA: usize = 8192;
pub const ZMAP_PACKED_NID: u64 = 64;
const MAX_INDEX: usize = 2000;

/// Input: flags (1 byte), size (4 bytes LE), index length (2 bytes LE), index bytes
/// (after the inode core: map header, then indexes), then data bytes.
pub fn zmap_image(data: &[u8]) -> Option<Vec<u8>> {
    let (&flags, rest) = data.split_first()?;
    let size = u32::from_le_bytes(rest.get(0..4)?.try_into().ok()?);
    let ilen = usize::from(u16::from_le_bytes(rest.get(4..6)?.try_into().ok()?)) % MAX_INDEX;
    let rest = rest.get(6..)?;
    let index = rest.get(..ilen.min(rest.len()))?;
    let payload = rest.get(index.len()..)?;
    let bits = 9 + (flags >> 6);
    let bs = 1usize << bits;
    let total = (ZMAP_DATA + payload.len().min(256 << 10)).div_ceil(bs) * bs;
    let mut img = vec![0u8; total.max(ZMAP_DATA + bs)];
    let mut incompat = INCOMPAT_ZERO_PADDING
        | INCOMPAT_COMPR_CFGS
        | INCOMPAT_COMPR_HEAD2
        | INCOMPAT_ZTAILPACKING
        | INCOMPAT_FRAGMENTS;
    if flags & 8 != 0 {
        incompat |= INCOMPAT_48BIT;
    }
    let sb = Superblock {
        magic: MAGIC,
        blkszbits: bits,
        inos: 2,
        blocks_lo: (img.len() / bs) as u32,
        meta_blkaddr: (ZMAP_META / bs) as u32,
        feature_incompat: incompat,
        u1: 0b1111,
        packed_nid: ZMAP_PACKED_NID,
        ..Default::default()
    };
    let b = sb.encode();
    img[1024..1024 + b.len()].copy_from_slice(&b);
    // Config records, each 4-byte aligned: lz4, lzma (64 KiB dictionary), deflate, zstd.
    let mut pos = 1024 + b.len();
    let mut lzma = vec![0u8; 14];
    lzma[..4].copy_from_slice(&(64u32 << 10).to_le_bytes());
    let mut deflate = vec![0u8; 6];
    deflate[0] = 15;
    for rec in [
        vec![0xFF, 0xFF, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        lzma,
        deflate,
        vec![0u8; 6],
    ] {
        pos = (pos + 3) & !3;
        img[pos..pos + 2].copy_from_slice(&(rec.len() as u16).to_le_bytes());
        img[pos + 2..pos + 2 + rec.len()].copy_from_slice(&rec);
        pos += 2 + rec.len();
    }
    let extended = flags & 1 != 0;
    let layout = if flags & 2 != 0 {
        DataLayout::CompressedCompact
    } else {
        DataLayout::CompressedFull
    };
    let core = InodeCore {
        format: ferofs_format::inode::make_format(extended, layout, false),
        xattr_icount: 0,
        mode: ferofs_format::inode::S_IFREG | 0o644,
        nb: 1,
        size: u64::from(size),
        u: 0,
        ino: 1,
        nlink_ext: 1,
        ..Default::default()
    };
    let enc: Vec<u8> = if extended {
        core.encode_extended().to_vec()
    } else {
        core.encode_compact().to_vec()
    };
    let at = ZMAP_META;
    img[at..at + enc.len()].copy_from_slice(&enc);
    let room = (ZMAP_PACKED_NID as usize * 32).saturating_sub(enc.len());
    let n = index.len().min(room);
    img[at + enc.len()..at + enc.len() + n].copy_from_slice(&index[..n]);
    // The packed inode: flat, its data the fuzzer's payload.
    let packed = InodeCore {
        format: ferofs_format::inode::make_format(false, DataLayout::FlatPlain, false),
        mode: ferofs_format::inode::S_IFREG | 0o600,
        nb: 1,
        size: payload.len().min(256 << 10) as u64,
        u: (ZMAP_DATA / bs) as u32,
        ino: 2,
        ..Default::default()
    };
    let p = ZMAP_META + ZMAP_PACKED_NID as usize * 32;
    img[p..p + 32].copy_from_slice(&packed.encode_compact());
    let m = payload.len().min(img.len() - ZMAP_DATA);
    img[ZMAP_DATA..ZMAP_DATA + m].copy_from_slice(&payload[..m]);
    Some(img)
}

/// Map and read the inode under test (nid 0) of a [`zmap_image`].
pub fn zmap_exercise(img: &[u8]) {
    let Ok(im) = Image::new(img.to_vec()) else {
        return;
    };
    let Ok(ino) = im.inode(0) else { return };
    let _ = im.extents(&ino);
    let mut ctx = ReadCtx::new();
    let mut buf = vec![0u8; 256 << 10];
    // Whole (bounded) sequential read, then reads at the ends and in the middle.
    let stop = ino.size.min(4 << 20);
    let mut off = 0;
    while off < stop {
        let n = ((stop - off) as usize).min(buf.len());
        match im.read_at_with(&mut ctx, &ino, off, &mut buf[..n]) {
            Ok(got) if got > 0 => off += got as u64,
            _ => break,
        }
    }
    for at in [
        0,
        ino.size / 2,
        ino.size.saturating_sub(1),
        ino.size.saturating_sub(5000),
    ] {
        let _ = im.read_at(&ino, at, &mut buf[..6000]);
        let _ = im.hole_end(&mut ctx, &ino, at);
        let _ = im.seek_data(&mut ctx, &ino, at);
        let _ = im.seek_hole(&mut ctx, &ino, at);
    }
}

/// One decoder with a fixed output length. Input: 3 bytes of output length (up to
/// 1 MiB), 1 byte of flags (bit 0: partial), 4 bytes of LZMA dictionary size, then the
/// stream. Errors are fine; panics, hangs and huge allocations are what is looked for.
pub fn decompress_fixed(alg: ferofs_compress::Algorithm, data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let n = (usize::from(data[0]) | usize::from(data[1]) << 8 | usize::from(data[2]) << 16)
        % (1 << 20)
        + 1;
    let partial = data[3] & 1 != 0;
    let cfg = ferofs_compress::DecompressConfig {
        lzma_dict: u32::from_le_bytes([data[4], data[5], data[6], data[7]]),
    };
    let mut out = vec![0u8; n];
    let _ = ferofs_compress::decompress(alg, &data[8..], &mut out, partial, &cfg);
}

pub mod input;

/// A fresh directory for one run's files, in memory (/dev/shm) where there is one.
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)
        .expect("tempdir")
}
pub mod roundtrip;
