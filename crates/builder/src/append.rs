//! In-place append (`ferofs build --base IMAGE LAYER IMAGE`, mkfs.erofs's
//! `--incremental`): a layer laid onto an image by writing only what changed, behind
//! the image's end, and a few bytes in place. The image's bytes are otherwise left as
//! they are, so the cost is the layer's, not the image's.
//!
//! What is written:
//! - every file, symlink and special file of the layer, and every directory the layer
//!   touches (the ones it names, and their ancestors up to the root), as new inodes
//!   behind the image's end, through the usual stages (plan, data, metadata, blobs);
//!   their nids count from the image's `meta_blkaddr` like the old ones;
//! - a touched directory's entries keep the old nids of what the layer leaves alone
//!   (each such entry is a *kept* node of the tree: it has no record of its own);
//! - in place: the root's record (the root keeps its nid, which the superblock's 16-bit
//!   field names; its entries go to blocks of their own, so the new record is no longer
//!   than the old one), the ".." entry of each kept directory whose parent moved, and
//!   the superblock (block count, inode count, checksum).
//!
//! The overlay semantics are `merge`'s for two layers: an entry of the layer wins its
//! name, a directory merges with the image's directory at its path unless it is
//! opaque, whiteouts hide the image's entries and stay (or go, with `--ovlfs-strip`,
//! also from the touched directories of the image), a directory a tar only implies
//! keeps the image's metadata.
//!
//! Not everything can be appended: options that change the whole image (fragments,
//! dedupe, metabox, chunks, verity, ...), an image whose format the new inodes cannot
//! join (metabox, extra devices, another compression configuration) and
//! several tar layers at once are [`Appended::Unsupported`], said before anything is
//! written (and, but for a root that outgrows its record, before the layer is read),
//! so the caller can rebuild the whole image instead ([`crate::build_onto`]).
//! A build that fails leaves the image as it was (the in-place writes come last, the
//! bytes they overwrite are put back should one fail, and the file is cut back to
//! its old length).

use crate::erofsin::{self, ErofsImage};
use crate::layout::Layout;
use crate::merge::opaque;
use crate::options::*;
use crate::out::Out;
use crate::scan::{InodeId, Kind, Node, Tree};
use crate::tarball::{is_whiteout, OVL_OPAQUE};
use crate::{blobs, nids, place, plan, scan, tarball, write, Layer};
use ferofs_format::dirent::{
    FT_BLKDEV, FT_CHRDEV, FT_DIR, FT_FIFO, FT_REG_FILE, FT_SOCK, FT_SYMLINK,
};
use ferofs_format::inode::{
    COMPACT_NLINK_AT, COMPACT_SIZE, EXTENDED_NLINK_AT, EXTENDED_SIZE, S_IFBLK, S_IFCHR, S_IFDIR,
    S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK,
};
use ferofs_format::sb::{self as fsb, Superblock};
use ferofs_reader::{DataLayout, Inode};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

/// What [`append_onto`] did.
#[derive(Debug)]
pub enum Appended {
    Done(Box<BuildReport>),
    /// Nothing was read or written: the reason this cannot be appended in place.
    Unsupported(String),
}

/// Deepest directory nesting followed.
const MAX_DEPTH: usize = 4096;
/// A kept directory larger than this is rewritten rather than searched for its "..".
const MAX_DOTDOT_SCAN: u64 = 64 << 20;

/// The options an append cannot honour (they change the whole image), or None.
fn unsupported_options(o: &BuildOptions) -> Option<&'static str> {
    let why = if o.output_offset != 0 {
        "--offset"
    } else if o.metabox {
        "-m (metabox)"
    } else if o.layout48() {
        "the 48-bit layout"
    } else if o.fragments != Fragments::Off {
        "fragments"
    } else if o.dedupe {
        "dedupe"
    } else if o.chunks.is_some() {
        "chunk-based files"
    } else if o.tar_index {
        "--tar-index"
    } else if o.reserve_data || o.block_map.is_some() {
        "--reserve-data / --block-map"
    } else if o.verity.is_some() {
        "--verity"
    } else if o.fsverity_digests || o.inode_digest.is_some() {
        "fs-verity digests"
    } else if o.fs_config.is_some() || o.file_contexts.is_some() {
        "--fs-config-file / --file-contexts"
    } else if o.uid_offset != 0 || o.gid_offset != 0 {
        "--uid-offset / --gid-offset"
    } else if !o.sort.is_empty() {
        "--sort"
    } else if o.blobdev.is_some() || !o.source_devices.is_empty() {
        "extra devices"
    } else if o.fs_align_blocks > 1 {
        "--fsalignblks"
    } else if o.label.is_some() {
        "a new label"
    } else if !matches!(o.uuid, UuidChoice::Derived) {
        "a new UUID"
    } else {
        return None;
    };
    Some(why)
}

