//! `extract`: the whole tree (or a subtree) to a directory, in parallel, with metadata.
//!
//! Order: walk the image once (metadata only), create directories, then write regular
//! files in parallel — each with one read context and buffer per thread, positional
//! writes of up to 1 MiB, holes skipped so sparse files stay sparse, and owner, xattrs,
//! mode and times set through the still-open descriptor — then symlinks, device nodes,
//! FIFOs, sockets and hardlinks, then the metadata of symlinks and special files, and of
//! directories last and deepest first, so writing into them does not disturb their
//! times or trip over their permissions.

use crate::fmt::bytes_display;
use crate::list::open;
use crate::source::Image;
use anyhow::{bail, Context, Result};
use clap::Args;
use ferofs_format::inode::*;
use ferofs_reader::{Inode, ReadCtx};
use rayon::prelude::*;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use xattr::FileExt as _;

#[derive(Args)]
pub struct ExtractArgs {
    /// The image: a file or a URL (http://, https://, s3://bucket/key).
    image: PathBuf,
    /// Output directory (created if missing; must be empty if it exists).
    out: PathBuf,
    /// Extract only this path of the image: a directory's contents go into the output
    /// directory; any other file becomes OUT when OUT is not a directory (as `cp`
    /// does, and fsck.erofs's `--extract=OUT --path=FILE`), else goes into it under
    /// its name.
    #[arg(long, default_value = "/")]
    path: String,
    /// Extract only the inode of this number (fsck.erofs's `--nid`): as `--path`;
    /// a file that is not a directory, put into an existing directory, is named by
    /// its nid there.
    #[arg(long, conflicts_with = "path")]
    nid: Option<u64>,
    /// Worker threads (0 = all cores).
    #[arg(short = 'j', long, default_value_t = 0)]
    threads: usize,
    /// Do not restore owners (uid/gid).
    #[arg(long)]
    no_owner: bool,
    /// Do not restore extended attributes.
    #[arg(long)]
    no_xattrs: bool,
    /// Extract into a non-empty directory (or over an existing file): directories
    /// there are kept, any other entry in the way is replaced (a symbolic link too,
    /// never followed); what the image does not hold is left alone.
    #[arg(long)]
    force: bool,
    /// Permission bits masked by this process's umask (as `tar` does for ordinary
    /// users; fsck.erofs's `--no-preserve-perms`), instead of restored exactly.
    #[arg(long)]
    no_same_permissions: bool,
    /// Do not verify the superblock checksum (fsck.erofs's `--no-sbcrc`).
    #[arg(long)]
    no_sb_checksum: bool,
}

struct Entry {
    rel: Vec<u8>,
    ino: Inode,
    /// For a hardlink after the first: the first path of the same inode.
    link_to: Option<Vec<u8>>,
    depth: usize,
}

fn join(base: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        base.to_path_buf()
    } else {
        base.join(OsStr::from_bytes(rel))
    }
}

