//! Stage 1, scan: an input (a directory here; tar streams in `tarball`) becomes a [`Tree`]
//! of metadata only. Inodes are numbered in the order mkfs.erofs uses — the root, then
//! for each directory in depth-first pre-order, all of its entries in name order — and
//! hardlinks (same device and inode number) share one inode.

use crate::options::*;
use crate::source::Source;
use ferofs_format::inode::*;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub type InodeId = usize;

#[derive(Debug, Clone)]
pub enum Kind {
    /// Entries sorted bytewise, without "." and "..".
    Dir {
        entries: Vec<(Vec<u8>, InodeId)>,
        parent: InodeId,
    },
    File {
        src: Source,
        size: u64,
    },
    Symlink {
        target: Vec<u8>,
    },
    Device {
        rdev: u32,
    },
    Fifo,
    Socket,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub kind: Kind,
    /// Full `st_mode` (type and permission bits).
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub nlink: u32,
    /// (full name, value), sorted by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Relative path of the first name (for error messages).
    pub rel: Vec<u8>,
}

impl Node {
    /// A regular file of the image's own (packed inode, metabox inode): owned by root,
    /// one link, the build time as mtime, in no directory; `rel` names it in errors.
    pub fn internal_file(path: PathBuf, size: u64, mode: u16, mtime: i64, rel: &[u8]) -> Node {
        Node {
            kind: Kind::File {
                src: Source::Path(path),
                size,
            },
            mode,
            uid: 0,
            gid: 0,
            mtime,
            mtime_nsec: 0,
            nlink: 1,
            xattrs: Vec::new(),
            rel: rel.to_vec(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Tree {
    pub nodes: Vec<Node>,
    pub root: InodeId,
    /// The packed inode (fragments): a regular file no directory links.
    pub packed: Option<InodeId>,
    /// Extra devices the image refers to (tar index mode: the tar; merged layers), in
    /// device-table order.
    pub devices: Vec<Device>,
}

/// An extra device of the image: its size in blocks and the tag of its device-table
/// slot (zeros: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub blocks: u64,
    pub tag: [u8; 64],
}

impl Device {
    pub fn untagged(blocks: u64) -> Device {
        Device {
            blocks,
            tag: [0; 64],
        }
    }
}

impl Tree {
    /// The inode at `path` (relative to the root; `/`-separated, leading and repeated
    /// slashes ignored), following no symlinks.
    pub fn lookup(&self, path: &[u8]) -> Option<InodeId> {
        self.walk(path, |_| {})
    }

    /// The inodes a lookup of `path` meets after the root: each directory on the way,
    /// then what the path names.
    pub fn lookup_way(&self, path: &[u8]) -> Option<Vec<InodeId>> {
        let mut way = Vec::new();
        self.walk(path, |id| way.push(id))?;
        Some(way)
    }

    /// Look `path` up, handing each inode met after the root to `met`.
    fn walk(&self, path: &[u8], mut met: impl FnMut(InodeId)) -> Option<InodeId> {
        let mut id = self.root;
        for comp in path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            let Kind::Dir { entries, .. } = &self.nodes.get(id)?.kind else {
                return None;
            };
            let i = entries
                .binary_search_by(|(name, _)| name.as_slice().cmp(comp))
                .ok()?;
            id = entries[i].1;
            met(id);
        }
        Some(id)
    }
}

/// Deepest directory nesting accepted.
const MAX_DEPTH: usize = 4096;

/// Scan a directory tree. Four passes: the directories are read (`readdir`), a level
/// at a time, on the build's threads; their entries are put in the order the inodes
/// are numbered; every entry is looked at (`lstat`, xattrs, symlink target) on the
/// build's threads; the nodes are then made in that order, hardlinks joined. The tree,
/// and the first error met in that order, are the same for any thread count.
pub fn scan_dir(root: &Path, opts: &BuildOptions) -> Result<Tree> {
    let md = std::fs::symlink_metadata(root).map_err(io_err(root, "scan"))?;
    if !md.is_dir() {
        return Err(BuildError::Invalid {
            path: root.to_path_buf(),
            what: "source is not a directory".into(),
        });
    }
    let mut nodes = vec![make_node(opts, root, &md, Vec::new())?];
    let root_id = 0;
    let threads = opts.worker_threads();
    let pool = if threads > 1 {
        let p = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| BuildError::Options(format!("thread pool: {e}")))?;
        Some(p)
    } else {
        None
    };
    let excl = Excludes::new(opts);
    let read = read_dirs(root, &excl, pool.as_ref());
    let mut l = Listing {
        excl,
        read,
        entries: Vec::new(),
        dirs: Vec::new(),
    };
    l.list(0, None, b"")?;
    let Listing { entries, dirs, .. } = l;
    let look = |e: &Entry| -> Result<Looked> {
        let md = std::fs::symlink_metadata(&e.path).map_err(io_err(&e.path, "scan: stat"))?;
        let node = make_node(opts, &e.path, &md, e.rel.clone());
        Ok((md, node))
    };
    let looked: Vec<Result<Looked>> = match &pool {
        Some(pool) if entries.len() >= 256 => {
            use rayon::prelude::*;
            pool.install(|| entries.par_iter().with_min_len(64).map(look).collect())
        }
        _ => entries.iter().map(look).collect(),
    };
    // The directories' entry ranges follow one another: take the results in order.
    let mut looked = looked.into_iter();
    let mut dir_node: Vec<InodeId> = vec![root_id; entries.len()];
    let mut seen: HashMap<(u64, u64), InodeId> = HashMap::new();
    for (owner, range) in dirs {
        let id = owner.map_or(root_id, |i| dir_node[i]);
        let mut list = Vec::with_capacity(range.len());
        for i in range {
            let e = &entries[i];
            let Some(r) = looked.next() else {
                return Err(BuildError::Invalid {
                    path: e.path.clone(),
                    what: "scan: entry without a look".into(),
                });
            };
            let (md, node) = r?;
            if md.is_dir() != e.dir {
                return Err(BuildError::Invalid {
                    path: e.path.clone(),
                    what: "changed type while the tree was scanned".into(),
                });
            }
            let key = (md.dev(), md.ino());
            let linked = !md.is_dir() && md.nlink() > 1;
            let cid = match seen.get(&key) {
                Some(&c) if linked => c,
                _ => {
                    let mut node = node?;
                    if let Kind::Dir { parent, .. } = &mut node.kind {
                        *parent = id;
                    }
                    nodes.push(node);
                    let c = nodes.len() - 1;
                    if linked {
                        seen.insert(key, c);
                    }
                    c
                }
            };
            dir_node[i] = cid;
            list.push((e.name.clone(), cid));
        }
        if let Kind::Dir { entries: d, .. } = &mut nodes[id].kind {
            *d = list;
        }
    }
    let mut tree = Tree {
        nodes,
        root: root_id,
        packed: None,
        devices: Vec::new(),
    };
    fix_nlinks(&mut tree);
    Ok(tree)
}

/// An entry's `lstat` and the node made from it (kept apart: the node of a second
/// name of a hardlinked file is not used, nor its error).
type Looked = (std::fs::Metadata, Result<Node>);

/// A directory entry met by the listing.
struct Entry {
    path: PathBuf,
    rel: Vec<u8>,
    name: Vec<u8>,
    /// A directory, as `readdir` said (checked against `lstat`).
    dir: bool,
}

/// A directory's entries: (name, a directory by `readdir`), in name order.
type Names = Vec<(Vec<u8>, bool)>;

/// A directory read by [`read_dirs`].
struct DirRead {
    path: PathBuf,
    /// Its entries, (name, a directory by `readdir`), in name order; or the error met.
    names: Option<Result<Names>>,
    /// The directories among those entries that are read too (not excluded, names
    /// that fit), in name order, by their index in the list of [`DirRead`]s.
    subdirs: Vec<usize>,
}

/// Read every directory of the tree at `root`, the directories of one depth at a
/// time on `pool`'s threads; index 0 is the root. Directories too deep get an error
/// instead of a read; excluded ones and those with names too long are not read.
fn read_dirs(root: &Path, excl: &Excludes, pool: Option<&rayon::ThreadPool>) -> Vec<DirRead> {
    let read_one = |path: &Path, depth: usize| -> Result<Names> {
        if depth > MAX_DEPTH {
            return Err(BuildError::Invalid {
                path: path.to_path_buf(),
                what: "directory nesting too deep".into(),
            });
        }
        let rd = std::fs::read_dir(path).map_err(io_err(path, "scan: read directory"))?;
        let mut names: Names = Vec::new();
        for e in rd {
            let e = e.map_err(io_err(path, "scan: read directory"))?;
            // d_type (std falls back to lstat where the filesystem gives none).
            let dir = e
                .file_type()
                .map_err(io_err(&e.path(), "scan: stat"))?
                .is_dir();
            names.push((e.file_name().as_bytes().to_vec(), dir));
        }
        names.sort();
        Ok(names)
    };
    let mut all = vec![DirRead {
        path: root.to_path_buf(),
        names: None,
        subdirs: Vec::new(),
    }];
    let mut rels: Vec<Vec<u8>> = vec![Vec::new()];
    let mut level = vec![0usize];
    // Bounded by the depth: each round reads one level, and a level past MAX_DEPTH is
    // not read (nor gets children).
    for depth in 0.. {
        if level.is_empty() {
            break;
        }
        let got: Vec<Result<Names>> = match pool {
            Some(p) if level.len() > 1 => {
                use rayon::prelude::*;
                p.install(|| {
                    level
                        .par_iter()
                        .map(|&d| read_one(&all[d].path, depth))
                        .collect()
                })
            }
            _ => level
                .iter()
                .map(|&d| read_one(&all[d].path, depth))
                .collect(),
        };
        let mut next = Vec::new();
        for (&d, r) in level.iter().zip(got) {
            if let Ok(names) = &r {
                for (name, dir) in names {
                    if !*dir || name.len() > ferofs_format::MAX_NAME_LEN {
                        continue;
                    }
                    let crel = child_rel(&rels[d], name);
                    if excl.matches(&crel) {
                        continue;
                    }
                    let k = all.len();
                    all.push(DirRead {
                        path: all[d].path.join(OsStr::from_bytes(name)),
                        names: None,
                        subdirs: Vec::new(),
                    });
                    rels.push(crel);
                    all[d].subdirs.push(k);
                    next.push(k);
                }
            }
            all[d].names = Some(r);
        }
        level = next;
    }
    all
}

/// The second pass of [`scan_dir`]: every directory's entries (not excluded), in name
/// order, the directories in depth-first pre-order — the order of the inode numbers.
struct Listing<'a> {
    excl: Excludes<'a>,
    read: Vec<DirRead>,
    entries: Vec<Entry>,
    /// Per directory: its own entry (None for the root) and the range of its entries.
    dirs: Vec<(Option<usize>, std::ops::Range<usize>)>,
}

