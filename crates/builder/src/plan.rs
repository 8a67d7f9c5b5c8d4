//! Stage 2, plan: how every inode will be stored, decided from the tree and the options
//! before any data is written — the time policy, each inode's version (compact or
//! extended), the xattr plan, directory contents and sizes, which tails may go inline
//! behind the inode, and where block 0 ends (superblock and compression configs).

use crate::dir::{self, DirPlan};
use crate::options::*;
use crate::sb::ComprCfg;
use crate::scan::{InodeId, Kind, Tree};
use crate::xattrs::{self, XattrPlan};
use ferofs_format::inode::{xattr_icount_for, COMPACT_SIZE, EXTENDED_SIZE};
use std::os::unix::ffi::OsStrExt;

/// Everything later stages need to know about the inodes that does not depend on where
/// data or metadata goes.
pub struct Plan {
    /// log2 of the block size.
    pub bits: u8,
    /// Block size in bytes.
    pub bs: u64,
    pub build_time: i64,
    /// The superblock's epoch: compact inodes store mtime as seconds from it. The build
    /// time itself, except in the 48-bit layout, where it lies up to 2^32-1 s before
    /// the build time (as mkfs.erofs sets it), so older files' inodes can be compact.
    pub epoch: i64,
    /// The 48-bit layout (`-E 48bit`, `-m`, `-E dot-omitted`).
    pub layout48: bool,
    /// Directories store no "." entry (`-E dot-omitted`).
    pub dot_omitted: bool,
    pub xattrs: XattrPlan,
    /// Per inode: an extended (64-byte) core instead of a compact (32-byte) one.
    pub extended: Vec<bool>,
    /// Per inode: i_size (file size, directory size, symlink target length; 0 else).
    pub sizes: Vec<u64>,
    /// Per inode: the directory's content (None for other inodes).
    pub dirs: Vec<Option<DirPlan>>,
    /// Per inode: a directory or symlink whose last partial block goes behind the inode.
    pub content_inline: Vec<bool>,
    /// Compression config records behind the superblock.
    pub cfg: ComprCfg,
    /// First block after block 0's superblock and records: the data region starts here.
    pub first_blk: u64,
    /// Where the long-prefix table went into the packed inode's data (set once that
    /// is laid out; None: it is plain, behind the superblock).
    pub prefixes_in_packed: Option<u64>,
    /// Regular files' tails may go inline (`-E noinline_data` turns this off).
    inline_data: bool,
    /// Inode serial numbers (`i_ino`) count from this plus one (an in-place append
    /// numbers its inodes after the image's).
    pub ino_base: u32,
}

impl Plan {
    /// Bytes the inode takes before anything layout-specific: core and xattrs.
    pub fn fixed_meta(&self, id: InodeId) -> u64 {
        let core = if self.extended[id] {
            EXTENDED_SIZE
        } else {
            COMPACT_SIZE
        };
        core as u64 + self.xattrs.ibody[id].len() as u64
    }

    /// Whether the tail of regular file `id` of `size` bytes goes behind its inode.
    pub fn inline_tail(&self, id: InodeId, size: u64) -> bool {
        let tail = size % self.bs;
        // Inode, xattrs and tail in one block. (The kernel would also accept an inode
        // crossing into the tail's block, as mkfs.erofs sometimes writes; measured on
        // the linux tree, inlining those big tails cost more metadata blocks than it
        // saved data blocks.)
        self.inline_data && tail != 0 && self.fixed_meta(id) + tail <= self.bs
    }

    /// Directories and symlinks: the last partial block goes inline whenever it fits
    /// behind the inode's core and xattrs (regardless of -E noinline_data, like mkfs).
    /// Decided again by whoever changes an xattr area after planning.
    pub fn decide_content_inline(&mut self, tree: &Tree) {
        let bs = self.bs;
        self.content_inline = tree
            .nodes
            .iter()
            .enumerate()
            .map(|(id, nd)| {
                let tail = self.sizes[id] % bs;
                matches!(nd.kind, Kind::Dir { .. } | Kind::Symlink { .. })
                    && tail != 0
                    && self.fixed_meta(id) + tail <= bs
            })
            .collect();
    }

    /// Set the size of regular file `id` (the packed inode, known after the data).
    pub fn set_file_size(&mut self, id: InodeId, size: u64) {
        self.sizes[id] = size;
        if size > u64::from(u32::MAX) {
            self.extended[id] = true;
        }
    }

