//! The engine: the only module with `unsafe` code.
//!
//! A [`RawCache`] is an array of shards ([`table::Shard`], open-addressed tables of node
//! pointers that migrate cooperatively when they fill), a weight [`counter::Budget`], and an
//! epoch [`epoch::Domain`] of its own. The public types in `crate::cache` are a thin safe
//! facade over it.
//!
//! # Invariants
//!
//! These are referred to as `I1`..`I7` in every `// SAFETY:` comment; `docs/DESIGN.md` mirrors
//! them with the reasoning behind each. The table's own rules, `H1`..`H4`, are in
//! [`table`].
//!
//! - **I1 (node ownership).** Every node a table points at was allocated as `Arc<Node>`; each
//!   table holds one strong count of each node it points at (H3). Only the thread whose CAS
//!   takes a node out of a slot releases that table's count, through the cache's epoch
//!   collector; a retired table releases the counts it still holds when the collector
//!   destroys it. So a node reached under a guard stays allocated until the guard drops. A
//!   builder and any parked waiter hold counts of their own, so they need no guard while they
//!   build or sleep.
//! - **I2 (binding).** A table slot, once claimed for a key, holds only nodes of that key until
//!   a dead node in it is unlinked (H1); a key is claimed only at the first empty slot of its
//!   probe sequence. So each table binds a key to at most one slot.
//! - **I3 (dead nodes).** A dead node may stay in its slot: readers treat it as absent, and a
//!   writer of the same key replaces it by CAS. Dead nodes that hold something for waiters
//!   (an uncached value, an error) are unlinked by the thread that ended the attempt; an
//!   entry that is removed, cleared or evicted is unlinked by whoever took its value. A node
//!   still held by its builder (its value published and taken before the builder finished),
//!   or whose slot a migration has frozen, stays until its key returns or its table migrates
//!   (a migration copies only live nodes).
//! - **I4 (liveness).** An entry node is *live* while its slot is `LOADING`, or `READY` with a
//!   non-null value cell. It never becomes live again once dead. With I2, a key has at most
//!   one live node in the newest table, and a migration copies a node before any writer may
//!   write that key into the new table (H2), so at most one live node at any instant.
//! - **I5 (weight).** The weighted size and the capacity change together in one atomic word, and
//!   a reservation succeeds only if `size + weight <= capacity`, so `size <= capacity` at every
//!   instant. Each node records the weight reserved for its value, written before the value
//!   is published and never changed (a cell holds a value at most once). The thread whose
//!   CAS takes the value out of the cell (remove, evict, clear, or a replacement's forward)
//!   releases exactly that weight, less what a replacement keeps for its new node. Uncached
//!   values carry none.
//! - **I6 (value lifetime).** The count a cell holds of a value taken out of it is released
//!   through the epoch collector, so a reader that loaded the value under a guard may still
//!   borrow it or take an `Arc` of it. The `V` itself lives until its last `Arc` drops.
//! - **I7 (reclamation domain).** Each cache has its own collector. Everything it retired runs
//!   by the time the collector's last handle drops (a thread's batch of retirements goes to
//!   the collector before that thread's handle drops); the live contents are dropped by the
//!   cache's own `Drop`, once, when the cache drops.

pub(crate) mod counter;
pub(crate) mod epoch;
pub(crate) mod node;
pub(crate) mod slot;
pub(crate) mod table;
pub(crate) mod word;

use crate::policy::S3Fifo;
use crate::sync::Ordering;
use counter::{Budget, Counter, StatsBlock};
use crossbeam_epoch::Guard;
use crossbeam_utils::CachePadded;
use epoch::Domain;
pub(crate) use node::arc_of;
use node::{forward_to, hold, value_of, Node, Outcome, View};
use slot::{DEAD, READY};
use std::any::Any;
use std::borrow::Borrow;
use std::cell::Cell;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use table::Shard;

/// The largest shard count a builder accepts.
pub const MAX_SHARDS: usize = 1 << 16;

/// Why a value left the cache, as told to an [`on_evict`](crate::CacheBuilder::on_evict) listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RemovalCause {
    /// Evicted by the policy to make room for a new entry, or removed to honour a smaller
    /// capacity (`set_capacity`).
    Capacity,
    /// Removed by [`Cache::remove`](crate::Cache::remove), [`Cache::remove_if`](crate::Cache::remove_if) or [`Cache::retain`](crate::Cache::retain).
    Removed,
    /// Replaced by [`Cache::insert`](crate::Cache::insert) of the same key.
    Replaced,
    /// Removed by [`Cache::clear`](crate::Cache::clear).
    Cleared,
}

/// Computes an entry's weight.
pub(crate) type Weigher<K, V> = Box<dyn Fn(&K, &V) -> u64 + Send + Sync>;

/// Hears about every value that leaves the cache.
pub(crate) type Listener<K, V> = Box<dyn Fn(&K, &Arc<V>, RemovalCause) + Send + Sync>;

/// How a `get_or_build` call was served.
pub(crate) enum Served<V, E> {
    /// The value was cached.
    Hit(Arc<V>),
    /// Another caller built it while this one waited.
    Shared(Arc<V>),
    /// This caller built it; `cached` says whether it fit.
    Built { value: Arc<V>, cached: bool },
    /// The build failed (this caller's, or the attempt it waited on).
    Failed(Arc<E>),
}

