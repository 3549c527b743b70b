//! The safe facade: [`Cache`], its builder (`builder.rs`), what its lookups report
//! (`outcome.rs`), the pinned read handle (`pinned.rs`), and its sizes, capacity, statistics
//! and upkeep (`size.rs`).

#![forbid(unsafe_code)]

mod builder;
mod future;
mod outcome;
mod pinned;
mod size;

use builder::default_shards;
pub use builder::{CacheBuilder, WhenFull};
pub use outcome::{Fetched, Lookup, Source, Stats};
pub use pinned::Pinned;

use crate::error::{BuildError, InsertError, RecursionError};
pub use crate::raw::{Clock, Expiry, Handle, ManualClock, RemovalCause, WeakHandle, MAX_SHARDS};
use crate::raw::{RawCache, Recursion, Served};
use equivalent::Equivalent;
use std::convert::Infallible;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::time::Duration;

/// The hasher a cache uses unless [`CacheBuilder::hasher`] picks another: foldhash's fast,
/// randomly seeded hasher (the one hashbrown uses).
#[cfg(not(runcache_loom))]
pub type DefaultHashBuilder = foldhash::fast::RandomState;

/// Under the loom models, every default hasher has a fixed seed: loom replays each
/// interleaving many times, and random seeds would make the replays differ.
#[cfg(runcache_loom)]
pub type DefaultHashBuilder = foldhash::fast::FixedState;

/// A lock-free concurrent cache of values by key, handed out as counted [`Handle`]s; see the
/// [crate docs](crate).
///
/// ```
/// use runcache::Cache;
/// use std::thread;
///
/// // Compiled kernels by shape, shared by every thread; at most 1,000 of them.
/// let kernels: Cache<(u32, u32), String> = Cache::new(1_000);
/// thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| {
///             let kernel = kernels.get_or_insert_with((64, 64), || "gemm 64x64".to_string());
///             assert_eq!(*kernel, "gemm 64x64");
///         });
///     }
/// });
/// assert_eq!(kernels.stats().builds, 1, "built once, however many threads asked");
/// ```
pub struct Cache<K, V, S = DefaultHashBuilder> {
    raw: RawCache<K, V, S>,
}

// A panic anywhere a cache calls out (a build, a weigher, a listener, a key's `Hash` or
// `Eq`) leaves the cache consistent and poisons nothing (`docs/DESIGN.md`, "Single flight"
// and "Size accounting"), so a cache is unwind safe whenever its keys, values and hasher
// are: `catch_unwind(|| cache.get_or_insert_with(..))` needs no `AssertUnwindSafe`. The
// boxed weigher and listener are the caller's own code; whatever state they keep is theirs.
impl<K: RefUnwindSafe, V: RefUnwindSafe, S: RefUnwindSafe> RefUnwindSafe for Cache<K, V, S> {}
impl<K: UnwindSafe, V: UnwindSafe, S: UnwindSafe> UnwindSafe for Cache<K, V, S> {}

