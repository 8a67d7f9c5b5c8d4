//! Compressed data (like the kernel's zdata.c): read through `zmap`, decompress only the
//! pclusters a read needs.
//!
//! Two ways in, one engine:
//!
//! - [`Image::read_at_with`] with a caller-owned [`ReadCtx`] (one per thread): the
//!   context keeps a window over the inode's index bytes, a read-ahead window over the
//!   compressed bytes, and the last extent it decoded in part. Extents the read covers
//!   whole are decoded straight into the caller's buffer; nothing is shared and nothing
//!   is allocated per file once the buffers have grown. This is the path for whole-file
//!   readers (`extract`, `check`).
//! - [`Image::read_at`]: the same, with a per-thread context of the library's own, and
//!   extents needed only in part kept in the image's shared, sharded cache
//!   ([`crate::cache`]), so random readers on many threads share decoded bytes.

use crate::cache::Bytes;
use crate::data::Extent;
use crate::error::*;
use crate::image::Image;
use crate::inode::Inode;
use crate::source::Source;
use crate::zmap::{MetaWin, ZExtent, ZInfo, ZKind, ZSrc};
use ferofs_compress::{decompress, Algorithm, DecompressConfig};
use ferofs_format::sb::INCOMPAT_COMPR_CFGS;
use std::cell::RefCell;
use std::sync::Arc;

/// Largest decoded extent the kernel accepts (Z_EROFS_PCLUSTER_MAX_DSIZE).
const MAX_DSIZE: u64 = ferofs_format::PCLUSTER_MAX_DSIZE;

/// Most compressed bytes read ahead in one positional read.
const RAW_AHEAD_MAX: u64 = 1 << 20;

/// Buffers above this are released after a read through the library's own context.
const KEEP_CAPACITY: usize = 4 << 20;

/// Image bytes `[at, at + len)` in `buf[..len]`, valid for the image with id `img` (0:
/// none). `buf` only grows (up to the largest window), so a reload does not zero it.
#[derive(Debug, Default)]
struct RawWin {
    img: u64,
    at: u64,
    len: usize,
    buf: Vec<u8>,
}

/// Per-reader state for [`Image::read_at_with`]: reusable buffers and small windows
/// over what the last read touched. Cheap to create (nothing is allocated until used);
/// keep one per thread and reuse it across files. It may be used with any number of
/// images: everything in it is keyed by the image it came from.
#[derive(Debug, Default)]
pub struct ReadCtx {
    meta: MetaWin,
    /// (image id, nid) and the map facts of the inode read last.
    zi: Option<(u64, u64, ZInfo)>,
    raw: RawWin,
    /// Scratch for inline (tail-packed) pclusters.
    inline: Vec<u8>,
    /// A decoded prefix of one extent: (image id, nid, logical start).
    dec_key: Option<(u64, u64, u64)>,
    dec: Vec<u8>,
}

impl ReadCtx {
    pub fn new() -> Self {
        Self::default()
    }
    fn trim(&mut self) {
        for v in [&mut self.raw.buf, &mut self.dec, &mut self.inline] {
            if v.capacity() > KEEP_CAPACITY {
                *v = Vec::new();
            }
        }
        if self.raw.buf.is_empty() {
            self.raw.img = 0;
            self.raw.len = 0;
        }
        if self.dec.is_empty() {
            self.dec_key = None;
        }
    }
}

thread_local! {
    static CTX: RefCell<ReadCtx> = RefCell::new(ReadCtx::new());
}

/// Run `f` with this thread's library context, or a fresh one when it is in use (a read
/// of the packed or metabox inode nested inside another read) or gone (thread exit).
fn with_thread_ctx<T>(f: impl FnOnce(&mut ReadCtx) -> Result<T>) -> Result<T> {
    let mut f = Some(f);
    let r = CTX.try_with(|c| {
        let f = f.take()?;
        Some(match c.try_borrow_mut() {
            Ok(mut g) => {
                let r = f(&mut g);
                g.trim();
                r
            }
            Err(_) => f(&mut ReadCtx::new()),
        })
    });
    match (r, f.take()) {
        (Ok(Some(r)), _) => r,
        (_, Some(f)) => f(&mut ReadCtx::new()),
        (_, None) => Err(unsupported("no reader context", None)),
    }
}

