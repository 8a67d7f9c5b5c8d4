//! Compressed-file mapping (like the kernel's zmap.c): logical offset -> extent
//! (logical range, where its bytes are stored, how they are encoded).

use crate::error::*;
use crate::image::Image;
use crate::inode::Inode;
use crate::source::Source;
use ferofs_format::inode::DataLayout;
use ferofs_format::zindex::compact_split;
use ferofs_format::zmap::*;

/// How an extent's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZSrc {
    /// A pcluster at this absolute byte address of this many bytes.
    Pcluster { addr: u64, len: u64 },
    /// Inline pcluster (ztailpacking): offset from the inode start, length.
    Inline { rel: u64, len: u64 },
    /// Bytes in the packed inode at this offset (uncompressed there).
    Fragment { off: u64 },
    /// Zeros.
    Hole,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZKind {
    /// Uncompressed; `interlaced` = rotated inside the pcluster.
    Plain {
        interlaced: bool,
    },
    Compressed(u8),
}

/// One mapped extent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ZExtent {
    pub la: u64,
    pub end: u64,
    pub src: ZSrc,
    pub kind: ZKind,
    pub partial_ref: bool,
}

/// Per-inode facts from the map header.
#[derive(Debug, Clone)]
pub(crate) struct ZInfo {
    advise: u16,
    algs: [u8; 2],
    lbits: u8,
    /// Offset of the map header from the inode start.
    hdr: u64,
    compact: bool,
    extents: bool,
    nlclusters: u64,
    whole_fragment: Option<u64>,
    fragment_off: Option<u64>,
    inline: Option<(u64, u64)>,
    tail_head: Option<u64>,
    big1: bool,
    big2: bool,
    extent_count: u64,
}

impl ZInfo {
    /// The head lcluster of the file's last extent when that extent is a fragment tail
    /// (read from the packed inode, so not bounded by MAX_DSIZE).
    fn fragment_tail_head(&self) -> Option<u64> {
        self.fragment_off.and(self.tail_head)
    }
}

/// One decoded lcluster entry.
#[derive(Debug, Clone, Copy)]
struct Lc {
    ty: u8,
    clusterofs: u16,
    pblk: u64,
    delta0: u16,
    cblkcnt: Option<u16>,
    partial_ref: bool,
}

/// Largest decoded extent the kernel accepts.
const MAX_DSIZE: u64 = ferofs_format::PCLUSTER_MAX_DSIZE;

/// Furthest an index lookup walks back (delta[0] hops) to find the head of an extent:
/// the largest extent, [`MAX_DSIZE`]. Public as [`crate::limits::MAX_LOOKBACK_BYTES`].
pub(crate) const MAX_LOOKBACK_BYTES: u64 = MAX_DSIZE;
/// A fragment tail's lookback (see `find_head_from`): at most this many hops plus one
/// per 2^TAIL_HOP_BITS lclusters walked.
const MIN_TAIL_HOPS: u64 = 4;
const TAIL_HOP_BITS: u32 = 10;

/// Bytes of inode metadata (map header, lcluster indexes, extent records) read at once.
const META_WIN: u64 = 16 << 10;

/// A window over image bytes holding inode metadata, so that mapping a run of extents
/// costs one positional read per window instead of one per lcluster entry. Keyed by the
/// image's id (0: empty); the image is read-only, so a window stays valid.
#[derive(Debug, Default)]
pub(crate) struct MetaWin {
    img: u64,
    start: u64,
    buf: Vec<u8>,
    /// 4-byte extent records: (image id, nid, lcn, physical start of record lcn), the
    /// running sum the last lookup reached, so that a forward walk through a file
    /// continues from it instead of summing from record 0 again.
    rec4: Option<(u64, u64, u64, u64)>,
}