impl<K, V> Cache<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    /// A builder with the defaults: unbounded, weight 1 per entry, default hasher and shards.
    ///
    /// ```
    /// use runcache::{Cache, WhenFull};
    ///
    /// let cache = Cache::<String, Vec<u8>>::builder()
    ///     .capacity(1 << 20) // a byte budget
    ///     .weigher(|_key, value| value.len() as u64) // what each entry costs
    ///     .when_full(WhenFull::Evict)
    ///     .build()?;
    /// cache.insert("weights".to_string(), vec![0; 4096]).unwrap();
    /// assert_eq!(cache.weighted_size(), 4096);
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn builder() -> CacheBuilder<K, V> {
        CacheBuilder::default()
    }

    /// A cache of at most `capacity` entries, with every other setting at its default.
    ///
    /// ```
    /// let cache = runcache::Cache::new(2);
    /// cache.put(1, "one").unwrap();
    /// cache.put(2, "two").unwrap();
    /// cache.put(3, "three").unwrap(); // full: the policy evicts an entry to make room
    /// assert_eq!(cache.len(), 2);
    /// assert!(cache.contains_key(&3));
    /// ```
    pub fn new(capacity: u64) -> Self {
        Self {
            raw: RawCache::new(
                default_shards(),
                capacity,
                DefaultHashBuilder::default(),
                None,
                None,
                true,
                None,
            ),
        }
    }
}

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The cached value for `key`: a co-owning [`Handle`] that stays valid after the entry is
    /// removed or evicted. Takes no lock and writes no shared memory.
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put("conv", vec![1.0f32, 2.0]).unwrap();
    /// let weights = cache.get("conv").expect("cached");
    /// assert_eq!(weights[1], 2.0);
    /// cache.invalidate("conv");
    /// assert!(cache.get("conv").is_none());
    /// assert_eq!(weights.len(), 2, "a handle outlives its entry");
    /// ```
    pub fn get<Q>(&self, key: &Q) -> Option<Handle<V>>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.raw.lookup(
            key,
            |k| key.equivalent(k),
            |v| v.map(crate::raw::handle_of::<K, V>),
        )
    }

    /// A clone of the cached value for `key`, made while the cache is pinned: no reference
    /// count is written, so for a small `Copy` value, or an `Arc` stored as the value (which
    /// this hands out as one count of that `Arc`), it is the cheapest read that outlives the
    /// call. Takes no lock and writes no shared memory besides what `V::clone` writes.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// // An `Arc` stored as the value comes out as one count of that `Arc`.
    /// let names: runcache::Cache<u32, Arc<str>> = runcache::Cache::new(10);
    /// names.put(1, Arc::from("relu")).unwrap();
    /// let name: Arc<str> = names.get_cloned(&1).unwrap();
    /// assert_eq!(&*name, "relu");
    ///
    /// // A small `Copy` value comes out as itself.
    /// let sizes = runcache::Cache::new(10);
    /// sizes.put("batch", 32u32).unwrap();
    /// assert_eq!(sizes.get_cloned("batch"), Some(32));
    /// ```
    pub fn get_cloned<Q>(&self, key: &Q) -> Option<V>
    where
        Q: Hash + Equivalent<K> + ?Sized,
        V: Clone,
    {
        self.raw.lookup(key, |k| key.equivalent(k), |v| v.cloned())
    }

    /// The cached value of the key `eq` accepts, found by a `probe` that hashes exactly as that
    /// key does: a tuple of references to a tuple key's fields hashes as the tuple itself, so
    /// layers above look tuple keys up without building (cloning) one.
    pub(crate) fn get_eq<Q: Hash + ?Sized>(
        &self,
        probe: &Q,
        eq: impl Fn(&K) -> bool,
    ) -> Option<Handle<V>> {
        self.raw
            .lookup(probe, eq, |v| v.map(crate::raw::handle_of::<K, V>))
    }

    /// Pins the cache on this thread for a run of reads that touch no reference count; see
    /// [`Pinned`].
    ///
    /// ```
    /// let cache = runcache::Cache::new(100);
    /// for i in 0..10u64 {
    ///     cache.put(i, i * i).unwrap();
    /// }
    /// // Ten reads under one pin, none of which writes a reference count.
    /// let pinned = cache.pin();
    /// let sum: u64 = (0..10).filter_map(|i| pinned.get(&i)).sum();
    /// assert_eq!(sum, 285);
    /// ```
    pub fn pin(&self) -> Pinned<'_, K, V, S> {
        Pinned {
            raw: &self.raw,
            pin: self.raw.pin(),
        }
    }

    /// Whether a value is cached for `key`.
    ///
    /// A peek: it counts neither as a hit nor as a miss in [`stats`](Self::stats), and it
    /// is not a use of the entry for the eviction policy (checking an entry does not keep it
    /// cached, as reading it with [`get`](Self::get) does).
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put("gemm", 1).unwrap();
    /// assert!(cache.contains_key("gemm"));
    /// assert!(!cache.contains_key("conv"));
    /// let stats = cache.stats();
    /// assert_eq!(stats.hits + stats.misses, 0, "a peek is not a lookup");
    /// ```
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.raw.contains(key, None)
    }

    /// Caches `value` under `key`, replacing (and returning) any cached value.
    ///
    /// If a build for `key` is in flight, waits for it and then replaces its result.
    ///
    /// # Errors
    /// When the entry cannot be cached, nothing changes and [`InsertError`] hands `key` and
    /// `value` back: an evicting cache refuses only an entry heavier than its whole capacity
    /// (or anything at capacity 0, or when the door turns it away, or when all the room stays
    /// held by entries being built or by other threads' evictions while it waits a moment:
    /// 0 of 32,000 calls on four threads in a cache of two entries); a rejecting
    /// cache ([`WhenFull::Reject`]) refuses any entry that does not fit in the free capacity.
    ///
    /// ```
    /// use runcache::{Cache, WhenFull};
    ///
    /// let cache = Cache::new(10);
    /// assert!(cache.insert("k", 1).unwrap().is_none());
    /// let old = cache.insert("k", 2).unwrap().expect("the replaced value");
    /// assert_eq!(*old, 1);
    ///
    /// // A rejecting cache hands a refused entry back, whole.
    /// let full = Cache::<&str, u32>::builder().capacity(1).when_full(WhenFull::Reject).build()?;
    /// full.insert("a", 1).unwrap();
    /// let refused = full.insert("b", 2).unwrap_err();
    /// assert_eq!((refused.weight, refused.capacity), (1, 1));
    /// assert_eq!(refused.into_inner(), ("b", 2));
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn insert(&self, key: K, value: V) -> Result<Option<Handle<V>>, InsertError<K, V>> {
        self.raw.insert(key, value, true, None).map_err(refused)
    }

    /// Caches `value` under `key`, replacing any cached value without handing it back: what
    /// [`insert`](Self::insert) does, for a caller that has no use for the old value. It
    /// takes no count of the replaced value (unless an eviction listener hears of it), so a
    /// replacement writes two shared counts fewer than an `insert` whose result is dropped.
    ///
    /// # Errors
    /// As [`insert`](Self::insert): [`InsertError`] hands `key` and `value` back when the
    /// entry cannot be cached, and nothing changes.
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put("kernel", 1).unwrap();
    /// cache.put("kernel", 2).unwrap();
    /// assert_eq!(cache.get_cloned("kernel"), Some(2));
    /// ```
    pub fn put(&self, key: K, value: V) -> Result<(), InsertError<K, V>> {
        self.raw
            .insert(key, value, false, None)
            .map(|_| ())
            .map_err(refused)
    }

    /// Caches `value` under `key` for `ttl` from now, replacing any cached value (and
    /// handing it back, as [`insert`](Self::insert) does): a deadline for this entry, in
    /// place of the one the cache's expiry rule would give it. Later reads and replacements
    /// follow the rule again: a [`time_to_idle`](crate::CacheBuilder::time_to_idle) read
    /// moves the deadline to the idle time from then, an [`Expiry::after_read`] returning
    /// `None` keeps it, and a plain `insert` over it sets the rule's deadline. A `ttl` of zero
    /// expires the entry at once; one past the clock's end never does.
    ///
    /// # Errors
    /// As [`insert`](Self::insert), and also when the cache was built without an expiry rule
    /// ([`time_to_live`](crate::CacheBuilder::time_to_live),
    /// [`time_to_idle`](crate::CacheBuilder::time_to_idle) or
    /// [`expire_after`](crate::CacheBuilder::expire_after)): nothing there would take the
    /// entry out at its deadline, so [`InsertError`] hands `key` and `value` back with
    /// [`no_expiry`](InsertError::no_expiry) set, and nothing changes.
    ///
    /// ```
    /// use runcache::{Cache, Clock};
    /// use std::time::Duration;
    ///
    /// let (clock, hand) = Clock::manual();
    /// let cache = Cache::builder()
    ///     .capacity(10)
    ///     .time_to_live(Duration::from_secs(60))
    ///     .clock(clock)
    ///     .build()?;
    /// cache.insert_expiring("plan", 1, Duration::from_secs(5)).unwrap();
    /// cache.insert("kernel", 2).unwrap();
    /// hand.advance(Duration::from_secs(5));
    /// assert_eq!(cache.get_cloned("plan"), None, "its own deadline");
    /// assert_eq!(cache.get_cloned("kernel"), Some(2), "the cache's rule: 60 s");
    ///
    /// let plain = Cache::new(10);
    /// let err = plain.insert_expiring("plan", 1, Duration::from_secs(5)).unwrap_err();
    /// assert!(err.no_expiry, "{err}");
    /// assert_eq!(err.into_inner(), ("plan", 1));
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn insert_expiring(
        &self,
        key: K,
        value: V,
        ttl: Duration,
    ) -> Result<Option<Handle<V>>, InsertError<K, V>> {
        self.raw
            .insert(key, value, true, Some(ttl))
            .map_err(refused)
    }

    /// The value for `key`, built by `build` if it is missing.
    ///
    /// # Single flight
    /// `build` runs at most once per key at a time: callers that ask for a key being built
    /// park on the entry (a futex; no spinning, no lock) and receive the same value when it is
    /// ready. A value that cannot be cached (see [`insert`](Self::insert) for when) is still
    /// returned, to this caller and to those waiting, but not cached.
    ///
    /// # Panics
    /// A panic in `build` (or in the weigher) reaches this caller; the entry is released, and
    /// one of the waiting callers runs its own builder. Nothing is poisoned and nothing hangs.
    ///
    /// # Recursion
    /// If `build` asks this cache for the same key on the same thread, that inner call panics
    /// with a message saying so, instead of waiting for itself forever; the panic names the
    /// inner call's line. The fallible forms
    /// ([`try_get_or_insert_with`](Self::try_get_or_insert_with),
    /// [`get_or_build`](Self::get_or_build)) return [`BuildError::Recursion`] with the key
    /// instead. (A builder that hands the same request to another thread and waits for it
    /// is not detected.)
    ///
    /// ```
    /// let cache = runcache::Cache::new(100);
    /// let compiled = cache.get_or_insert_with((3, 3), || format!("conv {}x{}", 3, 3));
    /// assert_eq!(*compiled, "conv 3x3");
    /// // The second call finds it: its builder does not run.
    /// let again = cache.get_or_insert_with((3, 3), || unreachable!());
    /// assert!(runcache::Handle::ptr_eq(&compiled, &again));
    /// ```
    #[track_caller]
    pub fn get_or_insert_with(&self, key: K, build: impl FnOnce() -> V) -> Handle<V> {
        match self.raw.get_or_build::<Infallible, _>(key, |_| Ok(build())) {
            Ok(Served::Hit(v) | Served::Shared(v) | Served::Built { value: v, .. }) => v,
            Ok(Served::Failed(e)) => match *e {},
            Err(r) => r.panic(),
        }
    }

    /// Like [`get_or_insert_with`](Self::get_or_insert_with), for a builder that can fail.
    ///
    /// # Errors
    /// [`BuildError::Failed`] with the builder's error, shared by this caller and every
    /// caller that waited on that attempt: nothing is cached, and the next call builds again.
    /// (A waiter whose own error type differs from the failed builder's runs its own builder
    /// instead.) [`BuildError::Recursion`], with the key, if this call comes from inside the
    /// key's own build on this thread (see [`get_or_insert_with`](Self::get_or_insert_with),
    /// "Recursion").
    ///
    /// ```
    /// let cache = runcache::Cache::new(100);
    /// let failed = cache.try_get_or_insert_with("kernel", || Err::<u32, _>("no compiler"));
    /// assert_eq!(failed.unwrap_err().failed(), Some(&"no compiler"));
    /// assert!(!cache.contains_key("kernel"), "a failure is not cached");
    /// let built = cache.try_get_or_insert_with("kernel", || Ok::<_, &str>(7)).unwrap();
    /// assert_eq!(*built, 7);
    /// ```
    #[track_caller]
    pub fn try_get_or_insert_with<E>(
        &self,
        key: K,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<Handle<V>, BuildError<K, E>>
    where
        E: Send + Sync + 'static,
    {
        self.get_or_build(key, |_| build()).map(|f| f.value)
    }

    /// The single-flight lookup with every detail: the builder gets the key, and the result
    /// says whether the value was a hit, shared, cached or built uncached.
    ///
    /// # Errors
    /// As [`try_get_or_insert_with`](Self::try_get_or_insert_with).
    ///
    /// ```
    /// use runcache::Source;
    /// use std::convert::Infallible;
    ///
    /// let cache = runcache::Cache::new(100);
    /// let first = cache.get_or_build(4, |k| Ok::<_, Infallible>(k * 10)).unwrap();
    /// assert_eq!((*first.value, first.source), (40, Source::Cached));
    /// let second = cache.get_or_build(4, |_| Ok::<_, Infallible>(0)).unwrap();
    /// assert_eq!((*second.value, second.source), (40, Source::Hit));
    /// ```
    #[track_caller]
    pub fn get_or_build<E>(
        &self,
        key: K,
        build: impl FnOnce(&K) -> Result<V, E>,
    ) -> Result<Fetched<V>, BuildError<K, E>>
    where
        E: Send + Sync + 'static,
    {
        fetched(self.raw.get_or_build(key, build))
    }

    /// [`get_or_build`](Self::get_or_build) for the key that `eq` accepts, found by a
    /// `probe` that hashes as that key does (see [`get_eq`](Self::get_eq)); `key` makes the
    /// owned key only on a miss, so a hit clones nothing.
    #[track_caller]
    pub(crate) fn get_or_build_from<Q, E>(
        &self,
        probe: &Q,
        eq: impl Fn(&K) -> bool,
        key: impl FnOnce() -> K,
        build: impl FnOnce(&K) -> Result<V, E>,
    ) -> Result<Fetched<V>, BuildError<K, E>>
    where
        Q: Hash + ?Sized,
        E: Send + Sync + 'static,
    {
        fetched(self.raw.get_or_build_from(probe, eq, key, build))
    }

    /// The value for `key`, built from the key if missing, and whether this call built it:
    /// the shape of OpenVINO's runtime cache `getOrCreate`. Single-flight as
    /// [`get_or_insert_with`](Self::get_or_insert_with).
    ///
    /// ```
    /// use runcache::Lookup;
    ///
    /// let cache = runcache::Cache::new(100);
    /// let (value, how) = cache.get_or_create(&"softmax", |name| name.len());
    /// assert_eq!((*value, how), (7, Lookup::Miss));
    /// let (_, how) = cache.get_or_create(&"softmax", |name| name.len());
    /// assert_eq!(how, Lookup::Hit);
    /// ```
    #[track_caller]
    pub fn get_or_create(&self, key: &K, build: impl FnOnce(&K) -> V) -> (Handle<V>, Lookup)
    where
        K: Clone,
    {
        match self.raw.get_or_build_from::<_, Infallible, _>(
            key,
            |k| k == key,
            || key.clone(),
            |k| Ok(build(k)),
        ) {
            Ok(Served::Hit(v) | Served::Shared(v)) => (v, Lookup::Hit),
            Ok(Served::Built { value, .. }) => (value, Lookup::Miss),
            Ok(Served::Failed(e)) => match *e {},
            Err(r) => r.panic(),
        }
    }

    /// Removes the cached value for `key` and returns it. The value itself lives on while any
    /// caller holds a handle of it. A build in flight for `key` is not affected.
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put(1, String::from("gemm")).unwrap();
    /// let removed = cache.remove(&1).expect("it was cached");
    /// assert_eq!(*removed, "gemm", "the caller holds the value on");
    /// assert!(cache.remove(&1).is_none());
    /// assert_eq!(cache.stats().removals, 1);
    /// ```
    pub fn remove<Q>(&self, key: &Q) -> Option<Handle<V>>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.raw.remove(key)
    }

    /// Removes the cached value for `key` without handing it back: whether one was cached.
    /// What [`remove`](Self::remove) does, for a caller that has no use for the value: it
    /// takes no count of it (unless an eviction listener hears of the removal). A build in
    /// flight for `key` is not affected.
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put(7, "seven").unwrap();
    /// assert!(cache.invalidate(&7));
    /// assert!(!cache.invalidate(&7), "nothing left to remove");
    /// ```
    pub fn invalidate<Q>(&self, key: &Q) -> bool
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.raw.invalidate(key)
    }

    /// Removes the cached value for `key` only if `pred` accepts it (checked and removed in
    /// one atomic step: a value replaced meanwhile is not removed).
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put("plan", 3).unwrap();
    /// assert!(cache.remove_if("plan", |v| *v > 5).is_none(), "the predicate refused");
    /// assert_eq!(cache.remove_if("plan", |v| *v == 3).as_deref(), Some(&3));
    /// assert!(cache.is_empty());
    /// ```
    pub fn remove_if<Q>(&self, key: &Q, pred: impl Fn(&V) -> bool) -> Option<Handle<V>>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.raw.remove_if(key, pred)
    }

    /// Keeps only the entries that `keep` accepts: every cached entry is shown to `keep`
    /// once, and those it refuses are removed (counted in [`Stats::removals`], reported to
    /// the eviction listener as [`RemovalCause::Removed`]). Returns how many this call
    /// removed.
    ///
    /// Other threads may use the cache meanwhile: an entry inserted during the call may or
    /// may not be shown, and an entry replaced after `keep` saw it is kept, since its new
    /// value was not asked about. `keep` may use the cache itself. Builds in flight are not
    /// affected. If `keep` panics, the entries removed before stay removed.
    ///
    /// ```
    /// use runcache::Cache;
    ///
    /// let cache: Cache<(u32, u32), String> = Cache::new(100);
    /// for session in 0..3 {
    ///     cache.insert((session, 7), format!("kernel for session {session}")).unwrap();
    /// }
    /// // Session 1 ended: drop everything it compiled.
    /// assert_eq!(cache.retain(|&(session, _), _| session != 1), 1);
    /// assert!(cache.get(&(1, 7)).is_none());
    /// assert_eq!(cache.len(), 2);
    /// ```
    pub fn retain(&self, keep: impl FnMut(&K, &V) -> bool) -> usize {
        self.raw.retain(keep)
    }

    /// Removes every cached value (builds in flight are not affected).
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put(1, "a").unwrap();
    /// let held = cache.get(&1).unwrap();
    /// cache.clear();
    /// assert!(cache.is_empty());
    /// assert_eq!(*held, "a", "a held value survives the clear");
    /// ```
    pub fn clear(&self) {
        self.raw.clear();
    }
}

