//! Where a file the user names as an output goes, one rule for every writer of one
//! (the image, `--block-map`, `export --tar`, `--vmdk-desc`):
//!
//! - a symbolic link is followed, so the link stays and what it points at is written
//!   (a dangling link's target is created);
//! - an existing FIFO or device is written in place: renaming a finished file over it
//!   would replace the node (`export --tar /dev/null` once replaced the machine's
//!   /dev/null with a regular file);
//! - a regular file or a new name is written to a temporary file beside it and renamed
//!   onto it once complete, so a failed write leaves the old file, or none;
//! - a directory is an error.

use crate::options::{io_err, BuildError, Result};
use std::fs::FileType;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What an output name resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A regular file or a name that does not exist yet (after following links):
    /// written beside itself and renamed onto it.
    File(PathBuf),
    /// An existing node that is not a regular file (FIFO, character or block device,
    /// socket): opened and written in place, never replaced.
    Node(PathBuf, FileType),
}

impl Target {
    /// The path written (a link's final target).
    pub fn path(&self) -> &Path {
        match self {
            Target::File(p) | Target::Node(p, _) => p,
        }
    }
}

/// Resolves the output name `path` (at most 40 links, as the kernel's limit).
pub fn resolve(path: &Path) -> Result<Target> {
    use std::os::unix::fs::FileTypeExt;
    let p = follow_links(path)?;
    match std::fs::metadata(&p) {
        Ok(m) if m.is_dir() => Err(BuildError::Invalid {
            path: p,
            what: "is a directory".into(),
        }),
        Ok(m) if m.is_file() => Ok(Target::File(p)),
        Ok(m) if m.file_type().is_socket() => Err(BuildError::Invalid {
            path: p,
            what: "is a socket".into(),
        }),
        Ok(m) => Ok(Target::Node(p, m.file_type())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Target::File(p)),
        Err(e) => Err(io_err(&p, "stat output")(e)),
    }
}

/// Writes `data` to the output `path` by the rules above (`fsync`: flush a file before
/// it is renamed into place). A new file gets the usual mode (0666 less the umask).
pub fn write_all(path: &Path, data: &[u8], fsync: bool) -> Result<()> {
    match resolve(path)? {
        Target::Node(p, _) => std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|mut f| f.write_all(data))
            .map_err(io_err(&p, "write output")),
        Target::File(p) => {
            let (mut f, tmp) = temp_beside(&p)?;
            crate::cleanup::track(&tmp);
            let done = f
                .write_all(data)
                .map_err(io_err(&p, "write output"))
                .and_then(|()| match fsync {
                    true => f.sync_all().map_err(io_err(&p, "sync output")),
                    false => Ok(()),
                })
                .and_then(|()| std::fs::rename(&tmp, &p).map_err(io_err(&p, "rename output")));
            if done.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            crate::cleanup::untrack(&tmp);
            done
        }
    }
}

/// A new temporary file beside `target` (the path a [`Target::File`] resolved to), to
/// be renamed onto it once written: a random name (`.NAME.ferofs-tmp-XXXXXX`) created
/// exclusively (O_EXCL), so a link planted under a name we would pick is never written
/// through — a name from the process id was: in a shared directory such as /tmp, a
/// build as root truncated the link's target and renamed the link onto the output.
/// Mode 0666 less the umask, as `File::create` gives.
pub fn temp_beside(target: &Path) -> Result<(std::fs::File, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let dir = dir_of(target);
    let mut name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    // A name may be up to 255 bytes; the prefix, the dot and the suffix need 20 of
    // them, so a long output name is shortened here (it is only a hint).
    if name.len() > 200 {
        let cut = (0..=200)
            .rev()
            .find(|&i| name.is_char_boundary(i))
            .unwrap_or(0);
        name.truncate(cut);
    }
    let t = tempfile::Builder::new()
        .prefix(&format!(".{name}.ferofs-tmp-"))
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(io_err(dir, "create temporary output"))?;
    t.keep()
        .map_err(|e| io_err(dir, "create temporary output")(e.error))
}

/// The path `target`'s chain of symbolic links ends at (itself when it is none).
pub(crate) fn follow_links(target: &Path) -> Result<PathBuf> {
    let mut p = target.to_path_buf();
    // Bounded: 40 links, as the kernel's limit.
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let l = std::fs::read_link(&p).map_err(io_err(&p, "read output link"))?;
                p = if l.is_absolute() {
                    l
                } else {
                    dir_of(&p).join(l)
                };
            }
            _ => return Ok(p),
        }
    }
    Err(BuildError::Invalid {
        path: target.to_path_buf(),
        what: "too many levels of symbolic links".into(),
    })
}

