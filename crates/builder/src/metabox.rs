//! `-m`, the metabox (Linux 6.17+): every inode's metadata record (core, xattrs, inline
//! tail, compressed index) goes into the data of one more regular file, the metabox
//! inode, which is compressed like any file with the image's first algorithm. An inode
//! in the metabox has nid bit 63 set and lives at `(nid & !(1 << 63)) * 32` in that
//! data, so small files and directories whose contents are inline are compressed with
//! their inodes.
//!
//! The superblock names the metabox inode (`metabox_nid`, in its extension slot) and
//! the root, whose nid (`1 << 63`: it is packed first) only fits the 64-bit root nid
//! field: the kernel reads that one only with the 48-bit layout, so `-m` sets it, as
//! mkfs.erofs does. The rest of the image is unchanged by it: data blocks, directory
//! and symlink blocks and shared xattrs stay where they are; the kernel reads inline
//! data of a metabox inode from the metabox too.
//!
//! Layout: `[block 0: superblock, configs, the metabox inode's record when it fits]
//! [data region][directory and symlink blocks][shared xattrs][metabox data][the
//! metabox inode's record otherwise]`.

use crate::blobs;
use crate::data::DataWriter;
use crate::layout::Layout;
use crate::nids;
use crate::options::*;
use crate::out::Out;
use crate::place::Placed;
use crate::plan::Plan;
use crate::sb::SbFields;
use crate::scan::{Node, Tree};
use crate::write::{self, Written};
use crate::zdata::{self, Compression, FileReq};

/// The metabox inode's name in errors, and what a compression hint matches it by.
const METABOX_REL: &[u8] = b"(metabox inode)";

/// What the metabox took.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Bytes of metadata in it.
    pub bytes: u64,
    /// What they take in the image: blocks and inline tail.
    pub stored: u64,
}

