//! `build`: flags -> validated `BuildOptions`, then the builder library.

use crate::report::{peak_rss_bytes, BarView, Summary};
use anyhow::{bail, Context, Result};
use clap::Args;
use ferofs_builder::{
    parse_hints, BuildOptions, ChunkOptions, Compression, Fragments, Hint, InodeVersion, Progress,
    TarInput, UuidChoice, VerityOptions,
};
use ferofs_compress::CompressorSpec;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct BuildArgs {
    /// `SOURCE IMAGE`: the source directory (or a SquashFS image, or an EROFS image to
    /// re-encode, each detected by its magic) and the output image (written to a
    /// temporary file and renamed on success); with `--tar`, only `IMAGE`. Several
    /// EROFS images before `IMAGE` (`LOWER... UPPER IMAGE`) are merged as overlayfs
    /// stacks layers (later ones on top; whiteouts and opaque directories hide what is
    /// under them).
    #[arg(required = true, num_args = 1.., value_name = "SOURCE] [IMAGE")]
    paths: Vec<PathBuf>,
    /// With EROFS images as SOURCE: the new image holds the metadata only and refers to
    /// the files' bytes where they are in the source images, which become its extra
    /// devices in the order given (mkfs.erofs's default for image sources). Mount with
    /// `-o device=` for each (`mount -t erofs -o ro,loop,device=/dev/loopA,device=/dev/loopB
    /// IMAGE DIR`; `ferofs` commands take `--device` for each). Block size: the last
    /// source's unless `-b`. A file whose bytes are not in one block-aligned piece of
    /// its source (inline tail, compressed, holes) is copied into the image instead,
    /// with a warning.
    #[arg(long)]
    by_reference: bool,
    /// Build SOURCE (a directory, or the `--tar` streams, each a layer) as a layer on
    /// top of the EROFS image BASE, as overlayfs stacks layers (mkfs.erofs's
    /// `--incremental`): its entries win their names, its whiteouts (char 0:0; OCI
    /// `.wh.` entries with `--aufs`) and opaque directories hide BASE's entries, a
    /// directory a tar only implies keeps BASE's metadata. IMAGE is a new image of the
    /// stack (BASE's files read and stored anew with the build's options); it may be
    /// BASE itself, replaced when the build succeeds. `--ovlfs-strip` drops the
    /// whiteouts and markers after the merge.
    #[arg(long, value_name = "BASE")]
    base: Option<PathBuf>,
    /// With `--base` and IMAGE the same file: rebuild the whole image rather than
    /// append to it in place. (In place, only the layer's inodes, its directories and
    /// their ancestors are written, behind the image's end; the image's other bytes stay
    /// as they are. Options that change the whole image, or an image the new inodes
    /// cannot join, rebuild it anyway, with a note.)
    #[arg(long, requires = "base")]
    rewrite: bool,
    /// Build from a tar archive instead of a directory: a file or `-` for stdin;
    /// gzip, xz, zstd and bzip2 streams are detected. Repeat it to flatten a stack of
    /// OCI layers into one tree (later layers win, whiteouts applied).
    #[arg(long, value_name = "FILE|-")]
    tar: Vec<std::ffi::OsString>,
    /// Build from an image in an OCI registry (Docker Hub, GHCR, Quay, a private
    /// registry): `[REGISTRY/]NAME[:TAG|@DIGEST]`, e.g. `debian:stable`,
    /// `ghcr.io/OWNER/APP:1.2`, `localhost:5000/app@sha256:...`; or an image on disk as
    /// skopeo names them: `oci:DIR[:REF]` (an OCI image layout), `oci-archive:FILE[:REF]`,
    /// `docker-archive:FILE` (`docker save`). The layers of the platform's image are
    /// fetched (each checked against its size and SHA-256 digest) into a temporary
    /// directory beside IMAGE (a layout's are read in place), then flattened as repeated
    /// `--tar`s are (whiteouts applied); only `IMAGE` is given as a path.
    #[arg(long, value_name = "REF", conflicts_with_all = ["tar", "tar_index"])]
    oci: Option<String>,
    /// With --oci: the platform, `OS/ARCH[/VARIANT]` (default: this machine's, e.g.
    /// `linux/amd64`).
    #[arg(long, value_name = "OS/ARCH", requires = "oci")]
    oci_platform: Option<String>,
    /// With --oci: only this layer (0-based), its whiteouts applied to nothing.
    #[arg(long, value_name = "N", requires = "oci", conflicts_with = "oci_blob")]
    oci_layer: Option<usize>,
    /// With --oci: only the layer with this digest (`sha256:HEX`).
    #[arg(long, value_name = "DIGEST", requires = "oci")]
    oci_blob: Option<String>,
    /// With --oci: user name for the registry (its token service); the password from
    /// --oci-password or the environment variable FEROFS_OCI_PASSWORD.
    #[arg(long, value_name = "USER", requires = "oci")]
    oci_username: Option<String>,
    /// With --oci: the password (visible to other users in the process list: prefer
    /// FEROFS_OCI_PASSWORD).
    #[arg(long, value_name = "PASSWORD", requires = "oci_username")]
    oci_password: Option<String>,
    /// With --oci: plain HTTP (a registry without TLS, e.g. on localhost).
    #[arg(long, requires = "oci")]
    oci_insecure: bool,
    /// Build from the objects of an S3 bucket (AWS or compatible: MinIO, Ceph RGW, ...)
    /// under a prefix: `BUCKET[/PREFIX]`. Each object becomes a file at its key (mode
    /// 0644, your uid and gid, its last-modified time), a key ending in `/` a directory
    /// (0755), as mkfs.erofs's `--s3`; the objects are fetched into a tar beside IMAGE
    /// (removed afterwards) and built from it. Endpoint and credentials: --s3-endpoint,
    /// --s3-passwd-file, or the AWS_* environment; only `IMAGE` is given as a path.
    #[arg(long, value_name = "BUCKET[/PREFIX]", conflicts_with_all = ["tar", "tar_index", "oci"])]
    s3: Option<String>,
    /// With --s3: the access key and secret from an s3fs password file (one line,
    /// `ACCESS_KEY:SECRET_KEY`).
    #[arg(long, value_name = "FILE", requires = "s3")]
    s3_passwd_file: Option<PathBuf>,
    /// With --s3: the bucket's region (default AWS_REGION, else us-east-1).
    #[arg(long, value_name = "REGION", requires = "s3")]
    s3_region: Option<String>,
    /// With --s3: virtual-hosted-style requests (`BUCKET.ENDPOINT/KEY`, AWS's) instead
    /// of path-style (`ENDPOINT/BUCKET/KEY`).
    #[arg(long, requires = "s3")]
    s3_virtual_hosted: bool,
    /// Tar input: OCI whiteouts (`.wh.NAME`, `.wh..wh..opq`) become overlayfs
    /// whiteouts (char 0:0) and opaque directories (`trusted.overlay.opaque=y`).
    #[arg(long)]
    aufs: bool,
    /// Leave overlayfs whiteouts (char 0:0) and `trusted.overlay.opaque` out of the
    /// image (`--ovlfs-strip` or `--ovlfs-strip=1`; `=0` keeps them).
    #[arg(
        long,
        value_name = "0|1",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "1"
    )]
    ovlfs_strip: Option<u8>,
    /// Block size in bytes: 512, 1024, 2048 or 4096 (default 4096; 512 with
    /// --tar-index).
    #[arg(short = 'b', long)]
    block_size: Option<u32>,
    /// Tar index mode (mkfs.erofs's `--tar=i`): the image holds metadata only, its
    /// regular files point into the (uncompressed) tar, which is mounted beside it as
    /// an extra device: `mount -t erofs -o ro,loop,device=/dev/loopN IMAGE DIR` with
    /// the tar on loop device N (`losetup -r`). 512-byte blocks.
    #[arg(long, requires = "tar")]
    tar_index: bool,
    /// The tar holds headers only (mkfs.erofs's `--tar=headerball`): no data follows a
    /// regular file's header, and each file is its size of zeros, stored as a hole.
    /// For metadata-only images whose file data lives elsewhere, e.g. an overlayfs
    /// data-only lower layer the files' `trusted.overlay.redirect` and
    /// `trusted.overlay.metacopy` xattrs (PAX `SCHILY.xattr.*`) point at (composefs).
    #[arg(long, requires = "tar", conflicts_with = "tar_index")]
    tar_headerball: bool,
    /// Reserve space for the file data without storing it (mkfs.erofs's
    /// `--clean=rvsp`): every non-empty regular file gets its blocks in the image,
    /// uncompressed and contiguous, holding zeros until the data is written there
    /// later (a hole in the image file until then). With --block-map, where.
    #[arg(long, conflicts_with_all = ["tar_index", "blobdev", "verity", "fsverity_digests"])]
    reserve_data: bool,
    /// Write a line per file of --reserve-data to FILE when the build succeeds, in
    /// block order: `BLKADDR NBLOCKS SRCOFF [ZEROED]` (hex; ZEROED, the bytes of the
    /// last block past the file's end, decimal and only when not 0), where SRCOFF is
    /// the data's byte offset in the (decompressed) tar, 0 for other sources. Copy
    /// NBLOCKS blocks' worth of the tar from SRCOFF to block BLKADDR of the image,
    /// zeroing the last ZEROED bytes, and the image holds the data (mkfs.erofs's
    /// `--tar=f,MAPFILE` format).
    #[arg(long, value_name = "FILE")]
    block_map: Option<PathBuf>,
    /// Make every file owned by root (uid 0, gid 0).
    #[arg(long)]
    all_root: bool,
    /// Set every file's uid.
    #[arg(long, value_name = "UID")]
    force_uid: Option<u32>,
    /// Set every file's gid.
    #[arg(long, value_name = "GID")]
    force_gid: Option<u32>,
    /// Add N to every uid (after --all-root / --force-uid), e.g. for a user namespace.
    #[arg(long, value_name = "N", default_value_t = 0)]
    uid_offset: u32,
    /// Add N to every gid (after --all-root / --force-gid).
    #[arg(long, value_name = "N", default_value_t = 0)]
    gid_offset: u32,
    /// Store every name of a hardlinked file as a file of its own.
    #[arg(long)]
    hard_dereference: bool,
    /// Leave the source's xattrs out (ACLs and SELinux labels too).
    #[arg(long)]
    no_xattrs: bool,
    /// SELinux labels: give every file the `security.selinux` context that this
    /// file_contexts file (text form: `REGEX [TYPE] CONTEXT` lines) selects for its path
    /// and type, in place of the source's label (as mkfs.erofs's `--file-contexts`:
    /// plain paths beat regexes, else the last match in the file wins; `<<none>>`: no
    /// label). Paths are `/MOUNT-POINT/PATH` (see --mount-point).
    #[arg(long, value_name = "FILE")]
    file_contexts: Option<PathBuf>,
    /// Android's canned fs_config (as mkfs.erofs built for Android): owner, permission
    /// bits and capabilities for every path, in place of the source's. Lines `PATH UID
    /// GID MODE [capabilities=CAPS]` (PATH relative to the partition root, `/` or a
    /// line starting with a space for the root; MODE octal; CAPS e.g. `0x1000`); the
    /// last line of a path wins; a path not listed is an error. Non-zero capabilities
    /// become the `security.capability` xattr. Paths are `MOUNT-POINT/PATH` (see
    /// --mount-point), the root the empty path.
    #[arg(long, value_name = "FILE")]
    fs_config_file: Option<PathBuf>,
    /// Where the image will be mounted (e.g. `/system`): the prefix of the paths
    /// looked up in --file-contexts and --fs-config-file. Default: `/`.
    #[arg(long, value_name = "PATH")]
    mount_point: Option<PathBuf>,
    /// Make the root directory's xattr area at least this many bytes (at most 65,532;
    /// the rest zeros), as mkfs.erofs's `--root-xattr-isize`: room for a tool that adds
    /// xattrs to the root of the image in place later.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    root_xattr_isize: u32,
    /// A long xattr name prefix (repeatable, at most 128, each at most 255 bytes;
    /// Linux 6.4+), e.g. `trusted.overlay.`: every xattr whose name starts with it
    /// (the longest given that fits) stores only the rest of its name, as mkfs.erofs's
    /// `--xattr-prefix`. The prefix table goes into the packed inode when the image has
    /// one, else behind the superblock (`-E plain-xattr-prefixes`: always there).
    #[arg(long, value_name = "PREFIX")]
    xattr_prefix: Vec<std::ffi::OsString>,
    /// Record each non-empty regular file's content fingerprint (`sha256:` and the
    /// SHA-256 of its data) in an xattr named NAME (default `erofs.fingerprint.v1`, a
    /// name no namespace lists: only the kernel sees it), a long prefix of its own
    /// named in the superblock, as mkfs.erofs's `--xattr-inode-digest`: kernels with
    /// EROFS page-cache sharing share the cached pages of identical files across
    /// images by it. Older kernels ignore it. `ferofs stat` shows it, `check`
    /// verifies it.
    #[arg(
        long,
        value_name = "NAME",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "erofs.fingerprint.v1"
    )]
    xattr_inode_digest: Option<std::ffi::OsString>,
    /// Leave out this path (relative to the source; repeatable).
    #[arg(long, value_name = "PATH")]
    exclude_path: Vec<PathBuf>,
    /// Leave out paths matching this regex (relative to the source; repeatable).
    #[arg(long, value_name = "REGEX")]
    exclude_regex: Vec<String>,
    /// Volume label (at most 15 bytes).
    #[arg(short = 'L', long)]
    label: Option<String>,
    /// Filesystem UUID, or "random". Default: derived from the content (reproducible).
    #[arg(short = 'U', long)]
    uuid: Option<String>,
    /// Build time and every file's mtime, in seconds since the epoch.
    #[arg(short = 'T', long, allow_negative_numbers = true)]
    timestamp: Option<i64>,
    /// With -T: the timestamp is the build time only, files keep their own mtimes
    /// (mkfs.erofs's `--mkfs-time`).
    #[arg(long, requires = "timestamp")]
    mkfs_time: bool,
    /// Store the build time instead of each file's mtime (smaller inodes).
    #[arg(long)]
    ignore_mtime: bool,
    /// Compression: `ALG[,level=N][,dictsize=B][:ALG2...]` with ALG in lz4, lz4hc, lzma,
    /// deflate, zstd; `none` for an uncompressed image. Several algorithms may be listed
    /// for --compress-hints to choose from (index 0 is the default).
    #[arg(
        short = 'z',
        long = "compress",
        default_value = "lz4hc,level=9",
        value_name = "ALGS"
    )]
    compress: String,
    /// Physical cluster size in bytes: one block (default) up to 1 MiB.
    #[arg(short = 'C', long = "pcluster-size", value_name = "BYTES")]
    pcluster_size: Option<u32>,
    /// Files stored uncompressed (every file with `-z none`) become chunk-based with
    /// chunks of BYTES (a power of two, at least the block size): identical chunks are
    /// stored once (`-E ^dedupe`: not), chunks of zeros and holes take no space, and
    /// runs of chunks stored one after another merge into bigger chunks, as mkfs.erofs's
    /// `--chunksize`. `-E force-chunk-indexes`: 8-byte chunk indexes instead of 4-byte
    /// block map entries.
    #[arg(long, value_name = "BYTES")]
    chunksize: Option<u32>,
    /// With --chunksize: every regular file's data goes, as chunks (deduplicated as
    /// --chunksize says), to BLOB, a file or block device that becomes the image's
    /// extra device; the image keeps the metadata only (as mkfs.erofs's `--blobdev`).
    /// Mount with `mount -o loop,device=/dev/loopN IMAGE DIR` (BLOB on a loop device);
    /// `ferofs` reads the image and BLOB concatenated (`cat IMAGE BLOB`).
    #[arg(long, value_name = "BLOB")]
    blobdev: Option<PathBuf>,
    /// Also write a VMDK descriptor to FILE that joins the image and its extra devices
    /// (the --blobdev blob, the --tar-index tar) into one virtual disk for a VM (as
    /// mkfs.erofs's `--vmdk-desc`): extents of at most 2 GiB, in device-table order,
    /// which is the image's unified address space.
    #[arg(long, value_name = "FILE")]
    vmdk_desc: Option<PathBuf>,
    /// Round the image's size up to a multiple of N blocks (N rounded up to a power of
    /// two; the blocks added are zeros), as mkfs.erofs's `--fsalignblks`: e.g. for a
    /// partition or a disk image that wants whole MiB.
    #[arg(long, value_name = "N", default_value_t = 1)]
    fsalignblks: u32,
    /// Start every file's data (the packed inode's too) at a block address that is a
    /// multiple of N blocks, for storage that works in stripes, as mkfs.erofs's
    /// `--dsunit`: the image grows by the gaps. With --chunksize only when N is at most
    /// one chunk (else ignored, with a warning); a file whose first chunk or pcluster is
    /// shared (-E dedupe) stays where the one it shares is.
    #[arg(long, value_name = "N", default_value_t = 0)]
    dsunit: u32,
    /// Most bytes one compressed extent may decode to (k, m suffixes; at least the block
    /// size), as mkfs.erofs's `--max-extent-bytes`: bounds what a random read
    /// decompresses when data compresses very well (by default an extent takes as much
    /// input as fills its pcluster, up to the kernel's limit). At or below -C the
    /// pclusters then hold fixed-size input, as SquashFS blocks do.
    #[arg(long, value_name = "BYTES")]
    max_extent_bytes: Option<String>,
    /// Per-file compression policy file (mkfs.erofs format: `PCLUSTER [ALG_INDEX] REGEX`).
    #[arg(long, value_name = "FILE")]
    compress_hints: Option<PathBuf>,
    /// Extended options, comma-separated, later ones win, `^` negates:
    /// `ztailpacking` (compressed tails inline behind the inode), `fragments[=BYTES]`
    /// (compressed tails and small files packed together in the packed inode; BYTES: its
    /// pcluster size), `all-fragments[=BYTES]` (every file in the packed inode), `dedupe`
    /// (identical data stored once), `48bit` (the 48-bit layout, Linux 6.15+: compact
    /// 32-byte inodes keep per-file mtimes), `dot-omitted` (no "." directory entries;
    /// implies 48bit), `noinline_data` (= `^inline_data`), `force-inode-compact` (implies
    /// --ignore-mtime; in the 48-bit layout mtimes are kept to the second),
    /// `force-inode-extended`, `nosbcrc` (no superblock checksum), `force-chunk-indexes`
    /// / `force-inode-blockmap` (with --chunksize), `legacy-compress` (full 8-byte
    /// lcluster indexes for every compressed file, never compact ones; in the 48-bit
    /// layout encoded extents still win where shorter), `plain-xattr-prefixes` (see
    /// --xattr-prefix), and the preset `smallest` (=
    /// `ztailpacking,fragments,dedupe`: the smallest image Linux 6.1+ mounts).
    #[arg(short = 'E', value_name = "OPTS")]
    extended: Vec<String>,
    /// Metadata compression (Linux 6.17+): every inode, with its xattrs, inline tail and
    /// index, goes into one "metabox" inode compressed with the first -z algorithm; BYTES
    /// is its pcluster size (default: -C). Saves most on trees of many small files.
    /// Implies the 48-bit layout. `:ALG` picks the metabox's algorithm: an index into the
    /// -z list, or `ALG[,level=N]` (added to the image's algorithms), e.g. `-z lzma
    /// -m=4096:lz4`: small data, fast lookups. (mkfs.erofs: `-mBYTES[:ALG]`; here `-m`,
    /// `-m=BYTES` or `-m=BYTES:ALG`.)
    #[arg(
        short = 'm',
        long,
        value_name = "BYTES[:ALG]",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "0"
    )]
    metabox: Option<String>,
    /// Worker threads (0 = all cores). Output is identical for any value.
    #[arg(short = 'j', long, default_value_t = 0)]
    threads: usize,
    /// Peak memory to stay under (e.g. 512m, 2g; 0: no limit). With LZMA, or zstd
    /// from level 10, at big pclusters each compression thread's codec takes tens of
    /// MiB: fewer threads than -j run when more would not fit (a warning says so).
    /// Output is identical for any value.
    #[arg(long, value_name = "SIZE", default_value = "512m")]
    memory_limit: String,
    /// fsync the image before renaming it into place (crash-safe, slower).
    #[arg(long)]
    fsync: bool,
    /// Print nothing but errors on stderr: no progress bar, no summary.
    #[arg(short, long)]
    quiet: bool,
    /// Print the summary as one JSON object on stdout (instead of lines on stderr).
    #[arg(long)]
    json: bool,
    /// Data order: a file listing paths (one per line, relative to the source) whose
    /// data goes first, contiguous, in that order (e.g. what a program reads at start-up);
    /// their inodes and the directories on their paths go first in the metadata too;
    /// listed files are never put in fragments. `none` (mkfs.erofs's spelling): no list.
    #[arg(long, value_name = "FILE")]
    sort: Option<PathBuf>,
    /// With --sort: compress the listed files with ALG (`ALG[,level=N]`, as -z) instead
    /// of the first -z algorithm; the image then holds two algorithms. For start-up
    /// speed from zstd or lzma images: `-z zstd --sort list --sort-compress lz4hc` keeps
    /// what the program reads at start-up fast to decode. The listed files' rule comes
    /// before any --compress-hints line; their pcluster size is -C. `none`: the listed
    /// files are stored uncompressed (start-up reads then decode nothing).
    #[arg(long, value_name = "ALG", requires = "sort")]
    sort_compress: Option<String>,
    /// Integrity: append a dm-verity hash tree (sha256, 4096-byte data and hash blocks,
    /// with veritysetup's superblock) behind the image, and print its root hash and the
    /// `veritysetup open` command line on stdout (even with -q; in the object with
    /// --json). The image itself is unchanged and mounts as before. 4096-byte blocks.
    #[arg(long)]
    verity: bool,
    /// The verity salt in hex, at most 256 bytes (`-`: none). Default: 32 bytes
    /// derived from the image's UUID, so the same tree gives the same bytes.
    #[arg(long, value_name = "HEX", requires = "verity")]
    verity_salt: Option<String>,
    /// Integrity per file: store each regular file's fs-verity digest (SHA-256, 4096-byte
    /// blocks, no salt; what `fsverity digest` prints) in a `trusted.overlay.metacopy`
    /// xattr, as composefs does, for overlayfs's `verity=require`.
    #[arg(long)]
    fsverity_digests: bool,
}