/// How much of an extent of `span` bytes to decode when the read needs its first
/// `need` bytes and `cached` are decoded already: rounded up to 64 KiB and at least
/// double the cached prefix (so reads walking through a big extent stay linear), the
/// whole extent when that is close anyway.
fn prefix_len(need: u64, cached: u64, span: u64) -> u64 {
    let step = 64u64 << 10;
    let want = need
        .max(cached.saturating_mul(2))
        .div_ceil(step)
        .saturating_mul(step);
    if want.saturating_mul(4) >= span.saturating_mul(3) {
        span
    } else {
        want.min(span)
    }
}

fn to_usize(v: u64, ino: &Inode, e: &ZExtent) -> Result<usize> {
    usize::try_from(v).map_err(|_| {
        corrupt(
            CorruptKind::BadPcluster,
            Some(ino.nid),
            Some(e.la),
            Some(v),
            "length does not fit in memory",
        )
    })
}

impl<S: Source> Image<S> {
    /// The compressed bytes of extent `e` (a pcluster or an inline pcluster). Pclusters
    /// come from the read-ahead window, reloaded (at most `ahead` bytes, bounded by
    /// [`RAW_AHEAD_MAX`]) when it does not hold them.
    fn z_raw<'c>(
        &self,
        win: &'c mut RawWin,
        inline: &'c mut Vec<u8>,
        ino: &Inode,
        e: &ZExtent,
        ahead: u64,
    ) -> Result<&'c [u8]> {
        let bad = |v: u64, what| {
            corrupt(
                CorruptKind::BadPcluster,
                Some(ino.nid),
                Some(e.la),
                Some(v),
                what,
            )
        };
        match e.src {
            ZSrc::Inline { rel, len } => {
                if len > ferofs_format::PCLUSTER_MAX_SIZE {
                    return Err(bad(len, "pcluster too large"));
                }
                let n = to_usize(len, ino, e)?;
                inline.resize(n, 0);
                self.read_inode_meta(ino.nid, rel, inline)?;
                Ok(&inline[..])
            }
            ZSrc::Pcluster { addr, len } => {
                if len > ferofs_format::PCLUSTER_MAX_SIZE {
                    return Err(bad(len, "pcluster too large"));
                }
                let end = addr
                    .checked_add(len)
                    .filter(|&x| x <= self.len)
                    .ok_or_else(|| bad(addr, "pcluster beyond the end of the image"))?;
                let held = win.img == self.id
                    && addr >= win.at
                    && end <= win.at.saturating_add(win.len as u64);
                if !held {
                    let bs = u64::from(self.block_size());
                    let more = ahead
                        .min(RAW_AHEAD_MAX)
                        .div_ceil(bs)
                        .saturating_add(1)
                        .saturating_mul(bs);
                    let mut n = to_usize(len.max(more).min(self.len - addr), ino, e)?;
                    win.img = 0;
                    if win.buf.len() < n {
                        win.buf.resize(n, 0);
                    }
                    // What lies past the pcluster is read on speculation: when it
                    // cannot be read (a gap between an image and its extra devices,
                    // one shorter than its slot), the pcluster alone is.
                    if self.read_raw(&mut win.buf[..n], addr).is_err() {
                        n = to_usize(len, ino, e)?;
                        self.read_raw(&mut win.buf[..n], addr)?;
                    }
                    win.img = self.id;
                    win.at = addr;
                    win.len = n;
                }
                let o = to_usize(addr - win.at, ino, e)?;
                let n = to_usize(len, ino, e)?;
                win.buf[..win.len]
                    .get(o..o.saturating_add(n))
                    .ok_or_else(|| bad(addr, "pcluster outside the read window"))
            }
            ZSrc::Hole | ZSrc::Fragment { .. } => Err(bad(0, "extent has no pcluster")),
        }
    }

    /// Decode the first `out.len()` bytes of extent `e` from its stored bytes `raw`
    /// (`out.len()` < the extent's length: a prefix, partial decoding).
    fn z_decode(&self, ino: &Inode, e: &ZExtent, raw: &[u8], out: &mut [u8]) -> Result<()> {
        let span = e.end - e.la;
        let n = out.len();
        let partial = (n as u64) < span;
        let inline = matches!(e.src, ZSrc::Inline { .. });
        let bad = |kind, v: u64, what| corrupt(kind, Some(ino.nid), Some(e.la), Some(v), what);
        match e.kind {
            ZKind::Plain { interlaced } => {
                let p = raw.len();
                if p == 0 {
                    return Err(bad(CorruptKind::BadPcluster, 0, "empty plain pcluster"));
                }
                if n > p || (!partial && span > p as u64) {
                    return Err(bad(
                        CorruptKind::BadPcluster,
                        n as u64,
                        "plain extent longer than its pcluster",
                    ));
                }
                if interlaced {
                    // As the kernel reads it: the first bs - la % bs bytes of the extent
                    // are the last ones of the pcluster, the rest follow from its start.
                    // So byte i is stored at (r + i) % p, r = p - (bs - la % bs): for
                    // one block, a rotation by la % bs. A pcluster shorter than bs -
                    // la % bs (an inline tail: mkfs.erofs 1.9.3 writes such tails for
                    // its packed inode) makes the kernel read bytes before the pcluster:
                    // refused, rather than returning other bytes than the kernel.
                    let bs = u64::from(self.block_size());
                    let head = bs - e.la % bs;
                    let r = (p as u64).checked_sub(head).ok_or_else(|| {
                        bad(
                            CorruptKind::BadPcluster,
                            p as u64,
                            "interlaced plain pcluster shorter than its first block's part (the kernel reads before it)",
                        )
                    })?;
                    // r < p and n <= p: the pcluster's end, then (if more is wanted)
                    // its start.
                    let r = usize::try_from(r).unwrap_or(0);
                    let first = (p - r).min(n);
                    out[..first].copy_from_slice(&raw[r..r + first]);
                    out[first..].copy_from_slice(&raw[..n - first]);
                } else {
                    out.copy_from_slice(&raw[..n]);
                }
            }
            ZKind::Compressed(alg) => {
                let algo = Algorithm::from_id(alg).ok_or_else(|| {
                    bad(
                        CorruptKind::BadLcluster,
                        u64::from(alg),
                        "unknown algorithm",
                    )
                })?;
                let avail = if self.sb.has_incompat(INCOMPAT_COMPR_CFGS) {
                    self.compr.available
                } else {
                    1
                };
                if avail & (1 << alg) == 0 {
                    return Err(bad(
                        CorruptKind::BadLcluster,
                        u64::from(alg),
                        "algorithm not declared in the superblock",
                    ));
                }
                let stream = if inline {
                    raw
                } else {
                    // Zero padding in front of the stream (0PADDING).
                    let z = raw
                        .iter()
                        .position(|&b| b != 0)
                        .ok_or_else(|| bad(CorruptKind::BadPcluster, e.la, "all-zero pcluster"))?;
                    &raw[z..]
                };
                let cfg = DecompressConfig {
                    lzma_dict: self.compr.lzma_dict_size(),
                };
                decompress(algo, stream, out, e.partial_ref || partial, &cfg)
                    .or_else(|_| decompress(algo, stream, out, true, &cfg))
                    .map_err(|_| {
                        bad(
                            CorruptKind::Decompress,
                            u64::from(alg),
                            "pcluster does not decompress",
                        )
                    })?;
            }
        }
        Ok(())
    }

    fn check_span(&self, ino: &Inode, e: &ZExtent) -> Result<u64> {
        let span = e.end.saturating_sub(e.la);
        if span > MAX_DSIZE {
            return Err(corrupt(
                CorruptKind::BadLcluster,
                Some(ino.nid),
                Some(e.la),
                Some(span),
                "decoded extent larger than 12 MiB",
            ));
        }
        Ok(span)
    }

    /// At least the first `need` bytes of extent `e`, from or into the shared cache.
    fn z_shared_prefix(
        &self,
        ctx: &mut ReadCtx,
        ino: &Inode,
        e: &ZExtent,
        need: u64,
    ) -> Result<Bytes> {
        let span = self.check_span(ino, e)?;
        let key = (ino.nid, e.la);
        let mut cached = 0u64;
        if let Some(v) = self.cache.get(key) {
            if v.len() as u64 >= need.min(span) {
                return Ok(v);
            }
            cached = v.len() as u64;
        }
        let n = to_usize(prefix_len(need, cached, span), ino, e)?;
        let mut out = vec![0u8; n];
        let raw = self.z_raw(&mut ctx.raw, &mut ctx.inline, ino, e, 0)?;
        self.z_decode(ino, e, raw, &mut out)?;
        let v = Arc::new(out);
        self.cache.put(key, v.clone());
        Ok(v)
    }

    /// Make `ctx.dec` hold at least the first `need` bytes of extent `e`.
    fn z_ctx_prefix(&self, ctx: &mut ReadCtx, ino: &Inode, e: &ZExtent, need: u64) -> Result<()> {
        let span = self.check_span(ino, e)?;
        let key = Some((self.id, ino.nid, e.la));
        let mut cached = 0u64;
        if ctx.dec_key == key {
            cached = ctx.dec.len() as u64;
            if cached >= need.min(span) {
                return Ok(());
            }
        }
        let n = to_usize(prefix_len(need, cached, span), ino, e)?;
        let ReadCtx {
            raw,
            inline,
            dec,
            dec_key,
            ..
        } = ctx;
        *dec_key = None;
        // No clear: the decoder overwrites all n bytes, only growth is zeroed.
        dec.resize(n, 0);
        let r = self.z_raw(raw, inline, ino, e, 0)?;
        self.z_decode(ino, e, r, dec)?;
        *dec_key = key;
        Ok(())
    }

    /// The map facts of `ino`, computed once per inode in a row.
    fn ctx_zinfo(&self, ctx: &mut ReadCtx, ino: &Inode) -> Result<ZInfo> {
        if let Some((img, nid, zi)) = &ctx.zi {
            if *img == self.id && *nid == ino.nid {
                return Ok(zi.clone());
            }
        }
        ctx.zi = None;
        let zi = self.zinfo(&mut ctx.meta, ino)?;
        ctx.zi = Some((self.id, ino.nid, zi.clone()));
        Ok(zi)
    }

    /// Read a compressed file. `shared`: extents needed in part go through the image's
    /// cache (random readers); otherwise through `ctx` alone.
    pub(crate) fn z_read(
        &self,
        ctx: &mut ReadCtx,
        shared: bool,
        ino: &Inode,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let zi = self.ctx_zinfo(ctx, ino)?;
        let want = buf.len();
        let mut done = 0usize;
        // Bounded: each iteration consumes at least one byte of a non-empty extent.
        while done < want {
            let pos = offset.checked_add(done as u64).ok_or_else(|| {
                corrupt(
                    CorruptKind::BadInodeSize,
                    Some(ino.nid),
                    Some(offset),
                    None,
                    "read offset overflows",
                )
            })?;
            let e = self.z_map(&mut ctx.meta, ino, &zi, pos)?;
            if pos < e.la || pos >= e.end {
                return Err(corrupt(
                    CorruptKind::BadLcluster,
                    Some(ino.nid),
                    Some(pos),
                    Some(e.la),
                    "mapping does not cover the offset",
                ));
            }
            let from = pos - e.la;
            let left = want - done;
            let n = usize::try_from(e.end - pos).map_or(left, |x| x.min(left));
            let dst = &mut buf[done..done + n];
            match e.src {
                // Fragments and holes are served directly: no decoded-extent buffer.
                ZSrc::Hole => dst.fill(0),
                ZSrc::Fragment { off } => self.z_fragment(ino, pos, off, from, dst)?,
                _ if from == 0 && n as u64 == e.end - e.la => {
                    // The whole extent: decode straight into the caller's buffer.
                    self.check_span(ino, &e)?;
                    let raw = self.z_raw(&mut ctx.raw, &mut ctx.inline, ino, &e, left as u64)?;
                    self.z_decode(ino, &e, raw, dst)?;
                }
                _ => {
                    let need = from + n as u64;
                    let f = to_usize(from, ino, &e)?;
                    let src = if shared {
                        let v = self.z_shared_prefix(ctx, ino, &e, need)?;
                        copy_from(dst, &v, f)
                    } else {
                        self.z_ctx_prefix(ctx, ino, &e, need)?;
                        copy_from(dst, &ctx.dec, f)
                    };
                    src.ok_or_else(|| {
                        corrupt(
                            CorruptKind::BadPcluster,
                            Some(ino.nid),
                            Some(pos),
                            Some(need),
                            "decoded extent shorter than needed",
                        )
                    })?;
                }
            }
            done += n;
        }
        Ok(want)
    }

    fn z_fragment(&self, ino: &Inode, pos: u64, off: u64, from: u64, dst: &mut [u8]) -> Result<()> {
        let bad = |what| {
            corrupt(
                CorruptKind::BadPcluster,
                Some(ino.nid),
                Some(pos),
                Some(off),
                what,
            )
        };
        let packed = self.packed_inode()?;
        if packed.nid == ino.nid {
            return Err(bad("the packed inode cannot use fragments"));
        }
        let at = off
            .checked_add(from)
            .ok_or_else(|| bad("fragment offset overflows"))?;
        let got = self.read_at(packed, at, dst)?;
        if got != dst.len() {
            return Err(bad("fragment beyond the packed inode"));
        }
        Ok(())
    }

    /// [`Image::read_at`] for compressed files: this thread's context, shared cache.
    pub(crate) fn z_read_at(&self, ino: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        with_thread_ctx(|ctx| self.z_read(ctx, true, ino, offset, buf))
    }

    pub(crate) fn z_extents(&self, ino: &Inode) -> Result<Vec<Extent>> {
        let mut m = MetaWin::default();
        let zi = self.zinfo(&mut m, ino)?;
        let mut v = Vec::new();
        let mut pos = 0u64;
        while pos < ino.size && v.len() < crate::data::MAX_EXTENTS_LISTED {
            let e = self.z_map(&mut m, ino, &zi, pos)?;
            if e.end <= pos {
                break;
            }
            let (physical, stored, where_) = match e.src {
                ZSrc::Pcluster { addr, len } => (Some(addr), len, ""),
                ZSrc::Inline { len, .. } => (None, len, " inline"),
                ZSrc::Fragment { .. } => (None, 0, " fragment"),
                ZSrc::Hole => (None, 0, " hole"),
            };
            let fragment_offset = match e.src {
                ZSrc::Fragment { off } => Some(off),
                _ => None,
            };
            let kind = match e.kind {
                ZKind::Plain { interlaced: true } => format!("plain-interlaced{where_}"),
                ZKind::Plain { .. } => format!("plain{where_}"),
                ZKind::Compressed(a) => format!(
                    "{}{where_}",
                    Algorithm::from_id(a).map(|a| a.name()).unwrap_or("?")
                ),
            };
            v.push(Extent {
                logical: e.la,
                length: e.end - e.la,
                physical,
                stored,
                kind,
                fragment_offset,
            });
            pos = e.end;
        }
        Ok(v)
    }

    /// Whether logical offset `pos` of a compressed file lies in a hole; the end of that
    /// hole if so.
    pub(crate) fn z_hole_end(
        &self,
        ctx: &mut ReadCtx,
        ino: &Inode,
        pos: u64,
    ) -> Result<Option<u64>> {
        let zi = self.ctx_zinfo(ctx, ino)?;
        let e = self.z_map(&mut ctx.meta, ino, &zi, pos)?;
        Ok(matches!(e.src, ZSrc::Hole).then_some(e.end))
    }

    /// The extent of a compressed file that holds `pos`: its end and whether it is a
    /// hole.
    pub(crate) fn z_run_end(
        &self,
        ctx: &mut ReadCtx,
        ino: &Inode,
        pos: u64,
    ) -> Result<(u64, bool)> {
        let zi = self.ctx_zinfo(ctx, ino)?;
        let e = self.z_map(&mut ctx.meta, ino, &zi, pos)?;
        Ok((e.end, matches!(e.src, ZSrc::Hole)))
    }
    /// The stretch of file data holding logical offset `pos` and what it is made of, for
    /// callers that cache decoded data by extent (the FUSE mount); None at or past the
    /// end of the file. An [`SpanKind::Encoded`] span read whole with
    /// [`Image::read_at_with`] (offset `start`, length `end - start`) is decoded straight
    /// into the caller's buffer: one pcluster read, one decompression.
    pub fn data_span(&self, ctx: &mut ReadCtx, ino: &Inode, pos: u64) -> Result<Option<DataSpan>> {
        if pos >= ino.size {
            return Ok(None);
        }
        let (start, end, kind) = if ino.layout.is_compressed() {
            let zi = self.ctx_zinfo(ctx, ino)?;
            let e = self.z_map(&mut ctx.meta, ino, &zi, pos)?;
            let kind = match e.src {
                ZSrc::Hole => SpanKind::Hole,
                ZSrc::Fragment { .. } => SpanKind::Fragment,
                ZSrc::Pcluster { len, .. } | ZSrc::Inline { len, .. } => {
                    self.check_span(ino, &e)?;
                    SpanKind::Encoded { stored: len }
                }
            };
            (e.la, e.end, kind)
        } else {
            let run = self.map_flat(ino, pos)?;
            let kind = match run.src {
                crate::data::Src::Hole => SpanKind::Hole,
                _ => SpanKind::Stored,
            };
            (run.start, run.start.saturating_add(run.len), kind)
        };
        let end = end.min(ino.size);
        if pos < start || pos >= end {
            return Err(corrupt(
                CorruptKind::BadLcluster,
                Some(ino.nid),
                Some(pos),
                Some(start),
                "mapping does not cover the offset",
            ));
        }
        Ok(Some(DataSpan { start, end, kind }))
    }
}

/// What a [`DataSpan`] is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Zeros: nothing is stored.
    Hole,
    /// Bytes stored as they are (uncompressed layouts, inline tails): a read costs a copy.
    Stored,
    /// One extent of a compressed file (compressed, or stored plain in a pcluster):
    /// reading any of it costs reading `stored` bytes and decoding.
    Encoded { stored: u64 },
    /// In the packed inode (fragments): read through [`Image::read_at`], whose shared
    /// cache keeps the packed inode's decoded extents.
    Fragment,
}

/// Logical bytes `[start, end)` of a file that come from one place (see
/// [`Image::data_span`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSpan {
    pub start: u64,
    pub end: u64,
    pub kind: SpanKind,
}

/// `dst` from `src[from..]`; None when `src` is too short.
fn copy_from(dst: &mut [u8], src: &[u8], from: usize) -> Option<()> {
    dst.copy_from_slice(src.get(from..from.checked_add(dst.len())?)?);
    Some(())
}
