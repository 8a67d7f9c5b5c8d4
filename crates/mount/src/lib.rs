//! # ferofs-mount — EROFS images through FUSE
//!
//! What it owns: serving an image read by `ferofs-reader` to the kernel's FUSE device
//! (`fuser`, pure Rust: no libfuse; as root it mounts with mount(2), as a user through
//! `fusermount3`), read-only, with several threads. What it does not own: anything
//! about the format (the reader), flags and daemonising (the `ferofs mount` command).
//!
//! How a request flows:
//!
//! - [`mount`] opens the image (at `--offset`), checks the superblock and the root
//!   inode, reads the image's metadata into memory (`preload`: every block a walk of
//!   the whole tree touches, up to `preload_bytes`, served from memory for the mount's
//!   life), mounts, and returns once the kernel's INIT handshake is done: the mount is
//!   usable when it returns, and every error before that is the caller's to report.
//! - [`Mounted::run`] serves until the filesystem is unmounted (`umount`,
//!   `fusermount3 -u`) or SIGINT/SIGTERM/SIGHUP arrives (then it unmounts itself).
//!   `threads` event loops each read a request from their own clone of the FUSE device,
//!   serve it and send the reply: a bounded pool, replies from the workers.
//! - `fs` maps node ids to nids (the nid is the inode number, as in the kernel), builds
//!   attributes (st_blocks and st_nlink as the kernel reports them), and maps reader
//!   errors to errno (corrupt -> EIO, unsupported -> EOPNOTSUPP); a request that panics
//!   gets EIO, the daemon lives on. Every change is refused with EROFS.
//! - Reads go extent by extent: a compressed extent is decoded whole, once (single
//!   flight: a second reader of the same pcluster waits for the first), kept in the
//!   `cache` when it was read in part, and a sequential reader gets the next extents
//!   decoded ahead by read-ahead threads. Inodes and directory listings share the same
//!   byte budget. The kernel keeps pages, entries and attributes (the image never
//!   changes, so with long timeouts).
//! - `record` writes `--record-access`: each regular file's path on its first read.

#![forbid(unsafe_code)]

mod cache;
mod fs;
mod preload;
mod record;
mod source;

pub use fs::{ErofsFs, FsOptions};
pub use preload::DEFAULT_PRELOAD_BYTES;
pub use source::OffsetFile;

use ferofs_reader::{Image, Source};
use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `ferofs mount` asks for.
#[derive(Debug, Clone)]
pub struct Options {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    /// Where the image starts in its file.
    pub offset: u64,
    /// Budget of decoded data and metadata kept in memory.
    pub cache_bytes: usize,
    /// Image blocks of metadata read at mount and kept for the mount's life, at most
    /// (0: none; see `preload`). On top of `cache_bytes`.
    pub preload_bytes: usize,
    /// Request threads (event loops).
    pub threads: usize,
    /// Read-ahead threads (0: none).
    pub prefetch_threads: usize,
    pub allow_other: bool,
    /// Kernel permission checks (modes, POSIX ACLs), as a kernel mount does.
    pub default_permissions: bool,
    /// Honour set-user-id bits and device nodes (`-o suid`, `-o dev`).
    pub suid: bool,
    pub dev: bool,
    /// No program runs from the mount (`-o noexec`).
    pub noexec: bool,
    pub record_access: Option<PathBuf>,
    /// Read-ahead window of the mount's FUSE device in bytes, set as root through its
    /// sysfs knob once mounted (0: the kernel's, 128 KiB); see [`set_read_ahead`].
    pub read_ahead_bytes: u64,
    /// Print reader errors (corruption reports) on stderr as requests meet them.
    pub verbose: bool,
}

impl Options {
    pub fn new(image: impl Into<PathBuf>, mountpoint: impl Into<PathBuf>) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Options {
            image: image.into(),
            mountpoint: mountpoint.into(),
            offset: 0,
            cache_bytes: DEFAULT_CACHE_BYTES,
            preload_bytes: DEFAULT_PRELOAD_BYTES,
            threads: (2 * cores).clamp(4, 16),
            prefetch_threads: cores.clamp(1, 4),
            allow_other: false,
            default_permissions: true,
            suid: false,
            dev: false,
            noexec: false,
            record_access: None,
            read_ahead_bytes: DEFAULT_READ_AHEAD,
            verbose: false,
        }
    }
}

/// Default `-o read_ahead=SIZE`.
pub const DEFAULT_READ_AHEAD: u64 = 4 << 20;

