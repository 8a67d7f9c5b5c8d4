//! `check`: verify every structure of an image, read every byte, and report every
//! problem found (not just the first), each with the path(s) it affects.
//!
//! Two phases. The walk (one thread) reads every directory block by block and checks
//! names, nids, `.`/`..`, file types, directory cycles and nlink; a bad directory block
//! or entry is reported and the walk goes on with the next one (what hangs below a lost
//! entry is reported as unreachable). Then every inode found is checked in parallel:
//! xattrs, the data mapping (compressed index included), every byte read (every
//! pcluster decompressed to its length), nothing past the end of the image. Last, the
//! byte ranges of all inodes are sorted and swept for overlaps between different
//! inodes (identical ranges are allowed sharing: whole-file and pcluster dedupe).

use crate::fmt::bytes_display;
use crate::source::Image;
use anyhow::{Context as _, Result};
use clap::Args;
use ferofs_format::dirent::{file_type_of_mode, FT_DIR};
use ferofs_format::sb::INCOMPAT_FRAGMENTS;
use ferofs_reader::{CorruptKind, Error, Inode, ReadCtx, Source};
use rayon::prelude::*;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;

/// Most problems kept; past this the check stops early and says so.
pub const MAX_PROBLEMS: usize = 100_000;

#[derive(Args)]
pub struct CheckArgs {
    /// The image: a file or a URL (http://, https://, s3://bucket/key).
    pub image: PathBuf,
    /// Print every path as it is checked (to standard error).
    #[arg(short, long)]
    pub verbose: bool,
    /// Print one JSON document: the problems and a summary.
    #[arg(long)]
    pub json: bool,
    /// Integrity: also check every data block against the dm-verity hash tree that
    /// `build --verity` appended, and the tree against ROOTHASH (hex). A mismatch
    /// names the data block and the files whose data it holds.
    #[arg(long, value_name = "ROOTHASH")]
    pub verity: Option<String>,
    /// Byte offset of the verity superblock (veritysetup's --hash-offset). Default:
    /// the end of the image as its superblock gives it, rounded up to 4096.
    #[arg(long, value_name = "BYTES", requires = "verity")]
    pub verity_hash_offset: Option<u64>,
    /// Do not verify the superblock checksum (fsck.erofs's `--no-sbcrc`): for an image
    /// whose superblock a tool changed in place without updating it. Everything else
    /// is checked.
    #[arg(long)]
    pub no_sb_checksum: bool,
    /// Also print the compression ratio of all regular files (fsck.erofs's `-p`):
    /// the blocks their stored extents take against the blocks their sizes take.
    #[arg(long)]
    pub ratio: bool,
    /// Check only this path of the image: the file, or the directory and everything
    /// below it (fsck.erofs's `--path`). The superblock is checked as always; link
    /// counts of files with names outside the subtree are not (only that no file has
    /// more names than its count), nor the packed inode as a whole (the fragments of
    /// the files checked are read).
    #[arg(long, conflicts_with = "nid")]
    pub path: Option<String>,
    /// Check only the inode of this number and, for a directory, everything below it
    /// (fsck.erofs's `--nid`), as `--path` does; also inodes no directory lists, e.g.
    /// the packed inode (`inspect` shows its nid).
    #[arg(long)]
    pub nid: Option<u64>,
}

/// Where a scoped check (`--path`, `--nid`) starts.
pub struct Scope {
    /// The inode the walk starts from (a directory or any other inode).
    pub ino: Inode,
    /// How problems name it: the path given, or `(nid N)`.
    pub path: String,
    /// The parent its `..` must point at, when known (the path's directory).
    pub parent: Option<u64>,
}

/// The subtree `--path` or `--nid` names (`None`: the whole image; so is `--nid` of
/// the root, as in fsck.erofs, which then checks the packed inode too).
fn scope_of(img: &Image, a: &CheckArgs) -> Result<Option<Scope>> {
    if let Some(p) = &a.path {
        let ino = img
            .lookup(p.as_bytes())
            .with_context(|| format!("{p}: lookup failed"))?;
        let trimmed = p.trim_end_matches('/');
        let parent = match trimmed.rsplit_once('/') {
            _ if ino.nid == img.root_nid() => Some(ino.nid),
            Some((dir, _)) => Some(
                img.lookup(if dir.is_empty() { b"/" } else { dir.as_bytes() })
                    .with_context(|| format!("{dir}: lookup failed"))?
                    .nid,
            ),
            None => Some(img.root_nid()),
        };
        // As the walk names paths: "/a/b", whatever slashes were given.
        let path = format!("/{}", trimmed.trim_start_matches('/'));
        return Ok(Some(Scope { ino, path, parent }));
    }
    match a.nid {
        Some(n) if n != img.root_nid() => {
            let ino = img.inode(n).with_context(|| format!("nid {n}"))?;
            Ok(Some(Scope {
                ino,
                path: format!("(nid {n})"),
                parent: None,
            }))
        }
        _ => Ok(None),
    }
}