/// A pinned epoch plus the calling thread's statistics block.
pub(crate) struct Pin<'c> {
    pub(crate) guard: Guard,
    pub(crate) stats: &'c StatsBlock,
    /// Lookups and misses of `get` under this pin, added to `stats` (as hits and misses)
    /// when it drops: a batch of pinned lookups writes its counters once, not once per
    /// lookup. A hit adds to one cell only.
    lookups: Cell<u64>,
    misses: Cell<u64>,
}

impl Pin<'_> {
    /// Counts one lookup (see `lookups`).
    #[inline(always)]
    fn looked_up(&self, hit: bool) {
        self.lookups.set(self.lookups.get() + 1);
        if !hit {
            self.misses.set(self.misses.get() + 1);
        }
    }
}

impl Drop for Pin<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let misses = self.misses.get();
        let hits = self.lookups.get() - misses;
        if hits > 0 {
            self.stats.bump_by(Counter::Hit, hits);
        }
        if misses > 0 {
            self.stats.bump_by(Counter::Miss, misses);
        }
    }
}

/// The share of the capacity (one part in `HAND_OVER`) that a thread's retired values
/// (removed, replaced or evicted) may weigh before it hands them to the collector (see
/// `RawCache::retired`).
const HAND_OVER: u64 = 64;

/// Why an `insert` was refused.
pub(crate) struct Refused<K, V> {
    pub(crate) key: K,
    pub(crate) value: V,
    pub(crate) weight: u64,
    pub(crate) capacity: u64,
}

pub(crate) struct RawCache<K, V, S> {
    shards: Box<[CachePadded<Shard<K, V>>]>,
    /// `shards - 1`; the shard is `hash >> 48 & shard_mask`: the top 16 bits, which neither
    /// slot indices nor the slot word's hash tag (bits 32–47) use, as far as
    /// [`MAX_SHARDS`] shards need.
    shard_mask: usize,
    hasher: S,
    weigher: Option<Weigher<K, V>>,
    listener: Option<Listener<K, V>>,
    budget: Budget,
    /// The eviction policy; `None` when the cache rejects entries that do not fit.
    policy: Option<S3Fifo<Arc<Node<K, V>>>>,
    // Declared last: dropped after the shards, so this thread's handle goes last (I7).
    domain: Domain,
}

