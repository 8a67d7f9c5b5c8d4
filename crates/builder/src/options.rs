//! Build options and errors.

use std::path::PathBuf;

/// How the filesystem UUID is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UuidChoice {
    /// Derived from a hash of the image content (reproducible). The default.
    #[default]
    Derived,
    Fixed([u8; 16]),
    Random,
}

/// The default of [`BuildOptions::memory_limit`]: 512 MiB.
pub const DEFAULT_MEMORY_LIMIT: u64 = 512 << 20;

/// Everything that shapes an image. Built from CLI flags in one place (the CLI) and
/// passed by value: no globals, so two builds can run in one process.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// 512..=4096, a power of two.
    pub block_size: u32,
    pub all_root: bool,
    pub force_uid: Option<u32>,
    pub force_gid: Option<u32>,
    /// Added to every uid / gid after `all_root` and `force_uid` / `force_gid`
    /// (mkfs.erofs's `--uid-offset`, `--gid-offset`: user-namespace id shifts).
    pub uid_offset: u32,
    pub gid_offset: u32,
    /// `--hard-dereference`: hardlinked files become separate inodes, one per name.
    pub hard_dereference: bool,
    /// `--no-xattrs`: the source's xattrs (ACLs included) are left out.
    pub no_xattrs: bool,
    /// `--file-contexts`: SELinux labels (`security.selinux`) by path and type,
    /// replacing the source's.
    pub file_contexts: Option<std::sync::Arc<crate::selabel::FileContexts>>,
    /// `--fs-config-file`: Android's canned fs_config, owner, permission bits and
    /// capabilities per path (under `mount_point`), in place of the source's.
    pub fs_config: Option<std::sync::Arc<crate::fsconfig::FsConfig>>,
    /// `--mount-point`: where the image is mounted, for the file contexts' paths.
    pub mount_point: PathBuf,
    /// Paths relative to the source root; a directory excludes its subtree.
    pub exclude_paths: Vec<PathBuf>,
    /// Matched against the path relative to the source root (no leading '/').
    pub exclude_regex: Vec<regex::Regex>,
    /// At most 15 bytes.
    pub label: Option<String>,
    pub uuid: UuidChoice,
    /// `-T`: build time, and every inode's mtime (unless `timestamp_build_only`).
    pub timestamp: Option<i64>,
    /// `--mkfs-time`: `timestamp` is the build time only; files keep their mtimes.
    pub timestamp_build_only: bool,
    /// `SOURCE_DATE_EPOCH`: build time; newer mtimes are clamped down to it.
    pub source_date_epoch: Option<i64>,
    /// Every inode gets the build time as mtime (compact inodes).
    pub ignore_mtime: bool,
    /// Inline file tails behind the inode (default true).
    pub inline_data: bool,
    /// Worker threads, 0 = all cores. Never changes the output.
    pub threads: usize,
    /// Peak memory to stay under, in bytes (0: no limit): codecs with a large state
    /// (LZMA and zstd from level 10 at big pclusters) get fewer compression workers
    /// than `threads` when that many would not fit (see `zdata::fit_workers`).
    pub memory_limit: u64,
    /// fsync the image before renaming it into place.
    pub fsync: bool,
    /// None: uncompressed. The CLI defaults to lz4hc level 9 with 4 KiB pclusters.
    pub compression: Option<crate::zdata::Compression>,
    /// `-E fragments` / `-E all-fragments`: tails (or whole files) in the packed inode.
    /// Needs compression.
    pub fragments: Fragments,
    /// `-E dedupe`: identical data stored once.
    pub dedupe: bool,
    /// `-m`: every inode's metadata (core, xattrs, inline data, index) in the data of a
    /// metabox inode, compressed like file data (Linux 6.17+; implies the 48-bit layout).
    pub metabox: bool,
    /// `-E 48bit`: the 48-bit layout (Linux 6.15+), whose compact (32-byte) inodes carry
    /// their own mtime as seconds from the superblock's epoch: every inode whose mtime
    /// has no nanoseconds and whose owner and link count fit 16 bits is compact.
    /// `-m` and `dot_omitted` imply it.
    pub layout48: bool,
    /// `-E dot-omitted`: directories store no "." entry (the kernel makes it up; Linux
    /// 6.15+, implies the 48-bit layout).
    pub dot_omitted: bool,
    /// `--sort FILE`: these files' data first, contiguous, in this order (paths
    /// relative to the source); their inodes, and those of the directories on their
    /// paths, first in the metadata, and those directories' blocks first among the
    /// directory blocks. Listed files never go to fragments.
    pub sort: Vec<Vec<u8>>,
    /// File bytes to store and done so far (the CLI's progress bar reads it).
    pub progress: Option<std::sync::Arc<crate::Progress>>,
    /// The metabox inode's pcluster size in bytes (0: the image's `-C`).
    pub metabox_pcluster_size: u32,
    /// The metabox inode's algorithm: an index into `compression`'s algorithms.
    pub metabox_algorithm: usize,
    /// `--root-xattr-isize`: the root's xattr area at least this many bytes (0: as its
    /// xattrs need), the rest zeros.
    pub root_xattr_isize: usize,
    /// Tar input: OCI layer whiteouts (`.wh.NAME`, `.wh..wh..opq`) become overlayfs
    /// whiteouts and opaque directories (`--aufs`).
    pub aufs: bool,
    /// Leave overlayfs whiteouts (char 0:0) and `trusted.overlay.opaque` out of the
    /// image (`--ovlfs-strip`), any input.
    pub ovlfs_strip: bool,
    /// Tar input, index mode (`--tar-index`, mkfs.erofs's `--tar=i`): no file data in
    /// the image, regular files point into the tar, the image's extra device.
    pub tar_index: bool,
    /// Tar input without file data (`--tar-headerball`, mkfs.erofs's
    /// `--tar=headerball`): each regular file's header is followed by the next header,
    /// and the file is its size of zeros, stored as a hole.
    pub tar_headerball: bool,
    /// `--reserve-data` (mkfs.erofs's `--clean=rvsp`): every non-empty regular file
    /// gets its blocks in the image (uncompressed, contiguous, FLAT_PLAIN) but its
    /// data is not stored: the image holds zeros there, to be filled in later (from
    /// the tar, at the offsets `block_map` lists). Files of a `build_onto` base keep
    /// their data.
    pub reserve_data: bool,
    /// `--block-map FILE` (mkfs.erofs's `--tar=MODE,MAPFILE`): written when the build
    /// succeeds, a line per reserved file in block order, `BLKADDR NBLOCKS SRCOFF`
    /// and, when the last block is not full, the bytes of zeros at its end
    /// (`%08x %8x %08x %08u`, mkfs.erofs's format); SRCOFF is the data's offset in
    /// the (decompressed) tar, 0 for other sources. Empty without `reserve_data`.
    pub block_map: Option<std::path::PathBuf>,
    /// `--verity`: a dm-verity hash tree appended behind the image (see `verity`).
    pub verity: Option<VerityOptions>,
    /// `--fsverity-digests`: each regular file's fs-verity digest in a
    /// `trusted.overlay.metacopy` xattr (see `fsverity`).
    pub fsverity_digests: bool,
    /// `-E force-inode-compact|extended`: one inode core for every inode.
    pub inode_version: InodeVersion,
    /// The superblock checksum (`-E nosbcrc` turns it off, as mkfs.erofs's does).
    pub sb_checksum: bool,
    /// `--chunksize`: files stored uncompressed are chunk-based, their chunks
    /// deduplicated (see `chunks`).
    pub chunks: Option<ChunkOptions>,
    /// Where the image starts in the output (`--offset`): the bytes before it are
    /// zeros in a new file, left as they are on a block device.
    pub output_offset: u64,
    /// `--fsalignblks`: the image's size is rounded up to a multiple of this many
    /// blocks (a power of two; 0 or 1: no rounding).
    pub fs_align_blocks: u32,
    /// `--dsunit`: every file's data (the packed inode's too) starts at a block address
    /// that is a multiple of this many blocks, for storage that works in stripes (0 or
    /// 1: no alignment). With chunks only when at most one chunk (else ignored, with a
    /// warning, as mkfs.erofs); a file whose first chunk or pcluster is shared with
    /// another file's stays where that one is.
    pub dsunit: u32,
    /// `--blobdev`: with `chunks` (uncompressed), every regular file's data goes, as
    /// chunks, to this file or block device, an extra device of the image (device 1,
    /// chunk indexes); the image keeps the metadata only. Mounted with `-o
    /// device=BLOB`, or the image and the blob concatenated.
    pub blobdev: Option<PathBuf>,
    /// Extra devices of an EROFS source image (`--device`), in device-table order.
    pub source_devices: Vec<PathBuf>,
    /// `--xattr-prefix`: long xattr name prefixes (Linux 6.4+), full names such as
    /// `trusted.overlay.`, in the order given (an xattr uses the longest it starts with):
    /// each such xattr stores only the rest of its name.
    pub xattr_prefixes: Vec<Vec<u8>>,
    /// `-E plain-xattr-prefixes`: the prefix table always in the image's metadata
    /// (Linux 6.17+ read that beside a packed inode), never in the packed inode.
    pub plain_xattr_prefixes: bool,
    /// `--xattr-inode-digest`: every non-empty regular file gets an xattr of this name
    /// holding `sha256:` and the SHA-256 of its contents (32 bytes), a long prefix of
    /// its own, named in the superblock: the content fingerprint with which newer
    /// kernels share the page cache of identical files across images.
    pub inode_digest: Option<Vec<u8>>,
}

