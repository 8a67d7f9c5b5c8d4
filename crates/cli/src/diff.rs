//! `diff A B`: compare two trees, each an EROFS image or a directory.
//!
//! Both sides are listed (metadata only: type, mode, owner, mtime to the nanosecond,
//! size, symlink target, device number, xattrs), sorted in tree order (a directory's
//! entries right after it, by name bytes: the order of an EROFS directory), and merged.
//! Paths on one side only are `added` (in B only) or `removed` (in A only); for paths
//! on both sides every differing field is named. File contents are compared only when
//! the sizes are equal (otherwise `size` already says they differ), a chunk at a time
//! from both sides and in parallel across files, stopping at the first difference.
//! Not compared: atime/ctime, directory sizes and link counts (they differ between
//! filesystems by design), and which paths are hardlinks of each other.

use crate::fmt::{bytes_display, type_name};
use crate::list::open_one_of;
use crate::source::Image;
use anyhow::{bail, Context, Result};
use clap::Args;
use ferofs_format::inode::*;
use ferofs_reader::{Inode, ReadCtx};
use rayon::prelude::*;
use serde_json::{json, Value};
use std::cmp::Ordering;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct DiffArgs {
    /// First tree: an EROFS image (a file or a URL) or a directory.
    a: PathBuf,
    /// Second tree: an EROFS image (a file or a URL) or a directory.
    b: PathBuf,
    /// Print one JSON object per difference, one per line (JSON Lines).
    #[arg(long)]
    json: bool,
    /// Do not compare modification times.
    #[arg(long)]
    ignore_times: bool,
    /// Do not compare owners (uid and gid).
    #[arg(long)]
    ignore_owners: bool,
    /// Do not compare extended attributes (ACLs included).
    #[arg(long)]
    ignore_xattrs: bool,
    /// Print nothing; only the exit status tells (0 equal, 1 different, 2 error).
    #[arg(short, long)]
    quiet: bool,
}

/// Deepest directory level listed from a directory tree.
const MAX_DEPTH: usize = 4096;
/// Bytes compared at a time.
const CHUNK: usize = 1 << 20;

/// One path's metadata.
struct Node {
    /// Relative path, "" for the top.
    rel: Vec<u8>,
    /// Full st_mode.
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: i64,
    nsec: u32,
    rdev: (u32, u32),
    target: Vec<u8>,
    /// Sorted by name.
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The image inode (image side only).
    ino: Option<Inode>,
}

enum Tree {
    Image(Box<Image>),
    Dir(PathBuf),
}

impl Tree {
    fn open(p: &Path) -> Result<Tree> {
        if crate::source::is_url(p) {
            return Ok(Tree::Image(Box::new(open_one_of(p)?)));
        }
        let m = fs::metadata(p).with_context(|| format!("cannot open {}", p.display()))?;
        Ok(if m.is_dir() {
            Tree::Dir(p.to_path_buf())
        } else {
            Tree::Image(Box::new(open_one_of(p)?))
        })
    }

    fn list(&self, xattrs: bool) -> Result<Vec<Node>> {
        let mut v = match self {
            Tree::Image(img) => list_image(img, xattrs)?,
            Tree::Dir(d) => list_dir(d, xattrs)?,
        };
        v.sort_by(|a, b| tree_order(&a.rel, &b.rel));
        Ok(v)
    }

