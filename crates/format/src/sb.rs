//! Superblock (format doc §1): 128 bytes at byte 1024, plus 16-byte extension slots.

use crate::le::*;

pub const MAGIC: u32 = 0xE0F5_E1E2;
/// Byte offset of the superblock in the image.
pub const SB_OFFSET: u64 = 1024;
/// Size of the base superblock.
pub const SB_BASE_SIZE: usize = 128;
/// Size of the largest superblock this crate knows (one extension slot).
pub const SB_MAX_SIZE: usize = 144;

// feature_compat
pub const COMPAT_SB_CHKSUM: u32 = 0x01;
pub const COMPAT_MTIME: u32 = 0x02;
pub const COMPAT_XATTR_FILTER: u32 = 0x04;
pub const COMPAT_SHARED_EA_IN_METABOX: u32 = 0x08;
pub const COMPAT_PLAIN_XATTR_PFX: u32 = 0x10;
pub const COMPAT_ISHARE_XATTRS: u32 = 0x20;

// feature_incompat
pub const INCOMPAT_ZERO_PADDING: u32 = 0x001;
pub const INCOMPAT_COMPR_CFGS: u32 = 0x002;
pub const INCOMPAT_BIG_PCLUSTER: u32 = 0x002;
pub const INCOMPAT_CHUNKED_FILE: u32 = 0x004;
pub const INCOMPAT_DEVICE_TABLE: u32 = 0x008;
pub const INCOMPAT_COMPR_HEAD2: u32 = 0x008;
pub const INCOMPAT_ZTAILPACKING: u32 = 0x010;
pub const INCOMPAT_FRAGMENTS: u32 = 0x020;
pub const INCOMPAT_DEDUPE: u32 = 0x020;
pub const INCOMPAT_XATTR_PREFIXES: u32 = 0x040;
pub const INCOMPAT_48BIT: u32 = 0x080;
pub const INCOMPAT_METABOX: u32 = 0x100;
/// Every incompat bit this crate knows about.
pub const INCOMPAT_ALL_KNOWN: u32 = 0x1FF;

/// Compression algorithm ids (bit numbers of `available_compr_algs`).
pub const ALG_LZ4: u8 = 0;
pub const ALG_LZMA: u8 = 1;
pub const ALG_DEFLATE: u8 = 2;
pub const ALG_ZSTD: u8 = 3;
pub const ALG_MAX: u8 = 4;

/// The superblock, field for field. Parsing never fails; validation is the reader's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Superblock {
    pub magic: u32,
    pub checksum: u32,
    pub feature_compat: u32,
    pub blkszbits: u8,
    pub sb_extslots: u8,
    /// Raw u16 at 0x0E: root nid, or (48-bit with rootnid_8b) blocks_hi.
    pub rootnid_2b: u16,
    pub inos: u64,
    pub epoch: u64,
    pub fixed_nsec: u32,
    pub blocks_lo: u32,
    pub meta_blkaddr: u32,
    pub xattr_blkaddr: u32,
    pub uuid: [u8; 16],
    pub volume_name: [u8; 16],
    pub feature_incompat: u32,
    /// `available_compr_algs` with COMPR_CFGS, else `lz4_max_distance`.
    pub u1: u16,
    pub extra_devices: u16,
    pub devt_slotoff: u16,
    pub dirblkbits: u8,
    pub xattr_prefix_count: u8,
    pub xattr_prefix_start: u32,
    pub packed_nid: u64,
    pub xattr_filter_reserved: u8,
    pub ishare_xattr_prefix_id: u8,
    pub build_time: u32,
    pub rootnid_8b: u64,
    /// Only meaningful when `sb_size() > 128`.
    pub metabox_nid: u64,
}

