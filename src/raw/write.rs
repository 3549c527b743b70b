//! Writes: insert and replace (a replacement forwards the old node to the new one in one CAS),
//! removal by key, and [`take_if`](RawCache::take_if), the one place a value leaves a node,
//! whoever takes it (remove, evict, clear, retain). Also where retired values are handed to
//! the epoch collector (I5, I6).

#![allow(unsafe_code)]

use super::counter::Counter;
use super::handle::Handle;
use super::node::{self, handle_of, hold, value_of, Node, NodeRef, View};
use super::table::Shard;
use super::{into_parts, Pin, RawCache, Refused, RemovalCause, Room};
use crate::sync::local_key;
use crossbeam_epoch::Guard;
use equivalent::Equivalent;
use std::any::Any;
use std::cell::Cell;
use std::hash::{BuildHasher, Hash};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::Duration;

/// The share of the capacity (one part in `HAND_OVER`) that a thread's retired values
/// (removed, replaced or evicted) may weigh before it hands them to the collector (see
/// `RawCache::retired`).
const HAND_OVER: u64 = 64;

local_key! {
    /// The panic of a listener that an operation of this thread's caught, until the
    /// operation ends and resumes it ([`RawCache::passing_on`]).
    static UNHEARD: Cell<Option<Box<dyn Any + Send>>> = Cell::new(None);
}

