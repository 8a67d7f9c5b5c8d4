//! A CLOCK ("second chance") table: the eviction core of the reader's extent cache and
//! of the FUSE mount's cache. Each entry carries a charge (what it costs against a
//! budget, which the caller keeps); a hit sets its reference bit, and eviction moves a
//! hand over the slots, clearing set bits and taking the first clear one, so an
//! eviction visits every slot at most twice: O(1) amortised, no scan for the oldest.

use std::collections::HashMap;
use std::hash::Hash;

struct Slot<K, V> {
    key: K,
    val: V,
    charge: usize,
    referenced: bool,
}

/// The table. Not synchronised: callers shard it behind locks.
pub struct Clock<K, V> {
    map: HashMap<K, usize>,
    slots: Vec<Option<Slot<K, V>>>,
    free: Vec<usize>,
    hand: usize,
}

impl<K, V> Default for Clock<K, V> {
    fn default() -> Self {
        Clock {
            map: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            hand: 0,
        }
    }
}

impl<K: Copy + Eq + Hash, V> Clock<K, V> {
    /// The value for `key`, marked as referenced.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        let i = *self.map.get(key)?;
        let s = self.slots.get_mut(i)?.as_mut()?;
        s.referenced = true;
        Some(&s.val)
    }

    pub fn contains(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Insert or replace (referenced); returns the change of the total charge.
    pub fn insert(&mut self, key: K, val: V, charge: usize) -> isize {
        let slot = Slot {
            key,
            val,
            charge,
            referenced: true,
        };
        if let Some(&i) = self.map.get(&key) {
            if let Some(Some(s)) = self.slots.get_mut(i) {
                let old = std::mem::replace(s, slot);
                return charge as isize - old.charge as isize;
            }
        }
        let i = match self.free.pop() {
            Some(i) => {
                if let Some(s) = self.slots.get_mut(i) {
                    *s = Some(slot);
                }
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.map.insert(key, i);
        charge as isize
    }

    /// Remove `key`: its value and charge.
    pub fn take(&mut self, key: &K) -> Option<(V, usize)> {
        let i = self.map.remove(key)?;
        let s = self.slots.get_mut(i)?.take()?;
        self.free.push(i);
        Some((s.val, s.charge))
    }

    /// Evict one entry; its charge, or None when the table is empty. At most two sweeps
    /// over the slots: the first clears every reference bit it passes.
    pub fn evict_one(&mut self) -> Option<usize> {
        if self.map.is_empty() {
            return None;
        }
        let n = self.slots.len();
        for _ in 0..n.saturating_mul(2) {
            let i = self.hand;
            self.hand = if i + 1 >= n { 0 } else { i + 1 };
            let victim = match self.slots.get_mut(i) {
                Some(Some(s)) if s.referenced => {
                    s.referenced = false;
                    false
                }
                Some(Some(_)) => true,
                _ => false,
            };
            if victim {
                let s = self.slots.get_mut(i).and_then(Option::take)?;
                self.map.remove(&s.key);
                self.free.push(i);
                return Some(s.charge);
            }
        }
        None
    }
}
