//! Compressed data (like the kernel's zdata.c): read through `zmap`, decompress only the
//! pclusters a read needs, keep decompressed pclusters in a bounded shared cache.

use crate::data::Extent;
use crate::error::*;
use crate::image::Image;
use crate::inode::Inode;
use crate::source::Source;
use std::sync::Mutex;

/// A bounded cache of decompressed extents, keyed by (nid, logical start).
pub struct PclusterCache {
    inner: Mutex<CacheInner>,
}

struct CacheInner {
    budget: usize,
    used: usize,
    tick: u64,
    map: std::collections::HashMap<(u64, u64), (u64, std::sync::Arc<Vec<u8>>)>,
}

impl PclusterCache {
    pub fn new(budget: usize) -> Self {
        PclusterCache {
            inner: Mutex::new(CacheInner {
                budget,
                used: 0,
                tick: 0,
                map: Default::default(),
            }),
        }
    }
    pub fn set_budget(&self, budget: usize) {
        if let Ok(mut g) = self.inner.lock() {
            g.budget = budget;
            g.evict();
        }
    }
    pub(crate) fn get(&self, key: (u64, u64)) -> Option<std::sync::Arc<Vec<u8>>> {
        let mut g = self.inner.lock().ok()?;
        g.tick += 1;
        let t = g.tick;
        let e = g.map.get_mut(&key)?;
        e.0 = t;
        Some(e.1.clone())
    }
    pub(crate) fn put(&self, key: (u64, u64), v: std::sync::Arc<Vec<u8>>) {
        let Ok(mut g) = self.inner.lock() else { return };
        if v.len() > g.budget {
            return;
        }
        g.tick += 1;
        let t = g.tick;
        g.used += v.len();
        if let Some(old) = g.map.insert(key, (t, v)) {
            g.used -= old.1.len();
        }
        g.evict();
    }
    /// Bytes currently held.
    pub fn used(&self) -> usize {
        self.inner.lock().map(|g| g.used).unwrap_or(0)
    }
}

impl CacheInner {
    fn evict(&mut self) {
        // Bounded: each pass removes one entry.
        while self.used > self.budget {
            let Some((&k, _)) = self.map.iter().min_by_key(|(_, (t, _))| *t) else {
                break;
            };
            if let Some((_, v)) = self.map.remove(&k) {
                self.used -= v.len();
            }
        }
    }
}

impl<S: Source> Image<S> {
    pub(crate) fn z_read_at(&self, ino: &Inode, _offset: u64, _buf: &mut [u8]) -> Result<usize> {
        Err(unsupported("compressed files", Some(ino.nid)))
    }
    pub(crate) fn z_extents(&self, ino: &Inode) -> Result<Vec<Extent>> {
        Err(unsupported("compressed files", Some(ino.nid)))
    }
}
