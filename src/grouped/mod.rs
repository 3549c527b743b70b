//! A grouped cache: session → group (the input shape) → name → value, evicting whole groups.
//!
//! Runtimes with dynamic input shapes create many objects per shape. PaddlePaddle's MKL-DNN
//! blob cache groups them by input shape so that memory pressure clears a whole shape group at once, which frees far more than evicting one
//! object. Here:
//!
//! - [`GroupedCache::get`] is one lock-free lookup in a flat table keyed by
//!   `(session, group, name)`, made without cloning any part of the key; it writes no
//!   bookkeeping.
//! - The capacity counts groups per session (0 = unbounded). When a new group would exceed it,
//!   the session's **oldest group by creation** is evicted whole. (Paddle evicts whichever group
//!   its hash map lists first — in effect a random one.)
//! - [`clear_session`](GroupedCache::clear_session), [`clear`](GroupedCache::clear), and
//!   [`clear_owner`](GroupedCache::clear_owner), which removes exactly what one owner (an
//!   executor) created, so a finished executor releases its objects without touching others'.
//! - Nested executors: instead of Paddle's "skip the next clear" counter, which a missed or
//!   extra call silently desynchronizes, an executor that runs others holds a
//!   [`ClearHold`]. While any hold lives, `clear_owner` calls are deferred, and they run when
//!   the last hold drops. Nothing is skipped, and nothing runs early.
//! - Values are counted [`Handle`]s: what a caller holds survives any clearing.
//!
//! ```
//! use runcache::grouped::GroupedCache;
//!
//! // Keep at most 2 input shapes per session.
//! let blobs: GroupedCache<u32, Vec<usize>, String, String> = GroupedCache::new(2);
//! for shape in [vec![1, 128], vec![1, 256], vec![1, 384]] {
//!     let name = "conv1_weights".to_string();
//!     blobs.set(&7, &shape, &name, format!("primitive for {shape:?}"));
//! }
//! assert_eq!(blobs.group_count(&7), 2);
//! assert!(blobs.get(&7, &vec![1, 128], "conv1_weights").is_none(), "the oldest shape went first");
//! assert!(blobs.get(&7, &vec![1, 384], "conv1_weights").is_some());
//! ```

#![forbid(unsafe_code)]

use crate::cache::{Cache, Fetched, Handle, Source, WeakHandle, WhenFull};
use crate::error::{BuildError, RecursionError};
use crate::sync::{fence, AtomicBool, AtomicUsize, Ordering};
use crossbeam_queue::SegQueue;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::hash::Hash;

/// An owner of entries (an executor, say), for [`GroupedCache::clear_owner`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(pub u64);

struct Group<N> {
    /// Names stored in this group (duplicates are harmless: removal is idempotent).
    names: SegQueue<N>,
    evicted: AtomicBool,
}

struct Session<G, N> {
    groups: Cache<G, Group<N>>,
    /// Groups in creation order (oldest first).
    order: SegQueue<G>,
    count: AtomicUsize,
}

/// What one owner inserted: keys and the exact values, so `clear_owner` never removes a
/// value another owner put there later.
struct OwnerLog<S, G, N, V> {
    entries: SegQueue<((S, G, N), WeakHandle<V>)>,
}

/// Trait bounds shared by the key parts.
pub trait Part: Hash + Eq + Clone + Send + Sync + 'static {}
impl<T: Hash + Eq + Clone + Send + Sync + 'static> Part for T {}

/// See the [module docs](self).
pub struct GroupedCache<S: Part, G: Part, N: Part, V: Send + Sync + 'static> {
    groups_per_session: usize,
    values: Cache<(S, G, N), V>,
    sessions: Cache<S, Session<G, N>>,
    /// Every session created, for `clear`.
    session_ids: SegQueue<S>,
    owners: Cache<OwnerId, OwnerLog<S, G, N, V>>,
    holds: AtomicUsize,
    deferred: SegQueue<OwnerId>,
}

/// Defers [`GroupedCache::clear_owner`] calls while it lives; see the module docs.
#[must_use = "the hold ends (and deferred clears run) when this is dropped"]
pub struct ClearHold<'a, S: Part, G: Part, N: Part, V: Send + Sync + 'static> {
    cache: &'a GroupedCache<S, G, N, V>,
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> Drop for ClearHold<'_, S, G, N, V> {
    fn drop(&mut self) {
        // AcqRel: the last hold to go sees every clear deferred under the others.
        if self.cache.holds.fetch_sub(1, Ordering::AcqRel) == 1 {
            while let Some(owner) = self.cache.deferred.pop() {
                self.cache.clear_owner_now(owner);
            }
        }
    }
}

