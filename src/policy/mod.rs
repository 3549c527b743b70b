//! Eviction: S3-FIFO over lock-free queues.
//!
//! S3-FIFO (Yang et al., SOSP 2023) keeps a small FIFO for new entries (about 10% of the
//! capacity), a main FIFO for entries that proved themselves, and a ghost record of what the
//! small FIFO evicted recently:
//!
//! - a new entry joins the small queue, or the main queue if its hash is in the ghost;
//! - a hit raises the entry's 2-bit frequency, writing only while it is below the maximum;
//! - evicting from the small queue promotes entries that were hit since they joined (to the
//!   main queue) and evicts the others, remembering their hash in the ghost;
//! - evicting from the main queue gives entries with a non-zero frequency another round
//!   (frequency − 1) and evicts the first one at zero.
//!
//! One-hit wonders (scans) therefore leave through the small queue without disturbing the
//! main one. The queues are `crossbeam_queue::SegQueue`s (lock-free, MPMC) of `Arc`s of the
//! table's nodes, so a popped node is always valid; entries are queued only once their value
//! is published, so an entry being built is never evicted. Removal from the table does not
//! touch the queues: dead entries are skipped when popped, and compacted away when they
//! outnumber the live ones.

use crate::sync::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use crossbeam_queue::SegQueue;

/// The highest frequency an entry records.
const MAX_FREQ: u8 = 3;

/// Per-entry policy state, kept in the table's node.
#[derive(Debug)]
pub(crate) struct EntryMeta {
    freq: AtomicU8,
    /// The weight the entry had when it joined its queue.
    weight: AtomicU64,
}

impl EntryMeta {
    pub(crate) fn new() -> Self {
        Self {
            freq: AtomicU8::new(0),
            weight: AtomicU64::new(0),
        }
    }

    /// Records a hit: raises the frequency unless it is already at the maximum, so a hot
    /// entry's hits write nothing.
    #[inline]
    pub(crate) fn touch(&self) {
        // Relaxed: a frequency hint; a lost update only costs precision.
        let f = self.freq.load(Ordering::Relaxed);
        if f < MAX_FREQ {
            self.freq.store(f + 1, Ordering::Relaxed);
        }
    }

    fn freq(&self) -> u8 {
        // Relaxed: see `touch`.
        self.freq.load(Ordering::Relaxed)
    }

    fn set_freq(&self, f: u8) {
        // Relaxed: see `touch`.
        self.freq.store(f, Ordering::Relaxed);
    }

    fn weight(&self) -> u64 {
        // Relaxed: a queue-size hint.
        self.weight.load(Ordering::Relaxed)
    }
}

/// What the policy needs to know about a queued entry.
pub(crate) trait Queued {
    fn meta(&self) -> &EntryMeta;
    /// The entry's hash (for the ghost).
    fn hash(&self) -> u64;
    /// Whether the entry still holds a cached value.
    fn is_cached(&self) -> bool;
    /// The entry's identity (its address), for [`S3Fifo::validate`].
    fn id(&self) -> usize;
}

/// The S3-FIFO queues of one cache.
pub(crate) struct S3Fifo<T> {
    small: SegQueue<T>,
    main: SegQueue<T>,
    small_weight: AtomicU64,
    main_weight: AtomicU64,
    ghost: Box<[AtomicU64]>,
    admitted: AtomicUsize,
    compacting: AtomicBool,
}

impl<T: Queued> S3Fifo<T> {
    /// Queues for a cache expected to hold about `entries` entries (sizes the ghost).
    pub(crate) fn new(entries: usize) -> Self {
        let ghost = entries.clamp(64, 1 << 20).next_power_of_two();
        Self {
            small: SegQueue::new(),
            main: SegQueue::new(),
            small_weight: AtomicU64::new(0),
            main_weight: AtomicU64::new(0),
            ghost: (0..ghost).map(|_| AtomicU64::new(0)).collect(),
            admitted: AtomicUsize::new(0),
            compacting: AtomicBool::new(false),
        }
    }

    fn ghost_slot(&self, hash: u64) -> &AtomicU64 {
        &self.ghost[(hash as usize) & (self.ghost.len() - 1)]
    }