/// Why the image `sb` cannot take new inodes built with `o`, or None.
fn unsupported_image(sb: &Superblock, block0: &[u8], o: &BuildOptions) -> Option<String> {
    use fsb::*;
    if sb.has_incompat(INCOMPAT_METABOX) {
        return Some("the image keeps its inodes in a metabox".into());
    }
    if sb.extra_devices != 0 || sb.has_incompat(INCOMPAT_DEVICE_TABLE) {
        return Some("the image has extra devices".into());
    }
    let cfg = crate::sb::ComprCfg::new(o, &[]);
    if !cfg.prefixes.is_empty() {
        return Some("long xattr name prefixes".into());
    }
    if o.compression.is_some() {
        // An image without compression takes LZ4 files of one-block pclusters (no
        // config records needed; the flags are set in its superblock) — unless it
        // might hold LZ4 files of before zero padding (a non-zero window field).
        if !sb.has_incompat(INCOMPAT_ZERO_PADDING)
            && (cfg.needed || sb.has_incompat(INCOMPAT_COMPR_CFGS) || sb.u1 != 0)
        {
            return Some("the image has no compressed files of this kind".into());
        }
        let at = fsb::SB_OFFSET as usize + sb.sb_size();
        let same_cfgs = sb.has_incompat(INCOMPAT_COMPR_CFGS)
            && sb.u1 == cfg.algs
            && block0.get(at..at + cfg.bytes.len()) == Some(&cfg.bytes[..]);
        let plain_lz4 = !sb.has_incompat(INCOMPAT_COMPR_CFGS) || sb.u1 & 1 != 0;
        if (cfg.needed && !same_cfgs) || (!cfg.needed && !plain_lz4) {
            return Some(
                "the compression settings (algorithms, levels' dictionaries, pcluster sizes) \
                 differ from the image's"
                    .into(),
            );
        }
    }
    None
}

/// Lay `layer` onto the EROFS image at `image`, in place (see the module doc). Options
/// as for [`crate::build_onto`]; the block size is the image's.
pub fn append_onto(image: &Path, layer: Layer<'_>, opts: &BuildOptions) -> Result<Appended> {
    opts.check()?;
    if let Some(why) = unsupported_options(opts) {
        return Ok(Appended::Unsupported(why.into()));
    }
    if let Layer::Tars(t) = &layer {
        if t.len() != 1 {
            return Ok(Appended::Unsupported(
                "several tar layers in one call: append them one by one".into(),
            ));
        }
    }
    let file_len = match std::fs::metadata(image) {
        Ok(m) if m.is_file() => m.len(),
        _ => return Ok(Appended::Unsupported("not a regular file".into())),
    };
    if let Some(dev) = loop_device_of(image) {
        // Changed under a mount, the kernel would mix cached and new metadata; the
        // rebuild writes a new file and renames it over this one.
        return Ok(Appended::Unsupported(format!("{dev} is attached to it")));
    }
    let base = erofsin::open_image(image, &BuildOptions::default())?;
    let sb = base.img.superblock().clone();
    let bs = u64::from(base.img.block_size());
    let mut o = opts.clone();
    o.block_size = base.img.block_size();
    // Compact inodes show the superblock's fixed nanoseconds: none of ours has them.
    if sb.fixed_nsec != 0 {
        o.inode_version = InodeVersion::Extended;
    }
    let mut head = vec![0u8; head_len(bs)];
    base.read_at(0, &mut head)?;
    if let Some(why) = unsupported_image(&sb, &head, &o) {
        return Ok(Appended::Unsupported(why));
    }
    if file_len > sb.root_nid_and_blocks().1.saturating_mul(bs) {
        // A `--verity` hash tree, most likely: appending would bury it, stale.
        return Ok(Appended::Unsupported(
            "bytes lie behind the image's end (a verity hash tree?)".into(),
        ));
    }
    let root_nid = base.img.root_nid();
    let root_ino = base.img.inode(root_nid).map_err(erofsin::rerr(image))?;
    let (root_pos, old_root_len) = match base.img.inode_record(&root_ino) {
        Some((s, e)) => {
            let tail = match root_ino.layout {
                DataLayout::FlatInline => root_ino.size % bs,
                _ => 0,
            };
            (s, e - s + tail)
        }
        None => return Ok(Appended::Unsupported("the root is in a metabox".into())),
    };

    // The layer, whiteouts kept (the walk applies them).
    o.ovlfs_strip = false;
    let (ltree, implicit, spools) = match layer {
        Layer::Dir(d) => (scan::scan_dir(d, &o)?, Vec::new(), Vec::new()),
        Layer::Tars(inputs) => {
            let t = tarball::scan_tars(inputs, crate::out::dir_of(image), &o)?;
            (t.tree, t.implicit, t.spools)
        }
    };
    o.ovlfs_strip = opts.ovlfs_strip;
    let mut walk = Walk {
        base: &base,
        l: &ltree,
        implicit: &implicit,
        o: &o,
        nodes: Vec::new(),
        fixed: Vec::new(),
        dotdots: Vec::new(),
        copied: HashMap::new(),
        unlinked: BTreeMap::new(),
        hidden_seen: 0,
        raw_xattrs: Vec::new(),
    };
    let root = walk.merged_dir(&root_ino, Some(ltree.root), None, Vec::new(), 0)?;
    let links = walk.nlink_patches()?;
    let Walk {
        nodes,
        mut fixed,
        dotdots,
        raw_xattrs,
        ..
    } = walk;
    drop(ltree);
    fixed[root] = Some(root_nid);
    let mut tree = Tree {
        nodes,
        root,
        packed: None,
        devices: Vec::new(),
    };
    finish_tree(&mut tree, &mut fixed, &o);
    let rereadable = match layer {
        Layer::Dir(_) => true,
        Layer::Tars(t) => t.iter().all(|i| matches!(i, tarball::TarInput::File(_))),
    };
    let places = Places {
        file_len,
        root_pos,
        old_root_len,
        old_root_xattrs: root_ino.meta_size.saturating_sub(core_size(&root_ino)) as usize,
        dotdots: &dotdots,
        links,
        raw_xattrs,
    };
    let r = write_append(image, tree, &fixed, places, &sb, head, &o);
    drop(spools);
    match r? {
        Ok(r) => Ok(Appended::Done(Box::new(r))),
        Err(why) if rereadable => Ok(Appended::Unsupported(why)),
        Err(why) => Err(BuildError::Invalid {
            path: image.to_path_buf(),
            what: format!("{why}: rebuild the whole image instead (--rewrite)"),
        }),
    }
}

