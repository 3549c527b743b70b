//! One evicting cache per key type: OpenVINO's runtime parameters cache, shared by all
//! threads.
//!
//! OpenVINO's CPU plugin keeps a `MultiCache` with one LRU cache per key type (the executors of
//! each kind of node, keyed by shapes and parameters). Its cache is not thread-safe and is
//! duplicated per stream. A [`MultiCache`] is one cache for all threads:
//!
//! - [`MultiCache::get_or_create`] finds (or lazily creates, once) the cache of the key and
//!   value types, then looks the key up with the core's single-flight `get_or_create`.
//! - Finding the per-type cache costs no lock, no pin and no allocation: per-type caches are
//!   never dropped before the multi-cache, so the type map is an append-only lock-free map of
//!   `TypeId`s, and the key itself proves the stored type (no second check).
//! - Every per-type cache evicts with the core's policy and holds at most `capacity` entries;
//!   capacity 0 builds on every call and reports a miss.
//! - A builder that yields no value ([`try_get_or_create`](MultiCache::try_get_or_create) with
//!   an error, [`get_or_create_opt`](MultiCache::get_or_create_opt) with `None`) caches nothing
//!   and is asked again next time.
//!
//! ```
//! use runcache::multi::MultiCache;
//! use runcache::Lookup;
//!
//! #[derive(Clone, PartialEq, Eq, Hash)]
//! struct ConvKey { shape: [usize; 4] }
//! #[derive(Clone, PartialEq, Eq, Hash)]
//! struct PoolKey { window: usize }
//!
//! let cache = MultiCache::default(); // 5000 entries per key type, like OpenVINO
//! let (conv, how) = cache.get_or_create(&ConvKey { shape: [1, 3, 224, 224] }, |k| k.shape.iter().product::<usize>());
//! assert_eq!((*conv, how), (150_528, Lookup::Miss));
//! // The value type selects the cache too, so say it where the builder does not.
//! let (_, how) = cache.get_or_create(&ConvKey { shape: [1, 3, 224, 224] }, |_| -> usize { unreachable!() });
//! assert_eq!(how, Lookup::Hit);
//! let (pool, _) = cache.get_or_create(&PoolKey { window: 3 }, |k| format!("pool {}", k.window));
//! assert_eq!(*pool, "pool 3");
//! assert_eq!(cache.type_count(), 2);
//! ```

// No unsafe code here; the crate-wide `deny(unsafe_code)` holds, and only the child module
// that needs unsafe allows it (a `forbid` here would bind the children too).

mod typemap;

use crate::cache::{Cache, Handle, Lookup, Source};
use crate::error::{BuildError, RecursionError};
use crate::raw::Recursion;
use std::any::Any;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use typemap::{AsAny, TypeMap};

/// OpenVINO's default capacity per key type.
pub const DEFAULT_CAPACITY: u64 = 5000;

/// A per-type cache, type-erased, with a way to clear it without knowing its types.
struct Erased {
    cache: Box<dyn Any + Send + Sync>,
    clear: fn(&(dyn Any + Send + Sync)),
}

impl AsAny for Erased {
    fn as_any(&self) -> &(dyn Any + Send + Sync) {
        &*self.cache
    }
}

fn clear_cache<K, V>(cache: &(dyn Any + Send + Sync))
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    if let Some(c) = cache.downcast_ref::<Cache<K, V>>() {
        c.clear();
    }
}

/// One evicting cache per (key type, value type); see the [module docs](self).
///
/// ```
/// use runcache::multi::MultiCache;
///
/// // One cache per key type, each holding at most 100 entries.
/// let cache = MultiCache::new(100);
/// let (gemm, _) = cache.get_or_create(&(64u32, 64u32), |&(m, n)| format!("gemm {m}x{n}"));
/// let (relu, _) = cache.get_or_create(&"relu", |name| name.len());
/// assert_eq!((gemm.as_str(), *relu), ("gemm 64x64", 4));
/// assert_eq!(cache.type_count(), 2);
/// ```
pub struct MultiCache {
    capacity: u64,
    /// `TypeId::of::<Cache<K, V>>()` → that cache, created on first use, kept until drop.
    types: TypeMap<Erased>,
}

