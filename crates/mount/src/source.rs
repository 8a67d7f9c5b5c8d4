//! An image inside a file: the bytes from `offset` to the end (`--offset`).
//!
//! Two open files of the same image: the kernel's page-cache read-ahead is per open
//! file. Sequential reads (a file read from its start on, metadata) go through `file`,
//! where read-ahead streams the image from the disk; random reads (a request that does
//! not continue the previous one of its file, see [`random_reads`]) through `random`,
//! opened with POSIX_FADV_RANDOM, so a 4 KiB read costs the blocks it needs, not a
//! read-ahead window of megabytes (the disk's `read_ahead_kb`).

use ferofs_reader::Source;
use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

thread_local! {
    static RANDOM: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` with the thread-local flag `flag` set, cleared again however `f` ends.
pub(crate) fn with_flag<T>(
    flag: &'static std::thread::LocalKey<Cell<bool>>,
    f: impl FnOnce() -> T,
) -> T {
    struct Reset(&'static std::thread::LocalKey<Cell<bool>>);
    impl Drop for Reset {
        fn drop(&mut self) {
            self.0.with(|r| r.set(false));
        }
    }
    flag.with(|r| r.set(true));
    let _reset = Reset(flag);
    f()
}

/// Run `f` with this thread's image reads going through the random-access file.
pub(crate) fn random_reads<T>(f: impl FnOnce() -> T) -> T {
    with_flag(&RANDOM, f)
}

/// A [`Source`] over `file[offset..]`.
#[derive(Debug)]
pub struct OffsetFile {
    file: File,
    /// The same image opened once more, without read-ahead (None: use `file`).
    random: Option<File>,
    offset: u64,
    len: u64,
}

impl OffsetFile {
    /// The bytes of `file` from `offset` on; an error when `offset` is past its end.
    pub fn new(file: File, offset: u64) -> io::Result<Self> {
        let size = ferofs_reader::source::file_len(&file)?;
        let len = size.checked_sub(offset).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("offset {offset} is past its end ({size} bytes)"),
            )
        })?;
        Ok(OffsetFile {
            file,
            random: None,
            offset,
            len,
        })
    }

    /// Serve random reads through `twin`, another open file of the same image, which
    /// is told not to read ahead (POSIX_FADV_RANDOM).
    pub fn with_random_twin(mut self, twin: File) -> io::Result<Self> {
        rustix::fs::fadvise(&twin, 0, None, rustix::fs::Advice::Random)?;
        self.random = Some(twin);
        Ok(self)
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
        let f = match &self.random {
            Some(r) if RANDOM.with(Cell::get) => r,
            _ => &self.file,
        };
        FileExt::read_exact_at(f, buf, at)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.len)
    }
}