/// The loop device whose backing file is `image`, if any (Linux's sysfs).
fn loop_device_of(image: &Path) -> Option<String> {
    let want = std::fs::canonicalize(image).ok()?;
    let dir = std::fs::read_dir("/sys/block").ok()?;
    // Bounded: the entries of one sysfs directory.
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(back) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        if Path::new(back.trim_end_matches('\n')) == want {
            return Some(format!("/dev/{name}"));
        }
    }
    None
}

/// Bytes at the image's start read and rewritten with the superblock: its block (or
/// the superblock and the region its checksum covers).
fn head_len(bs: u64) -> usize {
    let sb_end = fsb::SB_OFFSET as usize + fsb::checksum_len(bs as u32).max(fsb::SB_MAX_SIZE);
    sb_end.max(bs as usize)
}

/// Links, whiteouts and stripped markers of the tree of new and touched inodes.
fn finish_tree(tree: &mut Tree, fixed: &mut Vec<Option<u64>>, o: &BuildOptions) {
    if o.hard_dereference {
        scan::dereference_hardlinks(tree);
        fixed.resize(tree.nodes.len(), None);
    }
    let is_dir: Vec<bool> = tree
        .nodes
        .iter()
        .map(|n| n.mode & S_IFMT == S_IFDIR)
        .collect();
    let root = tree.root;
    for (id, (nd, f)) in tree.nodes.iter_mut().zip(fixed.iter()).enumerate() {
        let written = f.is_none() || id == root;
        if let Kind::Dir { entries, .. } = &nd.kind {
            let subdirs = entries.iter().filter(|(_, c)| is_dir[*c]).count();
            nd.nlink = u32::try_from(subdirs).unwrap_or(u32::MAX).saturating_add(2);
        }
        if written {
            if o.ovlfs_strip {
                nd.xattrs.retain(|(k, _)| k.as_slice() != OVL_OPAQUE);
            }
            if o.no_xattrs {
                nd.xattrs
                    .retain(|(k, _)| o.aufs && k.as_slice() == OVL_OPAQUE);
            }
        }
    }
    crate::merge::mark_whiteout_dirs(tree, o.ovlfs_strip);
}

