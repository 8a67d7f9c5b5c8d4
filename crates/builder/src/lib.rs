//! # ferofs-builder — mkfs.erofs as a library
//!
//! What it owns: turning an input tree into an EROFS image. What it does not own: the
//! on-disk structs (`ferofs-format`) and codecs (`ferofs-compress`).
//!
//! Data flows through stages whose outputs are plain data:
//! 1. [`scan`]: the input becomes a [`scan::Tree`] (metadata only, inodes numbered,
//!    hardlinks merged).
//! 2. time policy, the [`xattrs`] plan (shared entries, inline areas, bloom filters)
//!    and each inode's version (compact or extended).
//! 3. [`data`]: file contents are streamed to the data region (from the first block
//!    after the superblock), in inode order; holes become null chunks.
//! 4. plan: every inode's metadata record (core + xattrs + inline tail or chunk map)
//!    is packed into metadata blocks (first fit, never crossing a block when it holds
//!    inline data), which fixes every nid; directory blocks follow.
//! 5. write: metadata, shared xattrs, directory/symlink blocks, then the superblock
//!    with its checksum last; the temporary file is renamed over the output.
//!
//! Layout: `[block 0: superblock][data region][metadata region][shared xattrs]
//! [directory and symlink blocks]`. The same tree and options give the same bytes.

#![forbid(unsafe_code)]

pub mod data;
pub mod dir;
pub mod options;
mod out;
pub mod scan;
pub mod xattrs;
pub mod zdata;

pub use options::{BuildError, BuildOptions, BuildReport, UuidChoice};
pub use zdata::{parse_hints, Compression, Hint};

use data::{DataWriter, FileData};
use ferofs_format::dirent::{file_type_of_mode, FT_DIR};
use ferofs_format::inode::*;
use ferofs_format::sb::*;
use options::Result;
use scan::{InodeId, Kind, Tree};
use std::path::Path;

/// Build an image of the directory `source` at `output`.
pub fn build_from_dir(source: &Path, output: &Path, opts: &BuildOptions) -> Result<BuildReport> {
    check_options(opts)?;
    let tree = scan::scan_dir(source, opts)?;
    build_tree(tree, output, opts)
}

fn check_options(o: &BuildOptions) -> Result<()> {
    if !(512..=4096).contains(&o.block_size) || !o.block_size.is_power_of_two() {
        return Err(BuildError::Options(format!(
            "block size {} (512, 1024, 2048 or 4096)",
            o.block_size
        )));
    }
    if let Some(l) = &o.label {
        if l.len() > 15 {
            return Err(BuildError::Options("label longer than 15 bytes".into()));
        }
    }
    if let Some(c) = &o.compression {
        if c.algorithms.is_empty() {
            return Err(BuildError::Options("no compression algorithm".into()));
        }
        let sizes = std::iter::once(c.pcluster_size).chain(c.hints.iter().map(|h| h.pcluster_size));
        for p in sizes {
            if p == 0 || p % o.block_size != 0 || p > 1 << 20 || p / o.block_size > 2047 {
                return Err(BuildError::Options(format!(
                    "pcluster size {p}: a multiple of the block size ({}), at most 1 MiB and 2047 blocks",
                    o.block_size
                )));
            }
        }
        for h in &c.hints {
            if h.algorithm >= c.algorithms.len() {
                return Err(BuildError::Options(format!(
                    "compress hint {:?} uses algorithm index {} but only {} algorithm(s) were given with -z",
                    h.regex.as_str(),
                    h.algorithm,
                    c.algorithms.len()
                )));
            }
        }
    }
    Ok(())
}

/// Build time and per-inode mtimes (doc: -T, SOURCE_DATE_EPOCH, --ignore-mtime).
fn apply_time_policy(tree: &mut Tree, o: &BuildOptions) -> i64 {
    let newest = tree.nodes.iter().map(|n| n.mtime).max().unwrap_or(0);
    let build_time = o.timestamp.or(o.source_date_epoch).unwrap_or(newest);
    for n in &mut tree.nodes {
        if let Some(t) = o.timestamp {
            n.mtime = t;
            n.mtime_nsec = 0;
        } else if let Some(sde) = o.source_date_epoch {
            if n.mtime > sde {
                n.mtime = sde;
                n.mtime_nsec = 0;
            }
        }
        if o.ignore_mtime {
            n.mtime = build_time;
            n.mtime_nsec = 0;
        }
    }
    build_time
}