/// The directory `path` is in (`.` for a bare name): where its scratch files go.
pub(crate) fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    fn mkfifo(p: &Path) {
        let st = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .expect("run mkfifo");
        assert!(st.success());
    }

    #[test]
    fn links_are_followed_and_nodes_kept() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path();
        // A new name, a regular file, a link to one, a dangling link, a chain.
        assert_eq!(
            resolve(&p.join("new")).expect("new"),
            Target::File(p.join("new"))
        );
        std::fs::write(p.join("f"), b"old").expect("write");
        std::os::unix::fs::symlink("f", p.join("l")).expect("link");
        assert_eq!(
            resolve(&p.join("l")).expect("link"),
            Target::File(p.join("f"))
        );
        std::os::unix::fs::symlink("gone", p.join("dangling")).expect("link");
        assert_eq!(
            resolve(&p.join("dangling")).expect("dangling"),
            Target::File(p.join("gone"))
        );
        std::os::unix::fs::symlink("l", p.join("l2")).expect("link");
        assert_eq!(
            resolve(&p.join("l2")).expect("chain"),
            Target::File(p.join("f"))
        );
        // A loop is an error, not a hang.
        std::os::unix::fs::symlink("loop", p.join("loop")).expect("link");
        assert!(matches!(
            resolve(&p.join("loop")),
            Err(BuildError::Invalid { what, .. }) if what.contains("too many levels")
        ));
        // A directory is an error, directly or through a link.
        std::fs::create_dir(p.join("dir")).expect("mkdir");
        std::os::unix::fs::symlink("dir", p.join("dl")).expect("link");
        for n in ["dir", "dl"] {
            assert!(matches!(
                resolve(&p.join(n)),
                Err(BuildError::Invalid { path, what }) if path == p.join("dir") && what == "is a directory"
            ));
        }
        // A FIFO and a character device are nodes, through links too.
        mkfifo(&p.join("fifo"));
        std::os::unix::fs::symlink("fifo", p.join("fl")).expect("link");
        match resolve(&p.join("fl")).expect("fifo") {
            Target::Node(at, ft) => {
                assert_eq!(at, p.join("fifo"));
                assert!(ft.is_fifo());
            }
            t => panic!("{t:?}"),
        }
        match resolve(Path::new("/dev/null")).expect("/dev/null") {
            Target::Node(at, ft) => {
                assert_eq!(at, Path::new("/dev/null"));
                assert!(ft.is_char_device());
            }
            t => panic!("{t:?}"),
        }
    }

    /// An output name of 255 bytes (the longest a name may be) still gets a temporary
    /// file beside it: its part of the temporary name is shortened.
    #[test]
    fn the_longest_names_get_a_temporary_file() {
        let d = tempfile::tempdir().expect("tempdir");
        for name in ["a".repeat(255), "é".repeat(127)] {
            let p = d.path().join(&name);
            write_all(&p, b"long", false).expect("write a long name");
            assert_eq!(std::fs::read(&p).expect("read"), b"long");
            std::fs::remove_file(&p).expect("rm");
        }
        assert_eq!(std::fs::read_dir(d.path()).expect("list").count(), 0);
    }

    #[test]
    fn write_all_replaces_files_and_writes_into_nodes() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path();
        // Through a link: the link stays, its target gets the bytes, the usual mode.
        std::fs::write(p.join("f"), b"old contents").expect("write");
        std::os::unix::fs::symlink("f", p.join("l")).expect("link");
        write_all(&p.join("l"), b"new", false).expect("write through link");
        assert!(std::fs::symlink_metadata(p.join("l"))
            .expect("stat")
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(p.join("f")).expect("read"), b"new");
        // A new output gets the mode `File::create` gives (0666 less the umask).
        write_all(&p.join("fresh"), b"x", true).expect("write new");
        std::fs::File::create(p.join("plain")).expect("create");
        let mode = |n: &str| {
            std::fs::metadata(p.join(n))
                .expect("stat")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("fresh"), mode("plain"));
        std::fs::remove_file(p.join("plain")).expect("rm");
        // Into a FIFO: it stays a FIFO and its reader gets the bytes.
        mkfifo(&p.join("fifo"));
        let fifo = p.join("fifo");
        let reader = std::thread::spawn(move || std::fs::read(fifo).expect("read fifo"));
        write_all(&p.join("fifo"), b"through the pipe", false).expect("write fifo");
        assert_eq!(reader.join().expect("reader"), b"through the pipe");
        assert!(std::fs::metadata(p.join("fifo"))
            .expect("stat")
            .file_type()
            .is_fifo());
        // No temporary file is left beside any of them.
        let mut names: Vec<String> = std::fs::read_dir(p)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["f", "fifo", "fresh", "l"]);
        // A directory: an error, and nothing written.
        std::fs::create_dir(p.join("dir")).expect("mkdir");
        assert!(write_all(&p.join("dir"), b"x", false).is_err());
        assert_eq!(std::fs::read_dir(p.join("dir")).expect("list").count(), 0);
    }
}