    /// Blocks the shared xattr area takes.
    pub fn shared_xattr_blocks(&self) -> u64 {
        (self.xattrs.shared_area.len() as u64).div_ceil(self.bs)
    }
}

/// Add the packed inode to `tree` (its size is set once the fragments are known): a
/// regular file owned by root, mode 0600, linked from no directory, numbered last.
pub fn add_packed_inode(tree: &mut Tree, build_time: i64) {
    tree.nodes.push(crate::scan::Node::internal_file(
        std::path::PathBuf::new(),
        0,
        0o100600,
        build_time,
        b"(packed inode)",
    ));
    tree.packed = Some(tree.nodes.len() - 1);
}

/// Add `--uid-offset` / `--gid-offset` to every inode's owner; an id pushed past
/// 2^32-1 is an error naming the path.
pub fn apply_owner_offsets(tree: &mut Tree, o: &BuildOptions) -> Result<()> {
    if o.uid_offset == 0 && o.gid_offset == 0 {
        return Ok(());
    }
    for n in &mut tree.nodes {
        match (
            n.uid.checked_add(o.uid_offset),
            n.gid.checked_add(o.gid_offset),
        ) {
            (Some(u), Some(g)) => (n.uid, n.gid) = (u, g),
            _ => {
                return Err(BuildError::Invalid {
                    path: std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&n.rel)),
                    what: format!(
                        "uid {} + {} or gid {} + {} is past 4294967295",
                        n.uid, o.uid_offset, n.gid, o.gid_offset
                    ),
                })
            }
        }
    }
    Ok(())
}

/// Apply the time policy to `tree` (doc: -T, SOURCE_DATE_EPOCH, --ignore-mtime) and
/// return the build time.
///
/// Without `-T` or `SOURCE_DATE_EPOCH` the build time is taken from the tree, so that
/// the same tree gives the same image. Outside the 48-bit layout it is also the mtime of
/// every compact (32-byte) inode, so it is the most common whole-second mtime (ties: the
/// newest of them): a tree unpacked from a tar or packages, where most entries share
/// one time, then gets compact inodes for those (the linux tree: 83,121 of 83,731
/// entries, 32 bytes each). In the 48-bit layout compact inodes store mtimes up to
/// 2^32-1 s before the build time, so it is the newest mtime; likewise with
/// `--ignore-mtime`, and when no mtime is in whole seconds.
pub fn apply_time_policy(tree: &mut Tree, o: &BuildOptions) -> i64 {
    let build_time = o.timestamp.or(o.source_date_epoch).unwrap_or_else(|| {
        let common = if o.layout48() || o.ignore_mtime {
            None
        } else {
            most_common_whole_second(tree)
        };
        common.unwrap_or_else(|| tree.nodes.iter().map(|n| n.mtime).max().unwrap_or(0))
    });
    for n in &mut tree.nodes {
        if let Some(t) = o.timestamp.filter(|_| !o.timestamp_build_only) {
            n.mtime = t;
            n.mtime_nsec = 0;
        } else if let Some(sde) = o.source_date_epoch {
            if n.mtime > sde {
                n.mtime = sde;
                n.mtime_nsec = 0;
            }
        }
        if o.ignore_mtime {
            n.mtime = build_time;
            n.mtime_nsec = 0;
        }
    }
    if o.inode_version == InodeVersion::Compact && o.layout48() {
        // `-E force-inode-compact` in the 48-bit layout: every mtime to the second, and
        // into the 2^32 s a compact inode reaches (see `plan`); outside the layout the
        // option implies --ignore-mtime instead.
        let epoch = epoch48(build_time);
        let last = epoch.saturating_add(i64::from(u32::MAX));
        for n in &mut tree.nodes {
            n.mtime = n.mtime.clamp(epoch, last);
            n.mtime_nsec = 0;
        }
    }
    build_time
}

/// The 48-bit layout's epoch for `build_time`: compact inodes hold mtimes from it up to
/// 2^32-1 s after it, so it lies that far before the build time (never before 1970 nor
/// after the build time: the superblock's fields are unsigned).
fn epoch48(build_time: i64) -> i64 {
    build_time
        .saturating_sub(i64::from(u32::MAX))
        .max(0)
        .min(build_time)
}

