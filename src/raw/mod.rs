//! The engine: the cache's sharded table, its nodes and once-cell slots, the weight budget and
//! the epoch reclamation; nothing a layer owns.
//!
//! A [`RawCache`] is an array of shards ([`table::Shard`], open-addressed tables of node
//! pointers that migrate cooperatively when they fill), a weight [`counter::Budget`], and an
//! epoch [`epoch::Domain`] of its own. The public types in `crate::cache` are a thin safe
//! facade over it.
//!
//! # Invariants
//!
//! These are referred to as `I1`..`I8` in every `// SAFETY:` comment; `docs/DESIGN.md` mirrors
//! them with the reasoning behind each. The table's own rules, `H1`..`H4`, are in
//! [`table`].
//!
//! - **I1 (node ownership).** Every node a table points at carries its own strong count
//!   ([`node::NodeRef`], S1 in `strong.rs`); each table holds one strong count of each node it points at
//!   (H3). Only the thread whose CAS
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
//!   borrow it or take a handle of it. The `V` itself, which lives in its node, is dropped by
//!   its last owner (C1 in `handle`): a handle, or the cell's deferred release.
//! - **I7 (reclamation domain).** Each cache has its own collector. Everything it retired runs
//!   by the time the cache's `drop` returns: the drop releases every thread's registration
//!   (its batch of retirements goes to the collector, its handle is finalized), whether that
//!   thread is alive or not, so the cache's own reference is the collector's last (E4, E5 in
//!   `epoch`). The live contents are dropped by the cache's own `Drop`, once.
//! - **I8 (weightless entries).** An entry of weight 0 takes no room, so evicting it frees
//!   none: the policy never queues it (its admission and the sweep pass it by), and the
//!   shrinks skip it. Only a removal, a replacement, `clear`, `retain`, a replacement's
//!   forward or a capacity of 0 (a disabled cache holds nothing) takes it out.

#![allow(unsafe_code)]

pub(crate) mod counter;
pub(crate) mod epoch;
mod evict;
mod expire;
mod flight;
mod handle;
pub(crate) mod node;
pub(crate) mod slot;
mod strong;
pub(crate) mod table;
mod validate;
mod waiters;
mod walk;
pub(crate) mod word;
mod write;

use crate::policy::{EvictionPolicy, Tuning};
use counter::{Budget, Counter, StatsBlock};
use crossbeam_epoch::Guard;
use crossbeam_utils::CachePadded;
use epoch::Domain;
use equivalent::Equivalent;
use expire::{Expiring, Record};

/// A cache's expiry, its wheel holding the cache's nodes.
type NodeWheel<K, V> = Expiring<K, V, Record<K, V>>;
pub(crate) use expire::{nanos, Rule};
pub use expire::{Clock, Expiry, ManualClock};
pub(crate) use flight::Recursion;
pub use handle::{Handle, WeakHandle};
pub(crate) use node::handle_of;
use node::{Node, NodeRef, View};
use std::cell::Cell;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use table::Shard;

/// The largest shard count a builder accepts.
pub const MAX_SHARDS: usize = 1 << 16;

/// The most entries a cache sizes its tables for when it is built (2^20: 16 MiB of slots over
/// all shards); a larger cache grows them as it fills. Also the policy's guess of its entries
/// by count, for the rare cache that cannot tell at its first eviction (`policy::EvictionPolicy`'s
/// `prepare`).
const EXPECTED_MAX: u64 = 1 << 20;

/// Why a value left the cache, as told to an [`on_evict`](crate::CacheBuilder::on_evict) listener.
///
/// ```
/// use runcache::RemovalCause;
/// use std::sync::{Arc, Mutex};
///
/// let causes = Arc::new(Mutex::new(Vec::new()));
/// let sink = Arc::clone(&causes);
/// let cache = runcache::Cache::<u32, u32>::builder()
///     .capacity(1)
///     .on_evict(move |_, _, cause| sink.lock().unwrap().push(cause))
///     .build()?;
/// cache.put(1, 1).unwrap();
/// cache.put(2, 2).unwrap(); // evicts 1
/// cache.clear();
/// assert_eq!(*causes.lock().unwrap(), [RemovalCause::Capacity, RemovalCause::Cleared]);
/// # Ok::<(), runcache::ConfigError>(())
/// ```
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
    /// Its deadline passed (see [`CacheBuilder::time_to_live`](crate::CacheBuilder::time_to_live)
    /// and the other expiry settings).
    Expired,
}