/// Hex digits to bytes (`-` or nothing: no bytes).
pub fn parse_hex(what: &str, s: &str) -> Result<Vec<u8>> {
    let s = s.trim();
    if s == "-" {
        return Ok(Vec::new());
    }
    if !s.len().is_multiple_of(2) || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        bail!("{what}: {s:?} is not an even number of hex digits");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(s.get(i..i + 2).unwrap_or(""), 16)
                .with_context(|| format!("{what}: {s:?}"))
        })
        .collect()
}

/// `--sort-compress`: the files of the `--sort` list compressed with `spec` (added to
/// the image's algorithms unless it is one of them), or stored uncompressed when `spec`
/// is None (`none`), through a compress hint matching exactly their paths, ahead of
/// any other hint.
/// The index of `spec` in the image's algorithm list, added at the end when not there
/// (for `--sort-compress` and `-m=BYTES:ALG`).
fn algorithm_index(c: &mut Compression, spec: CompressorSpec) -> usize {
    c.algorithms
        .iter()
        .position(|a| *a == spec)
        .unwrap_or_else(|| {
            c.algorithms.push(spec);
            c.algorithms.len() - 1
        })
}

fn sort_hint(c: &mut Compression, spec: Option<CompressorSpec>, sort: &[Vec<u8>]) -> Result<()> {
    if sort.is_empty() {
        eprintln!("warning: --sort-compress: the --sort list is empty, so no file uses it");
        return Ok(());
    }
    let uncompressed = spec.is_none();
    // Unused when the files are stored uncompressed.
    let algorithm = spec.map_or(0, |spec| algorithm_index(c, spec));
    // The builder matches hints against the path as (lossy) UTF-8.
    let alternatives: Vec<String> = sort
        .iter()
        .map(|p| regex::escape(&String::from_utf8_lossy(p)))
        .collect();
    let re = format!("^(?:{})$", alternatives.join("|"));
    let regex = regex::RegexBuilder::new(&re)
        .size_limit(256 << 20)
        .build()
        .context("--sort-compress: the --sort list as one pattern")?;
    c.hints.insert(
        0,
        Hint {
            pcluster_size: c.pcluster_size,
            algorithm,
            regex,
            uncompressed,
        },
    );
    Ok(())
}

