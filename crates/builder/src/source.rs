//! Where a regular file's bytes come from: the one thing the data stages (`place`,
//! `data`, `zdata`, `dedupe`) know about an input. A directory scan gives each file its
//! own path; a tar stream gives byte ranges of the tar itself (read in place) or of a
//! spool file its contents were copied to. Another input (a SquashFS or EROFS image
//! read through a reader) adds a variant here and the arms of [`Reader`]; nothing else
//! in the pipeline changes.
//!
//! A file is `size` logical bytes. Whatever no data segment covers is a hole: it reads
//! as zeros, and the data stages keep it a hole (null chunks) when it spans a chunk.

use crate::options::*;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One data segment of a file: logical bytes `[start, start + len)` are at byte `at`
/// of the backing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub start: u64,
    pub len: u64,
    pub at: u64,
}

/// A regular file's contents.
#[derive(Debug, Clone)]
pub enum Source {
    /// A file of its own, from offset 0 (the builder's own spools); holes are found
    /// with SEEK_DATA/SEEK_HOLE.
    Path(PathBuf),
    /// A file of a scanned directory: as `Path`, with its mtime and ctime as scanned;
    /// [`Reader::unchanged`] checks them (and the size) after each read.
    Scanned { path: PathBuf, stamp: Stamp },
    /// All `size` bytes, contiguous from byte `at` of a shared backing file.
    Range { file: Arc<Path>, at: u64 },
    /// Data segments of a shared backing file (sorted, not overlapping, inside the
    /// file's size); the rest is holes.
    Sparse {
        file: Arc<Path>,
        segs: Arc<[Segment]>,
    },
    /// Data segments of the fragments' spool (the packed inode's data): as `Sparse`,
    /// with places past [`crate::frag::IN_PLACE`] read from the source files they
    /// refer to.
    Spooled {
        spool: Arc<crate::frag::Spool>,
        segs: Arc<[Segment]>,
    },
    /// On an extra device of the image, contiguous from block `blkaddr` (tar index
    /// mode: the tar is the device; a layer merged by reference). Never read: the
    /// image only points at it. With `tail`, only the file's full blocks are there:
    /// its last, partial block is read from `tail` (the same file of a layer, whose
    /// tail is inline) and stored in the image.
    External {
        device: u16,
        blkaddr: u64,
        tail: Option<Arc<crate::erofsin::ErofsFile>>,
    },
    /// Blocks reserved in the image for the file's data, which is not stored
    /// (`--reserve-data`): zeros until filled in from byte `at` of the source (the
    /// data's offset in a tar; 0 for other sources). Never read.
    Reserved { at: u64 },
    /// A regular file of an EROFS image read through the reader (re-encoding): read
    /// on demand, decoding only the extents a read covers; holes from its mapping.
    Erofs(Arc<crate::erofsin::ErofsFile>),
    /// A regular file of a SquashFS image with data blocks, decoded as it is read.
    Squash(Arc<crate::squashfs::SquashFile>),
}

impl Source {
    /// The file read for these bytes (for error messages).
    pub fn path(&self) -> &Path {
        match self {
            Source::Path(p) | Source::Scanned { path: p, .. } => p,
            Source::Range { file, .. } | Source::Sparse { file, .. } => file,
            Source::Spooled { spool, .. } => spool.path(),
            Source::External { .. } => Path::new("(extra device)"),
            Source::Reserved { .. } => Path::new("(reserved)"),
            Source::Erofs(e) => &e.image.path,
            Source::Squash(f) => f.image_path(),
        }
    }

    /// Open for reading a file of `size` bytes.
    pub fn open(&self, size: u64) -> Result<Reader<'_>> {
        if let Source::External { .. } | Source::Reserved { .. } = self {
            return Err(BuildError::Options(
                "internal: data on an extra device or only reserved is not read".into(),
            ));
        }
        let f = match self {
            Source::Scanned { path, .. } => open_scanned(path),
            _ => File::open(self.path()),
        }
        .map_err(io_err(self.path(), "data: open"))?;
        if let Source::Erofs(e) = self {
            if let Some(why) = e.mapping_error() {
                return Err(io_err(self.path(), "data: read")(std::io::Error::other(
                    why,
                )));
            }
        }
        Ok(Reader { src: self, f, size })
    }
}

/// Opens a file of the source tree for reading as the scan saw it, a regular file: a
/// symbolic link put there since is an error (O_NOFOLLOW), not followed out of the
/// tree, and a FIFO is opened without waiting for a writer (O_NONBLOCK; it then fails
/// the stamp check), so a build never hangs on one. Neither flag changes reads of a
/// regular file.
pub(crate) fn open_scanned(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
}

/// mtime and ctime (seconds, nanoseconds) of a scanned file.
pub type Stamp = [i64; 4];

/// The stamp of `md`.
pub fn stamp(md: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    [md.mtime(), md.mtime_nsec(), md.ctime(), md.ctime_nsec()]
}