/// (logical, physical) blocks of every regular file, each counted once, as
/// fsck.erofs's `-p` counts them: its size in blocks, and the bytes its extents
/// store (inline tails and fragments included, holes not) rounded up to blocks; the
/// packed inode's stored bytes count as physical only.
fn compression_blocks(img: &Image, scope: Option<&Scope>) -> (u64, u64) {
    let bs = u64::from(img.block_size());
    let stored = |ino: &ferofs_reader::Inode| {
        let b: u64 = img
            .extents(ino)
            .unwrap_or_default()
            .iter()
            .fold(0u64, |a, e| a.saturating_add(e.stored));
        b.div_ceil(bs)
    };
    let mut seen = HashSet::new();
    let (mut logical, mut physical) = (0u64, 0u64);
    let top = match scope {
        Some(s) => s.ino.clone(),
        None => match img.inode(img.root_nid()) {
            Ok(r) => r,
            Err(_) => return (0, 0),
        },
    };
    let _ = img.walk_from(&top, |_, ino| {
        if ino.is_regular() && seen.insert(ino.nid) {
            logical = logical.saturating_add(ino.size.div_ceil(bs));
            physical = physical.saturating_add(stored(ino));
        }
        Ok(())
    });
    let sb = img.superblock();
    // The packed inode counts for the whole image only (as in fsck.erofs).
    if scope.is_none() && sb.feature_incompat & ferofs_format::sb::INCOMPAT_FRAGMENTS != 0 {
        if let Ok(p) = img.inode(sb.packed_nid) {
            physical = physical.saturating_add(stored(&p));
        }
    }
    (logical, physical)
}

/// One problem found.
#[derive(Debug, Clone)]
pub struct Problem {
    /// Every path known to lead to the inode (several for hard links); may be empty
    /// for structures no path reaches (the superblock).
    pub paths: Vec<String>,
    pub kind: String,
    pub what: String,
    pub nid: Option<u64>,
    pub offset: Option<u64>,
    pub value: Option<u64>,
    pub expected: Option<u64>,
}

impl Problem {
    fn new(path: &str, kind: &str, what: impl Into<String>) -> Self {
        Problem {
            paths: if path.is_empty() {
                vec![]
            } else {
                vec![path.to_string()]
            },
            kind: kind.to_string(),
            what: what.into(),
            nid: None,
            offset: None,
            value: None,
            expected: None,
        }
    }
    fn nid(mut self, n: u64) -> Self {
        self.nid = Some(n);
        self
    }
    fn value(mut self, v: u64) -> Self {
        self.value = Some(v);
        self
    }
    fn expected(mut self, v: u64) -> Self {
        self.expected = Some(v);
        self
    }
    fn offset(mut self, v: u64) -> Self {
        self.offset = Some(v);
        self
    }

    /// From a reader error; `nid` fills in when the error names none.
    fn from_error(paths: &[String], nid: u64, e: &Error, context: &str) -> Self {
        let mut p = match e {
            Error::Corrupt(c) => Problem {
                paths: paths.to_vec(),
                kind: format!("{:?}", c.kind),
                what: if c.detail.is_empty() {
                    context.to_string()
                } else {
                    format!("{context}: {}", c.detail)
                },
                nid: c.nid,
                offset: c.offset,
                value: c.value,
                expected: None,
            },
            Error::Io { offset, error } => Problem {
                paths: paths.to_vec(),
                kind: "Io".into(),
                what: format!("{context}: {error}"),
                nid: None,
                offset: Some(*offset),
                value: None,
                expected: None,
            },
            Error::Unsupported { what, nid } => Problem {
                paths: paths.to_vec(),
                kind: "Unsupported".into(),
                what: format!("{context}: unsupported: {what}"),
                nid: *nid,
                offset: None,
                value: None,
                expected: None,
            },
            other => Problem {
                paths: paths.to_vec(),
                kind: "Other".into(),
                what: format!("{context}: {other}"),
                nid: None,
                offset: None,
                value: None,
                expected: None,
            },
        };
        if p.nid.is_none() {
            p.nid = Some(nid);
        }
        p
    }

    pub fn line(&self) -> String {
        let mut s = match self.paths.split_first() {
            None => "(image)".to_string(),
            Some((first, [])) => first.clone(),
            Some((first, rest)) => format!("{first} (also {})", rest.join(", ")),
        };
        s.push_str(": ");
        s.push_str(&self.what);
        let mut parts = Vec::new();
        if let Some(n) = self.nid {
            parts.push(format!("nid {n}"));
        }
        if let Some(o) = self.offset {
            parts.push(format!("offset {o}"));
        }
        if let Some(v) = self.value {
            parts.push(format!("value {v}"));
        }
        if let Some(v) = self.expected {
            parts.push(format!("expected {v}"));
        }
        if !parts.is_empty() {
            s.push_str(&format!(" ({})", parts.join(", ")));
        }
        s
    }

    pub fn to_json(&self) -> Value {
        json!({
            "paths": self.paths,
            "kind": self.kind,
            "message": self.what,
            "nid": self.nid,
            "offset": self.offset,
            "value": self.value,
            "expected": self.expected,
        })
    }
}

/// What the check covered.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    /// Paths visited: the root and every entry but "." and "..".
    pub entries: u64,
    pub directories: u64,
    pub inodes: u64,
    /// Bytes of regular-file data read (symlink targets not counted), holes included.
    pub bytes_read: u64,
    /// Of those, bytes in holes: mapped as holes, so there was nothing to read.
    pub hole_bytes: u64,
    pub ranges: u64,
    pub truncated: bool,
    /// Inodes in the metabox with both inline and shared xattrs: valid, but Linux
    /// 6.17-6.18 (and erofsfuse 1.9.3) can miss the shared ones (a stale buffer).
    pub metabox_mixed_xattrs: u64,
    /// Content fingerprints not checked: their files have more than
    /// [`MAX_FINGERPRINT_HOLES`] bytes of holes.
    pub fingerprints_unverified: u64,
}

/// An inode found by the walk, with every path that names it.
struct Found {
    ino: Inode,
    paths: Vec<String>,
}

/// A data byte range: (start, end, nid, uncompressed blocks). Uncompressed blocks are
/// shared block by block (mkfs.erofs dedupes them so: a file's blocks may be a run
/// inside another's), so two such ranges may overlap in part.
type DataRange = (u64, u64, u64, bool);

