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

/// What went wrong in the Vulkan memory layer ([`crate::vulkan`]). After any of these, nothing
/// is left allocated and a cache whose build failed with it is unchanged.
#[cfg(feature = "vulkan")]
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VulkanError {
    /// The Vulkan loader (`libvulkan.so.1`, `vulkan-1.dll`) could not be loaded.
    Loader {
        /// Why, as the dynamic loader put it.
        reason: String,
    },
    /// No physical device has a queue family that can transfer.
    NoDevice,
    /// Validation was asked for but `VK_LAYER_KHRONOS_validation` is not installed.
    ValidationUnavailable,
    /// A Vulkan buffer cannot be empty.
    ZeroSize,
    /// The request exceeds the device's `maxMemoryAllocationSize`.
    TooLarge {
        /// Bytes asked for.
        requested: u64,
        /// The device's limit.
        max_allocation_size: u64,
    },
    /// The request exceeds the whole device-local heap.
    AboveHeap {
        /// Bytes asked for.
        requested: u64,
        /// The heap's size.
        heap_size: u64,
    },
    /// The request exceeds what `VK_EXT_memory_budget` says this process may still use.
    OverBudget {
        /// Bytes asked for.
        requested: u64,
        /// Budget minus usage, when checked.
        available: u64,
    },
    /// The request would take the allocator past its soft limit.
    SoftLimit {
        /// Bytes asked for.
        requested: u64,
        /// Bytes of live buffers when checked.
        used: u64,
        /// The limit.
        limit: u64,
    },
    /// The driver is out of device memory (`VK_ERROR_OUT_OF_DEVICE_MEMORY`).
    OutOfDeviceMemory {
        /// Bytes asked for (0 when the failing call was not an allocation).
        requested: u64,
    },
    /// The driver is out of host memory (`VK_ERROR_OUT_OF_HOST_MEMORY`).
    OutOfHostMemory {
        /// Bytes asked for (0 when the failing call was not an allocation).
        requested: u64,
    },
    /// The device was lost (`VK_ERROR_DEVICE_LOST`).
    DeviceLost,
    /// No memory type suits the buffer (device-local for constants, host-visible and
    /// coherent for staging).
    NoMemoryType {
        /// Bytes asked for.
        requested: u64,
    },
    /// A read or write outside the buffer.
    OutOfRange {
        /// Where it started.
        offset: u64,
        /// How many bytes.
        len: u64,
        /// The buffer's size.
        size: u64,
    },
    /// The buffer was made by another allocator.
    NotFromThisAllocator,
    /// A transfer did not finish within a minute.
    Timeout,
    /// An allocator setting that cannot be built.
    InvalidConfig {
        /// What is wrong.
        reason: &'static str,
    },
    /// No staging slot could be had.
    Staging {
        /// Why.
        reason: String,
    },
    /// gpu-allocator failed for a reason other than memory.
    Allocator {
        /// Its message.
        reason: String,
    },
    /// Another driver error.
    Driver {
        /// The Vulkan call that failed.
        call: &'static str,
        /// What it returned.
        result: ash::vk::Result,
    },
}

#[cfg(feature = "vulkan")]
impl fmt::Display for VulkanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VulkanError::Loader { reason } => write!(f, "the Vulkan loader could not be loaded: {reason}"),
            VulkanError::NoDevice => f.write_str("no Vulkan device has a queue family that can transfer"),
            VulkanError::ValidationUnavailable => f.write_str(
                "validation was requested but VK_LAYER_KHRONOS_validation is not installed \
                 (Debian: vulkan-validationlayers)",
            ),
            VulkanError::ZeroSize => f.write_str("a Vulkan buffer cannot be 0 bytes"),
            VulkanError::TooLarge { requested, max_allocation_size } => write!(
                f,
                "{requested} bytes exceed the device's maxMemoryAllocationSize of {max_allocation_size}"
            ),
            VulkanError::AboveHeap { requested, heap_size } => write!(
                f,
                "{requested} bytes exceed the whole device-local heap of {heap_size}"
            ),
            VulkanError::OverBudget { requested, available } => write!(
                f,
                "{requested} bytes exceed the {available} bytes VK_EXT_memory_budget leaves this process"
            ),
            VulkanError::SoftLimit { requested, used, limit } => write!(
                f,
                "{requested} bytes would exceed the soft limit of {limit} ({used} in use)"
            ),
            VulkanError::OutOfDeviceMemory { requested } => {
                write!(f, "out of device memory (request of {requested} bytes)")
            }
            VulkanError::OutOfHostMemory { requested } => {
                write!(f, "out of host memory (request of {requested} bytes)")
            }
            VulkanError::DeviceLost => f.write_str("the Vulkan device was lost"),
            VulkanError::NoMemoryType { requested } => {
                write!(f, "no memory type suits a buffer of {requested} bytes")
            }
            VulkanError::OutOfRange { offset, len, size } => write!(
                f,
                "{len} bytes at offset {offset} do not fit in a buffer of {size} bytes"
            ),
            VulkanError::NotFromThisAllocator => {
                f.write_str("the buffer was made by another allocator")
            }
            VulkanError::Timeout => f.write_str("a transfer did not finish within 60 s"),
            VulkanError::InvalidConfig { reason } => write!(f, "invalid allocator setting: {reason}"),
            VulkanError::Staging { reason } => write!(f, "no staging slot: {reason}"),
            VulkanError::Allocator { reason } => write!(f, "gpu-allocator: {reason}"),
            VulkanError::Driver { call, result } => write!(f, "{call} failed: {result}"),
        }
    }
}

#[cfg(feature = "vulkan")]
impl std::error::Error for VulkanError {}
