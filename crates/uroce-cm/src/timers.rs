//! Deadlines kept in order, so that finding the next one and the ones due costs O(log n)
//! whatever the number of connections (an idle connection costs no CPU, as an idle QP
//! does not).

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

use uroce_engine::Instant;

/// At most one deadline per key.
#[derive(Debug)]
pub(crate) struct Timers<K> {
    by_key: HashMap<K, Instant>,
    by_time: BTreeSet<(Instant, K)>,
}

impl<K: Copy + Ord + Hash> Timers<K> {
    pub(crate) fn new() -> Self {
        Self { by_key: HashMap::new(), by_time: BTreeSet::new() }
    }

    /// Sets (or, with `None`, clears) `key`'s deadline.
    pub(crate) fn set(&mut self, key: K, at: Option<Instant>) {
        if let Some(old) = self.by_key.remove(&key) {
            self.by_time.remove(&(old, key));
        }
        if let Some(at) = at {
            self.by_key.insert(key, at);
            self.by_time.insert((at, key));
        }
    }

    /// The earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.by_time.first().map(|&(at, _)| at)
    }

    /// Takes every key due at `now`, earliest first; their deadlines are cleared.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<K> {
        let mut due = Vec::new();
        while let Some(&(at, key)) = self.by_time.first() {
            if at > now {
                break;
            }
            self.by_time.pop_first();
            self.by_key.remove(&key);
            due.push(key);
        }
        due
    }

    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Timers;
    use uroce_engine::{Duration, Instant};

    fn at(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn deadlines_come_due_in_order_and_a_reset_replaces_the_old_one() {
        let mut t = Timers::new();
        t.set(1u32, Some(at(30)));
        t.set(2, Some(at(10)));
        t.set(3, Some(at(20)));
        t.set(3, Some(at(40)));
        t.set(2, None);
        assert_eq!((t.next(), t.len()), (Some(at(30)), 2));
        assert_eq!(t.take_due(at(29)), Vec::<u32>::new());
        assert_eq!(t.take_due(at(40)), vec![1, 3]);
        assert_eq!((t.next(), t.len()), (None, 0));
    }
}