/// The mtime in whole seconds that most inodes of `tree` have; ties go to the newest.
fn most_common_whole_second(tree: &Tree) -> Option<i64> {
    let mut times: Vec<i64> = tree
        .nodes
        .iter()
        .filter(|n| n.mtime_nsec == 0)
        .map(|n| n.mtime)
        .collect();
    times.sort_unstable();
    let mut best: Option<(usize, i64)> = None;
    for run in times.chunk_by(|a, b| a == b) {
        // `>=`: a later run of equal length wins (the newer time).
        if best.is_none_or(|(count, _)| run.len() >= count) {
            best = Some((run.len(), run[0]));
        }
    }
    best.map(|(_, t)| t)
}

/// Plan `tree` (its times already set by [`apply_time_policy`]).
pub fn plan(tree: &Tree, build_time: i64, o: &BuildOptions) -> Result<Plan> {
    plan_with(tree, build_time, o, true)
}

/// [`plan`] for an in-place append: no shared xattrs (the image's shared area stays
/// as it is), the epoch `build_time` (the image's).
pub(crate) fn plan_unshared(tree: &Tree, build_time: i64, o: &BuildOptions) -> Result<Plan> {
    plan_with(tree, build_time, o, false)
}

fn plan_with(tree: &Tree, build_time: i64, o: &BuildOptions, share: bool) -> Result<Plan> {
    let bits = o.block_size.trailing_zeros() as u8;
    let bs = u64::from(o.block_size);
    let cfg = ComprCfg::new(o, &tree.devices);
    let mut xattrs = xattrs::plan_with(tree, o.metabox, &cfg.prefixes, share);
    xattrs::reserve_root(&mut xattrs, tree.root, o.root_xattr_isize);
    // Inode versions: compact only when every value fits and the mtime is the one a
    // compact inode shows: the build time, or (48-bit layout, Linux 6.15+) any mtime of
    // whole seconds from the epoch up to 2^32-1 s after it (the superblock's
    // `fixed_nsec` is 0). Never a wrapped or rounded mtime, unlike mkfs.erofs 1.9.3.
    let layout48 = o.layout48();
    let epoch = if layout48 {
        epoch48(build_time)
    } else {
        build_time
    };
    // How far after the epoch a compact inode's mtime may lie (without the layout the
    // epoch is the build time and only it fits).
    let reach = if layout48 { i64::from(u32::MAX) } else { 0 };
    let mtime_fits = |mtime: i64| {
        mtime
            .checked_sub(epoch)
            .is_some_and(|d| (0..=reach).contains(&d))
    };
    let extended: Vec<bool> = tree
        .nodes
        .iter()
        .map(|nd| {
            let size = match &nd.kind {
                Kind::File { size, .. } => *size,
                _ => 0,
            };
            o.inode_version == InodeVersion::Extended
                || size > u64::from(u32::MAX)
                || nd.uid > 0xFFFF
                || nd.gid > 0xFFFF
                || nd.nlink > 0xFFFF
                || !mtime_fits(nd.mtime)
                || nd.mtime_nsec != 0
        })
        .collect();
    if o.inode_version == InodeVersion::Compact {
        if let Some(id) = extended.iter().position(|&e| e) {
            let nd = &tree.nodes[id];
            return Err(BuildError::Invalid {
                path: match nd.rel.is_empty() {
                    true => ".".into(),
                    false => std::ffi::OsStr::from_bytes(&nd.rel).into(),
                },
                what: "cannot be stored in a compact inode (-E force-inode-compact): it needs \
                       a size past 4 GiB, an id or link count past 65535, or its own mtime"
                    .into(),
            });
        }
    }
    for (id, area) in xattrs.ibody.iter().enumerate() {
        if xattr_icount_for(area.len()).is_none() {
            return Err(BuildError::Invalid {
                path: tree.nodes[id]
                    .rel
                    .iter()
                    .copied()
                    .map(char::from)
                    .collect::<String>()
                    .into(),
                what: "xattrs too large for one inode".into(),
            });
        }
    }
    let dirs: Vec<Option<DirPlan>> = (0..tree.nodes.len())
        .map(|id| dir::plan(tree, id, bs as usize, o.dot_omitted))
        .collect();
    let sizes: Vec<u64> = tree
        .nodes
        .iter()
        .zip(&dirs)
        .map(|(nd, d)| match &nd.kind {
            Kind::Dir { .. } => d.as_ref().map_or(0, |d| d.size),
            Kind::File { size, .. } => *size,
            Kind::Symlink { target } => target.len() as u64,
            _ => 0,
        })
        .collect();
    let mut p = Plan {
        bits,
        bs,
        build_time,
        epoch,
        layout48,
        dot_omitted: o.dot_omitted,
        xattrs,
        extended,
        sizes,
        dirs,
        content_inline: Vec::new(),
        first_blk: cfg.end().div_ceil(bs),
        prefixes_in_packed: None,
        cfg,
        inline_data: o.inline_data,
        ino_base: 0,
    };
    p.decide_content_inline(tree);
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::Node;

    fn node(kind: Kind, mtime: i64) -> Node {
        Node {
            kind,
            mode: 0o40755,
            uid: 0,
            gid: 0,
            mtime,
            mtime_nsec: 0,
            nlink: 1,
            xattrs: Vec::new(),
            rel: Vec::new(),
        }
    }

    /// A root holding a file, a short and a 4095-byte symlink; the file is older.
    fn tree() -> Tree {
        let root = Kind::Dir {
            entries: vec![
                (b"f".to_vec(), 1),
                (b"long".to_vec(), 3),
                (b"s".to_vec(), 2),
            ],
            parent: 0,
        };
        let file = Kind::File {
            src: crate::source::Source::Path("/nonexistent".into()),
            size: 5000,
        };
        Tree {
            nodes: vec![
                node(root, 100),
                node(file, 50),
                node(
                    Kind::Symlink {
                        target: b"target".to_vec(),
                    },
                    100,
                ),
                node(
                    Kind::Symlink {
                        target: vec![b'x'; 4095],
                    },
                    100,
                ),
            ],
            root: 0,
            packed: None,
            devices: Vec::new(),
        }
    }

    /// `t` planned with `o` after its time policy.
    fn planned(t: &mut Tree, o: &BuildOptions) -> Result<Plan> {
        let build_time = apply_time_policy(t, o);
        plan(t, build_time, o)
    }

    #[test]
    fn owner_offsets_add_and_refuse_to_wrap() {
        let mut t = tree();
        t.nodes[1].uid = 5;
        t.nodes[1].gid = 7;
        let o = BuildOptions {
            uid_offset: 100_000,
            gid_offset: 200_000,
            ..BuildOptions::default()
        };
        apply_owner_offsets(&mut t, &o).expect("offsets");
        assert_eq!((t.nodes[0].uid, t.nodes[0].gid), (100_000, 200_000));
        assert_eq!((t.nodes[1].uid, t.nodes[1].gid), (100_005, 200_007));
        let mut t = tree();
        t.nodes[2].uid = u32::MAX - 1;
        t.nodes[2].rel = b"etc/wraps".to_vec();
        let o = BuildOptions {
            uid_offset: 2,
            ..BuildOptions::default()
        };
        match apply_owner_offsets(&mut t, &o) {
            Err(BuildError::Invalid { path, what }) => {
                assert_eq!(path, std::path::Path::new("etc/wraps"));
                assert!(what.contains("4294967294 + 2"), "{what}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn versions_sizes_and_inline_decisions() -> Result<()> {
        let mut t = tree();
        let o = BuildOptions::default();
        let build_time = apply_time_policy(&mut t, &o);
        assert_eq!(build_time, 100);
        let p = plan(&t, build_time, &o)?;
        // Only the older file needs an extended inode (its mtime is not the build time).
        assert_eq!(p.extended, [false, true, false, false]);
        assert_eq!(p.fixed_meta(1), 64);
        // ".", "..", "f", "long", "s": 5 dirents of 12 bytes and 1+2+1+4+1 name bytes.
        assert_eq!(p.sizes, [69, 5000, 6, 4095]);
        // The file's 904-byte tail fits behind its 64-byte inode; the 4095-byte target
        // does not fit behind a 32-byte one.
        assert!(p.inline_tail(1, 5000));
        assert_eq!(p.content_inline, [true, false, true, false]);
        assert_eq!(p.first_blk, 1);
        let no_inline = BuildOptions {
            inline_data: false,
            ..o
        };
        assert!(!plan(&t, build_time, &no_inline)?.inline_tail(1, 5000));
        Ok(())
    }

    #[test]
    fn the_build_time_is_the_most_common_whole_second_mtime() -> Result<()> {
        // Three entries at 100 s, one at 50 s: 100 (also the newest).
        let mut t = tree();
        assert_eq!(apply_time_policy(&mut t, &BuildOptions::default()), 100);
        // Now three at 50 s and one newer at 100 s: 50, and those three are compact.
        let mut t = tree();
        t.nodes[0].mtime = 50;
        t.nodes[2].mtime = 50;
        let o = BuildOptions::default();
        let build_time = apply_time_policy(&mut t, &o);
        assert_eq!(build_time, 50);
        assert_eq!(
            plan(&t, build_time, &o)?.extended,
            [false, false, false, true]
        );
        // Times with nanoseconds do not count; a tie goes to the newer time.
        let mut t = tree();
        t.nodes[0].mtime_nsec = 7;
        t.nodes[2].mtime_nsec = 7;
        assert_eq!(apply_time_policy(&mut t, &o), 100);
        // No whole-second mtime at all: the newest.
        let mut t = tree();
        for (n, time) in t.nodes.iter_mut().zip([30, 90, 60, 10]) {
            (n.mtime, n.mtime_nsec) = (time, 1);
        }
        assert_eq!(apply_time_policy(&mut t, &o), 90);
        // The 48-bit layout and --ignore-mtime keep the newest (three at 50 s again).
        for o in [
            BuildOptions {
                layout48: true,
                ..BuildOptions::default()
            },
            BuildOptions {
                ignore_mtime: true,
                ..BuildOptions::default()
            },
        ] {
            let mut t = tree();
            t.nodes[0].mtime = 50;
            t.nodes[2].mtime = 50;
            assert_eq!(apply_time_policy(&mut t, &o), 100);
        }
        // -T and SOURCE_DATE_EPOCH win.
        let mut t = tree();
        let o = BuildOptions {
            source_date_epoch: Some(70),
            ..BuildOptions::default()
        };
        assert_eq!(apply_time_policy(&mut t, &o), 70);
        Ok(())
    }

    #[test]
    fn layout48_compact_inodes_keep_their_mtimes() -> Result<()> {
        let o = BuildOptions {
            layout48: true,
            ..BuildOptions::default()
        };
        // The file is 50 s older than the build time: compact, 50 s after epoch 0.
        let mut t = tree();
        let build_time = apply_time_policy(&mut t, &o);
        let p = plan(&t, build_time, &o)?;
        assert_eq!((p.epoch, p.layout48), (0, true));
        assert_eq!(p.extended, [false; 4]);
        // Nanoseconds, or an mtime before the epoch, need an extended inode.
        t.nodes[1].mtime_nsec = 1;
        t.nodes[2].mtime = -1;
        assert_eq!(
            plan(&t, build_time, &o)?.extended,
            [false, true, true, false]
        );
        // A build time past 2^32-1 s moves the epoch up to keep it within reach; an
        // mtime 2^32 s before the build time is out of reach.
        let late = i64::from(u32::MAX) + 1000;
        let mut t = tree();
        t.nodes[0].mtime = late;
        t.nodes[1].mtime = late - i64::from(u32::MAX);
        t.nodes[2].mtime = late - i64::from(u32::MAX) - 1;
        t.nodes[3].mtime = late;
        let p = planned(&mut t, &o)?;
        assert_eq!(p.epoch, 1000);
        assert_eq!(p.extended, [false, false, true, false]);
        // A build time before 1970: the epoch is the build time itself.
        let mut t = tree();
        for n in &mut t.nodes {
            n.mtime = -100;
        }
        let p = planned(&mut t, &o)?;
        assert_eq!(p.epoch, -100);
        assert_eq!(p.extended, [false; 4]);
        // Without the 48-bit layout the epoch is the build time (the old rule).
        let p = planned(&mut tree(), &BuildOptions::default())?;
        assert_eq!((p.epoch, p.layout48), (100, false));
        Ok(())
    }

    #[test]
    fn dot_omitted_directories_have_no_dot() -> Result<()> {
        let o = BuildOptions {
            dot_omitted: true,
            ..BuildOptions::default()
        };
        let mut t = tree();
        let p = planned(&mut t, &o)?;
        assert!(p.layout48 && p.dot_omitted);
        // "..", "f", "long", "s": 4 dirents and 2+1+4+1 name bytes.
        assert_eq!(p.sizes[0], 56);
        let names: Vec<&[u8]> = p.dirs[0]
            .as_ref()
            .map(|d| d.entries.iter().map(|e| e.0.as_slice()).collect())
            .unwrap_or_default();
        assert_eq!(names, [&b".."[..], b"f", b"long", b"s"]);
        Ok(())
    }

    #[test]
    fn ignore_mtime_makes_every_inode_compact() -> Result<()> {
        let mut t = tree();
        let o = BuildOptions {
            ignore_mtime: true,
            ..BuildOptions::default()
        };
        let build_time = apply_time_policy(&mut t, &o);
        let p = plan(&t, build_time, &o)?;
        assert_eq!(p.extended, [false; 4]);
        Ok(())
    }
}