impl Listing<'_> {
    /// List directory `d` of [`read_dirs`] (its entry `owner`, at `rel`), then its
    /// subdirectories; the first error in that order is returned.
    fn list(&mut self, d: usize, owner: Option<usize>, rel: &[u8]) -> Result<()> {
        let Some(dr) = self.read.get_mut(d) else {
            return Err(BuildError::Invalid {
                path: PathBuf::new(),
                what: format!("scan: directory {d} was not read"),
            });
        };
        let path = dr.path.clone();
        let subdirs = std::mem::take(&mut dr.subdirs);
        let names = match dr.names.take() {
            Some(r) => r?,
            None => {
                return Err(BuildError::Invalid {
                    path,
                    what: "scan: directory read twice".into(),
                })
            }
        };
        let start = self.entries.len();
        let mut sub = Vec::new();
        let mut next_sub = subdirs.into_iter();
        for (name, dir) in names {
            let child = path.join(OsStr::from_bytes(&name));
            if name.len() > ferofs_format::MAX_NAME_LEN {
                return Err(BuildError::Invalid {
                    path: child,
                    what: "name longer than 255 bytes".into(),
                });
            }
            let crel = child_rel(rel, &name);
            if self.excl.matches(&crel) {
                continue;
            }
            if dir {
                // The same filters as read_dirs': its next subdirectory is this one.
                let Some(k) = next_sub.next() else {
                    return Err(BuildError::Invalid {
                        path: child,
                        what: "scan: directory not read".into(),
                    });
                };
                sub.push((self.entries.len(), k));
            }
            self.entries.push(Entry {
                path: child,
                rel: crel,
                name,
                dir,
            });
        }
        let end = self.entries.len();
        self.dirs.push((owner, start..end));
        for (i, k) in sub {
            let r = self.entries[i].rel.clone();
            self.list(k, Some(i), &r)?;
        }
        Ok(())
    }
}