/// What one inode's check gives.
#[derive(Default)]
struct InodeResult {
    probs: Vec<Problem>,
    ranges: Vec<DataRange>,
    /// The inode record's byte range (start, end, nid).
    record: Option<(u64, u64, u64)>,
    /// Bytes of file data read, holes included.
    read: u64,
    /// Of those, bytes in holes.
    holes: u64,
    /// A metabox inode with inline and shared xattrs.
    mixed: bool,
    /// A content fingerprint not checked: its file has more than
    /// [`MAX_FINGERPRINT_HOLES`] bytes of holes.
    unverified: bool,
}

/// Whether `ino` has at most `limit` bytes of holes, by its map (no data read); false
/// when the map cannot be read to the end (the read reports that).
fn hole_bytes_at_most(img: &Image, ctx: &mut ReadCtx, ino: &Inode, limit: u64) -> bool {
    let (mut pos, mut holes) = (0u64, 0u64);
    // Bounded: every run ends past its start (or the walk stops), up to the size.
    while pos < ino.size {
        match img.run_end(ctx, ino, pos) {
            Ok((end, hole)) if end > pos => {
                if hole {
                    holes += end - pos;
                    if holes > limit {
                        return false;
                    }
                }
                pos = end;
            }
            _ => return true,
        }
    }
    true
}

/// The most bytes of holes a file's content fingerprint is checked over (their zeros
/// are hashed: about a minute of SHA-256); a hostile image can claim petabytes.
const MAX_FINGERPRINT_HOLES: u64 = 64 << 30;

/// Result of a whole check.
pub struct Report {
    pub problems: Vec<Problem>,
    pub summary: Summary,
    /// For each watched byte range given to [`check_image`]: the paths of the inodes
    /// whose data lies in it.
    pub watched: Vec<Vec<String>>,
}

fn join(dir: &str, name: &[u8]) -> String {
    let n = bytes_display(name);
    if dir == "/" {
        format!("/{n}")
    } else {
        format!("{dir}/{n}")
    }
}

/// Open for checking: a bad superblock checksum is a problem, not the end.
pub fn open_for_check(path: &std::path::Path) -> Result<(Image, Vec<Problem>), Error> {
    let src = |path| {
        crate::source::open_src(path).map_err(|e| Error::Io {
            offset: 0,
            error: std::io::Error::other(format!("{e:#}")),
        })
    };
    match Image::new(src(path)?) {
        Ok(img) => Ok((img, vec![])),
        Err(e) if e.corrupt_kind() == Some(CorruptKind::BadChecksum) => {
            let f = src(path)?;
            let img = Image::new_ignoring_checksum(f)?;
            let mut p = Problem::from_error(&[], 0, &e, "superblock");
            p.nid = None;
            p.paths = vec!["(superblock)".into()];
            // The checksum the superblock should hold.
            let n = ferofs_format::sb::checksum_len(img.block_size());
            let mut region = vec![0u8; n];
            if img
                .source()
                .read_exact_at(&mut region, ferofs_format::sb::SB_OFFSET)
                .is_ok()
            {
                p.expected = Some(u64::from(ferofs_format::sb::compute_checksum(&region)));
            }
            Ok((img, vec![p]))
        }
        Err(e) => Err(e),
    }
}

