//! dm-verity (Linux device-mapper's hash-tree target), format 1, as `veritysetup
//! format` lays it out: not EROFS, but what `ferofs build --verity` appends behind the
//! image. Only the layout and the 512-byte superblock live here; the hashing is the
//! builder's (`ferofs_builder::verity`).
//!
//! The hash area, at a hash-block-aligned byte offset:
//!
//! ```text
//! [superblock: 512 bytes, the rest of its hash block zero]
//! [level n-1: 1 hash block] [level n-2] ... [level 0: one digest per data block]
//! ```
//!
//! Every digest is `sha256(salt || block)` (format 1; format 0, Chrome OS's, hashes
//! `block || salt`). Level 0 holds the digests of the data blocks, level i+1 those of
//! the hash blocks of level i, each hash block holding `hash_block_size / 32` digests
//! followed by zeros; the top level is one hash block, and the root hash is its digest
//! (with one data block there are no levels: the root hash is that block's digest).
//! The number of levels is the smallest n with `(data_blocks - 1) >> (n * bits) == 0`,
//! `bits` = log2(digests per hash block) — so 128 data blocks need one level, 129 two.

use crate::le::*;

/// Size of the superblock (its hash block is padded with zeros).
pub const SB_SIZE: usize = 512;
pub const SIGNATURE: [u8; 8] = *b"verity\0\0";
/// The superblock's own version (not the hash format).
pub const SB_VERSION: u32 = 1;
/// Hash format 1: `digest(salt || block)`.
pub const HASH_TYPE_NORMAL: u32 = 1;
/// Largest salt the superblock holds.
pub const MAX_SALT: usize = 256;
/// Most levels the kernel accepts.
pub const MAX_LEVELS: usize = 63;

const OFF_VERSION: usize = 8;
const OFF_HASH_TYPE: usize = 12;
const OFF_UUID: usize = 16;
const OFF_ALGORITHM: usize = 32;
const ALGORITHM_LEN: usize = 32;
const OFF_DATA_BLOCK_SIZE: usize = 64;
const OFF_HASH_BLOCK_SIZE: usize = 68;
const OFF_DATA_BLOCKS: usize = 72;
const OFF_SALT_SIZE: usize = 80;
const OFF_SALT: usize = 88;

/// The superblock, field for field (all little-endian on disk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VeritySb {
    pub version: u32,
    pub hash_type: u32,
    pub uuid: [u8; 16],
    /// Hash algorithm name as the kernel's crypto API spells it ("sha256").
    pub algorithm: String,
    pub data_block_size: u32,
    pub hash_block_size: u32,
    pub data_blocks: u64,
    /// At most [`MAX_SALT`] bytes (longer is cut by `encode`).
    pub salt: Vec<u8>,
}

impl VeritySb {
    /// `(signature ok, superblock)`; the signature is not checked here.
    pub fn parse(b: &[u8; SB_SIZE]) -> (bool, Self) {
        let salt_size = usize::from(u16_at(b, OFF_SALT_SIZE)).min(MAX_SALT);
        let alg = &b[OFF_ALGORITHM..OFF_ALGORITHM + ALGORITHM_LEN];
        let alg_len = alg.iter().position(|&c| c == 0).unwrap_or(ALGORITHM_LEN);
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[OFF_UUID..OFF_UUID + 16]);
        (
            b[..8] == SIGNATURE,
            VeritySb {
                version: u32_at(b, OFF_VERSION),
                hash_type: u32_at(b, OFF_HASH_TYPE),
                uuid,
                algorithm: String::from_utf8_lossy(&alg[..alg_len]).into_owned(),
                data_block_size: u32_at(b, OFF_DATA_BLOCK_SIZE),
                hash_block_size: u32_at(b, OFF_HASH_BLOCK_SIZE),
                data_blocks: u64_at(b, OFF_DATA_BLOCKS),
                salt: b[OFF_SALT..OFF_SALT + salt_size].to_vec(),
            },
        )
    }

    pub fn encode(&self) -> [u8; SB_SIZE] {
        let mut b = [0u8; SB_SIZE];
        b[..8].copy_from_slice(&SIGNATURE);
        put_u32(&mut b, OFF_VERSION, self.version);
        put_u32(&mut b, OFF_HASH_TYPE, self.hash_type);
        b[OFF_UUID..OFF_UUID + 16].copy_from_slice(&self.uuid);
        let alg = self.algorithm.as_bytes();
        let n = alg.len().min(ALGORITHM_LEN);
        b[OFF_ALGORITHM..OFF_ALGORITHM + n].copy_from_slice(&alg[..n]);
        put_u32(&mut b, OFF_DATA_BLOCK_SIZE, self.data_block_size);
        put_u32(&mut b, OFF_HASH_BLOCK_SIZE, self.hash_block_size);
        put_u64(&mut b, OFF_DATA_BLOCKS, self.data_blocks);
        let salt = &self.salt[..self.salt.len().min(MAX_SALT)];
        // At most 256: fits a u16.
        put_u16(&mut b, OFF_SALT_SIZE, salt.len() as u16);
        b[OFF_SALT..OFF_SALT + salt.len()].copy_from_slice(salt);
        b
    }
}

