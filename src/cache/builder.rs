//! [`CacheBuilder`] and what it configures: the capacity, the weigher, what a full cache
//! does ([`WhenFull`]), the listener, expiry, the shards, the hasher and the presizing.

#![forbid(unsafe_code)]

use super::{Cache, DefaultHashBuilder, Handle, RemovalCause, MAX_SHARDS};
use crate::error::ConfigError;
use crate::raw::{nanos, Clock, Expiry, Listener, RawCache, Rule, Weigher};
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::time::Duration;

/// What a cache does when an entry does not fit in the free capacity.
///
/// ```
/// use runcache::{Cache, WhenFull};
///
/// // A byte budget that refuses what does not fit, as a constant tensor cache does.
/// let tensors = Cache::<&str, Vec<u8>>::builder()
///     .capacity(100)
///     .weigher(|_, v| v.len() as u64)
///     .when_full(WhenFull::Reject)
///     .build()?;
/// tensors.insert("a", vec![0; 80]).unwrap();
/// assert!(tensors.insert("b", vec![0; 40]).is_err(), "refused; nothing was evicted");
/// assert!(tensors.contains_key("a"));
/// # Ok::<(), runcache::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WhenFull {
    /// Evict entries chosen by the scan-resistant policy (S3-FIFO with TinyLFU's admission
    /// duel, see the crate docs) until the new one fits (the
    /// default). An entry heavier than the whole capacity is still refused: it never flushes
    /// the cache. A newcomer heavier than the room the policy keeps for new entries is
    /// cached only if the sketch counts it more often than the entries it would displace,
    /// together; otherwise it is handed back uncached and displaces nothing.
    ///
    /// The policy's frequency sketch and ghost are allocated just before the cache's first
    /// eviction, so a cache that never fills allocates neither: 30 to 46 bytes per entry
    /// the capacity holds at the mean weight of the entries cached then (16 to 32 of sketch,
    /// whose length is a power of two, 12 of ghost and 2 of links between the admission
    /// duel's narrow winners and their victims), for at most 2^24 entries (480 to 736
    /// MiB). A weighted cache is thus sized for the entries it really holds, whatever
    /// `expected_entry_weight` guessed.
    #[default]
    Evict,
    /// Refuse the new entry and keep the cached ones (constant tensor caches work this way).
    Reject,
}

/// Builds a [`Cache`]; see [`Cache::builder`].
///
/// ```
/// use runcache::{Cache, RemovalCause};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
///
/// let evicted = Arc::new(AtomicU64::new(0));
/// let seen = Arc::clone(&evicted);
/// let cache = Cache::<u32, Vec<u8>>::builder()
///     .capacity(64 << 10) // 64 KiB
///     .weigher(|_, v| v.len() as u64)
///     .expected_entry_weight(4 << 10) // presized for 16 entries
///     .on_evict(move |_, v, cause| {
///         if cause == RemovalCause::Capacity {
///             seen.fetch_add(v.len() as u64, Ordering::Relaxed);
///         }
///     })
///     .shards(4)
///     .build()?;
/// for i in 0..32 {
///     cache.put(i, vec![0; 4 << 10]).unwrap();
/// }
/// assert!(cache.weighted_size() <= 64 << 10);
/// assert_eq!(cache.weighted_size() + evicted.load(Ordering::Relaxed), 32 * (4 << 10));
/// # Ok::<(), runcache::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct CacheBuilder<K, V, S = DefaultHashBuilder> {
    pub(super) capacity: u64,
    pub(super) shards: Option<usize>,
    pub(super) hasher: S,
    pub(super) weigher: Option<Weigher<K, V>>,
    pub(super) listener: Option<Listener<K, V>>,
    pub(super) when_full: WhenFull,
    pub(super) entry_weight: Option<u64>,
    /// The expiry rules asked for, by the builder method's name (one may be kept).
    pub(super) expiry: Vec<(&'static str, Rule<K, V>)>,
    pub(super) clock: Clock,
    /// The eviction policy's tuning values, when not the defaults.
    #[cfg(feature = "tuning")]
    pub(super) tuning: Option<&'static crate::policy::Tuning>,
    pub(super) _types: PhantomData<fn(K, V)>,
}

