//! dm-verity: the hash tree `ferofs build --verity` appends behind the image, and the
//! check of an image against it (`ferofs check --verity`).
//!
//! Layout and superblock: `ferofs_format::verity`. Fixed here: sha256, 4096-byte data
//! and hash blocks, hash format 1 (`sha256(salt || block)`), the superblock written
//! (so `veritysetup open` needs the root hash and the hash offset only). The data
//! area is the whole image, `data_blocks * 4096` bytes; the superblock sits right
//! behind it, at the hash offset, and the tree one hash block further.
//!
//! Memory: the digests of level 0 are computed and written a batch at a time; only the
//! levels above it (1/128 of level 0 each) are kept.

use ferofs_format::verity::{
    TreeLayout, VeritySb, HASH_TYPE_NORMAL, MAX_SALT, SB_SIZE, SB_VERSION,
};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Data and hash block size.
pub const BLOCK: u64 = 4096;
/// Bytes of a sha256 digest.
pub const DIGEST: usize = 32;
/// The hash algorithm, as the superblock and veritysetup name it.
pub const ALGORITHM: &str = "sha256";
/// Level-0 hash blocks hashed at once (each covers 128 data blocks, 512 KiB).
const BATCH: u64 = 64;

/// What the build appended: everything `veritysetup` needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerityInfo {
    pub root_hash: [u8; DIGEST],
    pub salt: Vec<u8>,
    /// The verity superblock's UUID.
    pub uuid: [u8; 16],
    /// 4096-byte data blocks: the whole image.
    pub data_blocks: u64,
    /// Byte offset of the verity superblock (`veritysetup --hash-offset`): the end of
    /// the data blocks.
    pub hash_offset: u64,
    /// Hash blocks of the tree (the superblock's block not counted).
    pub hash_blocks: u64,
    /// Bytes of the whole file: data, superblock block and tree.
    pub file_bytes: u64,
}

/// The salt when none is given: 32 bytes (veritysetup's default size) derived from the
/// filesystem UUID, itself derived from the content by default — so two builds of one
/// tree give the same bytes.
pub fn derived_salt(fs_uuid: &[u8; 16]) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(b"ferofs dm-verity salt\0");
    h.update(fs_uuid);
    h.finalize().to_vec()
}

/// The verity superblock's UUID, derived from the filesystem UUID (a version-4 shape).
pub fn derived_uuid(fs_uuid: &[u8; 16]) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(b"ferofs dm-verity uuid\0");
    h.update(fs_uuid);
    let d = h.finalize();
    let mut u = [0u8; 16];
    u.copy_from_slice(&d[..16]);
    u[6] = (u[6] & 0x0F) | 0x40;
    u[8] = (u[8] & 0x3F) | 0x80;
    u
}

/// `sha256(salt || block)`.
fn digest(salt: &[u8], block: &[u8]) -> [u8; DIGEST] {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(block);
    h.finalize().into()
}

fn layout(data_blocks: u64) -> io::Result<TreeLayout> {
    TreeLayout::new(data_blocks, BLOCK / DIGEST as u64)
        .ok_or_else(|| io::Error::other(format!("{data_blocks} data blocks: too many levels")))
}

/// Byte offset of the tree: the first hash block after the superblock.
fn tree_offset(hash_offset: u64) -> u64 {
    (hash_offset + SB_SIZE as u64).div_ceil(BLOCK) * BLOCK
}

/// Level-0 hash block `k` as it should be: the digests of data blocks `k * 128 ..`,
/// then zeros.
fn level0_block<S: ferofs_reader::Source + ?Sized>(
    file: &S,
    salt: &[u8],
    t: &TreeLayout,
    k: u64,
) -> io::Result<Vec<u8>> {
    let first = k * t.per_block;
    let n = t.per_block.min(t.data_blocks - first);
    let mut data = vec![0u8; (n * BLOCK) as usize];
    file.read_exact_at(&mut data, first * BLOCK)?;
    Ok(pack(data.chunks(BLOCK as usize).map(|b| digest(salt, b))))
}

/// Digests packed into hash blocks, each padded with zeros.
fn pack(digests: impl Iterator<Item = [u8; DIGEST]>) -> Vec<u8> {
    let per = (BLOCK as usize) / DIGEST;
    let mut out = Vec::new();
    for (i, d) in digests.enumerate() {
        if i % per == 0 {
            out.resize(out.len() + BLOCK as usize, 0);
        }
        let at = (i / per) * BLOCK as usize + (i % per) * DIGEST;
        out[at..at + DIGEST].copy_from_slice(&d);
    }
    out
}

/// Digest of every hash block of `level`.
fn digests_of(salt: &[u8], level: &[u8]) -> Vec<[u8; DIGEST]> {
    level
        .chunks(BLOCK as usize)
        .map(|b| digest(salt, b))
        .collect()
}