impl<K, V, S> fmt::Debug for Cache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("len", &self.len())
            .field("weighted_size", &self.weighted_size())
            .field("capacity", &self.capacity())
            .field("shards", &self.shards())
            .finish_non_exhaustive()
    }
}

/// A single-flight result as [`Cache::get_or_build`] and
/// [`Cache::get_or_build_async`] report it.
fn fetched<K, V, E>(
    served: Result<Served<V, E>, Recursion<K>>,
) -> Result<Fetched<V>, BuildError<K, E>> {
    let (value, source) = match served {
        Ok(Served::Hit(v)) => (v, Source::Hit),
        Ok(Served::Shared(v)) => (v, Source::Shared),
        Ok(Served::Built {
            value,
            cached: true,
        }) => (value, Source::Cached),
        Ok(Served::Built {
            value,
            cached: false,
        }) => (value, Source::Uncached),
        Ok(Served::Failed(e)) => return Err(BuildError::Failed(e)),
        Err(Recursion(key)) => return Err(BuildError::Recursion(RecursionError { key })),
    };
    Ok(Fetched { value, source })
}

/// The error of a refused insert: the key and the value back, with why.
fn refused<K, V>(r: crate::raw::Refused<K, V>) -> InsertError<K, V> {
    InsertError {
        key: r.key,
        value: r.value,
        weight: r.weight,
        capacity: r.capacity,
        turned_away: r.turned,
        no_expiry: r.no_expiry,
    }
}