/// `--exclude-path` and `--exclude-regex`, for any input: paths relative to the
/// source root, without leading or trailing `/`.
pub struct Excludes<'a> {
    paths: Vec<Vec<u8>>,
    regex: &'a [regex::Regex],
}

impl<'a> Excludes<'a> {
    pub fn new(opts: &'a BuildOptions) -> Self {
        Excludes {
            paths: opts
                .exclude_paths
                .iter()
                .map(|p| {
                    let b = p.as_os_str().as_bytes();
                    let b = b.strip_prefix(b"/").unwrap_or(b);
                    b.strip_suffix(b"/").unwrap_or(b).to_vec()
                })
                .collect(),
            regex: &opts.exclude_regex,
        }
    }

    /// Whether the path `rel` is left out.
    pub fn matches(&self, rel: &[u8]) -> bool {
        if self.paths.iter().any(|e| e.as_slice() == rel) {
            return true;
        }
        if self.regex.is_empty() {
            return false;
        }
        let s = String::from_utf8_lossy(rel);
        self.regex.iter().any(|r| r.is_match(&s))
    }
}

/// The node of the entry at `path` with `lstat` result `md` (reads its xattrs and symlink
/// target).
fn make_node(
    opts: &BuildOptions,
    path: &Path,
    md: &std::fs::Metadata,
    rel: Vec<u8>,
) -> Result<Node> {
    let mode = u16::try_from(md.mode()).map_err(|_| BuildError::Invalid {
        path: path.to_path_buf(),
        what: format!("mode {:o} does not fit 16 bits", md.mode()),
    })?;
    let kind = match mode & S_IFMT {
        S_IFDIR => Kind::Dir {
            entries: Vec::new(),
            parent: 0,
        },
        S_IFREG => Kind::File {
            src: Source::Scanned {
                path: path.to_path_buf(),
                stamp: crate::source::stamp(md),
            },
            size: md.size(),
        },
        S_IFLNK => {
            let t = std::fs::read_link(path).map_err(io_err(path, "scan: readlink"))?;
            let target = t.as_os_str().as_bytes().to_vec();
            if target.is_empty() || target.len() > 4095 {
                return Err(BuildError::Invalid {
                    path: path.to_path_buf(),
                    what: format!(
                        "symlink target of {} bytes (1..=4095 allowed)",
                        target.len()
                    ),
                });
            }
            Kind::Symlink { target }
        }
        S_IFCHR | S_IFBLK => {
            let d = md.rdev();
            let major = ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff);
            let minor = (d & 0xff) | ((d >> 12) & !0xff);
            if major > 0xfff || minor > 0xfffff {
                return Err(BuildError::Invalid {
                    path: path.to_path_buf(),
                    what: format!("device number {major}:{minor} does not fit"),
                });
            }
            Kind::Device {
                rdev: encode_rdev(major as u32, minor as u32),
            }
        }
        S_IFIFO => Kind::Fifo,
        S_IFSOCK => Kind::Socket,
        _ => {
            return Err(BuildError::Invalid {
                path: path.to_path_buf(),
                what: format!("unknown file type {mode:o}"),
            })
        }
    };
    let xattrs = read_xattrs(path)?;
    let uid = opts
        .force_uid
        .unwrap_or(if opts.all_root { 0 } else { md.uid() });
    let gid = opts
        .force_gid
        .unwrap_or(if opts.all_root { 0 } else { md.gid() });
    Ok(Node {
        kind,
        mode,
        uid,
        gid,
        mtime: md.mtime(),
        mtime_nsec: u32::try_from(md.mtime_nsec()).unwrap_or(0),
        nlink: 0,
        xattrs,
        rel,
    })
}