/// Append the superblock and tree for the first `data_bytes` bytes of `file` (padded
/// with zeros to whole blocks). `threads`: the pool hashing the data.
pub fn append(
    file: &File,
    data_bytes: u64,
    salt: &[u8],
    uuid: [u8; 16],
    threads: usize,
) -> io::Result<VerityInfo> {
    if salt.len() > MAX_SALT {
        return Err(io::Error::other(format!(
            "verity salt of {} bytes (at most {MAX_SALT})",
            salt.len()
        )));
    }
    let data_blocks = data_bytes.div_ceil(BLOCK).max(1);
    let t = layout(data_blocks)?;
    let hash_offset = data_blocks * BLOCK;
    let tree_at = tree_offset(hash_offset);
    // Zeros up to the superblock: a data tail that is not a whole block, and the
    // superblock's block.
    file.set_len(tree_at)?;
    let sb = VeritySb {
        version: SB_VERSION,
        hash_type: HASH_TYPE_NORMAL,
        uuid,
        algorithm: ALGORITHM.into(),
        data_block_size: BLOCK as u32,
        hash_block_size: BLOCK as u32,
        data_blocks,
        salt: salt.to_vec(),
    };
    file.write_all_at(&sb.encode(), hash_offset)?;
    let root = if t.levels() == 0 {
        // One data block: its digest is the root.
        let mut b = vec![0u8; BLOCK as usize];
        file.read_exact_at(&mut b, 0)?;
        digest(salt, &b)
    } else {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .build()
            .map_err(io::Error::other)?;
        let l0_at = tree_at + t.level_start(0) * BLOCK;
        let mut below: Vec<[u8; DIGEST]> = Vec::new();
        let mut k = 0;
        // Bounded: k advances by BATCH up to the level's block count.
        while k < t.level_blocks[0] {
            let end = (k + BATCH).min(t.level_blocks[0]);
            let blocks: Vec<Vec<u8>> = pool.install(|| {
                (k..end)
                    .into_par_iter()
                    .map(|j| level0_block(file, salt, &t, j))
                    .collect::<io::Result<_>>()
            })?;
            let mut joined = Vec::with_capacity(blocks.len() * BLOCK as usize);
            for b in &blocks {
                below.push(digest(salt, b));
                joined.extend_from_slice(b);
            }
            file.write_all_at(&joined, l0_at + k * BLOCK)?;
            k = end;
        }
        for level in 1..t.levels() {
            let blocks = pack(below.iter().copied());
            file.write_all_at(&blocks, tree_at + t.level_start(level) * BLOCK)?;
            below = digests_of(salt, &blocks);
        }
        // The top level is one block: one digest.
        below
            .first()
            .copied()
            .ok_or_else(|| io::Error::other("verity: empty top level"))?
    };
    Ok(VerityInfo {
        root_hash: root,
        salt: salt.to_vec(),
        uuid,
        data_blocks,
        hash_offset,
        hash_blocks: t.total_blocks(),
        file_bytes: tree_at + t.total_blocks() * BLOCK,
    })
}

/// One disagreement between an image and its tree (or the root hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// Data block `block`'s digest differs from its entry in level 0: the data (or that
    /// level-0 hash block) changed.
    DataBlock { block: u64 },
    /// Hash block `index` of `level` differs from its entry one level up.
    HashBlock { level: usize, index: u64 },
    /// The top hash block (with one data block: that block) does not give the root hash.
    Root,
    /// Hash block `index` of `level` has non-zero bytes after its digests (the kernel
    /// ignores them, veritysetup's verify does not).
    Padding { level: usize, index: u64 },
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    pub sb: Option<VeritySb>,
    pub data_blocks: u64,
    pub hash_blocks: u64,
    pub levels: usize,
    /// In order: the root, the upper levels top down, then level 0 and the data.
    pub mismatches: Vec<Mismatch>,
    /// Mismatches past `max` (counted, not kept).
    pub more: u64,
}

impl VerifyReport {
    fn push(&mut self, m: Mismatch, max: usize) {
        if self.mismatches.len() < max {
            self.mismatches.push(m);
        } else {
            self.more += 1;
        }
    }
}