/// Read a `--sort` list: one path a line, relative to the source (a leading `/` or
/// `./` is dropped), empty lines skipped.
pub fn read_sort_list(path: &std::path::Path) -> Result<Vec<Vec<u8>>> {
    if path.as_os_str() == "none" {
        return Ok(Vec::new());
    }
    let text = std::fs::read(path).with_context(|| format!("--sort {}", path.display()))?;
    Ok(text
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .map(|l| {
            let l = l.strip_prefix(b"./").unwrap_or(l);
            let start = l.iter().position(|&b| b != b'/').unwrap_or(l.len());
            l[start..].to_vec()
        })
        .filter(|l| !l.is_empty())
        .collect())
}

fn parse_uuid(s: &str) -> Result<UuidChoice> {
    if s == "random" {
        return Ok(UuidChoice::Random);
    }
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("--uuid: {s:?} is not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) or \"random\"");
    }
    let mut u = [0u8; 16];
    for (i, b) in u.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(UuidChoice::Fixed(u))
}

pub fn options(a: &BuildArgs) -> Result<BuildOptions> {
    let mut o = BuildOptions::default();
    let merge = a.by_reference || a.paths.len() > 2;
    let block_size = match (a.block_size, merge, a.paths.len()) {
        (Some(b), ..) => b,
        // The uppermost source image's (as mkfs.erofs).
        (None, true, n) if n >= 2 && crate::source::is_erofs_file(&a.paths[n - 2]) => {
            let top = &a.paths[n - 2];
            ferofs_reader::Image::open(top)
                .with_context(|| format!("reading {}", top.display()))?
                .block_size()
        }
        _ if a.tar_index => 512,
        _ => 4096,
    };
    if !(512..=4096).contains(&block_size) || !block_size.is_power_of_two() {
        bail!("--block-size must be 512, 1024, 2048 or 4096 (got {block_size})");
    }
    o.block_size = block_size;
    o.tar_index = a.tar_index;
    o.tar_headerball = a.tar_headerball;
    o.reserve_data = a.reserve_data;
    o.block_map = a.block_map.clone();
    o.aufs = a.aufs;
    o.ovlfs_strip = match a.ovlfs_strip {
        None | Some(0) => false,
        Some(1) => true,
        Some(n) => bail!("--ovlfs-strip={n}: 0 or 1"),
    };
    if a.aufs && a.tar.is_empty() && a.oci.is_none() && a.s3.is_none() {
        bail!("--aufs applies to tar input (--tar, --oci)");
    }
    o.all_root = a.all_root;
    o.force_uid = a.force_uid;
    o.force_gid = a.force_gid;
    o.uid_offset = a.uid_offset;
    o.gid_offset = a.gid_offset;
    o.hard_dereference = a.hard_dereference;
    o.no_xattrs = a.no_xattrs;
    if let Some(f) = &a.file_contexts {
        o.file_contexts = Some(std::sync::Arc::new(
            ferofs_builder::selabel::FileContexts::load(f)?,
        ));
    }
    if let Some(f) = &a.fs_config_file {
        o.fs_config = Some(std::sync::Arc::new(
            ferofs_builder::fsconfig::FsConfig::load(f)?,
        ));
    }
    if let Some(m) = &a.mount_point {
        if a.file_contexts.is_none() && a.fs_config_file.is_none() {
            bail!("--mount-point: only --file-contexts and --fs-config-file use it");
        }
        o.mount_point = ferofs_builder::selabel::mount_point(m);
    }
    if a.root_xattr_isize as usize > ferofs_builder::xattrs::ROOT_XATTR_ISIZE_MAX {
        bail!(
            "--root-xattr-isize {}: at most {} (an xattr area's limit)",
            a.root_xattr_isize,
            ferofs_builder::xattrs::ROOT_XATTR_ISIZE_MAX
        );
    }
    o.root_xattr_isize = a.root_xattr_isize as usize;
    {
        use std::os::unix::ffi::OsStrExt;
        o.xattr_prefixes = a
            .xattr_prefix
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect();
        o.inode_digest = a.xattr_inode_digest.as_ref().map(|p| p.as_bytes().to_vec());
    }
    o.exclude_paths = a.exclude_path.clone();
    for r in &a.exclude_regex {
        o.exclude_regex
            .push(regex::Regex::new(r).with_context(|| format!("--exclude-regex {r:?}"))?);
    }
    if let Some(l) = &a.label {
        if l.len() > 15 {
            bail!("--label: at most 15 bytes (got {})", l.len());
        }
        o.label = Some(l.clone());
    }
    if let Some(u) = &a.uuid {
        o.uuid = parse_uuid(u)?;
    }
    o.timestamp = a.timestamp;
    o.timestamp_build_only = a.mkfs_time;
    o.ignore_mtime = a.ignore_mtime;
    if let Ok(s) = std::env::var("SOURCE_DATE_EPOCH") {
        if !s.is_empty() {
            o.source_date_epoch = Some(
                s.trim()
                    .parse()
                    .with_context(|| format!("SOURCE_DATE_EPOCH={s:?} is not a number"))?,
            );
        }
    }
    let ext = parse_extended(&a.extended)?;
    let ztail = ext.ztailpacking;
    o.inline_data = ext.inline_data;
    o.dedupe = ext.dedupe;
    o.fragments = ext.fragments;
    o.layout48 = ext.layout48;
    o.dot_omitted = ext.dot_omitted;
    o.inode_version = ext.inode_version;
    o.sb_checksum = ext.sb_checksum;
    o.plain_xattr_prefixes = ext.plain_xattr_prefixes;
    o.output_offset = crate::source::offset()?;
    if a.fsalignblks > 1 << 31 {
        bail!("--fsalignblks {}: at most 2^31 blocks", a.fsalignblks);
    }
    o.fs_align_blocks = a.fsalignblks;
    if a.dsunit > 1 << 31 {
        bail!("--dsunit {}: at most 2^31 blocks", a.dsunit);
    }
    o.dsunit = a.dsunit;
    if let Some(cs) = a.chunksize {
        if a.tar_index {
            bail!(
                "--chunksize and --tar-index: a tar index points into the tar, it stores no chunks"
            );
        }
        if !cs.is_power_of_two() || cs < block_size || u64::from(cs) > u64::from(block_size) << 31 {
            bail!(
                "--chunksize {cs}: a power of two from the block size ({block_size}) up to \
                 2^31 blocks"
            );
        }
        o.chunks = Some(ChunkOptions {
            bits: cs.trailing_zeros() as u8,
            indexes: ext.chunk_indexes,
            dedupe: ext.dedupe_given != Some(false),
        });
    } else if ext.chunk_indexes {
        bail!("-E force-chunk-indexes needs --chunksize");
    }
    if let Some(b) = &a.blobdev {
        if a.chunksize.is_none() {
            bail!("--blobdev needs --chunksize (the data goes to the blob as chunks)");
        }
        if a.extended.iter().any(|e| {
            e.split(',')
                .any(|f| f.trim_start_matches('^') == "force-inode-blockmap")
        }) {
            bail!("--blobdev: chunks on another device need chunk indexes, not -E force-inode-blockmap");
        }
        if a.compress != "none" {
            bail!("--blobdev applies to uncompressed images (-z none)");
        }
        o.blobdev = Some(b.clone());
    }
    if let Some(s) = &a.sort {
        o.sort = read_sort_list(s)?;
    }
    o.threads = a.threads;
    o.memory_limit = crate::source::parse_size("--memory-limit", &a.memory_limit)?;
    o.fsync = a.fsync;
    o.fsverity_digests = a.fsverity_digests;
    if a.verity {
        o.verity = Some(VerityOptions {
            salt: match &a.verity_salt {
                Some(s) => {
                    let salt = parse_hex("--verity-salt", s)?;
                    if salt.len() > 256 {
                        bail!("--verity-salt: at most 256 bytes (got {})", salt.len());
                    }
                    Some(salt)
                }
                None => None,
            },
        });
        if block_size != 4096 {
            bail!("--verity needs 4096-byte blocks (got -b {block_size})");
        }
    }
    let (metabox_size, metabox_alg) = match a.metabox.as_deref() {
        None => (None, None),
        Some(m) => {
            let (size, alg) = match m.split_once(':') {
                Some((s, alg)) => (s, Some(alg)),
                None => (m, None),
            };
            let size = match size {
                "" => 0,
                s => s
                    .parse::<u32>()
                    .with_context(|| format!("-m={m}: BYTES is a number"))?,
            };
            (Some(size), alg)
        }
    };
    if let Some(p) = metabox_size {
        o.metabox = true;
        o.metabox_pcluster_size = p;
    }
    if o.inode_version == InodeVersion::Compact && !o.layout48() {
        // A compact inode has no mtime of its own outside the 48-bit layout (which -m
        // and -E dot-omitted imply): as mkfs.erofs, the option implies --ignore-mtime.
        // In the layout each keeps its mtime to the second (the builder's time policy).
        o.ignore_mtime = true;
    }
    if a.compress != "none" {
        let mut c = Compression {
            algorithms: a
                .compress
                .split(':')
                .map(|s| CompressorSpec::parse(s).with_context(|| format!("-z {s:?}")))
                .collect::<Result<_>>()?,
            pcluster_size: a.pcluster_size.unwrap_or(block_size),
            ztailpacking: ztail,
            ..Compression::default()
        };
        if let Some(h) = &a.compress_hints {
            let text = std::fs::read_to_string(h)
                .with_context(|| format!("--compress-hints {}", h.display()))?;
            c.hints = parse_hints(&text, h)?;
        }
        if let Some(s) = &a.sort_compress {
            let spec = match s.as_str() {
                "none" => None,
                _ => Some(
                    CompressorSpec::parse(s).with_context(|| format!("--sort-compress {s:?}"))?,
                ),
            };
            sort_hint(&mut c, spec, &o.sort)?;
        }
        if o.chunks.is_some() {
            bail!(
                "--chunksize applies to uncompressed images (-z none): in a compressed image \
                 identical data is shared with -E dedupe"
            );
        }
        if let Some(m) = &a.max_extent_bytes {
            let n = crate::source::parse_size("--max-extent-bytes", m)?;
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            if n < block_size {
                bail!("--max-extent-bytes {n}: at least the block size ({block_size})");
            }
            c.max_extent = n;
        }
        c.full_index = ext.full_index;
        if let Some(alg) = metabox_alg {
            o.metabox_algorithm = match alg.parse::<usize>() {
                Ok(i) if i < c.algorithms.len() => i,
                Ok(i) => bail!(
                    "-m=...:{i}: the -z list has {} algorithm(s), counted from 0",
                    c.algorithms.len()
                ),
                Err(_) => algorithm_index(
                    &mut c,
                    CompressorSpec::parse(alg).with_context(|| format!("-m=...:{alg}"))?,
                ),
            };
        }
        o.compression = Some(c);
    } else if a.pcluster_size.is_some()
        || a.compress_hints.is_some()
        || a.sort_compress.is_some()
        || ztail
        || o.fragments != Fragments::Off
        || metabox_size.is_some_and(|p| p != 0)
        || metabox_alg.is_some()
        || a.max_extent_bytes.is_some()
        || ext.full_index
    {
        bail!(
            "-C, --compress-hints, --sort-compress, --max-extent-bytes, -E ztailpacking, -E fragments, -E legacy-compress and a metabox pcluster size or algorithm need compression (not -z none)"
        );
    }
    Ok(o)
}