/// Which inode core every inode gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InodeVersion {
    /// Compact (32 bytes) when every value fits, else extended (64 bytes).
    #[default]
    Auto,
    /// Compact for all; a file whose values do not fit is an error naming it.
    Compact,
    /// Extended for all.
    Extended,
}

/// `--chunksize`: how files stored uncompressed are cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkOptions {
    /// log2 of the chunk size in bytes: at least the block size's.
    pub bits: u8,
    /// 8-byte chunk indexes instead of 4-byte block map entries
    /// (`-E force-chunk-indexes`).
    pub indexes: bool,
    /// Identical chunks stored once (on unless `-E ^dedupe` says otherwise).
    pub dedupe: bool,
}

/// `--verity`: sha256, 4096-byte data and hash blocks, the superblock written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerityOptions {
    /// None: 32 bytes derived from the filesystem UUID (reproducible).
    pub salt: Option<Vec<u8>>,
}

/// Which file data goes into the packed inode (`-E fragments`, `-E all-fragments`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fragments {
    #[default]
    Off,
    /// The tail extent of every compressed file; files no longer than one pcluster whole.
    Tails {
        /// The packed inode's pcluster size (0: the image's).
        pcluster_size: u32,
    },
    /// Every regular file whole.
    All { pcluster_size: u32 },
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            block_size: 4096,
            all_root: false,
            force_uid: None,
            uid_offset: 0,
            gid_offset: 0,
            hard_dereference: false,
            no_xattrs: false,
            force_gid: None,
            file_contexts: None,
            fs_config: None,
            mount_point: PathBuf::new(),
            exclude_paths: Vec::new(),
            exclude_regex: Vec::new(),
            label: None,
            uuid: UuidChoice::Derived,
            timestamp: None,
            timestamp_build_only: false,
            source_date_epoch: None,
            ignore_mtime: false,
            inline_data: true,
            threads: 0,
            memory_limit: DEFAULT_MEMORY_LIMIT,
            compression: None,
            fsync: false,
            fragments: Fragments::Off,
            dedupe: false,
            metabox: false,
            layout48: false,
            dot_omitted: false,
            sort: Vec::new(),
            metabox_pcluster_size: 0,
            metabox_algorithm: 0,
            root_xattr_isize: 0,
            progress: None,
            aufs: false,
            ovlfs_strip: false,
            tar_index: false,
            tar_headerball: false,
            reserve_data: false,
            block_map: None,
            verity: None,
            fsverity_digests: false,
            inode_version: InodeVersion::Auto,
            sb_checksum: true,
            chunks: None,
            output_offset: 0,
            fs_align_blocks: 1,
            dsunit: 0,
            blobdev: None,
            source_devices: Vec::new(),
            xattr_prefixes: Vec::new(),
            plain_xattr_prefixes: false,
            inode_digest: None,
        }
    }
}

