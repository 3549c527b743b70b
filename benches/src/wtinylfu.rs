//! A reference W-TinyLFU, built as Caffeine builds it, for the trace suite's "Caffeine-class"
//! column: single-threaded, for hit ratios only, never part of the cache.
//!
//! Written from Caffeine's published design (Einziger, Friedman and Manes, "TinyLFU: A Highly
//! Efficient Cache Admission Policy", 2017; "Adaptive Software Cache Management", Middleware
//! 2018) and its `BoundedLocalCache` / `FrequencySketch`:
//!
//! - an LRU *window* (1% of the capacity at the start) in front of a segmented-LRU *main*
//!   region, whose *protected* part holds up to 80% of it and whose *probation* part takes
//!   the rest;
//! - every access, hit or miss, counts in a count-min sketch of 4-bit counters (four per key,
//!   the least is the estimate; 16 counters per 64-bit word, one word per entry rounded up to
//!   a power of two), which halves every counter after ten accesses per entry; the sketch
//!   starts counting once the cache is half full;
//! - a miss joins the window; the window's least recent entry (the *candidate*) goes to
//!   probation while the cache has room, and otherwise duels probation's least recent (the
//!   *victim*): the candidate is admitted only if the sketch estimates it more frequent, or,
//!   at an estimate of 6 or more, with a chance of 1 in 128 (Caffeine's guard against hash
//!   flooding);
//! - a hit in probation moves the entry to protected, demoting protected's least recent to
//!   probation when protected is over its share;
//! - the classic hill climber sizes the window: every ten accesses per entry it compares the
//!   sample's hit rate with the last sample's, keeps its direction while the rate rose (or
//!   held) and turns back otherwise, by a step of 6.25% of the capacity at first and after
//!   any change of the rate by 5 points or more, decaying by 0.98 per sample otherwise.
//!
//! Caffeine's 2026 density tier (above 4,096 entries) is not built here: the column is the
//! classic policy.

use std::collections::HashMap;

const NIL: u32 = u32::MAX;

/// Which list an entry is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Region {
    Window,
    Probation,
    Protected,
}

struct Node {
    key: u64,
    prev: u32,
    next: u32,
    region: Region,
}

/// A doubly linked list over the slab, least recent at the head.
#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: usize,
}

impl List {
    const EMPTY: Self = Self {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// Caffeine's frequency sketch: 4-bit counters, four per key, halved after `10 × capacity`
/// additions.
struct Sketch {
    table: Vec<u64>,
    mask: u64,
    additions: u64,
    sample: u64,
}

impl Sketch {
    fn new(capacity: usize) -> Self {
        let words = capacity.max(8).next_power_of_two();
        Self {
            table: vec![0; words],
            mask: words as u64 - 1,
            additions: 0,
            sample: 10 * capacity.max(1) as u64,
        }
    }

    /// The word and the counter within it of `key`'s `i`-th counter.
    fn slot(&self, key: u64, i: u64) -> (usize, u32) {
        let h = (key ^ 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i + 1))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9)
            .rotate_left(31)
            .wrapping_mul(0x94D0_49BB_1331_11EB);
        ((h & self.mask) as usize, ((h >> 60) as u32) * 4)
    }

    fn frequency(&self, key: u64) -> u64 {
        (0..4)
            .map(|i| {
                let (w, s) = self.slot(key, i);
                self.table[w] >> s & 15
            })
            .min()
            .unwrap_or(0)
    }

    fn increment(&mut self, key: u64) {
        let mut added = false;
        for i in 0..4 {
            let (w, s) = self.slot(key, i);
            if self.table[w] >> s & 15 < 15 {
                self.table[w] += 1 << s;
                added = true;
            }
        }
        if added {
            self.additions += 1;
            if self.additions >= self.sample {
                self.reset();
            }
        }
    }

    fn reset(&mut self) {
        let mut odd = 0;
        for w in &mut self.table {
            odd += (*w & 0x1111_1111_1111_1111).count_ones() as u64;
            *w = (*w >> 1) & 0x7777_7777_7777_7777;
        }
        self.additions = (self.additions - odd / 4) / 2;
    }
}

/// The reference W-TinyLFU cache of keys.
pub struct WTinyLfu {
    capacity: usize,
    map: HashMap<u64, u32>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    window: List,
    probation: List,
    protected: List,
    window_max: usize,
    protected_max: usize,
    sketch: Sketch,
    counting: bool,
    /// The hill climber's state.
    hits: u64,
    misses: u64,
    previous_rate: f64,
    step: f64,
    /// Window size still to move (positive grows the window).
    adjustment: i64,
    /// For the 1-in-128 admission.
    random: u64,
}

