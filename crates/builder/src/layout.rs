//! Where an inode's data lives: the hand-off from data placement (regular files) and
//! the directory/symlink blocks to the metadata records.

use crate::data::FileData;
use crate::options::*;
use crate::zdata::{Stored, ZFile};
use std::borrow::Cow;
use std::sync::Arc;

/// Bytes that go behind an inode (an inline tail): in memory, or, once a build's tails
/// pass a budget, in a scratch file (so that memory does not grow with a tree of many
/// small files: their tails are most of their data).
#[derive(Debug, Clone, Default)]
pub struct Tail(TailAt);

#[derive(Debug, Clone)]
enum TailAt {
    Mem(Vec<u8>),
    Spool {
        file: Arc<tempfile::NamedTempFile>,
        off: u64,
        len: u32,
    },
}

impl Default for TailAt {
    fn default() -> Self {
        TailAt::Mem(Vec::new())
    }
}

/// Equal bytes (for tests and assertions; a tail that cannot be read equals nothing).
impl PartialEq for Tail {
    fn eq(&self, other: &Self) -> bool {
        match (self.bytes(), other.bytes()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Tail {}

impl Tail {
    /// Bytes kept in memory.
    pub fn mem(bytes: Vec<u8>) -> Self {
        Tail(TailAt::Mem(bytes))
    }

    /// `len` bytes at `off` of a scratch file.
    pub fn spooled(file: Arc<tempfile::NamedTempFile>, off: u64, len: u32) -> Self {
        Tail(TailAt::Spool { file, off, len })
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            TailAt::Mem(v) => v.len(),
            TailAt::Spool { len, .. } => *len as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes (read back from the scratch file when they are there).
    pub fn bytes(&self) -> Result<Cow<'_, [u8]>> {
        match &self.0 {
            TailAt::Mem(v) => Ok(Cow::Borrowed(v)),
            TailAt::Spool { file, off, len } => {
                use std::os::unix::fs::FileExt;
                let mut b = vec![0u8; *len as usize];
                file.as_file()
                    .read_exact_at(&mut b, *off)
                    .map_err(io_err(file.path(), "read inline tails"))?;
                Ok(Cow::Owned(b))
            }
        }
    }
}

#[derive(Debug, Clone)]
pub enum Layout {
    /// FLAT_PLAIN with blocks from `startblk` (or none: 0).
    Plain { startblk: u64 },
    /// FLAT_INLINE: full blocks from startblk (None if none), tail behind the inode.
    Inline { startblk: Option<u64>, tail: Tail },
    /// CHUNK_BASED: chunk size = block size << `chunk_rel`, block map (u32::MAX = hole),
    /// or the same start blocks as 8-byte chunk indexes on the primary device
    /// (`indexes`).
    Chunked {
        chunk_rel: u8,
        map: Vec<u32>,
        indexes: bool,
        /// The device of every block in `map` (0: the image; 1: the `--blobdev` blob).
        device: u16,
    },
    /// CHUNK_BASED with 8-byte chunk indexes: `count` chunks of block size <<
    /// `chunk_rel`, contiguous from block `blkaddr` of extra device `device` (tar index
    /// mode: the data stays in the tar).
    ChunkIndex {
        chunk_rel: u8,
        device: u16,
        blkaddr: u32,
        count: u32,
        /// One more chunk, the file's last, at this block of the image (device 0):
        /// a tail that is not on the device.
        tail_blk: Option<u32>,
    },
    /// COMPRESSED_COMPACT (or COMPRESSED_FULL when `full_index`).
    Compressed(ZFile),
    /// The whole file is a fragment at `off` of the packed inode's data
    /// (COMPRESSED_FULL, the map header's bit 63 form). While data is placed, `off` is
    /// the fragment's id.
    Fragment { off: u64 },
}

impl Layout {
    /// No data blocks (yet): empty files, and every inode that is not a regular file
    /// until the directory/symlink blocks are placed.
    pub const NONE: Layout = Layout::Plain { startblk: 0 };

    /// A compressed file whose last pcluster is inline behind the inode.
    pub fn inline_pcluster(&self) -> bool {
        matches!(self, Layout::Compressed(z) if z.inline.is_some())
    }

    /// Compressed layouts (a whole-file fragment counts: its data is compressed in the
    /// packed inode).
    pub fn compressed(&self) -> bool {
        matches!(self, Layout::Compressed(_) | Layout::Fragment { .. })
    }

    /// CHUNK_BASED.
    pub fn chunked(&self) -> bool {
        matches!(self, Layout::Chunked { .. } | Layout::ChunkIndex { .. })
    }

    /// Compressed, sharing pclusters with other extents (the dedupe feature).
    pub fn shared(&self) -> bool {
        matches!(self, Layout::Compressed(z) if z.shared)
    }

    /// Some of the file's data is in the packed inode.
    pub fn fragment(&self) -> bool {
        matches!(self, Layout::Fragment { .. })
            || matches!(self, Layout::Compressed(z) if z.fragment.is_some())
    }
}

impl From<FileData> for Layout {
    fn from(d: FileData) -> Self {
        match d {
            FileData::Empty => Layout::NONE,
            FileData::Flat {
                startblk,
                nblocks,
                tail,
            } if !tail.is_empty() => Layout::Inline {
                startblk: (nblocks > 0).then_some(startblk),
                tail,
            },
            FileData::Flat { startblk, .. } => Layout::Plain { startblk },
            FileData::Chunked {
                chunk_rel,
                map,
                indexes,
                device,
            } => Layout::Chunked {
                chunk_rel,
                map,
                indexes,
                device,
            },
        }
    }
}

impl From<Stored> for Layout {
    fn from(s: Stored) -> Self {
        match s {
            Stored::Compressed(z) => Layout::Compressed(z),
            Stored::Data(d) => d.into(),
            Stored::Fragment(id) => Layout::Fragment { off: id },
        }
    }
}
