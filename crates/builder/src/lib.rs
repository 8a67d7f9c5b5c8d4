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
//!   merged (a directory: `scan`; tar streams and layer     tarball
//!   stacks: `tarball`; an EROFS image: `erofsin`); each    erofsin
//!   file's bytes are a `Source`                            source
//! 2 plan: times, inode versions, xattrs, dir contents,   plan   Plan
//!   inline decisions, block 0's size
//! 3 data placement: file contents to the data region,    place  Placed (a Layout per file)
//!   compressed (zdata) or not (data), in inode order
//! 4 metadata layout: records packed into blocks: nids    nids   MetaLayout
//! 5 directory and symlink blocks, encoded with the nids  blobs  Blobs (every Layout)
//! 6 write: records (record), shared xattrs, blobs, then  write  Written
//!   superblock and checksum (sb) last; with --verity the
//!   hash tree behind it (verity); rename into place
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

mod append;
mod blobs;
pub mod chunks;
pub mod cleanup;
pub mod data;
mod dedupe;
pub mod dir;
pub mod erofsin;
mod frag;
pub mod fsconfig;
pub mod fsverity;
mod layout;
mod lzo;
pub mod merge;
mod metabox;
mod nids;
pub mod options;
mod out;
pub mod outfile;
mod place;
mod plan;
mod progress;
mod record;
mod sb;
pub mod scan;
pub mod selabel;
mod shift;
mod similar;
pub mod source;
pub mod squashfs;
pub mod tarball;
pub mod verity;
mod write;
pub mod xattrs;
pub mod zdata;

pub use append::{append_onto, Appended};
pub use options::{
    BuildError, BuildOptions, BuildReport, ChunkOptions, Fragments, InodeVersion, UuidChoice,
    VerityOptions,
};
pub use progress::Progress;
pub use tarball::TarInput;
pub use zdata::{parse_hints, Compression, Hint};

use options::Result;
use scan::{Kind, Tree};
use std::path::Path;

/// Build an image of the directory `source` at `output`.
pub fn build_from_dir(source: &Path, output: &Path, opts: &BuildOptions) -> Result<BuildReport> {
    opts.check()?;
    let mut tree = scan::scan_dir(source, opts)?;
    if opts.ovlfs_strip {
        tarball::strip_overlay(&mut tree);
        scan::fix_nlinks(&mut tree);
    }
    reserve_all(&mut tree, opts);
    build_tree(tree, output, opts)
}

/// `--reserve-data` for a source other than a tar (whose reader reserves as it goes,
/// noting each file's offset in the tar): every non-empty regular file's data becomes
/// space reserved for it.
fn reserve_all(tree: &mut Tree, o: &BuildOptions) {
    if !o.reserve_data {
        return;
    }
    for n in &mut tree.nodes {
        if let Kind::File { src, size } = &mut n.kind {
            if *size > 0 {
                *src = source::Source::Reserved { at: 0 };
            }
        }
    }
}

/// Build an image of tar streams at `output`: one archive, or a layer stack (later
/// layers win, whiteouts applied). Compressed streams and stdin are spooled beside
/// `output`; the spool is removed when the build ends, whatever the outcome.
pub fn build_from_tars(
    inputs: &[TarInput],
    output: &Path,
    opts: &BuildOptions,
) -> Result<BuildReport> {
    opts.check()?;
    let dir = out::dir_of(output);
    let t = tarball::scan_tars(inputs, dir, opts)?;
    let r = build_tree(t.tree, output, opts);
    drop(t.spools);
    r
}

/// Build an image of the SquashFS image `image` at `output` (conversion). File
/// contents are decompressed into a spool beside `output`; the spool is removed when
/// the build ends, whatever the outcome.
pub fn build_from_squashfs(
    image: &Path,
    output: &Path,
    opts: &BuildOptions,
) -> Result<BuildReport> {
    opts.check()?;
    let dir = out::dir_of(output);
    let mut t = squashfs::scan_squashfs(image, dir, opts)?;
    reserve_all(&mut t.tree, opts);
    let r = build_tree(t.tree, output, opts);
    drop(t.spool);
    r
}

