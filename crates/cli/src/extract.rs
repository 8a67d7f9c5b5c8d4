//! `extract`: the whole tree (or a subtree) to a directory, in parallel, with metadata.
//!
//! Order: walk the image once (metadata only), create directories, then write regular
//! files in parallel (holes are skipped so sparse files stay sparse), then symlinks,
//! device nodes, FIFOs, sockets and hardlinks, then apply owner, mode, xattrs and times —
//! directories last and deepest first, so writing into them does not disturb their
//! times or trip over their permissions.

use crate::fmt::bytes_display;
use crate::list::open;
use anyhow::{bail, Context, Result};
use clap::Args;
use ferofs_format::inode::*;
use ferofs_reader::{Image, Inode};
use rayon::prelude::*;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ExtractArgs {
    /// The image.
    image: PathBuf,
    /// Output directory (created if missing; must be empty if it exists).
    out: PathBuf,
    /// Extract only this path of the image.
    #[arg(long, default_value = "/")]
    path: String,
    /// Worker threads (0 = all cores).
    #[arg(short = 'j', long, default_value_t = 0)]
    threads: usize,
    /// Do not restore owners (uid/gid).
    #[arg(long)]
    no_owner: bool,
    /// Do not restore extended attributes.
    #[arg(long)]
    no_xattrs: bool,
    /// Allow extracting into a non-empty directory.
    #[arg(long)]
    force: bool,
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
    let img = open(&a.image)?;
    if a.threads > 0 {
        rayon::ThreadPoolBuilder::new()
            .num_threads(a.threads)
            .build_global()
            .ok();
    }
    let top = img
        .lookup(a.path.as_bytes())
        .with_context(|| format!("{}: lookup failed", a.path))?;
    if a.out.exists() {
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
    } else {
        let name = a
            .path
            .rsplit('/')
            .next()
            .unwrap_or("file")
            .as_bytes()
            .to_vec();
        entries.push(Entry {
            rel: name,
            ino: top,
            link_to: None,
            depth: 1,
        });
    }

    // 2. Directories (0700 while we fill them).
    for e in entries.iter().filter(|e| e.ino.is_dir()) {
        let p = join(&a.out, &e.rel);
        if !e.rel.is_empty() {
            fs::create_dir(&p).with_context(|| format!("create directory {}", p.display()))?;
        }
    }

    // 3. Regular file contents, in parallel.
    entries
        .par_iter()
        .filter(|e| e.ino.is_regular() && e.link_to.is_none())
        .try_for_each(|e| write_file(&img, &e.ino, &join(&a.out, &e.rel)))?;

    // 4. Everything else that is not a directory.
    for e in entries.iter().filter(|e| !e.ino.is_dir()) {
        let p = join(&a.out, &e.rel);
        if let Some(target) = &e.link_to {
            fs::hard_link(join(&a.out, target), &p)
                .with_context(|| format!("hardlink {}", p.display()))?;
            continue;
        }
        match e.ino.mode & S_IFMT {
            S_IFREG => {}
            S_IFLNK => {
                let t = img.read_link(&e.ino)?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&t), &p)
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
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &p,
                    kind,
                    rustix::fs::Mode::from_raw_mode(0o600),
                    rustix::fs::makedev(ma, mi),
                )
                .with_context(|| format!("mknod {}", p.display()))?;
            }
            _ => bail!(
                "{}: unknown file type {:o}",
                bytes_display(&e.rel),
                e.ino.mode
            ),
        }
    }

    // 5. Metadata: non-directories in parallel, then directories deepest first.
    entries
        .par_iter()
        .filter(|e| !e.ino.is_dir() && e.link_to.is_none())
        .try_for_each(|e| apply_meta(&img, e, &a))?;
    let mut dirs: Vec<&Entry> = entries.iter().filter(|e| e.ino.is_dir()).collect();
    dirs.sort_by_key(|e| std::cmp::Reverse(e.depth));
    for e in dirs {
        apply_meta(&img, e, &a)?;
    }
    Ok(())
}

fn write_file(img: &Image, ino: &Inode, p: &Path) -> Result<()> {
    let mut f = fs::File::create(p).with_context(|| format!("create {}", p.display()))?;
    let mut buf = vec![0u8; (1usize << 20).min(ino.size.max(1) as usize)];
    let mut off = 0u64;
    let mut pending_hole = false;
    while off < ino.size {
        let n = img
            .read_at(ino, off, &mut buf)
            .with_context(|| format!("{}: read at offset {off}", p.display()))?;
        if n == 0 {
            bail!(
                "{}: image data ends at {off}, size is {}",
                p.display(),
                ino.size
            );
        }
        let chunk = &buf[..n];
        if chunk.iter().all(|&b| b == 0) {
            f.seek(SeekFrom::Current(n as i64))?;
            pending_hole = true;
        } else {
            f.write_all(chunk)
                .with_context(|| format!("write {}", p.display()))?;
            pending_hole = false;
        }
        off += n as u64;
    }
    if pending_hole {
        f.set_len(ino.size)?;
    }
    Ok(())
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
    // tv_nsec is not i64 on every target: keep the conversion.
    #[allow(clippy::useless_conversion)]
    let t = rustix::fs::Timespec {
        tv_sec: e.ino.mtime,
        tv_nsec: i64::from(e.ino.mtime_nsec).try_into().unwrap_or(0),
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        &p,
        &rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .with_context(ctx)?;
    Ok(())
}
