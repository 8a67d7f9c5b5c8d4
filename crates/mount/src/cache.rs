//! The mount's cache: decoded extents and metadata (inodes, directory listings) under one
//! byte budget (`-o cache=SIZE`), and single-flight loading.
//!
//! Keys hash to one of [`SHARDS`] shards, each behind its own lock, so threads serving
//! different files rarely meet. Eviction is CLOCK per shard (a hit sets the entry's
//! reference bit; the hand clears set bits and evicts the first clear one): O(1)
//! amortised, no scan for the oldest. The budget is global; an insert evicts from its
//! own shard first, then from the others, never holding two locks.
//!
//! Single flight: [`Cache::get_or_load`] lets one thread load a missing key while the
//! others asking for it wait for that result, so two readers of one pcluster
//! decompress it once. The loader may publish a value without keeping it (a read that
//! covered an extent whole leaves it to the kernel's page cache).

use ferofs_reader::clock::Clock;
use ferofs_reader::{DirEntry, Inode};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Number of shards (a power of two).
const SHARDS: usize = 32;

/// Bookkeeping bytes charged per entry on top of its payload.
const ENTRY_OVERHEAD: usize = 96;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Inode(u64),
    Dir(u64),
    /// (nid, logical start of the extent).
    Data(u64, u64),
}

#[derive(Debug, Clone)]
pub(crate) enum Val {
    Inode(Arc<Inode>),
    Dir(Arc<Vec<DirEntry>>),
    Data(Arc<Vec<u8>>),
}

impl Val {
    /// Bytes this value is charged against the budget.
    fn charge(&self) -> usize {
        ENTRY_OVERHEAD
            + match self {
                Val::Inode(_) => std::mem::size_of::<Inode>(),
                Val::Dir(d) => d
                    .iter()
                    .map(|e| e.name.len() + std::mem::size_of::<DirEntry>())
                    .sum(),
                Val::Data(v) => v.len(),
            }
    }
}

/// Outcome of a load, shared with the threads that waited for it: the value or an errno.
type Outcome = Result<Val, i32>;

/// A load in progress: its outcome once published, and how many threads wait for it.
#[derive(Default)]
struct Flight {
    state: Mutex<(Option<Outcome>, usize)>,
    cv: Condvar,
}

impl Flight {
    fn publish(&self, r: Outcome) {
        let waiters = match self.state.lock() {
            Ok(mut g) => {
                g.0 = Some(r);
                g.1
            }
            Err(_) => 1,
        };
        // A wake-up is a system call: only when someone waits (nearly never).
        if waiters > 0 {
            self.cv.notify_all();
        }
    }

    fn wait(&self) -> Outcome {
        let Ok(mut g) = self.state.lock() else {
            return Err(EIO);
        };
        g.1 += 1;
        // Bounded by the loader: it always publishes (see `Publish`), then every waiter
        // wakes; spurious wake-ups go round again.
        loop {
            if let Some(r) = g.0.as_ref() {
                return r.clone();
            }
            g = match self.cv.wait(g) {
                Ok(g) => g,
                Err(_) => return Err(EIO),
            };
        }
    }
}

const EIO: i32 = 5;

/// Publishes EIO if the loader never got to publish (a panic while loading), so no
/// waiter waits forever.
struct Publish<'a> {
    cache: &'a Cache,
    key: Key,
    flight: Arc<Flight>,
    done: bool,
}

impl Drop for Publish<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.cache.end_flight(self.key, &self.flight);
            self.flight.publish(Err(EIO));
        }
    }
}

#[derive(Default)]
struct Shard {
    clock: Clock<Key, Val>,
    flights: HashMap<Key, Arc<Flight>>,
}

/// Counters, printed at unmount with `-v`.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Loads that waited for another thread's load of the same key.
    pub joined: AtomicU64,
}

pub(crate) struct Cache {
    shards: Box<[Mutex<Shard>]>,
    used: AtomicUsize,
    budget: usize,
    pub(crate) stats: CacheStats,
}

fn shard_of(key: &Key) -> usize {
    let (a, b) = match *key {
        Key::Inode(n) => (n, 1),
        Key::Dir(n) => (n, 2),
        Key::Data(n, la) => (n, la.wrapping_add(3)),
    };
    let h = a.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
        ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    let h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    usize::try_from(h >> 59).unwrap_or(0) % SHARDS
}