pub fn run(a: ExtractArgs) -> Result<()> {
    let img = if a.no_sb_checksum {
        crate::list::open_ignoring_checksum(&a.image)?
    } else {
        open(&a.image)?
    };
    if a.threads > 0 {
        rayon::ThreadPoolBuilder::new()
            .num_threads(a.threads)
            .build_global()
            .ok();
    }
    let top = match a.nid {
        Some(n) => img.inode(n).with_context(|| format!("nid {n}"))?,
        None => img
            .lookup(a.path.as_bytes())
            .with_context(|| format!("{}: lookup failed", a.path))?,
    };
    // One file that is not a directory, to a path that is not a directory: the
    // file is written there (as cp does, and as fsck.erofs --extract=X --path=FILE).
    let as_file = !top.is_dir() && !a.out.is_dir();
    if as_file {
        if fs::symlink_metadata(&a.out).is_ok() {
            if !a.force {
                bail!("{} exists (use --force)", a.out.display());
            }
            fs::remove_file(&a.out).with_context(|| format!("remove {}", a.out.display()))?;
        }
        if let Some(parent) = a.out.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        }
    } else if a.out.exists() {
        if !a.force && fs::read_dir(&a.out)?.next().is_some() {
            bail!("{} is not empty (use --force)", a.out.display());
        }
    } else {
        fs::create_dir_all(&a.out).with_context(|| format!("create {}", a.out.display()))?;
    }

    // 1. Walk once: collect every entry, resolve hardlinks to their first path.
    let mut entries: Vec<Entry> = Vec::new();
    let mut first_path: HashMap<u64, Vec<u8>> = HashMap::new();
    if top.is_dir() {
        img.walk_from(&top, |rel, ino| {
            let rel = rel.strip_prefix(b"/").unwrap_or(rel).to_vec();
            let depth = rel.iter().filter(|&&c| c == b'/').count() + usize::from(!rel.is_empty());
            let mut link_to = None;
            if !ino.is_dir() && ino.nlink > 1 {
                match first_path.get(&ino.nid) {
                    Some(p) => link_to = Some(p.clone()),
                    None => {
                        first_path.insert(ino.nid, rel.clone());
                    }
                }
            }
            entries.push(Entry {
                rel,
                ino: ino.clone(),
                link_to,
                depth,
            });
            Ok(())
        })?;
    } else if as_file {
        entries.push(Entry {
            rel: Vec::new(),
            ino: top,
            link_to: None,
            depth: 1,
        });
    } else {
        let name = match a.nid {
            Some(n) => n.to_string().into_bytes(),
            None => a
                .path
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or("file")
                .as_bytes()
                .to_vec(),
        };
        entries.push(Entry {
            rel: name,
            ino: top,
            link_to: None,
            depth: 1,
        });
    }

    if a.no_same_permissions {
        let mask = process_umask();
        for e in &mut entries {
            if !e.ino.is_symlink() {
                e.ino.mode &= !mask;
            }
        }
    }

    // Modes are set explicitly: files are created with their final mode where possible
    // (saves a chmod each), directories 0700 until their metadata is applied at the end.
    rustix::process::umask(rustix::fs::Mode::empty());

    // 2. Directories (0700 while we fill them).
    for e in entries.iter().filter(|e| e.ino.is_dir()) {
        let p = join(&a.out, &e.rel);
        if !e.rel.is_empty() {
            let mkdir = || fs::DirBuilder::new().mode(0o700).create(&p);
            match mkdir() {
                Err(err) if a.force && err.kind() == std::io::ErrorKind::AlreadyExists => {
                    let m = fs::symlink_metadata(&p)
                        .with_context(|| format!("create directory {}", p.display()))?;
                    if m.is_dir() {
                        // Kept, writable until its metadata is applied at the end.
                        fs::set_permissions(&p, fs::Permissions::from_mode(0o700))
                    } else {
                        // A link is replaced, never followed out of the tree.
                        fs::remove_file(&p).and_then(|()| mkdir())
                    }
                }
                r => r,
            }
            .with_context(|| format!("create directory {}", p.display()))?;
        }
    }

    // 3. Regular files, in parallel: contents, then owner, xattrs, mode and times on the
    //    open descriptor (no path lookups). One read context and buffer per thread.
    let own = Ownership::probe(&a)?;
    entries
        .par_iter()
        .filter(|e| e.ino.is_regular() && e.link_to.is_none())
        .try_for_each_init(Worker::new, |w, e| w.file(&img, e, &a, own))?;

    // 4. Everything else that is not a directory.
    for e in entries.iter().filter(|e| !e.ino.is_dir()) {
        let p = join(&a.out, &e.rel);
        if let Some(target) = &e.link_to {
            replacing(&p, a.force, || fs::hard_link(join(&a.out, target), &p))
                .with_context(|| format!("hardlink {}", p.display()))?;
            continue;
        }
        match e.ino.mode & S_IFMT {
            S_IFREG => {}
            S_IFLNK => {
                let t = img.read_link(&e.ino)?;
                replacing(&p, a.force, || {
                    std::os::unix::fs::symlink(OsStr::from_bytes(&t), &p)
                })
                .with_context(|| format!("symlink {}", p.display()))?;
            }
            S_IFCHR | S_IFBLK | S_IFIFO | S_IFSOCK => {
                let (ma, mi) = e.ino.rdev_major_minor();
                let kind = match e.ino.mode & S_IFMT {
                    S_IFCHR => rustix::fs::FileType::CharacterDevice,
                    S_IFBLK => rustix::fs::FileType::BlockDevice,
                    S_IFIFO => rustix::fs::FileType::Fifo,
                    _ => rustix::fs::FileType::Socket,
                };
                replacing(&p, a.force, || {
                    rustix::fs::mknodat(
                        rustix::fs::CWD,
                        &p,
                        kind,
                        rustix::fs::Mode::from_raw_mode(0o600),
                        rustix::fs::makedev(ma, mi),
                    )
                    .map_err(std::io::Error::from)
                })
                .with_context(|| format!("mknod {}", p.display()))?;
            }
            _ => bail!(
                "{}: unknown file type {:o}",
                bytes_display(&e.rel),
                e.ino.mode
            ),
        }
    }

    // 5. Metadata of the rest (regular files have theirs): symlinks and special files
    //    in parallel, then directories deepest first.
    entries
        .par_iter()
        .filter(|e| !e.ino.is_dir() && !e.ino.is_regular() && e.link_to.is_none())
        .try_for_each(|e| apply_meta(&img, e, &a))?;
    let mut dirs: Vec<&Entry> = entries.iter().filter(|e| e.ino.is_dir()).collect();
    dirs.sort_by_key(|e| std::cmp::Reverse(e.depth));
    for e in dirs {
        apply_meta(&img, e, &a)?;
    }
    Ok(())
}