/// Default `-o cache=SIZE`.
pub const DEFAULT_CACHE_BYTES: usize = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{path}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}")]
    Image {
        path: String,
        #[source]
        source: ferofs_reader::Error,
    },
    #[error("--record-access {path}")]
    Record {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot mount on {path}")]
    Mount {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A mounted image, ready to serve.
pub struct Mounted {
    session: Session<ErofsFs<Served>>,
    /// Registered before the mount, so a signal that comes before [`Mounted::run`]
    /// unmounts too (and does not kill the daemon with the mount left behind).
    signals: signal_hook::iterator::Signals,
    unmounter: SessionUnmounter,
    mountpoint: PathBuf,
    record: Option<(PathBuf, Arc<record::Recorder>)>,
    shared: Arc<fs::Shared<Served>>,
    verbose: bool,
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

/// The bytes [`mount_source`] serves: the image file at its offset, or a source the
/// caller opened (an image over the network).
pub enum ImageSource {
    File(OffsetFile),
    Shared(Arc<dyn Source>),
}

impl Source for ImageSource {
    #[inline]
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            ImageSource::File(f) => f.read_exact_at(buf, offset),
            ImageSource::Shared(s) => s.read_exact_at(buf, offset),
        }
    }
    fn size(&self) -> std::io::Result<u64> {
        match self {
            ImageSource::File(f) => f.size(),
            ImageSource::Shared(s) => s.size(),
        }
    }
}

/// What the reader reads: the image, its metadata blocks kept in memory from mount.
type Served = preload::Pinned<ImageSource>;

/// Open the image file (`o.image` at `o.offset`), mount it and complete the kernel
/// handshake.
pub fn mount(o: &Options) -> Result<Mounted, MountError> {
    let f = std::fs::File::open(&o.image).map_err(|e| MountError::Open {
        path: shown(&o.image),
        source: e,
    })?;
    let twin = std::fs::File::open(&o.image).map_err(|e| MountError::Open {
        path: shown(&o.image),
        source: e,
    })?;
    let src = OffsetFile::new(f, o.offset)
        .and_then(|s| s.with_random_twin(twin))
        .map_err(|e| MountError::Open {
            path: shown(&o.image),
            source: e,
        })?;
    mount_source(o, ImageSource::File(src))
}

/// Mount the image in `src` (`o.image` names it; `o.offset` is not used), as [`mount`].
pub fn mount_source(o: &Options, src: ImageSource) -> Result<Mounted, MountError> {
    let src = preload::Pinned::new(src, o.preload_bytes).map_err(|e| MountError::Open {
        path: shown(&o.image),
        source: e,
    })?;
    let img = Image::new(src).map_err(|e| MountError::Image {
        path: shown(&o.image),
        source: e,
    })?;
    // The root must load and be a directory, or the mount is refused here.
    let root = img.inode(img.root_nid()).map_err(|e| MountError::Image {
        path: shown(&o.image),
        source: e,
    })?;
    if !root.is_dir() {
        return Err(MountError::Image {
            path: shown(&o.image),
            source: ferofs_reader::Error::NotADirectory {
                path: "/ (the root inode)".into(),
            },
        });
    }
    img.read_dir(&root).map_err(|e| MountError::Image {
        path: shown(&o.image),
        source: e,
    })?;
    // Metadata into memory before the mount is up (best effort: never fails).
    let pre = preload::preload(&img);
    if o.verbose && o.preload_bytes > 0 {
        eprintln!("ferofs mount: {}", pre.line());
    }
    let root_nid = img.root_nid();
    let record = match &o.record_access {
        Some(p) => Some((
            p.clone(),
            Arc::new(
                record::Recorder::create(p, root_nid).map_err(|e| MountError::Record {
                    path: shown(p),
                    source: e,
                })?,
            ),
        )),
        None => None,
    };
    let shared = Arc::new(fs::Shared::new(img, o.cache_bytes, o.verbose));
    let fsys = ErofsFs::new(
        shared.clone(),
        record.as_ref().map(|(_, r)| r.clone()),
        &FsOptions {
            prefetch_threads: o.prefetch_threads,
            default_permissions: o.default_permissions,
        },
    )?;
    let mut opts = vec![
        MountOption::RO,
        MountOption::FSName(shown(&o.image)),
        MountOption::Subtype("ferofs".into()),
    ];
    if o.default_permissions {
        opts.push(MountOption::DefaultPermissions);
    }
    if o.suid {
        opts.push(MountOption::Suid);
    }
    if o.dev {
        opts.push(MountOption::Dev);
    }
    if o.noexec {
        opts.push(MountOption::NoExec);
    }
    let mut cfg = Config::default();
    cfg.mount_options = opts;
    cfg.acl = if o.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(o.threads.max(1));
    cfg.clone_fd = true;
    // Before mounting: resolving the path afterwards would ask this daemon, which is not
    // serving yet.
    let mountpoint = std::fs::canonicalize(&o.mountpoint).unwrap_or_else(|_| o.mountpoint.clone());
    let signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])?;
    let mut session = Session::new(fsys, &o.mountpoint, &cfg).map_err(|e| MountError::Mount {
        path: shown(&o.mountpoint),
        source: e,
    })?;
    let unmounter = session.unmount_callable();
    if o.read_ahead_bytes > 0 && !set_read_ahead(&mountpoint, o.read_ahead_bytes) && o.verbose {
        eprintln!(
            "ferofs mount: read_ahead: the FUSE device's read-ahead window left at the kernel's (setting it needs root and a writable /sys)"
        );
    }
    Ok(Mounted {
        session,
        signals,
        unmounter,
        mountpoint: o.mountpoint.clone(),
        record,
        shared,
        verbose: o.verbose,
    })
}