/// Where an inode's data lives, after the data stage and planning.
#[derive(Debug, Clone)]
enum Layout {
    /// FLAT_PLAIN with blocks (or none).
    Plain {
        startblk: u64,
    },
    /// FLAT_INLINE: full blocks from startblk (NULL if none), tail behind the inode.
    Inline {
        startblk: Option<u64>,
        tail: Vec<u8>,
    },
    Chunked {
        chunk_rel: u8,
        map: Vec<u32>,
    },
    Compressed(zdata::ZFile),
}

/// Blocks of directory/symlink content waiting for the post-metadata region.
struct Blob {
    id: InodeId,
    bytes: Vec<u8>,
}

fn build_tree(mut tree: Tree, output: &Path, o: &BuildOptions) -> Result<BuildReport> {
    let bits = o.block_size.trailing_zeros() as u8;
    let bs = u64::from(o.block_size);
    let build_time = apply_time_policy(&mut tree, o);
    let xplan = xattrs::plan(&tree);
    let n = tree.nodes.len();

    // Inode versions: compact only when every value fits and the mtime equals the
    // build time (compact inodes carry no mtime older kernels would show).
    let extended: Vec<bool> = tree
        .nodes
        .iter()
        .map(|nd| {
            let size = match &nd.kind {
                Kind::File { size, .. } => *size,
                _ => 0,
            };
            size > u64::from(u32::MAX)
                || nd.uid > 0xFFFF
                || nd.gid > 0xFFFF
                || nd.nlink > 0xFFFF
                || nd.mtime != build_time
                || nd.mtime_nsec != 0
        })
        .collect();
    let core_size = |id: InodeId| if extended[id] { EXTENDED_SIZE } else { COMPACT_SIZE } as u64;
    for (id, area) in xplan.ibody.iter().enumerate() {
        if xattr_icount_for(area.len()).is_none() {
            return Err(BuildError::Invalid {
                path: tree.nodes[id]
                    .rel
                    .clone()
                    .into_iter()
                    .map(char::from)
                    .collect::<String>()
                    .into(),
                what: "xattrs too large for one inode".into(),
            });
        }
    }
    let fixed_meta = |id: InodeId| core_size(id) + xplan.ibody[id].len() as u64;

    let mut out = out::Out::create(output)?;
    // Compression config records follow the superblock in block 0 (doc §1.5).
    let cfg = compr_configs(o);
    let first_blk = (SB_OFFSET + SB_BASE_SIZE as u64 + cfg.bytes.len() as u64).div_ceil(bs);
    let mut layouts: Vec<Layout> = vec![Layout::Plain { startblk: 0 }; n];
    let mut bytes_in = 0u64;
    let to_layout = |d: FileData| match d {
        FileData::Empty => Layout::Plain { startblk: 0 },
        FileData::Flat {
            startblk,
            nblocks,
            tail,
        } if !tail.is_empty() => Layout::Inline {
            startblk: (nblocks > 0).then_some(startblk),
            tail,
        },
        FileData::Flat { startblk, .. } => Layout::Plain { startblk },
        FileData::Chunked { chunk_rel, map } => Layout::Chunked { chunk_rel, map },
    };
    let inline_tail = |id: InodeId, size: u64| {
        let tail = size % bs;
        // Inode, xattrs and tail in one block. (The kernel would also accept an inode
        // crossing into the tail's block, as mkfs.erofs sometimes writes; measured on
        // the linux tree, inlining those big tails cost more metadata blocks than it
        // saved data blocks.)
        o.inline_data && tail != 0 && fixed_meta(id) + tail <= bs
    };
    let data_end;
    let mut compressor_input = 0;
    if let Some(c) = &o.compression {
        let mut reqs = Vec::new();
        for (id, nd) in tree.nodes.iter().enumerate() {
            if let Kind::File { path, size } = &nd.kind {
                bytes_in += size;
                reqs.push(zdata::FileReq {
                    id,
                    path: path.clone(),
                    size: *size,
                    rel: nd.rel.clone(),
                    fixed_meta: fixed_meta(id),
                    inline_tail: inline_tail(id, *size),
                });
            }
        }
        let threads = if o.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            o.threads
        };
        let (stored, end, fed) = zdata::store_all(&reqs, c, &mut out, bits, first_blk, threads)?;
        compressor_input = fed;
        for (r, st) in reqs.iter().zip(stored) {
            layouts[r.id] = match st {
                zdata::Stored::Compressed(z) => Layout::Compressed(z),
                zdata::Stored::Data(d) => to_layout(d),
            };
        }
        data_end = end;
    } else {
        let mut dw = DataWriter {
            out: &mut out,
            blkszbits: bits,
            next_blk: first_blk,
            buf: Vec::new(),
        };
        for (id, nd) in tree.nodes.iter().enumerate() {
            if let Kind::File { path, size } = &nd.kind {
                bytes_in += size;
                layouts[id] = to_layout(dw.store_file(path, *size, inline_tail(id, *size))?);
            }
        }
        data_end = dw.next_blk;
    }
    let any_compressed = layouts.iter().any(|l| matches!(l, Layout::Compressed(_)));
    let big_pcluster = any_compressed && cfg.needed;
    let any_inline_z = layouts
        .iter()
        .any(|l| matches!(l, Layout::Compressed(z) if z.inline.is_some()));

    // Directory entries and symlink targets: content known now, nids later.
    type DirPlan = (dir::DirEntries, Vec<std::ops::Range<usize>>, u64);
    let mut dir_entries: Vec<Option<DirPlan>> = vec![None; n];
    let mut sizes: Vec<u64> = vec![0; n];
    for (id, nd) in tree.nodes.iter().enumerate() {
        match &nd.kind {
            Kind::Dir { entries, parent } => {
                let parent = if id == tree.root { id } else { *parent };
                let mut es: dir::DirEntries = vec![
                    (b".".to_vec(), id, FT_DIR),
                    (b"..".to_vec(), parent, FT_DIR),
                ];
                for (name, c) in entries {
                    es.push((name.clone(), *c, file_type_of_mode(tree.nodes[*c].mode)));
                }
                es.sort_by(|a, b| a.0.cmp(&b.0));
                let (blocks, size) = dir::layout(&es, bs as usize);
                sizes[id] = size;
                dir_entries[id] = Some((es, blocks, size));
            }
            Kind::File { size, .. } => sizes[id] = *size,
            Kind::Symlink { target } => sizes[id] = target.len() as u64,
            _ => {}
        }
    }
    // Inline decision for directories and symlinks (always allowed, like mkfs).
    let mut content_inline = vec![false; n];
    for (id, nd) in tree.nodes.iter().enumerate() {
        if matches!(nd.kind, Kind::Dir { .. } | Kind::Symlink { .. }) {
            let tail = sizes[id] % bs;
            content_inline[id] = tail != 0 && fixed_meta(id) + tail <= bs;
        }
    }

    // Stage 4: pack metadata records, first fit, fixing every nid.
    // Metadata record of inode `id` placed at offset `off` of the (block-aligned)
    // metadata region: compact index sizes depend on the position modulo 32.
    let record_len = |id: InodeId, off: u64| -> u64 {
        let base = fixed_meta(id);
        match &layouts[id] {
            Layout::Compressed(z) => {
                let hdr = base.div_ceil(8) * 8;
                let nl = sizes[id].div_ceil(bs) as usize;
                let idx = ferofs_format::zindex::compact_size(nl, off + hdr + 8, true) as u64;
                hdr + 8 + idx + z.inline.as_ref().map_or(0, |(b, _)| b.len() as u64)
            }
            Layout::Inline { tail, .. } => base + tail.len() as u64,
            Layout::Chunked { map, .. } => base.div_ceil(4) * 4 + 4 * map.len() as u64,
            Layout::Plain { .. } if content_inline[id] => base + sizes[id] % bs,
            Layout::Plain { .. } => base,
        }
    };
    let bad_inline = |id: InodeId| BuildError::Invalid {
        path: String::from_utf8_lossy(&tree.nodes[id].rel)
            .into_owned()
            .into(),
        what: "inline record larger than a block".into(),
    };
    // Packing of the records into metadata blocks from `base` (absolute block numbers),
    // optionally starting with the free tail of the superblock's block. Returns each
    // record's absolute byte position and the number of new blocks.
    //
    // Records with inline data (a tail or a compressed pcluster behind the inode) must
    // not cross a block boundary; the others may (the kernel reads inodes, xattrs and
    // indexes across blocks: index packs and chunk entries are aligned, so none is
    // split). So: first the root (its nid must stay small) and the block-bound records,
    // best fit; then the others, each into the tightest gap left that holds it whole,
    // else onto one stream at the end that runs across block boundaries and wastes
    // nothing.
    let sb_end = (SB_OFFSET + SB_BASE_SIZE as u64 + cfg.bytes.len() as u64).div_ceil(32) * 32;
    let block_bound = |id: InodeId| {
        matches!(&layouts[id], Layout::Compressed(z) if z.inline.is_some())
            || matches!(layouts[id], Layout::Inline { .. })
            || content_inline[id]
    };
    let mut order: Vec<InodeId> = Vec::with_capacity(n);
    order.push(tree.root);
    order.extend((0..n).filter(|&id| id != tree.root && block_bound(id)));
    order.extend((0..n).filter(|&id| id != tree.root && !block_bound(id)));
    let pack = |base: u64, use_sb_block: bool| -> Result<(Vec<u64>, u64)> {
        let mut pos = vec![0u64; n];
        // Free slots (free bytes, absolute block, start offset in the block): best fit,
        // ties to the lowest block, so packing is deterministic.
        let mut free_set: std::collections::BTreeSet<(u64, u64, u64)> =
            std::collections::BTreeSet::new();
        let add_slot = |set: &mut std::collections::BTreeSet<(u64, u64, u64)>,
                        blk: u64,
                        start: u64,
                        end: u64| {
            let start = start.div_ceil(32) * 32;
            if end >= start + 32 {
                set.insert((end - start, blk, start));
            }
        };
        if use_sb_block {
            let blk = first_blk - 1;
            add_slot(&mut free_set, blk, sb_end - blk * bs, bs);
        }
        let mut meta_blocks = 0u64;
        // The stream's next byte, once it has begun.
        let mut stream: Option<u64> = None;
        for &id in &order {
            let bound = id == tree.root || block_bound(id);
            let len0 = record_len(id, 0).div_ceil(32) * 32;
            if len0 > bs && bound {
                return Err(bad_inline(id));
            }
            // The index size depends on the offset modulo 32 (index areas are 8-aligned):
            // start from the smallest size it can have, confirm at the candidate.
            let lower = (0..4u64)
                .map(|a| record_len(id, a * 8).div_ceil(32) * 32)
                .min()
                .unwrap_or(len0);
            let mut chosen = None;
            for &(free, blk, start) in free_set.range((lower, 0, 0)..).take(8) {
                let len = record_len(id, blk * bs + start).div_ceil(32) * 32;
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
                let len = record_len(id, pos[id]).div_ceil(32) * 32;
                if len > bs {
                    return Err(bad_inline(id));
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
                let end = at + record_len(id, at);
                meta_blocks = meta_blocks.max(end.div_ceil(bs) - base);
                stream = Some(end.div_ceil(32) * 32);
            }
        }
        Ok((pos, meta_blocks))
    };
    // Preferred: nids count from byte 0 and the root (packed first) sits behind the
    // superblock, like mkfs.erofs, so block 0 is not wasted. When the root does not fit
    // there, its nid would not fit 16 bits: count nids from the metadata region instead.
    let (nid_pos, meta_blocks, meta_blkaddr) = {
        let (p, m) = pack(data_end, true)?;
        if p[tree.root] / 32 <= 0xFFFF {
            (p, m, 0u64)
        } else {
            let (p, m) = pack(data_end, false)?;
            (p, m, data_end)
        }
    };
    let nid_of = |id: InodeId| (nid_pos[id] - meta_blkaddr * bs) / 32;
    if nid_of(tree.root) > 0xFFFF {
        return Err(BuildError::TooLarge("root nid does not fit 16 bits".into()));
    }
    let meta_base = data_end;
    let shared_blk = meta_base + meta_blocks;
    let shared_blocks = (xplan.shared_area.len() as u64).div_ceil(bs);
    let mut blob_blk = shared_blk + shared_blocks;

    // Directory and symlink full blocks after the metadata.
    let mut blobs: Vec<Blob> = Vec::new();
    for (id, nd) in tree.nodes.iter().enumerate() {
        let content: Option<Vec<u8>> = match &nd.kind {
            Kind::Dir { .. } => {
                let (es, blocks, size) = dir_entries[id]
                    .as_ref()
                    .map(|(a, b, c)| (a, b, *c))
                    .ok_or_else(|| {
                        BuildError::Options("internal: directory without entries".into())
                    })?;
                let mut v = Vec::with_capacity(size as usize);
                for (i, r) in blocks.iter().enumerate() {
                    let mut b = dir::encode_block(&es[r.clone()], &|c| nid_of(c));
                    if i + 1 < blocks.len() {
                        b.resize(bs as usize, 0);
                    }
                    v.extend_from_slice(&b);
                }
                Some(v)
            }
            Kind::Symlink { target } => Some(target.clone()),
            _ => None,
        };
        if let Some(bytes) = content {
            let full = if content_inline[id] {
                bytes.len() as u64 / bs * bs
            } else {
                bytes.len() as u64
            };
            let tail = bytes[full as usize..].to_vec();
            let startblk = if full > 0 {
                let s = blob_blk;
                blob_blk += full.div_ceil(bs);
                blobs.push(Blob {
                    id,
                    bytes: bytes[..full as usize].to_vec(),
                });
                Some(s)
            } else {
                None
            };
            layouts[id] = if content_inline[id] {
                Layout::Inline { startblk, tail }
            } else {
                Layout::Plain {
                    startblk: startblk.unwrap_or(0),
                }
            };
        }
    }
    let total_blocks = blob_blk;

    // Stage 5: write metadata.
    let mut meta = vec![0u8; (meta_blocks * bs) as usize];
    // Block 0 (up to the end of the superblock's block): superblock, compression
    // configs, and the records packed behind them.
    let mut block0 = vec![0u8; (first_blk * bs) as usize];
    for (id, nd) in tree.nodes.iter().enumerate() {
        let ext = extended[id];
        let (layout, u) = match &layouts[id] {
            Layout::Plain { startblk } => (DataLayout::FlatPlain, *startblk),
            Layout::Inline { startblk, .. } => (
                DataLayout::FlatInline,
                startblk.unwrap_or(u64::from(u32::MAX)),
            ),
            Layout::Chunked { chunk_rel, .. } => (DataLayout::ChunkBased, u64::from(*chunk_rel)),
            Layout::Compressed(z) => (DataLayout::CompressedCompact, z.blocks),
        };
        let u = match nd.kind {
            Kind::Device { rdev } => u64::from(rdev),
            Kind::Fifo | Kind::Socket => 0,
            _ => u,
        };
        let u32v = u32::try_from(u)
            .map_err(|_| BuildError::TooLarge("block address beyond 2^32 blocks".into()))?;
        let area = &xplan.ibody[id];
        let core = InodeCore {
            format: make_format(ext, layout, false),
            xattr_icount: xattr_icount_for(area.len()).unwrap_or(0),
            mode: nd.mode,
            nb: if ext { 0 } else { nd.nlink as u16 },
            size: sizes[id],
            mtime: if ext { nd.mtime } else { 0 },
            mtime_nsec: if ext { nd.mtime_nsec } else { 0 },
            u: u32v,
            ino: (id + 1) as u32,
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
        match &layouts[id] {
            Layout::Inline { tail, .. } => rec.extend_from_slice(tail),
            Layout::Chunked { map, .. } => {
                rec.resize(rec.len().div_ceil(4) * 4, 0);
                for m in map {
                    rec.extend_from_slice(&m.to_le_bytes());
                }
            }
            Layout::Plain { .. } => {}
            Layout::Compressed(z) => {
                rec.resize(rec.len().div_ceil(8) * 8, 0);
                let mut advise = ferofs_format::zmap::ADVISE_COMPACTED_2B;
                if big_pcluster {
                    advise |= ferofs_format::zmap::ADVISE_BIG_PCLUSTER_1
                        | ferofs_format::zmap::ADVISE_BIG_PCLUSTER_2;
                }
                let mut word0 = 0u32;
                if let Some((b, _)) = &z.inline {
                    advise |= ferofs_format::zmap::ADVISE_INLINE_PCLUSTER;
                    word0 = (b.len() as u32) << 16;
                }
                let h = ferofs_format::zmap::MapHeader {
                    word0,
                    advise,
                    algorithmtype: z.alg_id,
                    clusterbits: 0,
                };
                rec.extend_from_slice(&h.encode());
                let ents = ferofs_format::zindex::lcluster_entries(
                    &z.extents,
                    sizes[id],
                    bits,
                    big_pcluster,
                )
                .map_err(|e| BuildError::Invalid {
                    path: String::from_utf8_lossy(&nd.rel).into_owned().into(),
                    what: format!("index: {e:?}"),
                })?;
                let e_pos = nid_pos[id] + rec.len() as u64;
                let idx = ferofs_format::zindex::encode_compact(&ents, e_pos, true, big_pcluster)
                    .map_err(|e| BuildError::Invalid {
                    path: String::from_utf8_lossy(&nd.rel).into_owned().into(),
                    what: format!("index: {e:?}"),
                })?;
                rec.extend_from_slice(&idx);
                if let Some((b, _)) = &z.inline {
                    rec.extend_from_slice(b);
                }
            }
        }
        let p = nid_pos[id];
        let dst = if p < meta_base * bs {
            &mut block0[p as usize..p as usize + rec.len()]
        } else {
            let off = (p - meta_base * bs) as usize;
            &mut meta[off..off + rec.len()]
        };
        dst.copy_from_slice(&rec);
    }
    out.write_at(meta_base * bs, &meta)?;
    if !xplan.shared_area.is_empty() {
        out.write_at(shared_blk * bs, &xplan.shared_area)?;
    }
    for b in &blobs {
        let start = match &layouts[b.id] {
            Layout::Plain { startblk } => *startblk,
            Layout::Inline { startblk, .. } => startblk.unwrap_or(0),
            Layout::Chunked { .. } | Layout::Compressed(_) => 0,
        };
        let mut bytes = b.bytes.clone();
        bytes.resize((bytes.len() as u64).div_ceil(bs) as usize * bs as usize, 0);
        out.write_at(start * bs, &bytes)?;
    }

    // Superblock, checksum last.
    let mut feature_incompat = 0;
    if layouts.iter().any(|l| matches!(l, Layout::Chunked { .. })) {
        feature_incompat |= INCOMPAT_CHUNKED_FILE;
    }
    let mut u1 = 0u16;
    if any_compressed {
        feature_incompat |= INCOMPAT_ZERO_PADDING;
        if cfg.needed {
            feature_incompat |= INCOMPAT_COMPR_CFGS;
            u1 = cfg.algs;
        } else {
            u1 = 0xFFFF; // lz4_max_distance: the default 64 KiB window
        }
    }
    if any_inline_z {
        feature_incompat |= INCOMPAT_ZTAILPACKING;
    }
    let mut sb = Superblock {
        magic: MAGIC,
        feature_compat: COMPAT_SB_CHKSUM
            | COMPAT_MTIME
            | if xplan.any { COMPAT_XATTR_FILTER } else { 0 },
        blkszbits: bits,
        rootnid_2b: nid_of(tree.root) as u16,
        inos: n as u64,
        epoch: build_time as u64,
        blocks_lo: u32::try_from(total_blocks)
            .map_err(|_| BuildError::TooLarge("more than 2^32 blocks".into()))?,
        meta_blkaddr: u32::try_from(meta_blkaddr)
            .map_err(|_| BuildError::TooLarge("metadata beyond 2^32 blocks".into()))?,
        xattr_blkaddr: u32::try_from(shared_blk).unwrap_or(0),
        feature_incompat,
        u1,
        ..Default::default()
    };
    if let Some(l) = &o.label {
        sb.volume_name[..l.len()].copy_from_slice(l.as_bytes());
    }
    sb.uuid = match o.uuid {
        UuidChoice::Fixed(u) => u,
        UuidChoice::Random => {
            let mut u = [0u8; 16];
            getrandom::fill(&mut u)
                .map_err(|e| BuildError::Options(format!("random uuid: {e}")))?;
            set_v4(u)
        }
        UuidChoice::Derived => {
            let mut h = out.content_hash().to_vec();
            h.extend_from_slice(&sb.encode());
            let d: [u8; 32] =
                sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(&h)).into();
            let mut u = [0u8; 16];
            u.copy_from_slice(&d[..16]);
            set_v4(u)
        }
    };
    let sbb = sb.encode();
    let sbo = SB_OFFSET as usize;
    block0[sbo..sbo + sbb.len()].copy_from_slice(&sbb);
    if big_pcluster {
        let at = sbo + sbb.len();
        block0[at..at + cfg.bytes.len()].copy_from_slice(&cfg.bytes);
    }
    let clen = checksum_len(bs as u32);
    let csum = compute_checksum(&block0[sbo..sbo + clen]);
    block0[sbo + 4..sbo + 8].copy_from_slice(&csum.to_le_bytes());
    out.write_at(0, &block0)?;
    out.set_len(total_blocks * bs)?;
    out.finish(o.fsync)?;

    let mut r = BuildReport {
        inodes: n as u64,
        bytes_in,
        compressor_input,
        image_bytes: total_blocks * bs,
        blocks: total_blocks,
        uuid: sb.uuid,
        build_time,
        ..Default::default()
    };
    for nd in &tree.nodes {
        match nd.kind {
            Kind::Dir { .. } => r.directories += 1,
            Kind::File { .. } => r.files += 1,
            Kind::Symlink { .. } => r.symlinks += 1,
            _ => r.special += 1,
        }
    }
    Ok(r)
}