    /// Queues an entry whose value was just published with `weight`.
    pub(crate) fn admit(&self, entry: T, weight: u64, live: impl FnOnce() -> usize) {
        let meta = entry.meta();
        // Relaxed: a queue-size hint.
        meta.weight.store(weight, Ordering::Relaxed);
        meta.set_freq(0);
        // The ghost is direct-mapped and lossy: a collision only costs a misplaced entry.
        // Relaxed: a hint.
        let remembered = self.ghost_slot(entry.hash()).load(Ordering::Relaxed) == entry.hash();
        if remembered {
            push(&self.main, &self.main_weight, entry);
        } else {
            push(&self.small, &self.small_weight, entry);
        }
        // Relaxed: only paces the compaction check.
        if self.admitted.fetch_add(1, Ordering::Relaxed) % 64 == 63 {
            self.compact_if_needed(live());
        }
    }

    /// Pops the next entry to evict under `capacity`, or `None` when no queued entry holds a
    /// value. The caller removes it from the table (which may fail if another thread removed
    /// it first; then it asks again).
    pub(crate) fn victim(&self, capacity: u64) -> Option<T> {
        // Every entry can be passed over at most MAX_FREQ + 1 times before it is evicted, so
        // this bound only stops a pass that other threads keep refilling.
        let bound = 4 * (self.small.len() + self.main.len()) + 16;
        for _ in 0..bound {
            // Relaxed: queue-size hints.
            let small_heavy = self.small_weight.load(Ordering::Relaxed) >= capacity / 10;
            if small_heavy || self.main.is_empty() {
                if let Some(e) = pop(&self.small, &self.small_weight) {
                    if !e.is_cached() {
                        continue;
                    }
                    if e.meta().freq() > 0 {
                        e.meta().set_freq(0);
                        push(&self.main, &self.main_weight, e);
                        continue;
                    }
                    // Relaxed: a hint.
                    self.ghost_slot(e.hash()).store(e.hash(), Ordering::Relaxed);
                    return Some(e);
                }
            }
            match pop(&self.main, &self.main_weight) {
                Some(e) => {
                    if !e.is_cached() {
                        continue;
                    }
                    let f = e.meta().freq();
                    if f > 0 {
                        e.meta().set_freq(f - 1);
                        push(&self.main, &self.main_weight, e);
                        continue;
                    }
                    return Some(e);
                }
                None if self.small.is_empty() => return None,
                None => {}
            }
        }
        None
    }

    /// Drops queued entries that no longer hold a value once they outnumber the live ones.
    /// One thread at a time compacts; the others skip it (nobody waits).
    fn compact_if_needed(&self, live: usize) {
        let queued = self.small.len() + self.main.len();
        if queued <= 2 * live + 1024 {
            return;
        }
        // Acquire/Release: the flag only elects one compactor; it guards no data.
        if self
            .compacting
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        for (queue, weight) in [
            (&self.small, &self.small_weight),
            (&self.main, &self.main_weight),
        ] {
            for _ in 0..queue.len() {
                let Some(e) = pop(queue, weight) else { break };
                if e.is_cached() {
                    push(queue, weight, e);
                }
            }
        }
        // Release: pairs with the Acquire of the next compactor's election.
        self.compacting.store(false, Ordering::Release);
    }

    /// Checks the queues' bookkeeping; for quiet caches only (tests and fuzzing). Every
    /// queue's weight total equals the weights of its entries and no entry is queued twice.
    /// Returns the ids of the queued entries that still hold a value.
    ///
    /// The queues are emptied and refilled in their order, so nothing about the policy's
    /// state changes.
    pub(crate) fn validate(&self) -> Result<Vec<usize>, String> {
        let mut seen = std::collections::HashSet::new();
        let mut live = Vec::new();
        for (name, queue, total) in [
            ("small", &self.small, &self.small_weight),
            ("main", &self.main, &self.main_weight),
        ] {
            let mut entries = Vec::with_capacity(queue.len());
            while let Some(e) = queue.pop() {
                entries.push(e);
            }
            let mut sum = 0u64;
            let mut twice = None;
            for e in &entries {
                sum += e.meta().weight();
                if !seen.insert(e.id()) {
                    twice = Some(e.hash());
                }
                if e.is_cached() {
                    live.push(e.id());
                }
            }
            for e in entries {
                queue.push(e);
            }
            if let Some(hash) = twice {
                return Err(format!("the entry with hash {hash:#x} is queued twice"));
            }
            // Relaxed: the cache is quiet.
            let recorded = total.load(Ordering::Relaxed);
            if recorded != sum {
                return Err(format!(
                    "the {name} queue records weight {recorded}, its entries weigh {sum}"
                ));
            }
        }
        Ok(live)
    }

