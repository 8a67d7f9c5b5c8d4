//! Stage 4, metadata layout: every inode's metadata record (core + xattrs + inline tail,
//! chunk map or compressed index) is packed into metadata blocks, which fixes its nid.
//!
//! Records with inline data (a tail or a compressed pcluster behind the inode) must not
//! cross a block boundary; the others may (the kernel reads inodes, xattrs and indexes
//! across blocks: index packs and chunk entries are aligned, so none is split). So:
//! first the root (its nid must stay small; a root record longer than a block, which has
//! no inline data, begins the stream instead) and the block-bound records, best fit; then
//! the others, each into the tightest gap left that holds it whole, else onto one
//! stream at the end that runs across block boundaries and wastes nothing.
//!
//! With `--sort`, the records of the listed files and of the directories on their
//! paths ([`front`]) come first, right behind the root, one after the other in the
//! order a lookup meets them, so that what a program reads at start-up is a few
//! contiguous blocks of metadata instead of one block per file.
//!
//! Preferred: nids count from byte 0 and the root (packed first) sits behind the
//! superblock, like mkfs.erofs, so block 0 is not wasted. When the root does not fit
//! there, its nid would not fit 16 bits: nids count from the metadata region instead.
//!
//! With a metabox (`-m`, [`assign_metabox`]) the same packing runs in the metabox
//! inode's data, from its byte 0 (root first: nid `1 << 63`): its blocks are the blocks
//! of that data, which the kernel reads like the image's (a record with inline data
//! must not cross one of them; compact indexes pack by the position in that data). The
//! metabox inode's own record then goes into the image alone ([`place_alone`]).

use crate::layout::Layout;
use crate::options::*;
use crate::plan::Plan;
use crate::scan::{InodeId, Tree};
use std::collections::BTreeSet;

/// A metadata record's length, which for a compressed file depends on where it starts:
/// compact index sizes depend on the position modulo 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Fixed(u64),
    /// `head` bytes (core, xattrs, padding, map header), then the compact index of
    /// `lclusters` entries, then `tail` bytes (an inline pcluster).
    Compact {
        head: u64,
        lclusters: usize,
        tail: u64,
    },
}

impl Shape {
    /// Length of the record when it starts at byte `off` (absolute, or of the
    /// block-aligned metadata region: only `off % 32` matters).
    pub fn len(self, off: u64) -> u64 {
        match self {
            Shape::Fixed(n) => n,
            Shape::Compact {
                head,
                lclusters,
                tail,
            } => {
                head + ferofs_format::zindex::compact_size(lclusters, off + head, true) as u64
                    + tail
            }
        }
    }
}

/// One inode's record as the packer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub shape: Shape,
    /// Holds inline data: must sit within one block.
    pub bound: bool,
}

/// Where a compressed file's encoded-extent records start in its record, after `base`
/// bytes of core and xattrs: behind the 8-byte map header, aligned to `recsz` (format
/// doc §8.11; records start 32-byte aligned, so this does not depend on the position).
pub fn extent_records_at(base: u64, recsz: u64) -> u64 {
    (base.div_ceil(8) * 8 + 8).div_ceil(recsz) * recsz
}

/// How a compressed file's extents are mapped in its record (format doc §8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZMap {
    /// Compact lcluster indexes (layout 3).
    Compact,
    /// Full 8-byte lcluster indexes (layout 1): shared pclusters, fragment offsets past
    /// 4 GiB.
    Full,
    /// Encoded extents of `recsz` bytes a record (layout 1 + `ADVISE_EXTENTS`).
    Extents { recsz: u64 },
}