/// All xattrs of a path (not following symlinks), sorted by name.
fn read_xattrs(path: &Path) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let names = match xattr::list(path) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(95) => return Ok(Vec::new()), // EOPNOTSUPP
        Err(e) => return Err(io_err(path, "scan: list xattrs")(e)),
    };
    let mut v = Vec::new();
    for n in names {
        let val = xattr::get(path, &n)
            .map_err(io_err(path, "scan: read xattr"))?
            .unwrap_or_default();
        let name = n.as_bytes().to_vec();
        if ferofs_format::xattr::split_name(&name).is_none() {
            return Err(BuildError::Invalid {
                path: path.to_path_buf(),
                what: format!(
                    "xattr {} has a namespace EROFS cannot store",
                    String::from_utf8_lossy(&name)
                ),
            });
        }
        if val.len() > usize::from(u16::MAX) {
            return Err(BuildError::Invalid {
                path: path.to_path_buf(),
                what: "xattr value larger than 65535 bytes".into(),
            });
        }
        v.push((name, val));
    }
    v.sort();
    Ok(v)
}

/// `--hard-dereference`: every name of a hardlinked file gets an inode of its own (a
/// copy of the node, with that name as its source-relative path); the first name met
/// in a walk from the root, directories in entry order, keeps the original.
pub fn dereference_hardlinks(tree: &mut Tree) {
    let mut seen = vec![false; tree.nodes.len()];
    let mut stack = vec![(tree.root, Vec::new())];
    // Bounded: each directory is pushed once (directories have one parent).
    while let Some((d, rel)) = stack.pop() {
        let Kind::Dir { entries, .. } = &tree.nodes[d].kind else {
            continue;
        };
        let entries = entries.clone();
        let mut later = Vec::new();
        for (i, (name, c)) in entries.iter().enumerate() {
            let crel = child_rel(&rel, name);
            if matches!(tree.nodes[*c].kind, Kind::Dir { .. }) {
                later.push((*c, crel));
            } else if std::mem::replace(&mut seen[*c], true) {
                // A second or later name: a copy (the first name keeps the node).
                let mut n = tree.nodes[*c].clone();
                n.rel = crel;
                tree.nodes.push(n);
                let new = tree.nodes.len() - 1;
                if let Kind::Dir { entries, .. } = &mut tree.nodes[d].kind {
                    entries[i].1 = new;
                }
            }
        }
        // Subdirectories in entry order (the stack pops the last pushed first).
        stack.extend(later.into_iter().rev());
    }
    fix_nlinks(tree);
}