impl<K, V, S> RawCache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// Inserts or replaces; refuses (handing both back) when the weight does not fit.
    ///
    /// A replacement is a new node: the old node's value cell is swapped, in one CAS, from
    /// its value to a forward to the new node, which makes the old value this call's alone
    /// (a remover racing it fails its own CAS and follows the forward). It reserves only what
    /// the new weight adds to the old one: the part they share passes from the old node to
    /// the new one with that CAS (I5). The slot is then swung to the new node, straight at
    /// the position found, or, if that slot changed meanwhile, by `locate` (which swings any
    /// forwarded slot it meets).
    ///
    /// `hand_back`: whether the caller wants the replaced value back. When it does not (and
    /// no listener hears the replacement), no count of the old value is taken for it.
    /// `ttl`: the entry's time to live from now, in place of the cache's expiry rule (in a
    /// cache that has one).
    pub(crate) fn insert(
        &self,
        key: K,
        value: V,
        hand_back: bool,
        ttl: Option<Duration>,
    ) -> Result<Option<Handle<V>>, Refused<K, V>> {
        if ttl.is_some() && !self.expires() {
            // No wheel would take it out at its deadline: its weight would stay until a
            // write found it.
            return Err(Refused {
                weight: self.weigh(&key, &value),
                key,
                value,
                capacity: self.budget.capacity(),
                turned: false,
                no_expiry: true,
            });
        }
        let inserted = self.insert_or_replace(key, value, hand_back, ttl);
        self.passing_on(inserted)
    }

    fn insert_or_replace(
        &self,
        key: K,
        value: V,
        hand_back: bool,
        ttl: Option<Duration>,
    ) -> Result<Option<Handle<V>>, Refused<K, V>> {
        let weight = self.weigh(&key, &value);
        let hash = self.hash(&key);
        let shard = self.shard(hash);
        let mut value = Some(value);
        let mut key = Some(key);
        loop {
            let pin = self.pin_for(shard, hash);
            let q = key
                .as_ref()
                .expect("the key is back in hand at every retry");
            let pos = shard.locate(hash, |k| k == q, &pin.guard);
            let Some(node) = pos.found else {
                let deadline = match (&key, &value, ttl) {
                    (_, _, Some(ttl)) => self.deadline_in(ttl),
                    (Some(k), Some(v), None) => self.deadline_of_new(k, v),
                    _ => unreachable!("the key and the value are in hand at every retry"),
                };
                let room = self.reserve(weight, Some(hash), pin.stats);
                if !room.made() {
                    let turned = room == Room::Turned;
                    return Err(self.refuse(&pin, key, value, weight, turned));
                }
                let node = self.node_with(hash, &mut key, &mut value, weight, 0);
                // Not shared yet: linking publishes it.
                node.set_deadline(deadline);
                let node = NodeRef::into_raw(node);
                // Counted before a remover can uncount it, in this thread's own block.
                pin.stats.bump(Counter::Live);
                if shard.link(&pos, node, &pin.guard) {
                    // SAFETY: (I1) linked, so the table holds a count and the node is alive; the
                    // policy's queue and the wheel take more (I1).
                    let node = unsafe { &*node };
                    self.admit(node, room);
                    self.scheduled(node, &pin.guard);
                    return Ok(None);
                }
                pin.stats.unbump(Counter::Live);
                self.budget.release(weight);
                // SAFETY: (I1) the link failed, so the node was never shared.
                let (k, v) = unsafe { into_parts(node) };
                (key, value) = (Some(k), v);
                continue;
            };
            match node.view(&pin.guard) {
                View::Ready { node: current, .. } if self.expired(current) => {
                    // Past its deadline: taken out as expired, and the key is new again.
                    self.take_expired(current, shard, &pin);
                }
                View::Ready {
                    node: current,
                    value: old,
                } => {
                    // A value cell's word is the value's address; if the cell has changed
                    // since `view` read it, the CAS below fails and we retry.
                    let cell = old as *const V as usize;
                    let deadline = match (&key, &value, ttl) {
                        (_, _, Some(ttl)) => self.deadline_in(ttl),
                        (Some(k), Some(v), None) => {
                            self.deadline_of_update(k, v, current.deadline())
                        }
                        _ => unreachable!("the key and the value are in hand at every retry"),
                    };
                    let shared = weight.min(current.acquired_weight());
                    if !self.reserve(weight - shared, None, pin.stats).made() {
                        return Err(self.refuse(&pin, key, value, weight, false));
                    }
                    // Made with a count for the forward besides the value's and ours, which
                    // goes to the slot: the replacement's counts take no read-modify-write.
                    let new = self.node_with(hash, &mut key, &mut value, weight, 1);
                    // Not shared yet: the forward's swap publishes it.
                    new.set_deadline(deadline);
                    // SAFETY: (S1) the count `create_counted` made for the forward.
                    let forward = unsafe { node::forward_counted(NodeRef::as_ptr(&new)) };
                    match current.swap_cell(cell, forward) {
                        Ok(()) => {
                            let old = self.take_value(current, cell, shared, hand_back);
                            // SAFETY: (H3, I1) alive while we are pinned: its counts now go
                            // through the epoch (the slot's, the forward's with the old node)
                            // or after its value's, which its cell keeps until then.
                            let to = unsafe { &*NodeRef::as_ptr(&new) };
                            // Swing the slot to the new node, retiring the old node and the
                            // cell's count of its value together: straight from where the
                            // key was found, or, if the slot changed since, the value alone
                            // and the slot by locating it again.
                            // SAFETY: (I6) our CAS took the old value out of the cell: no new
                            // reader can load it, and its count is ours to retire, once. Our
                            // count of the new node becomes the slot's.
                            let swung = unsafe {
                                shard.swing_at_with(&pos, new, Some(cell as *const V), &pin.guard)
                            };
                            if let Err(alone) = swung {
                                if let Some(raw) = alone {
                                    // SAFETY: (I6) as above; the node was not swung here, so
                                    // the value goes alone.
                                    unsafe { self.defer_value(raw, &pin.guard) };
                                }
                                let _ = shard.locate(hash, |k| k == to.key(), &pin.guard);
                            }
                            if let Some(old) = &old {
                                self.notify(to.key(), old, RemovalCause::Replaced);
                            }
                            self.admit(to, Room::Made);
                            self.scheduled(to, &pin.guard);
                            let capacity = self.budget.capacity();
                            self.retired(&pin, current.acquired_weight(), capacity);
                            return Ok(old.filter(|_| hand_back));
                        }
                        Err(_) => {
                            self.budget.release(weight - shared);
                            // SAFETY: (N1, S1) the cell did not take the count made for the
                            // forward.
                            unsafe { NodeRef::decrement_strong_count(NodeRef::as_ptr(&new)) };
                            let (k, v) = Node::into_parts(new);
                            (key, value) = (Some(k), v);
                        }
                    }
                }
                View::Loading => {
                    let held = hold(node);
                    drop(pin);
                    held.slot.wait();
                }
                View::Dead => {}
            }
        }
    }

    /// A `READY` node for an insert, taking the key and value out of their holders, made
    /// with `extra` raw counts for the caller to hand out (S1).
    pub(super) fn node_with(
        &self,
        hash: u64,
        key: &mut Option<K>,
        value: &mut Option<V>,
        weight: u64,
        extra: u32,
    ) -> NodeRef<K, V> {
        let k = key.take().expect("the key is in hand");
        let v = value.take().expect("the value is in hand");
        Node::create_counted(hash, k, Some((v, weight)), 0, extra)
    }

    /// Builds the refusal of an insert, handing the key and the value back.
    #[cold]
    pub(super) fn refuse(
        &self,
        pin: &Pin<'_>,
        key: Option<K>,
        value: Option<V>,
        weight: u64,
        turned: bool,
    ) -> Refused<K, V> {
        pin.stats.bump(Counter::Rejection);
        let value = value.expect("the value is in hand when refusing");
        Refused {
            key: key.expect("the key is in hand when refusing"),
            value,
            weight,
            capacity: self.budget.capacity(),
            turned,
            no_expiry: false,
        }
    }

    /// Releases the weight of a value that the caller's own CAS just swapped out of `node`'s
    /// cell (less `kept`, which passed to its replacement), and returns a handle of the
    /// value if the caller wants it back (`hand_back`) or a listener is to hear of it. The
    /// cell's count of it is the caller's to retire (`defer_value`, or with the node).
    pub(super) fn take_value(
        &self,
        node: &Node<K, V>,
        cell: usize,
        kept: u64,
        hand_back: bool,
    ) -> Option<Handle<V>> {
        let value = (hand_back || self.listener.is_some()).then(|| {
            handle_of::<K, V>(value_of::<V>(cell).expect("a value was taken out of the cell"))
        });
        // The CAS that took the value acquired its publication, weight included.
        self.budget.release(node.acquired_weight() - kept);
        value
    }

    /// Releases a value's count once the readers pinned now have unpinned.
    ///
    /// # Safety
    /// - `raw` is a node's value whose count (C1) the caller owns, taken out of a cell by the
    ///   caller's own CAS (so no new reader can load it), released nowhere else.
    pub(super) unsafe fn defer_value(&self, raw: *const V, guard: &Guard) {
        // SAFETY: (I6, C1) current readers are pinned, and the collector runs the closure once,
        // after the last of them unpins; the count is the caller's.
        unsafe {
            self.domain
                .pending()
                .defer(guard, move || node::release_value::<K, V>(raw))
        };
    }

    /// Notes that this thread retired a value of `weight` (removed, replaced or evicted), and
    /// hands its retirements (its batch and the cache's ready stack: `Pending::hand_over`) to
    /// the collector when that is due: at once for a value weighing
    /// [`1/HAND_OVER`](HAND_OVER) of the capacity (at least 1) or more, else once the values
    /// retired since the last hand-over weigh that much and number at least eight (see
    /// `StatsBlock::hand_over_due`).
    ///
    /// A light value waits in the thread's batch until the batch fills, another thread's
    /// maintenance or `reclaim` takes it, or the thread exits (`raw/epoch/retire.rs`); a
    /// heavy one (a buffer weighed in bytes) should not wait even that long. Each hand-over
    /// seals a ~2 KB bag of crossbeam's (an allocation and two copies), so light values go in
    /// groups: what waits is either under a sixty-fourth of the cache by weight or fewer than
    /// eight light values. The floor of eight keeps a small cache of light entries (187 by
    /// count: a sixty-fourth is two) from sealing a bag every other miss.
    ///
    /// `capacity` is the budget's, as the caller last read it (an evictor has it in hand, so
    /// the budget's contended line is not read again per eviction).
    #[inline]
    pub(super) fn retired(&self, pin: &Pin<'_>, weight: u64, capacity: u64) {
        let due = (capacity / HAND_OVER).max(1);
        if pin.stats.hand_over_due(weight, due) {
            self.domain.pending().hand_over(&pin.guard);
        }
    }

    /// Tells the listener, if any, that `value` left the cache. It runs after the cache is
    /// consistent again, holding nothing another thread waits for.
    ///
    /// A panic of the listener's is caught here, so that the operation around it (an
    /// eviction holding weight for its newcomer, a `clear` half done) runs to its end, and
    /// is kept for [`passing_on`](Self::passing_on) to resume in that operation's caller.
    /// The first panic of an operation is kept; a later one is dropped.
    pub(super) fn notify(&self, key: &K, value: &Handle<V>, cause: RemovalCause) {
        if let Some(listener) = &self.listener {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| listener(key, value, cause))) {
                let _ = UNHEARD.try_with(|kept| {
                    let first = kept.take().unwrap_or(panic);
                    kept.set(Some(first));
                });
            }
        }
    }

    /// Ends a public operation that may have told the listener of removals: `result`, or,
    /// if the listener panicked during the operation ([`notify`](Self::notify)), that panic,
    /// resumed now that the cache is consistent. A cache without a listener reads nothing.
    #[inline]
    pub(crate) fn passing_on<T>(&self, result: T) -> T {
        if self.listener.is_some() {
            if let Some(panic) = UNHEARD.try_with(Cell::take).ok().flatten() {
                drop(result);
                resume_unwind(panic);
            }
        }
        result
    }

    /// Removes a live node's value, if `pred` accepts the value cached at that moment, and
    /// unlinks the node; `how` says why and what to do around it ([`Take`]). `None` if
    /// nothing was taken: `pred` refused, or someone else removed or replaced the value first
    /// (the eviction policy's victim is that node, not its replacement, unless `how` follows).
    ///
    /// Else the weight the value held (`how.kept` included), and the value, as a handle of its
    /// own, if `how` hands it back. A caller that only evicts does not, and when no listener
    /// needs it either, no reference count of the value is written here.
    ///
    /// The value goes to this thread's batch of retirements, which reaches the collector as
    /// `raw/epoch/retire.rs` describes: see [`retired`](Self::retired) for when a removal or
    /// an eviction hands it over at once.
    pub(super) fn take_if(
        &self,
        node: &Node<K, V>,
        shard: &Shard<K, V>,
        pin: &Pin<'_>,
        how: Take,
        pred: impl Fn(&V) -> bool,
    ) -> Option<(u64, Option<Handle<V>>)> {
        let guard = &pin.guard;
        let Take {
            cause,
            follow,
            kept,
            hand_back,
        } = how;
        let mut node = node;
        let mut cell = node.cell();
        loop {
            if let Some(next) = node.forwarded_by(cell) {
                if !follow {
                    return None;
                }
                node = next;
                cell = node.cell();
                continue;
            }
            let value = value_of::<V>(cell)?;
            if !pred(value) {
                return None;
            }
            // The CAS fails if a replacement or another removal got there first.
            match node.swap_cell(cell, 0) {
                Ok(()) => break,
                Err(now) => cell = now,
            }
        }
        pin.stats.unbump(Counter::Live);
        let value = (hand_back || self.listener.is_some())
            .then(|| handle_of::<K, V>(value_of(cell).expect("a value was taken out of the cell")));
        // The CAS that took the value acquired its publication, weight included.
        let weight = node.acquired_weight();
        self.budget.release(weight - kept);
        let raw = cell as *const V;
        // Unless a builder still holds the node (`LOADING`: its value was published and
        // taken before the builder finished; such a node stays linked, dead, until its key
        // comes back or its table migrates), unlink it, retiring the value's count with it.
        let alone = if node.is_live(guard) {
            Some(raw)
        } else {
            // SAFETY: (I6) our CAS took the value out of the cell: no new reader can load it, and
            // its count is ours to retire, once.
            unsafe { shard.unlink_with(node, Some(raw), guard) }
        };
        if let Some(raw) = alone {
            // SAFETY: (I6) as above; the node was not unlinked here, so the value goes alone.
            unsafe { self.defer_value(raw, guard) };
        }
        if let Some(value) = &value {
            self.notify(node.key(), value, cause);
        }
        Some((weight, value))
    }

    /// Removes the value for `key` if `pred` accepts it.
    pub(crate) fn remove_if<Q>(&self, key: &Q, pred: impl Fn(&V) -> bool) -> Option<Handle<V>>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        let how = Take::key(RemovalCause::Removed).handing_back();
        let removed = self.remove_by(key, how, pred)?;
        Some(removed.expect("a removal by key hands the value back"))
    }

    /// Removes the value for `key`, handing nothing back: whether one was cached. No count
    /// of the value is taken unless a listener hears of the removal.
    pub(crate) fn invalidate<Q>(&self, key: &Q) -> bool
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.remove_by(key, Take::key(RemovalCause::Removed), |_| true)
            .is_some()
    }

    /// Takes the value cached for `key` out as `how` says, if `pred` accepts it; `None` if
    /// nothing was taken, else the value if `how` hands it back.
    fn remove_by<Q>(
        &self,
        key: &Q,
        how: Take,
        pred: impl Fn(&V) -> bool,
    ) -> Option<Option<Handle<V>>>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        let pin = self.pin_for(shard, hash);
        let node = shard.find(hash, |k| key.equivalent(k), &pin.guard)?;
        if let View::Ready { node, .. } = node.view(&pin.guard) {
            if self.expired(node) {
                // Nothing live to remove: taken out as expired.
                self.take_expired(node, shard, &pin);
                return self.passing_on(None);
            }
        }
        let (weight, value) = self.take_if(node, shard, &pin, how, pred)?;
        pin.stats.bump(Counter::Removal);
        self.retired(&pin, weight, self.budget.capacity());
        Some(self.passing_on(value))
    }

    pub(crate) fn remove<Q>(&self, key: &Q) -> Option<Handle<V>>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.remove_if(key, |_| true)
    }
}

