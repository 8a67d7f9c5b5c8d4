//! Stage 1 for an EROFS image as input (re-encoding): the image's tree, read through
//! `ferofs-reader`, becomes a [`Tree`].
//!
//! Metadata (mode, owner, mtime with nanoseconds, xattrs, symlink targets, device
//! numbers) comes from each inode; hardlinks are inodes reached by more than one name
//! (same nid). A regular file's bytes are a [`Source::Erofs`]: the shared image handle
//! and the inode, read on demand (a worker decodes only the extents its job covers,
//! keeping a per-thread read context), so nothing is extracted or spooled and memory
//! holds metadata only. Holes of the old image (null chunks, unmapped blocks, holes of
//! compressed files) are the file's data segments' gaps, taken from the reader's
//! mapping, so the data stages keep them holes. Whatever the old image stores beside
//! the tree (the packed inode of fragments, the metabox inode, its superblock options)
//! is not carried over: the build options decide the new image's layout.
//!
//! Bad input is an error naming the image and the nid (or path) at fault: a directory
//! reached twice (a loop or a second name for a directory), nesting deeper than
//! [`MAX_DEPTH`], a name or symlink target out of bounds, and anything the reader finds
//! corrupt.

use crate::options::*;
use crate::scan::{fix_nlinks, InodeId, Kind, Node, Tree};
use crate::source::Source;
use ferofs_format::inode::*;
use ferofs_reader::{Image, Inode, ReadCtx};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Deepest directory nesting accepted.
const MAX_DEPTH: usize = 4096;
/// Most data segments one file may have (each is at least a block of the old image,
/// so only a hostile image gets near it).
const MAX_SEGMENTS: usize = 1 << 24;

/// Whether the file at `path` starts like an EROFS image (the superblock magic at
/// byte 1024). A read error or a short file is `false`.
pub fn is_erofs_image(path: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let mut m = [0u8; 4];
    f.read_exact_at(&mut m, ferofs_format::sb::SB_OFFSET)
        .is_ok()
        && u32::from_le_bytes(m) == ferofs_format::sb::MAGIC
}

/// An open source image, shared by every file read from it.
pub struct ErofsImage {
    pub path: Arc<Path>,
    /// The image, joined with its extra devices when `--device` names them.
    pub img: Image<Arc<dyn ferofs_reader::Source>>,
}

impl ErofsImage {
    /// Raw bytes of the image at `offset` (an error naming the image past its end).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.img
            .source()
            .read_exact_at(buf, offset)
            .map_err(io_err(&self.path, "read image"))
    }
}

impl std::fmt::Debug for ErofsImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ErofsImage({})", self.path.display())
    }
}

/// A file's data segments when it has holes (None: no hole), or why its mapping
/// cannot be read.
type Mapped = Result<Option<Vec<(u64, u64)>>, String>;

/// One regular file of a source image.
#[derive(Debug)]
pub struct ErofsFile {
    pub image: Arc<ErofsImage>,
    pub ino: Inode,
    /// Data segments `[start, end)` when the file has a hole (computed once, on
    /// first use), or why the mapping cannot be read.
    segs: OnceLock<Mapped>,
}

thread_local! {
    static CTX: RefCell<ReadCtx> = RefCell::new(ReadCtx::new());
}

/// Run `f` with this thread's read context (an empty one when it is in use).
fn with_ctx<T>(f: impl FnOnce(&mut ReadCtx) -> T) -> T {
    let mut ctx = CTX.try_with(|c| c.take()).unwrap_or_default();
    let r = f(&mut ctx);
    let _ = CTX.try_with(|c| c.replace(ctx));
    r
}

impl ErofsFile {
    pub fn new(image: Arc<ErofsImage>, ino: Inode) -> ErofsFile {
        ErofsFile {
            image,
            ino,
            segs: OnceLock::new(),
        }
    }