/// Creates `p` with `make`, which fails when `p` exists (the file, link and node are
/// made exclusively: an existing symbolic link is never written through). With
/// `--force` an existing non-directory there is removed and `make` tried once more, as
/// tar and `fsck.erofs --overwrite` do; a directory stays an error.
fn replacing<T>(
    p: &Path,
    force: bool,
    make: impl Fn() -> std::io::Result<T>,
) -> std::io::Result<T> {
    match make() {
        Err(e) if force && e.kind() == std::io::ErrorKind::AlreadyExists => {
            fs::remove_file(p)?;
            make()
        }
        r => r,
    }
}

/// Whether `fchown` can be skipped: a file we create already belongs to our effective
/// uid and gid unless the output directory is set-group-ID (new files and directories
/// then take its group) or `--force` keeps directories that were there (which may be
/// set-group-ID themselves).
#[derive(Clone, Copy)]
struct Ownership {
    uid: u32,
    gid: u32,
    trust_new: bool,
}

impl Ownership {
    fn probe(a: &ExtractArgs) -> Result<Self> {
        // The directory new files go into: OUT, or the one holding OUT when OUT is
        // the file itself.
        let dir = if a.out.is_dir() {
            a.out.as_path()
        } else {
            a.out
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
        };
        let m = fs::metadata(dir).with_context(|| format!("stat {}", dir.display()))?;
        Ok(Ownership {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            trust_new: !a.force && m.permissions().mode() & 0o2000 == 0,
        })
    }
    fn needs_chown(self, ino: &Inode) -> bool {
        !(self.trust_new && ino.uid == self.uid && ino.gid == self.gid)
    }
    /// Whether creating the file with its final mode is enough: a new file, no
    /// setuid/setgid/sticky bit (a later chown would clear them, and a write may), and
    /// no chown to come.
    fn mode_at_create(self, ino: &Inode, a: &ExtractArgs) -> bool {
        self.trust_new && ino.mode & 0o7000 == 0 && (a.no_owner || !self.needs_chown(ino))
    }
}

/// Largest read and write of file data.
const CHUNK: usize = 1 << 20;

/// Granularity of hole detection in written data: a file block of zeros is not written
/// (as `cp --sparse=always` does), so sparse files stay sparse even where the image
/// stores their zeros as data (mkfs.erofs compresses them).
const SPARSE_BLOCK: u64 = 4096;

/// Per-thread state of the file writers.
struct Worker {
    ctx: ReadCtx,
    buf: Vec<u8>,
}

impl Worker {
    fn new() -> Self {
        Worker {
            ctx: ReadCtx::new(),
            buf: Vec::new(),
        }
    }

