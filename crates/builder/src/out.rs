//! The output file: a temporary file beside the target, positioned writes, a running
//! content hash (for the derived UUID), and rename-on-success.

use crate::options::*;
pub(crate) use crate::outfile::dir_of;
use crate::outfile::{follow_links, Target};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3;

pub struct Out {
    file: File,
    /// The temporary file (for a block device: the device).
    tmp: PathBuf,
    target: PathBuf,
    hasher: Xxh3,
    done: bool,
    /// Where the image starts in the file (`--offset`); every offset below is the
    /// image's own.
    base: u64,
    /// Writing straight into a block device of this many bytes: no temporary file and
    /// no rename.
    device: Option<u64>,
    /// Inline tail bytes kept in memory so far, and the scratch file the rest go to
    /// (with its length).
    tails_in_memory: u64,
    tail_spool: Option<(Arc<tempfile::NamedTempFile>, u64)>,
    /// Inline tail bytes kept in memory before the rest go to a scratch file.
    tail_budget: u64,
    /// Appending to an existing image in place, which was this many bytes long: a
    /// build that fails cuts it back to that.
    appending: Option<u64>,
}

/// How big the superblock's block is at most: zeroed first on a device.
const SB_BLOCK: usize = 4096;

impl Out {
    /// The output `target`, the image starting `base` bytes into it. A symbolic link
    /// is followed (the image goes where it points). A regular file (or a new name) is
    /// built in a temporary file beside it and renamed over it at the end; a block
    /// device is written in place, opened exclusively (not while it is mounted), its
    /// superblock zeroed first so a build that fails leaves no image that looks valid.
    /// Anything else is an error.
    pub fn create(target: &Path, base: u64) -> Result<Self> {
        use std::os::unix::fs::FileTypeExt;
        let target = match crate::outfile::resolve(target)? {
            Target::Node(p, ft) if ft.is_block_device() => return Self::device(&p, base),
            Target::Node(path, _) => {
                return Err(BuildError::Invalid {
                    path,
                    what: "the output must be a regular file or a block device".into(),
                })
            }
            Target::File(p) => p,
        };
        let (file, tmp) = crate::outfile::temp_beside(&target)?;
        crate::cleanup::track(&tmp);
        Ok(Out {
            file,
            tmp,
            target,
            hasher: Xxh3::new(),
            done: false,
            base,
            device: None,
            tails_in_memory: 0,
            tail_spool: None,
            tail_budget: u64::MAX,
            appending: None,
        })
    }