    /// Entries in the queues (live or waiting to be skipped).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.small.len() + self.main.len()
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool as StdBool;
    use std::sync::Arc;

    struct Entry {
        hash: u64,
        meta: EntryMeta,
        cached: StdBool,
    }

    impl Queued for Arc<Entry> {
        fn meta(&self) -> &EntryMeta {
            &self.meta
        }
        fn hash(&self) -> u64 {
            self.hash
        }
        fn is_cached(&self) -> bool {
            self.cached.load(Ordering::Relaxed)
        }
        fn id(&self) -> usize {
            Arc::as_ptr(self) as usize
        }
    }

    fn entry(hash: u64) -> Arc<Entry> {
        Arc::new(Entry {
            hash,
            meta: EntryMeta::new(),
            cached: StdBool::new(true),
        })
    }

    #[test]
    fn one_hit_wonders_leave_first_and_hit_entries_are_promoted() {
        let p = S3Fifo::new(64);
        let hot = entry(1);
        p.admit(hot.clone(), 1, || 1);
        hot.meta.touch();
        for h in 2..10 {
            p.admit(entry(h), 1, || 1);
        }
        // Capacity 10: the small queue is "heavy", so victims come from it, in FIFO order,
        // skipping (and promoting) the entry that was hit.
        let v = p.victim(10).unwrap();
        assert_eq!(v.hash, 2);
        // The evicted hash is in the ghost: re-admitting it goes to the main queue.
        p.admit(entry(2), 1, || 1);
        assert_eq!(p.main.len(), 2, "the promoted hot entry and the ghost hit");
    }

    #[test]
    fn frequency_saturates_and_main_queue_gives_second_chances() {
        let p = S3Fifo::new(64);
        let e = entry(7);
        p.admit(e.clone(), 1, || 1);
        for _ in 0..10 {
            e.meta.touch();
        }
        assert_eq!(e.meta.freq(), MAX_FREQ);
        // Only entry: it is promoted, then passed over MAX_FREQ times, then evicted.
        let v = p.victim(1).unwrap();
        assert_eq!(v.hash, 7);
        assert!(p.victim(1).is_none());
    }

    #[test]
    fn dead_entries_are_skipped_and_compacted() {
        let p = S3Fifo::new(64);
        let entries: Vec<_> = (0..3000).map(entry).collect();
        for e in &entries {
            e.cached.store(false, Ordering::Relaxed);
        }
        for e in &entries {
            p.admit(e.clone(), 1, || 0);
        }
        assert!(
            p.queued() < 3000,
            "compaction dropped dead entries: {}",
            p.queued()
        );
        assert!(p.victim(100).is_none(), "no live entry to evict");
        assert_eq!(p.queued(), 0);
    }
}

/// Pops a queue's oldest entry and takes its weight off the queue's total.
fn pop<T: Queued>(queue: &SegQueue<T>, total: &AtomicU64) -> Option<T> {
    let e = queue.pop()?;
    let w = e.meta().weight();
    // Relaxed: a queue-size hint; saturating, since the totals are hints too.
    let _ = total.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
        Some(t.saturating_sub(w))
    });
    Some(e)
}

/// Appends an entry to a queue and adds its weight to the queue's total.
fn push<T: Queued>(queue: &SegQueue<T>, total: &AtomicU64, e: T) {
    // Relaxed: a queue-size hint.
    total.fetch_add(e.meta().weight(), Ordering::Relaxed);
    queue.push(e);
}