/// An open [`Source`].
pub struct Reader<'a> {
    src: &'a Source,
    f: File,
    size: u64,
}

impl Reader<'_> {
    pub fn path(&self) -> &Path {
        self.src.path()
    }

    /// The open file (for a second read later, without opening it again).
    pub fn into_file(self) -> File {
        self.f
    }

    /// After reading a scanned file: an error if it is not as the scan saw it (size,
    /// mtime, ctime), so a file written to during the build is reported, not stored
    /// half old, half new, nor with a size its metadata does not have. One fstat per
    /// read. Other sources are the builder's own: always Ok.
    pub fn unchanged(&self) -> Result<()> {
        let Source::Scanned { stamp: then, .. } = self.src else {
            return Ok(());
        };
        let m = self
            .f
            .metadata()
            .map_err(io_err(self.path(), "data: stat"))?;
        let what = if m.len() != self.size {
            format!(
                "changed while the build read it (size {} when scanned, now {} bytes)",
                self.size,
                m.len()
            )
        } else if stamp(&m) != *then {
            "changed while the build read it (modified since it was scanned)".into()
        } else {
            return Ok(());
        };
        Err(BuildError::Invalid {
            path: self.path().to_path_buf(),
            what,
        })
    }

    /// Fill `buf` with the file's bytes from logical offset `off` (zeros in holes).
    /// A read past what the backing file holds is `UnexpectedEof`.
    pub fn read_exact_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        match self.src {
            Source::Path(_) | Source::Scanned { .. } => self.f.read_exact_at(buf, off),
            Source::Range { at, .. } => {
                let end = off.checked_add(buf.len() as u64);
                if end.is_none_or(|e| e > self.size) {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                self.f.read_exact_at(buf, at + off)
            }
            Source::External { .. } | Source::Reserved { .. } => {
                Err(std::io::ErrorKind::Unsupported.into())
            }
            Source::Erofs(e) => e.read_exact_at(buf, off),
            Source::Squash(f) => f.read_exact_at(buf, off),
            Source::Spooled { spool, segs } => {
                let end = off
                    .checked_add(buf.len() as u64)
                    .filter(|&e| e <= self.size)
                    .ok_or(std::io::ErrorKind::UnexpectedEof)?;
                fill_segments(segs, off, end, buf, |dst, at| {
                    spool
                        .read_at(dst, at)
                        .map_err(|e| std::io::Error::other(e.to_string()))
                })
            }
            Source::Sparse { segs, .. } => {
                let end = off
                    .checked_add(buf.len() as u64)
                    .filter(|&e| e <= self.size)
                    .ok_or(std::io::ErrorKind::UnexpectedEof)?;
                fill_segments(segs, off, end, buf, |dst, at| self.f.read_exact_at(dst, at))
            }
        }
    }

    /// Append `len` bytes from logical offset `start` to `data` (fresh capacity,
    /// no zeroing first for a file of its own).
    pub fn read_into(&self, start: u64, len: usize, data: &mut Vec<u8>) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.path();
        let shrank = || BuildError::Invalid {
            path: path.to_path_buf(),
            what: "file shrank while it was being read".into(),
        };
        match self.src {
            Source::Path(_) | Source::Scanned { .. } => {
                // Always from `start`: `segments` (SEEK_HOLE) moves the file offset.
                let mut f = &self.f;
                f.seek(SeekFrom::Start(start))
                    .map_err(io_err(path, "compress: seek"))?;
                let before = data.len();
                f.take(len as u64)
                    .read_to_end(data)
                    .map_err(io_err(path, "compress: read"))?;
                if data.len() - before != len {
                    return Err(shrank());
                }
            }
            Source::Spooled { spool, segs } => {
                let end = start
                    .checked_add(len as u64)
                    .filter(|&e| e <= self.size)
                    .ok_or_else(shrank)?;
                append_segments(segs, start, end, data, |at, n, data| {
                    spool.read_into(at, n, data, &self.f)
                })?;
            }
            Source::Sparse { segs, .. } => {
                let end = start
                    .checked_add(len as u64)
                    .filter(|&e| e <= self.size)
                    .ok_or_else(shrank)?;
                let mut f = &self.f;
                append_segments(segs, start, end, data, |at, n, data| {
                    f.seek(SeekFrom::Start(at))
                        .map_err(io_err(path, "compress: seek"))?;
                    let got = f
                        .take(n)
                        .read_to_end(data)
                        .map_err(io_err(path, "compress: read"))?;
                    if got as u64 != n {
                        return Err(shrank());
                    }
                    Ok(())
                })?;
            }
            _ => {
                let before = data.len();
                data.resize(before + len, 0);
                self.read_exact_at(&mut data[before..], start)
                    .map_err(|e| match e.kind() {
                        std::io::ErrorKind::UnexpectedEof => shrank(),
                        _ => io_err(path, "compress: read")(e),
                    })?;
            }
        }
        Ok(())
    }

    /// Data segments `[start, end)` when the file has a hole, else None.
    pub fn segments(&self) -> Option<Vec<(u64, u64)>> {
        match self.src {
            Source::Path(_) | Source::Scanned { .. } => {
                crate::data::data_segments(&self.f, self.size)
            }
            Source::Range { .. } | Source::External { .. } | Source::Reserved { .. } => None,
            Source::Erofs(e) => e.segments(),
            Source::Squash(f) => f.segments(),
            Source::Sparse { segs, .. } | Source::Spooled { segs, .. } => {
                let mut v: Vec<(u64, u64)> = Vec::with_capacity(segs.len());
                for s in segs.iter().filter(|s| s.len > 0) {
                    let e = (s.start + s.len).min(self.size);
                    match v.last_mut() {
                        Some(l) if l.1 >= s.start => l.1 = l.1.max(e),
                        _ => v.push((s.start, e)),
                    }
                }
                let whole = v.len() == 1 && v[0] == (0, self.size);
                (!whole && self.size > 0).then_some(v)
            }
        }
    }
}

