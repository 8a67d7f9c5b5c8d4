//! The output file: a temporary file beside the target, positioned writes, a running
//! content hash (for the derived UUID), and rename-on-success.

use crate::options::*;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

pub struct Out {
    file: File,
    tmp: PathBuf,
    target: PathBuf,
    hasher: Xxh3,
    done: bool,
}

impl Out {
    pub fn create(target: &Path) -> Result<Self> {
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "image".into());
        let tmp = dir.join(format!(".{name}.ferofs-tmp-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_err(&tmp, "create output"))?;
        crate::cleanup::track(&tmp);
        Ok(Out {
            file,
            tmp,
            target: target.to_path_buf(),
            hasher: Xxh3::new(),
            done: false,
        })
    }

    /// Write `data` at byte `off`; hashed in call order (which is deterministic).
    pub fn write_at(&mut self, off: u64, data: &[u8]) -> Result<()> {
        self.hasher.update(&off.to_le_bytes());
        self.hasher.update(data);
        self.file
            .write_all_at(data, off)
            .map_err(io_err(&self.tmp, "write output"))
    }

    /// 128-bit hash of everything written so far (xxh3: fast, not cryptographic —
    /// it only seeds the derived UUID).
    pub fn content_hash(&self) -> [u8; 16] {
        self.hasher.digest128().to_le_bytes()
    }

    /// Read back `buf.len()` bytes written at `off`.
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(buf, off)
            .map_err(io_err(&self.tmp, "read output"))
    }

    /// A scratch file beside the output (same filesystem), removed when dropped.
    pub fn spool(&self, what: &str) -> Result<tempfile::NamedTempFile> {
        let dir = dir_of(&self.tmp).to_path_buf();
        crate::cleanup::scratch(&dir, &format!(".ferofs-{what}-"))
            .map_err(io_err(&dir, "create scratch file"))
    }

    /// The temporary file itself (the verity tree is hashed from it and written to it).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The temporary file's path, for error messages.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    pub fn set_len(&mut self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .map_err(io_err(&self.tmp, "size output"))
    }

    /// Move the finished image to the target name. With `durable`: fsync, then rename
    /// over the target (atomic replace; a crash cannot leave a partly written image
    /// under the final name). Without: an old target is unlinked first, then the rename
    /// — as fast as writing in place, because ext4 flushes a file's data when it is
    /// renamed over an existing one (seconds for a large image); like mkfs.erofs, the
    /// page cache then writes the image back whenever it likes.
    pub fn finish(mut self, durable: bool) -> Result<()> {
        if durable {
            self.file
                .sync_all()
                .map_err(io_err(&self.tmp, "sync output"))?;
        } else if std::fs::symlink_metadata(&self.target).is_ok_and(|m| m.file_type().is_file()) {
            // A failure here only costs the flush; the rename below reports real errors.
            let _ = std::fs::remove_file(&self.target);
        }
        std::fs::rename(&self.tmp, &self.target).map_err(io_err(&self.target, "rename output"))?;
        crate::cleanup::untrack(&self.tmp);
        self.done = true;
        Ok(())
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
            crate::cleanup::untrack(&self.tmp);
        }
    }
}

/// The directory `path` is in (`.` for a bare name): where its scratch files go.
pub(crate) fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}