/// How compressed file `id` (`z`) is mapped, and its record's shape that way. Encoded
/// extents (48-bit layout, format doc §8.11) replace the lcluster index when the image
/// has the 48-bit layout and they are shorter: one 16-byte record an extent (32 bytes
/// past 4 GiB, whose logical starts need 64 bits) instead of one index entry an
/// lcluster, so the packed inode of a source tree (a gigabyte of 4 KiB lclusters in a
/// few thousand pclusters) shrinks from hundreds of KB of index to tens. Not with an
/// inline pcluster (ztailpacking), which mkfs.erofs never writes with extents either.
pub fn zmap(plan: &Plan, id: InodeId, z: &crate::zdata::ZFile) -> (ZMap, Shape) {
    let base = plan.fixed_meta(id);
    let lclusters = plan.sizes[id].div_ceil(plan.bs);
    let tail = z.inline.as_ref().map_or(0, |(b, _)| b.len() as u64);
    let index = if z.full_index {
        let len = base.div_ceil(8) * 8 + 16 + 8 * lclusters + tail;
        (ZMap::Full, Shape::Fixed(len))
    } else {
        let shape = Shape::Compact {
            head: base.div_ceil(8) * 8 + 8,
            lclusters: lclusters as usize,
            tail,
        };
        (ZMap::Compact, shape)
    };
    if !plan.layout48 || z.inline.is_some() || z.extents.is_empty() {
        return index;
    }
    let recsz = if plan.sizes[id] > u64::from(u32::MAX) {
        32
    } else {
        16
    };
    let extents = extent_records_at(base, recsz) + recsz * z.extents.len() as u64;
    // A compact index's length depends a little on its position; at 0 is near enough
    // for the choice, made once here for the packer and the encoder alike.
    if extents < index.1.len(0) {
        (ZMap::Extents { recsz }, Shape::Fixed(extents))
    } else {
        index
    }
}

/// The record of inode `id` with data at `layout`.
pub fn record(plan: &Plan, id: InodeId, layout: &Layout) -> Record {
    let base = plan.fixed_meta(id);
    let bs = plan.bs;
    let content_inline = plan.content_inline[id];
    let shape = match layout {
        // Map header and 8 reserved bytes (format doc §8.2).
        Layout::Fragment { .. } => Shape::Fixed(base.div_ceil(8) * 8 + 16),
        Layout::Compressed(z) => zmap(plan, id, z).1,
        Layout::Inline { tail, .. } => Shape::Fixed(base + tail.len() as u64),
        Layout::Chunked {
            map, indexes: true, ..
        } => Shape::Fixed(base.div_ceil(8) * 8 + 8 * map.len() as u64),
        Layout::Chunked { map, .. } => Shape::Fixed(base.div_ceil(4) * 4 + 4 * map.len() as u64),
        Layout::ChunkIndex {
            count, tail_blk, ..
        } => Shape::Fixed(
            base.div_ceil(8) * 8 + 8 * (u64::from(*count) + u64::from(tail_blk.is_some())),
        ),
        Layout::Plain { .. } if content_inline => Shape::Fixed(base + plan.sizes[id] % bs),
        Layout::Plain { .. } => Shape::Fixed(base),
    };
    let bound =
        layout.inline_pcluster() || matches!(layout, Layout::Inline { .. }) || content_inline;
    Record { shape, bound }
}

/// Where the metadata records went.
#[derive(Debug, Clone)]
pub struct MetaLayout {
    /// Per inode: absolute byte position of its record.
    pub pos: Vec<u64>,
    /// First block of the metadata region (the first block after the data).
    pub base: u64,
    /// Blocks of the metadata region (records behind the superblock not counted).
    pub blocks: u64,
    /// The superblock's meta_blkaddr: nids count from this block.
    pub blkaddr: u64,
    bs: u64,
    /// The positions are in the metabox inode's data (base and blkaddr 0).
    pub metabox: bool,
}

/// nid bit 63: the inode lives in the metabox inode's data.
pub const NID_METABOX: u64 = 1 << 63;

impl MetaLayout {
    pub fn nid(&self, id: InodeId) -> u64 {
        let slot = (self.pos[id] - self.blkaddr * self.bs) / 32;
        if self.metabox {
            slot | NID_METABOX
        } else {
            slot
        }
    }

    /// First block after the metadata region.
    pub fn end_blk(&self) -> u64 {
        self.base + self.blocks
    }
}

/// The inodes `--sort` puts first, in order: for each listed path that names a regular
/// file, the directories on its way not met yet (outermost first), then the file; the
/// root, which always goes first, is left out. Paths that name nothing or no regular
/// file are skipped (the data stage warns about them).
pub fn front(tree: &Tree, paths: &[Vec<u8>]) -> Vec<InodeId> {
    let mut seen = vec![false; tree.nodes.len()];
    seen[tree.root] = true;
    let mut out = Vec::new();
    for p in paths {
        let Some(way) = tree.lookup_way(p) else {
            continue;
        };
        let is_file = way
            .last()
            .is_some_and(|&id| matches!(tree.nodes[id].kind, crate::scan::Kind::File { .. }));
        if !is_file {
            continue;
        }
        for id in way {
            if !seen[id] {
                seen[id] = true;
                out.push(id);
            }
        }
    }
    out
}