/// The compression config records (doc §1.5) and whether the image needs them:
/// pclusters over one block or any algorithm other than LZ4.
struct ComprCfg {
    needed: bool,
    algs: u16,
    bytes: Vec<u8>,
}

fn compr_configs(o: &BuildOptions) -> ComprCfg {
    let Some(c) = &o.compression else {
        return ComprCfg {
            needed: false,
            algs: 0,
            bytes: Vec::new(),
        };
    };
    let max_pcl = std::iter::once(c.pcluster_size)
        .chain(c.hints.iter().map(|h| h.pcluster_size))
        .max()
        .unwrap_or(o.block_size);
    let mut algs = 0u16;
    for a in &c.algorithms {
        algs |= 1 << a.encoder.algorithm().id();
    }
    let needed = max_pcl > o.block_size || algs != 1;
    let mut bytes = Vec::new();
    if needed {
        for id in 0..4u8 {
            if algs & (1 << id) == 0 {
                continue;
            }
            let Some(alg) = ferofs_compress::Algorithm::from_id(id) else {
                continue;
            };
            let dict = c
                .algorithms
                .iter()
                .filter(|a| a.encoder.algorithm() == alg)
                .map(|a| a.effective_dict(max_pcl))
                .max()
                .unwrap_or(0);
            let rec = ferofs_compress::config_record(alg, dict, (max_pcl / o.block_size) as u16);
            while !(SB_BASE_SIZE + bytes.len()).is_multiple_of(4) {
                bytes.push(0);
            }
            bytes.extend_from_slice(&(rec.len() as u16).to_le_bytes());
            bytes.extend_from_slice(&rec);
        }
    }
    ComprCfg {
        needed,
        algs,
        bytes,
    }
}

fn set_v4(mut u: [u8; 16]) -> [u8; 16] {
    u[6] = (u[6] & 0x0F) | 0x40;
    u[8] = (u[8] & 0x3F) | 0x80;
    u
}