impl WTinyLfu {
    /// A cache of `capacity` keys (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let window_max = (capacity - (capacity as f64 * 0.99) as usize).max(1);
        Self {
            capacity,
            map: HashMap::with_capacity(capacity),
            nodes: Vec::with_capacity(capacity + 1),
            free: Vec::new(),
            window: List::EMPTY,
            probation: List::EMPTY,
            protected: List::EMPTY,
            window_max,
            protected_max: ((capacity - window_max) as f64 * 0.8) as usize,
            sketch: Sketch::new(capacity),
            counting: false,
            hits: 0,
            misses: 0,
            previous_rate: 0.0,
            step: -0.0625 * capacity as f64,
            adjustment: 0,
            random: 0x2545_F491_4F6C_DD1D,
        }
    }

    /// The window's share of the capacity now.
    pub fn window_share(&self) -> f64 {
        self.window_max as f64 / self.capacity as f64
    }

    fn list(&mut self, r: Region) -> &mut List {
        match r {
            Region::Window => &mut self.window,
            Region::Probation => &mut self.probation,
            Region::Protected => &mut self.protected,
        }
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next, r) = {
            let n = &self.nodes[i as usize];
            (n.prev, n.next, n.region)
        };
        if prev == NIL {
            self.list(r).head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.list(r).tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        self.list(r).len -= 1;
    }

    /// Appends `i` at the most recent end of `r`.
    fn push(&mut self, i: u32, r: Region) {
        let tail = self.list(r).tail;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = tail;
            n.next = NIL;
            n.region = r;
        }
        if tail == NIL {
            self.list(r).head = i;
        } else {
            self.nodes[tail as usize].next = i;
        }
        let l = self.list(r);
        l.tail = i;
        l.len += 1;
    }

    fn move_to(&mut self, i: u32, r: Region) {
        self.unlink(i);
        self.push(i, r);
    }

    fn len(&self) -> usize {
        self.window.len + self.probation.len + self.protected.len
    }

    fn evict(&mut self, i: u32) {
        self.unlink(i);
        self.map.remove(&self.nodes[i as usize].key);
        self.free.push(i);
    }

    /// Looks `key` up, inserting it on a miss; whether it hit.
    pub fn access(&mut self, key: u64) -> bool {
        if !self.counting && self.len() >= self.capacity / 2 {
            self.counting = true;
        }
        if self.counting {
            self.sketch.increment(key);
        }
        let hit = if let Some(&i) = self.map.get(&key) {
            match self.nodes[i as usize].region {
                Region::Window | Region::Protected => {
                    let r = self.nodes[i as usize].region;
                    self.move_to(i, r);
                }
                Region::Probation => {
                    self.move_to(i, Region::Protected);
                    self.demote_protected();
                }
            }
            self.hits += 1;
            true
        } else {
            let node = Node {
                key,
                prev: NIL,
                next: NIL,
                region: Region::Window,
            };
            let i = match self.free.pop() {
                Some(i) => {
                    self.nodes[i as usize] = node;
                    i
                }
                None => {
                    self.nodes.push(node);
                    (self.nodes.len() - 1) as u32
                }
            };
            self.map.insert(key, i);
            self.push(i, Region::Window);
            self.misses += 1;
            self.evict_entries();
            false
        };
        self.climb();
        hit
    }

    /// Demotes protected's least recent entries to probation while protected is over its
    /// share.
    fn demote_protected(&mut self) {
        while self.protected.len > self.protected_max {
            let i = self.protected.head;
            self.move_to(i, Region::Probation);
        }
    }

    /// Moves the window's overflow to probation while the cache has room; beyond it each
    /// overflowing candidate duels probation's victim (protected's when probation is empty).
    fn evict_entries(&mut self) {
        while self.window.len > self.window_max {
            let c = self.window.head;
            if self.len() <= self.capacity {
                self.move_to(c, Region::Probation);
                continue;
            }
            let victim = if self.probation.len > 0 {
                self.probation.head
            } else {
                self.protected.head
            };
            if victim == NIL {
                self.evict(c);
            } else if self.admit(self.nodes[c as usize].key, self.nodes[victim as usize].key) {
                self.evict(victim);
                self.move_to(c, Region::Probation);
            } else {
                self.evict(c);
            }
        }
        while self.len() > self.capacity {
            let victim = [self.probation.head, self.protected.head, self.window.head]
                .into_iter()
                .find(|&i| i != NIL)
                .expect("an over-full cache holds entries");
            self.evict(victim);
        }
    }

    fn admit(&mut self, candidate: u64, victim: u64) -> bool {
        let (c, v) = (
            self.sketch.frequency(candidate),
            self.sketch.frequency(victim),
        );
        if c > v {
            return true;
        }
        if c >= 6 {
            self.random ^= self.random << 13;
            self.random ^= self.random >> 7;
            self.random ^= self.random << 17;
            return self.random & 127 == 0;
        }
        false
    }

    /// Caffeine's classic hill climber, then the resize it decided.
    fn climb(&mut self) {
        if !self.counting {
            return;
        }
        let requests = self.hits + self.misses;
        if requests >= self.sketch.sample {
            let rate = self.hits as f64 / requests as f64;
            let change = rate - self.previous_rate;
            let amount = if change >= 0.0 { self.step } else { -self.step };
            self.step = if change.abs() >= 0.05 {
                0.0625 * self.capacity as f64 * if amount >= 0.0 { 1.0 } else { -1.0 }
            } else {
                0.98 * amount
            };
            self.previous_rate = rate;
            self.adjustment = amount as i64;
            self.hits = 0;
            self.misses = 0;
        }
        if self.adjustment > 0 {
            // Grow the window: the main region gives up the room, protected's share first.
            let main = self.capacity - self.window_max;
            let quota = (self.adjustment as usize).min(main.saturating_sub(1));
            self.window_max += quota;
            self.protected_max = self.protected_max.saturating_sub(quota);
            while self.protected.len > self.protected_max {
                let i = self.protected.head;
                self.move_to(i, Region::Probation);
            }
            // Probation's oldest move into the window while the main region is over its room.
            while self.probation.len + self.protected.len > self.capacity - self.window_max
                && self.probation.len > 0
            {
                let i = self.probation.head;
                self.move_to(i, Region::Window);
            }
        } else if self.adjustment < 0 {
            let quota = ((-self.adjustment) as usize).min(self.window_max.saturating_sub(1));
            self.window_max -= quota;
            self.protected_max = (self.protected_max + quota)
                .min(((self.capacity - self.window_max) as f64 * 0.8) as usize);
            while self.window.len > self.window_max {
                let i = self.window.head;
                self.move_to(i, Region::Probation);
            }
        }
        self.adjustment = 0;
    }
}