/// On SIGINT, SIGTERM or SIGHUP: remove the temporary image and scratch files, then exit
/// 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a shell would report.
fn stop_on_signals() -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("build: install signal handlers")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let n = ferofs_builder::cleanup::remove_all();
                let name = match sig {
                    SIGINT => "SIGINT",
                    SIGTERM => "SIGTERM",
                    _ => "SIGHUP",
                };
                eprintln!("\nferofs: build stopped by {name}; removed {n} temporary file(s)");
                std::process::exit(128 + sig);
            }
        })
        .context("build: start the signal thread")?;
    Ok(())
}

/// The directory of the output image, where `--oci` and `--s3` keep what they fetch
/// (its disk holds the image anyway; /tmp may be a small tmpfs).
fn beside_image(a: &BuildArgs, option: &str) -> Result<PathBuf> {
    let [image] = a.paths.as_slice() else {
        bail!("build {option}: give only the output IMAGE as a path");
    };
    Ok(match image.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    })
}

/// The access key and secret of an s3fs password file (`ACCESS_KEY:SECRET_KEY`).
fn s3_passwd(path: &std::path::Path) -> Result<(String, String)> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    anyhow::ensure!(meta.is_file(), "{}: not a regular file", path.display());
    anyhow::ensure!(
        meta.len() < 4096,
        "{}: too large for a password file",
        path.display()
    );
    if meta.permissions().mode() & 0o077 != 0 {
        eprintln!(
            "warning: {}: readable by group or others (chmod 600 it)",
            path.display()
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let Some((ak, sk)) = line.trim_end_matches('\r').split_once(':') else {
        bail!("{}: expected ACCESS_KEY:SECRET_KEY", path.display());
    };
    Ok((ak.to_string(), sk.to_string()))
}

/// The tar entry of S3 object `obj`: a file at its key (0644), or a directory (0755).
fn tar_entry(obj: &ferofs_remote::bucket::S3Object, uid: u32, gid: u32) -> crate::tarw::Entry {
    crate::tarw::Entry {
        path: format!("./{}", obj.key.trim_start_matches('/')).into_bytes(),
        kind: if obj.dir {
            crate::tarw::Kind::Dir
        } else {
            crate::tarw::Kind::File
        },
        mode: if obj.dir { 0o755 } else { 0o644 },
        uid,
        gid,
        mtime: obj.mtime,
        mtime_nsec: obj.mtime_nsec,
        size: if obj.dir { 0 } else { obj.size },
        link: Vec::new(),
        dev: (0, 0),
        xattrs: Vec::new(),
        sparse: None,
    }
}

/// Fetch the objects `--s3 BUCKET[/PREFIX]` names into a tar beside the output image:
/// each object a file at its key, a key ending in `/` a directory.
fn fetch_s3(a: &BuildArgs, spec: &str) -> Result<tempfile::NamedTempFile> {
    use std::io::Write;
    let dir = beside_image(a, "--s3")?;
    let spec = spec.trim_start_matches("s3://").trim_start_matches('/');
    let (bucket, prefix) = spec.split_once('/').unwrap_or((spec, ""));
    let ro = crate::source::remote_options()?;
    let mut o = ferofs_remote::bucket::S3Options {
        endpoint: ro.s3_endpoint.map(|e| {
            if e.contains("://") {
                e
            } else {
                format!("https://{e}")
            }
        }),
        region: a.s3_region.clone(),
        virtual_hosted: a.s3_virtual_hosted,
        timeout: ro.timeout,
        ..Default::default()
    };
    if let Some(f) = &a.s3_passwd_file {
        let (ak, sk) = s3_passwd(f)?;
        (o.access_key, o.secret_key) = (Some(ak), Some(sk));
    }
    let t = Instant::now();
    let what = format!("s3://{spec}");
    let b = ferofs_remote::bucket::S3Bucket::open(bucket, &o).with_context(|| what.clone())?;
    let objects = b.list(prefix).with_context(|| format!("listing {what}"))?;
    let tmp = tempfile::Builder::new()
        .prefix(".ferofs-s3-")
        .suffix(".tar")
        .tempfile_in(&dir)
        .with_context(|| format!("a temporary tar in {}", dir.display()))?;
    let (uid, gid) = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    let mut w = std::io::BufWriter::with_capacity(1 << 20, tmp.as_file());
    let mut written = 0u64;
    let mut bytes = 0u64;
    let head = crate::tarw::global_header();
    w.write_all(&head)?;
    written += head.len() as u64;
    // Small objects are fetched in batches, several at a time (a bucket of many small
    // objects is latency-bound); a large one streams into the tar alone.
    const SMALL: u64 = 1 << 20;
    const BATCH_BYTES: u64 = 16 << 20;
    let mut i = 0;
    // Bounded: every turn writes at least one object.
    while i < objects.len() {
        let mut j = i;
        let mut held = 0u64;
        while j < objects.len()
            && (objects[j].dir || objects[j].size <= SMALL)
            && held + objects[j].size <= BATCH_BYTES
            && j - i < 64
        {
            held += objects[j].size;
            j += 1;
        }
        let batch: Vec<&ferofs_remote::bucket::S3Object> = if j > i {
            objects[i..j].iter().filter(|o| !o.dir).collect()
        } else {
            Vec::new()
        };
        let mut data = b
            .fetch_many(&batch)
            .with_context(|| format!("fetching objects of {what}"))?
            .into_iter();
        let end = j.max(i + 1);
        for obj in &objects[i..end] {
            let mut h = Vec::new();
            tar_entry(obj, uid, gid).encode(&mut h);
            w.write_all(&h)?;
            written += h.len() as u64;
            if obj.dir {
                continue;
            }
            if j > i {
                let d = data.next().context("fetched objects out of step")?;
                w.write_all(&d)?;
            } else {
                b.fetch(obj, &mut w)
                    .with_context(|| format!("fetching s3://{bucket}/{}", obj.key))?;
            }
            let pad = crate::tarw::padding(obj.size);
            w.write_all(&vec![0u8; pad])?;
            written += obj.size + pad as u64;
            bytes += obj.size;
        }
        i = end;
    }
    w.write_all(&crate::tarw::trailer(written))?;
    w.flush()?;
    drop(w);
    if !a.quiet {
        eprintln!(
            "fetched {what}: {} objects, {bytes} bytes in {:.1} s",
            objects.len(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(tmp)
}

/// Fetch the layers `--oci` names into a temporary directory beside the output image.
fn pull_oci(a: &BuildArgs, reference: &str) -> Result<ferofs_remote::oci::Pulled> {
    let dir = beside_image(a, "--oci")?;
    let password = a
        .oci_password
        .clone()
        .or_else(|| std::env::var("FEROFS_OCI_PASSWORD").ok());
    let o = ferofs_remote::oci::OciOptions {
        platform: a
            .oci_platform
            .clone()
            .unwrap_or_else(ferofs_remote::oci::host_platform),
        layer: a.oci_layer,
        blob: a.oci_blob.clone(),
        username: a.oci_username.clone(),
        password: password.filter(|_| a.oci_username.is_some()),
        insecure: a.oci_insecure,
        ..Default::default()
    };
    let t = Instant::now();
    let mut o = o;
    let view = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let p = Arc::new(ferofs_remote::oci::PullProgress::default());
        o.progress = Some(p.clone());
        BarView::pull(p, reference.to_string())
    });
    let p = ferofs_remote::oci::pull(reference, &o, &dir);
    if let Some(v) = view {
        v.finish();
    }
    let p = p.with_context(|| format!("pulling {reference}"))?;
    if !a.quiet {
        eprintln!(
            "pulled {reference} ({}, manifest {}): {} layer(s), {} bytes in {:.1} s",
            o.platform,
            p.manifest_digest,
            p.layers.len(),
            p.bytes,
            t.elapsed().as_secs_f64()
        );
    }
    Ok(p)
}

pub fn run(mut a: BuildArgs) -> Result<()> {
    let mut opts = options(&a)?;
    stop_on_signals()?;
    open_files_to_the_hard_limit();
    // --oci: the layers, fetched and checked, become the tar stack (kept until the
    // build is done).
    let _pulled = match a.oci.clone() {
        Some(r) => {
            let p = pull_oci(&a, &r)?;
            a.tar = p
                .layers
                .iter()
                .map(|l| l.clone().into_os_string())
                .collect();
            Some(p)
        }
        None => None,
    };
    // --s3: the objects, fetched into one tar (removed when the build ends).
    let _fetched = match a.s3.clone() {
        Some(spec) => {
            let t = fetch_s3(&a, &spec)?;
            a.tar = vec![t.path().as_os_str().to_owned()];
            Some(t)
        }
        None => None,
    };
    if opts.worker_threads() > 2 {
        // Two arenas for all threads: each arena keeps what was freed in it, and with
        // one per thread their high-water marks added up past --memory-limit (linux
        // tree, `-j 8`: 540-620 MiB, 450-505 with two). Up to `-j 2` the default costs
        // no memory and is the fastest. Set here, before the scan's and the workers'
        // threads start: a process-wide tunable is the program's choice, not the
        // library's.
        ferofs_compress::limit_malloc_arenas(2);
    }
    if crate::source::has_devices()
        && !(a.tar.is_empty()
            && a.paths.len() == 2
            && ferofs_builder::erofsin::is_erofs_image(&a.paths[0]))
    {
        bail!("--device: extra devices of an EROFS source image; this source is not one");
    }
    let t0 = Instant::now();
    // The bar only on a terminal: a log or a pipe gets no carriage returns.
    let view = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let p = Arc::new(Progress::new());
        opts.progress = Some(p.clone());
        BarView::build(p)
    });
    let (source, image) = match (a.tar.is_empty(), a.paths.as_slice()) {
        (true, [s, i]) => (s.display().to_string(), i.clone()),
        (true, [layers @ .., i]) if layers.len() >= 2 => {
            let names: Vec<String> = layers.iter().map(|l| l.display().to_string()).collect();
            (names.join(" + "), i.clone())
        }
        (false, [i]) if a.oci.is_some() => (a.oci.clone().unwrap_or_default(), i.clone()),
        (false, [i]) if a.s3.is_some() => (
            format!("s3://{}", a.s3.as_deref().unwrap_or_default()),
            i.clone(),
        ),
        (false, [i]) => {
            let names: Vec<String> = a
                .tar
                .iter()
                .map(|t| t.to_string_lossy().into_owned())
                .collect();
            (format!("tar {}", names.join(" + ")), i.clone())
        }
        (true, _) => bail!("build: give SOURCE and IMAGE (or --tar FILE and IMAGE)"),
        (false, _) => bail!("build --tar: give only the output IMAGE as a path"),
    };
    let layers = &a.paths[..a.paths.len() - 1];
    let all_images = a.tar.is_empty() && layers.iter().all(|p| crate::source::is_erofs_file(p));
    if (layers.len() > 1 || a.by_reference) && !all_images {
        if let Some(p) = layers
            .iter()
            .find(|p| !ferofs_builder::erofsin::is_erofs_image(p))
        {
            bail!(
                "build: {} is not an EROFS image (several sources, or --by-reference, \
                 take EROFS images only)",
                p.display()
            );
        }
        bail!("build: several sources, or --by-reference, take EROFS images only");
    }
    if let Some(base) = &a.base {
        if !crate::source::is_erofs_file(base) {
            bail!("--base {}: not an EROFS image", base.display());
        }
        if a.tar_index {
            bail!("--base with --tar-index: the tar index refers to one tar, not a stack");
        }
        if a.tar.is_empty() && !(layers.len() == 1 && layers[0].is_dir()) {
            bail!("--base: SOURCE must be a directory or --tar streams");
        }
    }
    let built = if let (Some(base), true) = (&a.base, a.tar.is_empty()) {
        onto(
            base,
            ferofs_builder::Layer::Dir(&layers[0]),
            &image,
            &opts,
            a.rewrite,
            a.quiet,
        )
    } else if all_images && (layers.len() > 1 || a.by_reference) {
        if !crate::source::devices().is_empty() && layers.len() > 1 {
            bail!("build: --device names the extra devices of one source image, not of several");
        }
        if a.by_reference {
            // The image would refer to the file it replaces.
            if let Some(l) = layers.iter().find(|l| same_file(l, &image)) {
                bail!(
                    "--by-reference: the output {} is the layer {} it would refer to",
                    image.display(),
                    l.display()
                );
            }
        }
        opts.source_devices = crate::source::devices();
        ferofs_builder::build_from_images(layers, &image, &opts, a.by_reference)
    } else if a.tar.is_empty() && ferofs_builder::squashfs::is_squashfs(&a.paths[0]) {
        ferofs_builder::build_from_squashfs(&a.paths[0], &image, &opts)
    } else if a.tar.is_empty() {
        let src = &a.paths[0];
        // A regular file or a block device (a partition holding an image).
        if crate::source::is_erofs_file(src) {
            // An EROFS image (magic at byte 1024): re-encode it, with its extra
            // devices when `--device` names them.
            opts.source_devices = crate::source::devices();
            ferofs_builder::build_from_erofs(src, &image, &opts)
        } else {
            ferofs_builder::build_from_dir(src, &image, &opts)
        }
    } else {
        let inputs: Vec<TarInput> = a.tar.iter().map(|t| TarInput::parse(t)).collect();
        if inputs
            .iter()
            .filter(|i| matches!(i, TarInput::Stdin))
            .count()
            > 1
        {
            bail!("--tar -: stdin can be read once");
        }
        match &a.base {
            Some(base) => onto(
                base,
                ferofs_builder::Layer::Tars(&inputs),
                &image,
                &opts,
                a.rewrite,
                a.quiet,
            ),
            None => ferofs_builder::build_from_tars(&inputs, &image, &opts),
        }
    };
    if let Some(v) = view {
        v.finish();
    }
    let report = built.with_context(|| format!("building {} from {source}", image.display()))?;
    if let Some(d) = &a.vmdk_desc {
        let devices: Vec<String> = if let Some(b) = &a.blobdev {
            vec![b.display().to_string()]
        } else if a.by_reference {
            // Merged by reference: the layers are the devices.
            layers.iter().map(|l| l.display().to_string()).collect()
        } else if a.tar_index {
            a.tar
                .iter()
                .map(|t| t.to_string_lossy().into_owned())
                .collect()
        } else {
            Vec::new()
        };
        crate::vmdk::write(d, &image, opts.output_offset, &devices)?;
    }
    let summary = Summary {
        image: &image,
        report: &report,
        seconds: t0.elapsed().as_secs_f64(),
        threads: opts.worker_threads(),
        peak_rss: peak_rss_bytes(),
    };
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    if a.json {
        println!("{}", summary.json());
    } else if let Some(v) = &report.verity {
        // The root hash is part of what the build made: stdout, even with -q.
        print!("{}", crate::report::verity_lines(&image, v));
    }
    if !a.json && !a.quiet {
        eprint!("{}", summary.human());
        if opts.metabox {
            eprintln!(
                "metabox      {} bytes of metadata stored in {} bytes",
                report.metabox_bytes, report.metabox_stored
            );
        }
        if std::env::var_os("FEROFS_CODEC_STATS").is_some() {
            // Compressor work, for benchmarks: bytes compressed per byte consumed.
            use std::sync::atomic::Ordering::Relaxed;
            eprintln!(
                "codec work   search {} trials over {} bytes; pieces {} bytes for {} consumed",
                ferofs_compress::search::TRIALS.load(Relaxed),
                ferofs_compress::search::TRIAL_BYTES.load(Relaxed),
                ferofs_compress::PIECE_BYTES.load(Relaxed),
                ferofs_compress::PIECE_CONSUMED.load(Relaxed),
            );
            eprintln!(
                "codec work   pieces overflowed {}, {} bytes compressed again to undo them",
                ferofs_compress::PIECE_OVERFLOWS.load(Relaxed),
                ferofs_compress::PIECE_REPLAYED.load(Relaxed),
            );
            eprintln!(
                "codec work   lz4hc/lzma calls {}, {} bytes consumed; lz4 sizing zstd pieces {} bytes",
                ferofs_compress::NATIVE_CALLS.load(Relaxed),
                ferofs_compress::NATIVE_CONSUMED.load(Relaxed),
                ferofs_compress::GUIDE_BYTES.load(Relaxed),
            );
            eprintln!(
                "codec work   refits {} ({} trials over {} bytes)",
                ferofs_compress::search::REFITS.load(Relaxed),
                ferofs_compress::search::REFIT_TRIALS.load(Relaxed),
                ferofs_compress::search::REFIT_BYTES.load(Relaxed),
            );
        }
    }
    Ok(())
}