/// Computes an entry's weight.
pub(crate) type Weigher<K, V> = Box<dyn Fn(&K, &V) -> u64 + Send + Sync>;

/// Hears about every value that leaves the cache.
pub(crate) type Listener<K, V> = Box<dyn Fn(&K, &Handle<V>, RemovalCause) + Send + Sync>;

/// How a `get_or_build` call was served.
pub(crate) enum Served<V, E> {
    /// The value was cached.
    Hit(Handle<V>),
    /// Another caller built it while this one waited.
    Shared(Handle<V>),
    /// This caller built it; `cached` says whether it fit.
    Built { value: Handle<V>, cached: bool },
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

/// How `RawCache::reserve` made a newcomer's room.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[must_use]
pub(crate) enum Room {
    /// It was not made: the newcomer does not fit, and is not cached.
    Refused,
    /// The policy's door turned the newcomer away (**P10**): it is not cached, and nothing
    /// was displaced for it.
    Turned,
    /// It was there, or the queues' victims made it.
    Made,
    /// The newcomer won it at the policy's door and joins the main queue (**P10**).
    Judged,
}

impl Room {
    /// Whether the newcomer has its room.
    pub(crate) fn made(self) -> bool {
        matches!(self, Room::Made | Room::Judged)
    }
}

/// Why an `insert` was refused.
pub(crate) struct Refused<K, V> {
    pub(crate) key: K,
    pub(crate) value: V,
    pub(crate) weight: u64,
    pub(crate) capacity: u64,
    /// The policy's door turned it away (**P10**), though it would fit.
    pub(crate) turned: bool,
    /// It came with a time to live, and the cache has no expiry rule to hold it by.
    pub(crate) no_expiry: bool,
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
    policy: Option<EvictionPolicy<NodeRef<K, V>>>,
    /// The policy's sweep of the tables once the cache is first half full (P2).
    sweep: evict::Sweep,
    /// Deadlines and the wheel that takes expired entries out; `None` when nothing expires.
    expiry: Option<Box<NodeWheel<K, V>>>,
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
        entry_weight: Option<u64>,
    ) -> Self {
        // Callers validate the count first (`ConfigError`); `shard` relies on a non-empty array.
        assert!(shards.is_power_of_two() && shards <= MAX_SHARDS);
        // The entries the capacity holds, where they can be told: by count without a weigher,
        // else by `entry_weight` if given; not for an unbounded cache. They size the tables
        // (presizing) and the policy's sketch and ghost (see `WhenFull::Evict`); without them
        // the tables start small, and the policy is sized for 2^20 entries by count or 2^14
        // by weight.
        let weight = if weigher.is_none() {
            Some(1)
        } else {
            entry_weight
        };
        let expected = match weight {
            Some(w) if w > 0 && capacity != u64::MAX => Some((capacity / w).min(EXPECTED_MAX)),
            _ => None,
        };
        let policy_entries = expected.unwrap_or(if weigher.is_none() {
            EXPECTED_MAX
        } else {
            1 << 14
        });
        let per_shard = expected.unwrap_or(0).div_ceil(shards as u64) as usize;
        let domain = Domain::new();
        Self {
            shards: (0..shards)
                .map(|_| CachePadded::new(Shard::new(Arc::clone(domain.pending()), per_shard)))
                .collect(),
            shard_mask: shards - 1,
            hasher,
            weigher,
            listener,
            budget: Budget::new(capacity),
            policy: evict.then(|| EvictionPolicy::new(policy_entries as usize, &Tuning::DEFAULT)),
            sweep: evict::Sweep::new(),
            expiry: None,
            domain,
        }
    }

    /// Tunes the cache's eviction policy by `tuning` instead of [`Tuning::DEFAULT`] (which
    /// the caller checked).
    #[cfg(feature = "tuning")]
    pub(crate) fn with_tuning(mut self, tuning: &'static Tuning) -> Self {
        self.policy = self.policy.map(|p| p.tuned(tuning));
        self
    }

