//! What a queue remembers between requests to spare the store work: a
//! bounded map shared by the queue's clones.
//!
//! Each memo is a throttle or a cache: when a device's liveness was last
//! written, its liveness as last read, the syncs last written, each run's
//! progress writes and its coalesced report. What a memo holds only ever
//! spares a store access or defers a write; nothing a memo forgets changes
//! an answer's rules, only how often the store is asked (and, for the
//! progress memo, drops a coalesced report that a later one would replace).
//!
//! The bound has one rule, the same for every memo: when a key that is
//! not kept arrives and the memo is full (its capacity is given to
//! [`Memo::new`]), the memo starts over (every entry is dropped) before it
//! takes the new key.
//! A kept key is always replaced in place. A queue that meets more distinct
//! devices or running commands than that is far past the load the memos
//! are sized for; starting over keeps memory bounded with no eviction
//! order to maintain on every request.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A hash map with a fast keyed hash (seeded per process).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A map of at most `capacity` entries behind a lock (see the module docs).
pub(super) struct Memo<K, V> {
    capacity: usize,
    entries: Mutex<FastMap<K, V>>,
}

/// The entries of a [`Memo`], locked: what [`Memo::lock`] returns. Hold it
/// in a block that ends before the next `.await`.
pub(super) struct Entries<'a, K, V> {
    capacity: usize,
    map: MutexGuard<'a, FastMap<K, V>>,
}

impl<K: Eq + Hash, V> Memo<K, V> {
    /// An empty memo that keeps at most `capacity` entries.
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::new(FastMap::default()),
        }
    }

    /// Most entries kept.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The entries, locked. A panic while they were locked leaves them
    /// usable: every entry is a whole value, and the worst a half-done
    /// change can do is cost a store access.
    pub(super) fn lock(&self) -> Entries<'_, K, V> {
        Entries {
            capacity: self.capacity,
            map: self.entries.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }
}

impl<K: Eq + Hash, V> Entries<'_, K, V> {
    /// The entry of `key`, if kept.
    pub(super) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.map.get(key)
    }

    /// The entry of `key` to change in place, if kept.
    pub(super) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.map.get_mut(key)
    }

    /// Keeps `value` for `key`, replacing what was kept for it. A new key
    /// arriving at the bound empties the memo first.
    pub(super) fn insert(&mut self, key: K, value: V) {
        self.make_room_for(&key);
        self.map.insert(key, value);
    }

    /// The entry of `key`, made with `make` if it is not kept (a new key
    /// arriving at the bound empties the memo first).
    pub(super) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        self.make_room_for(&key);
        self.map.entry(key).or_insert_with(make)
    }

    /// Forgets `key`.
    pub(super) fn remove<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.map.remove(key);
    }

    /// Keeps only the entries `keep` accepts.
    pub(super) fn retain(&mut self, keep: impl FnMut(&K, &mut V) -> bool) {
        self.map.retain(keep);
    }

    /// Every entry, to change in place.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.map.iter_mut()
    }

    /// How many entries are kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// The bound's rule: a key not kept, arriving when the memo is full,
    /// finds it emptied.
    fn make_room_for(&mut self, key: &K) {
        if self.map.len() >= self.capacity && !self.map.contains_key(key) {
            self.map.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_never_holds_more_than_its_capacity() {
        let memo = Memo::new(3);
        for n in 0..100u32 {
            memo.lock().insert(n, n);
            assert!(memo.lock().len() <= memo.capacity(), "{n}");
        }
        for n in 100..200u32 {
            *memo.lock().get_or_insert_with(n, || 0) += 1;
            assert!(memo.lock().len() <= 3, "{n}");
        }
    }

    #[test]
    fn a_new_key_at_the_bound_starts_the_memo_over() {
        let memo = Memo::new(2);
        memo.lock().insert("a", 1);
        memo.lock().insert("b", 2);
        memo.lock().insert("c", 3);
        let entries = memo.lock();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries.get("a"), None);
        assert_eq!(entries.get("b"), None);
        assert_eq!(entries.get("c"), Some(&3));
    }

    #[test]
    fn a_kept_key_at_the_bound_is_replaced_and_nothing_is_dropped() {
        let memo = Memo::new(2);
        memo.lock().insert("a", 1);
        memo.lock().insert("b", 2);
        memo.lock().insert("a", 10);
        *memo.lock().get_or_insert_with("b", || 0) += 5;
        let entries = memo.lock();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries.get("a"), Some(&10));
        assert_eq!(entries.get("b"), Some(&7));
    }

    #[test]
    fn get_or_insert_with_makes_a_value_only_for_a_missing_key() {
        let memo = Memo::new(4);
        let mut made = 0;
        for _ in 0..3 {
            memo.lock().get_or_insert_with("k", || {
                made += 1;
                Vec::new()
            });
        }
        memo.lock().get_or_insert_with("k", Vec::new).push(1);
        assert_eq!(made, 1);
        assert_eq!(memo.lock().get("k"), Some(&vec![1]));
    }

    #[test]
    fn entries_change_in_place_and_can_be_filtered() {
        let memo = Memo::new(8);
        for n in 0..6u32 {
            memo.lock().insert(n, n);
        }
        if let Some(v) = memo.lock().get_mut(&0) {
            *v = 100;
        }
        assert_eq!(memo.lock().get_mut(&42), None);
        memo.lock().retain(|k, _| k % 2 == 0);
        for (_, v) in memo.lock().iter_mut() {
            *v += 1;
        }
        let entries = memo.lock();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries.get(&0), Some(&101));
        assert_eq!(entries.get(&1), None);
        assert_eq!(entries.get(&4), Some(&5));
    }

    #[test]
    fn a_panic_while_locked_leaves_the_memo_usable() {
        let memo = std::sync::Arc::new(Memo::new(2));
        memo.lock().insert(1, 1);
        let poisoner = std::sync::Arc::clone(&memo);
        let _ = std::thread::spawn(move || {
            let _entries = poisoner.lock();
            panic!("poison the lock");
        })
        .join();
        assert_eq!(memo.lock().get(&1), Some(&1));
    }
}