/// Hits of `trace` replayed against a reference W-TinyLFU of `capacity` keys.
pub fn replay(trace: &[u64], capacity: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let mut cache = WTinyLfu::new(capacity);
    trace.iter().map(|&k| u64::from(cache.access(k))).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frequent_key_survives_a_scan_that_lru_would_flush() {
        let mut c = WTinyLfu::new(100);
        for _ in 0..50 {
            for k in 0..50 {
                c.access(k);
            }
        }
        // A scan of 10,000 fresh keys: the fifty hot keys stay in the main region.
        for k in 1_000..11_000 {
            c.access(k);
        }
        let kept = (0..50).filter(|k| c.map.contains_key(k)).count();
        assert!(kept >= 45, "only {kept} of 50 hot keys survived the scan");
        assert!(c.len() <= 100);
    }

    #[test]
    fn the_cache_never_holds_more_than_its_capacity_and_hits_a_repeated_key() {
        let mut c = WTinyLfu::new(3);
        assert!(!c.access(1));
        assert!(c.access(1));
        for k in 0..1_000u64 {
            c.access(k % 7);
            assert!(c.len() <= 3);
        }
        assert_eq!(replay(&[], 10), 0);
        assert_eq!(replay(&[5, 5, 5], 0), 0);
        assert_eq!(replay(&[5, 5, 5], 1), 2);
    }

    #[test]
    fn the_window_grows_on_a_recency_workload_and_stays_in_bounds() {
        // A loop slightly larger than the cache punishes frequency; a sliding working set
        // rewards recency: the climber moves off its 1% start.
        let mut c = WTinyLfu::new(1_000);
        let start = c.window_share();
        let mut k = 0u64;
        for i in 0..400_000u64 {
            // A working set of 800 keys sliding by one key every 4 accesses.
            let key = k + i % 800;
            if i % 4 == 0 {
                k += 1;
            }
            c.access(key);
            assert!(c.window_max >= 1 && c.window_max <= 1_000);
        }
        assert!(c.window_share() > start, "{} <= {start}", c.window_share());
    }
}
