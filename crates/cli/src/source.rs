//! Where an image comes from: a local file, or a URL (`http://`, `https://`, `s3://`)
//! read with range requests through `ferofs-remote`. One enum, so the local path costs
//! one branch per read and no allocation.
//!
//! The remote options (`--cache-dir`, `--cache-size`, `--s3-endpoint`, `--timeout`,
//! `--fetch-block`, `--fetch-stats`) are global flags; `main` stores them here once.

use anyhow::{Context, Result};
use clap::Args;
use ferofs_reader::Source;
use ferofs_remote::{Remote, RemoteOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// An image's bytes.
#[derive(Debug)]
pub enum Src {
    /// A file or block device, the image from byte `--offset` on.
    File(ferofs_mount::OffsetFile),
    Remote(Arc<Remote>),
    /// The image and its extra devices (`--device`) in one address space.
    Joined(Arc<ferofs_reader::source::Joined>),
}

/// The CLI's image type.
pub type Image = ferofs_reader::Image<Src>;

impl Source for Src {
    #[inline]
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            Src::File(f) => f.read_exact_at(buf, offset),
            Src::Remote(r) => r.read_exact_at(buf, offset),
            Src::Joined(j) => j.read_exact_at(buf, offset),
        }
    }
    fn size(&self) -> io::Result<u64> {
        match self {
            Src::File(f) => f.size(),
            Src::Remote(r) => r.size(),
            Src::Joined(j) => j.size(),
        }
    }
}

/// Options of images given as URLs (every read-side command takes them).
#[derive(Args, Debug, Clone, Default)]
pub struct RemoteArgs {
    /// For an image given as a URL: keep fetched blocks in DIR, shared between runs
    /// (keyed by URL, size and ETag: a changed object never gets old blocks).
    #[arg(long, global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Size limit of --cache-dir (k, m, g suffixes); the oldest blocks go first.
    #[arg(long, global = true, value_name = "SIZE", default_value = "1g")]
    pub cache_size: String,
    /// S3 endpoint for s3:// URLs (MinIO, Ceph RGW, ...); default AWS_ENDPOINT_URL or AWS.
    #[arg(long, global = true, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// Seconds one request may take; failed requests are retried with backoff within
    /// this time, then the command fails.
    #[arg(long, global = true, value_name = "SECS", default_value_t = 30.0)]
    pub timeout: f64,
    /// Fetch granularity for URLs (k, m suffixes; a power of two).
    #[arg(long, global = true, value_name = "SIZE", default_value = "128k")]
    pub fetch_block: String,
    /// Print what was fetched for a URL (bytes, requests, cache hits) to stderr at exit.
    #[arg(long, global = true)]
    pub fetch_stats: bool,
    /// For an image given as a URL and built with `build --verity`: check every fetched
    /// block against the dm-verity tree, and the tree against ROOTHASH (hex), before
    /// using it; a mismatch is an I/O error.
    #[arg(long, global = true, value_name = "ROOTHASH")]
    pub verity_root: Option<String>,
    /// Where the image starts inside the file or block device given (bytes; k, m, g
    /// suffixes): an image inside a disk image, or behind a program. For `build`: where
    /// the image starts in the output, the bytes before it zeros (mkfs.erofs's
    /// `--offset`).
    #[arg(long, global = true, value_name = "BYTES", default_value = "0")]
    pub offset: String,
    /// An extra device of the image, in the order of its device table (repeat for
    /// more): the blob of `build --blobdev`, the tar of `build --tar-index`, a
    /// mkfs.erofs `--blobdev` blob. Read where the image's device table places it
    /// (fsck.erofs's `--device`; the kernel's `-o device=`).
    #[arg(long = "device", global = true, value_name = "FILE")]
    pub devices: Vec<PathBuf>,
}

/// `--offset` in bytes.
pub fn offset() -> Result<u64> {
    match ARGS.get() {
        Some(a) => parse_size("--offset", &a.offset),
        None => Ok(0),
    }
}

static ARGS: OnceLock<RemoteArgs> = OnceLock::new();
/// Remotes opened by this process (for --fetch-stats).
static OPENED: OnceLock<std::sync::Mutex<Vec<Arc<Remote>>>> = OnceLock::new();