/// Check the image, or only the subtree `scope` names (`None`: the whole image).
/// `verbose` prints each path to stderr as it is walked. `watch`: byte ranges (sorted,
/// not overlapping) whose owners the report names.
pub fn check_image(
    img: &Image,
    image_len: u64,
    verbose: bool,
    watch: &[(u64, u64)],
    scope: Option<&Scope>,
) -> Report {
    let mut problems: Vec<Problem> = Vec::new();
    let mut summary = Summary::default();
    let bs = u64::from(img.block_size());
    let root_nid = img.root_nid();

    // ---- Phase 1: the walk.
    let mut found: HashMap<u64, Found> = HashMap::new();
    let mut dirs_seen: HashSet<u64> = HashSet::new();
    // Names found per non-directory nid (for nlink).
    let root = match scope {
        Some(s) => s.ino.clone(),
        None => match img.inode(root_nid) {
            Ok(r) => r,
            Err(e) => {
                problems.push(Problem::from_error(
                    &["/".into()],
                    root_nid,
                    &e,
                    "root inode unreadable; the whole tree is unreachable",
                ));
                return Report {
                    problems,
                    summary,
                    watched: vec![Vec::new(); watch.len()],
                };
            }
        },
    };
    let top_path = scope.map_or_else(|| "/".to_string(), |s| s.path.clone());
    let top_parent = match scope {
        Some(s) => s.parent,
        None => Some(root_nid),
    };
    let walk_root = root.nid;
    // (directory inode, its path, parent nid when known, depth)
    let mut stack: Vec<(Inode, String, Option<u64>, usize)> = Vec::new();
    if root.is_dir() {
        dirs_seen.insert(walk_root);
        summary.entries = 1;
        stack.push((root.clone(), top_path.clone(), top_parent, 0));
    } else if scope.is_some() {
        // One file: no walk.
        summary.entries = 1;
    } else {
        problems.push(
            Problem::new("/", "NotADirectory", "root is not a directory")
                .nid(root_nid)
                .value(u64::from(root.mode)),
        );
        return Report {
            problems,
            summary,
            watched: vec![Vec::new(); watch.len()],
        };
    }
    found.insert(
        walk_root,
        Found {
            ino: root,
            paths: vec![top_path],
        },
    );
    let mut buf = vec![0u8; bs as usize];
    let mut walk_incomplete = false;
    // Bounded: each directory is pushed at most once (dirs_seen), and each has a
    // finite number of blocks, read until the first unreadable one.
    while let Some((dir, dpath, parent, depth)) = stack.pop() {
        if problems.len() >= MAX_PROBLEMS {
            summary.truncated = true;
            break;
        }
        summary.directories += 1;
        if verbose {
            eprintln!("{dpath}");
        }
        let nblocks = dir.size.div_ceil(bs);
        let mut prev: Option<Vec<u8>> = None;
        let mut complete = true;
        let mut subdirs = 0u64;
        let mut saw_dot = false;
        let mut saw_dotdot = false;
        for b in 0..nblocks {
            // A directory claiming a huge size of unparseable blocks ends here.
            if problems.len() >= MAX_PROBLEMS {
                summary.truncated = true;
                complete = false;
                break;
            }
            let start = b * bs;
            let len = (dir.size - start).min(bs) as usize;
            let blk = &mut buf[..len];
            let ents = match img.read_at(&dir, start, blk) {
                Ok(n) if n == len => ferofs_reader::dir::parse_dir_block(blk, dir.nid, start),
                Ok(n) => Err(Error::short_read(dir.nid, start + n as u64, dir.size)),
                Err(e) => {
                    problems.push(Problem::from_error(
                        std::slice::from_ref(&dpath),
                        dir.nid,
                        &e,
                        &format!(
                            "directory block {b} unreadable; it and the rest of the directory ({} of {nblocks} blocks) and their subtrees are unreachable",
                            nblocks - b
                        ),
                    ));
                    complete = false;
                    break;
                }
            };
            let ents = match ents {
                Ok(v) => v,
                Err(e) => {
                    problems.push(Problem::from_error(
                        std::slice::from_ref(&dpath),
                        dir.nid,
                        &e,
                        &format!("directory block {b} is corrupt; its entries and their subtrees are unreachable"),
                    ));
                    complete = false;
                    continue;
                }
            };
            for e in ents {
                let cpath = join(&dpath, &e.name);
                if let Some(p) = &prev {
                    if p.as_slice() >= e.name.as_slice() {
                        problems.push(
                            Problem::new(
                                &cpath,
                                "UnsortedDirectory",
                                format!(
                                    "name not after the previous one \"{}\" in its directory",
                                    bytes_display(p)
                                ),
                            )
                            .nid(dir.nid)
                            .offset(start),
                        );
                    }
                }
                prev = Some(e.name.clone());
                if e.name == b"." {
                    saw_dot = true;
                    if e.nid != dir.nid {
                        problems.push(
                            Problem::new(&dpath, "BadDot", "\".\" does not point at the directory")
                                .nid(dir.nid)
                                .offset(start)
                                .value(e.nid)
                                .expected(dir.nid),
                        );
                    }
                    continue;
                }
                if e.name == b".." {
                    saw_dotdot = true;
                    if let Some(parent) = parent.filter(|&p| p != e.nid) {
                        problems.push(
                            Problem::new(
                                &dpath,
                                "BadDotDot",
                                "\"..\" does not point at the parent",
                            )
                            .nid(dir.nid)
                            .offset(start)
                            .value(e.nid)
                            .expected(parent),
                        );
                    }
                    continue;
                }
                summary.entries += 1;
                if verbose {
                    eprintln!("{cpath}");
                }
                let child = match img.inode(e.nid) {
                    Ok(c) => c,
                    Err(err) => {
                        let what = if e.file_type == FT_DIR {
                            "entry's inode unreadable; its subtree is unreachable"
                        } else {
                            "entry's inode unreadable"
                        };
                        let mut p = Problem::from_error(&[cpath], e.nid, &err, what);
                        p.nid = Some(e.nid);
                        problems.push(p);
                        continue;
                    }
                };
                let ft = file_type_of_mode(child.mode);
                if e.file_type != ft {
                    problems.push(
                        Problem::new(
                            &cpath,
                            "FileTypeMismatch",
                            "directory entry's file type differs from the inode's",
                        )
                        .nid(child.nid)
                        .offset(start)
                        .value(u64::from(e.file_type))
                        .expected(u64::from(ft)),
                    );
                }
                if child.is_dir() {
                    subdirs += 1;
                    if !dirs_seen.insert(child.nid) {
                        let first = found
                            .get(&child.nid)
                            .and_then(|f| f.paths.first().cloned())
                            .unwrap_or_default();
                        problems.push(
                            Problem::new(
                                &cpath,
                                "DirectoryLoop",
                                format!("directory reached twice (a cycle or a hard-linked directory; first seen at {first})"),
                            )
                            .nid(child.nid)
                            .value(dir.nid),
                        );
                        continue;
                    }
                    if depth + 1 > ferofs_reader::dir::MAX_DEPTH {
                        problems.push(
                            Problem::new(
                                &cpath,
                                "TooDeep",
                                "directory tree too deep; subtree not checked",
                            )
                            .nid(child.nid)
                            .value((depth + 1) as u64),
                        );
                        continue;
                    }
                    found.insert(
                        child.nid,
                        Found {
                            ino: child.clone(),
                            paths: vec![cpath.clone()],
                        },
                    );
                    stack.push((child, cpath, Some(dir.nid), depth + 1));
                } else {
                    found
                        .entry(child.nid)
                        .or_insert_with(|| Found {
                            ino: child,
                            paths: vec![],
                        })
                        .paths
                        .push(cpath);
                }
            }
        }
        if !complete {
            walk_incomplete = true;
        }
        if complete {
            if !saw_dot && !dir.dot_omitted {
                problems.push(
                    Problem::new(&dpath, "BadDot", "directory has no \".\" entry").nid(dir.nid),
                );
            }
            if !saw_dotdot {
                let p =
                    Problem::new(&dpath, "BadDotDot", "directory has no \"..\" entry").nid(dir.nid);
                problems.push(match parent {
                    Some(n) => p.expected(n),
                    None => p,
                });
            }
            let want = subdirs.saturating_add(2);
            if u64::from(dir.nlink) != want {
                problems.push(
                    Problem::new(
                        &dpath,
                        "BadNlink",
                        "directory nlink is not 2 + its subdirectories",
                    )
                    .nid(dir.nid)
                    .value(u64::from(dir.nlink))
                    .expected(want),
                );
            }
        }
    }
    // nlink of everything else: the names found.
    // A subtree sees only some names of a file: then only more names than links
    // is wrong.
    for f in found.values() {
        let names = f.paths.len() as u64;
        let bad = match scope {
            None => u64::from(f.ino.nlink) != names,
            Some(_) => u64::from(f.ino.nlink) < names,
        };
        if !f.ino.is_dir() && bad {
            problems.push(Problem {
                paths: f.paths.clone(),
                kind: "BadNlink".into(),
                what: if walk_incomplete {
                    "nlink differs from the number of names found (some directories could not be read completely)".into()
                } else {
                    "nlink differs from the number of names found".into()
                },
                nid: Some(f.ino.nid),
                offset: None,
                value: Some(u64::from(f.ino.nlink)),
                expected: Some(f.paths.len() as u64),
            });
        }
    }
    // The packed inode (fragments) holds data too.
    let sb = img.superblock();
    if scope.is_none() && sb.has_incompat(INCOMPAT_FRAGMENTS) && sb.packed_nid != 0 {
        match img.inode(sb.packed_nid) {
            Ok(ino) => {
                found.entry(ino.nid).or_insert(Found {
                    ino,
                    paths: vec!["(packed inode)".into()],
                });
            }
            Err(e) => problems.push(Problem::from_error(
                &["(packed inode)".into()],
                sb.packed_nid,
                &e,
                "packed inode unreadable",
            )),
        }
    }

    // ---- Phase 2: every inode, in parallel.
    let mut items: Vec<Found> = found.into_values().collect();
    items.sort_by_key(|f| f.ino.nid);
    summary.inodes = items.len() as u64;
    let results: Vec<InodeResult> = items
        .par_iter()
        .map_init(
            || (vec![0u8; 1 << 20], ReadCtx::new()),
            |(buf, ctx), f| check_inode(img, image_len, f, buf, ctx),
        )
        .collect();
    let mut ranges: Vec<DataRange> = Vec::new();
    let mut records: Vec<(u64, u64, u64)> = Vec::new();
    for r in results {
        problems.extend(r.probs);
        ranges.extend(r.ranges);
        records.extend(r.record);
        summary.bytes_read += r.read;
        summary.hole_bytes += r.holes;
        summary.metabox_mixed_xattrs += u64::from(r.mixed);
        summary.fingerprints_unverified += u64::from(r.unverified);
    }

    let watched = owners(&ranges, &items, watch);
    // ---- Phase 3: no two inodes claim the same bytes (unless identical ranges).
    summary.ranges = ranges.len() as u64;
    if img.superblock().extra_devices == 0 {
        problems.extend(overlaps(ranges, records, &items));
    }
    if problems.len() > MAX_PROBLEMS {
        problems.truncate(MAX_PROBLEMS);
        summary.truncated = true;
    }
    Report {
        problems,
        summary,
        watched,
    }
}

