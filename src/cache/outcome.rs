//! What a cache's lookups report: [`Lookup`], [`Source`], [`Fetched`] and the activity
//! counters, [`Stats`].

#![forbid(unsafe_code)]

use super::Handle;
// For the docs' links only.
#[cfg(doc)]
use super::{Cache, Pinned};

/// Whether [`Cache::get_or_create`] found the value or ran the builder.
///
/// ```
/// use runcache::{Cache, Lookup};
///
/// let cache = Cache::new(10);
/// assert_eq!(cache.get_or_create(&1, |k| k + 1).1, Lookup::Miss);
/// assert_eq!(cache.get_or_create(&1, |k| k + 1).1, Lookup::Hit);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lookup {
    /// The value was cached, or another caller built it while this one waited.
    Hit,
    /// This call ran the builder (whether or not the value then fit in the cache).
    Miss,
}

/// Where a value returned by [`Cache::get_or_build`] came from.
///
/// ```
/// use runcache::{Cache, Source};
/// use std::convert::Infallible;
///
/// // Capacity 0: a disabled cache builds every time and caches nothing.
/// let off = Cache::<u32, u32>::new(0);
/// let fetched = off.get_or_build(1, |_| Ok::<_, Infallible>(1)).unwrap();
/// assert_eq!(fetched.source, Source::Uncached);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// It was cached.
    Hit,
    /// Another caller was building it; this one waited and shares the result.
    Shared,
    /// This caller built it and it is now cached.
    Cached,
    /// This caller built it but it is not cached: it did not fit, the eviction policy turned
    /// it away (see [`WhenFull::Evict`](crate::WhenFull::Evict)), or the cache is disabled.
    Uncached,
}

/// A value from [`Cache::get_or_build`] and where it came from.
///
/// ```
/// use runcache::{Cache, Fetched, Source};
///
/// let cache = Cache::new(10);
/// let Fetched { value, source } = cache.get_or_build("k", |_| Ok::<_, String>(1)).unwrap();
/// assert_eq!((*value, source), (1, Source::Cached));
/// ```
#[derive(Debug)]
pub struct Fetched<V> {
    /// The value.
    pub value: Handle<V>,
    /// Where it came from.
    pub source: Source,
}

/// Counters of a cache's activity; exact once no operation is in flight and no [`Pinned`]
/// handle is alive (a `Pinned` handle adds its lookups' hits and misses when it drops).
///
/// ```
/// let cache = runcache::Cache::<u32, u32>::builder().capacity(1).build()?;
/// cache.get_or_insert_with(1, || 10);
/// cache.get_or_insert_with(2, || 20); // evicts key 1
/// let stats = cache.stats();
/// assert_eq!((stats.misses, stats.builds, stats.evictions), (2, 2, 1));
/// # Ok::<(), runcache::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Lookups that found a cached value.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Builder runs.
    pub builds: u64,
    /// Builder runs that returned an error.
    pub build_failures: u64,
    /// Callers that waited for another caller's build. Such a caller counts here, not as a
    /// hit or a miss, unless the build it waited for left nothing it can take (the builder
    /// panicked, or failed with an error of another type): then its own next try counts
    /// too, as a hit or a miss.
    pub waits: u64,
    /// Values that were built or inserted but not cached: they did not fit, or the eviction
    /// policy turned them away (see [`WhenFull::Evict`](crate::WhenFull::Evict)).
    pub rejections: u64,
    /// Entries evicted to make room for new ones, or removed to honour a smaller capacity.
    pub evictions: u64,
    /// Entries removed by [`Cache::remove`], [`Cache::remove_if`] or [`Cache::retain`].
    pub removals: u64,
    /// Entries taken out because their deadline passed (see
    /// [`CacheBuilder::time_to_live`](crate::CacheBuilder::time_to_live)).
    pub expirations: u64,
}

impl Stats {
    /// The activity between `earlier` and `self` (each counter's difference).
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put(1, 1).unwrap();
    /// let before = cache.stats();
    /// let _ = cache.get(&1);
    /// let _ = cache.get(&2);
    /// let window = cache.stats().since(&before);
    /// assert_eq!((window.hits, window.misses), (1, 1));
    /// ```
    #[must_use]
    pub fn since(&self, earlier: &Stats) -> Stats {
        Stats {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            builds: self.builds.saturating_sub(earlier.builds),
            build_failures: self.build_failures.saturating_sub(earlier.build_failures),
            waits: self.waits.saturating_sub(earlier.waits),
            rejections: self.rejections.saturating_sub(earlier.rejections),
            evictions: self.evictions.saturating_sub(earlier.evictions),
            removals: self.removals.saturating_sub(earlier.removals),
            expirations: self.expirations.saturating_sub(earlier.expirations),
        }
    }

    /// `hits / (hits + misses)`, or 0 before any lookup.
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// assert_eq!(cache.stats().hit_ratio(), 0.0, "no lookup yet");
    /// cache.put(1, 1).unwrap();
    /// for key in [1, 1, 1, 2] {
    ///     let _ = cache.get(&key);
    /// }
    /// assert_eq!(cache.stats().hit_ratio(), 0.75);
    /// ```
    #[must_use]
    pub fn hit_ratio(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}