impl<K, V, S> RawCache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    pub(crate) fn new(
        shards: usize,
        capacity: u64,
        hasher: S,
        weigher: Option<Weigher<K, V>>,
        listener: Option<Listener<K, V>>,
        evict: bool,
    ) -> Self {
        // Callers validate the count first (`ConfigError`); `shard` relies on a non-empty array.
        assert!(shards.is_power_of_two() && shards <= MAX_SHARDS);
        // The entries the cache is expected to hold, which size the policy's sketch and ghost
        // (see `WhenFull::Evict`).
        let expected = if weigher.is_none() {
            capacity.min(1 << 20) as usize
        } else {
            1 << 14
        };
        let domain = Domain::new();
        Self {
            shards: (0..shards)
                .map(|_| CachePadded::new(Shard::new(Arc::clone(domain.pending()))))
                .collect(),
            shard_mask: shards - 1,
            hasher,
            weigher,
            listener,
            budget: Budget::new(capacity),
            policy: evict.then(|| S3Fifo::new(expected)),
            domain,
        }
    }

    #[inline]
    pub(crate) fn pin(&self) -> Pin<'_> {
        let (guard, stats) = self.domain.pin();
        Pin {
            guard,
            stats,
            lookups: Cell::new(0),
            misses: Cell::new(0),
        }
    }

    /// Pins for work on `hash`'s entry in `shard`, prefetching the key's first slot before
    /// the pin, whose full fence would otherwise hold its load back (see `Shard::prefetch`).
    #[inline(always)]
    fn pin_for(&self, shard: &Shard<K, V>, hash: u64) -> Pin<'_> {
        shard.prefetch(hash);
        self.pin()
    }

    /// See [`Domain::reclaim`].
    pub(crate) fn reclaim(&self) {
        self.domain.reclaim();
    }

    /// Whether `guard` belongs to this cache.
    pub(crate) fn owns(&self, guard: &Guard) -> bool {
        self.domain.owns(guard)
    }

    #[inline]
    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a hash: from its top 16 bits, which slot indices never reach. Nodes keep
    /// their full hash, so the evictor finds a victim's shard from the node alone.
    #[inline(always)]
    fn shard(&self, hash: u64) -> &Shard<K, V> {
        let i = (hash >> 48) as usize & self.shard_mask;
        debug_assert!(i < self.shards.len());
        // SAFETY: `shards` has `shard_mask + 1` elements, and `i <= shard_mask`.
        unsafe { self.shards.get_unchecked(i) }
    }

    /// Reserves `weight`; when it does not fit and the cache evicts, evicts by policy until
    /// it does. An entry heavier than the whole capacity is refused without evicting anything.
    ///
    /// A victim's weight passes straight to the newcomer, as much of it as the newcomer still
    /// needs: it never leaves the weighted size, so the size stays within the capacity, and an
    /// eviction that makes room for an entry of the same weight writes the budget not at all
    /// (rather than a release and a reservation, two compare-and-swaps on the cache's most
    /// contended word).
    fn reserve(&self, weight: u64, stats: &StatsBlock) -> bool {
        // Weight taken over from victims so far; it counts in the size like a reservation.
        let mut held = 0;
        loop {
            // (A weight of 0 still asks the budget, which refuses everything at capacity 0.)
            if (held > 0 && held == weight) || self.budget.try_reserve(weight - held) {
                return true;
            }
            let Some(policy) = &self.policy else {
                return false;
            };
            let capacity = self.budget.capacity();
            let kept = if capacity == 0 || weight > capacity {
                None
            } else {
                self.evict_one(policy, capacity, weight - held)
            };
            match kept {
                Some(kept) => {
                    held += kept;
                    stats.bump(Counter::Eviction);
                }
                None => {
                    self.budget.release(held);
                    return false;
                }
            }
        }
    }

    /// Evicts the policy's next victim, keeping up to `keep` of its weight reserved for the
    /// caller (the rest is released); returns the weight kept, or `None` when nothing is left
    /// to evict (every entry is being built, say).
    fn evict_one(&self, policy: &S3Fifo<Arc<Node<K, V>>>, capacity: u64, keep: u64) -> Option<u64> {
        let pin = self.pin();
        while let Some(node) = policy.victim(capacity) {
            let shard = self.shard(node.hash);
            let kept = keep.min(node.weight());
            if let Some((weight, _)) = self.take_if(
                &node,
                shard,
                &pin.guard,
                RemovalCause::Capacity,
                false,
                kept,
                false,
                |_| true,
            ) {
                self.retired(&pin, weight, capacity);
                return Some(kept);
            }
        }
        None
    }

    /// Hands a node whose value was just published to the policy.
    fn admit(&self, node: Arc<Node<K, V>>) {
        if let Some(policy) = &self.policy {
            let (size, capacity) = self.budget.snapshot();
            policy.admit(node, size >= capacity / 2, || self.len());
        }
    }

    /// Records a hit for the policy (a write only while the entry's frequency can grow).
    #[inline(always)]
    fn touch(&self, node: &Node<K, V>) {
        if self.policy.is_some() {
            node.meta.touch();
        }
    }

    fn weigh(&self, key: &K, value: &V) -> u64 {
        self.weigher.as_ref().map_or(1, |w| w(key, value))
    }

    /// The cached value for `key`, if any; reads only.
    #[inline(always)]
    pub(crate) fn get<'g, Q>(&'g self, key: &Q, pin: &'g Pin<'_>) -> Option<&'g V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get_eq(key, |k| k.borrow() == key, pin)
    }

    /// The cached value of the key that `eq` accepts, where `probe` hashes exactly as that key
    /// does (a tuple of references to a tuple key's fields, say); reads only.
    #[inline(always)]
    pub(crate) fn get_eq<'g, Q>(
        &'g self,
        probe: &Q,
        eq: impl Fn(&K) -> bool,
        pin: &'g Pin<'_>,
    ) -> Option<&'g V>
    where
        Q: Hash + ?Sized,
    {
        self.get_hashed(self.hash(probe), eq, pin)
    }

    /// Looks up the key that `eq` accepts, whose hash `probe` gives, under a pin of its own,
    /// and hands what it found to `then`. The key's first slot is prefetched before the pin,
    /// whose full fence would otherwise hold its load back (see `Shard::prefetch`).
    #[inline(always)]
    pub(crate) fn lookup<Q, R>(
        &self,
        probe: &Q,
        eq: impl Fn(&K) -> bool,
        then: impl FnOnce(Option<&V>) -> R,
    ) -> R
    where
        Q: Hash + ?Sized,
    {
        let hash = self.hash(probe);
        let pin = self.pin_for(self.shard(hash), hash);
        then(self.get_hashed(hash, eq, &pin))
    }

    /// [`get_eq`](Self::get_eq) for a hash already computed.
    #[inline(always)]
    fn get_hashed<'g>(
        &'g self,
        hash: u64,
        eq: impl Fn(&K) -> bool,
        pin: &'g Pin<'_>,
    ) -> Option<&'g V> {
        let found = self
            .shard(hash)
            .find_bound(hash, eq, &pin.guard)
            .and_then(|n| match n.view(&pin.guard) {
                View::Ready { node, value } => {
                    self.touch(node);
                    Some(value)
                }
                _ => None,
            });
        pin.looked_up(found.is_some());
        found
    }

    /// The single-flight path shared by every `get_or_*` method.
    #[inline]
    pub(crate) fn get_or_build<E, F>(&self, key: K, build: F) -> Served<V, E>
    where
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let hash = self.hash(&key);
        match self.hit(hash, |k| *k == key) {
            Some(value) => Served::Hit(value),
            None => self.build_or_wait(key, hash, build),
        }
    }

    /// The single-flight path for a key found by `probe` and `eq` (as in
    /// [`get_eq`](Self::get_eq)), made by `key` only on a miss: a hit clones no key. `key()`
    /// must hash as `probe` does and be the key `eq` accepts.
    #[inline]
    pub(crate) fn get_or_build_from<Q, E, F>(
        &self,
        probe: &Q,
        eq: impl Fn(&K) -> bool,
        key: impl FnOnce() -> K,
        build: F,
    ) -> Served<V, E>
    where
        Q: Hash + ?Sized,
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let hash = self.hash(probe);
        if let Some(value) = self.hit(hash, eq) {
            return Served::Hit(value);
        }
        let key = key();
        debug_assert_eq!(self.hash(&key), hash, "`key()` hashes as `probe`");
        self.build_or_wait(key, hash, build)
    }

    /// The first look of the single-flight path: the cached value, as [`lookup`]
    /// finds it, counted as a hit. A miss counts nothing here: [`build_or_wait`] counts it
    /// as a miss, a wait or, if the value appeared meanwhile, a hit, so each call counts
    /// once.
    ///
    /// [`lookup`]: Self::lookup
    /// [`build_or_wait`]: Self::build_or_wait
    #[inline(always)]
    fn hit(&self, hash: u64, eq: impl Fn(&K) -> bool) -> Option<Arc<V>> {
        let shard = self.shard(hash);
        let pin = self.pin_for(shard, hash);
        match shard.find_bound(hash, eq, &pin.guard)?.view(&pin.guard) {
            View::Ready { node, value } => {
                self.touch(node);
                pin.looked_up(true);
                Some(arc_of(value))
            }
            _ => None,
        }
    }

    /// The single-flight path after a first look missed: finds the key's entry again, and
    /// builds it (with a `LOADING` node of ours linked) or waits for the build in flight.
    fn build_or_wait<E, F>(&self, key: K, hash: u64, build: F) -> Served<V, E>
    where
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let shard = self.shard(hash);
        let token = epoch::thread_token();
        // Our loading node, made once and reused if a link attempt must be retried.
        let mut mine: Option<*const Node<K, V>> = None;
        let mut key = Some(key);
        let mut counted = false;
        loop {
            let pin = self.pin_for(shard, hash);
            let eq = |k: &K| match (&key, mine) {
                (Some(q), _) => k == q,
                // SAFETY: `mine` is ours (unlinked, or linked with our own count) and alive.
                (None, Some(n)) => k == unsafe { &*n }.key(),
                (None, None) => unreachable!("the key is either held or moved into our node"),
            };
            let existing = match shard.find(hash, eq, &pin.guard) {
                Some(n) => Some(n),
                None if self.budget.capacity() == 0 => None,
                None => {
                    let pos = shard.locate(hash, eq, &pin.guard);
                    match pos.found {
                        Some(n) => Some(n),
                        None => {
                            let node = *mine.get_or_insert_with(|| {
                                let k = key.take().expect("key present until moved into a node");
                                Arc::into_raw(Arc::new(Node::new(hash, k, None, token)))
                            });
                            if !shard.link(&pos, node, &pin.guard) {
                                continue;
                            }
                            // SAFETY: we created `node` with one count, now the table's (I1),
                            // and our guard keeps it alive; take one for ourselves while
                            // building, before the guard goes.
                            unsafe { Arc::increment_strong_count(node) };
                            // SAFETY: the count just taken keeps it alive.
                            let held = unsafe { Arc::from_raw(node) };
                            drop(pin);
                            return self.build_into(held, shard, build);
                        }
                    }
                }
            };
            match existing {
                None => {
                    // Capacity 0: the cache is off; build and hand the value back uncached.
                    pin.stats.bump(Counter::Miss);
                    let k = match (key.take(), mine.take()) {
                        (Some(k), _) => k,
                        // SAFETY: an unlinked node of ours; we hold its only count.
                        (None, Some(n)) => unsafe { into_parts(n) }.0,
                        (None, None) => unreachable!(),
                    };
                    pin.stats.bump(Counter::Build);
                    return match build(&k) {
                        Ok(v) => {
                            pin.stats.bump(Counter::Rejection);
                            Served::Built {
                                value: Arc::new(v),
                                cached: false,
                            }
                        }
                        Err(e) => {
                            pin.stats.bump(Counter::BuildFailure);
                            Served::Failed(Arc::new(e))
                        }
                    };
                }
                Some(node) => match node.view(&pin.guard) {
                    View::Ready {
                        node: holder,
                        value,
                    } => {
                        let value = arc_of(value);
                        self.touch(holder);
                        pin.stats.bump(Counter::Hit);
                        // SAFETY: an unlinked node of ours, never shared.
                        drop(mine.map(|n| unsafe { Arc::from_raw(n) }));
                        return Served::Hit(value);
                    }
                    View::Dead => continue,
                    View::Loading => {
                        if node.builder() == token && token != 0 {
                            drop(pin);
                            // SAFETY: as above.
                            drop(mine.map(|n| unsafe { Arc::from_raw(n) }));
                            panic!(
                                "runcache: a builder asked the same cache for the same key it \
                                 is building, on the same thread; this would wait for itself \
                                 forever (see `Cache::get_or_insert_with`, \"Recursion\")"
                            );
                        }
                        if !counted {
                            pin.stats.bump(Counter::Wait);
                            counted = true;
                        }
                        let held = hold(node);
                        drop(pin);
                        let state = held.slot.wait();
                        let pin = self.pin();
                        if state == READY {
                            if let View::Ready { value, .. } = held.view(&pin.guard) {
                                // SAFETY: as above.
                                drop(mine.map(|n| unsafe { Arc::from_raw(n) }));
                                return Served::Shared(arc_of(value));
                            }
                        } else if state == DEAD {
                            match held.outcome() {
                                Some(Outcome::Uncached(v)) => {
                                    // SAFETY: as above.
                                    drop(mine.map(|n| unsafe { Arc::from_raw(n) }));
                                    return Served::Shared(Arc::clone(v));
                                }
                                Some(Outcome::Failed(e)) => {
                                    if let Ok(e) = Arc::clone(e).downcast::<E>() {
                                        // SAFETY: as above.
                                        drop(mine.map(|n| unsafe { Arc::from_raw(n) }));
                                        return Served::Failed(e);
                                    }
                                    // Another error type: this caller builds for itself.
                                }
                                // The builder panicked: take the build over.
                                None => {}
                            }
                        }
                    }
                },
            }
        }
    }

    /// Runs the builder for our linked `LOADING` node and publishes the result.
    fn build_into<E, F>(&self, node: Arc<Node<K, V>>, shard: &Shard<K, V>, build: F) -> Served<V, E>
    where
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let stats = self.pin().stats;
        stats.bump(Counter::Miss);
        stats.bump(Counter::Build);
        // Ends the attempt as DEAD if the builder or the weigher unwinds.
        let mut attempt = Attempt {
            cache: self,
            node: &node,
            shard,
            done: false,
        };
        let result = build(node.key());
        let served = match result {
            Ok(v) => {
                let weight = self.weigh(node.key(), &v);
                let value = Arc::new(v);
                if self.reserve(weight, stats) {
                    // Relaxed: a size statistic (counted before a remover can uncount it).
                    shard.live.fetch_add(1, Ordering::Relaxed);
                    node.publish(Arc::clone(&value), weight);
                    node.slot.finish(READY);
                    self.admit(Arc::clone(&node));
                    attempt.done = true;
                    return Served::Built {
                        value,
                        cached: true,
                    };
                }
                stats.bump(Counter::Rejection);
                node.set_outcome(Outcome::Uncached(Arc::clone(&value)));
                Served::Built {
                    value,
                    cached: false,
                }
            }
            Err(e) => {
                stats.bump(Counter::BuildFailure);
                let e = Arc::new(e);
                let any: Arc<dyn Any + Send + Sync> = e.clone();
                node.set_outcome(Outcome::Failed(any));
                Served::Failed(e)
            }
        };
        attempt.done = true;
        self.abandon(&node, shard);
        served
    }

    /// Ends a `LOADING` attempt without a cached value: wakes the waiters, unlinks the node.
    fn abandon(&self, node: &Node<K, V>, shard: &Shard<K, V>) {
        node.slot.finish(DEAD);
        let pin = self.pin();
        shard.unlink(node, &pin.guard);
        // The node may hold an uncached value for its waiters: push it towards reclamation
        // now, as `take` explains.
        self.domain.pending().hand_over(&pin.guard);
    }

    /// Inserts or replaces; refuses (handing both back) when the weight does not fit.
    ///
    /// A replacement is a new node: the old node's value cell is swapped, in one CAS, from
    /// its value to a forward to the new node, which makes the old value this call's alone
    /// (a remover racing it fails its own CAS and follows the forward). It reserves only what
    /// the new weight adds to the old one: the part they share passes from the old node to
    /// the new one with that CAS (I5). The slot is then swung to the new node (`locate`
    /// swings any forwarded slot it meets).
    pub(crate) fn insert(&self, key: K, value: V) -> Result<Option<Arc<V>>, Refused<K, V>> {
        let weight = self.weigh(&key, &value);
        let hash = self.hash(&key);
        let shard = self.shard(hash);
        let mut value = Some(Arc::new(value));
        let mut key = Some(key);
        loop {
            let pin = self.pin_for(shard, hash);
            let q = key
                .as_ref()
                .expect("the key is back in hand at every retry");
            let pos = shard.locate(hash, |k| k == q, &pin.guard);
            let Some(node) = pos.found else {
                if !self.reserve(weight, pin.stats) {
                    return Err(self.refuse(&pin, key, value, weight));
                }
                let node =
                    Arc::into_raw(Arc::new(self.node_with(hash, &mut key, &mut value, weight)));
                // Relaxed: a size statistic (counted before a remover can uncount it).
                shard.live.fetch_add(1, Ordering::Relaxed);
                if shard.link(&pos, node, &pin.guard) {
                    // SAFETY: linked, so the table holds a count and the node is alive; the
                    // policy's queue takes one more (I1).
                    self.admit(unsafe { hold(&*node) });
                    return Ok(None);
                }
                shard.live.fetch_sub(1, Ordering::Relaxed);
                self.budget.release(weight);
                // SAFETY: the link failed, so the node was never shared.
                let (k, v) = unsafe { into_parts(node) };
                (key, value) = (Some(k), v);
                continue;
            };
            match node.view(&pin.guard) {
                View::Ready {
                    node: current,
                    value: old,
                } => {
                    // A value cell's word is the value's `Arc::into_raw` pointer; if the cell
                    // has changed since `view` read it, the CAS below fails and we retry.
                    let cell = old as *const V as usize;
                    let shared = weight.min(current.acquired_weight());
                    if !self.reserve(weight - shared, pin.stats) {
                        return Err(self.refuse(&pin, key, value, weight));
                    }
                    let new = Arc::new(self.node_with(hash, &mut key, &mut value, weight));
                    let forward = forward_to(Arc::clone(&new));
                    match current.swap_cell(cell, forward) {
                        Ok(()) => {
                            // SAFETY: our CAS took the old value out of the cell; `shared` of
                            // its weight now belongs to the new node (I5, I6).
                            let old =
                                unsafe { self.retire_value(current, cell, shared, &pin.guard) };
                            // Swing the slot to the new node.
                            let _ = shard.locate(hash, |k| k == new.key(), &pin.guard);
                            self.notify(new.key(), &old, RemovalCause::Replaced);
                            self.admit(new);
                            let capacity = self.budget.capacity();
                            self.retired(&pin, current.acquired_weight(), capacity);
                            return Ok(Some(old));
                        }
                        Err(_) => {
                            self.budget.release(weight - shared);
                            // SAFETY: the cell did not take the count `forward` carries.
                            drop(unsafe { Arc::from_raw(node::unforward::<K, V>(forward)) });
                            let (k, v) = Arc::try_unwrap(new)
                                .unwrap_or_else(|_| {
                                    unreachable!("a node never shared has one count")
                                })
                                .into_parts();
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

    /// A `READY` node for an insert, taking the key and value out of their holders.
    fn node_with(
        &self,
        hash: u64,
        key: &mut Option<K>,
        value: &mut Option<Arc<V>>,
        weight: u64,
    ) -> Node<K, V> {
        let k = key.take().expect("the key is in hand");
        let v = value.take().expect("the value is in hand");
        Node::new(hash, k, Some((v, weight)), 0)
    }

    /// Builds the refusal of an insert, handing the key and the value back.
    #[cold]
    fn refuse(
        &self,
        pin: &Pin<'_>,
        key: Option<K>,
        value: Option<Arc<V>>,
        weight: u64,
    ) -> Refused<K, V> {
        pin.stats.bump(Counter::Rejection);
        let value = Arc::try_unwrap(value.expect("the value is in hand when refusing"))
            .unwrap_or_else(|_| unreachable!("an insert's value is never shared before it lands"));
        Refused {
            key: key.expect("the key is in hand when refusing"),
            value,
            weight,
            capacity: self.budget.capacity(),
        }
    }

    /// Releases the weight of a value just swapped out of `node`'s cell (less `kept`, which
    /// passed to its replacement), defers the release of the cell's count, and returns the
    /// value.
    ///
    /// # Safety
    /// - `cell` held a value and the caller's own CAS took it out of `node`'s cell, so no
    ///   other thread releases or retires it.
    unsafe fn retire_value(
        &self,
        node: &Node<K, V>,
        cell: usize,
        kept: u64,
        guard: &Guard,
    ) -> Arc<V> {
        let value = arc_of(value_of::<V>(cell).expect("a value was taken out of the cell"));
        // The CAS that took the value acquired its publication, weight included.
        self.budget.release(node.acquired_weight() - kept);
        // SAFETY: the caller's contract.
        unsafe { self.defer_value(cell as *const V, guard) };
        value
    }

    /// Releases a value's count once the readers pinned now have unpinned.
    ///
    /// # Safety
    /// - `raw` is a count from `Arc::into_raw` that the caller owns, taken out of a cell by
    ///   the caller's own CAS (so no new reader can load it), released nowhere else.
    unsafe fn defer_value(&self, raw: *const V, guard: &Guard) {
        // SAFETY: current readers are pinned, and the collector runs the closure once, after
        // the last of them unpins.
        unsafe {
            self.domain
                .pending()
                .defer(guard, move || drop(Arc::from_raw(raw)))
        };
    }

    /// Notes that this thread retired a value of `weight` (removed, replaced or evicted), and
    /// hands its retirements (its batch, then its epoch bag: `Pending::hand_over`) to the
    /// collector when that is due: at once for a value weighing
    /// [`1/HAND_OVER`](HAND_OVER) of the capacity (at least 1) or more, else once the values
    /// retired since the last hand-over weigh that much and number at least eight (see
    /// `StatsBlock::hand_over_due`).
    ///
    /// A value retired into a bag reaches the collector only when the bag fills (64 batches
    /// of 32 retirements) or is flushed; until then a thread that stops using the cache keeps
    /// it alive, however long. Flushing after every removal bounded that to nothing but cost a
    /// sealed ~2 KB bag (an allocation and two copies) per removal, 41% of the instructions
    /// of conc-map-bench's rapid-grow mix; evictions, which happen on every miss of a full
    /// cache, never flushed, and could leave a heavy value waiting. Pacing by weight keeps
    /// what may wait on a quiet thread proportionate: heavy values (a buffer weighed in
    /// bytes) are handed over at once, light ones in batches, so what waits is either under
    /// a sixty-fourth of the cache by weight or fewer than eight light values (under an
    /// eighth). The floor of eight keeps a small cache of light entries (187 by count: a
    /// sixty-fourth is two) from sealing a bag every other miss.
    ///
    /// `capacity` is the budget's, as the caller last read it (an evictor has it in hand, so
    /// the budget's contended line is not read again per eviction).
    #[inline]
    fn retired(&self, pin: &Pin<'_>, weight: u64, capacity: u64) {
        let due = (capacity / HAND_OVER).max(1);
        if pin.stats.hand_over_due(weight, due) {
            self.domain.pending().hand_over(&pin.guard);
        }
    }

    /// Tells the listener, if any, that `value` left the cache. It runs after the cache is
    /// consistent again, holding nothing another thread waits for.
    fn notify(&self, key: &K, value: &Arc<V>, cause: RemovalCause) {
        if let Some(listener) = &self.listener {
            listener(key, value, cause);
        }
    }

    /// Removes a live node's value and unlinks the node; `None` if someone else removed or
    /// replaced it first (the eviction policy's victim is that node, not its replacement).
    ///
    /// The value goes to this thread's batch of retirements, then its epoch bag, which reach
    /// the collector only when the bag fills or they are handed over: see
    /// [`retired`](Self::retired) for when a removal or an eviction hands them over.
    fn take(
        &self,
        node: &Node<K, V>,
        shard: &Shard<K, V>,
        guard: &Guard,
        cause: RemovalCause,
    ) -> bool {
        self.take_if(node, shard, guard, cause, false, 0, false, |_| true)
            .is_some()
    }

    /// [`take`](Self::take), only if `pred` accepts the value cached at that moment; with
    /// `follow`, a replaced node's replacement is taken instead (a removal by key). `kept`
    /// (at most the node's weight) stays reserved for the caller instead of being released.
    ///
    /// `None` if nothing was taken; else the weight the value held (`kept` included), and
    /// the value, as an `Arc` of its own, if `hand_back` asks for it. A caller that only
    /// evicts does not, and when no listener needs it either, no reference count of the
    /// value is written here.
    #[allow(clippy::too_many_arguments)]
    fn take_if(
        &self,
        node: &Node<K, V>,
        shard: &Shard<K, V>,
        guard: &Guard,
        cause: RemovalCause,
        follow: bool,
        kept: u64,
        hand_back: bool,
        pred: impl Fn(&Arc<V>) -> bool,
    ) -> Option<(u64, Option<Arc<V>>)> {
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
            // SAFETY: the cell's count stays where it is; this only lends `pred` the value
            // as an `Arc` (never dropped here), alive under `guard` (I6).
            let lent = std::mem::ManuallyDrop::new(unsafe { Arc::from_raw(value as *const V) });
            if !pred(&lent) {
                return None;
            }
            // The CAS fails if a replacement or another removal got there first.
            match node.swap_cell(cell, 0) {
                Ok(()) => break,
                Err(now) => cell = now,
            }
        }
        // Relaxed: a size statistic.
        shard.live.fetch_sub(1, Ordering::Relaxed);
        let value = (hand_back || self.listener.is_some())
            .then(|| arc_of(value_of::<V>(cell).expect("a value was taken out of the cell")));
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
            // SAFETY: our CAS took the value out of the cell: no new reader can load it, and
            // its count is ours to retire, once.
            unsafe { shard.unlink_with(node, Some(raw), guard) }
        };
        if let Some(raw) = alone {
            // SAFETY: as above; the node was not unlinked here, so the value goes alone.
            unsafe { self.defer_value(raw, guard) };
        }
        if let Some(value) = &value {
            self.notify(node.key(), value, cause);
        }
        Some((weight, value))
    }

    /// Removes the value for `key` if `pred` accepts it.
    pub(crate) fn remove_if<Q>(&self, key: &Q, pred: impl Fn(&Arc<V>) -> bool) -> Option<Arc<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        let pin = self.pin_for(shard, hash);
        let node = shard.find(hash, |k| k.borrow() == key, &pin.guard)?;
        let removed = self.take_if(
            node,
            shard,
            &pin.guard,
            RemovalCause::Removed,
            true,
            0,
            true,
            pred,
        )?;
        pin.stats.bump(Counter::Removal);
        self.retired(&pin, removed.0, self.budget.capacity());
        Some(removed.1.expect("a removal by key hands the value back"))
    }

    pub(crate) fn remove<Q>(&self, key: &Q) -> Option<Arc<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remove_if(key, |_| true)
    }

    /// Removes every cached entry; returns how many this call removed.
    pub(crate) fn clear(&self) -> usize {
        self.remove_while(RemovalCause::Cleared, || true)
    }

    /// Removes cached entries, in table order, while `more()` says so.
    fn remove_while(&self, cause: RemovalCause, mut more: impl FnMut() -> bool) -> usize {
        let pin = self.pin();
        let mut removed = 0;
        'shards: for shard in self.shards.iter() {
            for node in shard.walk(&pin.guard) {
                if !more() {
                    break 'shards;
                }
                if self
                    .take_if(node, shard, &pin.guard, cause, true, 0, false, |_| true)
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

    /// The cached entries, shard by shard, each shard walked as [`Shard::walk`] describes:
    /// an entry cached throughout is yielded exactly once. Reads only, except that a shard's
    /// migration in flight is finished when the walk reaches it.
    pub(crate) fn entries<'g>(&'g self, pin: &'g Pin<'_>) -> impl Iterator<Item = (&'g K, &'g V)> {
        self.shards
            .iter()
            .flat_map(move |shard| shard.walk(&pin.guard))
            .filter_map(move |node| match node.view(&pin.guard) {
                View::Ready { node, value } => Some((node.key(), value)),
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
                if keep(node.key(), value) {
                    continue;
                }
                // Not following forwards: a replacement's value was not shown to `keep`. A
                // cell holds a value at most once, so a value still in it is the one shown.
                let taken = self.take_if(
                    node,
                    shard,
                    &pin.guard,
                    RemovalCause::Removed,
                    false,
                    0,
                    false,
                    |_| true,
                );
                if taken.is_some() {
                    pin.stats.bump(Counter::Removal);
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            self.domain.pending().hand_over(&pin.guard);
        }
        removed
    }

    /// Changes the capacity; a shrink evicts in policy order (or, without a policy, in table
    /// order) until the rest fits: never a full flush.
    pub(crate) fn set_capacity(&self, capacity: u64) {
        self.shrink(capacity, |target| match &self.policy {
            Some(policy) => {
                let mut n = 0;
                while self.budget.size() > target && self.evict_one(policy, target, 0).is_some() {
                    n += 1;
                }
                n
            }
            None => self.remove_while(RemovalCause::Capacity, || self.budget.size() > target),
        });
    }

    /// Changes the capacity; a shrink removes cached entries in ascending `rank` order.
    pub(crate) fn set_capacity_ranked<R: Ord>(
        &self,
        capacity: u64,
        mut rank: impl FnMut(&K, &V) -> R,
    ) {
        self.shrink(capacity, |target| {
            let pin = self.pin();
            let mut ranked = Vec::new();
            for shard in self.shards.iter() {
                for node in shard.walk(&pin.guard) {
                    if let View::Ready { node, value } = node.view(&pin.guard) {
                        ranked.push((rank(node.key(), value), node, &**shard));
                    }
                }
            }
            ranked.sort_by(|a, b| a.0.cmp(&b.0));
            let mut removed = 0;
            for (_, node, shard) in ranked {
                if self.budget.size() <= target {
                    break;
                }
                let taken = self.take(node, shard, &pin.guard, RemovalCause::Capacity);
                removed += usize::from(taken);
            }
            if removed > 0 {
                self.domain.pending().hand_over(&pin.guard);
            }
            removed
        });
    }

    /// The shared part of a capacity change; `evict(target)` removes entries and says how
    /// many.
    fn shrink(&self, capacity: u64, mut evict: impl FnMut(u64) -> usize) {
        let stats = self.pin().stats;
        self.budget.set_capacity(capacity, || {
            let n = evict(capacity);
            stats.bump_by(Counter::Eviction, n as u64);
            n > 0
        });
        if capacity == 0 {
            // Zero-weight entries cost nothing, so the loop above may leave them; a disabled
            // cache holds nothing. New ones cannot land: no reservation succeeds at capacity 0.
            let n = self.remove_while(RemovalCause::Capacity, || true);
            stats.bump_by(Counter::Eviction, n as u64);
        }
    }

    pub(crate) fn len(&self) -> usize {
        // Relaxed: a size statistic, exact once the cache is quiet. A shard's count can dip
        // below zero (wrapping) for an instant when a removal overtakes an insert's count.
        let sum = self.shards.iter().fold(0usize, |acc, s| {
            acc.wrapping_add(s.live.load(Ordering::Relaxed))
        });
        usize::try_from(sum as isize).unwrap_or(0)
    }

    pub(crate) fn weighted_size(&self) -> u64 {
        self.budget.size()
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.budget.capacity()
    }

    pub(crate) fn usage(&self) -> (u64, u64) {
        self.budget.snapshot()
    }

    pub(crate) fn stat(&self, c: Counter) -> u64 {
        self.domain.stats.sum(c)
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Checks every invariant that a quiet cache can show (tests and fuzzing call it between
    /// operations, never during one):
    /// - each shard's tables: every live node is found from its hash, none is frozen, and a
    ///   table's claim count is exact (I2, H1–H4); no node is still loading (I4);
    /// - no two cached nodes hold the same key, and each shard's live count is exact;
    /// - the budget's size is the sum of the cached weights and within the capacity (I5);
    /// - with eviction: the queues' totals are exact, no entry is queued twice, and the
    ///   cached entries are exactly the queued entries that hold a value.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let pin = self.pin();
        let mut cached = std::collections::HashSet::new();
        let mut keys = std::collections::HashSet::new();
        let mut weight = 0u64;
        let mut problem = None;
        for (i, shard) in self.shards.iter().enumerate() {
            let mut live = 0usize;
            shard
                .validate(&pin.guard)
                .map_err(|e| format!("shard {i}: {e}"))?;
            shard.for_each(&pin.guard, |n| {
                match n.view(&pin.guard) {
                    View::Ready { node, .. } => {
                        live += 1;
                        weight += node.acquired_weight();
                        cached.insert(node as *const Node<K, V> as usize);
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
            // Relaxed: the cache is quiet.
            let counted = shard.live.load(Ordering::Relaxed);
            if counted != live {
                return Err(format!(
                    "shard {i} counts {counted} live entries and holds {live}"
                ));
            }
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
            if queued != cached {
                let unqueued = cached.difference(&queued).count();
                let stale = queued.difference(&cached).count();
                return Err(format!(
                    "{unqueued} cached entries are in no queue; {stale} queued entries that \
                     hold a value are not in the table"
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

/// Takes the key and value back out of a node that was never linked.
///
/// # Safety
/// - `n` came from `Arc::into_raw(Arc::new(..))`, was never linked, and is not used afterwards.
unsafe fn into_parts<K, V>(n: *const Node<K, V>) -> (K, Option<Arc<V>>) {
    // SAFETY: never shared, so ours is the only count.
    let node = unsafe { Arc::from_raw(n) };
    Arc::try_unwrap(node)
        .unwrap_or_else(|_| unreachable!("a node that was never linked has one count"))
        .into_parts()
}

/// Drop guard of a build attempt: if the builder or weigher unwinds, the slot turns `DEAD`
/// with no outcome, the waiters wake and one of them takes the build over.
struct Attempt<'a, K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    cache: &'a RawCache<K, V, S>,
    node: &'a Node<K, V>,
    shard: &'a Shard<K, V>,
    done: bool,
}

impl<K, V, S> Drop for Attempt<'_, K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    fn drop(&mut self) {
        if !self.done {
            self.cache.abandon(self.node, self.shard);
        }
    }
}