/// Re-encode the EROFS image `source` at `output` (any image the reader reads): its
/// tree and file bytes are read through `ferofs-reader`, nothing is extracted.
pub fn build_from_erofs(source: &Path, output: &Path, opts: &BuildOptions) -> Result<BuildReport> {
    opts.check()?;
    let mut tree = erofsin::scan_image(source, opts)?;
    if opts.ovlfs_strip {
        tarball::strip_overlay(&mut tree);
        scan::fix_nlinks(&mut tree);
    }
    reserve_all(&mut tree, opts);
    build_tree(tree, output, opts)
}

/// Merge the EROFS images `layers` (the lowest first, as overlayfs stacks them) into
/// one image at `output`. The files' bytes are copied (re-encoded with the build's
/// options), or with `by_reference`, the new image refers to them where they are in
/// the layers, which become its extra devices in the order given; a file whose full
/// blocks are there but whose tail is inline has the tail copied into a block of the
/// image; files that cannot be referred to (smaller than a block, compressed, with
/// holes) are copied, and the report's warnings say how many.
pub fn build_from_images(
    layers: &[std::path::PathBuf],
    output: &Path,
    opts: &BuildOptions,
    by_reference: bool,
) -> Result<BuildReport> {
    opts.check()?;
    if by_reference && opts.reserve_data {
        return Err(BuildError::Options(
            "--reserve-data with layers merged by reference: their data is referred to, \
             not stored"
                .into(),
        ));
    }
    let mut m = merge::merge_images(layers, opts, by_reference)?;
    reserve_all(&mut m.tree, opts);
    let mut r = build_tree(m.tree, output, opts)?;
    if m.copied.0 > 0 {
        r.warnings.push(format!(
            "{} files ({} bytes) copied into the image: their data is not in one \
             block-aligned piece of their source image (smaller than a block, compressed, \
             holes)",
            m.copied.0, m.copied.1
        ));
    }
    Ok(r)
}