    /// Fill `buf` with the file's bytes from `off` (zeros in holes). A read past the
    /// end is `UnexpectedEof`; a corrupt extent is an error naming the nid and offset.
    pub fn read_exact_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.ino.size)
            .is_some();
        if !end {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let img = &self.image.img;
        let mut done = 0usize;
        // Bounded: each read returns at least one byte or the loop stops.
        while done < buf.len() {
            let n = with_ctx(|ctx| {
                img.read_at_with(ctx, &self.ino, off + done as u64, &mut buf[done..])
            })
            .map_err(std::io::Error::other)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            done += n;
        }
        Ok(())
    }

    /// Data segments `[start, end)` when the file has a hole, else None.
    pub fn segments(&self) -> Option<Vec<(u64, u64)>> {
        self.mapped().as_ref().ok().cloned().flatten()
    }

    /// Why the file's mapping cannot be read, if it cannot: `Source::open` fails with
    /// it, before a byte is copied (a corrupt map at the end of a file claiming
    /// gigabytes would otherwise be found after copying them).
    pub fn mapping_error(&self) -> Option<String> {
        self.mapped().as_ref().err().cloned()
    }

    fn mapped(&self) -> &Mapped {
        self.segs
            .get_or_init(|| self.map_segments().map_err(|e| e.to_string()))
    }

    fn map_segments(&self) -> ferofs_reader::Result<Option<Vec<(u64, u64)>>> {
        let size = self.ino.size;
        let img = &self.image.img;
        with_ctx(|ctx| {
            let mut v: Vec<(u64, u64)> = Vec::new();
            let mut holes = false;
            let mut pos = 0u64;
            // Bounded: every step moves `pos` forward (run_end is past `pos`), and
            // the segment count is capped.
            while pos < size {
                let (end, hole) = img.run_end(ctx, &self.ino, pos)?;
                if end <= pos {
                    break;
                }
                if hole {
                    holes = true;
                } else {
                    match v.last_mut() {
                        Some(l) if l.1 == pos => l.1 = end,
                        _ => {
                            if v.len() >= MAX_SEGMENTS {
                                return Ok(None);
                            }
                            v.push((pos, end));
                        }
                    }
                }
                pos = end;
            }
            Ok(holes.then_some(v))
        })
    }
}

fn invalid(path: impl Into<PathBuf>, what: impl Into<String>) -> BuildError {
    BuildError::Invalid {
        path: path.into(),
        what: what.into(),
    }
}

pub(crate) fn rerr(path: &Path) -> impl Fn(ferofs_reader::Error) -> BuildError + '_ {
    move |e| invalid(path, format!("source image: {e}"))
}

/// Open the EROFS image at `path` and scan its tree.
pub fn scan_image(path: &Path, opts: &BuildOptions) -> Result<Tree> {
    Ok(scan_image_with(path, opts)?.1)
}

/// Open the EROFS image at `path` and scan its tree; the open image too.
pub fn scan_image_with(path: &Path, opts: &BuildOptions) -> Result<(Arc<ErofsImage>, Tree)> {
    let image = open_image(path, opts)?;
    scan_opened(image, opts)
}

/// Open the EROFS image at `path` (with the extra devices `--device` names).
pub(crate) fn open_image(path: &Path, opts: &BuildOptions) -> Result<Arc<ErofsImage>> {
    let io = |e: std::io::Error| invalid(path, format!("source image: {e}"));
    let file = std::fs::File::open(path).map_err(io)?;
    let src: Arc<dyn ferofs_reader::Source> = if opts.source_devices.is_empty() {
        Arc::new(file)
    } else {
        let j = ferofs_reader::source::Joined::open(Arc::new(file), &opts.source_devices);
        Arc::new(j.map_err(|e| invalid(path, format!("source image, --device: {e}")))?)
    };
    let img = Image::new(src).map_err(rerr(path))?;
    Ok(Arc::new(ErofsImage {
        path: Arc::from(path),
        img,
    }))
}