fn unbounded<K: Hash + Eq + Send + Sync + 'static, V: Send + Sync + 'static>() -> Cache<K, V> {
    Cache::builder()
        .when_full(WhenFull::Reject)
        .build()
        .expect("the default shard count is always valid")
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> GroupedCache<S, G, N, V> {
    /// A grouped cache keeping at most `groups_per_session` groups per session (0: no limit).
    pub fn new(groups_per_session: usize) -> Self {
        Self {
            groups_per_session,
            values: unbounded(),
            sessions: unbounded(),
            session_ids: SegQueue::new(),
            owners: unbounded(),
            holds: AtomicUsize::new(0),
            deferred: SegQueue::new(),
        }
    }

    /// The value stored under `(session, group, name)`. One lock-free lookup; clones nothing.
    pub fn get<Q>(&self, session: &S, group: &G, name: &Q) -> Option<Handle<V>>
    where
        N: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // A tuple of references hashes exactly as the owned tuple key does.
        self.values.get_eq(&(session, group, name), |(s, g, n)| {
            s == session && g == group && n.borrow() == name
        })
    }

    /// Stores `value` under `(session, group, name)`, creating the group (and evicting the
    /// session's oldest group if that exceeds the capacity). Returns the value it replaced.
    pub fn set(&self, session: &S, group: &G, name: &N, value: V) -> Option<Handle<V>> {
        self.set_as(None, session, group, name, value)
    }

    /// The value under `(session, group, name)`, built once by `build` if missing
    /// (single-flight, as the core cache).
    pub fn get_or_insert_with(
        &self,
        session: &S,
        group: &G,
        name: &N,
        build: impl FnOnce() -> V,
    ) -> Handle<V> {
        self.get_or_insert_as(None, session, group, name, build)
    }

    /// The async form of [`get_or_insert_with`](Self::get_or_insert_with): `build` is polled
    /// only on a miss, by one caller per key at a time, and the others wait without blocking
    /// their thread (as [`Cache::get_or_insert_with_async`](crate::Cache::get_or_insert_with_async)).
    ///
    /// # Errors
    /// [`RecursionError`], with the key, if `build` asks for its own key from inside its
    /// poll.
    pub async fn get_or_insert_with_async<F: Future<Output = V>>(
        &self,
        session: &S,
        group: &G,
        name: &N,
        build: F,
    ) -> Result<Handle<V>, RecursionError<(S, G, N)>> {
        self.get_or_insert_as_async(None, session, group, name, build)
            .await
    }

    /// A handle whose inserts are recorded as `owner`'s, for [`clear_owner`](Self::clear_owner).
    pub fn owner(&self, owner: OwnerId) -> Owned<'_, S, G, N, V> {
        Owned { cache: self, owner }
    }

    fn set_as(&self, owner: Option<OwnerId>, s: &S, g: &G, n: &N, value: V) -> Option<Handle<V>> {
        let group = self.ensure_group(s, g);
        let key = (s.clone(), g.clone(), n.clone());
        let old = match self.values.insert(key.clone(), value) {
            Ok(old) => old,
            Err(_) => unreachable!("the value table never refuses (unbounded, rejecting)"),
        };
        self.record(owner, &group, key);
        old
    }

    fn get_or_insert_as(
        &self,
        owner: Option<OwnerId>,
        s: &S,
        g: &G,
        n: &N,
        build: impl FnOnce() -> V,
    ) -> Handle<V> {
        // The group is made (which may evict the session's oldest) only on a miss, before
        // the build: `key` runs then, and only then.
        let mut group = None;
        let fetched = self
            .values
            .get_or_build_from(
                // A tuple of references hashes exactly as the owned tuple key does.
                &(s, g, n),
                same(s, g, n),
                self.key_and_group(s, g, n, &mut group),
                |_| Ok::<_, ()>(build()),
            )
            .unwrap_or_else(|_| unreachable!("the builder cannot fail"));
        self.built(owner, group, fetched, (s, g, n))
    }

    /// [`get_or_insert_as`](Self::get_or_insert_as) for an async build.
    async fn get_or_insert_as_async<F: Future<Output = V>>(
        &self,
        owner: Option<OwnerId>,
        s: &S,
        g: &G,
        n: &N,
        build: F,
    ) -> Result<Handle<V>, RecursionError<(S, G, N)>> {
        let mut group = None;
        let fetched = self
            .values
            .get_or_build_async_from(
                &(s, g, n),
                same(s, g, n),
                self.key_and_group(s, g, n, &mut group),
                async { Ok::<_, Infallible>(build.await) },
            )
            .await
            .map_err(BuildError::into_recursion)?;
        Ok(self.built(owner, group, fetched, (s, g, n)))
    }

    /// What a single-flight miss runs to make the owned key: first the group `(s, g)`, which
    /// may evict the session's oldest, kept in `group` for [`built`](Self::built).
    fn key_and_group<'a>(
        &'a self,
        s: &'a S,
        g: &'a G,
        n: &'a N,
        group: &'a mut Option<Handle<Group<N>>>,
    ) -> impl FnOnce() -> (S, G, N) + 'a {
        move || {
            *group = Some(self.ensure_group(s, g));
            (s.clone(), g.clone(), n.clone())
        }
    }

    /// Records a value this call built and cached in its group (made by the miss), and hands
    /// the value out.
    fn built(
        &self,
        owner: Option<OwnerId>,
        group: Option<Handle<Group<N>>>,
        fetched: Fetched<V>,
        (s, g, n): (&S, &G, &N),
    ) -> Handle<V> {
        if fetched.source == Source::Cached {
            let group = group.expect("a cached build follows a miss, which made the group");
            self.record(owner, &group, (s.clone(), g.clone(), n.clone()));
        }
        fetched.value
    }

    /// Notes a stored key in its group (and its owner's log); if the group was evicted
    /// meanwhile, removes the entry again so nothing outlives its group.
    fn record(&self, owner: Option<OwnerId>, group: &Group<N>, key: (S, G, N)) {
        group.names.push(key.2.clone());
        if let Some(owner) = owner {
            if let Some(current) = self.values.get(&key) {
                let log = self.owners.get_or_insert_with(owner, || OwnerLog {
                    entries: SegQueue::new(),
                });
                log.entries.push((key.clone(), Handle::downgrade(&current)));
            }
        }
        // SeqCst: pairs with the fence in `evict_group`: either the evictor sees the name we
        // pushed, or we see its `evicted` flag (and remove the entry ourselves).
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fences.
        if group.evicted.load(Ordering::Relaxed) {
            self.values.remove(&key);
        }
    }

    /// The group `(s, g)`, created if missing; creating it may evict the session's oldest.
    fn ensure_group(&self, s: &S, g: &G) -> Handle<Group<N>> {
        let session = self
            .sessions
            .get_or_build_from(
                s,
                |k| k == s,
                || s.clone(),
                |_| {
                    Ok::<_, ()>(Session {
                        groups: unbounded(),
                        order: SegQueue::new(),
                        count: AtomicUsize::new(0),
                    })
                },
            )
            .unwrap_or_else(|_| unreachable!("the builder cannot fail"));
        if session.source == Source::Cached {
            self.session_ids.push(s.clone());
        }
        let session = session.value;
        let fetched = session
            .groups
            .get_or_build_from(
                g,
                |k| k == g,
                || g.clone(),
                |_| {
                    Ok::<_, ()>(Group {
                        names: SegQueue::new(),
                        evicted: AtomicBool::new(false),
                    })
                },
            )
            .unwrap_or_else(|_| unreachable!("the builder cannot fail"));
        if fetched.source == Source::Cached {
            session.order.push(g.clone());
            // Relaxed: the count is one word; the order queue decides which group goes.
            let now = session.count.fetch_add(1, Ordering::Relaxed) + 1;
            if self.groups_per_session > 0 && now > self.groups_per_session {
                self.evict_excess(s, &session);
            }
        }
        fetched.value
    }

    /// Evicts the session's oldest groups while it has more than the capacity.
    ///
    /// Each eviction is claimed by decrementing the count (CAS) *before* popping the oldest
    /// group, so concurrent evictors never act on a count that another's pending decrement
    /// inflates; otherwise two new groups could evict each other. (Found by the loom model
    /// `a_set_into_an_evicted_group_leaves_no_orphan`.)
    fn evict_excess(&self, s: &S, session: &Session<G, N>) {
        loop {
            // Relaxed: see `ensure_group`.
            let count = session.count.load(Ordering::Relaxed);
            if count <= self.groups_per_session {
                return;
            }
            if session
                .count
                .compare_exchange(count, count - 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            // Every counted group was pushed before it was counted, so this finds one.
            let Some(oldest) = session.order.pop() else {
                session.count.fetch_add(1, Ordering::Relaxed);
                return;
            };
            if let Some(group) = session.groups.remove(&oldest) {
                self.evict_group(s, &oldest, &group);
            }
        }
    }

    /// Removes every entry of a group that was just taken out of its session.
    fn evict_group(&self, s: &S, g: &G, group: &Group<N>) {
        // Relaxed: ordered by the fence.
        group.evicted.store(true, Ordering::Relaxed);
        // SeqCst: pairs with the fence in `record` (see there).
        fence(Ordering::SeqCst);
        while let Some(name) = group.names.pop() {
            self.values.remove(&(s.clone(), g.clone(), name));
        }
    }

    /// Removes every group of `session` (callers holding values keep them).
    pub fn clear_session(&self, session: &S) {
        let Some(sess) = self.sessions.remove(session) else {
            return;
        };
        while let Some(g) = sess.order.pop() {
            // Relaxed: as in `evict_excess`, popping claims one count.
            sess.count.fetch_sub(1, Ordering::Relaxed);
            if let Some(group) = sess.groups.remove(&g) {
                self.evict_group(session, &g, &group);
            }
        }
    }

    /// Removes everything.
    pub fn clear(&self) {
        while let Some(s) = self.session_ids.pop() {
            self.clear_session(&s);
        }
        self.values.clear();
    }

    /// Removes every entry `owner` stored that still holds the value it stored (an entry
    /// another owner replaced since is left alone). Deferred while a [`ClearHold`] lives.
    pub fn clear_owner(&self, owner: OwnerId) {
        // Acquire: pairs with the AcqRel in `ClearHold::drop`.
        if self.holds.load(Ordering::Acquire) > 0 {
            self.deferred.push(owner);
            // A hold that ended meanwhile would have missed this owner: run it if so.
            if self.holds.load(Ordering::Acquire) == 0 {
                while let Some(o) = self.deferred.pop() {
                    self.clear_owner_now(o);
                }
            }
            return;
        }
        self.clear_owner_now(owner);
    }

    fn clear_owner_now(&self, owner: OwnerId) {
        let Some(log) = self.owners.remove(&owner) else {
            return;
        };
        while let Some((key, mine)) = log.entries.pop() {
            if let Some(mine) = mine.upgrade() {
                self.values.remove_if(&key, |v| std::ptr::eq(v, &*mine));
            }
        }
    }

    /// Defers `clear_owner` calls until every hold has dropped (for nested executors).
    pub fn hold_clears(&self) -> ClearHold<'_, S, G, N, V> {
        // AcqRel: pairs with the AcqRel in `ClearHold::drop`.
        self.holds.fetch_add(1, Ordering::AcqRel);
        ClearHold { cache: self }
    }

    /// Groups in `session` now.
    pub fn group_count(&self, session: &S) -> usize {
        self.sessions
            .get(session)
            .map_or(0, |s| s.count.load(Ordering::Relaxed))
    }

    /// Entries stored, in all sessions.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Whether an owned key is `(s, g, n)`.
