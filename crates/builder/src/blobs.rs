//! Stage 5, directory and symlink blocks: with every nid known, directories are encoded
//! and, with symlink targets, placed in whole blocks behind the metadata and the shared
//! xattrs; a last partial block goes behind the inode when the plan inlines it.

use crate::layout::Layout;
use crate::nids::MetaLayout;
use crate::options::*;
use crate::plan::Plan;
use crate::scan::{InodeId, Kind, Tree};

/// Whole blocks of one directory or symlink, zero-padded.
pub struct Blob {
    pub startblk: u64,
    pub bytes: Vec<u8>,
}

/// The blocks placed, and every inode's final layout.
pub struct Blobs {
    pub layouts: Vec<Layout>,
    pub blobs: Vec<Blob>,
    /// First block after the last blob: the image's size in blocks.
    pub end_blk: u64,
}

/// Place directory and symlink contents from block `start_blk`: those of `first` (the
/// `--sort` inodes, [`crate::nids::front`]) first, in that order, then the others in
/// inode order. `layouts` (the data stage's) gets the directories' and symlinks' layouts.
pub fn place(
    tree: &Tree,
    plan: &Plan,
    meta: &MetaLayout,
    mut layouts: Vec<Layout>,
    start_blk: u64,
    first: &[InodeId],
) -> Result<Blobs> {
    let bs = plan.bs;
    let mut blobs = Vec::new();
    let mut next_blk = start_blk;
    let mut is_first = vec![false; tree.nodes.len()];
    for &id in first {
        is_first[id] = true;
    }
    let order = first
        .iter()
        .copied()
        .chain((0..tree.nodes.len()).filter(|&id| !is_first[id]));
    for id in order {
        let nd = &tree.nodes[id];
        let bytes: Vec<u8> = match &nd.kind {
            Kind::Dir { .. } => plan.dirs[id]
                .as_ref()
                .ok_or_else(|| BuildError::Options("internal: directory without entries".into()))?
                .encode(bs as usize, &|c| meta.nid(c)),
            Kind::Symlink { target } => target.clone(),
            _ => continue,
        };
        let inline = plan.content_inline[id];
        let full = if inline {
            bytes.len() as u64 / bs * bs
        } else {
            bytes.len() as u64
        };
        let startblk = (full > 0).then(|| {
            let s = next_blk;
            next_blk += full.div_ceil(bs);
            let mut b = bytes[..full as usize].to_vec();
            b.resize((full.div_ceil(bs) * bs) as usize, 0);
            blobs.push(Blob {
                startblk: s,
                bytes: b,
            });
            s
        });
        layouts[id] = if inline {
            Layout::Inline {
                startblk,
                tail: crate::layout::Tail::mem(bytes[full as usize..].to_vec()),
            }
        } else {
            Layout::Plain {
                startblk: startblk.unwrap_or(0),
            }
        };
    }
    Ok(Blobs {
        layouts,
        blobs,
        end_blk: next_blk,
    })
}