impl BuildOptions {
    /// Worker threads: `threads`, or every core when it is 0.
    pub fn worker_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// The image uses the 48-bit layout (`-E 48bit`, or implied by `-m` or
    /// `-E dot-omitted`).
    pub fn layout48(&self) -> bool {
        self.layout48 || self.metabox || self.dot_omitted
    }

    /// The packed inode's own pcluster size, when `-E fragments=SIZE` (or
    /// `all-fragments=SIZE`) gives one; otherwise it takes the image's `-C`.
    pub(crate) fn packed_pcluster(&self) -> Option<u32> {
        match self.fragments {
            Fragments::Tails { pcluster_size: p } | Fragments::All { pcluster_size: p }
                if p > 0 =>
            {
                Some(p)
            }
            _ => None,
        }
    }

    /// The metabox inode's pcluster size, when it is compressed.
    pub(crate) fn metabox_pcluster(&self) -> Option<u32> {
        let c = self.compression.as_ref().filter(|_| self.metabox)?;
        Some(match self.metabox_pcluster_size {
            0 => c.pcluster_size,
            p => p,
        })
    }

    /// Reject options no image can be built with (before anything is read or written).
    /// The image's long xattr name prefixes in table order: `--xattr-prefix`es, then
    /// the `--xattr-inode-digest` name unless it is one of them; and the digest's
    /// index in the table.
    pub(crate) fn long_prefixes(&self) -> (Vec<ferofs_format::xattr::LongPrefix>, Option<u8>) {
        let mut names: Vec<&[u8]> = self.xattr_prefixes.iter().map(|p| p.as_slice()).collect();
        let digest = self.inode_digest.as_deref().map(|d| {
            names.iter().position(|p| *p == d).unwrap_or_else(|| {
                names.push(d);
                names.len() - 1
            })
        });
        let long = names
            .iter()
            .map(|p| ferofs_format::xattr::LongPrefix::of(p))
            .collect();
        (long, digest.and_then(|i| u8::try_from(i).ok()))
    }