fn same<'a, S: Part, G: Part, N: Part>(
    s: &'a S,
    g: &'a G,
    n: &'a N,
) -> impl Fn(&(S, G, N)) -> bool + 'a {
    move |(ks, kg, kn)| ks == s && kg == g && kn == n
}

/// Inserts recorded as one owner's; see [`GroupedCache::owner`].
pub struct Owned<'a, S: Part, G: Part, N: Part, V: Send + Sync + 'static> {
    cache: &'a GroupedCache<S, G, N, V>,
    owner: OwnerId,
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> Owned<'_, S, G, N, V> {
    /// [`GroupedCache::set`], recorded as this owner's.
    pub fn set(&self, session: &S, group: &G, name: &N, value: V) -> Option<Handle<V>> {
        self.cache
            .set_as(Some(self.owner), session, group, name, value)
    }

    /// [`GroupedCache::get_or_insert_with`], recorded as this owner's when it builds.
    pub fn get_or_insert_with(
        &self,
        session: &S,
        group: &G,
        name: &N,
        build: impl FnOnce() -> V,
    ) -> Handle<V> {
        self.cache
            .get_or_insert_as(Some(self.owner), session, group, name, build)
    }

    /// [`GroupedCache::get_or_insert_with_async`], recorded as this owner's when it builds.
    ///
    /// # Errors
    /// As [`GroupedCache::get_or_insert_with_async`].
    pub async fn get_or_insert_with_async<F: Future<Output = V>>(
        &self,
        session: &S,
        group: &G,
        name: &N,
        build: F,
    ) -> Result<Handle<V>, RecursionError<(S, G, N)>> {
        self.cache
            .get_or_insert_as_async(Some(self.owner), session, group, name, build)
            .await
    }
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> fmt::Debug for GroupedCache<S, G, N, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupedCache")
            .field("groups_per_session", &self.groups_per_session)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}