/// Builds the tree of what the append writes.
struct Walk<'a> {
    base: &'a Arc<ErofsImage>,
    l: &'a Tree,
    implicit: &'a [bool],
    o: &'a BuildOptions,
    nodes: Vec<Node>,
    /// Per node: the image's nid of a kept inode (no record written).
    fixed: Vec<Option<u64>>,
    /// Kept directories whose ".." must name their new parent: (image byte of the
    /// entry's nid, the parent).
    dotdots: Vec<(u64, InodeId)>,
    /// Layer inodes already copied (hardlinks).
    copied: HashMap<InodeId, InodeId>,
    /// Image inodes with more than one name that lost names: how many.
    unlinked: BTreeMap<u64, u32>,
    /// Entries of hidden image directories visited so far (bounded).
    hidden_seen: usize,
    /// Directories that took the image's metadata: their xattr area as stored (it may
    /// refer to the image's shared xattrs) and the xattrs it holds.
    raw_xattrs: Vec<RawXattrs>,
}

/// An image inode's xattr area as stored, for the node that took its xattrs.
struct RawXattrs {
    id: InodeId,
    area: Vec<u8>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Most entries of hidden image directories followed to find hardlinks that lose a
/// name (a hostile image could nest far).
const MAX_HIDDEN: usize = 50_000_000;

/// Bytes of an image inode's core (before its xattr area).
fn core_size(ino: &Inode) -> u64 {
    if ino.extended {
        EXTENDED_SIZE as u64
    } else {
        COMPACT_SIZE as u64
    }
}

fn mode_of(ft: u8) -> Option<u16> {
    Some(match ft {
        FT_REG_FILE => S_IFREG,
        FT_DIR => S_IFDIR,
        FT_CHRDEV => S_IFCHR,
        FT_BLKDEV => S_IFBLK,
        FT_FIFO => S_IFIFO,
        FT_SOCK => S_IFSOCK,
        FT_SYMLINK => S_IFLNK,
        _ => return None,
    })
}

impl Walk<'_> {
    fn path(&self) -> &Path {
        &self.base.path
    }

