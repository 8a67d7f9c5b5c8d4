//! # ferofs-builder — mkfs.erofs as a library
//!
//! What it owns: turning an input tree into an EROFS image. What it does not own: the
//! on-disk structs (`ferofs-format`) and codecs (`ferofs-compress`).
//!
//! Data flows through stages, one module each, each handing the next plain data
//! (`build_tree` below is the whole pipeline):
//!
//! ```text
//! stage                                                  module hands on
//! 1 scan: the input's inodes, metadata only, hardlinks   scan   Tree
//!   merged
//! 2 plan: times, inode versions, xattrs, dir contents,   plan   Plan
//!   inline decisions, block 0's size
//! 3 data placement: file contents to the data region,    place  Placed (a Layout per file)
//!   compressed (zdata) or not (data), in inode order
//! 4 metadata layout: records packed into blocks: nids    nids   MetaLayout
//! 5 directory and symlink blocks, encoded with the nids  blobs  Blobs (every Layout)
//! 6 write: records (record), shared xattrs, blobs, then  write  Written
//!   superblock and checksum (sb) last; rename into place
//! 4-6 with `-m`: records into the metabox inode's data,  metabox Written
//!   which is then stored like a file
//! ```
//! Helpers: [`dir`] (directory blocks), [`xattrs`] (xattr plan), `layout` (the `Layout`
//! hand-off), `out` (the output file), [`options`] (options, errors, report).
//!
//! Layout: `[block 0: superblock][data region][metadata region][shared xattrs]
//! [directory and symlink blocks]` (with `-m`, see `metabox`). The same tree and
//! options give the same bytes (`scripts/same-bytes` compares two builds over a matrix
//! of options).

#![forbid(unsafe_code)]

mod blobs;
pub mod data;
pub mod dir;
mod layout;
mod metabox;
mod nids;
pub mod options;
mod out;
mod place;
mod plan;
mod record;
mod sb;
pub mod scan;
mod write;
pub mod xattrs;
pub mod zdata;

pub use options::{BuildError, BuildOptions, BuildReport, Fragments, UuidChoice};
pub use zdata::{parse_hints, Compression, Hint};

use options::Result;
use scan::{Kind, Tree};
use std::path::Path;

/// Build an image of the directory `source` at `output`.
pub fn build_from_dir(source: &Path, output: &Path, opts: &BuildOptions) -> Result<BuildReport> {
    opts.check()?;
    let tree = scan::scan_dir(source, opts)?;
    build_tree(tree, output, opts)
}

/// Stages 2 to 6: the image of `tree` at `output`.
fn build_tree(mut tree: Tree, output: &Path, o: &BuildOptions) -> Result<BuildReport> {
    let build_time = plan::apply_time_policy(&mut tree, o);
    let mut plan = plan::plan(&tree, build_time, o)?;
    let mut out = out::Out::create(output)?;
    let placed = place::store_data(&tree, &plan, o, &mut out)?;
    let (bytes_in, fed) = (placed.bytes_in, placed.compressor_input);
    let inodes = tree.nodes.len();
    let (image, mb) = if o.metabox {
        metabox::build(&mut tree, &mut plan, placed, out, o)?
    } else {
        let meta = nids::assign(&tree, &plan, &placed.layouts, placed.end_blk)?;
        let blobs_at = meta.end_blk() + plan.shared_xattr_blocks();
        let blobs = blobs::place(&tree, &plan, &meta, placed.layouts, blobs_at)?;
        let image = write::write_image(out, &tree, &plan, &meta, &blobs, o)?;
        (image, metabox::Stats::default())
    };
    let mut r = report(&tree.nodes[..inodes], build_time, bytes_in, fed, &image);
    r.metabox_bytes = mb.bytes;
    r.metabox_stored = mb.stored;
    Ok(r)
}

fn report(
    nodes: &[scan::Node],
    build_time: i64,
    bytes_in: u64,
    compressor_input: u64,
    image: &write::Written,
) -> BuildReport {
    let mut r = BuildReport {
        inodes: nodes.len() as u64,
        bytes_in,
        compressor_input,
        image_bytes: image.bytes,
        blocks: image.blocks,
        uuid: image.uuid,
        build_time,
        ..Default::default()
    };
    for nd in nodes {
        match nd.kind {
            Kind::Dir { .. } => r.directories += 1,
            Kind::File { .. } => r.files += 1,
            Kind::Symlink { .. } => r.symlinks += 1,
            _ => r.special += 1,
        }
    }
    r
}