/// Where the levels of a tree go, in hash blocks from the start of the tree (the hash
/// block after the superblock's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeLayout {
    pub data_blocks: u64,
    /// Digests per hash block (a power of two).
    pub per_block: u64,
    /// Hash blocks of each level, level 0 (the data blocks' digests) first.
    pub level_blocks: Vec<u64>,
}

impl TreeLayout {
    /// The layout for `data_blocks` blocks, `per_block` digests a hash block (rounded
    /// down to a power of two, as the kernel does). None for zero digests a block or
    /// more than [`MAX_LEVELS`] levels.
    pub fn new(data_blocks: u64, per_block: u64) -> Option<Self> {
        if per_block < 2 {
            return None;
        }
        let bits = 63 - per_block.leading_zeros();
        let per_block = 1u64 << bits;
        let mut levels = 0u32;
        while bits * levels < 64 && data_blocks.saturating_sub(1) >> (bits * levels) != 0 {
            levels += 1;
        }
        if levels as usize > MAX_LEVELS {
            return None;
        }
        let level_blocks = (0..levels)
            .map(|i| {
                // Digests at level i cover per_block^(i+1) data blocks a hash block.
                let shift = (i + 1) * bits;
                if shift >= 64 {
                    1
                } else {
                    data_blocks.div_ceil(1u64 << shift)
                }
            })
            .collect();
        Some(TreeLayout {
            data_blocks,
            per_block,
            level_blocks,
        })
    }

    pub fn levels(&self) -> usize {
        self.level_blocks.len()
    }

    /// First hash block of `level`, counted from the start of the tree: the levels
    /// above it come first.
    pub fn level_start(&self, level: usize) -> u64 {
        self.level_blocks.iter().skip(level + 1).sum()
    }

    /// Hash blocks of the whole tree (the superblock's not counted).
    pub fn total_blocks(&self) -> u64 {
        self.level_blocks.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_like_the_kernel() {
        let l = |n| TreeLayout::new(n, 128).map(|t| t.level_blocks);
        assert_eq!(l(1), Some(vec![]));
        assert_eq!(l(2), Some(vec![1]));
        assert_eq!(l(128), Some(vec![1]));
        assert_eq!(l(129), Some(vec![2, 1]));
        assert_eq!(l(128 * 128), Some(vec![128, 1]));
        assert_eq!(l(128 * 128 + 1), Some(vec![129, 2, 1]));
        let t = TreeLayout::new(128 * 128 + 1, 128).expect("layout");
        assert_eq!(t.level_start(2), 0);
        assert_eq!(t.level_start(1), 1);
        assert_eq!(t.level_start(0), 3);
        assert_eq!(t.total_blocks(), 132);
        assert_eq!(TreeLayout::new(5, 1), None);
        // 127 digests a block count as 64 (a power of two).
        assert_eq!(
            TreeLayout::new(65, 127).map(|t| t.level_blocks),
            Some(vec![2, 1])
        );
        assert!(TreeLayout::new(u64::MAX, 128).is_some());
    }

    #[test]
    fn superblock_roundtrip() {
        let sb = VeritySb {
            version: SB_VERSION,
            hash_type: HASH_TYPE_NORMAL,
            uuid: [7; 16],
            algorithm: "sha256".into(),
            data_block_size: 4096,
            hash_block_size: 4096,
            data_blocks: 12345,
            salt: vec![1, 2, 3],
        };
        let b = sb.encode();
        assert_eq!(&b[..8], b"verity\0\0");
        assert_eq!(&b[32..39], b"sha256\0");
        assert_eq!(b[80], 3);
        assert_eq!(VeritySb::parse(&b), (true, sb));
    }
}
