//! Room for a new entry: reserving its weight, evicting the policy's victims when it does
//! not fit (a victim's weight passes straight to the newcomer), admitting a published entry
//! to the policy, and capacity changes, whose shrinks evict in policy order (or in a caller's
//! rank order) until the rest fits (I5).

#![forbid(unsafe_code)]

use super::counter::{Counter, StatsBlock};
use super::node::{hold, Node, NodeRef, View};
use super::write::Take;
use super::{RawCache, RemovalCause, Room};
use crate::policy::{Door, EvictionPolicy};
use crate::sync::{yield_now, AtomicBool, AtomicUsize, Ordering};
use crossbeam_epoch::Guard;
use std::hash::{BuildHasher, Hash};

/// Slots one step of the policy's sweep looks at (see `RawCache::sweep_step`).
const SWEEP_STEP: usize = if cfg!(runcache_loom) { 2 } else { 32 };

/// How many times a newcomer that finds nothing to evict yields and looks again before it is
/// handed back uncached: what holds the room then is other threads' work in flight (victims
/// they popped and are deciding, newcomers between their reservation and their queue), which
/// ends in a moment. More keeps more small-cache misses cached under contention; fewer hands
/// them back sooner (each try is a yield). One in the loom models, whose schedules explore
/// every retry.
const ROOM_PATIENCE: u32 = if cfg!(runcache_loom) { 1 } else { 16 };

/// The progress of the sweep that enlists the entries a cold cache admitted (P2).
pub(super) struct Sweep {
    /// Steps handed out: step `n` covers shard `n % shards`, slots from `n / shards` steps in.
    next: AtomicUsize,
    /// Every shard's root table was swept past its end.
    done: AtomicBool,
    /// A whole walk of the tables enlisted every cached entry after the queueing switch was
    /// on: since then every admission claims its own entry, so nothing is outside the
    /// queues and the evictors stop looking for what the sweep missed (P2).
    settled: AtomicBool,
}

impl Sweep {
    pub(super) fn new() -> Self {
        Self {
            next: AtomicUsize::new(0),
            done: AtomicBool::new(false),
            settled: AtomicBool::new(false),
        }
    }

    fn claim(&self) -> usize {
        // Relaxed: a count of work; the slots' own loads order what is read.
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn done(&self) -> bool {
        // Relaxed: a hint; a late reader only takes a step that finds nothing.
        self.done.load(Ordering::Relaxed)
    }

    fn finish(&self) {
        // Relaxed: as in `done`.
        self.done.store(true, Ordering::Relaxed);
    }

    fn settled(&self) -> bool {
        // Relaxed: a hint; a late reader only takes one more whole walk.
        self.settled.load(Ordering::Relaxed)
    }

    fn settle(&self) {
        // Relaxed: as in `settled`.
        self.settled.store(true, Ordering::Relaxed);
        self.finish();
    }
}

/// Enlists `node`'s entry in the policy's queues if it holds a cached value of some weight
/// and was never queued (P1); whether it was queued here. An entry of weight 0 is never
/// queued (I8).
fn enlist<K, V>(policy: &EvictionPolicy<NodeRef<K, V>>, node: &Node<K, V>, guard: &Guard) -> bool {
    match node.view(guard) {
        // The node that holds the value: this one, or its replacement.
        View::Ready { node, .. } if node.acquired_weight() > 0 => {
            policy.enlist(node.meta(), || hold(node))
        }
        View::Ready { .. } => false,
        View::Loading | View::Dead => false,
    }
}

/// The entries `capacity` holds at the mean weight of the `len` entries that weigh `size`
/// together (**P4**: the policy sizes its sketch and ghost for them before the cache's first
/// eviction); `None` when nothing is cached to tell by. Rounded down, and at least 1.
fn held(capacity: u64, size: u64, len: usize) -> Option<u64> {
    if size == 0 || len == 0 {
        return None;
    }
    let held = u128::from(capacity) * len as u128 / u128::from(size);
    Some(u64::try_from(held).unwrap_or(u64::MAX).max(1))
}

impl<K, V, S> RawCache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// Reserves `weight` for a newcomer of `hash` (`None` for the growth of a replaced
    /// entry); when it does not fit and the cache evicts, makes room: a newcomer heavier than
    /// the small queue's room is judged at the policy's door first (**P10**), and otherwise,
    /// or if the door does not judge it, the policy's victims are evicted in their order
    /// until it fits. An entry heavier than the whole capacity is refused without evicting
    /// anything. In a cache that expires entries, a step of the timer wheel comes first, so
    /// that room held by expired entries is given before live ones are evicted or the
    /// newcomer is refused.
    ///
    /// A victim's weight passes straight to the newcomer, as much of it as the newcomer still
    /// needs: it never leaves the weighted size, so the size stays within the capacity, and an
    /// eviction that makes room for an entry of the same weight writes the budget not at all
    /// (rather than a release and a reservation, two compare-and-swaps on the cache's most
    /// contended word).
    pub(super) fn reserve(&self, weight: u64, hash: Option<u64>, stats: &StatsBlock) -> Room {
        // Weight taken over from victims so far; it counts in the size like a reservation.
        let mut held = 0;
        let mut door = hash;
        let mut judged = false;
        let mut patience = ROOM_PATIENCE;
        // Expired entries give their room first: before anything live is evicted, and in a
        // rejecting cache, which has nothing else to free.
        let mut expired_first = self.expires();
        loop {
            // (A weight of 0 still asks the budget, which refuses everything at capacity 0.)
            if (held > 0 && held == weight) || self.budget.try_reserve(weight - held) {
                return if judged { Room::Judged } else { Room::Made };
            }
            if std::mem::take(&mut expired_first) && self.expire_for_room() {
                continue;
            }
            let Some(policy) = &self.policy else {
                return Room::Refused;
            };
            let capacity = self.budget.capacity();
            if capacity == 0 || weight > capacity {
                self.budget.release(held);
                return Room::Refused;
            }
            if let Some(hash) = door
                .take()
                .filter(|_| policy.may_be_heavy(weight, capacity))
            {
                let free = capacity.saturating_sub(self.budget.size());
                match policy.door(hash, weight, weight.saturating_sub(free), capacity) {
                    Door::Open => {}
                    Door::Refuse => return Room::Turned,
                    Door::Admit(victims) => {
                        judged = true;
                        held += self.evict_judged(victims, weight - held, capacity, stats);
                        continue;
                    }
                }
            }
            match self.evict_one(policy, capacity, weight - held) {
                Some(kept) => {
                    held += kept;
                    stats.bump(Counter::Eviction);
                }
                None if patience > 0 => {
                    patience -= 1;
                    yield_now();
                }
                None => {
                    self.budget.release(held);
                    return Room::Refused;
                }
            }
        }
    }

