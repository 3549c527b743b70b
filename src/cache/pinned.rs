//! [`Pinned`]: a cache pinned on one thread, whose reads borrow values and write no count.

#![forbid(unsafe_code)]

use super::DefaultHashBuilder;
use crate::raw::{Pin, RawCache};
use equivalent::Equivalent;
use std::fmt;
use std::hash::{BuildHasher, Hash};

/// A cache pinned on the current thread: reads through it return plain references and touch
/// no reference count.
///
/// While a `Pinned` lives, memory of entries removed by any thread is not freed (it is freed
/// after the last pin of that time is dropped), so keep it for a run of reads, not forever.
/// Its lookups reach [`Cache::stats`](super::Cache::stats) when it drops, all at once, so that a run of pinned
/// reads writes no counter per read. It cannot leave its thread.
///
/// ```
/// let cache = runcache::Cache::new(10);
/// cache.put("scale", 0.5f32).unwrap();
/// {
///     let pinned = cache.pin();
///     let scale: &f32 = pinned.get("scale").unwrap(); // a plain reference, no count taken
///     assert_eq!(*scale, 0.5);
/// } // unpinned here; its lookups reach the stats now
/// assert_eq!(cache.stats().hits, 1);
/// ```
#[must_use = "dropping a Pinned unpins at once"]
pub struct Pinned<'c, K, V, S = DefaultHashBuilder> {
    pub(super) raw: &'c RawCache<K, V, S>,
    pub(super) pin: Pin<'c>,
}

impl<K, V, S> Pinned<'_, K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The cached value for `key`, borrowed for as long as this pin.
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put(7, String::from("seven")).unwrap();
    /// let pinned = cache.pin();
    /// assert_eq!(pinned.get(&7).map(String::as_str), Some("seven"));
    /// assert!(pinned.get(&8).is_none());
    /// ```
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        debug_assert!(self.raw.owns(&self.pin.guard));
        self.raw.get(key, &self.pin)
    }

    /// Whether a value is cached for `key`: a peek, as
    /// [`Cache::contains_key`](crate::Cache::contains_key) is (no hit or miss counted, no
    /// use of the entry for the eviction policy).
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put(7, 49).unwrap();
    /// let pinned = cache.pin();
    /// assert!(pinned.contains_key(&7));
    /// assert!(!pinned.contains_key(&8));
    /// ```
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        debug_assert!(self.raw.owns(&self.pin.guard));
        self.raw.contains(key, Some(&self.pin))
    }

    /// The cached entries, borrowed for as long as this pin, in no particular order.
    ///
    /// Other threads may change the cache meanwhile; the iteration is weakly consistent:
    ///
    /// - an entry cached from the call to the iteration's end is yielded exactly once, with
    ///   its value at the moment the iteration reaches it;
    /// - an entry inserted or removed meanwhile may or may not be yielded;
    /// - an entry removed and inserted again meanwhile may be yielded once per insertion.
    ///
    /// Builds in flight are not yielded. Iterating reads only, except that a table
    /// migration in flight (the table growing, or shedding removed entries) is finished when
    /// the iteration reaches its shard, as the next writer of that shard would. Lookups
    /// made this way are not counted in [`Cache::stats`](super::Cache::stats).
    ///
    /// ```
    /// use runcache::Cache;
    ///
    /// let cache: Cache<&str, u32> = Cache::new(10);
    /// cache.insert("conv", 3).unwrap();
    /// cache.insert("gemm", 4).unwrap();
    /// let pinned = cache.pin();
    /// let mut entries: Vec<_> = pinned.iter().collect();
    /// entries.sort();
    /// assert_eq!(entries, [(&"conv", &3), (&"gemm", &4)]);
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        debug_assert!(self.raw.owns(&self.pin.guard));
        self.raw.entries(&self.pin)
    }
}

impl<K, V, S> fmt::Debug for Pinned<'_, K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pinned").finish_non_exhaustive()
    }
}