impl<S: Source> Image<S> {
    /// [`Image::read_inode_meta`] through the window `m`. Inodes in the metabox and
    /// reads larger than a quarter window go straight through.
    pub(crate) fn meta_read(
        &self,
        m: &mut MetaWin,
        nid: u64,
        rel: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let (pos, in_metabox) = self.inode_pos(nid)?;
        let len = out.len() as u64;
        let at = match pos.checked_add(rel) {
            Some(at) if !in_metabox && len <= META_WIN / 4 => at,
            _ => return self.read_inode_meta(nid, rel, out),
        };
        let end = at.saturating_add(len);
        let held =
            m.img == self.id && at >= m.start && end <= m.start.saturating_add(m.buf.len() as u64);
        if !held {
            // From the start of the 4 KiB block holding `at` (walks go back as well as
            // forward); a read reaching beyond the image gets read_inode_meta's error.
            // A miss within a window's length of the window (a walk through a file's
            // index, forward or a lookback) loads a whole window; a far one (a random
            // reader's jump, the first read of a context) only the 4 KiB blocks it
            // needs, as the kernel reads metadata a page at a time: random 4 KiB reads
            // of one big file would otherwise fetch 16 KiB of index per read.
            let start = at & !4095;
            let win_end = m.start.saturating_add(m.buf.len() as u64);
            let near = m.img == self.id
                && at < win_end.saturating_add(META_WIN)
                && at.saturating_add(META_WIN) > m.start;
            let span = if near {
                META_WIN
            } else {
                end.saturating_sub(start)
                    .div_ceil(4096)
                    .saturating_mul(4096)
            };
            let stop = start.saturating_add(span).min(self.len);
            if stop < end {
                return self.read_inode_meta(nid, rel, out);
            }
            let n = usize::try_from(stop - start).unwrap_or(0);
            m.img = 0;
            m.buf.resize(n, 0);
            self.read_raw(&mut m.buf, start)?;
            m.img = self.id;
            m.start = start;
        }
        let o = usize::try_from(at - m.start).unwrap_or(usize::MAX);
        let src = o
            .checked_add(out.len())
            .and_then(|e| m.buf.get(o..e))
            .ok_or_else(|| {
                corrupt(
                    CorruptKind::NidOutOfRange,
                    Some(nid),
                    Some(at),
                    Some(len),
                    "metadata window miss",
                )
            })?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn zerr(&self, ino: &Inode, kind: CorruptKind, v: u64, what: &'static str) -> Error {
        corrupt(kind, Some(ino.nid), None, Some(v), what)
    }

    pub(crate) fn zinfo(&self, m: &mut MetaWin, ino: &Inode) -> Result<ZInfo> {
        let hdr = (ino.meta_size + 7) & !7;
        let mut hb = [0u8; MAP_HEADER_SIZE];
        self.meta_read(m, ino.nid, hdr, &mut hb)?;
        let h = MapHeader::parse(&hb);
        let compact = ino.layout == DataLayout::CompressedCompact;
        let mut zi = ZInfo {
            advise: h.advise,
            algs: [h.algorithmtype & 15, h.algorithmtype >> 4],
            lbits: 0,
            hdr,
            compact,
            extents: false,
            nlclusters: 0,
            whole_fragment: None,
            fragment_off: None,
            inline: None,
            tail_head: None,
            big1: h.advise & ADVISE_BIG_PCLUSTER_1 != 0,
            big2: h.advise & ADVISE_BIG_PCLUSTER_2 != 0,
            extent_count: 0,
        };
        if h.is_whole_fragment() {
            zi.whole_fragment = Some(h.whole_fragment_offset());
            return Ok(zi);
        }
        zi.extents = !compact && h.advise & ADVISE_EXTENTS != 0;
        let rel = u32::from(h.clusterbits & 15);
        if zi.extents && (4u32 << ((h.advise >> 1) & 3)) >= 16 {
            // h_extents_hi occupies bytes 6-7: the cluster bits are not there.
            zi.lbits = self.blkszbits;
            zi.extent_count =
                u64::from(h.word0) | (u64::from(u16::from_le_bytes([hb[6], hb[7]])) << 32);
        } else {
            zi.lbits = self.blkszbits + rel as u8;
        }
        if zi.lbits > 30 {
            return Err(self.zerr(
                ino,
                CorruptKind::BadLcluster,
                u64::from(zi.lbits),
                "lcluster size too large",
            ));
        }
        zi.nlclusters = ino.size.div_ceil(1u64 << zi.lbits);
        if compact && (!zi.extents) && zi.big1 != zi.big2 {
            return Err(self.zerr(
                ino,
                CorruptKind::BadLcluster,
                u64::from(h.advise),
                "compact indexes need BIG_PCLUSTER_1 == BIG_PCLUSTER_2",
            ));
        }
        if compact && zi.lbits > 14 {
            return Err(self.zerr(
                ino,
                CorruptKind::BadLcluster,
                u64::from(zi.lbits),
                "compact indexes need lclusters <= 16 KiB",
            ));
        }
        // An algorithm the superblock does not declare is an error only where an extent
        // uses it: checked at decode time.
        if ino.size == 0 {
            return Ok(zi);
        }
        if zi.extents {
            if h.advise & ADVISE_FRAGMENT_PCLUSTER != 0 {
                // The last record names the fragment (resolved in map_extent_records).
                zi.fragment_off = Some(0);
            }
            return Ok(zi);
        }
        if h.advise & ADVISE_INLINE_PCLUSTER != 0 {
            let last = zi.nlclusters - 1;
            let end = self.index_end_after(ino, &zi, last);
            zi.inline = Some((end, u64::from(h.idata_size())));
        }
        if h.advise & ADVISE_FRAGMENT_PCLUSTER != 0 {
            zi.fragment_off = Some(u64::from(h.fragment_off()));
        }
        if zi.inline.is_some() || zi.fragment_off.is_some() {
            let tail = zi.fragment_off.is_some();
            let (head, lc) = self.find_head_from(m, ino, &zi, ino.size - 1, tail)?;
            zi.tail_head = Some(head);
            if !compact {
                if let Some(f) = zi.fragment_off.as_mut() {
                    // Full indexes keep the high 32 bits in the tail head's blkaddr.
                    *f |= (lc.pblk & 0xFFFF_FFFF) << 32;
                }
            }
        }
        Ok(zi)
    }

    /// Offset (from the inode) just past the index entry or pack holding `lcn`.
    fn index_end_after(&self, ino: &Inode, zi: &ZInfo, lcn: u64) -> u64 {
        let e = zi.hdr + MAP_HEADER_SIZE as u64;
        if !zi.compact {
            return e + 8 + FULL_INDEX_SIZE as u64 * (lcn + 1);
        }
        let (ipos, _) = self.inode_pos(ino.nid).unwrap_or((0, false));
        let n = zi.nlclusters as usize;
        let (i, t, _) = compact_split(n, ipos + e, zi.advise & ADVISE_COMPACTED_2B != 0);
        let k = lcn as usize;
        if k < i {
            e + 8 * (k as u64 / 2 + 1)
        } else if k < i + t {
            e + 4 * i as u64 + 32 * (((k - i) / 16) as u64 + 1)
        } else {
            e + 4 * i as u64 + 2 * t as u64 + 8 * (((k - i - t) / 2) as u64 + 1)
        }
    }

    fn load_lcluster(&self, m: &mut MetaWin, ino: &Inode, zi: &ZInfo, lcn: u64) -> Result<Lc> {
        if lcn >= zi.nlclusters {
            return Err(self.zerr(
                ino,
                CorruptKind::BadLcluster,
                lcn,
                "lcluster beyond the end of the file",
            ));
        }
        let e = zi.hdr + MAP_HEADER_SIZE as u64;
        if !zi.compact {
            let mut b = [0u8; FULL_INDEX_SIZE];
            self.meta_read(m, ino.nid, e + 8 + FULL_INDEX_SIZE as u64 * lcn, &mut b)?;
            let fi = FullIndex::parse(&b);
            let ty = fi.lcluster_type();
            let (delta0, cblkcnt) = if ty == LCLUSTER_TYPE_NONHEAD {
                let d0 = fi.delta0();
                if zi.big1 && d0 & D0_CBLKCNT != 0 {
                    (1, Some(d0 & !D0_CBLKCNT))
                } else {
                    (d0, None)
                }
            } else {
                (0, None)
            };
            return Ok(Lc {
                ty,
                clusterofs: fi.clusterofs,
                pblk: u64::from(fi.u),
                delta0,
                cblkcnt,
                partial_ref: fi.partial_ref(),
            });
        }
        // Compact: find the pack.
        let (ipos, _) = self.inode_pos(ino.nid)?;
        let n = zi.nlclusters as usize;
        let (i, t, _) = compact_split(n, ipos + e, zi.advise & ADVISE_COMPACTED_2B != 0);
        let k = lcn as usize;
        let (pack_off, per, bits, j) = if k < i {
            (e + 8 * (k as u64 / 2), 2usize, 16u32, k % 2)
        } else if k < i + t {
            (
                e + 4 * i as u64 + 32 * ((k - i) / 16) as u64,
                16,
                14,
                (k - i) % 16,
            )
        } else {
            (
                e + 4 * i as u64 + 2 * t as u64 + 8 * ((k - i - t) / 2) as u64,
                2,
                16,
                (k - i - t) % 2,
            )
        };
        let pack_len = per * bits as usize / 8 + 4;
        let mut pack = [0u8; 32];
        self.meta_read(m, ino.nid, pack_off, &mut pack[..pack_len])?;
        let lobits = u32::from(zi.lbits).max(12);
        let decode = |j: usize| -> (u8, u16) {
            let bitpos = j * bits as usize;
            let byte = bitpos / 8;
            let mut w = [0u8; 4];
            for (x, b) in w.iter_mut().enumerate() {
                *b = if byte + x < pack_len - 4 {
                    pack[byte + x]
                } else {
                    0
                };
            }
            let v = (u32::from_le_bytes(w) >> (bitpos % 8)) & ((1u32 << bits) - 1);
            (((v >> lobits) & 3) as u8, (v & ((1 << lobits) - 1)) as u16)
        };
        let base = u32::from_le_bytes([
            pack[pack_len - 4],
            pack[pack_len - 3],
            pack[pack_len - 2],
            pack[pack_len - 1],
        ]);
        let (ty, lo) = decode(j);
        if ty == LCLUSTER_TYPE_NONHEAD {
            if zi.big1 && lo & D0_CBLKCNT != 0 {
                return Ok(Lc {
                    ty,
                    clusterofs: 0,
                    pblk: 0,
                    delta0: 1,
                    cblkcnt: Some(lo & !D0_CBLKCNT),
                    partial_ref: false,
                });
            }
            let delta0 = if j == per - 1 {
                // The last entry of a pack stores delta[1]; rebuild delta[0].
                let (pty, plo) = decode(j - 1);
                if pty != LCLUSTER_TYPE_NONHEAD {
                    1
                } else if zi.big1 && plo & D0_CBLKCNT != 0 {
                    2
                } else {
                    plo.saturating_add(1)
                }
            } else {
                lo
            };
            return Ok(Lc {
                ty,
                clusterofs: 0,
                pblk: 0,
                delta0,
                cblkcnt: None,
                partial_ref: false,
            });
        }
        // HEAD: count pclusters before it in the pack (bounded by the pack size).
        let mut nblk: u64 = if zi.big1 { 0 } else { 1 };
        let mut x = j as i64;
        let mut guard = 0;
        while x > 0 && guard < 64 {
            guard += 1;
            x -= 1;
            let (ety, elo) = decode(x as usize);
            if zi.big1 {
                if ety == LCLUSTER_TYPE_NONHEAD {
                    if elo & D0_CBLKCNT != 0 {
                        x -= 1;
                        nblk += u64::from(elo & !D0_CBLKCNT);
                        continue;
                    }
                    if elo <= 1 {
                        return Err(self.zerr(
                            ino,
                            CorruptKind::BadLcluster,
                            lcn,
                            "bad delta in compact pack",
                        ));
                    }
                    x -= i64::from(elo) - 2;
                    continue;
                }
                nblk += 1;
            } else {
                if ety == LCLUSTER_TYPE_NONHEAD {
                    x -= i64::from(elo);
                }
                if x >= 0 {
                    nblk += 1;
                }
            }
        }
        Ok(Lc {
            ty,
            clusterofs: lo,
            pblk: u64::from(base) + nblk,
            delta0: 0,
            cblkcnt: None,
            partial_ref: false,
        })
    }

    /// The head lcluster of the extent holding logical offset `x`.
    fn find_head(&self, m: &mut MetaWin, ino: &Inode, zi: &ZInfo, x: u64) -> Result<(u64, Lc)> {
        // At or after the head of a fragment tail, the extent may be longer than
        // MAX_DSIZE (see `find_head_from`).
        let tail = zi.fragment_tail_head().is_some_and(|t| x >> zi.lbits >= t);
        self.find_head_from(m, ino, zi, x, tail)
    }

    /// [`Self::find_head`]; `tail`: `x` may lie in a file's fragment tail. That extent
    /// is not decoded as one (its bytes are read from the packed inode), and the
    /// kernel and erofs-utils bound no extent of that kind: mkfs.erofs's tails stay
    /// under about 8 MiB, ferofs's may be far longer (all of a highly compressible
    /// file after its first pclusters). Its lookback is bounded in hops instead:
    /// writers point each NONHEAD as far back as its index field reaches (up to 2047
    /// lclusters, format doc §8), so a walk of `D` lclusters takes fewer than
    /// `D / 1024` hops plus a few, and a crafted index of short hops is refused early.
    fn find_head_from(
        &self,
        m: &mut MetaWin,
        ino: &Inode,
        zi: &ZInfo,
        x: u64,
        tail: bool,
    ) -> Result<(u64, Lc)> {
        let lsz = 1u64 << zi.lbits;
        let mut lcn = x >> zi.lbits;
        let ofs = x & (lsz - 1);
        let mut lc = self.load_lcluster(m, ino, zi, lcn)?;
        if lc.ty != LCLUSTER_TYPE_NONHEAD && u64::from(lc.clusterofs) <= ofs {
            return Ok((lcn, lc));
        }
        if lc.ty != LCLUSTER_TYPE_NONHEAD {
            // Before this head's start: the previous extent.
            if lcn == 0 {
                return Err(self.zerr(
                    ino,
                    CorruptKind::BadLcluster,
                    0,
                    "first lcluster does not start an extent",
                ));
            }
            lcn -= 1;
            lc = self.load_lcluster(m, ino, zi, lcn)?;
        }
        // Walk back along delta[0]; every step goes back at least one lcluster, and no
        // further than an extent may be long (MAX_LOOKBACK_BYTES): the extent holding
        // `x` starts at most one lcluster before the head found.
        let from = x >> zi.lbits;
        let mut hops = 0u64;
        while lc.ty == LCLUSTER_TYPE_NONHEAD {
            let d = u64::from(lc.delta0);
            if d == 0 || d > lcn {
                return Err(self.zerr(ino, CorruptKind::BadLcluster, lcn, "bad lookback distance"));
            }
            lcn -= d;
            hops += 1;
            if tail {
                if hops > MIN_TAIL_HOPS + ((from - lcn) >> TAIL_HOP_BITS) {
                    return Err(self.zerr(
                        ino,
                        CorruptKind::BadLcluster,
                        lcn,
                        "fragment tail lookback in too many short hops",
                    ));
                }
            } else if (from - lcn).saturating_sub(1) << zi.lbits > MAX_LOOKBACK_BYTES {
                return Err(self.zerr(
                    ino,
                    CorruptKind::BadLcluster,
                    lcn,
                    "lookback longer than the largest extent",
                ));
            }
            lc = self.load_lcluster(m, ino, zi, lcn)?;
        }
        if u64::from(lc.clusterofs) >= lsz {
            return Err(self.zerr(
                ino,
                CorruptKind::BadLcluster,
                lcn,
                "clusterofs beyond the lcluster",
            ));
        }
        Ok((lcn, lc))
    }

    /// Map the extent holding logical offset `x` (< size).
    pub(crate) fn z_map(
        &self,
        m: &mut MetaWin,
        ino: &Inode,
        zi: &ZInfo,
        x: u64,
    ) -> Result<ZExtent> {
        if let Some(off) = zi.whole_fragment {
            return Ok(ZExtent {
                la: 0,
                end: ino.size,
                src: ZSrc::Fragment { off },
                kind: ZKind::Plain { interlaced: false },
                partial_ref: false,
            });
        }
        if zi.extents {
            return self.z_map_records(m, ino, zi, x);
        }
        let lsz = 1u64 << zi.lbits;
        let bs = 1u64 << self.blkszbits;
        let (head, lc) = self.find_head(m, ino, zi, x)?;
        let la = (head << zi.lbits) + u64::from(lc.clusterofs);
        // Extent end: the next head (its clusterofs) or the end of the file. A fragment
        // tail runs to the end of the file (and may be longer than MAX_DSIZE).
        let frag_tail = zi.fragment_tail_head() == Some(head);
        let mut end = ino.size;
        let mut k = if frag_tail { zi.nlclusters } else { head + 1 };
        // Bounded by the file and by the largest extent: lcluster k belongs to this
        // extent unless it starts the next one, so a scan past MAX_DSIZE is an error.
        while k < zi.nlclusters {
            if (k << zi.lbits).saturating_sub(la) > MAX_DSIZE {
                return Err(self.zerr(
                    ino,
                    CorruptKind::BadLcluster,
                    head,
                    "extent longer than 12 MiB",
                ));
            }
            let n = self.load_lcluster(m, ino, zi, k)?;
            if n.ty != LCLUSTER_TYPE_NONHEAD {
                end = ((k << zi.lbits) + u64::from(n.clusterofs)).min(ino.size);
                break;
            }
            k += 1;
        }
        if end <= la || (end - la > MAX_DSIZE && !frag_tail) {
            return Err(self.zerr(ino, CorruptKind::BadLcluster, head, "bad extent length"));
        }
        let kind = match lc.ty {
            LCLUSTER_TYPE_PLAIN => ZKind::Plain {
                interlaced: zi.advise & ADVISE_INTERLACED_PCLUSTER != 0,
            },
            LCLUSTER_TYPE_HEAD1 => ZKind::Compressed(zi.algs[0]),
            _ => ZKind::Compressed(zi.algs[1]),
        };
        if Some(head) == zi.tail_head {
            if let Some((rel, len)) = zi.inline {
                return Ok(ZExtent {
                    la,
                    end,
                    src: ZSrc::Inline { rel, len },
                    kind,
                    partial_ref: false,
                });
            }
            if let Some(off) = zi.fragment_off {
                return Ok(ZExtent {
                    la,
                    end,
                    src: ZSrc::Fragment { off },
                    kind: ZKind::Plain { interlaced: false },
                    partial_ref: false,
                });
            }
        }
        let big = match lc.ty {
            LCLUSTER_TYPE_HEAD1 => zi.big1,
            _ => zi.big2,
        };
        let mut blocks = 1u64;
        if big && head + 1 < zi.nlclusters {
            let n = self.load_lcluster(m, ino, zi, head + 1)?;
            if n.ty == LCLUSTER_TYPE_NONHEAD {
                match n.cblkcnt {
                    Some(c) if c > 0 => blocks = u64::from(c),
                    _ => {
                        return Err(self.zerr(
                            ino,
                            CorruptKind::BadPcluster,
                            head,
                            "missing pcluster block count",
                        ))
                    }
                }
            }
        }
        let len = blocks << self.blkszbits;
        if len > ferofs_format::PCLUSTER_MAX_SIZE {
            return Err(self.zerr(
                ino,
                CorruptKind::BadPcluster,
                len,
                "pcluster larger than 1 MiB",
            ));
        }
        let _ = (lsz, bs);
        let addr = self.blk_pos(lc.pblk).ok_or_else(|| {
            self.zerr(
                ino,
                CorruptKind::BadPcluster,
                lc.pblk,
                "pcluster address overflows",
            )
        })?;
        if addr.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(self.zerr(
                ino,
                CorruptKind::BadPcluster,
                lc.pblk,
                "pcluster beyond the end of the image",
            ));
        }
        Ok(ZExtent {
            la,
            end,
            src: ZSrc::Pcluster { addr, len },
            kind,
            partial_ref: lc.partial_ref,
        })
    }

