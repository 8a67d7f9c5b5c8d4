//! Limits that protect callers from hostile images, in one place.
//!
//! An image is untrusted input: every size, count, offset and link in it is a claim.
//! The reader checks each claim before it acts on it, and where the format itself sets
//! no bound, it sets one of its own, listed here. Passing a limit is a structured error
//! ([`crate::Error::Corrupt`] with the [`crate::CorruptKind`] named below, the nid, the
//! offset and the value), never a panic, a hang or an unbounded allocation. Every limit
//! is at or above what the Linux kernel and mkfs.erofs accept, so valid images never
//! meet one.
//!
//! | what | limit | on excess |
//! |---|---|---|
//! | directory depth (`walk`, `lookup`) | [`MAX_DEPTH`] levels | `TooDeep` |
//! | directory loops (`walk`) | a directory may not contain an ancestor | `DirectoryLoop` |
//! | name length (dirents) | 1..=[`MAX_NAME_LEN`] bytes | `BadNameoff` |
//! | name length (`lookup` components, `lookup_child`) | [`MAX_NAME_LEN`] bytes | not found, nothing read |
//! | symlink target (`read_link`) | [`MAX_SYMLINK_LEN`] bytes | `BadInodeSize` |
//! | symlink hops | none needed: the reader never follows symlinks (`lookup` and `walk` treat them as leaves) | — |
//! | file size (`inode`) | [`MAX_FILE_SIZE`] | `BadInodeSize` |
//! | index lookback (compressed files) | [`MAX_LOOKBACK_BYTES`] of lclusters back to an extent's head; back to a fragment tail's head (which the kernel does not bound): a few hops plus one per 1,024 lclusters walked | `BadLcluster` |
//! | index lookahead (end of an extent) | [`MAX_EXTENT_BYTES`] of lclusters (a fragment tail ends at the end of the file: no scan) | `BadLcluster` |
//! | decompressed size per extent (pcluster) | [`MAX_EXTENT_BYTES`] | `BadLcluster` |
//! | stored size per pcluster | [`MAX_PCLUSTER_BYTES`] | `BadPcluster` |
//! | holes merged by one `hole_end` | [`MAX_HOLE_RUNS`] mapping runs | stops there |
//! | extents listed by `extents` | [`MAX_EXTENTS_LISTED`] | stops there |
//! | long xattr prefixes | [`MAX_XATTR_PREFIXES`], each 1..=256 bytes | `BadXattrPrefix` |
//! | compression config record | 4096 bytes | `BadComprConfig` |
//!
//! **Memory per request.** Nothing is allocated from a size the image claims before
//! the image has backed it:
//!
//! - `read_at` / `read_at_with`: the caller's buffer, plus at most one decoded extent
//!   ([`MAX_EXTENT_BYTES`]) and one window of stored bytes (a pcluster, at most
//!   [`MAX_PCLUSTER_BYTES`], plus read-ahead of at most 1 MiB) and a 16 KiB window of
//!   index bytes. A [`crate::ReadCtx`] keeps these buffers between reads; the library's
//!   own per-thread context drops buffers above 4 MiB after each read.
//! - The shared cache of decoded extents ([`crate::Image::read_at`] only): a byte budget,
//!   [`DEFAULT_CACHE_BUDGET`] by default ([`crate::Image::set_cache_budget`]).
//! - `read_to_vec_limited(ino, limit)`: at most `limit` bytes (`read_to_vec`: 1 GiB), and
//!   grown 4 MiB at a time as the data arrives, so a size the image cannot back fails
//!   before it is allocated.
//! - `read_dir`: the directory's entries, which the image proves block by block (names
//!   must increase strictly across the whole directory). `lookup_child` holds one block.
//! - `walk`: one directory block's entries per level, at most [`MAX_DEPTH`] levels, on a
//!   heap stack (no recursion: a walk needs the same small thread stack at any depth).
//! - `xattrs` / `get_xattr`: the inode's inline area (at most 256 KiB, from a u16 count)
//!   and each shared entry (at most 255 + 65535 bytes, from u8/u16 lengths).
//!
//! **Work per request.** Every loop over image data has a bound: one iteration per
//! directory block, dirent, xattr entry, mapping run, lcluster (bounded by the limits
//! above) or byte of output. One format detail costs more: a file mapped by 4-byte
//! extent records (48-bit layout) finds a record's physical address by summing the
//! lengths of all records before it, as the kernel does, so a lookup far into such a
//! file reads that many records; a [`crate::ReadCtx`] keeps the running sum, so reading
//! forward through the file costs one record per lcluster in all. Two things the reader cannot bound for the caller, because
//! a valid image can ask for them too: file data (a file may really be 2^60 bytes of
//! zeros or of a repeated pcluster — read what you need, with a size you chose), and
//! the number of paths `walk` visits (directories may share subdirectories, making the
//! tree a DAG with many more paths than inodes; the callback stops the walk by
//! returning an error).

pub use crate::data::MAX_HOLE_RUNS;
pub use crate::dir::MAX_DEPTH;
pub use ferofs_format::MAX_NAME_LEN;

/// Longest symlink target `read_link` returns (Linux's PATH_MAX, as the kernel).
pub const MAX_SYMLINK_LEN: u64 = 4096;

/// Largest file size an inode may claim.
pub const MAX_FILE_SIZE: u64 = crate::inode::MAX_FILE_SIZE;

/// Largest decoded extent (what one pcluster decompresses to), the kernel's
/// Z_EROFS_PCLUSTER_MAX_DSIZE.
pub const MAX_EXTENT_BYTES: u64 = ferofs_format::PCLUSTER_MAX_DSIZE;

/// Largest stored pcluster.
pub const MAX_PCLUSTER_BYTES: u64 = ferofs_format::PCLUSTER_MAX_SIZE;

/// Furthest a compressed-index lookup walks back to an extent's head.
pub const MAX_LOOKBACK_BYTES: u64 = crate::zmap::MAX_LOOKBACK_BYTES;

/// Most extents [`crate::Image::extents`] lists for one file.
pub const MAX_EXTENTS_LISTED: usize = crate::data::MAX_EXTENTS_LISTED;

/// Most long xattr name prefixes an image may declare.
pub const MAX_XATTR_PREFIXES: usize = crate::xattr::MAX_PREFIXES;

/// Default budget of the shared cache of decoded extents.
pub const DEFAULT_CACHE_BUDGET: usize = 64 << 20;