impl<K, V, S> CacheBuilder<K, V, S> {
    /// The capacity: a number of entries with the default weigher, else a total weight
    /// (bytes, say). 0 makes a disabled cache that caches nothing. Default: `u64::MAX`.
    /// [`Cache::new`] takes it as its argument.
    ///
    /// ```
    /// let cache = runcache::Cache::<u32, u32>::builder().capacity(3).build()?;
    /// for i in 0..10 {
    ///     cache.put(i, i).unwrap();
    /// }
    /// assert_eq!(cache.len(), 3);
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self
    }

    /// How much each entry counts against the capacity. Default: every entry weighs 1.
    ///
    /// An entry of weight 0 takes no room and is never evicted to make room: only a
    /// removal, a replacement, `retain`, `clear` or a capacity of 0 takes it out. An
    /// evicting cache judges a newcomer much heavier than most (heavier than the room its
    /// policy keeps for new entries) before it takes any room, and hands it back uncached
    /// unless it is asked for more often than the entries it would displace together (see
    /// [`InsertError::turned_away`](crate::InsertError::turned_away)).
    ///
    /// The weigher runs once per entry, when the entry is inserted or built, outside any
    /// shared state. If it panics, the panic reaches the caller that triggered it and nothing
    /// is cached (callers waiting on that build take it over).
    ///
    /// ```
    /// let cache = runcache::Cache::<&str, String>::builder()
    ///     .capacity(10)
    ///     .weigher(|k, v| (k.len() + v.len()) as u64)
    ///     .build()?;
    /// cache.put("ab", "cdef".to_string()).unwrap();
    /// assert_eq!(cache.weighted_size(), 6);
    /// assert!(cache.insert("big", "x".repeat(20)).is_err(), "heavier than the whole capacity");
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn weigher(mut self, weigher: impl Fn(&K, &V) -> u64 + Send + Sync + 'static) -> Self {
        self.weigher = Some(Box::new(weigher));
        self
    }

    /// The weight a typical entry has, for a cache with a weigher: the table is presized for
    /// `capacity / weight` entries (at most 2^20), so that filling the cache does not grow it
    /// step by step. Without a weigher every entry weighs 1 and the table is presized for the
    /// capacity anyway (unless it is unbounded); without this setting a weighted cache starts
    /// small and grows. Presizing allocates 16 bytes per expected entry when the cache is
    /// built (the policy sizes itself later, see [`WhenFull::Evict`]); `build` refuses 0
    /// with [`ConfigError::EntryWeight`].
    ///
    /// ```
    /// use runcache::{Cache, ConfigError};
    ///
    /// let cache = Cache::<u64, Vec<u8>>::builder()
    ///     .capacity(1 << 30)
    ///     .weigher(|_, v| v.len() as u64)
    ///     .expected_entry_weight(1 << 20) // about 1,024 entries of 1 MiB
    ///     .build()?;
    /// assert!(cache.is_empty());
    ///
    /// let bad = Cache::<u64, Vec<u8>>::builder().expected_entry_weight(0).build();
    /// assert_eq!(bad.unwrap_err(), ConfigError::EntryWeight { given: 0 });
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn expected_entry_weight(mut self, weight: u64) -> Self {
        self.entry_weight = Some(weight);
        self
    }

    /// What to do when an entry does not fit: evict by policy (the default) or refuse it.
    ///
    /// ```
    /// use runcache::WhenFull;
    ///
    /// let cache = runcache::Cache::<u32, u32>::builder()
    ///     .capacity(1)
    ///     .when_full(WhenFull::Reject)
    ///     .build()?;
    /// cache.put(1, 1).unwrap();
    /// let refused = cache.put(2, 2).unwrap_err();
    /// assert_eq!((refused.key, refused.value), (2, 2));
    /// assert_eq!(cache.get_cloned(&1), Some(1));
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// A listener told about every value that leaves the cache, with the reason.
    ///
    /// It runs on the thread whose operation removed the value, after the cache is consistent
    /// again and holding nothing that another thread waits for; the value itself stays alive
    /// while anyone holds a handle of it.
    ///
    /// If it panics, the panic is caught, the operation that removed the value runs to its
    /// end (an insert that evicted still caches its entry, a `clear` still removes every
    /// entry, each budget stays exact), and then the panic resumes in that operation's caller.
    /// The first panic of an operation is the one resumed; the listener stays installed and
    /// hears every later removal. (moka disables a listener that panicked and Caffeine logs
    /// the exception; here no removal goes unheard and no panic is hidden.)
    ///
    /// ```
    /// use runcache::RemovalCause;
    /// use std::sync::{Arc, Mutex};
    ///
    /// let log = Arc::new(Mutex::new(Vec::new()));
    /// let sink = Arc::clone(&log);
    /// let cache = runcache::Cache::<u32, &str>::builder()
    ///     .on_evict(move |key, _value, cause| sink.lock().unwrap().push((*key, cause)))
    ///     .build()?;
    /// cache.put(1, "a").unwrap();
    /// cache.put(1, "b").unwrap();
    /// cache.invalidate(&1);
    /// assert_eq!(
    ///     *log.lock().unwrap(),
    ///     [(1, RemovalCause::Replaced), (1, RemovalCause::Removed)]
    /// );
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn on_evict(
        mut self,
        listener: impl Fn(&K, &Handle<V>, RemovalCause) + Send + Sync + 'static,
    ) -> Self {
        self.listener = Some(Box::new(listener));
        self
    }

    /// The number of shards: a power of two (checked by [`build`](Self::build)). Default: the
    /// next power of two of four times [`std::thread::available_parallelism`].
    ///
    /// ```
    /// use runcache::{Cache, ConfigError};
    ///
    /// let cache = Cache::<u32, u32>::builder().shards(16).build()?;
    /// assert_eq!(cache.shards(), 16);
    /// let err = Cache::<u32, u32>::builder().shards(3).build().unwrap_err();
    /// assert_eq!(err, ConfigError::Shards { requested: 3 });
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The hasher. Default: [`DefaultHashBuilder`].
    ///
    /// ```
    /// use std::collections::hash_map::DefaultHasher;
    /// use std::hash::BuildHasherDefault;
    ///
    /// // A hasher with a fixed seed: the same table layout in every run (reproducible tests).
    /// let cache = runcache::Cache::<u32, u32>::builder()
    ///     .capacity(100)
    ///     .hasher(BuildHasherDefault::<DefaultHasher>::default())
    ///     .build()?;
    /// cache.put(1, 1).unwrap();
    /// assert_eq!(cache.get_cloned(&1), Some(1));
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn hasher<S2>(self, hasher: S2) -> CacheBuilder<K, V, S2> {
        CacheBuilder {
            capacity: self.capacity,
            shards: self.shards,
            hasher,
            weigher: self.weigher,
            listener: self.listener,
            when_full: self.when_full,
            entry_weight: self.entry_weight,
            expiry: self.expiry,
            clock: self.clock,
            #[cfg(feature = "tuning")]
            tuning: self.tuning,
            _types: PhantomData,
        }
    }

    /// Entries expire this long after they were built or inserted (a replacement starts
    /// anew). An expired entry is never returned: from its deadline on, lookups miss it,
    /// `get_or_insert_with` builds it again (one build per key, as always), and it leaves the
    /// cache as [`RemovalCause::Expired`] within about a millisecond once writes or
    /// [`Cache::purge_expired`] run, its weight back to the budget. `Duration::ZERO`:
    /// every entry expires as it is cached (its callers still get the value);
    /// `Duration::MAX`: never. Default: entries do not expire.
    ///
    /// One expiry rule per cache: this, [`time_to_idle`](Self::time_to_idle) or
    /// [`expire_after`](Self::expire_after) (a policy can combine the other two).
    ///
    /// ```
    /// use runcache::{Cache, Clock};
    /// use std::time::Duration;
    ///
    /// let (clock, hand) = Clock::manual();
    /// let kernels = Cache::<u32, u32>::builder()
    ///     .capacity(100)
    ///     .time_to_live(Duration::from_secs(600))
    ///     .clock(clock)
    ///     .build()?;
    /// kernels.put(1, 10).unwrap();
    /// hand.advance(Duration::from_secs(600));
    /// assert!(kernels.get(&1).is_none());
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn time_to_live(mut self, live: Duration) -> Self {
        self.expiry.push(("time_to_live", Rule::Live(nanos(live))));
        self
    }

    /// Entries expire when they have not been read or written for this long: each hit
    /// moves the deadline on (a write to the entry at most once a millisecond, none to
    /// anything shared). Otherwise as [`time_to_live`](Self::time_to_live).
    ///
    /// ```
    /// use runcache::{Cache, Clock};
    /// use std::time::Duration;
    ///
    /// let (clock, hand) = Clock::manual();
    /// let weights = Cache::<&str, Vec<u8>>::builder()
    ///     .capacity(1 << 20)
    ///     .weigher(|_, v| v.len() as u64)
    ///     .time_to_idle(Duration::from_secs(600))
    ///     .clock(clock)
    ///     .build()?;
    /// weights.put("resnet", vec![0; 1024]).unwrap();
    /// hand.advance(Duration::from_secs(500));
    /// assert!(weights.get("resnet").is_some()); // read: ten more minutes
    /// hand.advance(Duration::from_secs(500));
    /// assert!(weights.get("resnet").is_some());
    /// hand.advance(Duration::from_secs(600));
    /// assert!(weights.get("resnet").is_none());
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn time_to_idle(mut self, idle: Duration) -> Self {
        self.expiry.push(("time_to_idle", Rule::Idle(nanos(idle))));
        self
    }

    /// Each entry's deadline is set by `policy` when it is created, read or replaced (see
    /// [`Expiry`]). Otherwise as [`time_to_live`](Self::time_to_live).
    ///
    /// ```
    /// use runcache::{Cache, Clock, Expiry};
    /// use std::time::Duration;
    ///
    /// /// A plan built from statistics lives an hour, an error's plan a second.
    /// struct Plans;
    /// impl Expiry<u32, Result<u32, ()>> for Plans {
    ///     fn after_create(&self, _: &u32, plan: &Result<u32, ()>) -> Option<Duration> {
    ///         Some(Duration::from_secs(if plan.is_ok() { 3_600 } else { 1 }))
    ///     }
    /// }
    ///
    /// let (clock, hand) = Clock::manual();
    /// let plans = Cache::builder().capacity(100).expire_after(Plans).clock(clock).build()?;
    /// plans.put(1, Ok(7)).unwrap();
    /// plans.put(2, Err(())).unwrap();
    /// hand.advance(Duration::from_secs(1));
    /// assert!(plans.get(&1).is_some());
    /// assert!(plans.get(&2).is_none());
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn expire_after(mut self, policy: impl Expiry<K, V> + 'static) -> Self {
        self.expiry
            .push(("expire_after", Rule::Policy(Box::new(policy))));
        self
    }

    /// The clock deadlines are read against. Default: [`Clock::coarse`]. Without an expiry
    /// rule the cache never reads it.
    ///
    /// ```
    /// use runcache::{Cache, Clock};
    /// use std::time::Duration;
    ///
    /// // A test moves time itself instead of sleeping.
    /// let (clock, hand) = Clock::manual();
    /// let cache = Cache::<u32, u32>::builder()
    ///     .time_to_live(Duration::from_millis(5))
    ///     .clock(clock)
    ///     .build()?;
    /// cache.put(1, 1).unwrap();
    /// hand.advance(Duration::from_millis(5));
    /// assert!(cache.get(&1).is_none());
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Tunes the eviction policy by `tuning` instead of [`Tuning::DEFAULT`](crate::Tuning):
    /// for experiments with the policy (the trace tool's `--tune`), not for production use.
    /// [`build`](Self::build) checks the values.
    ///
    /// ```
    /// use runcache::{Cache, ConfigError, Tuning};
    ///
    /// static SHORT: Tuning = {
    ///     let mut t = Tuning::DEFAULT;
    ///     t.min_sample = 4_096;
    ///     t
    /// };
    /// let cache = Cache::<u32, u32>::builder().capacity(100).tuning(&SHORT).build()?;
    /// cache.put(1, 1).unwrap();
    ///
    /// static BAD: Tuning = {
    ///     let mut t = Tuning::DEFAULT;
    ///     t.promote_hits = 0;
    ///     t
    /// };
    /// let err = Cache::<u32, u32>::builder().tuning(&BAD).build().unwrap_err();
    /// assert!(err.to_string().contains("promote_hits"), "{err}");
    /// # Ok::<(), ConfigError>(())
    /// ```
    #[cfg(feature = "tuning")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tuning")))]
    pub fn tuning(mut self, tuning: &'static crate::policy::Tuning) -> Self {
        self.tuning = Some(tuning);
        self
    }
}