    /// Write one regular file: data with positional writes (holes of the image's mapping
    /// are skipped without reading them, all-zero blocks are not written, so sparse
    /// files stay sparse; the size is set at the end), then its metadata through the
    /// descriptor.
    fn file(&mut self, img: &Image, e: &Entry, a: &ExtractArgs, own: Ownership) -> Result<()> {
        let p = join(&a.out, &e.rel);
        let ino = &e.ino;
        let direct_mode = own.mode_at_create(ino, a);
        let f = replacing(&p, a.force, || {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(if direct_mode {
                    u32::from(ino.mode & 0o777)
                } else {
                    0o600
                })
                .open(&p)
        })
        .with_context(|| format!("create {}", p.display()))?;
        let want = usize::try_from(ino.size).map_or(CHUNK, |s| s.min(CHUNK));
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        let mut off = 0u64;
        let mut written = 0u64;
        // Bounded: every iteration advances `off` by at least one byte.
        while off < ino.size {
            let hole = img
                .hole_end(&mut self.ctx, ino, off)
                .with_context(|| format!("{}: map offset {off}", p.display()))?;
            if let Some(end) = hole {
                if end <= off {
                    bail!("{}: empty hole at offset {off}", p.display());
                }
                off = end;
                continue;
            }
            let n = img
                .read_at_with(&mut self.ctx, ino, off, &mut self.buf[..want])
                .with_context(|| format!("{}: read at offset {off}", p.display()))?;
            if n == 0 {
                bail!(
                    "{}: image data ends at {off}, size is {}",
                    p.display(),
                    ino.size
                );
            }
            let end = off + n as u64;
            // Write the runs of blocks that are not all zeros, one write per run.
            let mut run: Option<usize> = None;
            let mut i = 0usize;
            // Bounded: every step moves `i` to the next block boundary or the end.
            while i <= n {
                let j = if i == n {
                    n + 1
                } else {
                    let next = ((off + i as u64) / SPARSE_BLOCK + 1) * SPARSE_BLOCK - off;
                    usize::try_from(next).map_or(n, |x| x.min(n))
                };
                let zero = i == n || self.buf[i..j].iter().all(|&b| b == 0);
                match (zero, run) {
                    (false, None) => run = Some(i),
                    (true, Some(s)) => {
                        f.write_all_at(&self.buf[s..i], off + s as u64)
                            .with_context(|| format!("write {}", p.display()))?;
                        written = off + i as u64;
                        run = None;
                    }
                    _ => {}
                }
                i = j;
            }
            off = end;
        }
        if written < ino.size {
            f.set_len(ino.size)
                .with_context(|| format!("truncate {}", p.display()))?;
        }
        let ctx = || format!("set metadata of {}", p.display());
        if !a.no_owner && own.needs_chown(ino) {
            std::os::unix::fs::fchown(&f, Some(ino.uid), Some(ino.gid)).with_context(ctx)?;
        }
        if !a.no_xattrs && ino.xattr_icount != 0 {
            for x in img.xattrs(ino)? {
                f.set_xattr(OsStr::from_bytes(&x.name), &x.value)
                    .with_context(|| {
                        format!("{}: set xattr {}", p.display(), bytes_display(&x.name))
                    })?;
            }
        }
        // After chown: chown clears setuid/setgid.
        if !direct_mode {
            f.set_permissions(fs::Permissions::from_mode(u32::from(ino.mode & 0o7777)))
                .with_context(ctx)?;
        }
        rustix::fs::futimens(&f, &timestamps(ino)).with_context(ctx)?;
        Ok(())
    }
}

fn timestamps(ino: &Inode) -> rustix::fs::Timestamps {
    // tv_nsec is not i64 on every target: keep the conversion.
    #[allow(clippy::useless_conversion)]
    let t = rustix::fs::Timespec {
        tv_sec: ino.mtime,
        tv_nsec: i64::from(ino.mtime_nsec).try_into().unwrap_or(0),
    };
    rustix::fs::Timestamps {
        last_access: t,
        last_modification: t,
    }
}

fn apply_meta(img: &Image, e: &Entry, a: &ExtractArgs) -> Result<()> {
    let p = join(&a.out, &e.rel);
    let ctx = || format!("set metadata of {}", p.display());
    let is_link = e.ino.is_symlink();
    if !a.no_owner {
        std::os::unix::fs::lchown(&p, Some(e.ino.uid), Some(e.ino.gid)).with_context(ctx)?;
    }
    if !a.no_xattrs {
        for x in img.xattrs(&e.ino)? {
            xattr::set(&p, OsStr::from_bytes(&x.name), &x.value).with_context(|| {
                format!("{}: set xattr {}", p.display(), bytes_display(&x.name))
            })?;
        }
    }
    if !is_link {
        // After chown: chown clears setuid/setgid.
        rustix::fs::chmodat(
            rustix::fs::CWD,
            &p,
            rustix::fs::Mode::from_raw_mode(u32::from(e.ino.mode & 0o7777)),
            rustix::fs::AtFlags::empty(),
        )
        .with_context(ctx)?;
    }
    rustix::fs::utimensat(
        rustix::fs::CWD,
        &p,
        &timestamps(&e.ino),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .with_context(ctx)?;
    Ok(())
}

/// This process's umask (permission bits only).
fn process_umask() -> u16 {
    let old = rustix::process::umask(rustix::fs::Mode::empty());
    rustix::process::umask(old);
    (old.bits() & 0o7777) as u16
}
