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
//!   executor) created, so a finished executor releases its objects without touching others',
//!   and the groups that leaves empty.
//! - Nested executors: instead of Paddle's "skip the next clear" counter, which a missed or
//!   extra call silently desynchronizes, an executor that runs others holds a
//!   [`ClearHold`]. While any hold lives, `clear_owner` calls are deferred, and they run when
//!   the last hold drops. Nothing is skipped, and nothing runs early.
//! - Values are counted [`Handle`]s: what a caller holds survives any clearing.
//! - Expiry ([`GroupedCache::builder`]): each value expires on its own, after a time to live
//!   or a time to idle, and a group whose values have all expired leaves its session, so an
//!   idle input shape gives its objects and its place under the capacity back.
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

mod expiry;
mod owner;

pub use expiry::GroupedCacheBuilder;
pub use owner::{ClearHold, Owned, OwnerId};

use expiry::{Expired, Stored};

use crate::cache::{Cache, CacheBuilder, Fetched, Handle, Source, WhenFull};
use crate::error::{BuildError, RecursionError};
use crate::raw::Recursion;
use crate::sync::{fence, AtomicBool, AtomicUsize, Ordering};
use crossbeam_queue::SegQueue;
use owner::OwnerLog;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::hash::Hash;

struct Group<G, N> {
    /// Names stored in this group (duplicates are harmless: removal is idempotent).
    names: SegQueue<N>,
    evicted: AtomicBool,
    /// Entries of this group cached now, as far as `clear_owner` needs: counted when a
    /// store makes a new key, uncounted when `clear_owner` removes one. At 0 the group goes.
    entries: AtomicUsize,
    /// Tells this group from an earlier one of the same key in its session's order.
    serial: u64,
    /// The session whose order lists it, whose count it is in.
    session: Handle<Session<G>>,
}

/// Serials of groups; never reused. A std atomic on purpose (as the epoch's ids): a
/// `static` needs a `const` constructor, which loom's atomics lack, and a serial orders
/// nothing.
static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A session's groups in creation order; the groups themselves are in the grouped cache's
/// one table of groups, so a session costs two words and a queue, not a cache of its own.
struct Session<G> {
    /// Groups in creation order (oldest first), each with its serial: an entry whose group
    /// has gone (`clear_owner` removed it empty) is passed over.
    order: SegQueue<(G, u64)>,
    count: AtomicUsize,
}

/// Trait bounds shared by the key parts.
///
/// ```
/// use runcache::grouped::GroupedCache;
///
/// // Any hashable, clonable, thread-safe type is a key part: here a session id, an input
/// // shape and an object name.
/// let cache: GroupedCache<u64, Vec<usize>, String, f32> = GroupedCache::new(4);
/// cache.set(&1, &vec![1, 3, 224, 224], &"scale".to_string(), 0.5);
/// assert_eq!(cache.len(), 1);
/// ```
pub trait Part: Hash + Eq + Clone + Send + Sync + 'static {}
impl<T: Hash + Eq + Clone + Send + Sync + 'static> Part for T {}

/// See the [module docs](self).
///
/// ```
/// use runcache::grouped::{GroupedCache, OwnerId};
///
/// // session -> input shape -> name; at most 8 shapes per session.
/// let blobs: GroupedCache<u32, (u32, u32), &str, String> = GroupedCache::new(8);
/// let executor = blobs.owner(OwnerId(7));
/// let conv = executor.get_or_insert_with(&1, &(1, 224), &"conv1", || "conv1 for 224".into());
/// assert_eq!(*conv, "conv1 for 224");
/// blobs.clear_owner(OwnerId(7)); // the executor finished
/// assert!(blobs.get(&1, &(1, 224), "conv1").is_none());
/// assert_eq!(*conv, "conv1 for 224", "what a caller holds survives");
/// ```
pub struct GroupedCache<S: Part, G: Part, N: Part, V: Send + Sync + 'static> {
    groups_per_session: usize,
    values: Cache<Stored<S, G, N>, V>,
    /// Values taken out as expired, not yet uncounted from their groups; `None` for a cache
    /// whose values do not expire.
    expired: Option<Expired<S, G, N>>,
    /// Every session's groups, in one table keyed by `(session, group)`.
    groups: Cache<(S, G), Group<G, N>>,
    sessions: Cache<S, Session<G>>,
    owners: Cache<OwnerId, OwnerLog<S, G, N, V>>,
    holds: AtomicUsize,
    deferred: SegQueue<OwnerId>,
}

