//! Stage 1 for a stack of EROFS images (layers, the lowest first): their trees merged
//! as overlayfs stacks them, into one [`Tree`].
//!
//! For each directory of the merged tree, the layers that have a directory at that
//! path contribute their entries, the upper one winning a name. A directory merges with
//! the directories under it down to the first layer that has something else at that
//! path (a file, a whiteout, a symlink: it hides what is under it too) or to an opaque
//! directory (`trusted.overlay.opaque=y`), included. Whiteouts (character devices 0:0)
//! and opaque markers stay in the merged tree, so the result stacks on further layers
//! the same way; `--ovlfs-strip` drops them. A directory's own metadata and xattrs are
//! the uppermost layer's; hardlinks are kept within a layer. Inodes are numbered as a
//! directory scan numbers them.
//!
//! Data: every regular file keeps its [`Source::Erofs`] (copied into the new image by
//! the data stages), or, by reference, a file whose bytes lie in one piece on block
//! boundaries of its layer becomes a [`Source::External`] on the extra device that is
//! its layer: the new image then holds the metadata, and the layers, in the order
//! given, are its devices. A file whose last, partial block is an inline tail has
//! its full blocks referred to and the tail copied into a block of the image (one more
//! chunk, on the image itself). Files stored otherwise (smaller than a block,
//! compressed, with holes, on a layer's own extra device) are copied.

