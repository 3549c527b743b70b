//! The queues' upkeep: the compaction of entries removed from the table that still sit in
//! a queue, and the bookkeeping check of a quiet cache.

use super::{uncount, EvictionPolicy, Queued, COMPACT_STEP};
#[cfg(test)]
use crate::sync::Queue;
use crate::sync::{AtomicUsize, Ordering};

impl<T: Queued> EvictionPolicy<T> {
    /// Whether a compaction round is under way.
    pub(super) fn compacting(&self) -> bool {
        // Relaxed: a hint; a step that finds nothing left to claim does nothing.
        self.compact_left
            .iter()
            .any(|left| left.load(Ordering::Relaxed) != 0)
    }

    /// Starts a compaction round once queued entries outnumber the live ones by more than
    /// 2× + 1024: every entry queued now is looked at once, [`COMPACT_STEP`] per admission
    /// (this one's first), and dropped if it no longer holds a value, the live ones going
    /// back to the tail of their queue. Spread so, a round costs no admission more than a
    /// step, where one admission looking at every queued entry stalled for milliseconds
    /// (`docs/EXPERIMENTS.md`).
    pub(super) fn compact(&self, live: usize) {
        let queued = [self.small.len(), self.front.len(), self.main.len()];
        if queued.iter().sum::<usize>() <= 2 * live + 1024 {
            return;
        }
        for (left, n) in self.compact_left.iter().zip(queued) {
            // Relaxed: a count of work to claim; a round started twice at once only looks
            // at the entries once more.
            let _ = left.compare_exchange(0, n, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.compact_step();
    }

    /// One step of the compaction round: claims up to [`COMPACT_STEP`] entries still to look
    /// at, the small queue's first, and looks at that many. Steps of several threads run
    /// side by side (each pop and push is the queue's own).
    pub(super) fn compact_step(&self) {
        let mut budget = COMPACT_STEP;
        for (i, (queue, weight)) in [
            (&self.small, &self.small_weight),
            (&self.front, &self.main_weight),
            (&self.main, &self.main_weight),
        ]
        .into_iter()
        .enumerate()
        {
            let claimed = claim(&self.compact_left[i], budget);
            budget -= claimed;
            // A live entry keeps counting while it passes through (see `main_victim`).
            for _ in 0..claimed {
                let Some(e) = queue.pop() else { break };
                if e.is_cached() {
                    queue.push(e);
                } else {
                    uncount(weight, &e);
                }
            }
            if budget == 0 {
                return;
            }
        }
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
        // The main queue's head (`front`) and body share one weight total.
        let mut small = vec![&self.small];
        small.extend(self.staged.get().into_iter().flat_map(|s| s.iter()));
        for (name, queues, total) in [
            ("small", &small[..], &self.small_weight),
            ("main", &[&self.front, &self.main][..], &self.main_weight),
        ] {
            let mut sum = 0u64;
            let mut twice = None;
            let mut unclaimed = None;
            for queue in queues {
                let mut entries = Vec::with_capacity(queue.len());
                while let Some(e) = queue.pop() {
                    entries.push(e);
                }
                for e in &entries {
                    sum += e.weight();
                    if !seen.insert(e.id()) {
                        twice = Some(e.hash());
                    }
                    if !e.meta().is_claimed() {
                        unclaimed = Some(e.hash());
                    }
                    if e.is_cached() {
                        live.push(e.id());
                    }
                }
                for e in entries {
                    queue.push(e);
                }
            }
            if let Some(hash) = twice {
                return Err(format!("the entry with hash {hash:#x} is queued twice"));
            }
            if let Some(hash) = unclaimed {
                return Err(format!(
                    "the entry with hash {hash:#x} is queued without its claim (P1)"
                ));
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
        let staged: usize = self
            .staged
            .get()
            .map_or(0, |s| s.iter().map(Queue::len).sum());
        self.small.len() + staged + self.main.len() + self.front.len()
    }
}

/// Takes up to `most` from `left` (a count of work other threads take from too); returns
/// what it took.
fn claim(left: &AtomicUsize, most: usize) -> usize {
    // Relaxed: a count of work; the queue's own operations order the entries.
    let mut now = left.load(Ordering::Relaxed);
    loop {
        let take = now.min(most);
        if take == 0 {
            return 0;
        }
        match left.compare_exchange_weak(now, now - take, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return take,
            Err(actual) => now = actual,
        }
    }
}
