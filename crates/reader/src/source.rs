//! Positional-read sources. Reads take `&self`, so one image serves many threads.

use std::io;
use std::sync::Arc;

pub trait Source: Send + Sync {
    /// Fill `buf` from `offset`; an error (UnexpectedEof) if the source is shorter.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Total length in bytes.
    fn size(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.size()? == 0)
    }
}

impl Source for std::fs::File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        file_len(self)
    }
}

/// The length of an open file in bytes; for a block device (whose metadata says 0),
/// the device's size.
pub fn file_len(f: &std::fs::File) -> io::Result<u64> {
    use std::os::unix::fs::FileTypeExt;
    let md = f.metadata()?;
    if md.file_type().is_block_device() {
        // Positional reads do not use the file position, so moving it is harmless.
        let mut f = f;
        return io::Seek::seek(&mut f, io::SeekFrom::End(0));
    }
    Ok(md.len())
}

fn slice_read(data: &[u8], buf: &mut [u8], offset: u64) -> io::Result<()> {
    let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
    let end = start
        .checked_add(buf.len())
        .ok_or(io::ErrorKind::UnexpectedEof)?;
    let src = data.get(start..end).ok_or(io::ErrorKind::UnexpectedEof)?;
    buf.copy_from_slice(src);
    Ok(())
}

impl Source for Vec<u8> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        slice_read(self, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.as_slice().len() as u64)
    }
}

impl Source for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        slice_read(self, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(<[u8]>::len(self) as u64)
    }
}

impl<S: Source + ?Sized> Source for Arc<S> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_exact_at(buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
}
