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
    /// Extra devices the image refers to (tar index mode: the tar), in blocks.
    pub devices: Vec<u64>,
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

struct Scanner<'a> {
    opts: &'a BuildOptions,
    nodes: Vec<Node>,
    seen: HashMap<(u64, u64), InodeId>,
    excl: Excludes<'a>,
}

/// Scan a directory tree.
pub fn scan_dir(root: &Path, opts: &BuildOptions) -> Result<Tree> {
    let md = std::fs::symlink_metadata(root).map_err(io_err(root, "scan"))?;
    if !md.is_dir() {
        return Err(BuildError::Invalid {
            path: root.to_path_buf(),
            what: "source is not a directory".into(),
        });
    }
    let mut s = Scanner {
        opts,
        nodes: Vec::new(),
        seen: HashMap::new(),
        excl: Excludes::new(opts),
    };
    let root_id = s.new_node(root, &md, Vec::new())?;
    s.fill_dir(root_id, root, b"", 0)?;
    let mut tree = Tree {
        nodes: s.nodes,
        root: root_id,
        packed: None,
        devices: Vec::new(),
    };
    fix_nlinks(&mut tree);
    Ok(tree)
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

impl Scanner<'_> {
    fn excluded(&self, rel: &[u8]) -> bool {
        self.excl.matches(rel)
    }

    fn new_node(&mut self, path: &Path, md: &std::fs::Metadata, rel: Vec<u8>) -> Result<InodeId> {
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
        let o = self.opts;
        let uid = o.force_uid.unwrap_or(if o.all_root { 0 } else { md.uid() });
        let gid = o.force_gid.unwrap_or(if o.all_root { 0 } else { md.gid() });
        self.nodes.push(Node {
            kind,
            mode,
            uid,
            gid,
            mtime: md.mtime(),
            mtime_nsec: u32::try_from(md.mtime_nsec()).unwrap_or(0),
            nlink: 0,
            xattrs,
            rel,
        });
        Ok(self.nodes.len() - 1)
    }

    fn fill_dir(&mut self, id: InodeId, path: &Path, rel: &[u8], depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(BuildError::Invalid {
                path: path.to_path_buf(),
                what: "directory nesting too deep".into(),
            });
        }
        let rd = std::fs::read_dir(path).map_err(io_err(path, "scan: read directory"))?;
        let mut names: Vec<Vec<u8>> = Vec::new();
        for e in rd {
            let e = e.map_err(io_err(path, "scan: read directory"))?;
            names.push(e.file_name().as_bytes().to_vec());
        }
        names.sort();
        let mut entries = Vec::with_capacity(names.len());
        let mut subdirs = Vec::new();
        for name in names {
            let child = path.join(OsStr::from_bytes(&name));
            if name.len() > ferofs_format::MAX_NAME_LEN {
                return Err(BuildError::Invalid {
                    path: child,
                    what: "name longer than 255 bytes".into(),
                });
            }
            let crel = child_rel(rel, &name);
            if self.excluded(&crel) {
                continue;
            }
            let md = std::fs::symlink_metadata(&child).map_err(io_err(&child, "scan: stat"))?;
            let key = (md.dev(), md.ino());
            let cid = if !md.is_dir() && md.nlink() > 1 {
                match self.seen.get(&key) {
                    Some(&c) => c,
                    None => {
                        let c = self.new_node(&child, &md, crel.clone())?;
                        self.seen.insert(key, c);
                        c
                    }
                }
            } else {
                self.new_node(&child, &md, crel.clone())?
            };
            if md.is_dir() {
                subdirs.push((cid, child, crel));
            }
            entries.push((name, cid));
        }
        if let Kind::Dir { entries: e, .. } = &mut self.nodes[id].kind {
            *e = entries;
        }
        for (cid, child, crel) in subdirs {
            if let Kind::Dir { parent, .. } = &mut self.nodes[cid].kind {
                *parent = id;
            }
            self.fill_dir(cid, &child, &crel, depth + 1)?;
        }
        Ok(())
    }
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