    /// Compare the contents of `a` (in this tree) with `b` (in `other`); equal sizes.
    fn same_content(
        &self,
        other: &Tree,
        a: &Node,
        b: &Node,
        bufs: &mut (ReadCtx, ReadCtx, Vec<u8>, Vec<u8>),
    ) -> Result<bool> {
        let (ca, cb, ba, bb) = bufs;
        let mut ra = Content::new(self, a)?;
        let mut rb = Content::new(other, b)?;
        if ba.len() < CHUNK {
            ba.resize(CHUNK, 0);
            bb.resize(CHUNK, 0);
        }
        let mut off = 0u64;
        // Bounded: each step compares at least one byte of a file of known size, or
        // stops at a short read.
        while off < a.size {
            // Holes on both sides are equal without reading their zeros (the second
            // map is only asked when the first has a hole).
            let both = ra
                .hole_end(ca, off, a.size)
                .and_then(|ea| rb.hole_end(cb, off, a.size).map(|eb| ea.min(eb)));
            if let Some(end) = both {
                off = end;
                continue;
            }
            let n = usize::try_from(a.size - off).map_or(CHUNK, |l| l.min(CHUNK));
            ra.read_exact(ca, off, &mut ba[..n])?;
            rb.read_exact(cb, off, &mut bb[..n])?;
            if ba[..n] != bb[..n] {
                return Ok(false);
            }
            off += n as u64;
        }
        Ok(true)
    }
}

/// A file's bytes, from an image inode or an open file.
enum Content<'a> {
    Image(&'a Image, &'a Inode, &'a [u8]),
    File(fs::File, PathBuf),
}

impl<'a> Content<'a> {
    fn new(t: &'a Tree, n: &'a Node) -> Result<Content<'a>> {
        Ok(match (t, &n.ino) {
            (Tree::Image(img), Some(ino)) => Content::Image(img, ino, &n.rel),
            (Tree::Dir(d), _) => {
                let p = join(d, &n.rel);
                let f = fs::File::open(&p).with_context(|| format!("open {}", p.display()))?;
                Content::File(f, p)
            }
            _ => bail!("internal: image node without inode"),
        })
    }

    /// Where a hole at `off` ends (None: data there, or an error: the bytes are then
    /// read). A directory's file asks its filesystem (SEEK_DATA): a hole ends at the
    /// next data or, with none after `off`, at `size`.
    fn hole_end(&self, ctx: &mut ReadCtx, off: u64, size: u64) -> Option<u64> {
        match self {
            Content::Image(img, ino, _) => img.hole_end(ctx, ino, off).ok().flatten(),
            Content::File(f, _) => {
                use rustix::fs::{seek, SeekFrom};
                match seek(f, SeekFrom::Data(off)) {
                    Ok(d) => (d > off).then_some(d.min(size)),
                    // ENXIO: no data at or after `off`, all holes to the end.
                    Err(rustix::io::Errno::NXIO) => Some(size),
                    Err(_) => None,
                }
            }
        }
    }

    fn read_exact(&mut self, ctx: &mut ReadCtx, off: u64, buf: &mut [u8]) -> Result<()> {
        match self {
            Content::Image(img, ino, rel) => {
                let mut done = 0usize;
                // Bounded: each read returns at least one byte or we stop.
                while done < buf.len() {
                    let at = off + done as u64;
                    let n = img
                        .read_at_with(ctx, ino, at, &mut buf[done..])
                        .with_context(|| format!("/{}: read at offset {at}", bytes_display(rel)))?;
                    if n == 0 {
                        bail!("/{}: data ends at offset {at}", bytes_display(rel));
                    }
                    done += n;
                }
                Ok(())
            }
            Content::File(f, p) => f
                .read_exact_at(buf, off)
                .with_context(|| format!("read {} at offset {off}", p.display())),
        }
    }
}

fn join(base: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        base.to_path_buf()
    } else {
        base.join(OsStr::from_bytes(rel))
    }
}

/// Tree order: component by component, so that a directory's subtree follows it
/// ("a", "a/b", "a-c"): '/' sorts before every byte a name can hold.
fn tree_order(a: &[u8], b: &[u8]) -> Ordering {
    let k = |c: &u8| if *c == b'/' { 0 } else { *c };
    a.iter().map(k).cmp(b.iter().map(k))
}

