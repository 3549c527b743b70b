//! A reference GreedyDual-Size-Frequency cache (Cherkasova, "Improving WWW Proxies
//! Performance with Greedy-Dual-Size-Frequency Caching Policy", HP Labs 1998), the weighted
//! trace suite's size-aware column: single-threaded, for hit ratios only, never part of the
//! cache.
//!
//! Every cached entry has a priority `H = L + F / S`: `F` its accesses since it was last
//! admitted, `S` its size, and `L` the *inflation*, the priority of the last entry evicted
//! (so entries admitted later start above the ones that aged in place). A hit raises `F` by one
//! and recomputes `H`; a miss admits the entry at `F = 1` and evicts the entries of least
//! priority until the rest fits. An entry larger than the capacity is not admitted. With a
//! cost of 1 per entry, GDSF keeps what maximises the object hit ratio: many small, frequent
//! entries over a few large ones.
//!
//! [`Gdsf::with_exponent`] divides by `S^β` instead: β = 1 is GDSF, β = 0 ignores the size
//! (frequency with aging), and the values between trade the object hit ratio for the byte hit
//! ratio, which the weighted suite's `--frontier` replays to find what a size-aware policy can
//! reach in each cell.

use std::collections::{BTreeSet, HashMap};

/// A priority that orders as its value: non-negative floats order as their bits do.
fn key_of(priority: f64) -> u64 {
    debug_assert!(priority >= 0.0);
    priority.to_bits()
}

/// What an entry of `size` costs in a priority: `size^exponent` (exactly `size` at 1).
fn cost(size: u64, exponent: f64) -> f64 {
    if exponent == 1.0 {
        size as f64
    } else {
        (size as f64).powf(exponent)
    }
}

/// The reference GDSF cache of sized keys.
pub struct Gdsf {
    capacity: u64,
    size: u64,
    inflation: f64,
    /// β: a priority divides by the size to this power.
    exponent: f64,
    /// Key → (accesses since admission, size, priority bits).
    map: HashMap<u64, (u64, u64, u64)>,
    /// (priority bits, key), least first.
    order: BTreeSet<(u64, u64)>,
}

impl Gdsf {
    pub fn new(capacity: u64) -> Self {
        Self::with_exponent(capacity, 1.0)
    }

    /// A cache whose priorities divide by the size to the power `exponent` (β).
    pub fn with_exponent(capacity: u64, exponent: f64) -> Self {
        Self {
            capacity,
            size: 0,
            inflation: 0.0,
            exponent,
            map: HashMap::new(),
            order: BTreeSet::new(),
        }
    }

    /// One access of `key` of `size`; whether it hit.
    pub fn access(&mut self, key: u64, size: u64) -> bool {
        let size = size.max(1);
        if let Some((freq, s, prio)) = self.map.get_mut(&key) {
            self.order.remove(&(*prio, key));
            *freq += 1;
            *prio = key_of(self.inflation + *freq as f64 / cost(*s, self.exponent));
            self.order.insert((*prio, key));
            return true;
        }
        if size > self.capacity {
            return false;
        }
        while self.size + size > self.capacity {
            let Some((prio, victim)) = self.order.pop_first() else {
                break;
            };
            let (_, s, _) = self
                .map
                .remove(&victim)
                .expect("ordered entries are mapped");
            self.size -= s;
            self.inflation = f64::from_bits(prio);
        }
        let prio = key_of(self.inflation + 1.0 / cost(size, self.exponent));
        self.map.insert(key, (1, size, prio));
        self.order.insert((prio, key));
        self.size += size;
        false
    }

    /// The weight cached now.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// Replays `trace` (key, size) against a GDSF cache of `capacity`: (hits, bytes hit).
pub fn replay(trace: &[(u64, u32)], capacity: u64) -> (u64, u64) {
    replay_with(trace, capacity, 1.0)
}

/// [`replay`] with priorities divided by the size to the power `exponent`.
pub fn replay_with(trace: &[(u64, u32)], capacity: u64, exponent: f64) -> (u64, u64) {
    let mut cache = Gdsf::with_exponent(capacity, exponent);
    let (mut hits, mut bytes) = (0, 0);
    for &(k, s) in trace {
        if cache.access(k, u64::from(s)) {
            hits += 1;
            bytes += u64::from(s);
        }
    }
    (hits, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_never_holds_more_than_its_capacity() {
        let mut c = Gdsf::new(1_000);
        for i in 0..10_000u64 {
            c.access(i % 97, 1 + (i * 31) % 300);
            assert!(c.size() <= 1_000);
        }
        assert!(!c.access(5_000, 1_001), "heavier than the capacity");
        assert!(!c.map.contains_key(&5_000));
    }

    #[test]
    fn small_frequent_entries_outlast_a_large_one() {
        let mut c = Gdsf::new(100);
        for _ in 0..5 {
            for k in 0..10 {
                c.access(k, 5);
            }
        }
        // A 60-byte newcomer takes the room of the least valuable small entries, then ages
        // out while the small ones keep being hit.
        c.access(99, 60);
        for _ in 0..3 {
            for k in 0..10 {
                c.access(k, 5);
            }
        }
        c.access(98, 60);
        assert!(
            !c.map.contains_key(&99),
            "the large entry, hit once, left first"
        );
        assert!(c.map.len() >= 8);
    }

    #[test]
    fn without_the_size_a_frequent_large_entry_outlasts_rare_small_ones() {
        // Ten 5-byte keys hit once each and a 60-byte key hit five times, under 100 bytes:
        // by frequency alone (β = 0) the large key stays; GDSF (β = 1) evicts it first.
        let run = |exponent| {
            let mut c = Gdsf::with_exponent(100, exponent);
            for _ in 0..5 {
                c.access(99, 60);
            }
            for k in 0..10 {
                c.access(k, 5);
            }
            c.map.contains_key(&99)
        };
        assert!(run(0.0));
        assert!(!run(1.0));
    }
}
