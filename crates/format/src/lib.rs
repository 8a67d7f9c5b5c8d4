//! # ferofs-format — the EROFS on-disk format, and nothing else
//!
//! This crate owns every constant, field offset and structure size of the EROFS
//! on-disk format (see `shared/docs/erofs-format.md`; the kernel's `erofs_fs.h` is the
//! ground truth). It does no I/O and holds no policy: readers and writers both use the
//! `parse`/`encode` pairs here, so the two sides cannot drift apart.
//!
//! Map:
//! - [`sb`]: superblock (128 bytes + extension slots), feature bits, compression records.
//! - [`inode`]: compact (32 B) and extended (64 B) inodes, `i_format`, data layouts, rdev.
//! - [`dirent`]: 12-byte directory entries and file types.
//! - [`xattr`]: inline-area header, entries, name prefixes, bloom filter hash.
//! - [`chunk`]: chunk-based layout entries.
//! - [`zmap`]: compressed-file map header and lcluster index entries.
//! - [`crc32c`]: the superblock checksum.
//! - [`verity`]: not EROFS: the dm-verity hash tree layout and superblock appended by
//!   `ferofs build --verity`.
//!
//! Every parser takes a fixed-size array (the caller has already bounds-checked the
//! slice), so parsing itself cannot fail; *validation* of the values is the reader's job.

pub mod chunk;
pub mod crc32c;
pub mod dirent;
pub mod inode;
pub mod le;
pub mod sb;
pub mod verity;
pub mod xattr;
pub mod xxh32;
pub mod zindex;
pub mod zmap;

/// Size of an inode slot; nids count these.
pub const INODE_SLOT_SIZE: u64 = 32;
/// Smallest and largest supported block size bits (512 B ..= 4 KiB).
pub const MIN_BLKSZBITS: u8 = 9;
pub const MAX_BLKSZBITS: u8 = 12;
/// "No block" marker for FLAT_PLAIN / FLAT_INLINE start blocks.
pub const NULL_ADDR_32: u32 = u32::MAX;
/// Maximum length of one file name.
pub const MAX_NAME_LEN: usize = 255;
/// Largest pcluster the kernel accepts.
pub const PCLUSTER_MAX_SIZE: u64 = 1 << 20;
/// Largest decoded extent the kernel accepts.
pub const PCLUSTER_MAX_DSIZE: u64 = 12 << 20;
