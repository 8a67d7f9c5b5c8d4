//! The files a build creates beside its output (the temporary image, spools), listed so
//! that a signal can remove them: a build stopped by SIGINT or SIGTERM leaves neither an
//! output that looks valid nor scratch files behind. The command line installs the
//! handler ([`remove_all`] then exit); a library user may do the same.
//!
//! Every such file also removes itself when the build ends normally or fails (drop
//! guards); a path stays listed only while its file may exist.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

static TRACKED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn list() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    // A panic while the lock was held leaves a usable list of paths.
    TRACKED.lock().unwrap_or_else(|e| e.into_inner())
}

/// List `path` as a scratch file of a running build.
pub fn track(path: &Path) {
    list().push(path.to_path_buf());
}

/// `path` is gone or is the finished output: no longer remove it on a signal.
pub fn untrack(path: &Path) {
    let mut l = list();
    if let Some(i) = l.iter().rposition(|p| p == path) {
        l.swap_remove(i);
    }
}

/// Remove every listed file (for a signal handler, before exiting); returns how many
/// were removed.
pub fn remove_all() -> usize {
    let mut l = list();
    let n = l
        .drain(..)
        .filter(|p| std::fs::remove_file(p).is_ok())
        .count();
    n
}

/// A scratch file made by `tempfile` beside the output, listed while it lives.
pub(crate) fn scratch(dir: &Path, prefix: &str) -> std::io::Result<tempfile::NamedTempFile> {
    let t = tempfile::Builder::new().prefix(prefix).tempfile_in(dir)?;
    track(t.path());
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_files_are_removed_and_untracked_ones_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, b"a").expect("write");
        std::fs::write(&b, b"b").expect("write");
        track(&a);
        track(&b);
        untrack(&b);
        assert!(remove_all() >= 1);
        assert!(!a.exists());
        assert!(b.exists());
        assert_eq!(remove_all(), 0);
    }
}