use crate::erofsin::{self, ErofsImage};
use crate::options::*;
use crate::scan::{fix_nlinks, InodeId, Kind, Node, Tree};
use crate::source::Source;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most layers one merge takes (each is an extra device of a reference image; the
/// kernel's device table holds at most 65,535).
pub const MAX_LAYERS: usize = 4096;

use crate::tarball::{is_whiteout, OVL_OPAQUE, OVL_ORIGIN};

/// The merged tree of a stack of images and what its data stages need to know.
pub struct Merged {
    pub tree: Tree,
    /// Regular files that had to be copied by reference (not in one aligned piece),
    /// and their bytes.
    pub copied: (u64, u64),
    /// Files referred to but for their inline tails, which are copied, and the tails'
    /// bytes.
    pub tails: (u64, u64),
}

/// Merge the EROFS images `layers` (the lowest first). With `by_reference`, files in
/// one aligned piece of their layer point into it (the layers become the image's
/// extra devices, `block_size` the new image's block size).
pub fn merge_images(layers: &[PathBuf], opts: &BuildOptions, by_reference: bool) -> Result<Merged> {
    if layers.is_empty() {
        return Err(BuildError::Options("no source image to merge".into()));
    }
    if layers.len() > MAX_LAYERS {
        return Err(BuildError::Options(format!(
            "{} source images: at most {MAX_LAYERS} can be merged",
            layers.len()
        )));
    }
    let mut images = Vec::with_capacity(layers.len());
    let mut trees = Vec::with_capacity(layers.len());
    for p in layers {
        let (img, tree) = erofsin::scan_image_with(p, opts)?;
        images.push(img);
        trees.push(tree);
    }
    let mut tree = merge_trees(&trees, &[]);
    drop(trees);
    let mut copied = (0u64, 0u64);
    let mut tails = (0u64, 0u64);
    if by_reference {
        let bs = u64::from(opts.block_size);
        let mut devices = Vec::with_capacity(images.len());
        let mut lens = Vec::with_capacity(images.len());
        for (img, path) in images.iter().zip(layers) {
            let info = img.img.info();
            let bytes = info
                .blocks
                .checked_mul(u64::from(info.block_size))
                .ok_or_else(|| invalid(path, "source image: block count overflows"))?;
            devices.push(crate::scan::Device {
                blocks: bytes.div_ceil(bs),
                tag: uuid_tag(&info.uuid),
            });
            lens.push(bytes);
        }
        tree.devices = devices;
        for n in &mut tree.nodes {
            let Kind::File { src, size } = &mut n.kind else {
                continue;
            };
            let Source::Erofs(f) = src else { continue };
            if *size == 0 {
                continue;
            }
            let Some(k) = images.iter().position(|i| Arc::ptr_eq(i, &f.image)) else {
                continue;
            };
            match in_one_piece(&f.image, &f.ino, bs, lens[k]) {
                Some((blkaddr, inline_tail)) => {
                    let tail = inline_tail.then(|| f.clone());
                    if inline_tail {
                        tails.0 += 1;
                        tails.1 += *size % bs;
                    }
                    *src = Source::External {
                        device: u16::try_from(k + 1)
                            .map_err(|_| BuildError::Options("too many source images".into()))?,
                        blkaddr,
                        tail,
                    }
                }
                None => {
                    copied.0 += 1;
                    copied.1 += *size;
                }
            }
        }
    }
    mark_whiteout_dirs(&mut tree, opts.ovlfs_strip);
    if opts.ovlfs_strip {
        crate::tarball::strip_overlay(&mut tree);
        fix_nlinks(&mut tree);
    }
    Ok(Merged {
        tree,
        copied,
        tails,
    })
}

/// The block (of `bs` bytes) where the file's bytes start when they lie in one piece
/// on a block boundary of its image's own bytes (not on an extra device of its), and
/// whether only its full blocks are to be referred to, its last, partial block copied:
/// when that block is an inline tail, or when a whole block there would reach past
/// the image's `len` bytes (a layer with smaller blocks ends inside one; Linux reads
/// whole blocks and fails past the device's end).
fn in_one_piece(
    image: &ErofsImage,
    ino: &ferofs_reader::Inode,
    bs: u64,
    len: u64,
) -> Option<(u64, bool)> {
    if ino.layout.is_compressed() || !image.img.device_slots().is_empty() {
        return None;
    }
    let ext = image.img.extents(ino).ok()?;
    let (e, inline_tail) = match ext.as_slice() {
        [e] => (e, false),
        // Full blocks, then the tail behind the inode (FLAT_INLINE).
        [e, t] if t.kind == "inline" && e.length % bs == 0 && t.length < bs => (e, true),
        _ => return None,
    };
    let p = e.physical?;
    let covered = if inline_tail {
        e.length + ext[1].length
    } else {
        e.length
    };
    if !(e.kind == "plain" && e.logical == 0 && e.length > 0 && covered == ino.size && p % bs == 0)
    {
        return None;
    }
    let whole = p.checked_add(ino.size.div_ceil(bs).checked_mul(bs)?)? <= len;
    match (inline_tail, whole) {
        (true, _) | (false, true) => Some((p / bs, inline_tail)),
        // The last block copied: the full blocks before it stay.
        (false, false) if ino.size >= bs && !ino.size.is_multiple_of(bs) => Some((p / bs, true)),
        (false, false) => None,
    }
}

/// A layer's device-table tag: its UUID as 32 lowercase hex digits (what mkfs.erofs
/// writes for the layers of its rebuild mode); readers check a device given for the
/// slot against it.
pub fn uuid_tag(uuid: &[u8; 16]) -> [u8; 64] {
    let mut t = [0u8; 64];
    for (i, b) in uuid.iter().enumerate() {
        t[2 * i..2 * i + 2].copy_from_slice(format!("{b:02x}").as_bytes());
    }
    t
}

fn invalid(path: &Path, what: &str) -> BuildError {
    BuildError::Invalid {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// A directory holding whiteouts gets an empty `trusted.overlay.origin`, so that
/// overlayfs never lists it directly (and shows the whiteouts): kernel commit
/// b79e05aaa166, what mkfs.erofs and ferofs's tar input do. With `strip` (the
/// whiteouts go), every such marker goes.
pub(crate) fn mark_whiteout_dirs(tree: &mut Tree, strip: bool) {
    let wh: Vec<bool> = tree.nodes.iter().map(is_whiteout).collect();
    for n in &mut tree.nodes {
        let Kind::Dir { entries, .. } = &n.kind else {
            continue;
        };
        let has = entries
            .iter()
            .any(|(_, c)| wh.get(*c).copied().unwrap_or(false));
        let at = n
            .xattrs
            .binary_search_by(|(k, _)| k.as_slice().cmp(OVL_ORIGIN));
        match (strip, has, at) {
            (true, _, Ok(i)) => {
                n.xattrs.remove(i);
            }
            (false, true, Err(i)) => n.xattrs.insert(i, (OVL_ORIGIN.to_vec(), Vec::new())),
            _ => {}
        }
    }
}

pub(crate) fn opaque(n: &Node) -> bool {
    n.xattrs
        .iter()
        .any(|(k, v)| k.as_slice() == OVL_OPAQUE && v.as_slice() == b"y")
}

/// Merge `trees` (the lowest first) into one, numbered as a scan numbers it.
/// `implicit[layer][node]`: a directory whose metadata the layer made up (a tar's
/// implied parent): a merged directory takes the uppermost metadata that is not.
pub fn merge_trees(trees: &[Tree], implicit: &[Vec<bool>]) -> Tree {
    if trees.is_empty() {
        return Tree {
            nodes: Vec::new(),
            root: 0,
            packed: None,
            devices: Vec::new(),
        };
    }
    let node = |l: usize, id: InodeId| &trees[l].nodes[id];
    let made_up = |l: usize, id: InodeId| {
        implicit
            .get(l)
            .and_then(|v| v.get(id))
            .copied()
            .unwrap_or(false)
    };
    // Whose metadata a merged directory shows: the uppermost not made up.
    let meta = |s: &[(usize, InodeId)]| -> Node {
        let &(l, id) = s.iter().find(|&&(l, id)| !made_up(l, id)).unwrap_or(&s[0]);
        let mut n = node(l, id).clone();
        n.kind = Kind::Dir {
            entries: Vec::new(),
            parent: 0,
        };
        n
    };
    // The layers' directories behind a merged directory, the uppermost first.
    type Stack = Vec<(usize, InodeId)>;
    let below = |l: usize, id: InodeId, from: &[(usize, InodeId)], name: &[u8]| -> Stack {
        let mut s = vec![(l, id)];
        if opaque(node(l, id)) {
            return s;
        }
        for &(ll, dir) in from {
            if ll >= l {
                continue;
            }
            let Kind::Dir { entries, .. } = &node(ll, dir).kind else {
                continue;
            };
            let Ok(i) = entries.binary_search_by(|(n, _)| n.as_slice().cmp(name)) else {
                continue;
            };
            let c = entries[i].1;
            if !matches!(node(ll, c).kind, Kind::Dir { .. }) {
                break;
            }
            s.push((ll, c));
            if opaque(node(ll, c)) {
                break;
            }
        }
        s
    };
    let mut nodes: Vec<Node> = Vec::new();
    let mut links: HashMap<(usize, InodeId), InodeId> = HashMap::new();
    // The root merges with every layer's root down to an opaque one.
    let mut root_stack: Stack = Vec::new();
    for l in (0..trees.len()).rev() {
        root_stack.push((l, trees[l].root));
        if opaque(node(l, trees[l].root)) {
            break;
        }
    }
    nodes.push(meta(&root_stack));
    let mut work: Vec<(Stack, InodeId)> = vec![(root_stack, 0)];
    // Bounded: every layer directory is in one merged directory's stack (directories
    // have one name), and each stack is taken once.
    while let Some((stack, mid)) = work.pop() {
        // The names, each with the uppermost layer's entry.
        let mut names: Vec<(&[u8], usize, InodeId)> = Vec::new();
        for &(l, dir) in &stack {
            if let Kind::Dir { entries, .. } = &node(l, dir).kind {
                for (n, c) in entries {
                    names.push((n.as_slice(), l, *c));
                }
            }
        }
        // Uppermost first within a name, then keep the first of each.
        names.sort_by(|a, b| a.0.cmp(b.0).then(b.1.cmp(&a.1)));
        names.dedup_by(|a, b| a.0 == b.0);
        let mut entries = Vec::with_capacity(names.len());
        let mut subdirs = Vec::new();
        for (name, l, c) in names {
            let n = node(l, c);
            let cid = if matches!(n.kind, Kind::Dir { .. }) {
                let s = below(l, c, &stack, name);
                let mut d = meta(&s);
                d.kind = Kind::Dir {
                    entries: Vec::new(),
                    parent: mid,
                };
                nodes.push(d);
                subdirs.push((s, nodes.len() - 1));
                nodes.len() - 1
            } else {
                match links.get(&(l, c)) {
                    Some(&m) => m,
                    None => {
                        nodes.push(n.clone());
                        links.insert((l, c), nodes.len() - 1);
                        nodes.len() - 1
                    }
                }
            };
            entries.push((name.to_vec(), cid));
        }
        if let Kind::Dir { entries: e, .. } = &mut nodes[mid].kind {
            *e = entries;
        }
        work.extend(subdirs.into_iter().rev());
    }
    let mut tree = Tree {
        nodes,
        root: 0,
        packed: None,
        devices: Vec::new(),
    };
    fix_nlinks(&mut tree);
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(entries: Vec<(&str, InodeId)>, xattrs: Vec<(&[u8], &[u8])>) -> Node {
        Node {
            kind: Kind::Dir {
                entries: entries
                    .into_iter()
                    .map(|(n, c)| (n.as_bytes().to_vec(), c))
                    .collect(),
                parent: 0,
            },
            mode: 0o040755,
            uid: 0,
            gid: 0,
            mtime: 0,
            mtime_nsec: 0,
            nlink: 2,
            xattrs: xattrs
                .into_iter()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect(),
            rel: Vec::new(),
        }
    }

    fn leaf(kind: Kind, uid: u32) -> Node {
        let mode = match kind {
            Kind::Device { .. } => 0o020000,
            Kind::Symlink { .. } => 0o120777,
            _ => 0o100644,
        };
        Node {
            kind,
            mode,
            uid,
            gid: 0,
            mtime: 0,
            mtime_nsec: 0,
            nlink: 1,
            xattrs: Vec::new(),
            rel: Vec::new(),
        }
    }

    fn file(uid: u32) -> Node {
        leaf(
            Kind::File {
                src: Source::Path(PathBuf::from("/dev/null")),
                size: 0,
            },
            uid,
        )
    }

    fn tree(nodes: Vec<Node>) -> Tree {
        Tree {
            nodes,
            root: 0,
            packed: None,
            devices: Vec::new(),
        }
    }

    /// Paths of `t` with the uid of what they name, in scan order.
    fn listing(t: &Tree) -> Vec<(String, u32)> {
        let mut v = Vec::new();
        let mut stack = vec![(t.root, String::new())];
        while let Some((id, p)) = stack.pop() {
            if let Kind::Dir { entries, .. } = &t.nodes[id].kind {
                for (n, c) in entries.iter().rev() {
                    stack.push((*c, format!("{p}/{}", String::from_utf8_lossy(n))));
                }
            }
            v.push((p, t.nodes[id].uid));
        }
        v
    }

    #[test]
    fn upper_layers_win_and_whiteouts_and_opaque_dirs_hide() {
        // lower: /a/{x,y}, /b/z, /c/w, /d (file), /e/{f}
        let lower = tree(vec![
            dir(
                vec![("a", 1), ("b", 4), ("c", 6), ("d", 8), ("e", 9)],
                vec![],
            ),
            dir(vec![("x", 2), ("y", 3)], vec![]),
            file(1),
            file(1),
            dir(vec![("z", 5)], vec![]),
            file(1),
            dir(vec![("w", 7)], vec![]),
            file(1),
            file(1),
            dir(vec![("f", 10)], vec![]),
            file(1),
        ]);
        // upper: /a/x (new), /b whiteout, /c opaque with v, /d dir with q, /e/f symlink
        let upper = tree(vec![
            dir(
                vec![("a", 1), ("b", 3), ("c", 4), ("d", 6), ("e", 8)],
                vec![],
            ),
            dir(vec![("x", 2)], vec![]),
            file(2),
            leaf(Kind::Device { rdev: 0 }, 2),
            dir(vec![("v", 5)], vec![(OVL_OPAQUE, b"y")]),
            file(2),
            dir(vec![("q", 7)], vec![]),
            file(2),
            dir(vec![("f", 9)], vec![]),
            leaf(
                Kind::Symlink {
                    target: b"t".to_vec(),
                },
                2,
            ),
        ]);
        let m = merge_trees(&[lower, upper], &[]);
        let got = listing(&m);
        let want: Vec<(String, u32)> = [
            ("", 0),
            ("/a", 0),
            ("/a/x", 2),
            ("/a/y", 1),
            ("/b", 2),
            ("/c", 0),
            ("/c/v", 2),
            ("/d", 0),
            ("/d/q", 2),
            ("/e", 0),
            ("/e/f", 2),
        ]
        .iter()
        .map(|(p, u)| (p.to_string(), *u))
        .collect();
        assert_eq!(got, want);
        // Numbered as a scan: the root, then each directory's entries, depth first.
        let Kind::Dir { entries, .. } = &m.nodes[0].kind else {
            panic!("root")
        };
        let ids: Vec<InodeId> = entries.iter().map(|e| e.1).collect();
        assert_eq!(ids, vec![1, 2, 3, 4, 5]);
        assert_eq!(m.nodes[1].nlink, 2);
        assert_eq!(m.nodes[0].nlink, 6);
    }

    #[test]
    fn a_file_between_layers_hides_the_directories_under_it() {
        let bottom = tree(vec![
            dir(vec![("a", 1)], vec![]),
            dir(vec![("deep", 2)], vec![]),
            file(1),
        ]);
        let middle = tree(vec![dir(vec![("a", 1)], vec![]), file(2)]);
        let top = tree(vec![
            dir(vec![("a", 1)], vec![]),
            dir(vec![("new", 2)], vec![]),
            file(3),
        ]);
        let m = merge_trees(&[bottom, middle, top], &[]);
        let got: Vec<String> = listing(&m).into_iter().map(|x| x.0).collect();
        assert_eq!(got, vec!["", "/a", "/a/new"]);
    }

    #[test]
    fn made_up_directories_keep_the_lower_metadata() {
        let mut lower = tree(vec![dir(vec![("etc", 1)], vec![]), dir(vec![], vec![])]);
        lower.nodes[0].uid = 7;
        lower.nodes[1].uid = 8;
        let upper = tree(vec![
            dir(vec![("etc", 1), ("new", 3)], vec![]),
            dir(vec![("f", 2)], vec![]),
            file(2),
            dir(vec![], vec![]),
        ]);
        // The upper root and etc/ are made up (a tar's implied parents); new/ too, with
        // nothing under it to take metadata from.
        let implicit = vec![Vec::new(), vec![true, true, false, true]];
        let m = merge_trees(&[lower, upper], &implicit);
        let got = listing(&m);
        assert_eq!(
            got,
            [("", 7), ("/etc", 8), ("/etc/f", 2), ("/new", 0)]
                .iter()
                .map(|(p, u)| (p.to_string(), *u))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn hardlinks_stay_within_their_layer() {
        let lower = tree(vec![dir(vec![("h1", 1), ("h2", 1)], vec![]), file(1)]);
        let upper = tree(vec![dir(vec![("h1", 1)], vec![]), file(2)]);
        let m = merge_trees(&[lower, upper], &[]);
        let got = listing(&m);
        assert_eq!(got[1], ("/h1".to_string(), 2));
        assert_eq!(got[2], ("/h2".to_string(), 1));
        assert_eq!(m.nodes[2].nlink, 1);
        let lower = tree(vec![dir(vec![("h1", 1), ("h2", 1)], vec![]), file(1)]);
        let upper = tree(vec![dir(vec![], vec![])]);
        let m = merge_trees(&[lower, upper], &[]);
        assert_eq!(m.nodes.len(), 2);
        assert_eq!(m.nodes[1].nlink, 2);
    }
}
