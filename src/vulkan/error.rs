//! [`VulkanError`]: what went wrong in the Vulkan layer, and the driver's and gpu-allocator's
//! errors mapped onto it.

#![forbid(unsafe_code)]

use crate::pool::PoolError;
use ash::vk;
use gpu_allocator::AllocationError;
use std::fmt;
use std::sync::Arc;

/// What went wrong in the Vulkan memory layer ([`crate::vulkan`]). After any of these, nothing
/// is left allocated and a cache whose build failed with it is unchanged.
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// use runcache::VulkanError;
///
/// let gpu = VulkanAllocator::builder(ctx).soft_limit(1 << 20).build()?;
/// match gpu.upload(&vec![0u8; 2 << 20]) {
///     Err(e @ VulkanError::SoftLimit { .. }) => eprintln!("{e}"), // nothing was allocated
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), runcache::VulkanError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VulkanError {
    /// The Vulkan loader (`libvulkan.so.1`, `vulkan-1.dll`) could not be loaded.
    Loader {
        /// ash's error, with the dynamic loader's reason; also [`source`](std::error::Error::source).
        source: WrappedError,
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
    /// The request exceeds the device's `maxStorageBufferRange`, so the buffer could not be
    /// bound whole as a storage buffer (see
    /// [`VulkanAllocatorBuilder::limit_to_storage_range`](super::VulkanAllocatorBuilder::limit_to_storage_range)).
    AboveStorageRange {
        /// Bytes asked for.
        requested: u64,
        /// The device's limit.
        max_storage_buffer_range: u64,
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
    /// A transfer did not finish within a minute, so an upload stopped sending the rest.
    /// The transfers already sent were still waited for before the error was returned.
    Timeout,
    /// An allocator setting that cannot be built.
    InvalidConfig {
        /// What is wrong.
        reason: &'static str,
    },
    /// No staging slot could be had.
    Staging {
        /// Why the staging pool had none; also [`source`](std::error::Error::source).
        source: PoolError,
    },
    /// gpu-allocator failed for a reason other than memory.
    Allocator {
        /// gpu-allocator's error; also [`source`](std::error::Error::source).
        source: WrappedError,
    },
    /// More than 2^32 small-buffer blocks were asked of one allocator.
    TooManyBlocks,
    /// Another driver error.
    Driver {
        /// The Vulkan call that failed.
        call: &'static str,
        /// What it returned.
        result: ash::vk::Result,
    },
}

impl fmt::Display for VulkanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VulkanError::Loader { .. } => f.write_str("the Vulkan loader could not be loaded"),
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
            VulkanError::AboveStorageRange { requested, max_storage_buffer_range } => write!(
                f,
                "{requested} bytes exceed the device's maxStorageBufferRange of \
                 {max_storage_buffer_range}, the most a storage buffer binds"
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
            VulkanError::Staging { .. } => f.write_str("no staging slot could be reserved"),
            VulkanError::Allocator { .. } => f.write_str("gpu-allocator failed"),
            VulkanError::TooManyBlocks => {
                f.write_str("more than 2^32 small-buffer blocks were asked of one allocator")
            }
            VulkanError::Driver { call, .. } => write!(f, "{call} failed"),
        }
    }
}

/// The wrapped error is the source, not part of the message, as the Rust API guidelines ask:
/// print the chain (`{e}: {source}`, or an error reporter) to see both.
impl std::error::Error for VulkanError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            VulkanError::Loader { source } | VulkanError::Allocator { source } => {
                Some(source.get_ref())
            }
            VulkanError::Staging { source } => Some(source),
            VulkanError::Driver { result, .. } => Some(result),
            _ => None,
        }
    }
}

/// Another crate's error that a [`VulkanError`] wraps (ash's loader error, gpu-allocator's
/// error), shared so that the error stays `Clone`; two are equal when they are the same error
/// or say the same thing.
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// use runcache::VulkanError;
///
/// if let Err(VulkanError::Loader { source }) = VulkanContext::builder().build() {
///     eprintln!("{}", source.get_ref());
/// }
/// # Ok::<(), runcache::VulkanError>(())
/// ```
#[derive(Clone)]
pub struct WrappedError(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl WrappedError {
    pub(crate) fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(e))
    }

    /// The wrapped error, to print or downcast (`get_ref().downcast_ref::<ash::LoadingError>()`).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use runcache::VulkanError;
    ///
    /// if let Err(VulkanError::Loader { source }) = VulkanContext::builder().build() {
    ///     let loading = source.get_ref().downcast_ref::<runcache::vulkan::ash::LoadingError>();
    ///     assert!(loading.is_some());
    /// }
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl PartialEq for WrappedError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for WrappedError {}

impl fmt::Debug for WrappedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for WrappedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl VulkanError {
    /// Maps a driver result; `requested` is the size of the request that failed (0 if none).
    pub(crate) fn from_vk(call: &'static str, result: vk::Result, requested: u64) -> Self {
        match result {
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => VulkanError::OutOfDeviceMemory { requested },
            vk::Result::ERROR_OUT_OF_HOST_MEMORY => VulkanError::OutOfHostMemory { requested },
            vk::Result::ERROR_DEVICE_LOST => VulkanError::DeviceLost,
            result => VulkanError::Driver { call, result },
        }
    }

    pub(super) fn from_allocator(e: AllocationError, requested: u64) -> Self {
        match e {
            AllocationError::OutOfMemory => VulkanError::OutOfDeviceMemory { requested },
            AllocationError::NoCompatibleMemoryTypeFound => VulkanError::NoMemoryType { requested },
            other => VulkanError::Allocator {
                source: WrappedError::new(other),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn wrapping_variants_keep_their_error_as_source() {
        let staging = VulkanError::Staging {
            source: PoolError::Exhausted { max_pools: 4 },
        };
        let source = staging.source().expect("a staging error has a source");
        assert_eq!(
            source.downcast_ref::<PoolError>(),
            Some(&PoolError::Exhausted { max_pools: 4 })
        );

        let driver =
            VulkanError::from_vk("vkQueueSubmit", vk::Result::ERROR_INITIALIZATION_FAILED, 0);
        let source = driver.source().expect("a driver error has a source");
        assert_eq!(
            source.downcast_ref::<vk::Result>(),
            Some(&vk::Result::ERROR_INITIALIZATION_FAILED)
        );

        let allocator =
            VulkanError::from_allocator(AllocationError::InvalidAllocationCreateDesc, 8);
        let source = allocator.source().expect("an allocator error has a source");
        assert!(source.is::<AllocationError>(), "{source:?}");
        assert_eq!(
            allocator.clone(),
            allocator,
            "a wrapped error equals its clone"
        );

        assert!(VulkanError::TooManyBlocks.source().is_none());
        assert!(VulkanError::from_vk("x", vk::Result::ERROR_DEVICE_LOST, 0)
            .source()
            .is_none());
    }
}