/// The `-E` options, as mkfs.erofs spells them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extended {
    pub inline_data: bool,
    pub ztailpacking: bool,
    pub fragments: Fragments,
    pub dedupe: bool,
    pub layout48: bool,
    pub dot_omitted: bool,
    /// `dedupe` as given: Some(false) for an explicit `^dedupe`.
    pub dedupe_given: Option<bool>,
    pub inode_version: InodeVersion,
    pub sb_checksum: bool,
    /// `force-chunk-indexes` (true) or `force-inode-blockmap` (false), for --chunksize.
    pub chunk_indexes: bool,
    /// `legacy-compress`: full lcluster indexes for every compressed file.
    pub full_index: bool,
    /// `plain-xattr-prefixes`: the long-prefix table behind the superblock, never in
    /// the packed inode.
    pub plain_xattr_prefixes: bool,
}

/// Parse every `-E` argument in order: comma-separated options, `^` (or `no` for
/// `inline_data`) to negate, later options override earlier ones.
pub fn parse_extended(args: &[String]) -> Result<Extended> {
    let mut e = Extended {
        inline_data: true,
        ztailpacking: false,
        fragments: Fragments::Off,
        dedupe: false,
        layout48: false,
        dot_omitted: false,
        dedupe_given: None,
        inode_version: InodeVersion::Auto,
        sb_checksum: true,
        chunk_indexes: false,
        full_index: false,
        plain_xattr_prefixes: false,
    };
    for opt in args.iter().flat_map(|a| a.split(',')) {
        let (neg, body) = match opt.strip_prefix('^') {
            Some(b) => (true, b),
            None => (false, opt),
        };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        let size = || -> Result<u32> {
            match value {
                None => Ok(0),
                Some(v) => v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n > 0)
                    .with_context(|| format!("-E {name}={v}: a pcluster size in bytes")),
            }
        };
        if neg && value.is_some() {
            bail!("-E {opt}: a negated option takes no value");
        }
        if value.is_some() && !matches!(name, "fragments" | "all-fragments") {
            bail!("-E {opt}: {name} takes no value");
        }
        match name {
            "" if !neg => {}
            "inline_data" => e.inline_data = !neg,
            "noinline_data" if !neg => e.inline_data = false,
            "ztailpacking" => e.ztailpacking = !neg,
            "dedupe" => {
                e.dedupe = !neg;
                e.dedupe_given = Some(!neg);
            }
            "48bit" => e.layout48 = !neg,
            // As mkfs.erofs: the last one given wins, and `^` of either is no option.
            "force-inode-compact" if !neg => e.inode_version = InodeVersion::Compact,
            "force-inode-extended" if !neg => e.inode_version = InodeVersion::Extended,
            "nosbcrc" => e.sb_checksum = neg,
            "force-chunk-indexes" if !neg => e.chunk_indexes = true,
            "force-inode-blockmap" if !neg => e.chunk_indexes = false,
            "dot-omitted" => e.dot_omitted = !neg,
            "legacy-compress" => e.full_index = !neg,
            "plain-xattr-prefixes" => e.plain_xattr_prefixes = !neg,
            "fragments" if neg => {
                if matches!(e.fragments, Fragments::Tails { .. }) {
                    e.fragments = Fragments::Off;
                }
            }
            "all-fragments" if neg => {
                if matches!(e.fragments, Fragments::All { .. }) {
                    e.fragments = Fragments::Off;
                }
            }
            "fragments" => {
                e.fragments = Fragments::Tails {
                    pcluster_size: size()?,
                }
            }
            "all-fragments" => {
                e.fragments = Fragments::All {
                    pcluster_size: size()?,
                }
            }
            "smallest" if !neg => {
                e.ztailpacking = true;
                e.dedupe = true;
                if e.fragments == Fragments::Off {
                    e.fragments = Fragments::Tails { pcluster_size: 0 };
                }
            }
            _ => bail!(
                "-E: unknown extended option {opt:?} (known: ztailpacking, fragments[=BYTES], \
                 all-fragments[=BYTES], dedupe, 48bit, dot-omitted, inline_data, noinline_data, \
                 force-inode-compact, force-inode-extended, nosbcrc, force-chunk-indexes, \
                 force-inode-blockmap, legacy-compress, plain-xattr-prefixes, smallest; ^ negates)"
            ),
        }
    }
    Ok(e)
}

