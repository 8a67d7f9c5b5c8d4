//! Whole-file dedupe (for stage 3, `place`, with `-E dedupe`): files with the same
//! contents are stored once. Only files whose size another file shares can be
//! duplicates, so only those are read: hashed (xxh3-128) on all cores, then each
//! candidate is compared byte for byte with the earlier file it matched. The result
//! depends on the tree alone (the earliest file of a group is the one stored). Sparse
//! files are hashed and compared by their data segments (SEEK_DATA/SEEK_HOLE) and those
//! segments' bytes, so a huge mostly-empty file costs what its data costs.

use crate::options::*;
use crate::source::{Reader, Source};
use rayon::prelude::*;
use rustc_hash::FxHashMap as HashMap;
use xxhash_rust::xxh3::Xxh3;

/// A regular file as dedupe sees it.
pub struct Candidate<'a> {
    pub src: &'a Source,
    pub size: u64,
    /// Metadata bytes before its data layout (core and xattrs): a duplicate must not
    /// need more than the file it copies, whose inline tail it takes over.
    pub meta: u64,
}

const BUF: usize = 1 << 20;

/// The byte ranges of a file that hold data: its data segments when it has holes,
/// else the whole file.
fn segments(f: &Reader, size: u64) -> Vec<(u64, u64)> {
    f.segments().unwrap_or_else(|| vec![(0, size)])
}

fn hash(p: &Source, size: u64) -> Result<u128> {
    let f = p.open(size)?;
    let segs = segments(&f, size);
    let mut h = Xxh3::new();
    // Sized to the file: most candidates are small.
    let mut buf = vec![0u8; BUF.min(usize::try_from(size).unwrap_or(BUF))];
    for &(s, e) in &segs {
        h.update(&s.to_le_bytes());
        h.update(&e.to_le_bytes());
        let mut at = s;
        // Bounded: each pass reads up to BUF bytes of the segment.
        while at < e {
            let n = (e - at).min(BUF as u64) as usize;
            if f.read_exact_at(&mut buf[..n], at).is_err() {
                // Shrank while read: not a duplicate; the data stage reports it.
                return Ok(0);
            }
            h.update(&buf[..n]);
            at += n as u64;
        }
    }
    Ok(h.digest128())
}

/// Whether two files of `size` bytes hold the same bytes (and the same holes).
fn same(a: &Source, b: &Source, size: u64) -> Result<bool> {
    let (fa, fb) = (a.open(size)?, b.open(size)?);
    let segs = segments(&fa, size);
    if segs != segments(&fb, size) {
        return Ok(false);
    }
    let n = BUF.min(usize::try_from(size).unwrap_or(BUF));
    let (mut x, mut y) = (vec![0u8; n], vec![0u8; n]);
    for &(s, e) in &segs {
        let mut at = s;
        // Bounded: each pass compares up to BUF bytes of the segment.
        while at < e {
            let n = (e - at).min(BUF as u64) as usize;
            if fa.read_exact_at(&mut x[..n], at).is_err()
                || fb.read_exact_at(&mut y[..n], at).is_err()
            {
                return Ok(false);
            }
            if x[..n] != y[..n] {
                return Ok(false);
            }
            at += n as u64;
        }
    }
    Ok(true)
}

/// Per file: `Some(j)` when it has the contents of the earlier file `j` (which is
/// itself stored), `None` when its data must be stored.
pub fn find_duplicates(files: &[Candidate], threads: usize) -> Result<Vec<Option<usize>>> {
    let mut by_size: HashMap<u64, Vec<usize>> = HashMap::default();
    for (i, f) in files.iter().enumerate() {
        if f.size > 0 {
            by_size.entry(f.size).or_default().push(i);
        }
    }
    let mut todo: Vec<usize> = by_size
        .values()
        .filter(|v| v.len() > 1)
        .flatten()
        .copied()
        .collect();
    todo.sort_unstable();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| BuildError::Options(format!("thread pool: {e}")))?;
    let hashes: Vec<u128> = pool.install(|| {
        todo.par_iter()
            .map(|&i| hash(files[i].src, files[i].size))
            .collect::<Result<_>>()
    })?;
    // Candidate pairs, in file order: each file against the earliest stored file with
    // the same size and hash that has at least as much metadata.
    let mut groups: HashMap<(u64, u128), Vec<usize>> = HashMap::default();
    let mut pairs = Vec::new();
    for (&i, &h) in todo.iter().zip(&hashes) {
        let g = groups.entry((files[i].size, h)).or_default();
        match g.iter().find(|&&j| files[j].meta >= files[i].meta) {
            Some(&j) => pairs.push((i, j)),
            None => g.push(i),
        }
    }
    let checked: Vec<bool> = pool.install(|| {
        pairs
            .par_iter()
            .map(|&(i, j)| same(files[i].src, files[j].src, files[i].size))
            .collect::<Result<_>>()
    })?;
    let mut dup_of = vec![None; files.len()];
    for (&(i, j), ok) in pairs.iter().zip(checked) {
        if ok {
            dup_of[i] = Some(j);
        }
    }
    Ok(dup_of)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_files_point_at_the_first_with_enough_metadata() -> Result<()> {
        let d = tempfile::tempdir().map_err(io_err(std::path::Path::new("."), "tempdir"))?;
        let w = |n: &str, b: &[u8]| -> Source {
            let p = d.path().join(n);
            std::fs::write(&p, b).ok();
            Source::Path(p)
        };
        let a = w("a", b"same bytes");
        let b = w("b", b"same bytes");
        let c = w("c", b"same bytez");
        let e = w("e", b"");
        let f = w("f", b"");
        let g = w("g", b"same bytes");
        let h = w("h", b"same bytes");
        let files = [
            Candidate {
                src: &a,
                size: 10,
                meta: 32,
            },
            Candidate {
                src: &b,
                size: 10,
                meta: 32,
            },
            Candidate {
                src: &c,
                size: 10,
                meta: 32,
            },
            Candidate {
                src: &e,
                size: 0,
                meta: 32,
            },
            Candidate {
                src: &f,
                size: 0,
                meta: 32,
            },
            // More metadata than `a`: stored itself, then copied by `h`.
            Candidate {
                src: &g,
                size: 10,
                meta: 64,
            },
            Candidate {
                src: &h,
                size: 10,
                meta: 40,
            },
        ];
        let dups = find_duplicates(&files, 2)?;
        assert_eq!(dups, [None, Some(0), None, None, None, None, Some(5)]);
        Ok(())
    }
}