/// The paths of the inodes whose data ranges meet each of `watch` (sorted, not
/// overlapping byte ranges).
fn owners(ranges: &[DataRange], items: &[Found], watch: &[(u64, u64)]) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); watch.len()];
    if watch.is_empty() {
        return out;
    }
    for &(s, e, nid, _) in ranges {
        let first = watch.partition_point(|&(_, we)| we <= s);
        for (i, &(ws, _)) in watch.iter().enumerate().skip(first) {
            if ws >= e {
                break;
            }
            if let Some(f) = items
                .binary_search_by_key(&nid, |f| f.ino.nid)
                .ok()
                .and_then(|i| items.get(i))
            {
                out[i].extend(f.paths.iter().cloned());
            }
        }
    }
    for o in &mut out {
        o.sort();
        o.dedup();
    }
    out
}

/// xattrs, mapping, every byte, past-the-end. Returns problems, byte ranges
/// (start, end, nid) and bytes read.
fn check_inode(
    img: &Image,
    image_len: u64,
    f: &Found,
    buf: &mut [u8],
    ctx: &mut ReadCtx,
) -> InodeResult {
    let ino = &f.ino;
    let mut probs = Vec::new();
    let mut ranges = Vec::new();
    let mut mixed = false;
    match img.xattrs(ino) {
        Err(e) => probs.push(Problem::from_error(
            &f.paths,
            ino.nid,
            &e,
            "xattrs unreadable",
        )),
        // Shared ids are only worth reading for a metabox inode with xattrs.
        Ok(all) if !all.is_empty() && ino.nid & (1 << 63) != 0 => {
            let shared = img.xattr_shared_ids(ino).map_or(0, |ids| ids.len());
            mixed = shared > 0 && all.len() > shared;
        }
        Ok(_) => {}
    }
    match img.extents(ino) {
        Ok(ext) => {
            for x in ext {
                let Some(p) = x.physical else { continue };
                if x.stored == 0 {
                    continue;
                }
                match p.checked_add(x.stored) {
                    Some(end) if end <= image_len => {
                        let blocks = x.kind == "plain" && p % u64::from(img.block_size()) == 0;
                        ranges.push((p, end, ino.nid, blocks));
                    }
                    _ => probs.push(
                        Problem {
                            paths: f.paths.clone(),
                            kind: "PastEnd".into(),
                            what: format!(
                                "data at logical {} points past the end of the image",
                                x.logical
                            ),
                            nid: Some(ino.nid),
                            offset: Some(p),
                            value: Some(x.stored),
                            expected: None,
                        }
                        .expected(image_len),
                    ),
                }
            }
        }
        Err(e) => probs.push(Problem::from_error(
            &f.paths,
            ino.nid,
            &e,
            "data mapping (block map / compressed index) is corrupt",
        )),
    }
    let mut read = 0u64;
    let mut holes = 0u64;
    let mut unverified = false;
    if ino.is_symlink() {
        match img.read_link(ino) {
            Ok(_) => {}
            Err(e) => probs.push(Problem::from_error(
                &f.paths,
                ino.nid,
                &e,
                "symlink target unreadable",
            )),
        }
    } else if ino.is_regular() {
        // A content fingerprint (`--xattr-inode-digest`) is checked against the data.
        let fingerprint = match img.fingerprint(ino) {
            Ok(f) => f.filter(|_| ino.size > 0),
            Err(e) => {
                probs.push(Problem::from_error(
                    &f.paths,
                    ino.nid,
                    &e,
                    "content fingerprint unreadable",
                ));
                None
            }
        };
        // Too many holes to hash their zeros: the fingerprint is not checked (found
        // from the map alone, before any hashing).
        unverified =
            fingerprint.is_some() && !hole_bytes_at_most(img, ctx, ino, MAX_FINGERPRINT_HOLES);
        let fingerprint = fingerprint.filter(|_| !unverified);
        let mut hash = fingerprint
            .as_ref()
            .map(|_| <sha2::Sha256 as sha2::Digest>::new());
        // Bounded: every turn advances by n > 0 bytes up to the size.
        while read < ino.size {
            // A hole holds no bytes to verify (its mapping was checked above): skipped,
            // so that a file of terabytes of holes costs its map, not its size. A
            // fingerprint needs its zeros (at most MAX_FINGERPRINT_HOLES of them, by
            // the map walk above). (An error is left to the read below.)
            if let Ok(Some(end)) = img.hole_end(ctx, ino, read) {
                if let Some(h) = hash.as_mut() {
                    ferofs_builder::fsverity::hash_zeros(h, end - read);
                }
                holes += end - read;
                read = end;
                continue;
            }
            match img.read_at_with(ctx, ino, read, buf) {
                Ok(0) => {
                    let e = Error::short_read(ino.nid, read, ino.size);
                    probs.push(Problem::from_error(
                        &f.paths,
                        ino.nid,
                        &e,
                        "file data unreadable",
                    ));
                    break;
                }
                Ok(n) => {
                    if let Some(h) = hash.as_mut() {
                        sha2::Digest::update(h, &buf[..n]);
                    }
                    read += n as u64;
                }
                Err(e) => {
                    probs.push(Problem::from_error(
                        &f.paths,
                        ino.nid,
                        &e,
                        &format!("file data unreadable from byte {read}"),
                    ));
                    hash = None;
                    break;
                }
            }
        }
        if let (Some(want), Some(h)) = (fingerprint, hash.filter(|_| read == ino.size)) {
            let got = [&b"sha256:"[..], &sha2::Digest::finalize(h)].concat();
            if got != want {
                let show = |v: &[u8]| match v.strip_prefix(b"sha256:") {
                    Some(d) => format!("sha256:{}", crate::fmt::hex(d)),
                    None => crate::fmt::bytes_display(v),
                };
                probs.push(Problem {
                    paths: f.paths.clone(),
                    kind: "Fingerprint".into(),
                    what: format!(
                        "content fingerprint {} is not the data's {}",
                        show(&want),
                        show(&got)
                    ),
                    nid: Some(ino.nid),
                    offset: None,
                    value: None,
                    expected: None,
                });
            }
        }
    }
    InodeResult {
        probs,
        ranges,
        record: img.inode_record(ino).map(|(s, e)| (s, e, ino.nid)),
        read,
        holes,
        mixed,
        unverified,
    }
}

