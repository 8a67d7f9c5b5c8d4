//! Fragments (for stage 3, `place`): file tails and whole small files collected for the
//! packed inode (`-E fragments`, `-E all-fragments`, format doc §8.9).
//!
//! The data stage hands over each fragment in inode order; its bytes go to a spool file
//! beside the output (memory stays bounded whatever the tree holds). With dedupe, a
//! fragment equal byte for byte to an earlier one (found by a 128-bit hash, then
//! compared) becomes a reference to it. At the end the fragments are laid out by
//! [`FragKey`] — files of one type together, then by path — so that similar content
//! compresses together and one directory's files of a type sit side by side; the
//! packed inode's data is written in that order to a second spool, which the data
//! stage compresses like any file. Both orders are fixed by the tree alone, so the
//! image does not depend on the thread count.

use crate::options::*;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use xxhash_rust::xxh3::Xxh3;

/// Sort key of a fragment: its file's type (extension, or the whole name when there
/// is none: `Makefile`s and `Kconfig`s group too), then its path.
pub fn frag_key(rel: &[u8]) -> Vec<u8> {
    let name = rel.rsplit(|&b| b == b'/').next().unwrap_or(rel);
    let kind = match name.iter().rposition(|&b| b == b'.') {
        Some(i) if i > 0 => &name[i + 1..],
        _ => name,
    };
    let mut k = Vec::with_capacity(kind.len() + 1 + rel.len());
    k.extend_from_slice(kind);
    k.push(0);
    k.extend_from_slice(rel);
    k
}

struct Entry {
    key: Vec<u8>,
    /// Byte range in the first spool.
    off: u64,
    len: u64,
}

/// Collects fragments.
pub struct FragStore {
    spool: tempfile::NamedTempFile,
    len: u64,
    entries: Vec<Entry>,
    /// Per handed-out fragment id: its entry (several ids share one with dedupe).
    ids: Vec<usize>,
    /// The fragment being written: key, start, running hash.
    open: Option<(Vec<u8>, u64, Xxh3)>,
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

fn spool_in(dir: &Path) -> Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(".ferofs-fragments-")
        .tempfile_in(dir)
        .map_err(io_err(dir, "fragments: create spool"))
}

impl FragStore {
    pub fn new(dir: &Path, dedupe: bool) -> Result<Self> {
        Ok(FragStore {
            spool: spool_in(dir)?,
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

    /// Start a fragment of the file at `rel`.
    pub fn begin(&mut self, rel: &[u8]) {
        self.open = Some((frag_key(rel), self.len, Xxh3::new()));
    }

    /// Append bytes to the open fragment.
    pub fn push(&mut self, bytes: &[u8]) -> Result<()> {
        let Some((_, _, h)) = self.open.as_mut() else {
            return Err(BuildError::Options("internal: no open fragment".into()));
        };
        h.update(bytes);
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
        let Some((key, off, h)) = self.open.take() else {
            return Err(BuildError::Options("internal: no open fragment".into()));
        };
        let len = self.len - off;
        let mut entry = self.entries.len();
        let mut dup = None;
        if let Some(seen) = &self.seen {
            if let Some(cands) = seen.get(&(h.digest128(), len)) {
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
            if let Some(seen) = &mut self.seen {
                seen.entry((h.digest128(), len)).or_default().push(entry);
            }
            self.entries.push(Entry { key, off, len });
        }
        self.ids.push(entry);
        Ok(self.ids.len() - 1)
    }

    /// Store a whole fragment.
    pub fn add(&mut self, rel: &[u8], bytes: &[u8]) -> Result<usize> {
        self.begin(rel);
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

    /// Lay the fragments out by key into the packed inode's data.
    pub fn finish(self, dir: &Path) -> Result<Packed> {
        let mut order: Vec<usize> = (0..self.entries.len()).collect();
        order.sort_by(|&a, &b| self.entries[a].key.cmp(&self.entries[b].key));
        let out = spool_in(dir)?;
        let mut at = vec![0u64; self.entries.len()];
        let mut pos = 0u64;
        let src = self.spool.as_file();
        let mut buf = Vec::new();
        for &e in &order {
            let Entry { off, len, .. } = self.entries[e];
            at[e] = pos;
            let mut done = 0;
            // Bounded: each pass copies at least one byte.
            while done < len {
                let n = (len - done).min(CMP_CHUNK) as usize;
                buf.resize(n, 0);
                read_exact(src, self.path(), &mut buf, off + done)?;
                out.as_file()
                    .write_all_at(&buf, pos + done)
                    .map_err(io_err(out.path(), "fragments: write packed data"))?;
                done += n as u64;
            }
            pos += len;
        }
        Ok(Packed {
            file: out,
            size: pos,
            offsets: self.ids.iter().map(|&e| at[e]).collect(),
        })
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
    fn keys_group_by_type_then_path() {
        let mut v: Vec<&[u8]> = vec![
            b"b/x.c",
            b"a/Makefile",
            b"a/y.h",
            b"a/z.c",
            b"b/Makefile",
            b".hidden",
        ];
        v.sort_by_key(|r| frag_key(r));
        let want: Vec<&[u8]> = vec![
            b".hidden",
            b"a/Makefile",
            b"b/Makefile",
            b"a/z.c",
            b"b/x.c",
            b"a/y.h",
        ];
        assert_eq!(v, want);
    }

    #[test]
    fn fragments_dedupe_and_lay_out_by_key() -> Result<()> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("."), "tempdir"))?;
        let mut s = FragStore::new(dir.path(), true)?;
        let a = s.add(b"d/one.txt", b"hello")?;
        let b = s.add(b"d/two.c", b"int x;")?;
        s.begin(b"e/three.txt");
        s.push(b"hel")?;
        s.push(b"lo")?;
        let c = s.end()?;
        let d = s.add(b"e/four.txt", b"hellO")?;
        assert_eq!((a, b, c, d), (0, 1, 2, 3));
        assert_eq!(s.deduped, 5);
        assert_eq!(s.bytes_in, 21);
        let p = s.finish(dir.path())?;
        // "c" entries first (two.c), then txt: d/one.txt, e/four.txt; three = one.
        assert_eq!(p.offsets, vec![6, 0, 6, 11]);
        assert_eq!(p.size, 16);
        let bytes = std::fs::read(p.file.path()).map_err(io_err(p.file.path(), "read"))?;
        assert_eq!(bytes, b"int x;hellohellO");
        Ok(())
    }

    #[test]
    fn without_dedupe_equal_fragments_are_stored_twice() -> Result<()> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("."), "tempdir"))?;
        let mut s = FragStore::new(dir.path(), false)?;
        s.add(b"a", b"same")?;
        s.add(b"b", b"same")?;
        let p = s.finish(dir.path())?;
        assert_eq!((p.size, p.offsets), (8, vec![0, 4]));
        Ok(())
    }
}