/// nlink = number of names for non-directories, 2 + subdirectories for directories.
pub fn fix_nlinks(tree: &mut Tree) {
    let mut counts = vec![0u32; tree.nodes.len()];
    let mut subdirs = vec![0u32; tree.nodes.len()];
    for (id, n) in tree.nodes.iter().enumerate() {
        if let Kind::Dir { entries, .. } = &n.kind {
            for (_, c) in entries {
                counts[*c] = counts[*c].saturating_add(1);
                if matches!(tree.nodes[*c].kind, Kind::Dir { .. }) {
                    subdirs[id] = subdirs[id].saturating_add(1);
                }
            }
        }
    }
    for (id, n) in tree.nodes.iter_mut().enumerate() {
        n.nlink = if matches!(n.kind, Kind::Dir { .. }) {
            subdirs[id].saturating_add(2)
        } else {
            counts[id].max(1)
        };
    }
}

/// The source-relative path of `name` in the directory at `rel` (`""` is the root).
pub(crate) fn child_rel(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut crel = Vec::with_capacity(rel.len() + 1 + name.len());
    crel.extend_from_slice(rel);
    if !crel.is_empty() {
        crel.push(b'/');
    }
    crel.extend_from_slice(name);
    crel
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A tree of `n` directories of files, symlinks and hardlinks (some across
    /// directories), an empty directory and an excluded one.
    fn make(root: &Path, n: usize) {
        for d in 0..n {
            let dir = root.join(format!("d{d:02}"));
            std::fs::create_dir_all(dir.join("sub/empty")).expect("mkdir");
            for f in 0..12 {
                std::fs::write(dir.join(format!("f{f}")), vec![b'a'; f * 100]).expect("write");
            }
            symlink(format!("f{}", d % 12), dir.join("link")).expect("symlink");
            std::fs::hard_link(dir.join("f3"), dir.join("sub/f3.again")).expect("link");
            if d > 0 {
                std::fs::hard_link(root.join("d00/f5"), dir.join(format!("f5.of0.{d}")))
                    .expect("link");
            }
            std::fs::create_dir_all(dir.join("skipped/deeper")).expect("mkdir");
        }
    }

    #[test]
    fn the_tree_does_not_depend_on_the_thread_count() {
        let t = tempfile::tempdir().expect("tempdir");
        make(t.path(), 20);
        let mut o = BuildOptions {
            exclude_regex: vec![regex::Regex::new("/skipped$").expect("regex")],
            ..Default::default()
        };
        o.threads = 1;
        let one = scan_dir(t.path(), &o).expect("scan");
        // 1 root + per directory 12 files, link, sub, sub/empty, sub/f3.again (a
        // second name: no node) and 19 second names of d00/f5 (none a node).
        assert_eq!(one.nodes.len(), 1 + 20 + 20 * 15);
        let d00 = one.lookup(b"d00").expect("d00");
        let f5 = one.lookup(b"d00/f5").expect("f5");
        assert_eq!(one.lookup(b"d07/f5.of0.7"), Some(f5));
        assert_eq!(one.lookup(b"d07/sub/f3.again"), one.lookup(b"d07/f3"));
        assert_eq!(one.lookup(b"d07/skipped"), None);
        assert_eq!(one.nodes[f5].nlink, 20);
        // Numbered as mkfs.erofs does: the root's entries, then d00's, ...
        assert_eq!(d00, 1);
        assert_eq!(one.lookup(b"d01"), Some(2));
        assert_eq!(one.lookup(b"d00/f0"), Some(21));
        assert!(
            matches!(one.nodes[one.lookup(b"d03/sub").expect("sub")].kind,
            Kind::Dir { parent, .. } if parent == one.lookup(b"d03").expect("d03"))
        );
        for threads in [2, 3, 8] {
            o.threads = threads;
            let many = scan_dir(t.path(), &o).expect("scan");
            assert_eq!(format!("{one:?}"), format!("{many:?}"), "{threads} threads");
        }
    }

    #[test]
    fn hard_dereference_gives_every_name_its_own_node() {
        let t = tempfile::tempdir().expect("tempdir");
        make(t.path(), 3);
        let mut tree = scan_dir(t.path(), &BuildOptions::default()).expect("scan");
        let before = tree.nodes.len();
        dereference_hardlinks(&mut tree);
        // Copies for d00/sub/f3.again, d01/sub/f3.again, d02/sub/f3.again,
        // d01/f5.of0.1 and d02/f5.of0.2.
        assert_eq!(tree.nodes.len(), before + 5);
        let f5 = tree.lookup(b"d00/f5").expect("f5");
        let copy = tree.lookup(b"d02/f5.of0.2").expect("copy");
        assert_ne!(f5, copy);
        assert!(copy >= before);
        assert_eq!(tree.nodes[copy].rel, b"d02/f5.of0.2");
        assert_eq!(tree.nodes[copy].mode, tree.nodes[f5].mode);
        assert!(matches!(
            tree.nodes[copy].kind,
            Kind::File { size: 500, .. }
        ));
        for p in [
            &b"d00/f5"[..],
            b"d02/f5.of0.2",
            b"d01/f3",
            b"d01/sub/f3.again",
        ] {
            let id = tree.lookup(p).expect("lookup");
            assert_eq!(tree.nodes[id].nlink, 1, "{}", String::from_utf8_lossy(p));
        }
        // Directories keep their counts.
        let d00 = tree.lookup(b"d00").expect("d00");
        assert_eq!(tree.nodes[d00].nlink, 4);
    }
}