/// Partial overlaps between byte ranges of different inodes, and between data and
/// inode records (core and inline xattrs) or two records. Identical data ranges are
/// sharing (dedupe) and allowed, and so are overlaps between block-aligned ranges of
/// uncompressed blocks (block dedupe); overlaps within one inode's data too.
/// Memory: the range vectors only (32 bytes a range), sorted in place.
fn overlaps(
    mut ranges: Vec<DataRange>,
    records: Vec<(u64, u64, u64)>,
    items: &[Found],
) -> Vec<Problem> {
    ranges.sort_unstable();
    ranges.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    // (start, end, nid, is a record, uncompressed blocks), by start.
    let mut all: Vec<(u64, u64, u64, bool, bool)> = ranges
        .into_iter()
        .map(|(s, e, n, b)| (s, e, n, false, b))
        .chain(records.into_iter().map(|(s, e, n)| (s, e, n, true, false)))
        .collect();
    all.sort_unstable();
    let paths_of = |nid: u64| -> Vec<String> {
        items
            .binary_search_by_key(&nid, |f| f.ino.nid)
            .ok()
            .and_then(|i| items.get(i))
            .map(|f| f.paths.clone())
            .unwrap_or_default()
    };
    let what = |rec: bool| if rec { "inode record" } else { "data" };
    let mut out = Vec::new();
    // The range reaching furthest so far: (end, start, nid, is a record, blocks).
    let mut reach: Option<(u64, u64, u64, bool, bool)> = None;
    for &(s, e, nid, rec, blocks) in &all {
        if let Some((rend, rstart, rnid, rrec, rblocks)) = reach {
            if s < rend
                && (rnid != nid || rec != rrec)
                && !(blocks && rblocks)
                && out.len() < MAX_PROBLEMS
            {
                let p = Problem {
                    paths: paths_of(nid),
                    kind: if rec || rrec {
                        "MetaOverlap"
                    } else {
                        "BlockOverlap"
                    }
                    .into(),
                    what: format!(
                        "{} bytes {s}..{e} overlap {} bytes {rstart}..{rend} of nid {rnid} ({})",
                        what(rec),
                        what(rrec),
                        paths_of(rnid).join(", ")
                    ),
                    nid: Some(nid),
                    offset: Some(s),
                    value: Some(e - s),
                    expected: None,
                };
                out.push(p);
            }
            if e > rend {
                reach = Some((e, s, nid, rec, blocks));
            }
        } else {
            reach = Some((e, s, nid, rec, blocks));
        }
    }
    out
}

