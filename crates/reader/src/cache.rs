//! The shared cache of decoded extents (like the kernel's managed pcluster cache): a byte
//! budget over all shards, CLOCK eviction per shard.
//!
//! Only reads that need part of an extent come here (random access: `cat` at an offset,
//! a FUSE read, the packed and metabox inodes); reads that cover whole extents decode
//! straight into the caller's buffer and never touch it. Keys are hashed to one of
//! [`SHARDS`] shards, each behind its own lock, so threads reading different files do
//! not queue on one lock. Eviction is CLOCK ("second chance"): a hit sets the entry's
//! reference bit, the hand clears set bits and evicts the first clear one, so an eviction
//! visits at most every slot twice and costs O(1) amortised — no scan for the oldest.
//! The budget is global: an insert evicts from its own shard first and, only when that
//! shard is empty, from the others (never holding two locks).

use crate::clock::Clock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// (image-local nid, logical start of the extent).
pub(crate) type Key = (u64, u64);
/// Decoded bytes: the whole extent or a prefix of it.
pub(crate) type Bytes = Arc<Vec<u8>>;

/// Number of shards (a power of two).
pub(crate) const SHARDS: usize = 16;

type Shard = Clock<Key, Bytes>;

pub(crate) struct ExtentCache {
    shards: Box<[Mutex<Shard>]>,
    used: AtomicUsize,
    budget: AtomicUsize,
}

fn shard_of(key: Key) -> usize {
    // Fibonacci hashing of both halves; the top bits pick the shard.
    let h = key.0.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
        ^ key.1.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    let h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    usize::try_from(h >> 60).unwrap_or(0) % SHARDS
}

impl ExtentCache {
    pub(crate) fn new(budget: usize) -> Self {
        ExtentCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            used: AtomicUsize::new(0),
            budget: AtomicUsize::new(budget),
        }
    }

    fn lock(&self, i: usize) -> Option<MutexGuard<'_, Shard>> {
        // A poisoned shard (a panic while holding it) is skipped: the cache is only an
        // optimisation, the caller decodes again.
        self.shards.get(i)?.lock().ok()
    }

    pub(crate) fn budget(&self) -> usize {
        self.budget.load(Ordering::Relaxed)
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn set_budget(&self, budget: usize) {
        self.budget.store(budget, Ordering::Relaxed);
        self.shrink(0);
    }

    pub(crate) fn get(&self, key: Key) -> Option<Bytes> {
        self.lock(shard_of(key))?.get(&key).cloned()
    }

    /// Insert or replace; values larger than the whole budget are not kept.
    pub(crate) fn put(&self, key: Key, val: Bytes) {
        let len = val.len();
        if len > self.budget() {
            return;
        }
        let home = shard_of(key);
        if let Some(mut g) = self.lock(home) {
            let d = g.insert(key, val, len);
            if d >= 0 {
                self.used.fetch_add(d.unsigned_abs(), Ordering::Relaxed);
            } else {
                self.used.fetch_sub(d.unsigned_abs(), Ordering::Relaxed);
            }
        }
        self.shrink(home);
    }

    /// Evict until within budget: shard `first`, then the others in turn. Bounded: every
    /// step removes an entry, and a shard is left only once it is empty.
    fn shrink(&self, first: usize) {
        for k in 0..SHARDS {
            if self.used() <= self.budget() {
                return;
            }
            let Some(mut g) = self.lock((first + k) % SHARDS) else {
                continue;
            };
            while self.used() > self.budget() {
                match g.evict_one() {
                    Some(n) => {
                        self.used.fetch_sub(n, Ordering::Relaxed);
                    }
                    None => break,
                }
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        (0..SHARDS)
            .filter_map(|i| self.lock(i).map(|g| g.len()))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(n: usize, b: u8) -> Bytes {
        Arc::new(vec![b; n])
    }

    /// Keys that all land in one shard, to test CLOCK order.
    fn same_shard_keys(n: usize) -> Vec<Key> {
        let s = shard_of((1, 0));
        (0..u64::MAX)
            .map(|i| (1, i))
            .filter(|&k| shard_of(k) == s)
            .take(n)
            .collect()
    }

    #[test]
    fn budget_is_kept_and_hits_return_the_bytes() {
        let c = ExtentCache::new(10_000);
        for i in 0..100u64 {
            c.put((i, i * 7), val(1000, i as u8));
            assert!(c.used() <= 10_000, "over budget: {}", c.used());
        }
        assert_eq!(c.used(), 10_000);
        assert_eq!(c.len(), 10);
        let hits: Vec<u64> = (0..100u64)
            .filter(|&i| c.get((i, i * 7)).is_some())
            .collect();
        assert_eq!(hits.len(), 10);
        for i in hits {
            assert_eq!(*c.get((i, i * 7)).expect("hit"), vec![i as u8; 1000]);
        }
    }

    #[test]
    fn clock_keeps_referenced_entries() {
        let k = same_shard_keys(5);
        let c = ExtentCache::new(3000);
        c.put(k[0], val(1000, 0));
        c.put(k[1], val(1000, 1));
        c.put(k[2], val(1000, 2));
        // Fourth insert: the hand clears every bit in its first sweep and evicts k0.
        c.put(k[3], val(1000, 3));
        assert!(c.get(k[0]).is_none());
        // k1 is now referenced again: the next insert passes it and evicts k2.
        assert!(c.get(k[1]).is_some());
        c.put(k[4], val(1000, 4));
        assert!(c.get(k[2]).is_none(), "unreferenced entry kept");
        assert_eq!(
            *c.get(k[1]).expect("referenced entry evicted"),
            vec![1; 1000]
        );
        assert_eq!(c.used(), 3000);
    }

    #[test]
    fn replace_and_oversized_and_shrinking() {
        let c = ExtentCache::new(4096);
        c.put((1, 0), val(100, 1));
        c.put((1, 0), val(300, 2));
        assert_eq!(c.used(), 300);
        assert_eq!(*c.get((1, 0)).expect("hit"), vec![2; 300]);
        c.put((2, 0), val(5000, 3));
        assert!(c.get((2, 0)).is_none(), "larger than the budget");
        // Entries spread over shards: a smaller budget evicts across shards.
        for i in 0..40u64 {
            c.put((i + 10, 0), val(100, 4));
        }
        // 300 + 40 * 100 = 4300 bytes offered: evicted down to the budget.
        assert!((3796..=4096).contains(&c.used()), "{}", c.used());
        c.set_budget(250);
        assert!(c.used() <= 250);
        c.set_budget(0);
        assert_eq!((c.used(), c.len()), (0, 0));
    }
}
