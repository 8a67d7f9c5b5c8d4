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

/// Where a [`Window`] writes: the image (hashed as one write of the whole run), or a
/// scratch file.
pub trait Sink {
    fn start(&mut self, off: u64);
    fn piece(&mut self, at: u64, data: &[u8]) -> Result<()>;
}

impl Sink for Out {
    fn start(&mut self, off: u64) {
        self.run_start(off);
    }
    fn piece(&mut self, at: u64, data: &[u8]) -> Result<()> {
        self.run_piece(at, data)
    }
}

/// A scratch file (the metabox inode's data) and its path, for errors.
pub struct FileSink<'a>(pub &'a std::fs::File, pub &'a std::path::Path);

impl Sink for FileSink<'_> {
    fn start(&mut self, _: u64) {}
    fn piece(&mut self, at: u64, data: &[u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.0
            .write_all_at(data, at)
            .map_err(io_err(self.1, "metabox: write"))
    }
}

/// Writes a region from its start, in increasing positions, zeros in the gaps, in
/// pieces of at most [`Window::CAP`] bytes: a region of metadata records is never held
/// whole (it would hold every inline tail a second time).
pub struct Window<'a, S: Sink> {
    out: &'a mut S,
    buf: Vec<u8>,
    /// Where `buf` starts.
    at: u64,
}

impl<'a, S: Sink> Window<'a, S> {
    const CAP: usize = 8 << 20;

    pub fn new(out: &'a mut S, start: u64) -> Self {
        out.start(start);
        Window {
            out,
            buf: Vec::new(),
            at: start,
        }
    }

    fn flush(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.out.piece(self.at, &self.buf)?;
            self.at += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }

    /// Zeros up to `to`.
    fn zeros_to(&mut self, to: u64) -> Result<()> {
        // Bounded: each pass adds up to CAP bytes and moves towards `to`.
        while self.at + (self.buf.len() as u64) < to {
            if self.buf.len() >= Self::CAP {
                self.flush()?;
            }
            let room = (Self::CAP - self.buf.len()) as u64;
            let n = (to - self.at - self.buf.len() as u64).min(room);
            self.buf.resize(self.buf.len() + n as usize, 0);
        }
        Ok(())
    }

    /// `data` at byte `pos` (not before what was put already).
    pub fn put(&mut self, pos: u64, data: &[u8]) -> Result<()> {
        let end = self.at + self.buf.len() as u64;
        if pos < end {
            return Err(BuildError::Options(format!(
                "internal: metadata record at {pos} overlaps the one before (ends at {end})"
            )));
        }
        self.zeros_to(pos)?;
        if self.buf.len() + data.len() > Self::CAP {
            self.flush()?;
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// Zeros up to `end` (nothing more when it is 0), and everything out; returns
    /// where the written bytes end.
    pub fn finish(mut self, end: u64) -> Result<u64> {
        self.zeros_to(end)?;
        self.flush()?;
        Ok(self.at)
    }
}

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
    let region_at = meta.base * bs;
    let mut in_region = Vec::new();
    for (id, layout) in layouts.iter().enumerate() {
        let p = meta.pos[id];
        if p >= region_at {
            in_region.push(id);
            continue;
        }
        let rec = record_at(tree, plan, id, layout, p, big_pcluster)?;
        block0[p as usize..p as usize + rec.len()].copy_from_slice(&rec);
    }
    // The metadata region, records in place order, written through a window: holding
    // it whole would hold every inline tail a second time (on a tree of 200,000 small
    // files, 430 MB beside the layouts' own copy).
    in_region.sort_unstable_by_key(|&id| meta.pos[id]);
    let end = region_at + meta.blocks * bs;
    let mut w = Window::new(&mut out, region_at);
    for id in in_region {
        let p = meta.pos[id];
        let rec = record_at(tree, plan, id, &layouts[id], p, big_pcluster)?;
        w.put(p, &rec)?;
    }
    w.finish(end)?;
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
        shared_pclusters: layouts.iter().any(Layout::shared),
        prefixes_in_packed: plan.prefixes_in_packed,
        // The packed inode counts only when some file has a fragment in it (or it
        // holds the long xattr prefixes).
        packed_nid: match tree.packed {
            Some(id)
                if layouts.iter().any(Layout::fragment) || plan.prefixes_in_packed.is_some() =>
            {
                Some(meta.nid(id))
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The window writes what one buffer of the whole region would, and hashes it the
    /// same (the derived UUID must not change with how the region is cut).
    #[test]
    fn window_writes_and_hashes_like_one_write() -> Result<()> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("."), "tempdir"))?;
        let records: [(u64, Vec<u8>); 4] = [
            (4096, vec![1; 100]),
            (4196, vec![2; 20]),
            (4096 + (9 << 20), vec![3; 5000]),
            (4096 + (20 << 20) - 7, vec![4; 7]),
        ];
        let end = 4096 + (21 << 20);
        let mut whole = vec![0u8; (end - 4096) as usize];
        for (p, r) in &records {
            let at = (p - 4096) as usize;
            whole[at..at + r.len()].copy_from_slice(r);
        }
        let mut a = Out::create(&dir.path().join("a"), 0)?;
        a.write_at(4096, &whole)?;
        let mut b = Out::create(&dir.path().join("b"), 0)?;
        let mut w = Window::new(&mut b, 4096);
        for (p, r) in &records {
            w.put(*p, r)?;
        }
        // Overlapping the record before is refused.
        assert!(w.put(4096 + (20 << 20) - 1, &[9]).is_err());
        w.finish(end)?;
        let (ha, hb) = (a.content_hash(), b.content_hash());
        a.finish(false)?;
        b.finish(false)?;
        assert_eq!(ha, hb);
        let read = |n: &str| std::fs::read(dir.path().join(n)).expect("read");
        assert_eq!(read("a"), read("b"));
        assert_eq!(read("b").len() as u64, end);
        Ok(())
    }
}