    /// Evicts the victims a newcomer outcounted at the door (**P10**), keeping up to `keep`
    /// of their weight reserved for it; returns the weight kept. A victim removed meanwhile
    /// by someone else gives nothing.
    /// (It repeats `evict_one`'s take of a victim: one helper for both cost that miss path
    /// its inlining, `docs/EXPERIMENTS.md`.)
    fn evict_judged(
        &self,
        victims: Vec<NodeRef<K, V>>,
        mut keep: u64,
        capacity: u64,
        stats: &StatsBlock,
    ) -> u64 {
        let pin = self.pin();
        let mut kept_all = 0;
        for v in victims {
            let kept = keep.min(v.weight());
            let how = Take::node(RemovalCause::Capacity).keeping(kept);
            if let Some((weight, _)) = self.take_if(&v, self.shard(v.hash), &pin, how, |_| true) {
                keep -= kept;
                kept_all += kept;
                stats.bump(Counter::Eviction);
                self.retired(&pin, weight, capacity);
            }
        }
        kept_all
    }

    /// Evicts the policy's next victim, keeping up to `keep` of its weight reserved for the
    /// caller (the rest is released); returns the weight kept, or `None` when nothing is left
    /// to evict (every entry is being built, say).
    ///
    /// When the queues give no victim, the cached entries that were never queued (admitted
    /// while the cache was cold, and not reached by the sweep yet, P2) are enlisted by a
    /// sweep of every table, and the queues asked once more.
    pub(super) fn evict_one(
        &self,
        policy: &EvictionPolicy<NodeRef<K, V>>,
        capacity: u64,
        keep: u64,
    ) -> Option<u64> {
        policy.prepare(|| {
            let (size, capacity) = self.budget.snapshot();
            held(capacity, size, self.len())
        });
        let pin = self.pin();
        if policy.adapt_due() {
            let hits = self.stat(Counter::Hit);
            policy.adapt(hits, hits.wrapping_add(self.stat(Counter::Miss)));
        }
        // Entries the step-wise sweep missed stay outside the queues, where no evictor finds
        // them: an early eviction whose queues are short of the cache (the small queue
        // empty, or the queues' weights below the cached weight) walks the tables once to
        // enlist them before it takes a victim, until one such walk settles the matter (P2).
        let mut swept = false;
        if !self.sweep.settled() && policy.short_of(self.budget.size()) {
            swept = true;
            self.enlist_all(policy, &pin.guard);
        }
        loop {
            while let Some(node) = policy.victim(capacity) {
                let shard = self.shard(node.hash);
                let kept = keep.min(node.weight());
                let how = Take::node(RemovalCause::Capacity).keeping(kept);
                if let Some((weight, _)) = self.take_if(&node, shard, &pin, how, |_| true) {
                    self.retired(&pin, weight, capacity);
                    return Some(kept);
                }
            }
            if swept {
                return None;
            }
            swept = true;
            if !self.enlist_all(policy, &pin.guard) {
                return None;
            }
        }
    }

