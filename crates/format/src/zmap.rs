//! Compressed-file maps (format doc §8): map header, lcluster types, full indexes.
//! Compact (2 B / 4 B) pack encoding and decoding live here too.

use crate::le::*;

pub const MAP_HEADER_SIZE: usize = 8;
pub const FULL_INDEX_SIZE: usize = 8;

// h_advise
pub const ADVISE_COMPACTED_2B: u16 = 0x0001;
pub const ADVISE_EXTENTS: u16 = 0x0001;
pub const ADVISE_BIG_PCLUSTER_1: u16 = 0x0002;
pub const ADVISE_BIG_PCLUSTER_2: u16 = 0x0004;
pub const ADVISE_INLINE_PCLUSTER: u16 = 0x0008;
pub const ADVISE_INTERLACED_PCLUSTER: u16 = 0x0010;
pub const ADVISE_FRAGMENT_PCLUSTER: u16 = 0x0020;

/// Bit 7 of `h_clusterbits`: the whole file is a fragment.
pub const CLUSTERBITS_FRAGMENT: u8 = 0x80;

// lcluster types
pub const LCLUSTER_TYPE_PLAIN: u8 = 0;
pub const LCLUSTER_TYPE_HEAD1: u8 = 1;
pub const LCLUSTER_TYPE_NONHEAD: u8 = 2;
pub const LCLUSTER_TYPE_HEAD2: u8 = 3;

/// Full-index `di_advise` bit 15.
pub const FULL_PARTIAL_REF: u16 = 0x8000;
/// NONHEAD delta[0] bit 11: the entry is a CBLKCNT (pcluster block count).
pub const D0_CBLKCNT: u16 = 0x0800;
pub const D0_MAX: u16 = 2047;

/// The 8-byte map header, raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MapHeader {
    /// Bytes 0..4 (fragment offset / {reserved, idata_size} / extents_lo).
    pub word0: u32,
    pub advise: u16,
    pub algorithmtype: u8,
    pub clusterbits: u8,
}

impl MapHeader {
    pub fn parse(b: &[u8; MAP_HEADER_SIZE]) -> Self {
        MapHeader {
            word0: u32_at(b, 0),
            advise: u16_at(b, 4),
            algorithmtype: b[6],
            clusterbits: b[7],
        }
    }
    pub fn encode(&self) -> [u8; MAP_HEADER_SIZE] {
        let mut b = [0u8; MAP_HEADER_SIZE];
        put_u32(&mut b, 0, self.word0);
        put_u16(&mut b, 4, self.advise);
        b[6] = self.algorithmtype;
        b[7] = self.clusterbits;
        b
    }
    pub fn as_u64(&self) -> u64 {
        u64::from_le_bytes(self.encode())
    }
    /// Whole-file fragment: the header as u64 has bit 63 set.
    pub fn is_whole_fragment(&self) -> bool {
        self.clusterbits & CLUSTERBITS_FRAGMENT != 0
    }
    pub fn whole_fragment_offset(&self) -> u64 {
        self.as_u64() & !(1u64 << 63)
    }
    pub fn idata_size(&self) -> u16 {
        (self.word0 >> 16) as u16
    }
    pub fn fragment_off(&self) -> u32 {
        self.word0
    }
}

/// One full ("legacy") lcluster index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FullIndex {
    pub advise: u16,
    pub clusterofs: u16,
    /// HEAD: blkaddr. NONHEAD: delta[0] (low 16 bits), delta[1] (high 16 bits).
    pub u: u32,
}

impl FullIndex {
    pub fn parse(b: &[u8; FULL_INDEX_SIZE]) -> Self {
        FullIndex {
            advise: u16_at(b, 0),
            clusterofs: u16_at(b, 2),
            u: u32_at(b, 4),
        }
    }
    pub fn encode(&self) -> [u8; FULL_INDEX_SIZE] {
        let mut b = [0u8; FULL_INDEX_SIZE];
        put_u16(&mut b, 0, self.advise);
        put_u16(&mut b, 2, self.clusterofs);
        put_u32(&mut b, 4, self.u);
        b
    }
    pub fn lcluster_type(&self) -> u8 {
        (self.advise & 0x3) as u8
    }
    pub fn partial_ref(&self) -> bool {
        self.advise & FULL_PARTIAL_REF != 0
    }
    pub fn delta0(&self) -> u16 {
        self.u as u16
    }
    pub fn delta1(&self) -> u16 {
        (self.u >> 16) as u16
    }
}

/// Byte position of the map header for an inode whose metadata (core + xattrs) ends
/// at absolute/relative position `e`.
pub fn map_header_pos(e: u64) -> u64 {
    (e + 7) & !7
}
