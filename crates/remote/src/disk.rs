//! The on-disk block cache (`--cache-dir`, `--cache-size`), shared between runs and
//! between processes.
//!
//! Layout: `DIR/<object key>/<block index>`, where the object key is a digest of the
//! object's URL, size, ETag and modification time: a replaced object has another key,
//! so its old blocks are never served for it (they age out). Each file is the block's
//! bytes followed by a SHA-256 of (key, index, bytes): a torn or damaged file is a miss,
//! never data. Files are written to a temporary name and renamed, so readers in other
//! processes see whole files or none.
//!
//! Size limit: the bytes under `DIR` are counted once at open and kept up to date for
//! this process's writes; past the limit the oldest files (by modification time, which a
//! hit refreshes) are removed until the cache is at 90 % of it. Metadata goes last: an
//! object's metadata blocks (the range [`DiskCache::set_meta`] wrote to
//! `DIR/<object key>/meta`: inodes, directories, indexes, which every later run needs
//! first) are removed only once no data block of any object is left.

use sha2::{Digest, Sha256};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

/// Name of the file holding an object's metadata block range ("FIRST END", END
/// exclusive).
const META_FILE: &str = "meta";

/// At most this many files are looked at by one scan (a bound on a loop over a directory
/// another process may fill).
const MAX_SCAN: usize = 1 << 20;
const TRAILER: usize = 32;