impl<K, V, S> CacheBuilder<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// Builds the cache.
    ///
    /// # Errors
    /// [`ConfigError::Shards`] when the shard count is not a power of two in
    /// `1..=`[`MAX_SHARDS`]; [`ConfigError::EntryWeight`] when the expected entry weight is
    /// 0; [`ConfigError::Expiry`] when more than one expiry rule was given; with the
    /// `tuning` feature, `ConfigError::Tuning` when the tuning values are not consistent.
    ///
    /// ```
    /// let cache = runcache::Cache::<u32, u32>::builder().capacity(10).build();
    /// assert!(cache.is_ok());
    /// let err = runcache::Cache::<u32, u32>::builder().shards(0).build().unwrap_err();
    /// assert!(err.to_string().contains("invalid shard count 0"));
    /// ```
    pub fn build(self) -> Result<Cache<K, V, S>, ConfigError> {
        let shards = match self.shards {
            Some(n) if n.is_power_of_two() && n <= MAX_SHARDS => n,
            Some(requested) => return Err(ConfigError::Shards { requested }),
            None => default_shards(),
        };
        if let Some(given @ 0) = self.entry_weight {
            return Err(ConfigError::EntryWeight { given });
        }
        let mut expiry = self.expiry.into_iter();
        let rule = expiry.next();
        if let (Some((first, _)), Some((second, _))) = (&rule, expiry.next()) {
            return Err(ConfigError::Expiry { first, second });
        }
        #[cfg(feature = "tuning")]
        if let Some(tuning) = self.tuning {
            tuning.check().map_err(ConfigError::Tuning)?;
        }
        let raw = RawCache::new(
            shards,
            self.capacity,
            self.hasher,
            self.weigher,
            self.listener,
            self.when_full == WhenFull::Evict,
            self.entry_weight,
        );
        #[cfg(feature = "tuning")]
        let raw = match self.tuning {
            Some(tuning) => raw.with_tuning(tuning),
            None => raw,
        };
        Ok(Cache {
            raw: match rule {
                Some((_, rule)) => raw.with_expiry(self.clock, rule),
                None => raw,
            },
        })
    }
}