fn scan_opened(image: Arc<ErofsImage>, opts: &BuildOptions) -> Result<(Arc<ErofsImage>, Tree)> {
    let excl = crate::scan::Excludes::new(opts);
    let excluded = |rel: &[u8]| excl.matches(rel);
    let p = &*image.path;
    let img = &image.img;
    let root_ino = img.inode(img.root_nid()).map_err(rerr(p))?;
    if !root_ino.is_dir() {
        return Err(invalid(
            p,
            "source image: the root inode is not a directory",
        ));
    }
    let mut nodes: Vec<Node> = Vec::new();
    let root = nodes.len();
    nodes.push(make_node(&image, root_ino.clone(), Vec::new(), opts)?);
    let mut by_nid: HashMap<u64, InodeId> = HashMap::new();
    let mut dirs_seen: HashSet<u64> = HashSet::new();
    dirs_seen.insert(root_ino.nid);
    // (directory inode, its tree id, its path, depth)
    let mut stack: Vec<(Inode, InodeId, Vec<u8>, usize)> = vec![(root_ino, root, Vec::new(), 0)];
    // Bounded: each directory nid is pushed at most once (dirs_seen), and each
    // directory's entries are read once.
    while let Some((dino, did, rel, depth)) = stack.pop() {
        let ents = img.read_dir(&dino).map_err(rerr(p))?;
        let mut entries = Vec::with_capacity(ents.len());
        let mut subdirs = Vec::new();
        for e in ents {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let crel = crate::scan::child_rel(&rel, &e.name);
            let shown = || p.join(std::ffi::OsStr::new(&*String::from_utf8_lossy(&crel)));
            if e.name.is_empty()
                || e.name.len() > ferofs_format::MAX_NAME_LEN
                || e.name.contains(&b'/')
                || e.name.contains(&0)
            {
                return Err(invalid(
                    shown(),
                    format!("source image: bad name in directory nid {}", dino.nid),
                ));
            }
            if excluded(&crel) {
                continue;
            }
            let cid = match by_nid.get(&e.nid) {
                Some(&c) => c,
                None => {
                    let ino = img.inode(e.nid).map_err(rerr(p))?;
                    if ino.is_dir() {
                        if !dirs_seen.insert(ino.nid) {
                            return Err(invalid(
                                shown(),
                                format!(
                                    "source image: directory nid {} is reached twice \
                                     (a loop or a hardlinked directory)",
                                    ino.nid
                                ),
                            ));
                        }
                        if depth + 1 > MAX_DEPTH {
                            return Err(invalid(shown(), "source image: nesting too deep"));
                        }
                        let c = nodes.len();
                        nodes.push(make_node(&image, ino.clone(), crel.clone(), opts)?);
                        subdirs.push((ino, c, crel.clone(), depth + 1));
                        c
                    } else {
                        let c = nodes.len();
                        nodes.push(make_node(&image, ino, crel.clone(), opts)?);
                        by_nid.insert(e.nid, c);
                        c
                    }
                }
            };
            if let Kind::Dir { parent, .. } = &mut nodes[cid].kind {
                *parent = did;
            }
            entries.push((e.name, cid));
        }
        // On-disk order is bytewise already; sort anyway (the tree requires it).
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        if entries.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(invalid(
                p,
                format!("source image: directory nid {} repeats a name", dino.nid),
            ));
        }
        if let Kind::Dir { entries: en, .. } = &mut nodes[did].kind {
            *en = entries;
        }
        stack.extend(subdirs.into_iter().rev());
    }
    let mut tree = Tree {
        nodes,
        root,
        packed: None,
        devices: Vec::new(),
    };
    fix_nlinks(&mut tree);
    Ok((image, tree))
}

pub(crate) fn make_node(
    image: &Arc<ErofsImage>,
    ino: Inode,
    rel: Vec<u8>,
    o: &BuildOptions,
) -> Result<Node> {
    let p = &*image.path;
    let img = &image.img;
    let shown = || p.join(std::ffi::OsStr::new(&*String::from_utf8_lossy(&rel)));
    let kind = match ino.file_type() {
        S_IFDIR => Kind::Dir {
            entries: Vec::new(),
            parent: 0,
        },
        S_IFREG => Kind::File {
            size: ino.size,
            src: Source::Erofs(Arc::new(ErofsFile::new(image.clone(), ino.clone()))),
        },
        S_IFLNK => {
            let target = img.read_link(&ino).map_err(rerr(p))?;
            if target.is_empty() || target.len() > 4095 {
                return Err(invalid(
                    shown(),
                    format!(
                        "source image: symlink target of {} bytes (1..=4095 allowed)",
                        target.len()
                    ),
                ));
            }
            Kind::Symlink { target }
        }
        S_IFCHR | S_IFBLK => Kind::Device { rdev: ino.rdev },
        S_IFIFO => Kind::Fifo,
        S_IFSOCK => Kind::Socket,
        t => {
            return Err(invalid(
                shown(),
                format!("source image: nid {} has unknown file type {t:o}", ino.nid),
            ))
        }
    };
    let mut xattrs: Vec<(Vec<u8>, Vec<u8>)> = img
        .xattrs(&ino)
        .map_err(rerr(p))?
        .into_iter()
        .map(|x| (x.name, x.value))
        .collect();
    for (name, val) in &xattrs {
        if ferofs_format::xattr::split_name(name).is_none() || val.len() > usize::from(u16::MAX) {
            return Err(invalid(
                shown(),
                format!(
                    "source image: nid {} has xattr {} that cannot be stored",
                    ino.nid,
                    String::from_utf8_lossy(name)
                ),
            ));
        }
    }
    xattrs.sort();
    xattrs.dedup_by(|a, b| a.0 == b.0);
    Ok(Node {
        kind,
        mode: ino.mode,
        uid: o.force_uid.unwrap_or(if o.all_root { 0 } else { ino.uid }),
        gid: o.force_gid.unwrap_or(if o.all_root { 0 } else { ino.gid }),
        mtime: ino.mtime,
        mtime_nsec: ino.mtime_nsec,
        nlink: 0,
        xattrs,
        rel,
    })
}