    /// Enlists every cached entry that was never queued, walking every table (P2); whether
    /// it enlisted any. A walk that began with the queueing switch on settles the sweep:
    /// whatever it did not meet was admitted after it began, by an admission that claimed
    /// its entry itself.
    fn enlist_all(&self, policy: &EvictionPolicy<NodeRef<K, V>>, guard: &Guard) -> bool {
        let queueing = policy.queueing();
        // `walk` finishes a migration in flight first, so every cached entry is in the
        // table it walks; `|` (not `||`) so that the sweep goes on past the first.
        let enlisted = self
            .shards
            .iter()
            .flat_map(|shard| shard.walk(guard))
            .fold(false, |any, n| enlist(policy, n, guard) | any);
        if queueing {
            self.sweep.settle();
        }
        enlisted
    }

    /// Hands a node whose value was just published to the policy, unless it weighs 0: such
    /// an entry frees nothing if evicted, so the policy never sees it and only a removal, a
    /// replacement, `clear`, `retain` or a capacity of 0 takes it out (I8). `room` says how
    /// its room was made: a newcomer that won at the door joins the main queue (**P10**).
    #[inline]
    pub(super) fn admit(&self, node: &Node<K, V>, room: Room) {
        if node.weight() == 0 {
            return;
        }
        let judged = room == Room::Judged;
        if let Some(policy) = self.admission(node, judged) {
            self.enqueue(policy, hold(node), judged);
        }
    }

    /// Records a node's admission; the policy if the node is to be queued (P2).
    fn admission(&self, node: &Node<K, V>, judged: bool) -> Option<&EvictionPolicy<NodeRef<K, V>>> {
        let policy = self.policy.as_ref()?;
        let (size, capacity) = self.budget.snapshot();
        policy
            .admit_at(node.meta(), node.hash, size, capacity, judged)
            .then_some(policy)
    }

    /// Queues an admitted node, and while the sweep that enlists the entries admitted cold
    /// is under way, takes a step of it.
    fn enqueue(&self, policy: &EvictionPolicy<NodeRef<K, V>>, node: NodeRef<K, V>, judged: bool) {
        policy.enqueue(node, judged, || self.len());
        if !self.sweep.done() {
            self.sweep_step(policy);
        }
    }

    /// One step of the sweep that enlists the entries a cold cache admitted without queueing
    /// them (P2): [`SWEEP_STEP`] slots of one shard's root table, the shards taken in turn,
    /// so that the sweep is over before the cache can fill (a half-full cache has at least
    /// two slots per entry it can still admit before it is full, and each admission sweeps
    /// sixteen times that). Entries the sweep misses (a table migrating under it, an
    /// admission that read the switch late) are enlisted by the fallback in
    /// [`evict_one`](Self::evict_one).
    fn sweep_step(&self, policy: &EvictionPolicy<NodeRef<K, V>>) {
        let n = self.sweep.claim();
        let shards = self.shards.len();
        let start = (n / shards).saturating_mul(SWEEP_STEP);
        let pin = self.pin();
        let within = self.shards[n % shards].visit(start, SWEEP_STEP, &pin.guard, |node| {
            enlist(policy, node, &pin.guard);
        });
        if !within && self.shards.iter().all(|s| s.slots(&pin.guard) <= start) {
            self.sweep.finish();
        }
    }

    /// Changes the capacity; a shrink evicts in policy order (or, without a policy, in table
    /// order) until the rest fits: never a full flush. `Err((target, capacity))` if weight
    /// that nothing can evict kept the capacity above the target (`Budget::set_capacity`).
    pub(crate) fn set_capacity(&self, capacity: u64) -> Result<(), (u64, u64)> {
        let shrunk = self.shrink(capacity, |target| match &self.policy {
            Some(policy) => {
                let mut n = 0;
                while self.budget.size() > target && self.evict_one(policy, target, 0).is_some() {
                    n += 1;
                }
                n
            }
            None => self.remove_while(RemovalCause::Capacity, true, || self.budget.size() > target),
        });
        self.passing_on(shrunk)
    }