    /// Encoded extents (48-bit layout): records instead of lcluster indexes.
    fn z_map_records(&self, m: &mut MetaWin, ino: &Inode, zi: &ZInfo, x: u64) -> Result<ZExtent> {
        let recsz = 4u64 << ((zi.advise >> 1) & 3);
        let start = (zi.hdr + MAP_HEADER_SIZE as u64).div_ceil(recsz) * recsz;
        let rec = |m: &mut MetaWin, i: u64| -> Result<[u32; 5]> {
            let mut b = [0u8; 20];
            let n = recsz.min(20) as usize;
            let at = i
                .checked_mul(recsz)
                .and_then(|x| x.checked_add(start + if recsz == 4 { 8 } else { 0 }))
                .ok_or_else(|| {
                    self.zerr(ino, CorruptKind::BadLcluster, i, "record offset overflows")
                })?;
            self.meta_read(m, ino.nid, at, &mut b[..n])?;
            let w = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
            Ok([w(0), w(4), w(8), w(12), w(16)])
        };
        let (la, end, plen, pstart) = if recsz >= 16 {
            let count = zi.extent_count;
            if count == 0 || count > ino.size {
                return Err(self.zerr(ino, CorruptKind::BadLcluster, count, "bad extent count"));
            }
            let lstart = |r: &[u32; 5]| {
                u64::from(r[3])
                    | if recsz >= 32 {
                        u64::from(r[4]) << 32
                    } else {
                        0
                    }
            };
            // Binary search: last record with lstart <= x (bounded by log2(count)).
            let (mut lo, mut hi) = (0u64, count);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if lstart(&rec(m, mid)?) <= x {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let r = rec(m, lo)?;
            let end = if lo + 1 < count {
                lstart(&rec(m, lo + 1)?)
            } else {
                ino.size
            };
            (
                lstart(&r),
                end.min(ino.size),
                r[0],
                u64::from(r[1]) | (u64::from(r[2]) << 32),
            )
        } else if recsz == 8 {
            let lcn = x >> zi.lbits;
            let r = rec(m, lcn)?;
            let la = lcn << zi.lbits;
            (
                la,
                (la + (1 << zi.lbits)).min(ino.size),
                r[0],
                u64::from(r[1]),
            )
        } else {
            let lcn = x >> zi.lbits;
            if lcn > zi.nlclusters {
                return Err(self.zerr(
                    ino,
                    CorruptKind::BadLcluster,
                    lcn,
                    "record beyond the file",
                ));
            }
            // Physical start = the first record's base + the lengths of the records
            // before; resumed from the last lookup of this inode when it lies behind.
            let (from, mut pa) = match m.rec4 {
                Some((img, nid, l, p)) if img == self.id && nid == ino.nid && l <= lcn => (l, p),
                _ => {
                    let mut b = [0u8; 8];
                    self.meta_read(m, ino.nid, start, &mut b)?;
                    (0, u64::from_le_bytes(b))
                }
            };
            // Bounded by the file's lcluster count (checked above).
            for i in from..lcn {
                pa = pa.saturating_add(u64::from(rec(m, i)?[0] & 0x1F_FFFF));
            }
            m.rec4 = Some((self.id, ino.nid, lcn, pa));
            let la = lcn << zi.lbits;
            (
                la,
                (la + (1 << zi.lbits)).min(ino.size),
                rec(m, lcn)?[0],
                pa,
            )
        };
        if end <= la || x < la {
            return Err(self.zerr(ino, CorruptKind::BadLcluster, la, "bad extent record"));
        }
        let is_last = end >= ino.size;
        if is_last && zi.fragment_off.is_some() {
            // The kernel: the record's plen is the fragment offset, its pstart (records
            // of 8 bytes and more) the offset's high bits. Records of 4 bytes have no
            // pstart of their own (`pstart` here is the sum of the lengths before).
            let off = if recsz > 4 {
                u64::from(plen) | (pstart << 32)
            } else {
                u64::from(plen)
            };
            return Ok(ZExtent {
                la,
                end,
                src: ZSrc::Fragment { off },
                kind: ZKind::Plain { interlaced: false },
                partial_ref: false,
            });
        }
        let len = u64::from(plen & 0x1F_FFFF);
        if len == 0 {
            return Ok(ZExtent {
                la,
                end,
                src: ZSrc::Hole,
                kind: ZKind::Plain { interlaced: false },
                partial_ref: false,
            });
        }
        let fmt = plen >> 28;
        let bs = 1u64 << self.blkszbits;
        let kind = if fmt == 0 {
            // As the kernel: interlaced when the inode says so and the pcluster starts
            // on a block.
            ZKind::Plain {
                interlaced: zi.advise & ADVISE_INTERLACED_PCLUSTER != 0 && pstart % bs == 0,
            }
        } else {
            ZKind::Compressed((fmt - 1) as u8)
        };
        if len > ferofs_format::PCLUSTER_MAX_SIZE
            || pstart.checked_add(len).is_none_or(|e| e > self.len)
        {
            return Err(self.zerr(
                ino,
                CorruptKind::BadPcluster,
                pstart,
                "encoded extent beyond the image",
            ));
        }
        Ok(ZExtent {
            la,
            end,
            src: ZSrc::Pcluster { addr: pstart, len },
            kind,
            partial_ref: plen & (1 << 27) != 0,
        })
    }
}