pub fn set_args(a: RemoteArgs) {
    let _ = ARGS.set(a);
}

/// "64M", "1g", "4096", "512k" -> bytes.
pub fn parse_size(what: &str, s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_lowercase() {
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                _ => anyhow::bail!("{what} {s}: unknown size suffix (k, m, g or t)"),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .with_context(|| format!("{what} {s}: not a size"))?;
    n.checked_mul(mul)
        .with_context(|| format!("{what} {s}: too large"))
}

pub fn remote_options() -> Result<RemoteOptions> {
    let a = ARGS.get().cloned().unwrap_or_else(|| RemoteArgs {
        cache_size: "1g".into(),
        timeout: 30.0,
        fetch_block: "128k".into(),
        ..Default::default()
    });
    anyhow::ensure!(
        a.timeout.is_finite() && (0.1..=3600.0).contains(&a.timeout),
        "--timeout {}: from 0.1 to 3600 seconds",
        a.timeout
    );
    Ok(RemoteOptions {
        block_size: parse_size("--fetch-block", &a.fetch_block)?,
        timeout: Duration::from_secs_f64(a.timeout),
        cache_dir: a.cache_dir,
        cache_size: parse_size("--cache-size", &a.cache_size)?,
        s3_endpoint: a.s3_endpoint,
        verity: match &a.verity_root {
            Some(h) => {
                let root = crate::build::parse_hex("--verity-root", h)?;
                anyhow::ensure!(
                    root.len() == 32,
                    "--verity-root: a root hash is 64 hex digits (sha256)"
                );
                Some(root)
            }
            None => None,
        },
        ..Default::default()
    })
}

/// Is this image argument a URL?
pub fn is_url(image: &Path) -> bool {
    image.to_str().is_some_and(ferofs_remote::is_url)
}

/// Open a URL as a [`Remote`] with the global options.
pub fn open_remote(url: &str) -> Result<Arc<Remote>> {
    let r = Arc::new(Remote::open(url, &remote_options()?)?);
    if let Ok(mut v) = OPENED.get_or_init(Default::default).lock() {
        v.push(r.clone());
    }
    Ok(r)
}

/// The bytes of an image argument: a file, or a URL.
pub fn open_src(image: &Path) -> Result<Src> {
    open_src_with(image, has_devices())
}

/// [`open_src`], joined with the `--device` files only when `devices`.
pub fn open_src_with(image: &Path, devices: bool) -> Result<Src> {
    let offset = offset()?;
    match image.to_str() {
        Some(u) if ferofs_remote::is_url(u) => {
            anyhow::ensure!(offset == 0, "--offset is for image files, not URLs");
            anyhow::ensure!(!has_devices(), "--device is for image files, not URLs");
            Ok(Src::Remote(open_remote(u)?))
        }
        _ => {
            let file = std::fs::File::open(image).with_context(|| image.display().to_string())?;
            let f = ferofs_mount::OffsetFile::new(file, offset)
                .with_context(|| format!("{}: --offset", image.display()))?;
            if devices {
                return Ok(Src::Joined(Arc::new(joined(f, image)?)));
            }
            Ok(Src::File(f))
        }
    }
}

/// The `--device` files, in order.
pub fn devices() -> Vec<PathBuf> {
    ARGS.get().map(|a| a.devices.clone()).unwrap_or_default()
}

/// Whether `--device` was given.
pub fn has_devices() -> bool {
    ARGS.get().is_some_and(|a| !a.devices.is_empty())
}

/// `image` (its bytes `f`) joined with the `--device` files.
pub fn joined(f: ferofs_mount::OffsetFile, image: &Path) -> Result<ferofs_reader::source::Joined> {
    ferofs_reader::source::Joined::open(Arc::new(f), &devices())
        .map_err(|e| anyhow::anyhow!("{}: --device: {e}", image.display()))
}

/// "cannot open image IMAGE: ERROR", with a hint of where the image is when the error
/// is that there is no superblock where one was looked for.
pub fn cannot_open(image: &Path, e: ferofs_reader::Error) -> anyhow::Error {
    let hint = (e.corrupt_kind() == Some(ferofs_reader::CorruptKind::BadMagic))
        .then(|| where_is_the_image(image))
        .flatten();
    match hint {
        Some(h) => anyhow::anyhow!("cannot open image {}: {e}\nhint: {h}", image.display()),
        None => anyhow::Error::new(e).context(format!("cannot open image {}", image.display())),
    }
}

/// How far into a file [`where_is_the_image`] looks.
const HINT_SCAN: u64 = 64 << 20;

/// For a file that holds no EROFS superblock where it was looked for: what it is
/// instead, when that is easy to tell (a SquashFS image, or an EROFS superblock further
/// in, as in a disk image with a partition table: the `--offset` to give).
pub fn where_is_the_image(image: &Path) -> Option<String> {
    let read_at = |f: &std::fs::File, b: &mut [u8], at: u64| {
        std::os::unix::fs::FileExt::read_exact_at(f, b, at)
    };
    if is_url(image) {
        return None;
    }
    let f = std::fs::File::open(image).ok()?;
    let len = ferofs_reader::source::file_len(&f).ok()?;
    let given = offset().unwrap_or(0);
    let mut head = [0u8; 4];
    if read_at(&f, &mut head, given).is_ok() && &head == b"hsqs" {
        return Some(format!(
            "this is a SquashFS image: `ferofs build {} NEW.erofs` converts it",
            image.display()
        ));
    }
    // Superblocks sit 1024 bytes into the image, and images start on 512-byte
    // boundaries (partitions do).
    let magic = ferofs_format::sb::MAGIC.to_le_bytes();
    let end = len.min(HINT_SCAN);
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    // Bounded: HINT_SCAN bytes in 1 MiB pieces.
    while at < end {
        let n = (end - at).min(buf.len() as u64) as usize;
        read_at(&f, &mut buf[..n], at).ok()?;
        let mut p = (1024 - (at % 512) as usize % 512) % 512;
        while p + 13 <= n {
            let blkszbits = buf[p + 12];
            let start = (at + p as u64).checked_sub(1024);
            if buf[p..p + 4] == magic && (9..=16).contains(&blkszbits) {
                if let Some(start) = start.filter(|&s| s != given) {
                    return Some(format!(
                        "an EROFS superblock is at byte {}: the image starts at --offset {start}",
                        at + p as u64
                    ));
                }
            }
            p += 512;
        }
        at += n as u64;
    }
    None
}

/// --fetch-stats: one line per URL opened.
pub fn print_stats() {
    if !ARGS.get().is_some_and(|a| a.fetch_stats) {
        return;
    }
    if let Some(v) = OPENED.get() {
        if let Ok(v) = v.lock() {
            for r in v.iter() {
                eprintln!("ferofs: {}: {}", r.url(), r.stats());
            }
        }
    }
}

/// Most bytes [`prefetch_metadata`] fetches ahead.
const METADATA_PREFETCH_MAX: u64 = 16 << 20;

/// Fetch the metadata region of an image ahead, in the background: in images ferofs
/// builds, the inodes, shared xattrs, directory and symlink blocks lie together at the
/// end (from the superblock's `meta_blkaddr` to its block count), so a mount's lookups
/// and listings are served from memory after a few large requests instead of a round
/// trip each. Skipped when that region is large (other builders interleave metadata
/// with data: then the region is most of the image).
pub fn prefetch_metadata(r: &Arc<Remote>) {
    let Ok(img) = ferofs_reader::Image::new(r.clone()) else {
        return;
    };
    let sb = img.superblock();
    let bs = u64::from(img.block_size());
    let (_, blocks) = sb.root_nid_and_blocks();
    let start = u64::from(sb.meta_blkaddr).saturating_mul(bs);
    let end = blocks.saturating_mul(bs);
    if start == 0 || end <= start || end - start > METADATA_PREFETCH_MAX {
        return;
    }
    let r = r.clone();
    let _ = std::thread::Builder::new()
        .name("ferofs-prefetch".into())
        .spawn(move || {
            // Best effort: a failure here is met again (and reported) by the read that
            // needs the block.
            let _ = r.prefetch(start, end);
        });
}

/// Whether `p` is a regular file or a block device (a partition) holding an EROFS
/// image (the magic at byte 1024).
pub fn is_erofs_file(p: &std::path::Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let image_like =
        p.is_file() || std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device());
    image_like && ferofs_builder::erofsin::is_erofs_image(p)
}