/// Call `each(a, b, at)` on the parts of logical range `[start, end)` that `segs` hold,
/// in order: logical bytes `[a, b)` are at byte `at` of the backing store.
fn each_segment<E>(
    segs: &[Segment],
    start: u64,
    end: u64,
    mut each: impl FnMut(u64, u64, u64) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let first = segs.partition_point(|s| s.start + s.len <= start);
    let mut pos = start;
    // Bounded by the number of segments.
    for s in &segs[first..] {
        if s.start >= end {
            break;
        }
        // `max(pos)`: a no-op while the segments do not overlap.
        let a = s.start.max(pos);
        let b = (s.start + s.len).min(end);
        if a >= b {
            continue;
        }
        each(a, b, s.at + (a - s.start))?;
        pos = b;
    }
    Ok(())
}

/// Fill `buf` with logical bytes `[off, end)` of a file made of `segs` (`read(dst, at)`
/// fills `dst` from byte `at` of the backing store); holes (before, between and after
/// the segments read) are zeroed.
fn fill_segments(
    segs: &[Segment],
    off: u64,
    end: u64,
    buf: &mut [u8],
    mut read: impl FnMut(&mut [u8], u64) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut pos = off;
    each_segment(segs, off, end, |a, b, at| {
        buf[(pos - off) as usize..(a - off) as usize].fill(0);
        read(&mut buf[(a - off) as usize..(b - off) as usize], at)?;
        pos = b;
        Ok::<_, std::io::Error>(())
    })?;
    buf[(pos - off) as usize..].fill(0);
    Ok(())
}

/// Append logical bytes `[start, end)` of a file made of `segs` to `data`, segment by
/// segment into fresh capacity (`read(at, n, data)` appends `n` bytes from byte `at` of
/// the backing store); only holes are zeroed.
fn append_segments(
    segs: &[Segment],
    start: u64,
    end: u64,
    data: &mut Vec<u8>,
    mut read: impl FnMut(u64, u64, &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    let before = data.len();
    data.reserve((end - start) as usize);
    let mut pos = start;
    each_segment(segs, start, end, |a, b, at| {
        data.resize(data.len() + (a - pos) as usize, 0);
        read(at, b - a, data)?;
        pos = b;
        Ok::<_, BuildError>(())
    })?;
    data.resize(before + (end - start) as usize, 0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scanned regular file replaced, before its data is read, by a symbolic link out
    /// of the tree or by a FIFO: the link is not followed and the FIFO does not block
    /// (the open returns at once; the read or the stamp check then fails).
    #[test]
    fn a_scanned_file_swapped_for_a_link_or_fifo() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("f");
        std::fs::write(&p, b"tree data").expect("write");
        let m = std::fs::metadata(&p).expect("stat");
        let src = Source::Scanned {
            path: p.clone(),
            stamp: stamp(&m),
        };
        // As scanned: read back.
        let r = src.open(9).expect("open");
        let mut buf = [0u8; 9];
        r.read_exact_at(&mut buf, 0).expect("read");
        assert_eq!(&buf, b"tree data");
        r.unchanged().expect("unchanged");
        drop(r);

        let victim = d.path().join("victim");
        std::fs::write(&victim, b"secret!!!").expect("write");
        std::fs::remove_file(&p).expect("rm");
        std::os::unix::fs::symlink(&victim, &p).expect("symlink");
        match src.open(9) {
            Err(BuildError::Io { path, .. }) => assert_eq!(path, p),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a link put in the tree was followed"),
        }

        std::fs::remove_file(&p).expect("rm");
        let st = std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .expect("mkfifo");
        assert!(st.success());
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = src.clone();
        std::thread::spawn(move || {
            let res = s2.open(9).map(|r| r.unchanged().is_err());
            let _ = tx.send(res.map_err(|e| e.to_string()));
        });
        match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(Ok(changed)) => assert!(changed, "a FIFO passed the stamp check"),
            Ok(Err(e)) => panic!("opening the FIFO failed: {e}"),
            Err(_) => panic!("opening a FIFO put in the tree blocked"),
        }
    }
}
