//! Where an inode's data lives: the hand-off from data placement (regular files) and
//! the directory/symlink blocks to the metadata records.

use crate::data::FileData;
use crate::zdata::{Stored, ZFile};

#[derive(Debug, Clone)]
pub enum Layout {
    /// FLAT_PLAIN with blocks from `startblk` (or none: 0).
    Plain { startblk: u64 },
    /// FLAT_INLINE: full blocks from startblk (None if none), tail behind the inode.
    Inline {
        startblk: Option<u64>,
        tail: Vec<u8>,
    },
    /// CHUNK_BASED: chunk size = block size << `chunk_rel`, block map (u32::MAX = hole),
    /// or the same start blocks as 8-byte chunk indexes on the primary device
    /// (`indexes`).
    Chunked {
        chunk_rel: u8,
        map: Vec<u32>,
        indexes: bool,
    },
    /// CHUNK_BASED with 8-byte chunk indexes: `count` chunks of block size <<
    /// `chunk_rel`, contiguous from block `blkaddr` of extra device `device` (tar index
    /// mode: the data stays in the tar).
    ChunkIndex {
        chunk_rel: u8,
        device: u16,
        blkaddr: u32,
        count: u32,
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

    /// Compressed with full indexes (it may share pclusters: the dedupe feature).
    pub fn full_index(&self) -> bool {
        matches!(self, Layout::Compressed(z) if z.full_index)
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
            } => Layout::Chunked {
                chunk_rel,
                map,
                indexes,
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