/// Raise the limit on open files to its hard limit: with fragments, the builder keeps
/// the small files it read open until the packed inode reads them again (as many as
/// the limit leaves room for; the rest it opens again by path, which costs more).
/// Distributions set the soft limit at 1024 and the hard one far above for this.
fn open_files_to_the_hard_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        // Nothing lost if refused: fewer files are kept open.
        let _ = setrlimit(Resource::Nofile, l);
    }
}

/// Whether `a` and `b` name one existing file (device and inode).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &std::path::Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    id(a).is_some() && id(a) == id(b)
}

/// `--base`: `layer` onto `base` into `image`, appended in place when `image` is
/// `base` (unless `rewrite`) and the options allow it, else a new image of the stack.
fn onto(
    base: &std::path::Path,
    layer: ferofs_builder::Layer<'_>,
    image: &std::path::Path,
    opts: &BuildOptions,
    rewrite: bool,
    quiet: bool,
) -> Result<ferofs_builder::BuildReport, ferofs_builder::BuildError> {
    if !rewrite && same_file(base, image) {
        match ferofs_builder::append_onto(base, layer, opts)? {
            ferofs_builder::Appended::Done(r) => return Ok(*r),
            ferofs_builder::Appended::Unsupported(why) => {
                if !quiet {
                    eprintln!(
                        "ferofs: not appending to {} in place ({why}): rebuilding the whole image",
                        image.display()
                    );
                }
            }
        }
    }
    ferofs_builder::build_onto(base, layer, image, opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Extended> {
        parse_extended(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn extended_options_parse_in_order() -> Result<()> {
        let e = p(&["fragments,dedupe", "ztailpacking"])?;
        assert_eq!(e.fragments, Fragments::Tails { pcluster_size: 0 });
        assert!(e.dedupe && e.ztailpacking && e.inline_data);
        let e = p(&["smallest,^dedupe", "all-fragments=65536"])?;
        assert_eq!(
            e.fragments,
            Fragments::All {
                pcluster_size: 65536
            }
        );
        assert!(!e.dedupe && e.ztailpacking);
        let e = p(&["fragments=131072,^fragments,noinline_data"])?;
        assert_eq!(e.fragments, Fragments::Off);
        assert!(!e.inline_data);
        assert!(!p(&["^inline_data"])?.inline_data);
        let e = p(&["48bit,dot-omitted", "^dot-omitted"])?;
        assert!(e.layout48 && !e.dot_omitted);
        let e = p(&["dot-omitted,smallest"])?;
        assert!(!e.layout48 && e.dot_omitted);
        for bad in [
            "fragments=0",
            "fragments=x",
            "dedupe=1",
            "^fragments=4096",
            "frags",
            "^smallest",
            "48bit=1",
        ] {
            assert!(p(&[bad]).is_err(), "{bad} accepted");
        }
        Ok(())
    }
}
