//! dm-verity for fetched blocks: with a root hash (`--verity ROOTHASH`), the hash tree
//! `ferofs build --verity` appended is fetched at open and checked level by level
//! down from the root; then every 4 KiB data block a request brings is checked against
//! its level-0 digest before it is cached or used. A block that does not match is an
//! I/O error (the server sent something else), and reads past the data area the tree
//! covers are refused.
//!
//! Layout (`ferofs_format::verity`): sha256, 4096-byte data and hash blocks, hash
//! format 1 (`sha256(salt || block)`), the superblock at the hash offset, the tree one
//! hash block further, top level first.

use ferofs_format::verity::{TreeLayout, VeritySb, HASH_TYPE_NORMAL, SB_SIZE, SB_VERSION};
use sha2::{Digest, Sha256};
use std::io;

pub(crate) const BLOCK: u64 = 4096;
const DIGEST: usize = 32;
/// Largest tree held in memory (covers an image of 8 GiB).
pub(crate) const MAX_TREE: u64 = 64 << 20;

fn digest(salt: &[u8], block: &[u8]) -> [u8; DIGEST] {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(block);
    h.finalize().into()
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("verity: {msg}"))
}

/// A checked tree.
#[derive(Debug)]
pub(crate) struct Verity {
    salt: Vec<u8>,
    pub(crate) data_blocks: u64,
    /// Level 0 (one digest per data block), checked against the root.
    level0: Vec<u8>,
    /// With one data block there is no tree: the root is that block's digest.
    root: Vec<u8>,
}

/// Where the tree of the superblock at `hash_offset` lies: (layout, byte offset, bytes).
pub(crate) fn tree_span(sb: &VeritySb, hash_offset: u64) -> io::Result<(TreeLayout, u64, u64)> {
    let t = TreeLayout::new(sb.data_blocks, BLOCK / DIGEST as u64)
        .ok_or_else(|| bad(format!("{} data blocks: too many levels", sb.data_blocks)))?;
    let at = (hash_offset + SB_SIZE as u64).div_ceil(BLOCK) * BLOCK;
    let len = t
        .total_blocks()
        .checked_mul(BLOCK)
        .filter(|&l| l <= MAX_TREE)
        .ok_or_else(|| {
            bad(format!(
                "a tree of {} hash blocks is more than this reader holds ({MAX_TREE} bytes)",
                t.total_blocks()
            ))
        })?;
    Ok((t, at, len))
}

/// The verity superblock, checked to be one this reader knows.
pub(crate) fn parse_sb(b: &[u8], hash_offset: u64) -> io::Result<VeritySb> {
    let raw: &[u8; SB_SIZE] = b
        .get(..SB_SIZE)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| bad("short superblock".into()))?;
    let (sig, sb) = VeritySb::parse(raw);
    if !sig {
        return Err(bad(format!(
            "no verity superblock at byte {hash_offset} (no \"verity\" signature)"
        )));
    }
    if sb.version != SB_VERSION
        || sb.hash_type != HASH_TYPE_NORMAL
        || sb.algorithm != "sha256"
        || u64::from(sb.data_block_size) != BLOCK
        || u64::from(sb.hash_block_size) != BLOCK
    {
        return Err(bad(format!(
            "superblock version {} format {} {} {}/{}: only 1 1 sha256 4096/4096 is read",
            sb.version, sb.hash_type, sb.algorithm, sb.data_block_size, sb.hash_block_size
        )));
    }
    match sb.data_blocks.checked_mul(BLOCK) {
        Some(end) if sb.data_blocks > 0 && end <= hash_offset => Ok(sb),
        _ => Err(bad(format!(
            "{} data blocks do not end before the hash area at byte {hash_offset}",
            sb.data_blocks
        ))),
    }
}

impl Verity {
    /// Check `tree` (the bytes of [`tree_span`]) against `root`.
    pub(crate) fn new(sb: &VeritySb, t: &TreeLayout, tree: &[u8], root: &[u8]) -> io::Result<Self> {
        let b = BLOCK as usize;
        let level = |l: usize| -> io::Result<&[u8]> {
            let start = t.level_start(l) as usize * b;
            let len = t.level_blocks[l] as usize * b;
            tree.get(start..start + len)
                .ok_or_else(|| bad("the tree is cut short".into()))
        };
        if t.levels() > 0 {
            let top = level(t.levels() - 1)?;
            if digest(&sb.salt, top)[..] != *root {
                return Err(bad("the tree does not match the root hash".into()));
            }
            // Each level's blocks against the digests of the level above.
            for l in (1..t.levels()).rev() {
                let (upper, lower) = (level(l)?, level(l - 1)?);
                for (k, blk) in lower.chunks(b).enumerate() {
                    let want = upper.get(k * DIGEST..(k + 1) * DIGEST);
                    if want != Some(&digest(&sb.salt, blk)[..]) {
                        return Err(bad(format!(
                            "hash block {k} of level {} does not match",
                            l - 1
                        )));
                    }
                }
            }
        }
        Ok(Verity {
            salt: sb.salt.clone(),
            data_blocks: sb.data_blocks,
            level0: if t.levels() > 0 {
                level(0)?.to_vec()
            } else {
                Vec::new()
            },
            root: root.to_vec(),
        })
    }

    /// Check the data blocks in `data`, which starts at byte `offset` (a multiple of
    /// 4096); bytes past the data area are not checked (reads never use them).
    pub(crate) fn check(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let first = offset / BLOCK;
        for (k, blk) in data.chunks(BLOCK as usize).enumerate() {
            let j = first + k as u64;
            if j >= self.data_blocks {
                break;
            }
            if blk.len() as u64 != BLOCK {
                return Err(bad(format!("data block {j} is cut short")));
            }
            let d = digest(&self.salt, blk);
            let want: &[u8] = if self.level0.is_empty() {
                &self.root
            } else {
                let at = j as usize * DIGEST;
                self.level0.get(at..at + DIGEST).unwrap_or_default()
            };
            if d[..] != *want {
                return Err(bad(format!(
                    "data block {j} (bytes {}..{}) does not match the hash tree",
                    j * BLOCK,
                    (j + 1) * BLOCK
                )));
            }
        }
        Ok(())
    }

    /// Bytes the tree covers.
    pub(crate) fn data_end(&self) -> u64 {
        self.data_blocks * BLOCK
    }
}