    pub(crate) fn check(&self) -> Result<()> {
        let o = self;
        if !(512..=4096).contains(&o.block_size) || !o.block_size.is_power_of_two() {
            return Err(BuildError::Options(format!(
                "block size {} (512, 1024, 2048 or 4096)",
                o.block_size
            )));
        }
        if let Some(l) = &o.label {
            if l.len() > 15 {
                return Err(BuildError::Options("label longer than 15 bytes".into()));
            }
        }
        if o.fragments != Fragments::Off && o.compression.is_none() {
            return Err(BuildError::Options(
                "fragments need compression (the packed inode is compressed)".into(),
            ));
        }
        if let Fragments::Tails { pcluster_size: p } | Fragments::All { pcluster_size: p } =
            o.fragments
        {
            if p != 0 && (p % o.block_size != 0 || p > 1 << 20) {
                return Err(BuildError::Options(format!(
                    "fragments pcluster size {p}: a multiple of the block size ({}), at most 1 MiB",
                    o.block_size
                )));
            }
        }
        let (long, _) = o.long_prefixes();
        if long.len() > ferofs_format::xattr::MAX_LONG_PREFIXES {
            return Err(BuildError::Options(format!(
                "{} xattr name prefixes (--xattr-prefix, --xattr-inode-digest): at most {}",
                long.len(),
                ferofs_format::xattr::MAX_LONG_PREFIXES
            )));
        }
        if o.inode_digest.is_some() && o.tar_index {
            return Err(BuildError::Options(
                "--xattr-inode-digest with --tar-index: the file data stays in the tar, not read"
                    .into(),
            ));
        }
        for p in o.xattr_prefixes.iter().chain(&o.inode_digest) {
            if p.is_empty() || p.len() > ferofs_format::xattr::MAX_LONG_PREFIX_LEN {
                return Err(BuildError::Options(format!(
                    "xattr name prefix {:?}: 1 to {} bytes",
                    String::from_utf8_lossy(p),
                    ferofs_format::xattr::MAX_LONG_PREFIX_LEN
                )));
            }
        }
        if o.reserve_data {
            let other = if o.tar_index {
                Some("--tar-index (the data stays in the tar, no space is reserved)")
            } else if o.fsverity_digests {
                Some("--fsverity-digests (the data is not there to digest)")
            } else if o.inode_digest.is_some() {
                Some("--xattr-inode-digest (the data is not there to digest)")
            } else if o.verity.is_some() {
                Some("--verity (the hash tree would cover the zeros, not the data filled in later)")
            } else if o.blobdev.is_some() {
                Some("--blobdev")
            } else {
                None
            };
            if let Some(other) = other {
                return Err(BuildError::Options(format!("--reserve-data with {other}")));
            }
        }
        if o.fsverity_digests && o.tar_index {
            return Err(BuildError::Options(
                "--fsverity-digests with --tar-index: the file data stays in the tar, not read"
                    .into(),
            ));
        }
        if let Some(v) = &o.verity {
            if o.block_size != 4096 {
                return Err(BuildError::Options(format!(
                    "--verity needs 4096-byte blocks (the verity device's block size; got {})",
                    o.block_size
                )));
            }
            if o.tar_index {
                return Err(BuildError::Options(
                    "--verity with --tar-index would cover the metadata only (the file data stays in the tar)".into(),
                ));
            }
            if v.salt
                .as_ref()
                .is_some_and(|s| s.len() > ferofs_format::verity::MAX_SALT)
            {
                return Err(BuildError::Options(format!(
                    "verity salt longer than {} bytes",
                    ferofs_format::verity::MAX_SALT
                )));
            }
        }
        let p = o.metabox_pcluster_size;
        if o.metabox
            && p != 0
            && (!p.is_multiple_of(o.block_size) || p > 1 << 20 || p / o.block_size > 2047)
        {
            return Err(BuildError::Options(format!(
                "metabox pcluster size {p}: a multiple of the block size ({}), at most 1 MiB and 2047 blocks",
                o.block_size
            )));
        }
        if let Some(c) = &o.compression {
            if c.algorithms.is_empty() {
                return Err(BuildError::Options("no compression algorithm".into()));
            }
            let sizes =
                std::iter::once(c.pcluster_size).chain(c.hints.iter().map(|h| h.pcluster_size));
            for p in sizes {
                if p == 0 || p % o.block_size != 0 || p > 1 << 20 || p / o.block_size > 2047 {
                    return Err(BuildError::Options(format!(
                        "pcluster size {p}: a multiple of the block size ({}), at most 1 MiB and 2047 blocks",
                        o.block_size
                    )));
                }
            }
            for h in &c.hints {
                if h.algorithm >= c.algorithms.len() {
                    return Err(BuildError::Options(format!(
                        "compress hint {:?} uses algorithm index {} but only {} algorithm(s) were given with -z",
                        h.regex.as_str(),
                        h.algorithm,
                        c.algorithms.len()
                    )));
                }
            }
        }
        Ok(())
    }
}

