//! Stage 6, write: the metadata records into block 0 (behind the superblock) and the
//! metadata region, then the shared xattrs, the directory and symlink blocks, and the
//! superblock with its checksum last; the temporary file is renamed over the output.
//! (The data region was written by the data stage.)

use crate::blobs::Blobs;
use crate::layout::Layout;
use crate::nids::{self, MetaLayout};
use crate::options::*;
use crate::out::Out;
use crate::plan::Plan;
use crate::record;
use crate::sb;
use crate::scan::{InodeId, Tree};

/// What the finished image is.
pub struct Written {
    pub blocks: u64,
    pub bytes: u64,
    pub uuid: [u8; 16],
    pub verity: Option<crate::verity::VerityInfo>,
}

/// Write everything but the data region to `out` and finish it.
pub fn write_image(
    mut out: Out,
    tree: &Tree,
    plan: &Plan,
    meta: &MetaLayout,
    blobs: &Blobs,
    o: &BuildOptions,
) -> Result<Written> {
    let bs = plan.bs;
    let layouts = &blobs.layouts;
    let compressed = layouts.iter().any(Layout::compressed);
    let big_pcluster = compressed && plan.cfg.needed;

    // Block 0 (up to the end of the superblock's block): superblock, compression
    // configs, and the records packed behind them.
    let mut block0 = vec![0u8; (plan.first_blk * bs) as usize];
    let mut region = vec![0u8; (meta.blocks * bs) as usize];
    for (id, layout) in layouts.iter().enumerate() {
        let p = meta.pos[id];
        let rec = record_at(tree, plan, id, layout, p, big_pcluster)?;
        let dst = if p < meta.base * bs {
            &mut block0[p as usize..p as usize + rec.len()]
        } else {
            let off = (p - meta.base * bs) as usize;
            &mut region[off..off + rec.len()]
        };
        dst.copy_from_slice(&rec);
    }
    out.write_at(meta.base * bs, &region)?;
    let shared_blk = meta.end_blk();
    if !plan.xattrs.shared_area.is_empty() {
        out.write_at(shared_blk * bs, &plan.xattrs.shared_area)?;
    }
    for b in &blobs.blobs {
        out.write_at(b.startblk * bs, &b.bytes)?;
    }

    let fields = sb::SbFields {
        blkszbits: plan.bits,
        root_nid: meta.nid(tree.root),
        metabox_nid: None,
        inos: tree.nodes.len() as u64,
        build_time: plan.build_time,
        epoch: plan.epoch,
        layout48: plan.layout48,
        total_blocks: blobs.end_blk,
        meta_blkaddr: meta.blkaddr,
        xattr_blkaddr: shared_blk,
        xattr_filter: plan.xattrs.any,
        chunked: layouts.iter().any(Layout::chunked),
        compressed,
        inline_pcluster: layouts.iter().any(Layout::inline_pcluster),
        shared_pclusters: layouts.iter().any(Layout::full_index),
        // The packed inode counts only when some file has a fragment in it.
        packed_nid: match tree.packed {
            Some(id) if layouts.iter().any(Layout::fragment) => Some(meta.nid(id)),
            _ => None,
        },
    };
    finish(out, block0, &fields, plan, o)
}

/// The record of inode `id` (data at `layout`) placed at byte `pos` of its address
/// space, checked against the length the packer reserved for it (a longer record would
/// overwrite the next one).
pub fn record_at(
    tree: &Tree,
    plan: &Plan,
    id: InodeId,
    layout: &Layout,
    pos: u64,
    big_pcluster: bool,
) -> Result<Vec<u8>> {
    let rec = record::encode(plan, id, &tree.nodes[id], layout, pos, big_pcluster)?;
    if rec.len() as u64 != nids::record(plan, id, layout).shape.len(pos) {
        return Err(BuildError::Options(format!(
            "internal: inode {id}'s record is not as long as planned"
        )));
    }
    Ok(rec)
}

/// Finish the image: the superblock for `fields` (checksum last) into `block0`, which
/// is then written; size, sync and rename `out`.
pub fn finish(
    mut out: Out,
    mut block0: Vec<u8>,
    fields: &sb::SbFields,
    plan: &Plan,
    o: &BuildOptions,
) -> Result<Written> {
    // `--fsalignblks`: the image's size a multiple of a power of two of blocks (the
    // blocks added read as zeros).
    let align = u64::from(o.fs_align_blocks.max(1)).next_power_of_two();
    let total_blocks = fields
        .total_blocks
        .div_ceil(align)
        .checked_mul(align)
        .ok_or_else(|| BuildError::TooLarge("--fsalignblks".into()))?;
    let fields = &sb::SbFields {
        total_blocks,
        ..fields.clone()
    };
    let mut sb = sb::superblock(fields, &plan.cfg, o.label.as_deref())?;
    if !o.sb_checksum {
        sb.feature_compat &= !ferofs_format::sb::COMPAT_SB_CHKSUM;
    }
    sb.uuid = sb::uuid(o.uuid, &out, &sb)?;
    sb::seal_block0(
        &mut block0,
        &sb,
        &plan.cfg,
        fields.compressed && plan.cfg.needed,
    );
    out.write_at(0, &block0)?;
    out.set_len(total_blocks * plan.bs)?;
    // The tree covers the finished image: after the superblock, before the rename.
    let verity = match &o.verity {
        Some(v) => {
            let salt = v
                .salt
                .clone()
                .unwrap_or_else(|| crate::verity::derived_salt(&sb.uuid));
            let uuid = crate::verity::derived_uuid(&sb.uuid);
            let info = crate::verity::append(
                out.file(),
                total_blocks * plan.bs,
                &salt,
                uuid,
                o.worker_threads(),
            )
            .map_err(io_err(out.tmp_path(), "verity hash tree"))?;
            Some(info)
        }
        None => None,
    };
    out.finish(o.fsync)?;
    Ok(Written {
        blocks: total_blocks,
        bytes: total_blocks * plan.bs,
        uuid: sb.uuid,
        verity,
    })
}