    fn not_too_deep(&self, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(BuildError::Invalid {
                path: self.path().to_path_buf(),
                what: "directories nested too deep".into(),
            });
        }
        Ok(())
    }

    fn push(&mut self, n: Node, fixed: Option<u64>) -> InodeId {
        self.nodes.push(n);
        self.fixed.push(fixed);
        self.nodes.len() - 1
    }

    /// A kept inode of the image: its nid and file type, nothing else.
    fn kept(&mut self, nid: u64, mode: u16, whiteout: bool, rel: Vec<u8>) -> InodeId {
        let kind = if whiteout {
            Kind::Device { rdev: 0 }
        } else {
            Kind::Fifo
        };
        self.push(
            Node {
                kind,
                mode,
                uid: 0,
                gid: 0,
                mtime: 0,
                mtime_nsec: 0,
                nlink: 1,
                xattrs: Vec::new(),
                rel,
            },
            Some(nid),
        )
    }

    /// The merged directory of the image's `bino` and the layer's `lid` (None: the
    /// image's directory rewritten as it is, because its ".." cannot be patched).
    fn merged_dir(
        &mut self,
        bino: &Inode,
        lid: Option<InodeId>,
        parent: Option<InodeId>,
        rel: Vec<u8>,
        depth: usize,
    ) -> Result<InodeId> {
        self.not_too_deep(depth)?;
        let l = self.l;
        let made_up = lid.is_none_or(|l| self.implicit.get(l).copied().unwrap_or(false));
        let me = self.nodes.len();
        let mut node = match lid {
            Some(lid) if !made_up => l.nodes[lid].clone(),
            _ => {
                let n = erofsin::make_node(self.base, bino.clone(), rel.clone(), self.o)?;
                if let Some(area) = self.xattr_area(bino)? {
                    self.raw_xattrs.push(RawXattrs {
                        id: me,
                        area,
                        xattrs: n.xattrs.clone(),
                    });
                }
                n
            }
        };
        node.kind = Kind::Dir {
            entries: Vec::new(),
            parent: parent.unwrap_or(me),
        };
        node.rel = rel.clone();
        self.push(node, None);
        let lentries: &[(Vec<u8>, InodeId)] = match lid.map(|i| &l.nodes[i].kind) {
            Some(Kind::Dir { entries, .. }) => entries,
            _ => &[],
        };
        let hide = lid.is_some_and(|i| opaque(&l.nodes[i]));
        let mut based: BTreeMap<Vec<u8>, (u64, u8)> = BTreeMap::new();
        {
            let img = &self.base.img;
            for e in img.read_dir(bino).map_err(erofsin::rerr(self.path()))? {
                if e.name != b"." && e.name != b".." {
                    based.insert(e.name, (e.nid, e.file_type));
                }
            }
        }
        if hide {
            // An opaque directory: everything of the image's under it goes.
            for &(nid, _) in based.values() {
                self.hide(nid, depth + 1)?;
            }
            based.clear();
        }
        let strip = self.o.ovlfs_strip;
        let mut entries = Vec::with_capacity(based.len() + lentries.len());
        for (name, &(nid, ft)) in &based {
            if lentries
                .binary_search_by(|(n, _)| n.as_slice().cmp(name))
                .is_ok()
            {
                continue;
            }
            let crel = scan::child_rel(&rel, name);
            if let Some(id) = self.kept_entry(nid, ft, me, crel, depth)? {
                entries.push((name.clone(), id));
            }
        }
        for (name, lc) in lentries {
            let ln = &l.nodes[*lc];
            let crel = scan::child_rel(&rel, name);
            let below_dir = match based.get(name) {
                Some(&(nid, _)) if matches!(ln.kind, Kind::Dir { .. }) => {
                    let ino = self
                        .base
                        .img
                        .inode(nid)
                        .map_err(erofsin::rerr(self.path()))?;
                    ino.is_dir().then_some(ino)
                }
                _ => None,
            };
            if below_dir.is_none() {
                if let Some(&(nid, _)) = based.get(name) {
                    self.hide(nid, depth + 1)?;
                }
            }
            if strip && is_whiteout(ln) {
                continue;
            }
            let id = match below_dir {
                Some(ino) => self.merged_dir(&ino, Some(*lc), Some(me), crel, depth + 1)?,
                None => self.copy(*lc, me, crel, depth + 1)?,
            };
            entries.push((name.clone(), id));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        if let Kind::Dir { entries: en, .. } = &mut self.nodes[me].kind {
            *en = entries;
        }
        Ok(me)
    }

    /// The xattr area of image inode `ino` as stored (None: it has none).
    fn xattr_area(&self, ino: &Inode) -> Result<Option<Vec<u8>>> {
        let Some((pos, end)) = self.base.img.inode_record(ino) else {
            return Ok(None);
        };
        let from = pos + core_size(ino);
        if end <= from {
            return Ok(None);
        }
        let mut area = vec![0u8; (end - from) as usize];
        self.base.read_at(from, &mut area)?;
        Ok(Some(area))
    }

    /// The entry `nid` (type `ft`) of an image directory the append rewrites as the
    /// node `parent`: kept, or (a directory whose ".." cannot be patched) rewritten;
    /// None for a whiteout `--ovlfs-strip` drops.
    fn kept_entry(
        &mut self,
        nid: u64,
        ft: u8,
        parent: InodeId,
        rel: Vec<u8>,
        depth: usize,
    ) -> Result<Option<InodeId>> {
        let base = self.base;
        let img = &base.img;
        let rerr = erofsin::rerr(&base.path);
        let mode = match mode_of(ft) {
            Some(m) if m != S_IFDIR && m != S_IFCHR => m,
            _ => {
                // Directories, devices (whiteouts?) and unknown types: the inode says.
                let ino = img.inode(nid).map_err(&rerr)?;
                let m = ino.file_type();
                if ino.is_dir() {
                    return match dotdot_pos(img, &ino).map_err(&rerr)? {
                        Some(pos) => {
                            let id = self.kept(nid, S_IFDIR, false, rel);
                            self.dotdots.push((pos, parent));
                            Ok(Some(id))
                        }
                        None => self
                            .merged_dir(&ino, None, Some(parent), rel, depth + 1)
                            .map(Some),
                    };
                }
                if m == S_IFCHR && ino.rdev == 0 {
                    if self.o.ovlfs_strip {
                        self.lost_name(&ino);
                        return Ok(None);
                    }
                    return Ok(Some(self.kept(nid, S_IFCHR, true, rel)));
                }
                m
            }
        };
        Ok(Some(self.kept(nid, mode, false, rel)))
    }

    /// Image inode `ino` lost one of its names: counted when it has others.
    fn lost_name(&mut self, ino: &Inode) {
        if ino.nlink > 1 {
            *self.unlinked.entry(ino.nid).or_default() += 1;
        }
    }

    /// The image's entry `nid` is hidden by the layer: a name of an inode with several
    /// is gone; a directory's whole subtree is.
    fn hide(&mut self, nid: u64, depth: usize) -> Result<()> {
        let base = self.base;
        let rerr = erofsin::rerr(&base.path);
        self.hidden_seen += 1;
        if depth > MAX_DEPTH || self.hidden_seen > MAX_HIDDEN {
            return Err(BuildError::Invalid {
                path: base.path.to_path_buf(),
                what: "the directories the layer hides nest too deep or hold too many entries"
                    .into(),
            });
        }
        let ino = base.img.inode(nid).map_err(&rerr)?;
        if !ino.is_dir() {
            self.lost_name(&ino);
            return Ok(());
        }
        for e in base.img.read_dir(&ino).map_err(&rerr)? {
            if e.name != b"." && e.name != b".." {
                self.hide(e.nid, depth + 1)?;
            }
        }
        Ok(())
    }

    /// In-place writes of the link counts of image inodes that lost names: (image
    /// byte, new count), for those that keep at least one name.
    fn nlink_patches(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        let img = &self.base.img;
        let rerr = erofsin::rerr(&self.base.path);
        let mut out = Vec::new();
        for (&nid, &gone) in &self.unlinked {
            let ino = img.inode(nid).map_err(&rerr)?;
            let left = ino.nlink.saturating_sub(gone);
            let Some((pos, _)) = img.inode_record(&ino) else {
                continue;
            };
            match (left, ino.extended) {
                (0, _) => {}
                (n, true) => out.push((pos + EXTENDED_NLINK_AT as u64, n.to_le_bytes().to_vec())),
                (n, false) => out.push((
                    pos + COMPACT_NLINK_AT as u64,
                    (n as u16).to_le_bytes().to_vec(),
                )),
            }
        }
        Ok(out)
    }

    /// The layer's inode `lid` and, for a directory, everything under it: all new.
    fn copy(
        &mut self,
        lid: InodeId,
        parent: InodeId,
        rel: Vec<u8>,
        depth: usize,
    ) -> Result<InodeId> {
        self.not_too_deep(depth)?;
        if let Some(&t) = self.copied.get(&lid) {
            return Ok(t);
        }
        let l = self.l;
        let mut node = l.nodes[lid].clone();
        node.rel = rel.clone();
        let Kind::Dir { entries, .. } = &l.nodes[lid].kind else {
            let id = self.push(node, None);
            self.copied.insert(lid, id);
            return Ok(id);
        };
        let me = self.nodes.len();
        node.kind = Kind::Dir {
            entries: Vec::new(),
            parent,
        };
        self.push(node, None);
        let mut out = Vec::with_capacity(entries.len());
        for (name, c) in entries {
            if self.o.ovlfs_strip && is_whiteout(&l.nodes[*c]) {
                continue;
            }
            let crel = scan::child_rel(&rel, name);
            out.push((name.clone(), self.copy(*c, me, crel, depth + 1)?));
        }
        if let Kind::Dir { entries: en, .. } = &mut self.nodes[me].kind {
            *en = out;
        }
        Ok(me)
    }
}