/// How [`RawCache::take_if`] takes a value out of a node.
#[derive(Clone, Copy, Debug)]
pub(super) struct Take {
    /// Why, as the listener hears it.
    cause: RemovalCause,
    /// Whether a replaced node's replacement is taken instead (a removal by key), or nothing
    /// (a removal of the node met: the policy's victim, a walk's entry).
    follow: bool,
    /// Weight (at most the node's) that stays reserved for the caller instead of being
    /// released: an evictor passes it to the entry it makes room for (I5).
    kept: u64,
    /// Whether the caller wants the value back as a handle of its own.
    hand_back: bool,
}

impl Take {
    /// The value of this very node, for `cause`: not its replacement, if it was replaced.
    pub(super) fn node(cause: RemovalCause) -> Self {
        Self {
            cause,
            follow: false,
            kept: 0,
            hand_back: false,
        }
    }

    /// The value cached for the node's key, for `cause`: its replacement's, if it was replaced.
    pub(super) fn key(cause: RemovalCause) -> Self {
        Self {
            follow: true,
            ..Self::node(cause)
        }
    }

    /// Keeps `kept` of the value's weight reserved for the caller.
    pub(super) fn keeping(self, kept: u64) -> Self {
        Self { kept, ..self }
    }

    /// Hands the value back to the caller.
    pub(super) fn handing_back(self) -> Self {
        Self {
            hand_back: true,
            ..self
        }
    }
}