/// `--verity`: what the tree check found.
struct VerityCheck {
    root: Vec<u8>,
    hash_offset: u64,
    report: ferofs_builder::verity::VerifyReport,
}

/// Where `build --verity` put the verity superblock: the end of the EROFS image (its
/// superblock's block count), rounded up to 4096. Read raw, so a damaged image still
/// gets its tree checked.
fn verity_offset(f: &crate::source::Src) -> Result<u64> {
    use ferofs_format::sb::{Superblock, MAGIC, SB_MAX_SIZE, SB_OFFSET};
    let mut b = [0u8; SB_MAX_SIZE];
    f.read_exact_at(&mut b, SB_OFFSET)
        .map_err(|e| anyhow::anyhow!("reading the superblock: {e}"))?;
    let sb = Superblock::parse(&b);
    if sb.magic != MAGIC || !(9..=12).contains(&sb.blkszbits) {
        anyhow::bail!("no EROFS superblock to find the verity tree by: give --verity-hash-offset");
    }
    let (_, blocks) = sb.root_nid_and_blocks();
    let end = blocks << sb.blkszbits;
    Ok(end.div_ceil(4096) * 4096)
}

fn verity_check(a: &CheckArgs, root: &str) -> Result<VerityCheck> {
    let root = crate::build::parse_hex("--verity", root)?;
    if root.len() != ferofs_builder::verity::DIGEST {
        anyhow::bail!(
            "--verity: a root hash is {} hex digits (sha256), got {}",
            2 * ferofs_builder::verity::DIGEST,
            2 * root.len()
        );
    }
    let f = crate::source::open_src(&a.image)?;
    let hash_offset = match a.verity_hash_offset {
        Some(o) => o,
        None => verity_offset(&f)?,
    };
    let report = ferofs_builder::verity::verify(&f, hash_offset, &root, MAX_PROBLEMS)
        .map_err(|e| anyhow::anyhow!("--verity: {e}"))?;
    Ok(VerityCheck {
        root,
        hash_offset,
        report,
    })
}

/// The tree check's mismatches as problems; data blocks name the paths in `owners`
/// (one list a bad data block, in order).
fn verity_problems(v: &VerityCheck, owners: &[Vec<String>]) -> Vec<Problem> {
    use ferofs_builder::verity::{Mismatch, BLOCK};
    let tree = || vec!["(verity tree)".to_string()];
    let tree_at = v.hash_offset + BLOCK;
    let mut data = 0;
    v.report
        .mismatches
        .iter()
        .map(|m| match *m {
            Mismatch::DataBlock { block } => {
                let paths = owners.get(data).cloned().unwrap_or_default();
                data += 1;
                let start = block * BLOCK;
                let whose = if paths.is_empty() {
                    " (no file's data: metadata, or free space)"
                } else {
                    ""
                };
                Problem {
                    paths,
                    kind: "VerityDataBlock".into(),
                    what: format!(
                        "data block {block} (bytes {start}..{}) does not match its hash in the verity tree{whose}",
                        start + BLOCK
                    ),
                    nid: None,
                    offset: Some(start),
                    value: Some(block),
                    expected: None,
                }
            }
            Mismatch::HashBlock { level, index } => Problem {
                paths: tree(),
                kind: "VerityHashBlock".into(),
                what: format!(
                    "hash block {index} of level {level} does not match its hash one level up"
                ),
                nid: None,
                offset: None,
                value: Some(index),
                expected: None,
            },
            Mismatch::Root => Problem {
                paths: tree(),
                kind: "VerityRootHash".into(),
                what: format!(
                    "the tree's top does not give the root hash {} (a wrong root hash, or the tree was changed)",
                    crate::fmt::hex(&v.root)
                ),
                nid: None,
                offset: Some(tree_at),
                value: None,
                expected: None,
            },
            Mismatch::Padding { level, index } => Problem {
                paths: tree(),
                kind: "VerityPadding".into(),
                what: format!("hash block {index} of level {level} has bytes after its hashes"),
                nid: None,
                offset: None,
                value: Some(index),
                expected: None,
            },
        })
        .collect()
}

