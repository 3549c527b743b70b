//! [`CacheBuilder`] and what it configures: the capacity, the weigher, what a full cache
//! does ([`WhenFull`]), the listener, the shards, the hasher and the presizing.

#![forbid(unsafe_code)]

use super::{Cache, DefaultHashBuilder, Handle, RemovalCause, MAX_SHARDS};
use crate::error::ConfigError;
use crate::raw::{Listener, RawCache, Weigher};
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;

/// What a cache does when an entry does not fit in the free capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WhenFull {
    /// Evict entries chosen by the scan-resistant policy (S3-FIFO with TinyLFU's admission
    /// duel, see the crate docs) until the new one fits (the
    /// default). An entry heavier than the whole capacity is still refused: it never flushes
    /// the cache.
    ///
    /// The policy's frequency sketch and ghost are allocated just before the cache's first
    /// eviction, so a cache that never fills allocates neither: 28 to 44 bytes per entry
    /// the capacity holds at the mean weight of the entries cached then (16 to 32 of sketch,
    /// whose length is a power of two, and 12 of ghost), for at most 2^24 entries (448 to
    /// 704 MiB). A weighted cache is thus sized for the entries it really holds, whatever
    /// `expected_entry_weight` guessed.
    #[default]
    Evict,
    /// Refuse the new entry and keep the cached ones (constant tensor caches work this way).
    Reject,
}

/// Builds a [`Cache`]; see [`Cache::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct CacheBuilder<K, V, S = DefaultHashBuilder> {
    pub(super) capacity: u64,
    pub(super) shards: Option<usize>,
    pub(super) hasher: S,
    pub(super) weigher: Option<Weigher<K, V>>,
    pub(super) listener: Option<Listener<K, V>>,
    pub(super) when_full: WhenFull,
    pub(super) entry_weight: Option<u64>,
    pub(super) _types: PhantomData<fn(K, V)>,
}

impl<K, V, S> CacheBuilder<K, V, S> {
    /// The capacity: a number of entries with the default weigher, else a total weight
    /// (bytes, say). 0 makes a disabled cache that caches nothing. Default: `u64::MAX`.
    /// [`Cache::new`] takes it as its argument.
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self
    }

    /// How much each entry counts against the capacity. Default: every entry weighs 1.
    ///
    /// The weigher runs once per entry, when the entry is inserted or built, outside any
    /// shared state. If it panics, the panic reaches the caller that triggered it and nothing
    /// is cached (callers waiting on that build take it over).
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
    pub fn expected_entry_weight(mut self, weight: u64) -> Self {
        self.entry_weight = Some(weight);
        self
    }

    /// What to do when an entry does not fit: evict by policy (the default) or refuse it.
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// A listener told about every value that leaves the cache, with the reason.
    ///
    /// It runs on the thread whose operation removed the value, after the cache is consistent
    /// again and holding nothing that another thread waits for; the value itself stays alive
    /// while anyone holds a handle of it. If it panics, the panic reaches that operation's caller
    /// and the cache stays consistent (the entry is already gone).
    pub fn on_evict(
        mut self,
        listener: impl Fn(&K, &Handle<V>, RemovalCause) + Send + Sync + 'static,
    ) -> Self {
        self.listener = Some(Box::new(listener));
        self
    }

    /// The number of shards: a power of two (checked by [`build`](Self::build)). Default: the
    /// next power of two of four times [`std::thread::available_parallelism`].
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The hasher. Default: [`DefaultHashBuilder`].
    pub fn hasher<S2>(self, hasher: S2) -> CacheBuilder<K, V, S2> {
        CacheBuilder {
            capacity: self.capacity,
            shards: self.shards,
            hasher,
            weigher: self.weigher,
            listener: self.listener,
            when_full: self.when_full,
            entry_weight: self.entry_weight,
            _types: PhantomData,
        }
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
    /// 0.
    pub fn build(self) -> Result<Cache<K, V, S>, ConfigError> {
        let shards = match self.shards {
            Some(n) if n.is_power_of_two() && n <= MAX_SHARDS => n,
            Some(requested) => return Err(ConfigError::Shards { requested }),
            None => default_shards(),
        };
        if let Some(given @ 0) = self.entry_weight {
            return Err(ConfigError::EntryWeight { given });
        }
        Ok(Cache {
            raw: RawCache::new(
                shards,
                self.capacity,
                self.hasher,
                self.weigher,
                self.listener,
                self.when_full == WhenFull::Evict,
                self.entry_weight,
            ),
        })
    }
}

pub(super) fn default_shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores * 4).next_power_of_two().min(MAX_SHARDS)
}