/// The verity superblock at `hash_offset`, checked to be one this module writes and
/// reads (sha256, 4096-byte blocks, format 1, data before the hash area).
pub fn read_sb<S: ferofs_reader::Source + ?Sized>(
    file: &S,
    hash_offset: u64,
) -> Result<VeritySb, String> {
    let mut b = [0u8; SB_SIZE];
    file.read_exact_at(&mut b, hash_offset)
        .map_err(|e| format!("no verity superblock at byte {hash_offset}: {e}"))?;
    let (sig, sb) = VeritySb::parse(&b);
    if !sig {
        return Err(format!(
            "no verity superblock at byte {hash_offset} (no \"verity\" signature)"
        ));
    }
    if sb.version != SB_VERSION || sb.hash_type != HASH_TYPE_NORMAL {
        return Err(format!(
            "verity superblock version {} / hash format {}: only 1 / 1 is read",
            sb.version, sb.hash_type
        ));
    }
    if sb.algorithm != ALGORITHM
        || u64::from(sb.data_block_size) != BLOCK
        || u64::from(sb.hash_block_size) != BLOCK
    {
        return Err(format!(
            "verity superblock: {} with {}-byte data and {}-byte hash blocks; only {ALGORITHM} with {BLOCK}-byte blocks is read",
            sb.algorithm, sb.data_block_size, sb.hash_block_size
        ));
    }
    match sb.data_blocks.checked_mul(BLOCK) {
        Some(end) if sb.data_blocks > 0 && end <= hash_offset => Ok(sb),
        _ => Err(format!(
            "verity superblock: {} data blocks do not end before the hash area at byte {hash_offset}",
            sb.data_blocks
        )),
    }
}

/// Check every data block of `file` against the tree whose superblock is at
/// `hash_offset`, and the tree against `root`. Err when there is no usable superblock
/// or the file cannot be read; mismatches (at most `max` kept) are the report's.
pub fn verify<S: ferofs_reader::Source + ?Sized>(
    file: &S,
    hash_offset: u64,
    root: &[u8],
    max: usize,
) -> Result<VerifyReport, String> {
    let sb = read_sb(file, hash_offset)?;
    let salt = sb.salt.clone();
    let t = layout(sb.data_blocks).map_err(|e| e.to_string())?;
    let tree_at = tree_offset(hash_offset);
    let file_len = file.size().map_err(|e| format!("image size: {e}"))?;
    let tree_end = tree_at + t.total_blocks() * BLOCK;
    if file_len < tree_end {
        return Err(format!(
            "the verity tree is cut short: it ends at byte {tree_end}, the file at {file_len}"
        ));
    }
    let mut r = VerifyReport {
        data_blocks: sb.data_blocks,
        hash_blocks: t.total_blocks(),
        levels: t.levels(),
        sb: Some(sb),
        ..Default::default()
    };
    let io = |e: io::Error| format!("reading the image: {e}");
    if t.levels() == 0 {
        let mut b = vec![0u8; BLOCK as usize];
        file.read_exact_at(&mut b, 0).map_err(io)?;
        if digest(&salt, &b)[..] != *root {
            r.push(Mismatch::Root, max);
            r.push(Mismatch::DataBlock { block: 0 }, max);
        }
        return Ok(r);
    }
    // Levels 1.. in memory (each 1/128 of the one below).
    let mut upper: Vec<Vec<u8>> = vec![Vec::new()];
    for level in 1..t.levels() {
        let mut b = vec![0u8; (t.level_blocks[level] * BLOCK) as usize];
        file.read_exact_at(&mut b, tree_at + t.level_start(level) * BLOCK)
            .map_err(io)?;
        upper.push(b);
    }
    let top = t.levels() - 1;
    let top_block = if top == 0 {
        let mut b = vec![0u8; BLOCK as usize];
        file.read_exact_at(&mut b, tree_at + t.level_start(0) * BLOCK)
            .map_err(io)?;
        b
    } else {
        upper[top].clone()
    };
    if digest(&salt, &top_block)[..] != *root {
        r.push(Mismatch::Root, max);
    }
    let entry = |level: &[u8], i: u64| -> Option<[u8; DIGEST]> {
        // 128 digests fill a 4096-byte hash block exactly: digest i is at byte 32 * i.
        let at = usize::try_from(i).ok()?.checked_mul(DIGEST)?;
        level.get(at..at + DIGEST)?.try_into().ok()
    };
    // Upper levels top down: each hash block of level-1 against its entry in level.
    for level in (2..t.levels()).rev() {
        for (i, b) in upper[level - 1].chunks(BLOCK as usize).enumerate() {
            let i = i as u64;
            if Some(digest(&salt, b)) != entry(&upper[level], i) {
                r.push(
                    Mismatch::HashBlock {
                        level: level - 1,
                        index: i,
                    },
                    max,
                );
            }
        }
        padding(&mut r, &upper[level], t.level_blocks[level - 1], level, max);
    }
    if top >= 1 {
        padding(&mut r, &upper[1], t.level_blocks[0], 1, max);
    }
    // Level 0 and the data, a batch at a time.
    let l0_at = tree_at + t.level_start(0) * BLOCK;
    let mut k = 0;
    // Bounded: k advances by BATCH up to the level's block count.
    while k < t.level_blocks[0] {
        let end = (k + BATCH).min(t.level_blocks[0]);
        let got: Vec<(Vec<u8>, Vec<u8>)> = (k..end)
            .into_par_iter()
            .map(|j| {
                let want = level0_block(file, &salt, &t, j)?;
                let mut stored = vec![0u8; BLOCK as usize];
                file.read_exact_at(&mut stored, l0_at + j * BLOCK)?;
                Ok((want, stored))
            })
            .collect::<io::Result<_>>()
            .map_err(io)?;
        for (j, (want, stored)) in (k..end).zip(got) {
            let first = j * t.per_block;
            let n = t.per_block.min(t.data_blocks - first);
            for (s, (w, h)) in want
                .chunks(DIGEST)
                .zip(stored.chunks(DIGEST))
                .take(n as usize)
                .enumerate()
            {
                if w != h {
                    r.push(
                        Mismatch::DataBlock {
                            block: first + s as u64,
                        },
                        max,
                    );
                }
            }
            if stored[n as usize * DIGEST..].iter().any(|&b| b != 0) {
                r.push(Mismatch::Padding { level: 0, index: j }, max);
            }
            if top >= 1 && Some(digest(&salt, &stored)) != entry(&upper[1], j) {
                r.push(Mismatch::HashBlock { level: 0, index: j }, max);
            }
        }
        k = end;
    }
    Ok(r)
}

