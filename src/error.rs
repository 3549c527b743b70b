//! The facade's typed errors: a builder setting that cannot be built and an insert that does
//! not fit. Each layer keeps its own errors in its folder (`constant::AllocError`,
//! `pool::PoolError`, `vulkan::VulkanError`); the crate root re-exports them all. Every error
//! says what was wrong and with which value, and every method that fails hands the caller's
//! input back.

#![forbid(unsafe_code)]

use std::fmt;

/// A [`CacheBuilder`](crate::CacheBuilder) setting that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The shard count must be a power of two between 1 and [`MAX_SHARDS`](crate::MAX_SHARDS).
    Shards {
        /// The shard count that was asked for.
        requested: usize,
    },
    /// The expected entry weight must be at least 1: it divides the capacity into the number
    /// of entries the table is presized for.
    EntryWeight {
        /// The weight that was given.
        given: u64,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Shards { requested } => write!(
                f,
                "invalid shard count {requested}: it must be a power of two from 1 to {}",
                crate::raw::MAX_SHARDS
            ),
            ConfigError::EntryWeight { given } => write!(
                f,
                "invalid expected entry weight {given}: it must be at least 1"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// An [`insert`](crate::Cache::insert) that was refused because the entry does not fit; the key
/// and the value are handed back.
#[non_exhaustive]
pub struct InsertError<K, V> {
    /// The key that was not inserted.
    pub key: K,
    /// The value that was not inserted.
    pub value: V,
    /// The entry's weight, as the weigher computed it.
    pub weight: u64,
    /// The cache's capacity when the insert was refused.
    pub capacity: u64,
}

impl<K, V> InsertError<K, V> {
    /// The key and value that were not inserted.
    pub fn into_inner(self) -> (K, V) {
        (self.key, self.value)
    }
}

impl<K, V> fmt::Debug for InsertError<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InsertError")
            .field("weight", &self.weight)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl<K, V> fmt::Display for InsertError<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.capacity == 0 {
            write!(
                f,
                "entry of weight {} not inserted: the cache is disabled (capacity 0)",
                self.weight
            )
        } else {
            write!(
                f,
                "entry of weight {} not inserted: it does not fit in the free part of capacity {}",
                self.weight, self.capacity
            )
        }
    }
}

impl<K, V> std::error::Error for InsertError<K, V> {}