fn list_image(img: &Image, with_xattrs: bool) -> Result<Vec<Node>> {
    let mut v = Vec::new();
    img.walk(|path, ino| {
        let rel = path.strip_prefix(b"/").unwrap_or(path).to_vec();
        let target = if ino.is_symlink() {
            img.read_link(ino)?
        } else {
            Vec::new()
        };
        let mut xattrs: Vec<(Vec<u8>, Vec<u8>)> = if with_xattrs && ino.xattr_icount != 0 {
            img.xattrs(ino)?
                .into_iter()
                .map(|x| (x.name, x.value))
                .collect()
        } else {
            Vec::new()
        };
        xattrs.sort();
        v.push(Node {
            rel,
            mode: u32::from(ino.mode),
            uid: ino.uid,
            gid: ino.gid,
            size: ino.size,
            mtime: ino.mtime,
            nsec: ino.mtime_nsec,
            rdev: if ino.is_device() {
                ino.rdev_major_minor()
            } else {
                (0, 0)
            },
            target,
            xattrs,
            ino: Some(ino.clone()),
        });
        Ok(())
    })
    .context("walk the image")?;
    Ok(v)
}

fn list_dir(top: &Path, with_xattrs: bool) -> Result<Vec<Node>> {
    let mut v = Vec::new();
    let mut stack: Vec<(Vec<u8>, usize)> = vec![(Vec::new(), 0)];
    // Bounded: every directory is read once (no symlinks are followed; depth checked).
    while let Some((rel, depth)) = stack.pop() {
        let p = join(top, &rel);
        let m = fs::symlink_metadata(&p).with_context(|| format!("stat {}", p.display()))?;
        let kind = m.mode() & u32::from(S_IFMT);
        let target = if kind == u32::from(S_IFLNK) {
            fs::read_link(&p)
                .with_context(|| format!("readlink {}", p.display()))?
                .into_os_string()
                .into_vec()
        } else {
            Vec::new()
        };
        let mut xattrs = Vec::new();
        if with_xattrs {
            for name in
                xattr::list(&p).with_context(|| format!("list xattrs of {}", p.display()))?
            {
                if let Some(val) = xattr::get(&p, &name)
                    .with_context(|| format!("read xattr of {}", p.display()))?
                {
                    xattrs.push((name.as_bytes().to_vec(), val));
                }
            }
            xattrs.sort();
        }
        let is_dev = kind == u32::from(S_IFCHR) || kind == u32::from(S_IFBLK);
        let rdev = m.rdev();
        if kind == u32::from(S_IFDIR) {
            if depth >= MAX_DEPTH {
                bail!("{}: deeper than {MAX_DEPTH} levels", p.display());
            }
            let mut names: Vec<Vec<u8>> = Vec::new();
            for e in fs::read_dir(&p).with_context(|| format!("read {}", p.display()))? {
                let e = e.with_context(|| format!("read {}", p.display()))?;
                names.push(e.file_name().into_vec());
            }
            // Reverse order on the stack: popped in name order.
            names.sort_by(|a, b| b.cmp(a));
            for n in names {
                let mut c = rel.clone();
                if !c.is_empty() {
                    c.push(b'/');
                }
                c.extend_from_slice(&n);
                stack.push((c, depth + 1));
            }
        }
        v.push(Node {
            rel,
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            size: m.size(),
            mtime: m.mtime(),
            nsec: u32::try_from(m.mtime_nsec()).unwrap_or(0),
            rdev: if is_dev {
                (rustix::fs::major(rdev), rustix::fs::minor(rdev))
            } else {
                (0, 0)
            },
            target,
            xattrs,
            ino: None,
        });
    }
    Ok(v)
}

use std::os::unix::ffi::OsStringExt;

/// One difference of a path present on both sides.
struct Change {
    field: &'static str,
    a: Option<String>,
    b: Option<String>,
    /// For xattrs: the attribute's name.
    name: Option<String>,
}