/// `ferofs check`: Ok(true) when clean, Ok(false) when problems were found, Err when
/// the image cannot be opened at all.
pub fn run(a: CheckArgs) -> Result<bool> {
    // The tree first: it needs no more than the superblock's block count.
    let verity = match &a.verity {
        Some(root) => Some(verity_check(&a, root)?),
        None => None,
    };
    let bad_blocks: Vec<(u64, u64)> = verity.as_ref().map_or_else(Vec::new, |v| {
        v.report
            .mismatches
            .iter()
            .filter_map(|m| match m {
                ferofs_builder::verity::Mismatch::DataBlock { block } => Some((
                    block * ferofs_builder::verity::BLOCK,
                    (block + 1) * ferofs_builder::verity::BLOCK,
                )),
                _ => None,
            })
            .collect()
    });
    let (img, mut problems) = match open_for_check(&a.image) {
        Ok((img, p)) if a.no_sb_checksum => (
            img,
            p.into_iter()
                .filter(|p| p.paths != ["(superblock)"])
                .collect(),
        ),
        Ok(x) => x,
        Err(e) => {
            if let Some(v) = &verity {
                // What the tree says is worth seeing even when the image is unreadable.
                for p in verity_problems(v, &[]) {
                    println!("{}", p.line());
                }
            }
            return Err(crate::source::cannot_open(&a.image, e));
        }
    };
    let image_len = img.source().size()?;
    // Extra devices the image's data may be on, neither given nor behind it.
    let bs = u64::from(img.block_size());
    let devices_end = img
        .device_slots()
        .iter()
        .map(|d| d.uniaddr().saturating_add(d.blocks()).saturating_mul(bs))
        .max()
        .unwrap_or(0);
    if devices_end > image_len && !crate::source::has_devices() {
        // A merged layer's slot is tagged with the layer's UUID: name it.
        let tags: Vec<String> = img
            .device_slots()
            .iter()
            .enumerate()
            .filter_map(|(k, d)| {
                let tag = std::str::from_utf8(d.tag_bytes()).ok()?;
                (!tag.is_empty()).then(|| format!("device {}: tag {tag}", k + 1))
            })
            .collect();
        eprintln!(
            "note: the image has {} extra device(s) (data stored elsewhere: a --blobdev blob, the tar of a tar index, merged layers{}); give them with --device FILE",
            img.device_slots().len(),
            if tags.is_empty() {
                String::new()
            } else {
                format!(": {}", tags.join(", "))
            }
        );
    }
    let scope = scope_of(&img, &a)?;
    let rep = check_image(&img, image_len, a.verbose, &bad_blocks, scope.as_ref());
    if let Some(v) = &verity {
        problems.extend(verity_problems(v, &rep.watched));
    }
    problems.extend(rep.problems);
    let mut s = rep.summary;
    if verity.as_ref().is_some_and(|v| v.report.more > 0) {
        s.truncated = true;
    }
    let ratio = a.ratio.then(|| compression_blocks(&img, scope.as_ref()));
    let percent = |(l, p): (u64, u64)| {
        if l == 0 {
            0.0
        } else {
            p as f64 * 100.0 / l as f64
        }
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        let v = json!({
            "compression": ratio.map(|r| json!({
                "logical_blocks": r.0,
                "physical_blocks": r.1,
                "ratio_percent": percent(r),
            })),
            "image": a.image.display().to_string(),
            "clean": problems.is_empty(),
            "problems": problems.iter().map(Problem::to_json).collect::<Vec<_>>(),
            "summary": {
                "problems": problems.len(),
                "truncated": s.truncated,
                "directories": s.directories,
                "entries": s.entries,
                "inodes": s.inodes,
                "bytes_read": s.bytes_read,
                "hole_bytes": s.hole_bytes,
                "data_ranges": s.ranges,
                "metabox_mixed_xattrs": s.metabox_mixed_xattrs,
                "fingerprints_unverified": s.fingerprints_unverified,
                "verity": verity.as_ref().map(|v| json!({
                    "root_hash": crate::fmt::hex(&v.root),
                    "hash_offset": v.hash_offset,
                    "data_blocks": v.report.data_blocks,
                    "hash_blocks": v.report.hash_blocks,
                    "levels": v.report.levels,
                    "mismatches": v.report.mismatches.len() as u64 + v.report.more,
                })),
            },
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        for p in &problems {
            writeln!(out, "{}", p.line())?;
        }
        if s.metabox_mixed_xattrs > 0 {
            writeln!(
                out,
                "note: {} inode{} in the metabox {} inline and shared xattrs: valid, but Linux \
                 6.17-6.18 and erofsfuse 1.9.3 can miss the shared ones (ferofs reads them; \
                 `ferofs build IMAGE NEW` writes an image without such inodes)",
                s.metabox_mixed_xattrs,
                if s.metabox_mixed_xattrs == 1 { "" } else { "s" },
                if s.metabox_mixed_xattrs == 1 {
                    "has"
                } else {
                    "have"
                },
            )?;
        }
        if s.fingerprints_unverified > 0 {
            writeln!(
                out,
                "note: {} content fingerprint{} not checked: {} more than {} GiB of holes",
                s.fingerprints_unverified,
                if s.fingerprints_unverified == 1 {
                    ""
                } else {
                    "s"
                },
                if s.fingerprints_unverified == 1 {
                    "its file has"
                } else {
                    "their files have"
                },
                MAX_FINGERPRINT_HOLES >> 30,
            )?;
        }
        let tree = verity.as_ref().map_or(String::new(), |v| {
            let bad = v.report.mismatches.len() as u64 + v.report.more;
            format!(
                "; verity: {} data blocks and {} hash blocks against root hash {}, {}",
                v.report.data_blocks,
                v.report.hash_blocks,
                crate::fmt::hex(&v.root),
                if bad == 0 {
                    "all match".to_string()
                } else {
                    format!("{bad} mismatch{}", if bad == 1 { "" } else { "es" })
                }
            )
        });
        writeln!(
            out,
            "{}: {} problem{}{}; {} directories, {} entries, {} inodes, {} bytes of data read{}{tree}",
            if problems.is_empty() {
                "clean"
            } else {
                "CORRUPT"
            },
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            if s.truncated {
                " (stopped early: too many)"
            } else {
                ""
            },
            s.directories,
            s.entries,
            s.inodes,
            s.bytes_read,
            match s.hole_bytes {
                0 => String::new(),
                h => format!(" ({h} in holes)"),
            }
        )?;
        if let Some(r) = ratio {
            writeln!(
                out,
                "Compression ratio: {:.2}(%): {} blocks stored for {} blocks of file data",
                percent(r),
                r.1,
                r.0
            )?;
        }
    }
    Ok(problems.is_empty())
}