impl Default for MultiCache {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl MultiCache {
    /// A multi-cache whose per-type caches each hold at most `capacity` entries (0: none, so
    /// every call builds).
    ///
    /// ```
    /// use runcache::{multi::MultiCache, Lookup};
    ///
    /// let off = MultiCache::new(0); // every call builds
    /// assert_eq!(off.get_or_create(&1u8, |k| *k).1, Lookup::Miss);
    /// assert_eq!(off.get_or_create(&1u8, |k| *k).1, Lookup::Miss);
    /// ```
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            types: TypeMap::new(),
        }
    }

    /// The capacity of each per-type cache.
    ///
    /// ```
    /// use runcache::multi::{MultiCache, DEFAULT_CAPACITY};
    ///
    /// assert_eq!(MultiCache::default().capacity(), DEFAULT_CAPACITY);
    /// assert_eq!(MultiCache::new(10).capacity(), 10);
    /// ```
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// How many per-type caches exist.
    ///
    /// ```
    /// let cache = runcache::multi::MultiCache::new(10);
    /// cache.get_or_create(&1u32, |k| *k);
    /// cache.get_or_create(&1u32, |k| k.to_string()); // same key type, another value type
    /// assert_eq!(cache.type_count(), 2);
    /// ```
    pub fn type_count(&self) -> usize {
        let mut n = 0;
        self.types.for_each(|_| n += 1);
        n
    }

    /// The cache of `(K, V)`, created on first use. No lock, no pin, no allocation on a hit.
    #[inline]
    fn typed<K, V>(&self) -> &Cache<K, V>
    where
        K: Hash + Eq + Send + Sync + 'static,
        V: Send + Sync + 'static,
    {
        self.types.typed::<Cache<K, V>>(|| Erased {
            cache: Box::new(Cache::<K, V>::new(self.capacity)),
            clear: clear_cache::<K, V>,
        })
    }

    /// The value for `key`, built by `build` if missing, and whether it was found (the shape
    /// of OpenVINO's `getOrCreate`). Single-flight per key, as the core cache.
    ///
    /// ```
    /// use runcache::{multi::MultiCache, Lookup};
    ///
    /// let cache = MultiCache::new(10);
    /// let (value, how) = cache.get_or_create(&"conv", |k| k.len());
    /// assert_eq!((*value, how), (4, Lookup::Miss));
    /// let (_, how) = cache.get_or_create(&"conv", |_| -> usize { unreachable!() });
    /// assert_eq!(how, Lookup::Hit);
    /// ```
    #[track_caller]
    pub fn get_or_create<K, V>(&self, key: &K, build: impl FnOnce(&K) -> V) -> (Handle<V>, Lookup)
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
        V: Send + Sync + 'static,
    {
        self.typed::<K, V>().get_or_create(key, build)
    }

    /// Like [`get_or_create`](Self::get_or_create), for a builder that can fail: an error is
    /// returned (to this caller and any that waited on the attempt), nothing is cached, and
    /// the builder is asked again next time.
    ///
    /// # Errors
    /// [`BuildError::Failed`] with the builder's error, or [`BuildError::Recursion`] if
    /// `build` asks for its own key (as [`Cache::try_get_or_insert_with`]).
    ///
    /// ```
    /// let cache = runcache::multi::MultiCache::new(10);
    /// let err = cache.try_get_or_create(&7u32, |_| Err::<String, _>("unsupported shape"));
    /// assert_eq!(err.unwrap_err().failed(), Some(&"unsupported shape"));
    /// let (ok, _) = cache.try_get_or_create(&7u32, |k| Ok::<_, &str>(k.to_string())).unwrap();
    /// assert_eq!(*ok, "7");
    /// ```
    pub fn try_get_or_create<K, V, E>(
        &self,
        key: &K,
        build: impl FnOnce(&K) -> Result<V, E>,
    ) -> Result<(Handle<V>, Lookup), BuildError<K, E>>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
        V: Send + Sync + 'static,
        E: Send + Sync + 'static,
    {
        let fetched =
            self.typed::<K, V>()
                .get_or_build_from(key, |k| k == key, || key.clone(), build)?;
        Ok((fetched.value, lookup(fetched.source)))
    }

    /// Like [`get_or_create`](Self::get_or_create), for a builder that may yield nothing:
    /// `None` is returned, nothing is cached, and the builder is asked again next time. A
    /// build that asks for its own key panics, as `get_or_create`'s does.
    ///
    /// ```
    /// let cache = runcache::multi::MultiCache::new(10);
    /// assert!(cache.get_or_create_opt(&3u32, |_| None::<u64>).is_none(), "nothing cached");
    /// let (v, _) = cache.get_or_create_opt(&3u32, |k| Some(u64::from(*k) * 2)).unwrap();
    /// assert_eq!(*v, 6);
    /// ```
    #[track_caller]
    pub fn get_or_create_opt<K, V>(
        &self,
        key: &K,
        build: impl FnOnce(&K) -> Option<V>,
    ) -> Option<(Handle<V>, Lookup)>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
        V: Send + Sync + 'static,
    {
        match self.try_get_or_create(key, |k| build(k).ok_or(NoValue)) {
            Ok(found) => Some(found),
            Err(BuildError::Failed(_)) => None,
            Err(BuildError::Recursion(r)) => Recursion(r.key).panic(),
        }
    }

    /// The async form of [`get_or_create`](Self::get_or_create): `build` is polled only on
    /// a miss, by one caller per key at a time, and the others wait without blocking their
    /// thread (as [`Cache::get_or_insert_with_async`]). A hit clones no key.
    ///
    /// # Errors
    /// [`RecursionError`], with the key, if `build` asks for its own key from inside its
    /// poll.
    ///
    /// ```
    /// use runcache::{multi::MultiCache, Lookup};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let cache = MultiCache::new(10);
    /// let (v, how) = cache.get_or_create_async(&1u32, async { "one" }).await.unwrap();
    /// assert_eq!((*v, how), ("one", Lookup::Miss));
    /// # });
    /// ```
    pub async fn get_or_create_async<K, V, F>(
        &self,
        key: &K,
        build: F,
    ) -> Result<(Handle<V>, Lookup), RecursionError<K>>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
        V: Send + Sync + 'static,
        F: Future<Output = V>,
    {
        self.try_get_or_create_async::<K, V, Infallible, _>(key, async { Ok(build.await) })
            .await
            .map_err(BuildError::into_recursion)
    }

    /// The async form of [`try_get_or_create`](Self::try_get_or_create).
    ///
    /// # Errors
    /// [`BuildError::Failed`] with the build's error (shared with every caller that waited on
    /// the attempt; nothing is cached), or [`BuildError::Recursion`].
    ///
    /// ```
    /// use runcache::BuildError;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let cache = runcache::multi::MultiCache::new(10);
    /// let err = cache.try_get_or_create_async::<u32, u32, _, _>(&1, async { Err("no device") }).await;
    /// assert!(matches!(err, Err(BuildError::Failed(e)) if *e == "no device"));
    /// # });
    /// ```
    pub async fn try_get_or_create_async<K, V, E, F>(
        &self,
        key: &K,
        build: F,
    ) -> Result<(Handle<V>, Lookup), BuildError<K, E>>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
        V: Send + Sync + 'static,
        E: Send + Sync + 'static,
        F: Future<Output = Result<V, E>>,
    {
        let fetched = self
            .typed::<K, V>()
            .get_or_build_async_from(key, |k| k == key, || key.clone(), build)
            .await?;
        Ok((fetched.value, lookup(fetched.source)))
    }

    /// Removes the value for `key` from the cache of `(K, V)`; callers holding it keep it.
    ///
    /// ```
    /// let cache = runcache::multi::MultiCache::new(10);
    /// cache.get_or_create(&1u32, |_| "one");
    /// // The value type names the cache to remove from.
    /// assert_eq!(cache.remove::<u32, &str>(&1).as_deref(), Some(&"one"));
    /// assert!(cache.remove::<u32, &str>(&1).is_none());
    /// ```
    pub fn remove<K, V>(&self, key: &K) -> Option<Handle<V>>
    where
        K: Hash + Eq + Send + Sync + 'static,
        V: Send + Sync + 'static,
    {
        self.typed::<K, V>().remove(key)
    }

    /// The activity counters of the cache of `(K, V)`.
    ///
    /// ```
    /// let cache = runcache::multi::MultiCache::new(10);
    /// for _ in 0..3 {
    ///     cache.get_or_create(&1u32, |_| 1u64);
    /// }
    /// let stats = cache.stats::<u32, u64>();
    /// assert_eq!((stats.builds, stats.hits), (1, 2));
    /// ```
    pub fn stats<K, V>(&self) -> crate::cache::Stats
    where
        K: Hash + Eq + Send + Sync + 'static,
        V: Send + Sync + 'static,
    {
        self.typed::<K, V>().stats()
    }

    /// Removes every cached value of every type (callers holding values keep them).
    ///
    /// ```
    /// let cache = runcache::multi::MultiCache::new(10);
    /// cache.get_or_create(&1u32, |_| 1u64);
    /// cache.get_or_create(&"a", |_| 'a');
    /// cache.clear();
    /// assert_eq!(cache.stats::<u32, u64>().hits, 0);
    /// assert!(cache.remove::<u32, u64>(&1).is_none());
    /// ```
    pub fn clear(&self) {
        self.types.for_each(|e| (e.clear)(&*e.cache));
    }
}

/// Whether a value was found (a hit, or shared from another caller's build) or built.
fn lookup(source: Source) -> Lookup {
    match source {
        Source::Hit | Source::Shared => Lookup::Hit,
        _ => Lookup::Miss,
    }
}

/// The error a `None` from an `Option` builder becomes internally.
#[derive(Debug)]
struct NoValue;

impl fmt::Debug for MultiCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiCache")
            .field("capacity", &self.capacity)
            .field("types", &self.type_count())
            .finish()
    }
}