/// Pack the records of every inode of `tree` (data at `layouts`) from block `base`,
/// the inodes of `first` (see [`front`]) right behind the root.
pub fn assign(
    tree: &Tree,
    plan: &Plan,
    layouts: &[Layout],
    base: u64,
    first: &[InodeId],
) -> Result<MetaLayout> {
    let records: Vec<Record> = layouts
        .iter()
        .enumerate()
        .map(|(id, l)| record(plan, id, l))
        .collect();
    let bs = plan.bs;
    let bad_inline = |id: InodeId| BuildError::Invalid {
        path: String::from_utf8_lossy(&tree.nodes[id].rel)
            .into_owned()
            .into(),
        what: "inline record larger than a block".into(),
    };
    // The free end of block 0, behind the superblock and its config records.
    let sb_end = plan.cfg.end().div_ceil(32) * 32;
    let sb_slot = (plan.first_blk - 1, sb_end);
    let (pos, blocks, blkaddr) = {
        let (p, m) =
            pack(&records, tree.root, first, base, Some(sb_slot), bs).map_err(bad_inline)?;
        // The 48-bit layout's superblock holds a 64-bit root nid.
        if p[tree.root] / 32 <= 0xFFFF || plan.layout48 {
            (p, m, 0u64)
        } else {
            let (p, m) = pack(&records, tree.root, first, base, None, bs).map_err(bad_inline)?;
            (p, m, base)
        }
    };
    let meta = MetaLayout {
        pos,
        base,
        blocks,
        blkaddr,
        bs,
        metabox: false,
    };
    if meta.nid(tree.root) > 0xFFFF && !plan.layout48 {
        return Err(BuildError::TooLarge("root nid does not fit 16 bits".into()));
    }
    Ok(meta)
}

/// In-place append: pack the records of the inodes `fixed` does not place from block
/// `base`, nids counting from block `blkaddr` (the image's meta_blkaddr); an inode
/// `fixed` names keeps that nid (the image's inodes, and the root, whose record the
/// caller writes over its old one).
pub fn assign_append(
    tree: &Tree,
    plan: &Plan,
    layouts: &[Layout],
    base: u64,
    fixed: &[Option<u64>],
    blkaddr: u64,
) -> Result<MetaLayout> {
    let bs = plan.bs;
    let ids: Vec<InodeId> = (0..layouts.len())
        .filter(|&id| fixed.get(id).copied().flatten().is_none())
        .collect();
    let records: Vec<Record> = ids
        .iter()
        .map(|&id| record(plan, id, &layouts[id]))
        .collect();
    let mut pos = vec![0u64; layouts.len()];
    let mut blocks = 0;
    if !records.is_empty() {
        let (p, b) = pack(&records, 0, &[], base, None, bs).map_err(|k| BuildError::Invalid {
            path: String::from_utf8_lossy(&tree.nodes[ids[k]].rel)
                .into_owned()
                .into(),
            what: "inline record larger than a block".into(),
        })?;
        for (k, &id) in ids.iter().enumerate() {
            pos[id] = p[k];
        }
        blocks = b;
    }
    for (id, f) in fixed.iter().enumerate() {
        if let Some(nid) = f {
            pos[id] = nid
                .checked_mul(32)
                .and_then(|x| x.checked_add(blkaddr.checked_mul(bs)?))
                .ok_or_else(|| BuildError::TooLarge(format!("nid {nid}")))?;
        }
    }
    Ok(MetaLayout {
        pos,
        base,
        blocks,
        blkaddr,
        bs,
        metabox: false,
    })
}