fn ch(field: &'static str, a: String, b: String) -> Change {
    Change {
        field,
        a: Some(a),
        b: Some(b),
        name: None,
    }
}

fn time(sec: i64, nsec: u32) -> String {
    if nsec == 0 {
        sec.to_string()
    } else {
        format!("{sec}.{nsec:09}")
    }
}

fn type_of(mode: u32) -> &'static str {
    type_name(u16::try_from(mode & u32::from(S_IFMT)).unwrap_or(0))
}

/// Metadata differences (contents are compared separately).
fn compare(a: &Node, b: &Node, args: &DiffArgs) -> Vec<Change> {
    let mut v = Vec::new();
    let ta = a.mode & u32::from(S_IFMT);
    if ta != b.mode & u32::from(S_IFMT) {
        v.push(ch("type", type_of(a.mode).into(), type_of(b.mode).into()));
        return v;
    }
    // A symlink's permission bits mean nothing (and differ between filesystems).
    if ta != u32::from(S_IFLNK) && a.mode & 0o7777 != b.mode & 0o7777 {
        v.push(ch(
            "mode",
            format!("{:04o}", a.mode & 0o7777),
            format!("{:04o}", b.mode & 0o7777),
        ));
    }
    if !args.ignore_owners {
        if a.uid != b.uid {
            v.push(ch("uid", a.uid.to_string(), b.uid.to_string()));
        }
        if a.gid != b.gid {
            v.push(ch("gid", a.gid.to_string(), b.gid.to_string()));
        }
    }
    if !args.ignore_times && (a.mtime, a.nsec) != (b.mtime, b.nsec) {
        v.push(ch("mtime", time(a.mtime, a.nsec), time(b.mtime, b.nsec)));
    }
    if ta == u32::from(S_IFREG) && a.size != b.size {
        v.push(ch("size", a.size.to_string(), b.size.to_string()));
    }
    if ta == u32::from(S_IFLNK) && a.target != b.target {
        v.push(ch(
            "target",
            bytes_display(&a.target),
            bytes_display(&b.target),
        ));
    }
    if a.rdev != b.rdev {
        v.push(ch(
            "rdev",
            format!("{}:{}", a.rdev.0, a.rdev.1),
            format!("{}:{}", b.rdev.0, b.rdev.1),
        ));
    }
    if !args.ignore_xattrs {
        let (mut i, mut j) = (0, 0);
        // Bounded: each step consumes an attribute of one side or both.
        while i < a.xattrs.len() || j < b.xattrs.len() {
            let o = match (a.xattrs.get(i), b.xattrs.get(j)) {
                (Some(x), Some(y)) => x.0.cmp(&y.0),
                (Some(_), None) => Ordering::Less,
                _ => Ordering::Greater,
            };
            let (name, what) = match o {
                Ordering::Less => {
                    i += 1;
                    (&a.xattrs[i - 1].0, Some("removed"))
                }
                Ordering::Greater => {
                    j += 1;
                    (&b.xattrs[j - 1].0, Some("added"))
                }
                Ordering::Equal => {
                    i += 1;
                    j += 1;
                    let same = a.xattrs[i - 1].1 == b.xattrs[j - 1].1;
                    (&a.xattrs[i - 1].0, (!same).then_some("changed"))
                }
            };
            if let Some(w) = what {
                v.push(Change {
                    field: "xattr",
                    a: None,
                    b: Some(w.into()),
                    name: Some(bytes_display(name)),
                });
            }
        }
    }
    v
}

enum Diff {
    Added(usize),
    Removed(usize),
    Changed(usize, usize, Vec<Change>),
}

