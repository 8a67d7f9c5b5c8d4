//! Chunk-based files (format doc §6).

use crate::le::*;

/// `i_u` low 16 bits: bits 0..4 chunkbits - blkszbits.
pub const CHUNK_FORMAT_BLKBITS_MASK: u16 = 0x1F;
/// 8-byte chunk indexes instead of the 4-byte block map.
pub const CHUNK_FORMAT_INDEXES: u16 = 0x20;
/// 48-bit start blocks in chunk indexes.
pub const CHUNK_FORMAT_48BIT: u16 = 0x40;
pub const CHUNK_FORMAT_ALL: u16 = 0x7F;

pub const BLOCK_MAP_ENTRY_SIZE: usize = 4;
pub const CHUNK_INDEX_SIZE: usize = 8;
/// Hole marker in a 4-byte block map.
pub const BLOCK_MAP_HOLE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkIndex {
    pub startblk_hi: u16,
    pub device_id: u16,
    pub startblk_lo: u32,
}

impl ChunkIndex {
    pub fn parse(b: &[u8; CHUNK_INDEX_SIZE]) -> Self {
        ChunkIndex {
            startblk_hi: u16_at(b, 0),
            device_id: u16_at(b, 2),
            startblk_lo: u32_at(b, 4),
        }
    }
    pub fn encode(&self) -> [u8; CHUNK_INDEX_SIZE] {
        let mut b = [0u8; CHUNK_INDEX_SIZE];
        put_u16(&mut b, 0, self.startblk_hi);
        put_u16(&mut b, 2, self.device_id);
        put_u32(&mut b, 4, self.startblk_lo);
        b
    }
}