/// Image byte of the nid of directory `ino`'s ".." entry, when its blocks are plain
/// (flat, uncompressed) and so can be patched; None otherwise.
fn dotdot_pos<S: ferofs_reader::Source>(
    img: &ferofs_reader::Image<S>,
    ino: &Inode,
) -> ferofs_reader::Result<Option<u64>> {
    let inline = match ino.layout {
        DataLayout::FlatPlain => false,
        DataLayout::FlatInline => true,
        _ => return Ok(None),
    };
    if ino.size > MAX_DOTDOT_SCAN {
        return Ok(None);
    }
    let bs = u64::from(img.block_size());
    let data = img.read_to_vec_limited(ino, MAX_DOTDOT_SCAN)?;
    let tail_at = if inline && !ino.size.is_multiple_of(bs) {
        ino.size / bs * bs
    } else {
        u64::MAX
    };
    for (k, blk) in data.chunks(bs as usize).enumerate() {
        let off = k as u64 * bs;
        let ents = ferofs_reader::dir::parse_dir_block(blk, ino.nid, off)?;
        let Some(i) = ents.iter().position(|e| e.name == b"..") else {
            continue;
        };
        let at = off + (i * ferofs_format::dirent::DIRENT_SIZE) as u64;
        if at >= tail_at {
            return Ok(img
                .inode_record(ino)
                .and_then(|(_, end)| end.checked_add(at - tail_at)));
        }
        return Ok(ino
            .startblk()
            .checked_mul(bs)
            .and_then(|p| p.checked_add(at)));
    }
    Ok(None)
}

/// Where the in-place writes go.
struct Places<'a> {
    /// The image file's length before the append.
    file_len: u64,
    /// The root's record and its old length, and that of its xattr area (kept: room
    /// `--root-xattr-isize` reserved stays for the next append).
    root_pos: u64,
    old_root_len: u64,
    old_root_xattrs: usize,
    dotdots: &'a [(u64, InodeId)],
    /// Link counts of image inodes that lost names.
    links: Vec<(u64, Vec<u8>)>,
    raw_xattrs: Vec<RawXattrs>,
}

