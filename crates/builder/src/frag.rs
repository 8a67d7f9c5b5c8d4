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
    /// Its xxh3-128 when the caller handed it in (workers hash what they read).
    hash: Option<u128>,
}

/// With dedupe: what is known of the fragments stored so far.
#[derive(Default)]
struct Seen {
    /// Length -> the entries of that length not hashed yet. Most lengths occur once,
    /// so a fragment is hashed only when another one has its length (then both are).
    unhashed: HashMap<u64, Vec<usize>>,
    /// (xxh3-128, length) -> hashed entries.
    hashed: HashMap<(u128, u64), Vec<usize>>,
}

/// Collects fragments.
pub struct FragStore {
    spool: tempfile::NamedTempFile,
    len: u64,
    entries: Vec<Entry>,
    /// Per handed-out fragment id: its entry (several ids share one with dedupe).
    ids: Vec<usize>,
    /// Where the fragment being written starts.
    open: Option<u64>,
    seen: Option<Seen>,
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

/// The hash fragment dedupe keys fragments by (with their length).
pub fn frag_hash(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytes)
}

/// Most bytes compared or hashed at once.
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
            seen: dedupe.then(Seen::default),
            bytes_in: 0,
            deduped: 0,
        })
    }

    fn path(&self) -> &Path {
        self.spool.path()
    }

    /// Start a fragment.
    pub fn begin(&mut self) {
        self.open = Some(self.len);
    }

    /// Append bytes to the open fragment.
    pub fn push(&mut self, bytes: &[u8]) -> Result<()> {
        if self.open.is_none() {
            return Err(BuildError::Options("internal: no open fragment".into()));
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
        self.end_hashed(None)
    }

    /// Close the open fragment, whose xxh3-128 is `hash` when known; returns its id.
    pub fn end_hashed(&mut self, hash: Option<u128>) -> Result<usize> {
        let Some(off) = self.open.take() else {
            return Err(BuildError::Options("internal: no open fragment".into()));
        };
        let len = self.len - off;
        let entry = self.entries.len();
        let mut dup = None;
        if let Some(mut seen) = self.seen.take() {
            let found = self.dedupe(&mut seen, off, len, entry, hash);
            self.seen = Some(seen);
            dup = found?;
        }
        let id = if let Some(c) = dup {
            self.len = off;
            self.deduped += len;
            c
        } else {
            self.entries.push(Entry { off, hash });
            entry
        };
        self.ids.push(id);
        Ok(self.ids.len() - 1)
    }

    /// The stored entry equal to spool range `[off, off+len)`, or None after recording
    /// the range as entry `entry`.
    fn dedupe(
        &self,
        seen: &mut Seen,
        off: u64,
        len: u64,
        entry: usize,
        hash: Option<u128>,
    ) -> Result<Option<usize>> {
        let Some(waiting) = seen.unhashed.get_mut(&len) else {
            seen.unhashed.insert(len, vec![entry]);
            return Ok(None);
        };
        for e in std::mem::take(waiting) {
            let h = match self.entries[e].hash {
                Some(h) => h,
                None => self.hash_range(self.entries[e].off, len)?,
            };
            seen.hashed.entry((h, len)).or_default().push(e);
        }
        let h = match hash {
            Some(h) => h,
            None => self.hash_range(off, len)?,
        };
        let key = (h, len);
        for &c in seen.hashed.get(&key).map_or(&[][..], Vec::as_slice) {
            if self.same(self.entries[c].off, off, len)? {
                return Ok(Some(c));
            }
        }
        seen.hashed.entry(key).or_default().push(entry);
        Ok(None)
    }

    /// Store a whole fragment.
    pub fn add(&mut self, bytes: &[u8]) -> Result<usize> {
        self.add_hashed(bytes, None)
    }

    /// Store a whole fragment whose xxh3-128 is `hash` when known.
    pub fn add_hashed(&mut self, bytes: &[u8], hash: Option<u128>) -> Result<usize> {
        self.begin();
        self.push(bytes)?;
        self.end_hashed(hash)
    }

    /// xxh3-128 of spool range `[off, off+len)`.
    fn hash_range(&self, off: u64, len: u64) -> Result<u128> {
        let f = self.spool.as_file();
        let mut h = Xxh3::new();
        let mut buf = vec![0u8; len.min(CMP_CHUNK) as usize];
        let mut done = 0u64;
        // Bounded: each pass advances `done` by at least one byte (len > done).
        while done < len {
            let n = (len - done).min(CMP_CHUNK) as usize;
            read_exact(f, self.path(), &mut buf[..n], off + done)?;
            h.update(&buf[..n]);
            done += n as u64;
        }
        Ok(h.digest128())
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

    /// A fragment store on a spool in a fresh temporary directory (kept alive by the
    /// returned guard).
    fn store(dedupe: bool) -> Result<(tempfile::TempDir, FragStore)> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("."), "tempdir"))?;
        let spool =
            tempfile::NamedTempFile::new_in(dir.path()).map_err(io_err(dir.path(), "spool"))?;
        let s = FragStore::new(spool, dedupe)?;
        Ok((dir, s))
    }

    #[test]
    fn equal_fragments_are_stored_once_with_dedupe() -> Result<()> {
        let (_dir, mut s) = store(true)?;
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
    fn fragments_of_one_length_are_hashed_when_they_meet() -> Result<()> {
        let (_dir, mut s) = store(true)?;
        // "abc" waits unhashed until "xyz" has its length; the third meets the first.
        let ids = [
            s.add(b"abc")?,
            s.add(b"xyz")?,
            s.add(b"abc")?,
            s.add(b"xyz")?,
        ];
        let ids2 = [s.add(b"q")?, s.add(b"abcd")?, s.add(b"q")?];
        assert_eq!(ids, [0, 1, 2, 3]);
        assert_eq!(ids2, [4, 5, 6]);
        assert_eq!(s.deduped, 7);
        let p = s.finish();
        assert_eq!(p.offsets, vec![0, 3, 0, 3, 6, 7, 6]);
        assert_eq!(p.size, 11);
        Ok(())
    }

    #[test]
    fn handed_in_hashes_meet_hashes_read_from_the_spool() -> Result<()> {
        let (_dir, mut s) = store(true)?;
        // Longer than one spool read, so the spool's hash is computed in chunks.
        let big: Vec<u8> = (0..(CMP_CHUNK as usize + 12_345))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let a = s.add(&big)?; // hashed from the spool when the next one comes
        let b = s.add_hashed(&big, Some(frag_hash(&big)))?;
        let mut other = big.clone();
        other[5] ^= 1;
        let c = s.add_hashed(&other, Some(frag_hash(&other)))?;
        let d = s.add(&other)?;
        assert_eq!((a, b, c, d), (0, 1, 2, 3));
        assert_eq!(s.deduped, 2 * big.len() as u64);
        let p = s.finish();
        let n = big.len() as u64;
        assert_eq!(p.offsets, vec![0, 0, n, n]);
        Ok(())
    }

    #[test]
    fn without_dedupe_equal_fragments_are_stored_twice() -> Result<()> {
        let (_dir, mut s) = store(false)?;
        s.add(b"same")?;
        s.add(b"same")?;
        let p = s.finish();
        assert_eq!((p.size, p.offsets), (8, vec![0, 4]));
        Ok(())
    }
}