/// Stages 4 to 6 with a metabox: the records of every inode of `tree` into the metabox
/// data, the directory and symlink blocks, the shared xattrs, the metabox inode (added
/// to `tree` and `plan` as their last inode, linked from no directory) and the
/// superblock.
pub fn build(
    tree: &mut Tree,
    plan: &mut Plan,
    mut placed: Placed,
    mut out: Out,
    o: &BuildOptions,
) -> Result<(Written, Stats)> {
    let bs = plan.bs;
    // The packed inode (fragments) stays out of the metabox: the kernel loads it
    // before the metabox inode. Its record goes beside the metabox inode's.
    let packed = tree
        .packed
        .filter(|_| placed.layouts.iter().any(Layout::fragment));
    // Packed as an empty record (its slot stays unused), not copied: the layouts are
    // moved out and back.
    let packed_layout = packed.map(|p| std::mem::replace(&mut placed.layouts[p], Layout::NONE));
    let first = nids::front(tree, &o.sort);
    let inner = nids::assign_metabox(tree, plan, &placed.layouts, &first)?;
    if let (Some(p), Some(l)) = (packed, packed_layout) {
        placed.layouts[p] = l;
    }
    let blobs = blobs::place(tree, plan, &inner, placed.layouts, placed.end_blk, &first)?;
    let mut layouts = blobs.layouts;
    // The records' indexes use the big-pcluster format when the superblock will say
    // so: when anything is compressed (which any compressed record makes true).
    let big_inner = plan.cfg.needed;
    let n = tree.nodes.len();
    // The metabox inode's data: the records in place order, streamed to a scratch file
    // (held whole it would hold every inline tail a second time), zeros between them,
    // up to the end of the last.
    let scratch = out.spool("metabox")?;
    let spath = scratch.path().to_path_buf();
    let mut order: Vec<usize> = (0..n).filter(|&id| Some(id) != packed).collect();
    order.sort_unstable_by_key(|&id| inner.pos[id]);
    let mut sink = write::FileSink(scratch.as_file(), &spath);
    let mut w = write::Window::new(&mut sink, 0);
    for id in order {
        let p = inner.pos[id];
        let rec = write::record_at(tree, plan, id, &layouts[id], p, big_inner)?;
        w.put(p, &rec)?;
    }
    let size = w.finish(0)?;
    for b in &blobs.blobs {
        out.write_at(b.startblk * bs, &b.bytes)?;
    }
    let shared_blk = blobs.end_blk;
    if !plan.xattrs.shared_area.is_empty() {
        out.write_at(shared_blk * bs, &plan.xattrs.shared_area)?;
    }
    let mb_blk = shared_blk + plan.shared_xattr_blocks();

    // The metabox inode: a regular file of the metadata bytes, stored like file data.
    let id = n;
    tree.nodes.push(Node::internal_file(
        spath.clone(),
        size,
        0o100644,
        plan.build_time,
        METABOX_REL,
    ));
    plan.extended.push(size > u64::from(u32::MAX));
    plan.xattrs.ibody.push(Vec::new());
    plan.sizes.push(size);
    plan.dirs.push(None);
    plan.content_inline.push(false);
    let inline_tail = plan.inline_tail(id, size);
    let (layout, end_blk): (Layout, u64) = match &o.compression {
        Some(c) => {
            let pcluster_size = o.metabox_pcluster().unwrap_or(c.pcluster_size);
            let mut mc = Compression {
                pcluster_size,
                hints: Vec::new(),
                ..c.clone()
            };
            match o.metabox_algorithm {
                0 => mc.algorithms.truncate(1),
                // Another of the image's algorithms (`-m=BYTES:ALG`): the whole list
                // stays, so that the inode names it by its index, and a hint picks it.
                k => mc.hints.push(zdata::Hint {
                    pcluster_size,
                    algorithm: k,
                    regex: regex::Regex::new(&format!(
                        "^{}$",
                        regex::escape(&String::from_utf8_lossy(METABOX_REL))
                    ))
                    .map_err(|e| BuildError::Options(e.to_string()))?,
                    uncompressed: false,
                }),
            }
            let req = FileReq {
                id,
                src: crate::source::Source::Path(spath.clone()),
                size,
                rel: tree.nodes[id].rel.clone(),
                fixed_meta: plan.fixed_meta(id),
                inline_tail,
                frag: zdata::FragMode::None,
                skip: false,
                similar: false,
                // Metadata, not file data: `--dsunit` leaves it where it is.
                align: 0,
            };
            let threads = o.worker_threads();
            let (mut stored, end, _) = zdata::store_all(
                &[req],
                &mc,
                &mut out,
                plan.bits,
                mb_blk,
                threads,
                o.memory_limit,
                None,
                None,
                &crate::Progress::default(),
            )?;
            let st = stored
                .pop()
                .ok_or_else(|| BuildError::Options("internal: metabox not stored".into()))?;
            (st.into(), end)
        }
        None => {
            let mut dw = DataWriter {
                out: &mut out,
                blkszbits: plan.bits,
                next_blk: mb_blk,
                buf: Vec::new(),
                chunks: None,
                align: 0,
            };
            let d = dw.store_file(
                &crate::source::Source::Path(spath.clone()),
                size,
                inline_tail,
            )?;
            (d.into(), dw.next_blk)
        }
    };
    drop(scratch);
    let inline_len = match &layout {
        Layout::Compressed(z) => z.inline.as_ref().map_or(0, |(b, _)| b.len() as u64),
        Layout::Inline { tail, .. } => tail.len() as u64,
        _ => 0,
    };
    let stats = Stats {
        bytes: size,
        stored: (end_blk - mb_blk) * bs + inline_len,
    };
    layouts.push(layout);

    // The records outside the metabox (the packed inode's, then the metabox inode's):
    // behind the superblock when they fit, else after the metabox data.
    let compressed = layouts.iter().any(Layout::compressed);
    let big = compressed && plan.cfg.needed;
    let ids: Vec<usize> = packed.into_iter().chain(std::iter::once(id)).collect();
    let recs: Vec<nids::Record> = ids
        .iter()
        .map(|&i| nids::record(plan, i, &layouts[i]))
        .collect();
    let (pos_of, blocks) =
        nids::place_outside(&recs, plan.cfg.end(), plan.first_blk * bs, end_blk, bs).map_err(
            |k| BuildError::Invalid {
                path: String::from_utf8_lossy(&tree.nodes[ids[k]].rel)
                    .into_owned()
                    .into(),
                what: "inline record larger than a block".into(),
            },
        )?;
    let mut block0 = vec![0u8; (plan.first_blk * bs) as usize];
    let region_base = end_blk * bs;
    let mut region = vec![0u8; (blocks * bs) as usize];
    for (&i, &pos) in ids.iter().zip(&pos_of) {
        let r = write::record_at(tree, plan, i, &layouts[i], pos, big)?;
        let (buf, at) = if pos < region_base {
            (&mut block0, pos)
        } else {
            (&mut region, pos - region_base)
        };
        buf[at as usize..at as usize + r.len()].copy_from_slice(&r);
    }
    let (packed_nid, metabox_pos) = match packed {
        Some(_) => (Some(pos_of[0] / 32), pos_of[1]),
        None => (None, pos_of[0]),
    };
    if blocks > 0 {
        out.write_at(region_base, &region)?;
    }
    let fields = SbFields {
        blkszbits: plan.bits,
        root_nid: inner.nid(tree.root),
        metabox_nid: Some(metabox_pos / 32),
        inos: n as u64,
        build_time: plan.build_time,
        epoch: plan.epoch,
        layout48: plan.layout48,
        total_blocks: end_blk + blocks,
        meta_blkaddr: 0,
        xattr_blkaddr: shared_blk,
        xattr_filter: plan.xattrs.any,
        chunked: layouts.iter().any(Layout::chunked),
        compressed,
        inline_pcluster: layouts.iter().any(Layout::inline_pcluster),
        packed_nid,
        shared_pclusters: layouts.iter().any(Layout::shared),
        prefixes_in_packed: plan.prefixes_in_packed,
    };
    Ok((write::finish(out, block0, &fields, plan, o)?, stats))
}