impl Cache {
    pub(crate) fn new(budget: usize) -> Self {
        Cache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            used: AtomicUsize::new(0),
            budget,
            stats: CacheStats::default(),
        }
    }

    fn lock(&self, i: usize) -> Option<MutexGuard<'_, Shard>> {
        // A poisoned shard (a panic while holding it) is skipped: callers load again.
        self.shards.get(i)?.lock().ok()
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn budget(&self) -> usize {
        self.budget
    }

    #[cfg(test)]
    pub(crate) fn get(&self, key: Key) -> Option<Val> {
        self.lock(shard_of(&key))?.clock.get(&key).cloned()
    }

    /// Remove `key` and return its value (a prefetched extent the kernel has now read
    /// whole: its pages are in the page cache, so it will not be asked for again).
    pub(crate) fn take(&self, key: Key) -> Option<Val> {
        let (val, charge) = self.lock(shard_of(&key))?.clock.take(&key)?;
        self.used.fetch_sub(charge, Ordering::Relaxed);
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        Some(val)
    }

    /// True when `key` is cached or being loaded.
    pub(crate) fn present(&self, key: Key) -> bool {
        self.lock(shard_of(&key))
            .is_some_and(|g| g.clock.contains(&key) || g.flights.contains_key(&key))
    }

    /// The value for `key`: from the cache, from another thread's load in progress, or
    /// from `load` (run by this thread, once, while others wait). `keep(&val)` decides
    /// whether the loaded value stays in the cache.
    pub(crate) fn get_or_load(
        &self,
        key: Key,
        keep: bool,
        load: impl FnOnce() -> Outcome,
    ) -> Outcome {
        let si = shard_of(&key);
        let flight = {
            let Some(mut g) = self.lock(si) else {
                return load();
            };
            if let Some(v) = g.clock.get(&key) {
                let v = v.clone();
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(v);
            }
            if let Some(f) = g.flights.get(&key) {
                let f = f.clone();
                drop(g);
                self.stats.joined.fetch_add(1, Ordering::Relaxed);
                return f.wait();
            }
            let f = Arc::new(Flight::default());
            g.flights.insert(key, f.clone());
            f
        };
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        let mut guard = Publish {
            cache: self,
            key,
            flight,
            done: false,
        };
        let r = load();
        if let (Ok(v), true) = (&r, keep) {
            self.put(key, v.clone());
        }
        self.end_flight(key, &guard.flight);
        guard.flight.publish(r.clone());
        guard.done = true;
        r
    }

    fn end_flight(&self, key: Key, flight: &Arc<Flight>) {
        if let Some(mut g) = self.lock(shard_of(&key)) {
            if g.flights.get(&key).is_some_and(|f| Arc::ptr_eq(f, flight)) {
                g.flights.remove(&key);
            }
        }
    }

    /// Insert or replace; values larger than the whole budget are not kept.
    pub(crate) fn put(&self, key: Key, val: Val) {
        let charge = val.charge();
        if charge > self.budget {
            return;
        }
        let home = shard_of(&key);
        {
            let Some(mut g) = self.lock(home) else { return };
            let d = g.clock.insert(key, val, charge);
            if d >= 0 {
                self.used.fetch_add(d.unsigned_abs(), Ordering::Relaxed);
            } else {
                self.used.fetch_sub(d.unsigned_abs(), Ordering::Relaxed);
            }
        }
        self.shrink(home);
    }

    /// Evict until within budget: shard `first`, then the others in turn. Bounded: every
    /// step removes an entry, and a shard is left once it is empty.
    fn shrink(&self, first: usize) {
        for k in 0..SHARDS {
            if self.used() <= self.budget {
                return;
            }
            let Some(mut g) = self.lock((first + k) % SHARDS) else {
                continue;
            };
            while self.used() > self.budget {
                match g.clock.evict_one() {
                    Some(n) => {
                        self.used.fetch_sub(n, Ordering::Relaxed);
                    }
                    None => break,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn data(n: usize, b: u8) -> Val {
        Val::Data(Arc::new(vec![b; n]))
    }

    fn bytes(v: &Val) -> Vec<u8> {
        match v {
            Val::Data(d) => d.to_vec(),
            _ => panic!("not data"),
        }
    }

    #[test]
    fn budget_holds_and_hits_return_the_bytes() {
        let c = Cache::new(10 * (1000 + ENTRY_OVERHEAD));
        for i in 0..100u64 {
            c.put(Key::Data(i, i * 7), data(1000, i as u8));
            assert!(c.used() <= c.budget(), "over budget: {}", c.used());
        }
        let hits: Vec<u64> = (0..100u64)
            .filter(|&i| c.get(Key::Data(i, i * 7)).is_some())
            .collect();
        assert_eq!(hits.len(), 10);
        for i in hits {
            let v = c.get(Key::Data(i, i * 7)).expect("hit");
            assert_eq!(bytes(&v), vec![i as u8; 1000]);
        }
    }

    #[test]
    fn one_load_for_concurrent_askers() {
        let c = Arc::new(Cache::new(1 << 20));
        let loads = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let (c, loads, barrier) = (c.clone(), loads.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let v = c
                        .get_or_load(Key::Data(1, 0), false, || {
                            loads.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(200));
                            Ok(data(4096, 7))
                        })
                        .expect("load");
                    bytes(&v)
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().expect("thread"), vec![7; 4096]);
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1, "decoded more than once");
        // Not kept: the next ask loads again.
        assert!(c.get(Key::Data(1, 0)).is_none());
    }

    #[test]
    fn errors_reach_waiters_and_are_not_cached() {
        let c = Cache::new(1 << 20);
        assert_eq!(c.get_or_load(Key::Inode(3), true, || Err(5)).err(), Some(5));
        let v = c
            .get_or_load(Key::Data(3, 0), true, || Ok(data(10, 1)))
            .expect("load");
        assert_eq!(bytes(&v), vec![1; 10]);
        assert!(c.get(Key::Data(3, 0)).is_some(), "kept");
        assert!(c.get(Key::Inode(3)).is_none());
    }
}
