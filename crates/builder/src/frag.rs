//! Fragments (for stage 3, `place`): file tails and whole small files collected for the
//! packed inode (`-E fragments`, `-E all-fragments`, format doc §8.9).
//!
//! The data stage hands over each fragment in inode order; its bytes go to a spool file
//! beside the output (memory stays bounded whatever the tree holds), which becomes the
//! packed inode's data and is compressed like any file. With dedupe, a fragment equal
//! byte for byte to an earlier one (found by a 128-bit hash, then compared) becomes a
//! reference to it.
//!
//! Inode order keeps the files of one directory together, then its subdirectories'
//! (format doc §10): similar content sits side by side and a directory's small files
//! share pclusters. Measured on linux/fs (2,078 files, 128 KiB pclusters), it packs
//! better than grouping by file type first (+0.4 % with zstd and lz4hc), by path
//! (+0.2 %) or by directory then type (+0.3 %). The order is fixed by the tree alone,
//! so the image does not depend on the thread count.

use crate::options::*;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use xxhash_rust::xxh3::Xxh3;

struct Entry {
    /// Where the fragment starts in the spool.
    off: u64,
}

/// Collects fragments.
pub struct FragStore {
    spool: tempfile::NamedTempFile,
    len: u64,
    entries: Vec<Entry>,
    /// Per handed-out fragment id: its entry (several ids share one with dedupe).
    ids: Vec<usize>,
    /// The fragment being written: start, running hash (with dedupe).
    open: Option<(u64, Option<Xxh3>)>,
    /// With dedupe: (hash, length) -> entries with that hash.
    seen: Option<HashMap<(u128, u64), Vec<usize>>>,
    /// Fragment bytes handed in (duplicates counted each time).
    pub bytes_in: u64,
    /// Bytes not stored again thanks to dedupe.
    pub deduped: u64,
}

/// The packed inode's data, laid out.
pub struct Packed {
    pub file: tempfile::NamedTempFile,
    pub size: u64,
    /// Per fragment id: its offset in the packed inode's data.
    pub offsets: Vec<u64>,
}

/// Most bytes compared at once when checking a dedupe match.
const CMP_CHUNK: u64 = 1 << 20;

impl FragStore {
    /// Collect into `spool` (an empty scratch file).
    pub fn new(spool: tempfile::NamedTempFile, dedupe: bool) -> Result<Self> {
        Ok(FragStore {
            spool,
            len: 0,
            entries: Vec::new(),
            ids: Vec::new(),
            open: None,
            seen: dedupe.then(HashMap::new),
            bytes_in: 0,
            deduped: 0,
        })
    }

    fn path(&self) -> &Path {
        self.spool.path()
    }

    /// Start a fragment.
    pub fn begin(&mut self) {
        self.open = Some((self.len, self.seen.is_some().then(Xxh3::new)));
    }

    /// Append bytes to the open fragment.
    pub fn push(&mut self, bytes: &[u8]) -> Result<()> {
        let Some((_, h)) = self.open.as_mut() else {
            return Err(BuildError::Options("internal: no open fragment".into()));
        };
        if let Some(h) = h {
            h.update(bytes);
        }
        self.spool
            .as_file()
            .write_all_at(bytes, self.len)
            .map_err(io_err(self.spool.path(), "fragments: write spool"))?;
        self.len += bytes.len() as u64;
        self.bytes_in += bytes.len() as u64;
        Ok(())
    }

    /// Close the open fragment; returns its id.
    pub fn end(&mut self) -> Result<usize> {
        let Some((off, h)) = self.open.take() else {
            return Err(BuildError::Options("internal: no open fragment".into()));
        };
        let len = self.len - off;
        let mut entry = self.entries.len();
        let mut dup = None;
        let key = h.map(|h| (h.digest128(), len));
        if let (Some(seen), Some(key)) = (&self.seen, key) {
            if let Some(cands) = seen.get(&key) {
                for &c in cands {
                    if self.same(self.entries[c].off, off, len)? {
                        dup = Some(c);
                        break;
                    }
                }
            }
        }
        if let Some(c) = dup {
            entry = c;
            self.len = off;
            self.deduped += len;
        } else {
            if let (Some(seen), Some(key)) = (&mut self.seen, key) {
                seen.entry(key).or_default().push(entry);
            }
            self.entries.push(Entry { off });
        }
        self.ids.push(entry);
        Ok(self.ids.len() - 1)
    }

    /// Store a whole fragment.
    pub fn add(&mut self, bytes: &[u8]) -> Result<usize> {
        self.begin();
        self.push(bytes)?;
        self.end()
    }

    /// Whether spool ranges `[a, a+len)` and `[b, b+len)` hold the same bytes.
    fn same(&self, a: u64, b: u64, len: u64) -> Result<bool> {
        let f = self.spool.as_file();
        let mut x = vec![0u8; len.min(CMP_CHUNK) as usize];
        let mut y = x.clone();
        let mut done = 0u64;
        // Bounded: each pass advances `done` by at least one byte (len > done).
        while done < len {
            let n = (len - done).min(CMP_CHUNK) as usize;
            read_exact(f, self.path(), &mut x[..n], a + done)?;
            read_exact(f, self.path(), &mut y[..n], b + done)?;
            if x[..n] != y[..n] {
                return Ok(false);
            }
            done += n as u64;
        }
        Ok(true)
    }

    /// Whether any fragment was stored.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The packed inode's data: the spool itself.
    pub fn finish(self) -> Packed {
        Packed {
            size: self.len,
            offsets: self.ids.iter().map(|&e| self.entries[e].off).collect(),
            file: self.spool,
        }
    }
}

fn read_exact(f: &File, path: &Path, buf: &mut [u8], off: u64) -> Result<()> {
    f.read_exact_at(buf, off)
        .map_err(io_err(path, "fragments: read spool"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_fragments_are_stored_once_with_dedupe() -> Result<()> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("."), "tempdir"))?;
        let spool =
            tempfile::NamedTempFile::new_in(dir.path()).map_err(io_err(dir.path(), "spool"))?;
        let mut s = FragStore::new(spool, true)?;
        let a = s.add(b"hello")?;
        let b = s.add(b"int x;")?;
        s.begin();
        s.push(b"hel")?;
        s.push(b"lo")?;
        let c = s.end()?;
        let d = s.add(b"hellO")?;
        assert_eq!((a, b, c, d), (0, 1, 2, 3));
        assert_eq!(s.deduped, 5);
        assert_eq!(s.bytes_in, 21);
        let p = s.finish();
        assert_eq!(p.offsets, vec![0, 5, 0, 11]);
        assert_eq!(p.size, 16);
        let bytes = std::fs::read(p.file.path()).map_err(io_err(p.file.path(), "read"))?;
        assert_eq!(bytes, b"helloint x;hellO");
        Ok(())
    }

    #[test]
    fn without_dedupe_equal_fragments_are_stored_twice() -> Result<()> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("."), "tempdir"))?;
        let spool =
            tempfile::NamedTempFile::new_in(dir.path()).map_err(io_err(dir.path(), "spool"))?;
        let mut s = FragStore::new(spool, false)?;
        s.add(b"same")?;
        s.add(b"same")?;
        let p = s.finish();
        assert_eq!((p.size, p.offsets), (8, vec![0, 4]));
        Ok(())
    }
}