/// Stages 2-6 for the append: new inodes behind the image's end, then the in-place
/// writes. Inner Err: the layer, once read, cannot be appended (nothing was written).
fn write_append(
    image: &Path,
    mut tree: Tree,
    fixed: &[Option<u64>],
    places: Places<'_>,
    sb: &Superblock,
    mut head: Vec<u8>,
    o: &BuildOptions,
) -> Result<std::result::Result<BuildReport, String>> {
    let Places {
        file_len: old_len,
        root_pos,
        old_root_len,
        old_root_xattrs,
        dotdots,
        links,
        raw_xattrs,
    } = places;
    let root = tree.root;
    let epoch = sb.epoch as i64;
    let mut to = o.clone();
    if to.timestamp.is_none() {
        to.timestamp = Some(epoch);
        to.timestamp_build_only = true;
    }
    plan::apply_time_policy(&mut tree, &to);
    // Kept inodes are never written: give them what a compact inode holds, so the
    // plan asks nothing of them.
    for (n, f) in tree.nodes.iter_mut().zip(fixed) {
        if f.is_some() && !matches!(n.kind, Kind::Dir { .. }) {
            (n.mtime, n.mtime_nsec) = (epoch, 0);
        }
    }
    let mut plan = plan::plan_unshared(&tree, epoch, o)?;
    plan.ino_base = sb.inos as u32;
    let bs = plan.bs;
    // A directory whose xattrs are still the image's keeps their area as stored: it
    // may refer to the image's shared xattrs (whose table stays as it is), and the
    // root's then fits its old record.
    for r in raw_xattrs {
        if tree.nodes[r.id].xattrs == r.xattrs {
            plan.xattrs.ibody[r.id] = r.area;
        }
    }
    plan.decide_content_inline(&tree);
    crate::xattrs::reserve_root(&mut plan.xattrs, root, old_root_xattrs);
    // The root's record (core and xattrs: its entries go to blocks) must fit its old
    // place.
    plan.content_inline[root] = false;
    let root_len = plan.fixed_meta(root);
    if root_len > old_root_len {
        return Ok(Err(format!(
            "the root's new inode ({root_len} bytes: more xattrs?) does not fit its old one \
             ({old_root_len} bytes)"
        )));
    }
    let mut out = Out::append(image)?;
    let (_, blocks) = sb.root_nid_and_blocks();
    let start_blk = old_len.div_ceil(bs).max(blocks);
    plan.first_blk = start_blk;
    out.set_tail_budget(match o.memory_limit {
        0 => u64::MAX,
        m => m / 8,
    });
    let placed = place::store_data(&tree, &plan, o, &mut out)?;
    let stats = place::Stats::of(&placed);
    let meta = nids::assign_append(
        &tree,
        &plan,
        &placed.layouts,
        placed.end_blk,
        fixed,
        u64::from(sb.meta_blkaddr),
    )?;
    let blobs = blobs::place(&tree, &plan, &meta, placed.layouts, meta.end_blk(), &[])?;
    let layouts = &blobs.layouts;
    let compressed = layouts.iter().any(Layout::compressed);
    let big_pcluster = compressed && plan.cfg.needed;
    if big_pcluster && !sb.has_incompat(fsb::INCOMPAT_COMPR_CFGS)
        || layouts.iter().any(|l| l.shared() || l.fragment())
    {
        return Err(BuildError::Options(
            "internal: the appended inodes need features the image lacks".into(),
        ));
    }
    // The new records, in place order, behind the data.
    let region_at = meta.base * bs;
    let mut in_region: Vec<InodeId> = (0..tree.nodes.len())
        .filter(|&id| fixed[id].is_none())
        .collect();
    in_region.sort_unstable_by_key(|&id| meta.pos[id]);
    {
        let mut w = write::Window::new(&mut out, region_at);
        for &id in &in_region {
            let rec = write::record_at(&tree, &plan, id, &layouts[id], meta.pos[id], big_pcluster)?;
            w.put(meta.pos[id], &rec)?;
        }
        w.finish(meta.end_blk() * bs)?;
    }
    for b in &blobs.blobs {
        out.write_at(b.startblk * bs, &b.bytes)?;
    }
    let total = blobs.end_blk.max(start_blk);
    let blocks_lo = u32::try_from(total)
        .map_err(|_| BuildError::TooLarge("the image would pass 2^32 blocks".into()))?;
    // The in-place writes: the root's record (padded to its old length), the ".."
    // entries, the superblock.
    let mut root_rec =
        write::record_at(&tree, &plan, root, &layouts[root], root_pos, big_pcluster)?;
    if root_rec.len() as u64 > old_root_len {
        return Err(BuildError::Options(
            "internal: the root's record is longer than planned".into(),
        ));
    }
    root_rec.resize(old_root_len as usize, 0);
    let mut patches: Vec<(u64, Vec<u8>)> = vec![(root_pos, root_rec)];
    for &(pos, parent) in dotdots {
        patches.push((pos, meta.nid(parent).to_le_bytes().to_vec()));
    }
    patches.extend(links);
    // Every in-place write lands in the old image (a corrupt one could point them
    // anywhere), clear of the superblock's first bytes.
    let old_end = start_blk * bs;
    for (pos, bytes) in &patches {
        let end = pos.checked_add(bytes.len() as u64);
        if *pos < fsb::SB_OFFSET + sb.sb_size() as u64 && end.is_some_and(|e| e > fsb::SB_OFFSET)
            || end.is_none_or(|e| e > old_end)
        {
            return Err(BuildError::Invalid {
                path: image.to_path_buf(),
                what: format!("corrupt image: an inode or entry to update lies at byte {pos}"),
            });
        }
    }
    if o.fsync {
        out.file()
            .sync_data()
            .map_err(io_err(image, "sync image"))?;
    }
    let mut new_sb = sb.clone();
    if compressed && !sb.has_incompat(fsb::INCOMPAT_ZERO_PADDING) {
        // The first compressed files of the image: LZ4, default window (as `sb`).
        new_sb.feature_incompat |= fsb::INCOMPAT_ZERO_PADDING;
        new_sb.u1 = 0xFFFF;
    }
    if layouts.iter().any(Layout::inline_pcluster) {
        new_sb.feature_incompat |= fsb::INCOMPAT_ZTAILPACKING;
    }
    if layouts.iter().any(Layout::chunked) {
        // Sparse files: chunk indexes with null chunks for the holes.
        new_sb.feature_incompat |= fsb::INCOMPAT_CHUNKED_FILE;
    }
    new_sb.blocks_lo = blocks_lo;
    if sb.has_incompat(fsb::INCOMPAT_48BIT) && sb.rootnid_8b != 0 {
        // The 16-bit root field holds the block count's high bits.
        new_sb.rootnid_2b = 0;
    }
    new_sb.inos = sb.inos.saturating_add(in_region.len() as u64);
    new_sb.checksum = 0;
    let mut rest = Vec::new();
    for (pos, bytes) in patches {
        let end = pos + bytes.len() as u64;
        if end <= head.len() as u64 {
            head[pos as usize..end as usize].copy_from_slice(&bytes);
        } else {
            rest.push((pos, bytes));
        }
    }
    let sbo = fsb::SB_OFFSET as usize;
    let enc = new_sb.encode();
    head[sbo..sbo + enc.len()].copy_from_slice(&enc);
    crate::sb::put_checksum(&mut head, &new_sb);
    // What the in-place writes overwrite, put back should one of them fail (then the
    // appended bytes go too, when `out` is dropped): the image as it was.
    let mut saved = vec![(0u64, vec![0u8; head.len()])];
    saved.extend(rest.iter().map(|(p, b)| (*p, vec![0u8; b.len()])));
    for (p, b) in &mut saved {
        out.read_at(*p, b)?;
    }
    let mut wrote = 0;
    let r = (|| {
        out.write_at(0, &head)?;
        wrote = 1;
        for (pos, bytes) in &rest {
            out.write_at(*pos, bytes)?;
            wrote += 1;
        }
        out.set_len(total * bs)?;
        if o.fsync {
            out.file().sync_all().map_err(io_err(image, "sync image"))?;
        }
        Ok(())
    })();
    if let Err(e) = r {
        for (p, b) in saved.iter().take(wrote + 1) {
            let _ = out.write_at(*p, b);
        }
        return Err(e);
    }
    out.finish(false)?;
    let written: Vec<Node> = (0..tree.nodes.len())
        .filter(|&id| fixed[id].is_none() || id == root)
        .map(|id| tree.nodes[id].clone())
        .collect();
    let image_w = write::Written {
        blocks: total,
        bytes: total * bs,
        uuid: sb.uuid,
        verity: None,
    };
    let mut r = crate::report(&written, None, epoch, &stats, 0, &image_w);
    r.appended_in_place = true;
    r.appended_bytes = (total * bs).saturating_sub(old_len);
    Ok(Ok(r))
}