    /// Makes the cache's entries expire by `rule`, read against `clock`.
    pub(crate) fn with_expiry(mut self, clock: Clock, rule: Rule<K, V>) -> Self {
        self.expiry = Some(Box::new(Expiring::new(clock, rule)));
        self
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

    /// Retired items handed to the collector so far (a statistic for tests).
    pub(crate) fn handed_over(&self) -> u64 {
        self.domain.pending().handed()
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
        // SAFETY: (I8) `shards` has `shard_mask + 1` elements, and `i <= shard_mask`.
        unsafe { self.shards.get_unchecked(i) }
    }

    /// Records a hit for the policy (a write only while the entry's frequency can grow).
    #[inline(always)]
    fn touch(&self, node: &Node<K, V>) {
        if self.policy.is_some() {
            node.meta().touch();
        }
    }

    /// Whether a value a lookup found may be returned: in a cache that expires entries,
    /// whether it is before its deadline, whose move (if reads move it) this read then makes
    /// (at most once a tick, X2). One test of the expiry's box when nothing expires.
    #[inline(always)]
    fn readable(&self, node: &Node<K, V>, value: &V) -> bool {
        match &self.expiry {
            None => true,
            Some(x) => x.read(node, value),
        }
    }

    /// Whether `node`'s value is past its deadline: then lookups treat it as absent.
    #[inline(always)]
    fn expired(&self, node: &Node<K, V>) -> bool {
        match &self.expiry {
            None => false,
            Some(x) => x.is_past(node.deadline(), x.now()),
        }
    }

    fn weigh(&self, key: &K, value: &V) -> u64 {
        self.weigher.as_ref().map_or(1, |w| w(key, value))
    }

    /// The cached value for `key`, if any; reads only.
    #[inline(always)]
    pub(crate) fn get<'g, Q>(&'g self, key: &Q, pin: &'g Pin<'_>) -> Option<&'g V>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.get_eq(key, |k| key.equivalent(k), pin)
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
                View::Ready { node, value } if self.readable(node, value) => {
                    self.touch(node);
                    Some(value)
                }
                _ => None,
            });
        pin.looked_up(found.is_some());
        found
    }

    /// The node and value cached for the key that `eq` accepts; reads only, records nothing.
    #[inline(always)]
    fn find_value<'g>(
        &'g self,
        hash: u64,
        eq: impl Fn(&K) -> bool,
        guard: &'g Guard,
    ) -> Option<(&'g Node<K, V>, &'g V)> {
        self.shard(hash)
            .find_bound(hash, eq, guard)
            .and_then(|n| match n.view(guard) {
                View::Ready { node, value } if !self.expired(node) => Some((node, value)),
                _ => None,
            })
    }

    /// Whether a value is cached for `key`, as a peek: neither a hit nor a miss in the
    /// statistics, and no use of the entry for the eviction policy (as `moka` and Caffeine
    /// treat a containment check). `pin`, if the caller holds one; else one of its own.
    pub(crate) fn contains<Q>(&self, key: &Q, pin: Option<&Pin<'_>>) -> bool
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        let hash = self.hash(key);
        let eq = |k: &K| key.equivalent(k);
        match pin {
            Some(pin) => self.find_value(hash, eq, &pin.guard).is_some(),
            None => {
                let pin = self.pin_for(self.shard(hash), hash);
                self.find_value(hash, eq, &pin.guard).is_some()
            }
        }
    }

    /// The cached entries: every thread's count of the entries it made cached less those it
    /// took out (`Counter::Live`), so that an insert or a removal writes its own thread's
    /// block instead of a shared word. Exact once the cache is quiet; while writes run, the
    /// sum reads the blocks one after another, and can dip below zero (read as 0) when a
    /// removal's count is read before its insert's.
    pub(crate) fn len(&self) -> usize {
        usize::try_from(self.stat(Counter::Live) as i64).unwrap_or(0)
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

    pub(crate) fn small_share(&self) -> Option<f64> {
        self.policy.as_ref().map(EvictionPolicy::small_share)
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }
}

/// Takes the key and value back out of a node that was never linked.
///
/// # Safety
/// - `n` came from `NodeRef::into_raw(Node::create(..))`, was never linked, and is not used afterwards.
unsafe fn into_parts<K, V>(n: *const Node<K, V>) -> (K, Option<V>) {
    // SAFETY: (I1) never shared, so ours is the only count (besides its value's).
    Node::into_parts(unsafe { NodeRef::from_raw(n) })
}