    /// Changes the capacity; a shrink removes cached entries in ascending `rank` order.
    /// `Err` as [`set_capacity`](Self::set_capacity).
    pub(crate) fn set_capacity_ranked<R: Ord>(
        &self,
        capacity: u64,
        mut rank: impl FnMut(&K, &V) -> R,
    ) -> Result<(), (u64, u64)> {
        let shrunk = self.shrink(capacity, |target| {
            let pin = self.pin();
            let mut ranked = Vec::new();
            for shard in self.shards.iter() {
                for node in shard.walk(&pin.guard) {
                    match node.view(&pin.guard) {
                        // Weightless entries free nothing (I8).
                        View::Ready { node, value } if node.acquired_weight() > 0 => {
                            ranked.push((rank(node.key(), value), node, &**shard));
                        }
                        _ => {}
                    }
                }
            }
            ranked.sort_by(|a, b| a.0.cmp(&b.0));
            let mut removed = 0;
            for (_, node, shard) in ranked {
                if self.budget.size() <= target {
                    break;
                }
                let taken = self
                    .take_if(
                        node,
                        shard,
                        &pin,
                        Take::node(RemovalCause::Capacity),
                        |_| true,
                    )
                    .is_some();
                removed += usize::from(taken);
            }
            if removed > 0 {
                self.domain.pending().hand_over(&pin.guard);
            }
            removed
        });
        self.passing_on(shrunk)
    }

    /// The shared part of a capacity change; `evict(target)` removes entries and says how
    /// many (the target in force, which a later call may have set).
    pub(super) fn shrink(
        &self,
        capacity: u64,
        mut evict: impl FnMut(u64) -> usize,
    ) -> Result<(), (u64, u64)> {
        let stats = self.pin().stats;
        self.budget.set_capacity(capacity, |target| {
            let n = evict(target);
            stats.bump_by(Counter::Eviction, n as u64);
            n > 0
        })?;
        if self.budget.capacity() == 0 {
            // Zero-weight entries cost nothing, so the loop above may leave them; a disabled
            // cache holds nothing. New ones cannot land: no reservation succeeds at capacity 0.
            let n = self.remove_while(RemovalCause::Capacity, false, || true);
            stats.bump_by(Counter::Eviction, n as u64);
        }
        Ok(())
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::held;
    use crate::raw::RawCache;
    use std::collections::hash_map::RandomState;

    /// Entries admitted while the cache was cold and missed by the step-wise sweep (a table
    /// migrating under it does that; here the sweep is ended before it starts) must still
    /// reach the queues once the cache evicts: otherwise no evictor ever finds them, and
    /// they hold their room for good while the entries in use are evicted instead.
    #[test]
    fn entries_the_sweep_missed_are_still_evicted() {
        let c = RawCache::<u64, u64, _>::new(8, 1_000, RandomState::new(), None, None, true, None);
        c.sweep.finish();
        for k in 0..500 {
            assert!(c.insert(k, k, false, None).is_ok());
        }
        let used = 1_000..2_000u64;
        let mut hits = 0;
        for _ in 0..20 {
            hits = 0;
            for k in used.clone() {
                let found = c.get(&k, &c.pin()).is_some();
                if found {
                    hits += 1;
                } else {
                    assert!(c.insert(k, k, false, None).is_ok());
                }
            }
        }
        let stale = (0..500).filter(|k| c.get(k, &c.pin()).is_some()).count();
        assert!(stale <= 10, "{stale} of 500 unused entries kept their room");
        assert!(hits >= 950, "only {hits} of 1,000 entries in use hit");
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn held_scales_the_capacity_by_the_mean_weight() {
        assert_eq!(held(100, 50, 50), Some(100), "weight 1");
        assert_eq!(held(1_000, 500, 5), Some(10), "weight 100");
        assert_eq!(held(1_000, 600, 3), Some(5), "rounded down");
        assert_eq!(held(10, 10, 1), Some(1));
        assert_eq!(held(1, 1_000, 1), Some(1), "at least 1");
        assert_eq!(held(100, 0, 5), None, "weightless entries tell nothing");
        assert_eq!(held(100, 50, 0), None, "nothing cached");
        assert_eq!(held(u64::MAX, 1, usize::MAX), Some(u64::MAX), "saturates");
    }
}
