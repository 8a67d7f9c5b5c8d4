//! An image inside a file: the bytes from `offset` to the end (`--offset`).

use ferofs_reader::Source;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// A [`Source`] over `file[offset..]`.
#[derive(Debug)]
pub struct OffsetFile {
    file: File,
    offset: u64,
    len: u64,
}

impl OffsetFile {
    /// The bytes of `file` from `offset` on; an error when `offset` is past its end.
    pub fn new(file: File, offset: u64) -> io::Result<Self> {
        let size = file.metadata()?.len();
        let len = size.checked_sub(offset).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("offset {offset} is past the end of the file ({size} bytes)"),
            )
        })?;
        Ok(OffsetFile { file, offset, len })
    }
}

impl Source for OffsetFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.len)
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        let at = self
            .offset
            .checked_add(offset)
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        FileExt::read_exact_at(&self.file, buf, at)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.len)
    }
}
