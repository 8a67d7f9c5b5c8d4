//! # ferofs-reader — read any EROFS image
//!
//! What it owns: opening an image over any positional-read [`Source`] (`&self` reads,
//! so one [`Image`] serves many threads), validating the superblock, and answering
//! inode, lookup, readdir, data, symlink and xattr requests lazily — nothing but the
//! superblock is read up front. What it does not own: on-disk layouts (`ferofs-format`)
//! and codecs (`ferofs-compress`).
//!
//! Modules follow the kernel's files: [`image`] (super.c), [`inode`] (inode.c), [`dir`]
//! (dir.c + namei.c), [`data`] (data.c: flat, inline, chunk-based), `zmap`/[`zdata`]
//! (compressed files), [`xattr`] (xattr.c).
//!
//! Errors keep three kinds apart: I/O, `Corrupt` (a [`Corruption`] naming the nid,
//! offset and bad value) and `Unsupported`. Corrupt input never panics, never loops
//! without bound and never allocates more than the image can justify: [`limits`] lists
//! every bound the reader enforces (directory depth, name and symlink lengths, index
//! lookback, decompressed size per pcluster, memory per request) and what a caller
//! still has to bound itself. A corruption torture test (crates/cli/tests/torture.rs)
//! and cargo-fuzz targets (fuzz/) hold it to that.

#![forbid(unsafe_code)]

mod cache;
pub mod clock;
pub mod data;
pub mod dir;
pub mod error;
pub mod image;
pub mod inode;
pub mod limits;
pub mod source;
pub mod xattr;
pub mod zdata;
mod zmap;

pub use data::Extent;
pub use dir::DirEntry;
pub use error::{CorruptKind, Corruption, Error, Result};
pub use ferofs_format::inode::DataLayout;
pub use image::{Image, ImageInfo};
pub use inode::Inode;
pub use source::Source;
pub use xattr::Xattr;
pub use zdata::{DataSpan, ReadCtx, SpanKind};