/// Pack the records of every inode of `tree` (data at `layouts`) into the metabox
/// inode's data, from its byte 0, the inodes of `first` right behind the root. `blocks`
/// is then the length of that data in blocks.
pub fn assign_metabox(
    tree: &Tree,
    plan: &Plan,
    layouts: &[Layout],
    first: &[InodeId],
) -> Result<MetaLayout> {
    let records: Vec<Record> = layouts
        .iter()
        .enumerate()
        .map(|(id, l)| record(plan, id, l))
        .collect();
    let (pos, blocks) =
        pack(&records, tree.root, first, 0, None, plan.bs).map_err(|id| BuildError::Invalid {
            path: String::from_utf8_lossy(&tree.nodes[id].rel)
                .into_owned()
                .into(),
            what: "inline record larger than a block".into(),
        })?;
    Ok(MetaLayout {
        pos,
        base: 0,
        blocks,
        blkaddr: 0,
        bs: plan.bs,
        metabox: true,
    })
}

/// Where records kept out of a metabox go, one after the other: behind the
/// superblock from byte `from` while they fit by byte `limit`, else from block `base`
/// on, across blocks unless block-bound (then at a block start when it would cross).
/// Returns each record's byte position and the blocks taken from `base`, or the index
/// of a block-bound record longer than a block.
pub fn place_outside(
    recs: &[Record],
    from: u64,
    limit: u64,
    base: u64,
    bs: u64,
) -> Result<(Vec<u64>, u64), usize> {
    let mut at0 = from;
    let mut at = base * bs;
    let mut pos = Vec::with_capacity(recs.len());
    for (i, r) in recs.iter().enumerate() {
        let a = at0.div_ceil(32) * 32;
        if a + r.shape.len(a) <= limit {
            at0 = a + r.shape.len(a);
            pos.push(a);
            continue;
        }
        let mut a = at.div_ceil(32) * 32;
        if r.bound && r.shape.len(a) > bs {
            return Err(i);
        }
        if r.bound && a % bs + r.shape.len(a) > bs {
            a = a.div_ceil(bs) * bs;
        }
        at = a + r.shape.len(a);
        pos.push(a);
    }
    Ok((pos, (at - base * bs).div_ceil(bs)))
}

/// Free slots (free bytes, absolute block, start offset in the block): best fit, ties
/// to the lowest block, so packing is deterministic.
type Slots = BTreeSet<(u64, u64, u64)>;

fn add_slot(set: &mut Slots, blk: u64, start: u64, end: u64) {
    let start = start.div_ceil(32) * 32;
    if end >= start + 32 {
        set.insert((end - start, blk, start));
    }
}

