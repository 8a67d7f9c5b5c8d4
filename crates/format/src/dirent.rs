//! Directory entries (format doc §3).

use crate::le::*;

pub const DIRENT_SIZE: usize = 12;

pub const FT_UNKNOWN: u8 = 0;
pub const FT_REG_FILE: u8 = 1;
pub const FT_DIR: u8 = 2;
pub const FT_CHRDEV: u8 = 3;
pub const FT_BLKDEV: u8 = 4;
pub const FT_FIFO: u8 = 5;
pub const FT_SOCK: u8 = 6;
pub const FT_SYMLINK: u8 = 7;
pub const FT_MAX: u8 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dirent {
    pub nid: u64,
    pub nameoff: u16,
    pub file_type: u8,
}

impl Dirent {
    pub fn parse(b: &[u8; DIRENT_SIZE]) -> Self {
        Dirent {
            nid: u64_at(b, 0),
            nameoff: u16_at(b, 8),
            file_type: b[10],
        }
    }
    pub fn encode(&self) -> [u8; DIRENT_SIZE] {
        let mut b = [0u8; DIRENT_SIZE];
        put_u64(&mut b, 0, self.nid);
        put_u16(&mut b, 8, self.nameoff);
        b[10] = self.file_type;
        b
    }
}

/// Dirent file type for an `i_mode`.
pub fn file_type_of_mode(mode: u16) -> u8 {
    use crate::inode::*;
    match mode & S_IFMT {
        S_IFREG => FT_REG_FILE,
        S_IFDIR => FT_DIR,
        S_IFCHR => FT_CHRDEV,
        S_IFBLK => FT_BLKDEV,
        S_IFIFO => FT_FIFO,
        S_IFSOCK => FT_SOCK,
        S_IFLNK => FT_SYMLINK,
        _ => FT_UNKNOWN,
    }
}
