//! One inode's metadata record: the core (compact or extended), the xattr area, then by
//! layout the inline tail, the chunk map, or the compressed map header with its compact
//! index and inline pcluster. Its length matches [`crate::nids::record`]'s shape.

use crate::layout::Layout;
use crate::nids::ZMap;
use crate::options::*;
use crate::plan::Plan;
use crate::scan::{InodeId, Kind, Node};
use ferofs_format::inode::*;
use ferofs_format::zindex::HeadKind;
use ferofs_format::{zindex, zmap};

/// Encode the record of inode `id` (`nd`), data at `layout`, placed at absolute byte
/// `pos` (the compact index's packing depends on it). `big_pcluster`: the image's
/// compressed files use the big-pcluster index format.
pub fn encode(
    plan: &Plan,
    id: InodeId,
    nd: &Node,
    layout: &Layout,
    pos: u64,
    big_pcluster: bool,
) -> Result<Vec<u8>> {
    let ext = plan.extended[id];
    let mapping = match layout {
        Layout::Compressed(z) => crate::nids::zmap(plan, id, z).0,
        _ => ZMap::Compact,
    };
    let (data_layout, u) = match layout {
        Layout::Plain { startblk } => (DataLayout::FlatPlain, *startblk),
        Layout::Inline { startblk, .. } => (
            DataLayout::FlatInline,
            startblk.unwrap_or(u64::from(u32::MAX)),
        ),
        Layout::Chunked {
            chunk_rel, indexes, ..
        } => (
            DataLayout::ChunkBased,
            u64::from(*chunk_rel)
                | if *indexes {
                    u64::from(ferofs_format::chunk::CHUNK_FORMAT_INDEXES)
                } else {
                    0
                },
        ),
        Layout::ChunkIndex { chunk_rel, .. } => (
            DataLayout::ChunkBased,
            u64::from(*chunk_rel) | u64::from(ferofs_format::chunk::CHUNK_FORMAT_INDEXES),
        ),
        Layout::Compressed(z) if mapping == ZMap::Compact => {
            (DataLayout::CompressedCompact, z.blocks)
        }
        Layout::Compressed(z) => (DataLayout::CompressedFull, z.blocks),
        Layout::Fragment { .. } => (DataLayout::CompressedFull, 0),
    };
    let u = match nd.kind {
        Kind::Device { rdev } => u64::from(rdev),
        Kind::Fifo | Kind::Socket => 0,
        _ => u,
    };
    let u32v = u32::try_from(u)
        .map_err(|_| BuildError::TooLarge("block address beyond 2^32 blocks".into()))?;
    let area = &plan.xattrs.ibody[id];
    let size = plan.sizes[id];
    let core = InodeCore {
        format: make_format(
            ext,
            data_layout,
            plan.dot_omitted && matches!(nd.kind, Kind::Dir { .. }),
        ),
        xattr_icount: xattr_icount_for(area.len()).unwrap_or(0),
        mode: nd.mode,
        nb: if ext { 0 } else { nd.nlink as u16 },
        size,
        // Compact: seconds from the epoch (the plan made it compact only if they fit).
        mtime: if ext {
            nd.mtime
        } else {
            nd.mtime.wrapping_sub(plan.epoch)
        },
        mtime_nsec: if ext { nd.mtime_nsec } else { 0 },
        u: u32v,
        ino: plan.ino_base.wrapping_add(id as u32 + 1),
        uid: nd.uid,
        gid: nd.gid,
        nlink_ext: nd.nlink,
    };
    let mut rec: Vec<u8> = if ext {
        core.encode_extended().to_vec()
    } else {
        core.encode_compact().to_vec()
    };
    rec.extend_from_slice(area);
    match (layout, mapping) {
        (Layout::Inline { tail, .. }, _) => rec.extend_from_slice(&tail.bytes()?),
        (
            Layout::Chunked {
                map,
                indexes: true,
                device,
                ..
            },
            _,
        ) => {
            rec.resize(rec.len().div_ceil(8) * 8, 0);
            for &m in map {
                let e = ferofs_format::chunk::ChunkIndex {
                    startblk_hi: 0,
                    // A hole is a hole on any device.
                    device_id: if m == u32::MAX { 0 } else { *device },
                    startblk_lo: m,
                };
                rec.extend_from_slice(&e.encode());
            }
        }
        (Layout::Chunked { map, .. }, _) => {
            rec.resize(rec.len().div_ceil(4) * 4, 0);
            for m in map {
                rec.extend_from_slice(&m.to_le_bytes());
            }
        }
        (
            Layout::ChunkIndex {
                chunk_rel,
                device,
                blkaddr,
                count,
                tail_blk,
            },
            _,
        ) => {
            rec.resize(rec.len().div_ceil(8) * 8, 0);
            let blocks_per_chunk = 1u64 << chunk_rel;
            for k in 0..u64::from(*count) {
                let blk = u64::from(*blkaddr) + k * blocks_per_chunk;
                let lo = u32::try_from(blk)
                    .map_err(|_| BuildError::TooLarge("extra device block beyond 2^32".into()))?;
                let e = ferofs_format::chunk::ChunkIndex {
                    startblk_hi: 0,
                    device_id: *device,
                    startblk_lo: lo,
                };
                rec.extend_from_slice(&e.encode());
            }
            if let Some(t) = tail_blk {
                let e = ferofs_format::chunk::ChunkIndex {
                    startblk_hi: 0,
                    device_id: 0,
                    startblk_lo: *t,
                };
                rec.extend_from_slice(&e.encode());
            }
        }
        (Layout::Plain { .. }, _) => {}
        (Layout::Fragment { off }, _) => {
            // The whole file is at `off` of the packed inode: the header read as a
            // u64 is the offset with bit 63 set; 8 reserved bytes follow.
            if *off >> 63 != 0 {
                return Err(BuildError::TooLarge("fragment offset beyond 2^63".into()));
            }
            rec.resize(rec.len().div_ceil(8) * 8, 0);
            rec.extend_from_slice(&(off | 1 << 63).to_le_bytes());
            rec.extend_from_slice(&[0u8; 8]);
        }
        (Layout::Compressed(z), ZMap::Extents { recsz }) => {
            encode_extents(&mut rec, plan, nd, z, recsz)?;
        }
        (Layout::Compressed(z), _) => {
            rec.resize(rec.len().div_ceil(8) * 8, 0);
            // (For full indexes bit 0 would mean encoded extents.)
            let mut advise = if z.full_index {
                0
            } else {
                zmap::ADVISE_COMPACTED_2B
            };
            if big_pcluster {
                advise |= zmap::ADVISE_BIG_PCLUSTER_1 | zmap::ADVISE_BIG_PCLUSTER_2;
            }
            let mut word0 = 0u32;
            if let Some((b, _)) = &z.inline {
                advise |= zmap::ADVISE_INLINE_PCLUSTER;
                word0 = (b.len() as u32) << 16;
            }
            if let Some(off) = z.fragment {
                // The low half here; with full indexes the high half is in the tail
                // head's block address.
                advise |= zmap::ADVISE_FRAGMENT_PCLUSTER;
                word0 = off as u32;
            }
            let h = zmap::MapHeader {
                word0,
                advise,
                algorithmtype: z.alg_id,
                clusterbits: 0,
            };
            rec.extend_from_slice(&h.encode());
            let bad_index = |e| BuildError::Invalid {
                path: String::from_utf8_lossy(&nd.rel).into_owned().into(),
                what: format!("index: {e:?}"),
            };
            let ents = zindex::lcluster_entries(&z.extents, size, plan.bits, big_pcluster)
                .map_err(bad_index)?;
            if z.full_index {
                rec.extend_from_slice(&[0u8; 8]);
                rec.extend_from_slice(&zindex::encode_full(&ents));
            } else {
                let e_pos = pos + rec.len() as u64;
                let idx =
                    zindex::encode_compact(&ents, e_pos, true, big_pcluster).map_err(bad_index)?;
                rec.extend_from_slice(&idx);
            }
            if let Some((b, _)) = &z.inline {
                rec.extend_from_slice(b);
            }
        }
    }
    Ok(rec)
}