/// Set the read-ahead window of the FUSE mount at `mountpoint` (canonical) to `bytes`,
/// through `/sys/class/bdi/MAJ:MIN/read_ahead_kb`; best effort (root only), true when
/// done. The kernel caps a FUSE mount's read-ahead at the default 128 KiB whatever the
/// daemon asks for at INIT (it offers its current window and keeps the smaller of that
/// and the reply), so a larger window can only be set from outside, once the INIT reply
/// is processed: `Session::new` returns after the handshake, so this runs after it and
/// the value sticks. The device comes from /proc/self/mountinfo (the last mount on that
/// path): a stat of the mount point would be a request to this daemon, which is not
/// serving yet.
fn set_read_ahead(mountpoint: &Path, bytes: u64) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mountpoint.to_string_lossy();
    let dev = info
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let dev = f.nth(2)?;
            let at = f.nth(1)?;
            (unescape_mountinfo(at) == *want).then_some(dev)
        })
        .next_back();
    let Some(dev) = dev else { return false };
    let kb = (bytes / 1024).max(4);
    std::fs::write(
        format!("/sys/class/bdi/{dev}/read_ahead_kb"),
        kb.to_string(),
    )
    .is_ok()
}

/// A mountinfo path field: space, tab, newline and backslash are octal escapes.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| c == b'\\' && d.iter().all(|x| (b'0'..=b'7').contains(x)))
            .map(|d| d.iter().fold(0u32, |v, x| v * 8 + u32::from(x - b'0')));
        match oct.and_then(|v| u8::try_from(v).ok()) {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            None => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Mounted {
    /// Serve requests until the filesystem is unmounted; SIGINT, SIGTERM and SIGHUP
    /// unmount it. The access list (if any) is flushed before returning.
    pub fn run(self) -> Result<(), MountError> {
        let Mounted {
            session,
            mut signals,
            mut unmounter,
            mountpoint,
            record,
            shared,
            verbose,
        } = self;
        let handle = signals.handle();
        let mp = mountpoint.clone();
        let waiter = std::thread::Builder::new()
            .name("ferofs-signals".into())
            .spawn(move || {
                // Busy (a process has a file open): detach it, as `umount -l`.
                if signals.forever().next().is_some() && unmounter.unmount().is_err() {
                    let _ = rustix::mount::unmount(&mp, rustix::mount::UnmountFlags::DETACH);
                }
            })?;
        let served = session.run();
        handle.close();
        let _ = waiter.join();
        if verbose {
            eprintln!("ferofs mount: {}", shared.stats_line());
        }
        if let Some((path, r)) = record {
            r.flush().map_err(|e| MountError::Record {
                path: shown(&path),
                source: e,
            })?;
        }
        served.map_err(MountError::Io)
    }
}

#[cfg(test)]
mod tests {
    use super::unescape_mountinfo;

    #[test]
    fn mountinfo_paths_unescape() {
        assert_eq!(unescape_mountinfo("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo("/x\\011y\\012z\\134w"), "/x\ty\nz\\w");
        // Not an escape: kept as it is.
        assert_eq!(unescape_mountinfo("/a\\9b\\04"), "/a\\9b\\04");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }
}