impl Superblock {
    /// Parse from the bytes at [`SB_OFFSET`]. Bytes past 128 are used only when
    /// `sb_extslots` says they belong to the superblock.
    pub fn parse(b: &[u8; SB_MAX_SIZE]) -> Self {
        let sb_extslots = b[0x0D];
        Superblock {
            magic: u32_at(b, 0x00),
            checksum: u32_at(b, 0x04),
            feature_compat: u32_at(b, 0x08),
            blkszbits: b[0x0C],
            sb_extslots,
            rootnid_2b: u16_at(b, 0x0E),
            inos: u64_at(b, 0x10),
            epoch: u64_at(b, 0x18),
            fixed_nsec: u32_at(b, 0x20),
            blocks_lo: u32_at(b, 0x24),
            meta_blkaddr: u32_at(b, 0x28),
            xattr_blkaddr: u32_at(b, 0x2C),
            uuid: arr16(b, 0x30),
            volume_name: arr16(b, 0x40),
            feature_incompat: u32_at(b, 0x50),
            u1: u16_at(b, 0x54),
            extra_devices: u16_at(b, 0x56),
            devt_slotoff: u16_at(b, 0x58),
            dirblkbits: b[0x5A],
            xattr_prefix_count: b[0x5B],
            xattr_prefix_start: u32_at(b, 0x5C),
            packed_nid: u64_at(b, 0x60),
            xattr_filter_reserved: b[0x68],
            ishare_xattr_prefix_id: b[0x69],
            build_time: u32_at(b, 0x6C),
            rootnid_8b: u64_at(b, 0x70),
            metabox_nid: if sb_extslots >= 1 { u64_at(b, 0x80) } else { 0 },
        }
    }

    /// Encode into `sb_size()` bytes (128 or 144).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.sb_size()];
        put_u32(&mut b, 0x00, self.magic);
        put_u32(&mut b, 0x04, self.checksum);
        put_u32(&mut b, 0x08, self.feature_compat);
        b[0x0C] = self.blkszbits;
        b[0x0D] = self.sb_extslots;
        put_u16(&mut b, 0x0E, self.rootnid_2b);
        put_u64(&mut b, 0x10, self.inos);
        put_u64(&mut b, 0x18, self.epoch);
        put_u32(&mut b, 0x20, self.fixed_nsec);
        put_u32(&mut b, 0x24, self.blocks_lo);
        put_u32(&mut b, 0x28, self.meta_blkaddr);
        put_u32(&mut b, 0x2C, self.xattr_blkaddr);
        b[0x30..0x40].copy_from_slice(&self.uuid);
        b[0x40..0x50].copy_from_slice(&self.volume_name);
        put_u32(&mut b, 0x50, self.feature_incompat);
        put_u16(&mut b, 0x54, self.u1);
        put_u16(&mut b, 0x56, self.extra_devices);
        put_u16(&mut b, 0x58, self.devt_slotoff);
        b[0x5A] = self.dirblkbits;
        b[0x5B] = self.xattr_prefix_count;
        put_u32(&mut b, 0x5C, self.xattr_prefix_start);
        put_u64(&mut b, 0x60, self.packed_nid);
        b[0x68] = self.xattr_filter_reserved;
        b[0x69] = self.ishare_xattr_prefix_id;
        put_u32(&mut b, 0x6C, self.build_time);
        put_u64(&mut b, 0x70, self.rootnid_8b);
        if self.sb_extslots >= 1 {
            put_u64(&mut b, 0x80, self.metabox_nid);
        }
        b
    }

    /// Size of the superblock in bytes: `128 + 16 * sb_extslots`.
    pub fn sb_size(&self) -> usize {
        SB_BASE_SIZE + 16 * usize::from(self.sb_extslots)
    }

    pub fn has_compat(&self, bit: u32) -> bool {
        self.feature_compat & bit != 0
    }
    pub fn has_incompat(&self, bit: u32) -> bool {
        self.feature_incompat & bit != 0
    }

    /// Root nid and total block count, by the kernel's rule (doc §1.1).
    pub fn root_nid_and_blocks(&self) -> (u64, u64) {
        if self.has_incompat(INCOMPAT_48BIT) && self.rootnid_8b != 0 {
            (
                self.rootnid_8b,
                u64::from(self.blocks_lo) | (u64::from(self.rootnid_2b) << 32),
            )
        } else {
            (u64::from(self.rootnid_2b), u64::from(self.blocks_lo))
        }
    }

    /// Build time in seconds (epoch + build_time).
    pub fn build_time_secs(&self) -> i128 {
        i128::from(self.epoch as i64) + i128::from(self.build_time)
    }

    /// Label as bytes up to the first NUL.
    pub fn label(&self) -> &[u8] {
        until_nul(&self.volume_name)
    }
}

