//! The consistency check of a quiet cache that the tests and the fuzz targets run between
//! operations, and the table counters the growth tests read.

#![forbid(unsafe_code)]

use super::counter::Counter;
use super::node::{Node, View};
use super::RawCache;
use std::hash::{BuildHasher, Hash};

impl<K, V, S> RawCache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// Checks every invariant that a quiet cache can show (tests and fuzzing call it between
    /// operations, never during one):
    /// - each shard's tables: every live node is found from its hash, none is frozen, and a
    ///   table's claim count is exact (I2, H1–H4); no node is still loading (I4);
    /// - no two cached nodes hold the same key, and the threads' live counts add up to the
    ///   cached entries (`len`);
    /// - the budget's size is the sum of the cached weights and within the capacity (I5);
    /// - with eviction: the queues' totals are exact, no entry is queued twice or without
    ///   its claim, and the cached entries claimed for the queues are exactly the queued
    ///   entries that hold a value (P1; the others wait for the sweep, P2).
    pub(crate) fn validate(&self) -> Result<(), String> {
        let pin = self.pin();
        let mut claimed = std::collections::HashSet::new();
        let mut keys = std::collections::HashSet::new();
        let mut weight = 0u64;
        let mut problem = None;
        let mut live = 0usize;
        for (i, shard) in self.shards.iter().enumerate() {
            shard
                .validate(&pin.guard)
                .map_err(|e| format!("shard {i}: {e}"))?;
            shard.for_each(&pin.guard, |n| {
                match n.view(&pin.guard) {
                    View::Ready { node, .. } => {
                        live += 1;
                        weight += node.acquired_weight();
                        // Only claimed entries are queued (P1); the others wait for the
                        // policy's sweep (P2).
                        if node.meta().is_claimed() {
                            claimed.insert(node as *const Node<K, V> as usize);
                            if node.acquired_weight() == 0 {
                                problem =
                                    Some(format!("shard {i}: a weightless entry is queued (I8)"));
                            }
                        }
                        if !keys.insert(node.key()) {
                            problem = Some(format!("shard {i}: a key is cached twice"));
                        }
                    }
                    View::Loading => {
                        problem = Some(format!("shard {i}: an entry is loading in a quiet cache"));
                    }
                    View::Dead => {}
                }
                problem.is_none()
            });
            if let Some(p) = problem.take() {
                return Err(p);
            }
        }
        // Read in a quiet cache, where the threads' counts are exact.
        let counted = self.stat(Counter::Live);
        if counted != live as u64 {
            return Err(format!(
                "the threads count {} live entries and the tables hold {live}",
                counted as i64
            ));
        }
        let (size, capacity) = self.budget.snapshot();
        if size != weight {
            return Err(format!(
                "the budget records weight {size}, the cached entries weigh {weight}"
            ));
        }
        if size > capacity {
            return Err(format!("weighted size {size} is above capacity {capacity}"));
        }
        if let Some(policy) = &self.policy {
            let queued: std::collections::HashSet<usize> = policy.validate()?.into_iter().collect();
            if queued != claimed {
                let unqueued = claimed.difference(&queued).count();
                let stale = queued.difference(&claimed).count();
                return Err(format!(
                    "{unqueued} cached entries claimed for the queues are in none (P1); \
                     {stale} queued entries that hold a value are not in the table"
                ));
            }
        }
        Ok(())
    }

    /// Table slots over every shard (for growth tests).
    pub(crate) fn slots(&self) -> usize {
        let pin = self.pin();
        self.shards.iter().map(|s| s.slots(&pin.guard)).sum()
    }

    /// Table migrations finished over every shard (for growth tests).
    pub(crate) fn migrations(&self) -> usize {
        self.shards.iter().map(|s| s.migrations()).sum()
    }
}