    /// The existing image file `target`, written in place from its end on (an
    /// in-place append): no temporary file and no rename; a build that fails (this
    /// dropped unfinished) cuts the file back to its old length.
    pub fn append(target: &Path) -> Result<Self> {
        let target = follow_links(target)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&target)
            .map_err(io_err(&target, "open image to append to"))?;
        let md = file
            .metadata()
            .map_err(io_err(&target, "open image to append to"))?;
        if !md.file_type().is_file() {
            return Err(BuildError::Invalid {
                path: target,
                what: "appending in place takes a regular file".into(),
            });
        }
        Ok(Out {
            file,
            tmp: target.clone(),
            target,
            hasher: Xxh3::new(),
            done: false,
            base: 0,
            device: None,
            tails_in_memory: 0,
            tail_spool: None,
            tail_budget: u64::MAX,
            appending: Some(md.len()),
        })
    }

    fn device(path: &Path, base: u64) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            // On a block device: fails (EBUSY) while it is mounted or held.
            .custom_flags(rustix::fs::OFlags::EXCL.bits() as i32)
            .open(path)
            .map_err(io_err(path, "open output device"))?;
        let size = ferofs_reader::source::file_len(&file)
            .map_err(io_err(path, "size of output device"))?;
        let out = Out {
            file,
            tmp: path.to_path_buf(),
            target: path.to_path_buf(),
            hasher: Xxh3::new(),
            done: false,
            base,
            device: Some(size),
            tails_in_memory: 0,
            tail_spool: None,
            tail_budget: u64::MAX,
            appending: None,
        };
        out.fits(0, SB_BLOCK as u64)?;
        out.file
            .write_all_at(&[0u8; SB_BLOCK], base)
            .map_err(io_err(path, "write output"))?;
        Ok(out)
    }

    /// On a device: whether `len` bytes at image offset `off` fit it.
    fn fits(&self, off: u64, len: u64) -> Result<()> {
        let Some(size) = self.device else {
            return Ok(());
        };
        let end = self.base.checked_add(off).and_then(|e| e.checked_add(len));
        if end.is_some_and(|e| e <= size) {
            return Ok(());
        }
        Err(BuildError::TooLarge(format!(
            "{}: the image does not fit the device ({size} bytes{})",
            self.target.display(),
            match self.base {
                0 => String::new(),
                b => format!(", from byte {b}"),
            }
        )))
    }

    /// Write `data` at byte `off`; hashed in call order (which is deterministic).
    pub fn write_at(&mut self, off: u64, data: &[u8]) -> Result<()> {
        self.run_start(off);
        self.run_piece(off, data)
    }

    /// Where image offset `off` lies in the file.
    fn in_file(&self, off: u64) -> Result<u64> {
        self.base
            .checked_add(off)
            .ok_or_else(|| BuildError::TooLarge("output offset".into()))
    }

    /// Write `data` at byte `off` in pieces: `start(off)` once, then `piece(bytes)`
    /// for consecutive bytes. Hashed exactly as one `write_at(off, whole)` would be
    /// (the hash is streamed), so the derived UUID does not depend on the pieces.
    pub fn run_start(&mut self, off: u64) {
        self.hasher.update(&off.to_le_bytes());
    }

    /// The next piece of a run begun with [`Out::run_start`], at byte `at`.
    pub fn run_piece(&mut self, at: u64, data: &[u8]) -> Result<()> {
        self.fits(at, data.len() as u64)?;
        self.hasher.update(data);
        let pos = self.in_file(at)?;
        self.file
            .write_all_at(data, pos)
            .map_err(io_err(&self.tmp, "write output"))
    }

    /// Blocks `from..to` (of `1 << bits` bytes) are left unused (a `--dsunit` gap):
    /// zeros on a device, which holds old data there; a hole in a file already. Not
    /// hashed: the image's UUID does not depend on where it is written.
    pub fn clear_blocks(&mut self, from: u64, to: u64, bits: u8) -> Result<()> {
        if self.device.is_none() || to <= from {
            return Ok(());
        }
        let (start, end) = (from << bits, to << bits);
        self.fits(start, end - start)?;
        let zeros = vec![0u8; (end - start).min(1 << 20) as usize];
        let mut at = start;
        // Bounded: each pass writes up to 1 MiB and moves towards `end`.
        while at < end {
            let n = (end - at).min(zeros.len() as u64) as usize;
            let pos = self.in_file(at)?;
            self.file
                .write_all_at(&zeros[..n], pos)
                .map_err(io_err(&self.tmp, "write output"))?;
            at += n as u64;
        }
        Ok(())
    }

    /// Inline tails beyond `bytes` go to a scratch file (default: none do).
    pub fn set_tail_budget(&mut self, bytes: u64) {
        self.tail_budget = bytes;
    }

    /// Keep `bytes`, an inline tail, until the metadata is written: in memory up to the
    /// budget, then in a scratch file beside the output.
    pub fn keep_tail(&mut self, bytes: Vec<u8>) -> Result<crate::layout::Tail> {
        let len = bytes.len() as u64;
        if self.tails_in_memory + len <= self.tail_budget {
            self.tails_in_memory += len;
            return Ok(crate::layout::Tail::mem(bytes));
        }
        if self.tail_spool.is_none() {
            self.tail_spool = Some((Arc::new(self.spool("tails")?), 0));
        }
        let Some((file, end)) = self.tail_spool.as_mut() else {
            return Err(BuildError::Options("internal: no tail spool".into()));
        };
        file.as_file()
            .write_all_at(&bytes, *end)
            .map_err(io_err(file.path(), "write inline tails"))?;
        let len32 = u32::try_from(len)
            .map_err(|_| BuildError::Options("internal: inline tail over 4 GiB".into()))?;
        let t = crate::layout::Tail::spooled(file.clone(), *end, len32);
        *end += len;
        Ok(t)
    }

    /// 128-bit hash of everything written so far (xxh3: fast, not cryptographic —
    /// it only seeds the derived UUID).
    pub fn content_hash(&self) -> [u8; 16] {
        self.hasher.digest128().to_le_bytes()
    }

    /// Read back `buf.len()` bytes written at `off`.
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let at = self.in_file(off)?;
        self.file
            .read_exact_at(buf, at)
            .map_err(io_err(&self.tmp, "read output"))
    }

    /// A scratch file beside the output (same filesystem), removed when dropped.
    pub fn spool(&self, what: &str) -> Result<tempfile::NamedTempFile> {
        let dir = match self.device {
            // Not beside a device node.
            Some(_) => std::env::temp_dir(),
            None => dir_of(&self.tmp).to_path_buf(),
        };
        crate::cleanup::scratch(&dir, &format!(".ferofs-{what}-"))
            .map_err(io_err(&dir, "create scratch file"))
    }

    /// The temporary file itself (the verity tree is hashed from it and written to it;
    /// only with the image at its start).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Where the image starts in the file.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The temporary file's path, for error messages.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// The image is `len` bytes long (a device keeps its size).
    pub fn set_len(&mut self, len: u64) -> Result<()> {
        if self.device.is_some() {
            return self.fits(0, len);
        }
        let end = self.in_file(len)?;
        self.file
            .set_len(end)
            .map_err(io_err(&self.tmp, "size output"))
    }

    /// Move the finished image to the target name. With `durable`: fsync, then rename
    /// over the target (atomic replace; a crash cannot leave a partly written image
    /// under the final name). Without: an old target is unlinked first, then the rename
    /// — as fast as writing in place, because ext4 flushes a file's data when it is
    /// renamed over an existing one (seconds for a large image); like mkfs.erofs, the
    /// page cache then writes the image back whenever it likes.
    pub fn finish(mut self, durable: bool) -> Result<()> {
        if self.appending.is_some() {
            if durable {
                self.file
                    .sync_all()
                    .map_err(io_err(&self.tmp, "sync output"))?;
            }
            self.done = true;
            return Ok(());
        }
        if self.device.is_some() {
            // A device is always flushed: nothing else would tell of a failed write.
            self.file
                .sync_all()
                .map_err(io_err(&self.tmp, "sync output"))?;
            self.done = true;
            return Ok(());
        }
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
        if let (false, Some(len)) = (self.done, self.appending) {
            // The image as it was: nothing in its old bytes was written yet.
            let _ = self.file.set_len(len);
            return;
        }
        if !self.done && self.device.is_none() {
            let _ = std::fs::remove_file(&self.tmp);
            crate::cleanup::untrack(&self.tmp);
        }
    }
}