impl<K, V> Default for CacheBuilder<K, V> {
    /// The defaults of [`Cache::builder`]: unbounded, weight 1 per entry, evicting, default
    /// hasher and shards.
    fn default() -> Self {
        CacheBuilder {
            capacity: u64::MAX,
            shards: None,
            hasher: DefaultHashBuilder::default(),
            weigher: None,
            listener: None,
            when_full: WhenFull::Evict,
            entry_weight: None,
            expiry: Vec::new(),
            clock: Clock::coarse(),
            #[cfg(feature = "tuning")]
            tuning: None,
            _types: PhantomData,
        }
    }
}

impl<K, V, S> fmt::Debug for CacheBuilder<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("capacity", &self.capacity)
            .field("shards", &self.shards)
            .field("weigher", &self.weigher.is_some())
            .field("listener", &self.listener.is_some())
            .field("when_full", &self.when_full)
            .field("expected_entry_weight", &self.entry_weight)
            .field(
                "expiry",
                &self
                    .expiry
                    .iter()
                    .map(|(name, _)| *name)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Four shards per core, read once per process: `available_parallelism` reads the cgroup
/// files under `/proc` on Linux, which cost a cache build 20–30 µs when read each time.
pub(super) fn default_shards() -> usize {
    static SHARDS: OnceLock<usize> = OnceLock::new();
    *SHARDS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores * 4).next_power_of_two().min(MAX_SHARDS)
    })
}