/// What `build_onto` lays on its base image.
#[derive(Clone, Copy)]
pub enum Layer<'a> {
    /// A directory.
    Dir(&'a Path),
    /// Tar streams, each a layer of its own (the lowest first), whiteouts as `--aufs`
    /// says.
    Tars(&'a [TarInput]),
}

/// Build `layer` on top of the EROFS image `base` (mkfs.erofs's `--incremental`), as
/// overlayfs stacks layers: the layer's entries win their names, its whiteouts and
/// opaque directories hide the base's entries (then go, with `--ovlfs-strip`), and a
/// directory a tar only implies keeps the base's metadata. The result is a new image
/// of the whole stack at `output` (which may be `base`: it is replaced when the build
/// succeeds); the base's file bytes are read through the reader and stored anew.
pub fn build_onto(
    base: &Path,
    layer: Layer<'_>,
    output: &Path,
    opts: &BuildOptions,
) -> Result<BuildReport> {
    opts.check()?;
    // Whiteouts are applied by the merge, and stripped after it.
    let mut o = opts.clone();
    o.ovlfs_strip = false;
    let (_, base_tree) = erofsin::scan_image_with(base, &o)?;
    let mut trees = vec![base_tree];
    let mut implicit = vec![Vec::new()];
    let mut spools = Vec::new();
    match layer {
        Layer::Dir(d) => {
            let mut t = scan::scan_dir(d, &o)?;
            reserve_all(&mut t, &o);
            trees.push(t)
        }
        Layer::Tars(inputs) => {
            for i in inputs {
                let t = tarball::scan_tars(std::slice::from_ref(i), out::dir_of(output), &o)?;
                trees.push(t.tree);
                implicit.push(t.implicit);
                spools.extend(t.spools);
            }
        }
    }
    let mut tree = merge::merge_trees(&trees, &implicit);
    drop(trees);
    merge::mark_whiteout_dirs(&mut tree, opts.ovlfs_strip);
    if opts.ovlfs_strip {
        tarball::strip_overlay(&mut tree);
        scan::fix_nlinks(&mut tree);
    }
    let r = build_tree(tree, output, opts);
    drop(spools);
    r
}

/// Stages 2 to 6: the image of `tree` at `output`.
fn build_tree(mut tree: Tree, output: &Path, o: &BuildOptions) -> Result<BuildReport> {
    if o.hard_dereference {
        scan::dereference_hardlinks(&mut tree);
    }
    if o.no_xattrs {
        for n in &mut tree.nodes {
            // What --aufs made of `.wh..wh..opq` markers is the layer's structure, not
            // a source xattr: it stays.
            n.xattrs
                .retain(|(k, _)| o.aufs && k.as_slice() == b"trusted.overlay.opaque");
        }
    }
    if let Some(fc) = &o.fs_config {
        use std::os::unix::ffi::OsStrExt;
        fsconfig::apply(&mut tree, fc, o.mount_point.as_os_str().as_bytes())?;
    }
    if let Some(fc) = &o.file_contexts {
        use std::os::unix::ffi::OsStrExt;
        selabel::label(&mut tree, fc, o.mount_point.as_os_str().as_bytes());
    }
    if o.fsverity_digests {
        fsverity::add_digests(&mut tree, o.worker_threads())?;
    }
    if let Some(name) = &o.inode_digest {
        fsverity::add_fingerprints(&mut tree, name, o.worker_threads())?;
    }
    plan::apply_owner_offsets(&mut tree, o)?;
    let build_time = plan::apply_time_policy(&mut tree, o);
    if o.fragments != Fragments::Off {
        plan::add_packed_inode(&mut tree, build_time);
    }
    place::reserve_blob_slot(&mut tree, output, o)?;
    let mut plan = plan::plan(&tree, build_time, o)?;
    if o.verity.is_some() && o.output_offset != 0 {
        return Err(BuildError::Options(
            "--verity with --offset: the hash tree would not lie behind the image".into(),
        ));
    }
    let mut out = out::Out::create(output, o.output_offset)?;
    // Inline tails (most of the data of a tree of small files) wait for the metadata
    // stage in memory up to an eighth of the memory limit, then in a scratch file: 200,000
    // files of 0.1-4 KB took 539 MB of peak RSS with every tail in memory, 202 MB with
    // 64 MiB of them.
    out.set_tail_budget(match o.memory_limit {
        0 => u64::MAX,
        m => m / 8,
    });
    let mut placed = place::store_data(&tree, &plan, o, &mut out)?;
    // Written now, put in place with the image.
    let block_map = match &o.block_map {
        Some(p) => Some((p, block_map(p, &placed.reserved, plan.bs)?)),
        None => None,
    };
    let blob = placed.blob.take();
    if let (Some((_, blocks)), Some(slot)) = (&blob, plan.cfg.devices.first_mut()) {
        slot.blocks = *blocks;
    }
    // Long xattr prefixes go into the packed inode when there is one (kernels before
    // the plain table's flag read them there), unless asked plain or in a metabox
    // image (whose kernels read the plain table).
    if let Some(p) = placed.packed.as_mut() {
        if !plan.cfg.prefixes.is_empty() && !o.metabox && !o.plain_xattr_prefixes {
            plan.prefixes_in_packed = Some(p.append_aligned(&plan.cfg.prefix_table())?);
        }
    }
    if let (Some(id), Some(p)) = (tree.packed, &placed.packed) {
        plan.set_file_size(id, p.size);
        place::store_packed(id, &plan, o, &mut out, &mut placed)?;
    }
    let frag_saved = fragments_saved(&placed, tree.packed, plan.bs);
    // The spool is read for the last time: remove it (freeing its page cache, about a
    // gigabyte on a source tree) beside the metadata stage, which runs on one core.
    // Joined when dropped, on every way out of here: the spool is gone when the build is.
    let _spool = frag::DropBeside::new(placed.packed.take());
    let stats = place::Stats::of(&placed);
    let inodes = tree.nodes.len();
    let (image, mb) = if o.metabox {
        metabox::build(&mut tree, &mut plan, placed, out, o)?
    } else {
        let first = nids::front(&tree, &o.sort);
        let meta = nids::assign(&tree, &plan, &placed.layouts, placed.end_blk, &first)?;
        let blobs_at = meta.end_blk() + plan.shared_xattr_blocks();
        let blobs = blobs::place(&tree, &plan, &meta, placed.layouts, blobs_at, &first)?;
        let image = write::write_image(out, &tree, &plan, &meta, &blobs, o)?;
        (image, metabox::Stats::default())
    };
    // The blob goes into place once the image has: a failed build leaves neither.
    if let Some((b, _)) = blob {
        b.finish(o.fsync)?;
    }
    if let Some((p, text)) = block_map {
        outfile::write_all(p, &text, o.fsync)?;
    }
    let mut r = report(
        &tree.nodes[..inodes],
        tree.packed,
        build_time,
        &stats,
        frag_saved,
        &image,
    );
    r.metabox_bytes = mb.bytes;
    r.metabox_stored = mb.stored;
    Ok(r)
}

/// `--block-map`: the reserved files' lines (blocks of `bs` bytes), written to
/// `path` once the image is.
fn block_map(path: &Path, entries: &[place::Reserved], bs: u64) -> Result<Vec<u8>> {
    use std::io::Write;
    // A directory or a link loop fails the build before the image is written.
    outfile::resolve(path)?;
    let mut w = Vec::new();
    for e in entries {
        // mkfs.erofs's format: hex but the zeros that end the last block, which are
        // decimal and only there when some are.
        let r = write!(w, "{:08x} {:8x} {:08x}", e.blkaddr, e.blocks, e.at);
        let r = r.and_then(|()| match (bs - e.size % bs) % bs {
            0 => writeln!(w),
            zeroed => writeln!(w, " {zeroed:08}"),
        });
        r.map_err(options::io_err(path, "block map: write"))?;
    }
    Ok(w)
}

/// Bytes fragments saved, at least: what they would take on their own (a lower
/// bound, see `Placed::fragment_alt`) less what the packed inode takes.
fn fragments_saved(placed: &place::Placed, packed: Option<usize>, bs: u64) -> u64 {
    let Some(id) = packed.filter(|_| placed.packed.is_some()) else {
        return 0;
    };
    let size = placed.packed.as_ref().map_or(0, |p| p.size);
    let stored = match &placed.layouts[id] {
        layout::Layout::Compressed(z) => {
            z.blocks * bs + z.inline.as_ref().map_or(0, |(b, _)| b.len() as u64)
        }
        _ => size,
    };
    placed.fragment_alt.saturating_sub(stored)
}

fn report(
    nodes: &[scan::Node],
    packed: Option<usize>,
    build_time: i64,
    placed: &place::Stats,
    fragments_saved: u64,
    image: &write::Written,
) -> BuildReport {
    let mut r = BuildReport {
        inodes: nodes.len() as u64,
        bytes_in: placed.bytes_in,
        reserved_bytes: placed.reserved_bytes,
        compressor_input: placed.compressor_input,
        image_bytes: image.bytes,
        blocks: image.blocks,
        uuid: image.uuid,
        build_time,
        dedupe_saved: placed.dedupe_saved,
        fragment_bytes: placed.fragment_bytes,
        fragments_saved,
        warnings: placed.warnings.clone(),
        verity: image.verity.clone(),
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
    if packed.is_some() {
        // The packed inode is no file of the tree.
        r.files = r.files.saturating_sub(1);
    }
    r
}