fn unbounded<K: Hash + Eq + Send + Sync + 'static, V: Send + Sync + 'static>() -> Cache<K, V> {
    unbounded_builder()
        .build()
        .expect("the default shard count is always valid")
}

pub(super) fn unbounded_builder<K: Hash + Eq + Send + Sync + 'static, V: Send + Sync + 'static>(
) -> CacheBuilder<K, V> {
    Cache::builder().when_full(WhenFull::Reject)
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> GroupedCache<S, G, N, V> {
    /// A grouped cache keeping at most `groups_per_session` groups per session (0: no limit).
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(1);
    /// cache.set(&0, &10, &"a", 1);
    /// cache.set(&0, &20, &"a", 2); // a second group: the first is evicted whole
    /// assert_eq!(cache.group_count(&0), 1);
    /// assert!(cache.get(&0, &10, "a").is_none());
    /// ```
    pub fn new(groups_per_session: usize) -> Self {
        Self::with_values(groups_per_session, unbounded(), None)
    }

    fn with_values(
        groups_per_session: usize,
        values: Cache<Stored<S, G, N>, V>,
        expired: Option<Expired<S, G, N>>,
    ) -> Self {
        Self {
            groups_per_session,
            values,
            expired,
            groups: unbounded(),
            sessions: unbounded(),
            owners: unbounded(),
            holds: AtomicUsize::new(0),
            deferred: SegQueue::new(),
        }
    }

    /// The value stored under `(session, group, name)`. One lock-free lookup; clones nothing.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    ///
    /// let cache: GroupedCache<u32, u32, String, u32> = GroupedCache::new(0);
    /// cache.set(&0, &1, &"weights".to_string(), 5);
    /// // `name` may be borrowed: a `&str` finds a `String` name.
    /// assert_eq!(cache.get(&0, &1, "weights").as_deref(), Some(&5));
    /// assert!(cache.get(&0, &2, "weights").is_none());
    /// ```
    pub fn get<Q>(&self, session: &S, group: &G, name: &Q) -> Option<Handle<V>>
    where
        N: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // A tuple of references hashes exactly as the owned tuple key does.
        self.values.get_eq(&(session, group, name), |k| {
            let (s, g, n) = &k.parts;
            s == session && g == group && n.borrow() == name
        })
    }

    /// Stores `value` under `(session, group, name)`, creating the group (and evicting the
    /// session's oldest group if that exceeds the capacity). Returns the value it replaced.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// assert!(cache.set(&0, &1, &"a", 1).is_none());
    /// assert_eq!(cache.set(&0, &1, &"a", 2).as_deref(), Some(&1), "the replaced value");
    /// ```
    pub fn set(&self, session: &S, group: &G, name: &N, value: V) -> Option<Handle<V>> {
        self.set_as(None, session, group, name, value)
    }

    /// The value under `(session, group, name)`, built once by `build` if missing
    /// (single-flight, as the core cache).
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    ///
    /// let cache: GroupedCache<u32, u32, &str, String> = GroupedCache::new(0);
    /// let a = cache.get_or_insert_with(&0, &1, &"pool", || "built".to_string());
    /// let b = cache.get_or_insert_with(&0, &1, &"pool", || unreachable!());
    /// assert!(runcache::Handle::ptr_eq(&a, &b));
    /// ```
    #[track_caller]
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
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// let value = cache.get_or_insert_with_async(&0, &1, &"k", async { 3 }).await.unwrap();
    /// assert_eq!(*value, 3);
    /// # });
    /// ```
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

    fn set_as(&self, owner: Option<OwnerId>, s: &S, g: &G, n: &N, value: V) -> Option<Handle<V>> {
        let group = self.ensure_group(s, g);
        let key = (s.clone(), g.clone(), n.clone());
        let stored = Stored {
            parts: key.clone(),
            serial: group.serial,
        };
        let old = match self.values.insert(stored, value) {
            Ok(old) => old,
            Err(_) => unreachable!("the value table never refuses (unbounded, rejecting)"),
        };
        self.record(owner, &group, key, old.is_none());
        old
    }

    #[track_caller]
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
        let fetched = match self.values.get_or_build_from(
            // A tuple of references hashes exactly as the owned tuple key does.
            &(s, g, n),
            same(s, g, n),
            self.key_and_group(s, g, n, &mut group),
            |_| Ok::<_, Infallible>(build()),
        ) {
            Ok(fetched) => fetched,
            Err(BuildError::Failed(e)) => match *e {},
            Err(BuildError::Recursion(r)) => Recursion(r.key).panic(),
        };
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
            .map_err(|e| RecursionError {
                key: BuildError::into_recursion(e).key.parts,
            })?;
        Ok(self.built(owner, group, fetched, (s, g, n)))
    }

    /// What a single-flight miss runs to make the owned key: first the group `(s, g)`, which
    /// may evict the session's oldest, kept in `group` for [`built`](Self::built).
    fn key_and_group<'a>(
        &'a self,
        s: &'a S,
        g: &'a G,
        n: &'a N,
        group: &'a mut Option<Handle<Group<G, N>>>,
    ) -> impl FnOnce() -> Stored<S, G, N> + 'a {
        move || {
            let made = self.ensure_group(s, g);
            let serial = made.serial;
            *group = Some(made);
            Stored {
                parts: (s.clone(), g.clone(), n.clone()),
                serial,
            }
        }
    }

    /// Records a value this call built and cached in its group (made by the miss), and hands
    /// the value out.
    fn built(
        &self,
        owner: Option<OwnerId>,
        group: Option<Handle<Group<G, N>>>,
        fetched: Fetched<V>,
        (s, g, n): (&S, &G, &N),
    ) -> Handle<V> {
        if fetched.source == Source::Cached {
            let group = group.expect("a cached build follows a miss, which made the group");
            self.record(owner, &group, (s.clone(), g.clone(), n.clone()), true);
        }
        fetched.value
    }

    /// Notes a stored key in its group (and its owner's log), counting it if the store made
    /// it (`new`); if the group was evicted meanwhile, removes the entry again so nothing
    /// outlives its group.
    fn record(&self, owner: Option<OwnerId>, group: &Group<G, N>, key: (S, G, N), new: bool) {
        group.names.push(key.2.clone());
        if new {
            // Relaxed: see `uncount`.
            group.entries.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(owner) = owner {
            if let Some(current) = self.values.get(&key) {
                let log = self.owners.get_or_insert_with(owner, || OwnerLog {
                    entries: SegQueue::new(),
                });
                log.entries
                    .push((key.clone(), Handle::downgrade(&current), group.serial));
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
    /// In a cache whose values expire, every expired value is taken out first and the groups
    /// that leaves empty go, so the group found or made here is live.
    fn ensure_group(&self, s: &S, g: &G) -> Handle<Group<G, N>> {
        if self.expired.is_some() {
            self.purge_expired();
        }
        let session = self
            .sessions
            .get_or_build_from(
                s,
                |k| k == s,
                || s.clone(),
                |_| {
                    Ok::<_, ()>(Session {
                        order: SegQueue::new(),
                        count: AtomicUsize::new(0),
                    })
                },
            )
            .unwrap_or_else(|_| unreachable!("the builder neither fails nor asks the cache"))
            .value;
        let fetched = self
            .groups
            .get_or_build_from(
                // A tuple of references hashes exactly as the owned tuple key does.
                &(s, g),
                |(ks, kg)| ks == s && kg == g,
                || (s.clone(), g.clone()),
                |_| {
                    Ok::<_, ()>(Group {
                        names: SegQueue::new(),
                        evicted: AtomicBool::new(false),
                        entries: AtomicUsize::new(0),
                        // Relaxed: only uniqueness matters.
                        serial: NEXT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        session: session.clone(),
                    })
                },
            )
            .unwrap_or_else(|_| unreachable!("the builder neither fails nor asks the cache"));
        if fetched.source == Source::Cached {
            session.order.push((g.clone(), fetched.value.serial));
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
    fn evict_excess(&self, s: &S, session: &Session<G>) {
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
            let Some((oldest, serial)) = session.order.pop() else {
                session.count.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let key = (s.clone(), oldest);
            match self.groups.remove_if(&key, |group| group.serial == serial) {
                Some(group) => self.evict_group(s, &key.1, &group),
                // Gone already, uncounted by whoever removed it (`clear_owner`): the count
                // claimed was another group's.
                None => {
                    session.count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Removes every entry of a group that was just taken out of its session.
    fn evict_group(&self, s: &S, g: &G, group: &Group<G, N>) {
        // Relaxed: ordered by the fence.
        group.evicted.store(true, Ordering::Relaxed);
        // SeqCst: pairs with the fence in `record` (see there).
        fence(Ordering::SeqCst);
        while let Some(name) = group.names.pop() {
            self.values.remove(&(s.clone(), g.clone(), name));
        }
    }

    /// Removes every group of `session` (callers holding values keep them).
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// cache.set(&1, &8, &"a", 1);
    /// cache.set(&2, &8, &"a", 2);
    /// cache.clear_session(&1);
    /// assert_eq!((cache.group_count(&1), cache.len()), (0, 1));
    /// ```
    pub fn clear_session(&self, session: &S) {
        let Some(sess) = self.sessions.remove(session) else {
            return;
        };
        while let Some((g, serial)) = sess.order.pop() {
            // Relaxed: as in `evict_excess`, popping claims one count.
            sess.count.fetch_sub(1, Ordering::Relaxed);
            let key = (session.clone(), g);
            if let Some(group) = self.groups.remove_if(&key, |group| group.serial == serial) {
                self.evict_group(session, &key.1, &group);
            }
        }
    }

    /// Removes everything.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// cache.set(&1, &8, &"a", 1);
    /// cache.set(&2, &9, &"b", 2);
    /// cache.clear();
    /// assert!(cache.is_empty());
    /// ```
    pub fn clear(&self) {
        let sessions: Vec<S> = self.sessions.pin().iter().map(|(s, _)| s.clone()).collect();
        for s in &sessions {
            self.clear_session(s);
        }
        self.values.clear();
    }

    /// Groups in `session` now.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(2);
    /// for shape in 0..5 {
    ///     cache.set(&0, &shape, &"a", shape);
    /// }
    /// assert_eq!(cache.group_count(&0), 2);
    /// assert_eq!(cache.group_count(&1), 0);
    /// ```
    pub fn group_count(&self, session: &S) -> usize {
        self.sessions
            .get(session)
            .map_or(0, |s| s.count.load(Ordering::Relaxed))
    }

    /// Entries stored, in all sessions.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// cache.set(&0, &1, &"a", 1);
    /// cache.set(&0, &1, &"b", 2);
    /// assert_eq!(cache.len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no entry is stored.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// assert!(cache.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Whether an owned key is `(s, g, n)`.
fn same<'a, S: Part, G: Part, N: Part>(
    s: &'a S,
    g: &'a G,
    n: &'a N,
) -> impl Fn(&Stored<S, G, N>) -> bool + 'a {
    move |k| {
        let (ks, kg, kn) = &k.parts;
        ks == s && kg == g && kn == n
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
