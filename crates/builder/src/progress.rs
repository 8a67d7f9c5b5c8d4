//! Progress of a build, shared with whoever shows it (the CLI's progress bar reads it
//! from another thread while the builder runs).

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of regular-file data: the total (known once the tree is scanned) and how many
/// are done. Both only grow; `done` reaches `total` when all file data is stored.
#[derive(Debug, Default)]
pub struct Progress {
    total: AtomicU64,
    done: AtomicU64,
    /// Input bytes read while scanning a stream (tar input: the uncompressed tar).
    scanned: AtomicU64,
}

impl Progress {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes of file data to store, 0 until the scan is over.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Bytes of file data stored (or compressed) so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Bytes of the input stream scanned so far (tar input), before the total is known.
    pub fn scanned(&self) -> u64 {
        self.scanned.load(Ordering::Relaxed)
    }

    pub(crate) fn add_scanned(&self, bytes: u64) {
        self.scanned.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn set_total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn add_done(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }

    /// All file data is stored (files stored without compressing them count here).
    pub(crate) fn finish(&self) {
        self.done.fetch_max(self.total(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_up_to_the_total() {
        let p = Progress::new();
        assert_eq!((p.total(), p.done()), (0, 0));
        p.set_total(100);
        p.add_done(30);
        p.add_done(12);
        assert_eq!((p.total(), p.done()), (100, 42));
        p.finish();
        assert_eq!(p.done(), 100);
    }
}
