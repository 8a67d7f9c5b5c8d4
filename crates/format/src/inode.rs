//! Inodes (format doc §2): compact (32 B) and extended (64 B) cores.

use crate::le::*;

pub const COMPACT_SIZE: usize = 32;
pub const EXTENDED_SIZE: usize = 64;
/// Byte of the link count in a compact inode (`i_nb`, u16) and an extended one
/// (`i_nlink`, u32).
pub const COMPACT_NLINK_AT: usize = 0x06;
pub const EXTENDED_NLINK_AT: usize = 0x2C;

/// `i_format` bit 0: extended inode.
pub const I_VERSION_EXTENDED: u16 = 0x1;
/// `i_format` bits 1..3: data layout.
pub const I_DATALAYOUT_SHIFT: u16 = 1;
pub const I_DATALAYOUT_MASK: u16 = 0x7;
/// `i_format` bit 4: NLINK_1 (non-directories, compact) / DOT_OMITTED (directories).
pub const I_NLINK_1: u16 = 0x10;
pub const I_DOT_OMITTED: u16 = 0x10;
/// Bits the kernel accepts in `i_format`.
pub const I_FORMAT_ALL: u16 = 0x1F;

/// Data layouts (doc §2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataLayout {
    FlatPlain = 0,
    CompressedFull = 1,
    FlatInline = 2,
    CompressedCompact = 3,
    ChunkBased = 4,
}

impl DataLayout {
    pub fn from_raw(v: u16) -> Option<Self> {
        Some(match v {
            0 => Self::FlatPlain,
            1 => Self::CompressedFull,
            2 => Self::FlatInline,
            3 => Self::CompressedCompact,
            4 => Self::ChunkBased,
            _ => return None,
        })
    }
    pub fn is_compressed(self) -> bool {
        matches!(self, Self::CompressedFull | Self::CompressedCompact)
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::FlatPlain => "flat-plain",
            Self::CompressedFull => "compressed-full",
            Self::FlatInline => "flat-inline",
            Self::CompressedCompact => "compressed-compact",
            Self::ChunkBased => "chunk-based",
        }
    }
}

/// POSIX file type bits of `i_mode`.
pub const S_IFMT: u16 = 0o170000;
pub const S_IFSOCK: u16 = 0o140000;
pub const S_IFLNK: u16 = 0o120000;
pub const S_IFREG: u16 = 0o100000;
pub const S_IFBLK: u16 = 0o060000;
pub const S_IFDIR: u16 = 0o040000;
pub const S_IFCHR: u16 = 0o020000;
pub const S_IFIFO: u16 = 0o010000;

/// The fields common to both inode versions, as stored (no interpretation of `i_u`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InodeCore {
    pub format: u16,
    pub xattr_icount: u16,
    pub mode: u16,
    /// Raw `i_nb`: nlink (compact without NLINK_1) or the high bits of startblk/blocks.
    pub nb: u16,
    pub size: u64,
    /// Compact: mtime relative to `sb.epoch` (u32). Extended: absolute seconds.
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// Raw `i_u`.
    pub u: u32,
    pub ino: u32,
    pub uid: u32,
    pub gid: u32,
    /// Extended only (compact: taken from `nb`, see [`InodeCore::nlink`]).
    pub nlink_ext: u32,
}

impl InodeCore {
    pub fn is_extended(&self) -> bool {
        self.format & I_VERSION_EXTENDED != 0
    }
    pub fn core_size(&self) -> usize {
        if self.is_extended() {
            EXTENDED_SIZE
        } else {
            COMPACT_SIZE
        }
    }
    pub fn layout_raw(&self) -> u16 {
        (self.format >> I_DATALAYOUT_SHIFT) & I_DATALAYOUT_MASK
    }
    pub fn layout(&self) -> Option<DataLayout> {
        DataLayout::from_raw(self.layout_raw())
    }
    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
    /// NLINK_1 only applies to non-directory compact inodes.
    pub fn nlink_1(&self) -> bool {
        !self.is_extended() && !self.is_dir() && self.format & I_NLINK_1 != 0
    }
    pub fn dot_omitted(&self) -> bool {
        self.is_dir() && self.format & I_DOT_OMITTED != 0
    }
    pub fn nlink(&self) -> u32 {
        if self.is_extended() {
            self.nlink_ext
        } else if self.nlink_1() {
            1
        } else {
            u32::from(self.nb)
        }
    }
    /// High 16 bits of startblk / blocks (48-bit images).
    pub fn addr_hi(&self) -> u16 {
        if self.is_extended() || self.nlink_1() {
            self.nb
        } else {
            0
        }
    }
    /// Size of the inline xattr area (doc §4.1).
    pub fn xattr_size(&self) -> usize {
        xattr_ibody_size(self.xattr_icount)
    }

    pub fn parse_compact(b: &[u8; COMPACT_SIZE]) -> Self {
        InodeCore {
            format: u16_at(b, 0x00),
            xattr_icount: u16_at(b, 0x02),
            mode: u16_at(b, 0x04),
            nb: u16_at(b, COMPACT_NLINK_AT),
            size: u64::from(u32_at(b, 0x08)),
            mtime: i64::from(u32_at(b, 0x0C)),
            mtime_nsec: 0,
            u: u32_at(b, 0x10),
            ino: u32_at(b, 0x14),
            uid: u32::from(u16_at(b, 0x18)),
            gid: u32::from(u16_at(b, 0x1A)),
            nlink_ext: 0,
        }
    }