/// Append the map header and encoded-extent records of `z` (format doc §8.11) to `rec`
/// (core and xattrs so far): `recsz` 16 or 32 bytes a record, the extent count in the
/// header, byte addresses and lengths, the algorithm in each record, the fragment
/// tail's offset in the last record.
fn encode_extents(
    rec: &mut Vec<u8>,
    plan: &Plan,
    nd: &Node,
    z: &crate::zdata::ZFile,
    recsz: u64,
) -> Result<()> {
    let bad = |what: String| BuildError::Invalid {
        path: String::from_utf8_lossy(&nd.rel).into_owned().into(),
        what,
    };
    let count = z.extents.len() as u64;
    let records_at = crate::nids::extent_records_at(rec.len() as u64, recsz) as usize;
    rec.resize(rec.len().div_ceil(8) * 8, 0);
    let mut advise = zmap::ADVISE_EXTENTS | ((recsz / 4).trailing_zeros() as u16) << 1;
    if z.fragment.is_some() {
        advise |= zmap::ADVISE_FRAGMENT_PCLUSTER;
    }
    // Bytes 6-7 are the count's high half (below 2^47: the whole-file fragment bit 63
    // stays clear).
    let h = zmap::MapHeader {
        word0: count as u32,
        advise,
        algorithmtype: (count >> 32) as u8,
        clusterbits: (count >> 40) as u8,
    };
    rec.extend_from_slice(&h.encode());
    rec.resize(records_at, 0);
    let last = z.extents.len() - 1;
    for (k, e) in z.extents.iter().enumerate() {
        let (w0, pstart) = match z.fragment {
            // The fragment tail: its offset in the packed inode's data.
            Some(off) if k == last => (off as u32, off >> 32),
            _ => {
                let len = u32::from(e.blocks) << plan.bits;
                if len == 0 || len > 0x1F_FFFF {
                    return Err(bad(format!(
                        "extent at {}: pcluster of {len} bytes",
                        e.lstart
                    )));
                }
                let fmt = match e.kind {
                    HeadKind::Plain => 0,
                    HeadKind::Head1 => u32::from(z.alg_id & 15) + 1,
                    HeadKind::Head2 => u32::from(z.alg_id >> 4) + 1,
                };
                (
                    len | u32::from(e.partial) << 27 | fmt << 28,
                    u64::from(e.blkaddr) << plan.bits,
                )
            }
        };
        if recsz < 32 && e.lstart > u64::from(u32::MAX) {
            return Err(bad(format!("extent at {} in a 16-byte record", e.lstart)));
        }
        let mut r = [0u8; 32];
        r[0..4].copy_from_slice(&w0.to_le_bytes());
        r[4..12].copy_from_slice(&pstart.to_le_bytes());
        r[12..20].copy_from_slice(&e.lstart.to_le_bytes());
        rec.extend_from_slice(&r[..recsz as usize]);
    }
    Ok(())
}