/// Pack `records` into metadata blocks from `base` (absolute block numbers), the root
/// first, optionally starting with the free tail of block `sb_slot.0` from byte
/// `sb_slot.1`; then the records of `first`, one behind the other in that order from
/// the first new block (a block-bound one that would cross a block boundary begins the
/// next block, and the gap is filled later). Returns each record's absolute byte
/// position and the number of new blocks, or the inode whose block-bound record does
/// not fit a block.
fn pack(
    records: &[Record],
    root: InodeId,
    first: &[InodeId],
    base: u64,
    sb_slot: Option<(u64, u64)>,
    bs: u64,
) -> Result<(Vec<u64>, u64), InodeId> {
    let n = records.len();
    let mut is_first = vec![false; n];
    let mut order: Vec<InodeId> = Vec::with_capacity(n);
    order.push(root);
    is_first[root] = true;
    for &id in first {
        if !is_first[id] {
            is_first[id] = true;
            order.push(id);
        }
    }
    let n_first = order.len();
    order.extend((0..n).filter(|&id| !is_first[id] && records[id].bound));
    order.extend((0..n).filter(|&id| !is_first[id] && !records[id].bound));
    let mut pos = vec![0u64; n];
    let mut free_set = Slots::new();
    if let Some((blk, from)) = sb_slot {
        add_slot(&mut free_set, blk, from - blk * bs, bs);
    }
    let mut meta_blocks = 0u64;
    // The stream's next byte, once it has begun.
    let mut stream: Option<u64> = None;
    // `first`'s records, in a row from the first new block.
    let mut row: Option<u64> = None;
    for (k, &id) in order.iter().enumerate() {
        let shape = records[id].shape;
        if k == n_first {
            // The rest of the row's last block is a gap like any other.
            if let Some(p) = row.take() {
                if p % bs != 0 {
                    add_slot(&mut free_set, p / bs, p % bs, bs);
                }
            }
        }
        if k > 0 && k < n_first {
            let mut a = row.unwrap_or((base + meta_blocks) * bs).div_ceil(32) * 32;
            let bound = records[id].bound;
            if bound && a % bs + shape.len(a) > bs {
                add_slot(&mut free_set, a / bs, a % bs, bs);
                a = a.div_ceil(bs) * bs;
                if shape.len(a) > bs {
                    return Err(id);
                }
            }
            pos[id] = a;
            let end = a + shape.len(a);
            meta_blocks = meta_blocks.max(end.div_ceil(bs) - base);
            row = Some(end);
            continue;
        }
        let len0 = shape.len(0).div_ceil(32) * 32;
        // The root goes first, in one block when it fits one (its nid stays small
        // either way: it begins the region or the stream).
        let bound = records[id].bound || (id == root && len0 <= bs);
        if len0 > bs && bound {
            return Err(id);
        }
        // The index size depends on the offset modulo 32 (index areas are 8-aligned):
        // start from the smallest size it can have, confirm at the candidate.
        let lower = (0..4u64)
            .map(|a| shape.len(a * 8).div_ceil(32) * 32)
            .min()
            .unwrap_or(len0);
        let mut chosen = None;
        for &(free, blk, start) in free_set.range((lower, 0, 0)..).take(8) {
            let len = shape.len(blk * bs + start).div_ceil(32) * 32;
            if len <= free {
                chosen = Some((free, blk, start, len));
                break;
            }
        }
        if let Some((free, blk, start, len)) = chosen {
            free_set.remove(&(free, blk, start));
            pos[id] = blk * bs + start;
            add_slot(&mut free_set, blk, start + len, start + free);
        } else if bound {
            // (Never after the stream began: block-bound records come first. Should
            // one come later, the stream ends and its block's rest becomes a gap.)
            if let Some(p) = stream.take() {
                if p % bs != 0 {
                    add_slot(&mut free_set, p / bs, p % bs, bs);
                }
            }
            let blk = base + meta_blocks;
            meta_blocks += 1;
            pos[id] = blk * bs;
            let len = shape.len(pos[id]).div_ceil(32) * 32;
            if len > bs {
                return Err(id);
            }
            add_slot(&mut free_set, blk, len.min(bs), bs);
        } else {
            let at = match stream {
                Some(p) => p,
                None => {
                    // Begin in the free end of the last block, if it has one.
                    let last = (base + meta_blocks).checked_sub(1).filter(|&b| b >= base);
                    let end_slot = last.and_then(|b| {
                        free_set
                            .iter()
                            .find(|&&(free, blk, start)| blk == b && start + free == bs)
                            .copied()
                    });
                    match end_slot {
                        Some(slot) => {
                            free_set.remove(&slot);
                            slot.1 * bs + slot.2
                        }
                        None => (base + meta_blocks) * bs,
                    }
                }
            };
            pos[id] = at;
            let end = at + shape.len(at);
            meta_blocks = meta_blocks.max(end.div_ceil(bs) - base);
            stream = Some(end.div_ceil(32) * 32);
        }
    }
    Ok((pos, meta_blocks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(len: u64, bound: bool) -> Record {
        Record {
            shape: Shape::Fixed(len),
            bound,
        }
    }

    #[test]
    fn root_behind_the_superblock_then_best_fit_then_stream() -> Result<(), InodeId> {
        // Block 0 free from byte 1184 (superblock end rounded to 32) of 4096.
        let recs = vec![
            fixed(64, true),    // root
            fixed(32, false),   // into the tightest gap left
            fixed(3000, true),  // does not fit block 0's rest: a new block
            fixed(2000, true),  // best fit: block 0's rest (2848 bytes left)
            fixed(5000, false), // fits no gap: on the stream, across blocks
        ];
        let (pos, blocks) = pack(&recs, 0, &[], 10, Some((0, 1184)), 4096)?;
        assert_eq!(pos[0], 1184);
        assert_eq!(pos[2], 10 * 4096);
        assert_eq!(pos[3], 1184 + 64);
        // Gaps left: 832 bytes in block 0, 1088 at the end of block 10.
        assert_eq!(pos[1], 1184 + 64 + 2016);
        // The stream begins in the free end of the last new block.
        assert_eq!(pos[4], 10 * 4096 + 3008);
        assert_eq!(blocks, 2);
        Ok(())
    }

    #[test]
    fn outside_records_behind_the_superblock_or_from_base() {
        // Block 0 free from byte 1168: rounded up to 1184; the next one behind it.
        let (pos, blocks) =
            place_outside(&[fixed(200, false), fixed(64, false)], 1168, 4096, 9, 4096)
                .expect("fits");
        assert_eq!((pos, blocks), (vec![1184, 1408], 0));
        // 3000 bytes do not fit 1184..4096: block 9; a short one still goes behind the
        // superblock; a long unbound record runs across blocks.
        let recs = [fixed(3000, false), fixed(100, false), fixed(9000, false)];
        let (pos, blocks) = place_outside(&recs, 1168, 4096, 9, 4096).expect("fits");
        assert_eq!((pos, blocks), (vec![9 * 4096, 1184, 9 * 4096 + 3008], 3));
        // A bound record does not cross a block boundary, and may not exceed one.
        let recs = [fixed(3000, false), fixed(2000, true)];
        let (pos, blocks) = place_outside(&recs, 4000, 4096, 9, 4096).expect("fits");
        assert_eq!((pos, blocks), (vec![9 * 4096, 10 * 4096], 2));
        assert_eq!(
            place_outside(&[fixed(4097, true)], 1168, 4096, 9, 4096),
            Err(0)
        );
    }

    #[test]
    fn metabox_nids_have_bit_63() {
        let m = MetaLayout {
            pos: vec![0, 96, 4096],
            base: 0,
            blocks: 2,
            blkaddr: 0,
            bs: 4096,
            metabox: true,
        };
        assert_eq!(m.nid(0), 1 << 63);
        assert_eq!(m.nid(1), (1 << 63) | 3);
        assert_eq!(m.nid(2), (1 << 63) | 128);
    }

    #[test]
    fn first_records_in_a_row_behind_the_root() -> Result<(), InodeId> {
        let recs = vec![
            fixed(64, true),    // root: behind the superblock
            fixed(100, false),  // first, second
            fixed(3000, true),  // not first: best fit, into the row's gap
            fixed(64, false),   // first, first
            fixed(4000, true),  // first, third: would cross, begins block 11
            fixed(5000, false), // not first: on the stream
        ];
        let (pos, blocks) = pack(&recs, 0, &[3, 1, 4, 3], 10, Some((0, 1184)), 4096)?;
        assert_eq!(pos[0], 1184);
        assert_eq!(pos[3], 10 * 4096);
        assert_eq!(pos[1], 10 * 4096 + 64);
        assert_eq!(pos[4], 11 * 4096);
        // Block 10's rest (from 192) is the best fit for 3000 bytes (block 0 has 2848).
        assert_eq!(pos[2], 10 * 4096 + 192);
        // The stream begins in the free end of the last block.
        assert_eq!(pos[5], 11 * 4096 + 4000);
        assert_eq!(blocks, 4);
        // Without a list: the bound records first (2 opens block 10, 4 block 11), then
        // best fit: 1 behind 2, 3 into block 11's last 96 bytes.
        let (pos, _) = pack(&recs, 0, &[], 10, Some((0, 1184)), 4096)?;
        assert_eq!(pos[1], 10 * 4096 + 3008);
        assert_eq!(pos[3], 11 * 4096 + 4000);
        Ok(())
    }

    #[test]
    fn bound_record_larger_than_a_block_is_refused() {
        let recs = vec![fixed(64, true), fixed(4097, true)];
        assert_eq!(pack(&recs, 0, &[], 1, None, 4096), Err(1));
    }

    #[test]
    fn compact_shape_depends_on_position_mod_32() {
        let s = Shape::Compact {
            head: 40,
            lclusters: 40,
            tail: 0,
        };
        // e_pos % 32 == 8: 6 leading 4-byte entries, then 2 packs of 16 (2-byte), 2 left.
        assert_eq!(s.len(0), 40 + 4 * 6 + 2 * 32 + 4 * 2);
        assert_eq!(s.len(32), s.len(0));
    }
}