/// `b` up to its first NUL.
fn until_nul(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

fn arr16(b: &[u8; SB_MAX_SIZE], off: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    a
}

/// Length of the region the superblock checksum covers, for a block size (doc §1.3).
pub fn checksum_len(blksz: u32) -> usize {
    if blksz > 1024 {
        (blksz - 1024) as usize
    } else {
        blksz as usize
    }
}

/// Compute the checksum over `region` (starting at the superblock magic, `checksum_len`
/// bytes), treating the checksum field as zero.
pub fn compute_checksum(region: &[u8]) -> u32 {
    let mut crc = crate::crc32c::crc32c_raw(0xFFFF_FFFF, &region[..4.min(region.len())]);
    crc = crate::crc32c::crc32c_raw(crc, &[0u8; 4]);
    if region.len() > 8 {
        crc = crate::crc32c::crc32c_raw(crc, &region[8..]);
    }
    crc
}

/// Device table slot (doc §1.6), 128 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSlot {
    pub tag: [u8; 64],
    pub blocks_lo: u32,
    pub uniaddr_lo: u32,
    pub blocks_hi: u16,
    pub uniaddr_hi: u16,
}
pub const DEVICE_SLOT_SIZE: usize = 128;

impl DeviceSlot {
    pub fn parse(b: &[u8; DEVICE_SLOT_SIZE]) -> Self {
        let mut tag = [0u8; 64];
        tag.copy_from_slice(&b[..64]);
        DeviceSlot {
            tag,
            blocks_lo: u32_at(b, 64),
            uniaddr_lo: u32_at(b, 68),
            blocks_hi: u16_at(b, 72),
            uniaddr_hi: u16_at(b, 74),
        }
    }

    /// The device's first block in the unified address space.
    pub fn uniaddr(&self) -> u64 {
        u64::from(self.uniaddr_lo) | (u64::from(self.uniaddr_hi) << 32)
    }

    /// The tag up to its first NUL (empty: none).
    pub fn tag_bytes(&self) -> &[u8] {
        until_nul(&self.tag)
    }

    /// The device's size in blocks.
    pub fn blocks(&self) -> u64 {
        u64::from(self.blocks_lo) | (u64::from(self.blocks_hi) << 32)
    }
}

/// Compression configuration record payload lengths written by mkfs (doc §1.5).
pub fn compr_cfg_len(alg: u8) -> Option<u16> {
    match alg {
        ALG_LZ4 => Some(14),
        ALG_LZMA => Some(14),
        ALG_DEFLATE => Some(6),
        ALG_ZSTD => Some(6),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The superblock of the worked example in doc §14 (bytes 0x400..0x480).
    fn example() -> [u8; 128] {
        let hex = "e2e1f5e0d31b0dec030000000c0024000200000000000000\
                   00f1536500000000000000000100000000000000000000000123456789abcdef\
                   0123456789abcdef64656d6f";
        let mut b = [0u8; 128];
        let digits: Vec<u8> = hex.bytes().filter(|c| c.is_ascii_hexdigit()).collect();
        for (i, pair) in digits.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).expect("ascii");
            b[i] = u8::from_str_radix(s, 16).expect("hex");
        }
        b
    }

    #[test]
    fn parse_encode_example() {
        let mut b = [0u8; SB_MAX_SIZE];
        b[..128].copy_from_slice(&example());
        let sb = Superblock::parse(&b);
        assert_eq!(sb.magic, MAGIC);
        assert_eq!(sb.checksum, 0xEC0D_1BD3);
        assert_eq!(sb.feature_compat, COMPAT_SB_CHKSUM | COMPAT_MTIME);
        assert_eq!(sb.blkszbits, 12);
        assert_eq!(sb.root_nid_and_blocks(), (36, 1));
        assert_eq!(sb.inos, 2);
        assert_eq!(sb.epoch, 1_700_000_000);
        assert_eq!(sb.label(), b"demo");
        assert_eq!(sb.encode(), example().to_vec());
    }
}