/// Returns Ok(true) when the trees are equal.
pub fn run(args: DiffArgs) -> Result<bool> {
    let ta = Tree::open(&args.a)?;
    let tb = Tree::open(&args.b)?;
    let with_x = !args.ignore_xattrs;
    let (la, lb) = rayon::join(|| ta.list(with_x), || tb.list(with_x));
    let (la, lb) = (
        la.with_context(|| format!("list {}", args.a.display()))?,
        lb.with_context(|| format!("list {}", args.b.display()))?,
    );

    // Merge the two sorted lists.
    let mut diffs: Vec<Diff> = Vec::new();
    let mut content: Vec<(usize, usize)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    // Bounded: each step consumes an entry of one list or both.
    while i < la.len() || j < lb.len() {
        let o = match (la.get(i), lb.get(j)) {
            (Some(x), Some(y)) => tree_order(&x.rel, &y.rel),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        };
        match o {
            Ordering::Less => {
                diffs.push(Diff::Removed(i));
                i += 1;
            }
            Ordering::Greater => {
                diffs.push(Diff::Added(j));
                j += 1;
            }
            Ordering::Equal => {
                let c = compare(&la[i], &lb[j], &args);
                let (x, y) = (&la[i], &lb[j]);
                let regular = |n: &Node| n.mode & u32::from(S_IFMT) == u32::from(S_IFREG);
                if regular(x) && regular(y) && x.size == y.size && x.size > 0 {
                    content.push((i, j));
                }
                diffs.push(Diff::Changed(i, j, c));
                i += 1;
                j += 1;
            }
        }
    }

    // Contents, in parallel: the pairs whose bytes differ.
    let differ: Result<Vec<(usize, usize)>> = content
        .par_iter()
        .map_init(
            || (ReadCtx::new(), ReadCtx::new(), Vec::new(), Vec::new()),
            |bufs, &(i, j)| {
                let same = ta.same_content(&tb, &la[i], &lb[j], bufs)?;
                Ok((!same).then_some((i, j)))
            },
        )
        .filter_map(|r| r.transpose())
        .collect();
    let differ: std::collections::HashSet<(usize, usize)> = differ?.into_iter().collect();

    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut equal = true;
    for d in &mut diffs {
        let (status, node, changes): (&str, &Node, &[Change]) = match d {
            Diff::Added(j) => ("added", &lb[*j], &[]),
            Diff::Removed(i) => ("removed", &la[*i], &[]),
            Diff::Changed(i, j, c) => {
                if differ.contains(&(*i, *j)) {
                    c.push(Change {
                        field: "content",
                        a: None,
                        b: None,
                        name: None,
                    });
                }
                if c.is_empty() {
                    continue;
                }
                ("changed", &la[*i], c.as_slice())
            }
        };
        equal = false;
        if args.quiet {
            continue;
        }
        let path = format!("/{}", bytes_display(&node.rel));
        if args.json {
            let mut o = json!({"status": status, "path": path, "type": type_of(node.mode)});
            if !changes.is_empty() {
                let arr: Vec<Value> = changes
                    .iter()
                    .map(|c| {
                        let mut v = json!({"field": c.field});
                        if let Some(n) = &c.name {
                            v["name"] = json!(n);
                            v["change"] = json!(c.b);
                        } else if let (Some(a), Some(b)) = (&c.a, &c.b) {
                            v["a"] = json!(a);
                            v["b"] = json!(b);
                        }
                        v
                    })
                    .collect();
                o["changes"] = Value::Array(arr);
            }
            writeln!(out, "{o}")?;
        } else if changes.is_empty() {
            writeln!(out, "{status:<8} {path} ({})", type_of(node.mode))?;
        } else {
            let parts: Vec<String> = changes
                .iter()
                .map(|c| match (&c.name, &c.a, &c.b) {
                    (Some(n), _, Some(w)) => format!("xattr {n} {w}"),
                    (None, Some(a), Some(b)) => format!("{} {a} -> {b}", c.field),
                    _ => c.field.to_string(),
                })
                .collect();
            writeln!(out, "{status:<8} {path}: {}", parts.join(", "))?;
        }
    }
    out.flush()?;
    Ok(equal)
}
