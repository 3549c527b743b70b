//! Walks over every shard: iteration, `retain`, `clear` and the table-order removals of a
//! rejecting cache's shrink. Each shard is walked as [`Shard::walk`](super::table::Shard::walk) describes, so an entry
//! cached throughout is met exactly once (H1, H2).

#![forbid(unsafe_code)]

use super::counter::Counter;
use super::node::View;
use super::write::Take;
use super::{Pin, RawCache, RemovalCause};
use std::hash::{BuildHasher, Hash};

impl<K, V, S> RawCache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// Removes every cached entry; returns how many this call removed.
    pub(crate) fn clear(&self) -> usize {
        let removed = self.remove_while(RemovalCause::Cleared, false, || true);
        self.passing_on(removed)
    }

    /// Removes cached entries, in table order, while `more()` says so.
    pub(super) fn remove_while(
        &self,
        cause: RemovalCause,
        weighed: bool,
        mut more: impl FnMut() -> bool,
    ) -> usize {
        let pin = self.pin();
        let mut removed = 0;
        'shards: for shard in self.shards.iter() {
            for node in shard.walk(&pin.guard) {
                if !more() {
                    break 'shards;
                }
                // A shrink's removals skip what weighs nothing (I8).
                if weighed && node.weight() == 0 {
                    continue;
                }
                if self
                    .take_if(node, shard, &pin, Take::key(cause), |_| true)
                    .is_some()
                {
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            self.domain.pending().hand_over(&pin.guard);
        }
        removed
    }

    /// The cached entries, shard by shard, each shard walked as [`Shard::walk`](super::table::Shard::walk) describes:
    /// an entry cached throughout is yielded exactly once. Reads only, except that a shard's
    /// migration in flight is finished when the walk reaches it.
    pub(crate) fn entries<'g>(&'g self, pin: &'g Pin<'_>) -> impl Iterator<Item = (&'g K, &'g V)> {
        self.shards
            .iter()
            .flat_map(move |shard| shard.walk(&pin.guard))
            .filter_map(move |node| match node.view(&pin.guard) {
                View::Ready { node, value } if !self.expired(node) => Some((node.key(), value)),
                _ => None,
            })
    }

    /// Removes every cached entry that `keep` refuses; returns how many this call removed.
    /// An entry replaced after `keep` saw it is kept (its new value was not asked about).
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) -> usize {
        let pin = self.pin();
        let mut removed = 0;
        for shard in self.shards.iter() {
            for node in shard.walk(&pin.guard) {
                let View::Ready { node, value } = node.view(&pin.guard) else {
                    continue;
                };
                // An expired entry is not asked about: the wheel takes it out.
                if self.expired(node) {
                    continue;
                }
                if keep(node.key(), value) {
                    continue;
                }
                // Not following forwards: a replacement's value was not shown to `keep`. A
                // cell holds a value at most once, so a value still in it is the one shown.
                let taken =
                    self.take_if(node, shard, &pin, Take::node(RemovalCause::Removed), |_| {
                        true
                    });
                if taken.is_some() {
                    pin.stats.bump(Counter::Removal);
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            self.domain.pending().hand_over(&pin.guard);
        }
        self.passing_on(removed)
    }
}
