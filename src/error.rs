//! Typed errors. Every error says what was wrong and with which value, and every method that
//! fails hands the caller's input back.

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
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Shards { requested } => write!(
                f,
                "invalid shard count {requested}: it must be a power of two from 1 to {}",
                crate::MAX_SHARDS
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

/// A constant buffer that could not be allocated.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocError {
    /// The size and alignment do not form a valid layout (the alignment is not a power of two,
    /// or the size overflows when rounded up to it).
    InvalidLayout {
        /// The size asked for, in bytes.
        size: usize,
        /// The alignment asked for, in bytes.
        align: usize,
    },
    /// The device has no memory left for the request.
    OutOfMemory {
        /// The device asked.
        device: crate::DeviceKind,
        /// The size asked for, in bytes.
        size: usize,
        /// The alignment asked for, in bytes.
        align: usize,
    },
    /// The allocator returned memory that is not aligned as asked (a broken allocator).
    Misaligned {
        /// The device asked.
        device: crate::DeviceKind,
        /// The alignment asked for, in bytes.
        align: usize,
    },
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::InvalidLayout { size, align } => write!(
                f,
                "invalid buffer layout: size {size} with alignment {align} (the alignment must \
                 be a power of two and the rounded size must fit in usize)"
            ),
            AllocError::OutOfMemory {
                device,
                size,
                align,
            } => write!(
                f,
                "out of {device} memory allocating {size} bytes aligned to {align}"
            ),
            AllocError::Misaligned { device, align } => write!(
                f,
                "the {device} allocator returned memory not aligned to {align} bytes"
            ),
        }
    }
}

impl std::error::Error for AllocError {}

/// A pool reservation or a pool manager setting that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// A builder setting is out of range; says which and why.
    InvalidConfig {
        /// What is wrong, with the value.
        reason: &'static str,
    },
    /// Every pool is reserved, the maximum is reached, and the manager does not wait.
    Exhausted {
        /// The maximum number of pools.
        max_pools: usize,
    },
    /// Every pool stayed reserved for the whole wait.
    TimedOut {
        /// How long the reservation waited.
        after: std::time::Duration,
        /// The maximum number of pools.
        max_pools: usize,
    },
    /// More than about four billion pools were created over the manager's life.
    TooManyPools,
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::InvalidConfig { reason } => write!(f, "invalid pool manager setting: {reason}"),
            PoolError::Exhausted { max_pools } => {
                write!(f, "all {max_pools} pools are reserved and the manager does not wait")
            }
            PoolError::TimedOut { after, max_pools } => write!(
                f,
                "all {max_pools} pools stayed reserved for {after:?}, the longest the reservation waits"
            ),
            PoolError::TooManyPools => f.write_str("the pool manager ran out of slot indices"),
        }
    }
}

impl std::error::Error for PoolError {}