    pub fn parse_extended(b: &[u8; EXTENDED_SIZE]) -> Self {
        InodeCore {
            format: u16_at(b, 0x00),
            xattr_icount: u16_at(b, 0x02),
            mode: u16_at(b, 0x04),
            nb: u16_at(b, 0x06),
            size: u64_at(b, 0x08),
            u: u32_at(b, 0x10),
            ino: u32_at(b, 0x14),
            uid: u32_at(b, 0x18),
            gid: u32_at(b, 0x1C),
            mtime: u64_at(b, 0x20) as i64,
            mtime_nsec: u32_at(b, 0x28),
            nlink_ext: u32_at(b, EXTENDED_NLINK_AT),
        }
    }

    /// Encode a compact inode. The caller guarantees the values fit (see
    /// [`InodeCore::fits_compact`]); `mtime` must already be relative to the epoch.
    pub fn encode_compact(&self) -> [u8; COMPACT_SIZE] {
        let mut b = [0u8; COMPACT_SIZE];
        put_u16(&mut b, 0x00, self.format & !I_VERSION_EXTENDED);
        put_u16(&mut b, 0x02, self.xattr_icount);
        put_u16(&mut b, 0x04, self.mode);
        put_u16(&mut b, 0x06, self.nb);
        put_u32(&mut b, 0x08, self.size as u32);
        put_u32(&mut b, 0x0C, self.mtime as u32);
        put_u32(&mut b, 0x10, self.u);
        put_u32(&mut b, 0x14, self.ino);
        put_u16(&mut b, 0x18, self.uid as u16);
        put_u16(&mut b, 0x1A, self.gid as u16);
        b
    }

    /// Encode an extended inode.
    pub fn encode_extended(&self) -> [u8; EXTENDED_SIZE] {
        let mut b = [0u8; EXTENDED_SIZE];
        put_u16(&mut b, 0x00, self.format | I_VERSION_EXTENDED);
        put_u16(&mut b, 0x02, self.xattr_icount);
        put_u16(&mut b, 0x04, self.mode);
        put_u16(&mut b, 0x06, self.nb);
        put_u64(&mut b, 0x08, self.size);
        put_u32(&mut b, 0x10, self.u);
        put_u32(&mut b, 0x14, self.ino);
        put_u32(&mut b, 0x18, self.uid);
        put_u32(&mut b, 0x1C, self.gid);
        put_u64(&mut b, 0x20, self.mtime as u64);
        put_u32(&mut b, 0x28, self.mtime_nsec);
        put_u32(&mut b, 0x2C, self.nlink_ext);
        b
    }
}

/// Build an `i_format` value.
pub fn make_format(extended: bool, layout: DataLayout, bit4: bool) -> u16 {
    let mut f = (layout as u16) << I_DATALAYOUT_SHIFT;
    if extended {
        f |= I_VERSION_EXTENDED;
    }
    if bit4 {
        f |= I_NLINK_1;
    }
    f
}

/// Inline xattr area size for an `i_xattr_icount` (doc §4.1).
pub fn xattr_ibody_size(icount: u16) -> usize {
    if icount == 0 {
        0
    } else {
        12 + 4 * (usize::from(icount) - 1)
    }
}

/// `i_xattr_icount` for an inline area of `size` bytes (size must be 0 or 12 + 4k, k ≥ 1).
pub fn xattr_icount_for(size: usize) -> Option<u16> {
    if size == 0 {
        return Some(0);
    }
    if size < 16 || !(size - 12).is_multiple_of(4) {
        return None;
    }
    u16::try_from((size - 12) / 4 + 1).ok()
}

/// Encode a device number in Linux's "new" dev_t format (doc §2.6).
pub fn encode_rdev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// Decode (major, minor) from the on-disk rdev.
pub fn decode_rdev(rdev: u32) -> (u32, u32) {
    (
        (rdev & 0xfff00) >> 8,
        (rdev & 0xff) | ((rdev >> 12) & 0xfff00),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn rdev_roundtrip() {
        assert_eq!(encode_rdev(4, 64), 0x440);
        assert_eq!(decode_rdev(0x440), (4, 64));
        for (ma, mi) in [(4095, 1_048_575), (259, 65536), (0, 0), (8, 1)] {
            assert_eq!(decode_rdev(encode_rdev(ma, mi)), (ma, mi));
        }
    }
    #[test]
    fn xattr_sizes() {
        assert_eq!(xattr_ibody_size(0), 0);
        assert_eq!(xattr_ibody_size(0x0c), 56);
        assert_eq!(xattr_icount_for(56), Some(0x0c));
        assert_eq!(xattr_icount_for(12), None);
    }
    #[test]
    fn compact_example_from_doc() {
        // doc §14 root inode at 0x480
        let b: [u8; 32] = [
            0x04, 0x00, 0x00, 0x00, 0xed, 0x41, 0x02, 0x00, 0x30, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff,
            0xff, 0xff, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let i = InodeCore::parse_compact(&b);
        assert_eq!(i.layout(), Some(DataLayout::FlatInline));
        assert_eq!(i.mode, 0o040755);
        assert_eq!(i.nlink(), 2);
        assert_eq!(i.size, 48);
        assert_eq!(i.u, u32::MAX);
        assert_eq!(i.encode_compact(), b);
    }
    #[test]
    fn extended_roundtrip() {
        let i = InodeCore {
            format: make_format(true, DataLayout::FlatPlain, false),
            xattr_icount: 5,
            mode: S_IFREG | 0o4755,
            nb: 0,
            size: 5 << 30,
            mtime: -1,
            mtime_nsec: 999_999_999,
            u: 77,
            ino: 3,
            uid: 4_000_000_000,
            gid: 65536,
            nlink_ext: 70000,
        };
        assert_eq!(InodeCore::parse_extended(&i.encode_extended()), i);
    }
}