#[derive(Debug)]
pub(crate) struct DiskCache {
    root: PathBuf,
    dir: PathBuf,
    key: [u8; 32],
    limit: u64,
    used: AtomicU64,
    /// One eviction at a time in this process.
    evicting: Mutex<()>,
    seq: AtomicU64,
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl DiskCache {
    /// The cache under `root` for the object named by `identity` (URL, size, ETag, ...).
    pub(crate) fn open(root: &Path, identity: &str, limit: u64) -> io::Result<Self> {
        let key: [u8; 32] = Sha256::digest(identity.as_bytes()).into();
        let dir = root.join(hex(&key[..16]));
        fs::create_dir_all(&dir)?;
        let c = DiskCache {
            root: root.to_path_buf(),
            dir,
            key,
            limit,
            used: AtomicU64::new(0),
            evicting: Mutex::new(()),
            seq: AtomicU64::new(0),
        };
        let used = c.scan()?.iter().map(|f| f.2).sum();
        c.used.store(used, Ordering::Relaxed);
        Ok(c)
    }

    fn digest(&self, index: u64, data: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update(index.to_le_bytes());
        h.update(data);
        h.finalize().into()
    }

    /// Block `index`, when it is cached whole (`len` bytes) and intact.
    pub(crate) fn get(&self, index: u64, len: usize) -> Option<Vec<u8>> {
        let p = self.dir.join(index.to_string());
        // Only a file of ours: anything else there (a link) is not read or touched.
        if !fs::symlink_metadata(&p).ok()?.is_file() {
            return None;
        }
        let mut data = fs::read(&p).ok()?;
        if data.len() != len + TRAILER {
            let _ = fs::remove_file(&p);
            return None;
        }
        let trailer = data.split_off(len);
        if trailer[..] != self.digest(index, &data)[..] {
            let _ = fs::remove_file(&p);
            return None;
        }
        // Recently used: eviction goes by modification time.
        if let Ok(f) = fs::File::options().write(true).open(&p) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(data)
    }

    /// Store block `index` (best effort: a full disk only costs a refetch later).
    pub(crate) fn put(&self, index: u64, data: &[u8]) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".tmp-{}-{seq}-{index}", std::process::id()));
        let mut body = Vec::with_capacity(data.len() + TRAILER);
        body.extend_from_slice(data);
        body.extend_from_slice(&self.digest(index, data));
        if write_new(&tmp, &body).is_err() {
            let _ = fs::remove_file(&tmp);
            return;
        }
        if fs::rename(&tmp, self.dir.join(index.to_string())).is_err() {
            let _ = fs::remove_file(&tmp);
            return;
        }
        let used = self.used.fetch_add(body.len() as u64, Ordering::Relaxed) + body.len() as u64;
        if used > self.limit {
            self.evict();
        }
    }

    /// Blocks [first, end) of this object hold its metadata: evicted after data.
    pub(crate) fn set_meta(&self, first: u64, end: u64) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".tmp-{}-{seq}-meta", std::process::id()));
        if write_new(&tmp, format!("{first} {end}\n").as_bytes()).is_err()
            || fs::rename(&tmp, self.dir.join(META_FILE)).is_err()
        {
            let _ = fs::remove_file(&tmp);
        }
    }

    /// Every cache file under the root: (holds metadata, modification time, bytes,
    /// path). The small `meta` files themselves are not listed.
    fn scan(&self) -> io::Result<Vec<(bool, SystemTime, u64, PathBuf)>> {
        let mut out = Vec::new();
        for obj in fs::read_dir(&self.root)?.take(MAX_SCAN) {
            let Ok(obj) = obj else { continue };
            if !obj.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Ok(rd) = fs::read_dir(obj.path()) else {
                continue;
            };
            let meta = fs::read_to_string(obj.path().join(META_FILE))
                .ok()
                .and_then(|t| {
                    let mut it = t.split_whitespace().map(|x| x.parse::<u64>());
                    match (it.next(), it.next()) {
                        (Some(Ok(a)), Some(Ok(b))) => Some(a..b),
                        _ => None,
                    }
                });
            for f in rd.take(MAX_SCAN) {
                let Ok(f) = f else { continue };
                if f.file_name() == META_FILE {
                    continue;
                }
                let Ok(m) = f.metadata() else { continue };
                if m.is_file() {
                    let index = f.file_name().to_str().and_then(|n| n.parse::<u64>().ok());
                    let is_meta = matches!((&meta, index), (Some(r), Some(i)) if r.contains(&i));
                    out.push((
                        is_meta,
                        m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        m.len(),
                        f.path(),
                    ));
                }
                if out.len() >= MAX_SCAN {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// Remove the oldest files until the cache holds at most 90 % of its limit.
    fn evict(&self) {
        let Ok(_one) = self.evicting.try_lock() else {
            return;
        };
        let Ok(mut files) = self.scan() else { return };
        files.sort();
        let mut used: u64 = files.iter().map(|f| f.2).sum();
        let target = self.limit / 10 * 9;
        // Data blocks first (oldest first), then metadata blocks.
        for (_, _, len, p) in files {
            if used <= target {
                break;
            }
            if fs::remove_file(&p).is_ok() {
                used = used.saturating_sub(len);
            }
        }
        self.used.store(used, Ordering::Relaxed);
    }

    /// Bytes under the cache root, as this process counts them.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

/// Writes `data` to the new file `p`, created exclusively: a link or file already under
/// that name is an error, never written through.
fn write_new(p: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    fs::File::options()
        .write(true)
        .create_new(true)
        .open(p)?
        .write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Links planted in the cache (under the name a block is about to be written to,
    /// and under a block's own name) are neither written through nor read.
    #[test]
    fn planted_links_are_not_followed() -> io::Result<()> {
        let d = tempfile::tempdir()?;
        let victim = d.path().join("victim");
        fs::write(&victim, b"precious")?;
        let c = DiskCache::open(d.path(), "http://x/a size=10 etag=\"1\"", 10_000)?;
        let tmp = c.dir.join(format!(".tmp-{}-0-7", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp)?;
        c.put(7, b"hello");
        assert_eq!(fs::read(&victim)?, b"precious");
        assert_eq!(c.get(7, 5), None);
        // A link under a block's name, to a file holding what a block would: a miss.
        c.put(8, b"world");
        let held = fs::read(c.dir.join("8"))?;
        fs::write(&victim, &held)?;
        fs::remove_file(c.dir.join("8"))?;
        std::os::unix::fs::symlink(&victim, c.dir.join("8"))?;
        assert_eq!(c.get(8, 5), None);
        Ok(())
    }

    #[test]
    fn roundtrip_damage_and_limit() -> io::Result<()> {
        let d = tempfile::tempdir()?;
        let c = DiskCache::open(d.path(), "http://x/a size=10 etag=\"1\"", 10_000)?;
        c.put(3, b"hello");
        assert_eq!(c.get(3, 5).as_deref(), Some(&b"hello"[..]));
        // Wrong length asked: a miss, and the file is gone.
        assert_eq!(c.get(3, 4), None);
        assert_eq!(c.get(3, 5), None);
        // Damaged bytes: a miss.
        c.put(4, b"world");
        let p = c.dir.join("4");
        let mut b = fs::read(&p)?;
        b[0] ^= 1;
        fs::write(&p, b)?;
        assert_eq!(c.get(4, 5), None);
        // Another identity does not see these blocks.
        c.put(5, b"abcde");
        let other = DiskCache::open(d.path(), "http://x/a size=10 etag=\"2\"", 10_000)?;
        assert_eq!(other.get(5, 5), None);
        assert_eq!(c.get(5, 5).as_deref(), Some(&b"abcde"[..]));
        // The limit: 100 blocks of 1000 bytes in a 10 000-byte cache keep it under it.
        for i in 0..100 {
            c.put(100 + i, &[i as u8; 1000]);
        }
        assert!(c.used() <= 10_000, "{}", c.used());
        let on_disk: u64 = c.scan()?.iter().map(|f| f.2).sum();
        assert!(on_disk <= 10_000, "{on_disk}");
        // The newest block survived.
        assert_eq!(c.get(199, 1000), Some(vec![99u8; 1000]));
        Ok(())
    }

    #[test]
    fn metadata_blocks_are_evicted_after_data() -> io::Result<()> {
        let d = tempfile::tempdir()?;
        let c = DiskCache::open(d.path(), "http://x/b size=1 etag=\"1\"", 20_000)?;
        // Metadata blocks 0..4 are the oldest files in the cache.
        for i in 0..4 {
            c.put(i, &[7u8; 1000]);
        }
        c.set_meta(0, 4);
        std::thread::sleep(std::time::Duration::from_millis(20));
        // Data blocks well past the limit: eviction takes data blocks, never metadata.
        for i in 10..60 {
            c.put(i, &[i as u8; 1000]);
        }
        for i in 0..4 {
            assert_eq!(c.get(i, 1000), Some(vec![7u8; 1000]), "metadata block {i}");
        }
        assert!(
            c.get(10, 1000).is_none(),
            "the oldest data block was evicted"
        );
        let on_disk: u64 = c.scan()?.iter().map(|f| f.2).sum();
        assert!(on_disk <= 20_000, "{on_disk}");
        // Without the meta range the same files age out by time alone.
        let _ = fs::remove_file(c.dir.join(META_FILE));
        assert!(!c.scan()?.iter().any(|f| f.0));
        Ok(())
    }
}