/// Non-zero bytes after the `entries` digests of `level` (one per block below).
fn padding(r: &mut VerifyReport, level_bytes: &[u8], entries: u64, level: usize, max: usize) {
    let per = BLOCK / DIGEST as u64;
    for (i, b) in level_bytes.chunks(BLOCK as usize).enumerate() {
        let used = entries.saturating_sub(i as u64 * per).min(per) as usize * DIGEST;
        if b[used..].iter().any(|&x| x != 0) {
            r.push(
                Mismatch::Padding {
                    level,
                    index: i as u64,
                },
                max,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn image(blocks: u64) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        for i in 0..blocks {
            let b: Vec<u8> = (0..BLOCK).map(|j| (i * 7 + j * 13) as u8).collect();
            f.write_all(&b).expect("write");
        }
        f
    }

    #[test]
    fn one_block_root_is_its_digest() {
        let f = image(1);
        let v = append(f.as_file(), BLOCK, b"salt", [1; 16], 1).expect("append");
        let mut b = vec![0u8; BLOCK as usize];
        f.as_file().read_exact_at(&mut b, 0).expect("read");
        assert_eq!(v.root_hash, digest(b"salt", &b));
        assert_eq!(v.hash_blocks, 0);
        assert_eq!(v.file_bytes, 2 * BLOCK);
        let r = verify(f.as_file(), v.hash_offset, &v.root_hash, 10).expect("verify");
        assert!(r.mismatches.is_empty());
    }

    #[test]
    fn two_levels_verify_and_find_a_flipped_block() {
        // 300 data blocks: level 0 of 3 hash blocks, level 1 of one.
        let f = image(300);
        let v = append(f.as_file(), 300 * BLOCK - 100, &[], [2; 16], 2).expect("append");
        assert_eq!((v.data_blocks, v.hash_blocks), (300, 4));
        assert_eq!(v.file_bytes, (300 + 1 + 4) * BLOCK);
        // The root by hand: level 0 from the data, level 1 from level 0.
        let mut data = vec![0u8; 300 * BLOCK as usize];
        f.as_file().read_exact_at(&mut data, 0).expect("read");
        let l0 = pack(data.chunks(BLOCK as usize).map(|b| digest(&[], b)));
        let l1 = pack(l0.chunks(BLOCK as usize).map(|b| digest(&[], b)));
        assert_eq!(l1.len(), BLOCK as usize);
        assert_eq!(v.root_hash, digest(&[], &l1));
        let r = verify(f.as_file(), v.hash_offset, &v.root_hash, 10).expect("verify");
        assert_eq!(r.mismatches, vec![]);
        f.as_file()
            .write_all_at(&[0xFF], 200 * BLOCK + 5)
            .expect("flip");
        let r = verify(f.as_file(), v.hash_offset, &v.root_hash, 10).expect("verify");
        assert_eq!(r.mismatches, vec![Mismatch::DataBlock { block: 200 }]);
        let r = verify(f.as_file(), v.hash_offset, &[0u8; 32], 10).expect("verify");
        assert_eq!(r.mismatches[0], Mismatch::Root);
        // A hash block changed: named, against its parent entry.
        let l0_1 = v.hash_offset + BLOCK * 3;
        f.as_file().write_all_at(&[0xFF], l0_1).expect("flip");
        let r = verify(f.as_file(), v.hash_offset, &v.root_hash, 10).expect("verify");
        assert!(r
            .mismatches
            .contains(&Mismatch::HashBlock { level: 0, index: 1 }));
    }
}
