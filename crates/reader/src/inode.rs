//! Inodes (like the kernel's inode.c): locate by nid, parse compact/extended cores.

use crate::error::*;
use crate::image::Image;
use crate::source::Source;
use ferofs_format::inode::*;
use ferofs_format::sb::INCOMPAT_48BIT;

/// A parsed inode with its values interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub nid: u64,
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// `i_ino` as stored (serial number for 32-bit stat).
    pub ino: u32,
    /// Raw on-disk rdev (devices only).
    pub rdev: u32,
    pub layout: DataLayout,
    pub extended: bool,
    pub xattr_icount: u16,
    /// Raw `i_u` and the high address bits (48-bit).
    pub raw_u: u32,
    pub addr_hi: u16,
    /// Directory without a "." entry (DOT_OMITTED).
    pub dot_omitted: bool,
    /// Size of the inode core plus inline xattr area (where inline data starts).
    pub meta_size: u64,
}

impl Inode {
    pub fn file_type(&self) -> u16 {
        self.mode & S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.file_type() == S_IFDIR
    }
    pub fn is_regular(&self) -> bool {
        self.file_type() == S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.file_type() == S_IFLNK
    }
    pub fn is_device(&self) -> bool {
        matches!(self.file_type(), S_IFCHR | S_IFBLK)
    }
    pub fn rdev_major_minor(&self) -> (u32, u32) {
        decode_rdev(self.rdev)
    }
    /// First data block for flat layouts (48-bit aware).
    pub fn startblk(&self) -> u64 {
        u64::from(self.raw_u) | (u64::from(self.addr_hi) << 32)
    }
}

/// Bound on file sizes we accept (the format allows u64; nothing real exceeds 2^60).
pub(crate) const MAX_FILE_SIZE: u64 = 1 << 60;

impl<S: Source> Image<S> {
    /// Load inode `nid`.
    pub fn inode(&self, nid: u64) -> Result<Inode> {
        // One read of an extended inode's size covers either kind (most inodes of a
        // real tree are extended); near the end of the metadata only the compact
        // size may be there, so fall back to it.
        let mut both = [0u8; EXTENDED_SIZE];
        let whole = self.read_inode_meta(nid, 0, &mut both).is_ok();
        let mut head = [0u8; COMPACT_SIZE];
        if whole {
            head.copy_from_slice(&both[..COMPACT_SIZE]);
        } else {
            self.read_inode_meta(nid, 0, &mut head)?;
        }
        let format = u16::from_le_bytes([head[0], head[1]]);
        if format & !I_FORMAT_ALL != 0 {
            return Err(corrupt(
                CorruptKind::BadInodeFormat,
                Some(nid),
                None,
                Some(u64::from(format)),
                "unknown i_format bits",
            ));
        }
        let core = if format & I_VERSION_EXTENDED != 0 {
            let mut b = both;
            if !whole {
                // The second half is missing: this read reports why.
                let mut tail = [0u8; EXTENDED_SIZE - COMPACT_SIZE];
                self.read_inode_meta(nid, COMPACT_SIZE as u64, &mut tail)?;
                b[COMPACT_SIZE..].copy_from_slice(&tail);
            }
            InodeCore::parse_extended(&b)
        } else {
            InodeCore::parse_compact(&head)
        };
        let layout = core
            .layout()
            .ok_or_else(|| unsupported(format!("data layout {}", core.layout_raw()), Some(nid)))?;
        if core.xattr_icount == 1 {
            return Err(corrupt(
                CorruptKind::BadXattr,
                Some(nid),
                None,
                Some(1),
                "i_xattr_icount 1 is invalid",
            ));
        }
        if core.size > MAX_FILE_SIZE {
            return Err(corrupt(
                CorruptKind::BadInodeSize,
                Some(nid),
                None,
                Some(core.size),
                "file size too large",
            ));
        }
        let extended = core.is_extended();
        let (mtime, mtime_nsec) = if extended {
            (core.mtime, core.mtime_nsec)
        } else {
            // Compact inodes: epoch + unsigned 32-bit offset (48-bit layout and
            // kernels >= 6.15 treat every image alike), ns from the superblock.
            let epoch = self.sb.epoch as i64;
            (epoch.wrapping_add(core.mtime), self.sb.fixed_nsec)
        };
        let ftype = core.mode & S_IFMT;
        let is_dir = ftype == S_IFDIR;
        if !matches!(
            ftype,
            S_IFREG | S_IFDIR | S_IFLNK | S_IFCHR | S_IFBLK | S_IFIFO | S_IFSOCK
        ) {
            return Err(corrupt(
                CorruptKind::BadInodeFormat,
                Some(nid),
                None,
                Some(u64::from(core.mode)),
                "unknown file type",
            ));
        }
        let addr_hi = if self.sb.has_incompat(INCOMPAT_48BIT) {
            core.addr_hi()
        } else {
            0
        };
        let rdev = if matches!(ftype, S_IFCHR | S_IFBLK) {
            core.u
        } else {
            0
        };
        let meta_size = (core.core_size() + core.xattr_size()) as u64;
        Ok(Inode {
            nid,
            mode: core.mode,
            uid: core.uid,
            gid: core.gid,
            nlink: core.nlink(),
            size: core.size,
            mtime,
            mtime_nsec,
            ino: core.ino,
            rdev,
            layout,
            extended,
            xattr_icount: core.xattr_icount,
            raw_u: core.u,
            addr_hi,
            dot_omitted: is_dir && core.dot_omitted(),
            meta_size,
        })
    }
}