/// What went wrong, naming the source path and the stage.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    // The I/O error is part of the message, not a `source` as well: printed as a
    // chain (`{:#}`) it would appear twice.
    #[error("{stage}: {}: {error}", path.display())]
    Io {
        path: PathBuf,
        stage: &'static str,
        error: std::io::Error,
    },
    #[error("{}: {what}", path.display())]
    Invalid { path: PathBuf, what: String },
    #[error("invalid options: {0}")]
    Options(String),
    #[error("image too large: {0}")]
    TooLarge(String),
}

pub type Result<T, E = BuildError> = std::result::Result<T, E>;

pub(crate) fn io_err<'a>(
    path: &'a std::path::Path,
    stage: &'static str,
) -> impl FnOnce(std::io::Error) -> BuildError + 'a {
    move |error| BuildError::Io {
        path: path.to_path_buf(),
        stage,
        error,
    }
}

/// What a build produced.
#[derive(Debug, Clone, Default)]
pub struct BuildReport {
    pub inodes: u64,
    pub directories: u64,
    pub files: u64,
    pub symlinks: u64,
    pub special: u64,
    pub bytes_in: u64,
    /// File bytes handed to a compressor (data stored as it is without trying, such as
    /// files of at most one block without ztailpacking, is not counted).
    pub compressor_input: u64,
    pub image_bytes: u64,
    pub blocks: u64,
    pub uuid: [u8; 16],
    pub build_time: i64,
    /// File bytes not stored again because they duplicate data already in the image
    /// (whole files and pclusters, `-E dedupe`).
    pub dedupe_saved: u64,
    /// File bytes stored as fragments in the packed inode.
    pub fragment_bytes: u64,
    /// Image bytes saved by fragments: the blocks the fragments would have taken as
    /// ordinary pclusters or blocks, less what the packed inode takes.
    pub fragments_saved: u64,
    /// Things the user should know that did not stop the build (e.g. `--sort` paths
    /// that are not regular files of the tree).
    pub warnings: Vec<String>,
    /// `-m`: bytes of metadata in the metabox inode, and what they take in the image
    /// (its data blocks and inline tail).
    pub metabox_bytes: u64,
    pub metabox_stored: u64,
    /// `--verity`: the hash tree appended behind the image.
    pub verity: Option<crate::verity::VerityInfo>,
    /// The build appended to an existing image in place ([`crate::append_onto`]):
    /// `inodes` and the counts are of the inodes written.
    pub appended_in_place: bool,
    /// In place: bytes the image grew by.
    pub appended_bytes: u64,
    /// `--reserve-data`: bytes of the files whose space was reserved (not stored).
    pub reserved_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_data_refuses_what_would_need_the_data() {
        let base = BuildOptions {
            reserve_data: true,
            ..Default::default()
        };
        assert!(base.check().is_ok());
        let cases: [(&str, BuildOptions); 4] = [
            (
                "--tar-index",
                BuildOptions {
                    tar_index: true,
                    ..base.clone()
                },
            ),
            (
                "--fsverity-digests",
                BuildOptions {
                    fsverity_digests: true,
                    ..base.clone()
                },
            ),
            (
                "--xattr-inode-digest",
                BuildOptions {
                    inode_digest: Some(b"user.d".to_vec()),
                    ..base.clone()
                },
            ),
            (
                "--blobdev",
                BuildOptions {
                    blobdev: Some("b".into()),
                    ..base.clone()
                },
            ),
        ];
        for (what, o) in cases {
            match o.check() {
                Err(BuildError::Options(m)) => {
                    assert!(m.starts_with(&format!("--reserve-data with {what}")), "{m}")
                }
                r => panic!("{what}: {r:?}"),
            }
        }
    }
}
