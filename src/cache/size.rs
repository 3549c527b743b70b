//! The cache's sizes, capacity, statistics and upkeep: what a caller reads of a cache as a
//! whole and the calls that change it as a whole (capacity, expiry's purge, reclamation).

#![forbid(unsafe_code)]

use super::{Cache, Stats};
use crate::error::CapacityError;
use crate::raw::counter::Counter;
use std::hash::{BuildHasher, Hash};

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The number of cached entries (exact once no operation is in flight).
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// assert_eq!(cache.len(), 0);
    /// cache.put("a", 1).unwrap();
    /// cache.put("b", 2).unwrap();
    /// cache.put("a", 3).unwrap(); // a replacement
    /// assert_eq!(cache.len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether no entry is cached.
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// assert!(cache.is_empty());
    /// cache.put("a", 1).unwrap();
    /// assert!(!cache.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The total weight of cached entries (and of entries being published this instant).
    /// Never above the capacity; to see both at one instant while other threads change them,
    /// use [`weighted_size_and_capacity`](Self::weighted_size_and_capacity).
    ///
    /// ```
    /// let cache = runcache::Cache::<u32, Vec<u8>>::builder()
    ///     .capacity(1000)
    ///     .weigher(|_, bytes| bytes.len() as u64)
    ///     .build()?;
    /// cache.put(1, vec![0; 300]).unwrap();
    /// cache.put(2, vec![0; 200]).unwrap();
    /// assert_eq!(cache.weighted_size(), 500);
    /// assert_eq!(cache.len(), 2);
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn weighted_size(&self) -> u64 {
        self.raw.weighted_size()
    }

    /// The weighted size and the capacity read together: the size is read against the
    /// capacity read with it, so the first is never above the second, even while other
    /// threads insert or change the capacity.
    ///
    /// ```
    /// let cache = runcache::Cache::new(8);
    /// cache.put("a", 1).unwrap();
    /// let (size, capacity) = cache.weighted_size_and_capacity();
    /// assert!(size <= capacity);
    /// assert_eq!((size, capacity), (1, 8));
    /// ```
    pub fn weighted_size_and_capacity(&self) -> (u64, u64) {
        self.raw.usage()
    }

    /// The capacity in force. During a shrink by [`set_capacity`](Self::set_capacity) it
    /// follows the weighted size down to the new value, so it is never below the size.
    ///
    /// ```
    /// let cache = runcache::Cache::<u32, u32>::new(64);
    /// assert_eq!(cache.capacity(), 64);
    /// cache.set_capacity(16);
    /// assert_eq!(cache.capacity(), 16);
    /// ```
    pub fn capacity(&self) -> u64 {
        self.raw.capacity()
    }

    /// Changes the capacity. A larger one keeps every entry; a smaller one removes entries
    /// until the rest fits — in eviction-policy order for an evicting cache, in table order
    /// for a rejecting one (they count as evictions); 0 clears the cache and disables it, so
    /// that every `get_or_*` call returns its value uncached (concurrent callers of one key
    /// still share one build). Calls racing each other leave the capacity at the target set
    /// last.
    ///
    /// A shrink waits a moment for weight that entries being published hold; if that weight
    /// still cannot be evicted then, it stops with a [`CapacityError`] saying where the
    /// capacity stayed, rather than wait for ever.
    ///
    /// ```
    /// let cache = runcache::Cache::new(100);
    /// for i in 0..100 {
    ///     cache.put(i, i).unwrap();
    /// }
    /// cache.set_capacity(10)?; // removes entries until 10 remain
    /// assert_eq!(cache.len(), 10);
    /// assert_eq!(cache.stats().evictions, 90);
    ///
    /// cache.set_capacity(0)?; // clears and disables
    /// let built = cache.get_or_insert_with(1, || 1);
    /// assert_eq!(*built, 1);
    /// assert!(cache.is_empty(), "a disabled cache returns what it builds, uncached");
    /// # Ok::<(), runcache::CapacityError>(())
    /// ```
    pub fn set_capacity(&self, capacity: u64) -> Result<(), CapacityError> {
        self.raw
            .set_capacity(capacity)
            .map_err(CapacityError::from_parts)
    }

    /// Like [`set_capacity`](Self::set_capacity), but a shrink removes the entries with the
    /// lowest `rank` first (a last-use stamp gives least-recently-used order, say). `rank` is
    /// called once per cached entry, only when entries must go.
    ///
    /// ```
    /// // Each value carries its last-use stamp: a shrink keeps the most recently used.
    /// let cache = runcache::Cache::new(10);
    /// for (key, stamp) in [("old", 1u64), ("newer", 5), ("newest", 9)] {
    ///     cache.put(key, stamp).unwrap();
    /// }
    /// cache.set_capacity_by(2, |_, &stamp| stamp)?;
    /// assert!(!cache.contains_key("old"));
    /// assert!(cache.contains_key("newer") && cache.contains_key("newest"));
    /// # Ok::<(), runcache::CapacityError>(())
    /// ```
    pub fn set_capacity_by<R: Ord>(
        &self,
        capacity: u64,
        rank: impl FnMut(&K, &V) -> R,
    ) -> Result<(), CapacityError> {
        self.raw
            .set_capacity_ranked(capacity, rank)
            .map_err(CapacityError::from_parts)
    }

    /// Takes out every entry whose deadline has passed (see
    /// [`CacheBuilder::time_to_live`](crate::CacheBuilder::time_to_live)); returns how many this call took out. Writes do this
    /// work a little at a time already; call it where a cache may sit without writes while
    /// its entries' memory should come back (a thread of your own, or a timer). Another
    /// thread taking expired entries out at the same moment makes it return early (that
    /// thread finishes the work). Without an expiry rule it does nothing.
    ///
    /// # Panics
    /// If the eviction listener panics: the entries are taken out all the same, and the
    /// first panic is resumed at the end.
    ///
    /// ```
    /// use runcache::{Cache, Clock};
    /// use std::time::Duration;
    ///
    /// let (clock, hand) = Clock::manual();
    /// let cache = Cache::<u32, u32>::builder()
    ///     .capacity(100)
    ///     .time_to_live(Duration::from_secs(1))
    ///     .clock(clock)
    ///     .build()?;
    /// for i in 0..10 {
    ///     cache.put(i, i).unwrap();
    /// }
    /// hand.advance(Duration::from_secs(2));
    /// assert_eq!(cache.len(), 10, "expired, not yet taken out");
    /// assert_eq!(cache.purge_expired(), 10);
    /// assert_eq!((cache.len(), cache.weighted_size()), (0, 0));
    /// assert_eq!(cache.stats().expirations, 10);
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn purge_expired(&self) -> usize {
        self.raw.purge_expired()
    }

    /// The activity counters.
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.get_or_insert_with("a", || 1); // a miss, and one build
    /// let _ = cache.get("a"); // a hit
    /// let stats = cache.stats();
    /// assert_eq!((stats.hits, stats.misses, stats.builds), (1, 1, 1));
    /// assert_eq!(stats.hit_ratio(), 0.5);
    /// ```
    pub fn stats(&self) -> Stats {
        Stats {
            hits: self.raw.stat(Counter::Hit),
            misses: self.raw.stat(Counter::Miss),
            builds: self.raw.stat(Counter::Build),
            build_failures: self.raw.stat(Counter::BuildFailure),
            waits: self.raw.stat(Counter::Wait),
            rejections: self.raw.stat(Counter::Rejection),
            evictions: self.raw.stat(Counter::Eviction),
            removals: self.raw.stat(Counter::Removal),
            expirations: self.raw.stat(Counter::Expiration),
        }
    }

    /// The share of the capacity that the eviction policy gives its admission (small) queue
    /// now, between 0.01 and 0.4; `None` for a cache that rejects entries when full
    /// ([`WhenFull::Reject`](crate::WhenFull::Reject)). The policy adapts it as the cache runs, towards the queue that
    /// earns more hits for its room (see
    /// `docs/DESIGN.md`, "Eviction"); it is read here as a hint, for monitoring.
    ///
    /// ```
    /// let cache = runcache::Cache::<u64, u64>::builder().capacity(100).build()?;
    /// let share = cache.admission_share().expect("an evicting cache has a policy");
    /// assert!((0.01..=0.4).contains(&share));
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn admission_share(&self) -> Option<f64> {
        self.raw.small_share()
    }

    /// The number of shards.
    ///
    /// ```
    /// let cache = runcache::Cache::<u32, u32>::builder().shards(8).build()?;
    /// assert_eq!(cache.shards(), 8);
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn shards(&self) -> usize {
        self.raw.shard_count()
    }

    /// Runs the destructors of values that left the cache (removed, replaced, evicted,
    /// cleared) and that nobody holds any more, as far as other threads allow. Never needed
    /// for correctness: it only makes now what happens anyway.
    ///
    /// A value that leaves the cache is not dropped at once: a reader on another thread may
    /// still be looking at it through a [`pin`](Self::pin) handle, so it is dropped through
    /// the cache's epoch collector once no such reader can remain. That happens on its own:
    ///
    /// - A thread gathers what it retires in batches of 32. A batch reaches the collector
    ///   when eight full ones have gathered, at once for a value weighing a sixty-fourth of
    ///   the capacity or more, once the values it retired since its last hand-over weigh that
    ///   much together and number eight or more, and at the end of a clear or a shrink.
    /// - A maintenance task rides on the collector itself: whichever thread collects runs it
    ///   every few hundred calls into the cache, and it takes the batches of the next four
    ///   threads registered with the cache, in turn (as does a thread that fills a batch). So
    ///   what a thread retired before it went idle is freed after at most
    ///   384 × (⌈R / 4⌉ + 1) calls into the cache by any one other thread, with R the threads
    ///   registered with it (crossbeam collects every 128 pins of a thread, and the epoch
    ///   must advance twice for the task, and again for what it handed over).
    /// - A thread that exits hands its batch over.
    /// - Dropping the cache drops every value it still owns before `drop` returns, whichever
    ///   threads retired them and whether or not they are alive.
    ///
    /// `reclaim` makes it happen now for everything no pinned thread can still see, which
    /// every thread retired: useful when values hold scarce memory (a GPU buffer) and the
    /// cache has gone quiet. The constant caches call it after every removal, so that their
    /// buffers' memory comes back before the call returns.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// let cache = runcache::Cache::new(10);
    /// let tensor = Arc::new(vec![0u8; 1 << 20]);
    /// cache.put("weights", Arc::clone(&tensor)).unwrap();
    /// cache.invalidate("weights");
    /// cache.reclaim(); // drop what left the cache now, not later
    /// assert_eq!(Arc::strong_count(&tensor), 1, "the cache's count is gone");
    /// ```
    pub fn reclaim(&self) {
        self.raw.reclaim();
    }

    /// For tests: retired items (a removed entry's node and value, a replaced value, a
    /// retired table) handed to the epoch collector since the cache was made.
    #[doc(hidden)]
    pub fn __handed_over(&self) -> u64 {
        self.raw.handed_over()
    }

    /// For tests: table slots over all shards (they grow as entries are added).
    #[doc(hidden)]
    pub fn __slots(&self) -> usize {
        self.raw.slots()
    }

    /// For tests: table migrations finished over all shards.
    #[doc(hidden)]
    pub fn __migrations(&self) -> usize {
        self.raw.migrations()
    }

    /// For tests and fuzzing: checks every invariant a quiet cache can show (the table's
    /// order and counts, exact accounting, the eviction queues' bookkeeping) and says what
    /// is wrong. Call it only while no other operation is in flight.
    #[doc(hidden)]
    pub fn __validate(&self) -> Result<(), String> {
        self.raw.validate()
    }
}
