//! GPU constant buffers in Vulkan device memory (cargo feature `vulkan`).
//!
//! Weights are uploaded once into device-local buffers and shared, through the GPU
//! [`ConstantCache`], by every thread and every later inference.
//!
//! - [`VulkanContext`] wraps the instance, device and queue **the application already has**
//!   ([`VulkanContext::from_raw`]; runcache never destroys them), or makes its own on the first
//!   suitable physical device ([`VulkanContext::builder`]). The Vulkan loader is loaded at run
//!   time by ash: nothing links libvulkan at build time, and a machine without Vulkan gets
//!   [`VulkanError::Loader`] instead of a link error.
//! - [`VulkanAllocator`] makes device-local buffers, sub-allocated from 64 MiB blocks by
//!   [gpu-allocator] (the well-kept pure-Rust allocator of the field), with a dedicated
//!   allocation for buffers of 16 MiB and more. Small buffers (up to [`SLAB_MAX`], 256 KiB) are
//!   not buffers of their own: each is a slot of a shared 4 MiB block buffer, of the smallest
//!   power-of-two size class (256 B and up) that holds it, so making one calls no driver
//!   function once its class has a free slot. Bind a buffer as the range
//!   ([`DeviceBuffer::buffer`], [`DeviceBuffer::offset`], [`DeviceBuffer::size`]); the offset is
//!   a multiple of 256, valid for storage and uniform descriptors on every device. The cost:
//!   up to half a slot of padding per small buffer.
//! - Device memory goes back to the driver: a block of small buffers once it has been empty
//!   for the allocator's `empty_block_ttl` (1 s by default), gpu-allocator's last block once
//!   no buffer is left for as long, everything empty at once on
//!   [`VulkanAllocator::trim`] or when a request finds the device short of memory.
//!   [`VulkanAllocator::memory_report`] shows the bytes requested, in slots, in blocks and
//!   held from the driver. The allocator fills buffers by mapping when the device-local
//!   memory is also host-visible and coherent (unified memory, ReBAR, lavapipe), and otherwise
//!   through a recycled staging slot (a [`PoolManager`](crate::pool::PoolManager) of
//!   host-visible buffers in two halves, each half with its own command buffer and fence):
//!   chunks alternate the halves, so the host copies one while the device transfers the one
//!   before. Several threads upload at once, one staging slot each.
//! - Requests are checked against `maxMemoryAllocationSize`, the device-local heap, the
//!   `VK_EXT_memory_budget` budget, `maxStorageBufferRange` (every buffer can be bound whole
//!   as a storage buffer, unless the builder allows larger ones) and an optional soft limit
//!   **before** the driver is called;
//!   each failure is a typed [`VulkanError`]. A soft limit makes out-of-memory paths testable
//!   on any device.
//!
//! # Budget
//!
//! [`default_capacity`] is what a GPU constant cache holds unless the user says otherwise:
//! half of what `VK_EXT_memory_budget` says this process may still use of the largest
//! device-local heap, or, without the extension, half of that heap. Half, not all (TensorRT's
//! default is the whole device memory), because activations, workspaces and other processes
//! need the rest. A MiB setting from the user — [`ConstantCache::set_capacity_mb`], or the
//! `gpu:` field of `RUNCACHE_CONSTANT_CACHE_CAPACITY` — always wins: see [`constant_cache`] and
//! [`configure_process_cache`]. [`follow_budget`] keeps a cache at that half while serving,
//! as other work takes device memory and gives it back.
//!
//! # Lifetimes
//!
//! A [`DeviceBuffer`] is freed when the last [`Handle`](crate::Handle) of its
//! `ConstantBuffer` drops. The contract: **hold the handle until every submission that reads
//! the buffer has completed.** A cache may evict or remove the buffer at any time, but the
//! caller's handle keeps it alive.
//! Where holding it is awkward, [`VulkanAllocator::retire_after`] takes the handle and a fence
//! and lets go of it once the fence has signalled.
//!
//! # Invariants
//!
//! Every `// SAFETY:` comment in this layer names the rule it relies on:
//!
//! - **V1 (ownership of the handles).** A context made by [`VulkanContext::builder`] owns its
//!   instance, device and debug messenger, which were made together from one loaded entry;
//!   the messenger's sink is behind an `Arc` the context holds until after the messenger is
//!   destroyed (a [`ValidationLog`] may hold it longer). A context made by
//!   [`VulkanContext::from_raw`] borrows the caller's handles and destroys none of them.
//! - **V2 (threads).** Vulkan handles may be used from any thread. The one externally
//!   synchronized call, queue submission, goes through the context's queue lock; a staging
//!   slot (its buffer, mapping, command pool and fence) is used by one thread at a time,
//!   the one that reserved it from the pool manager.
//! - **V3 (destruction order).** A handle is destroyed once, after the device is done with
//!   it, and before its parent: buffers and memory before the device, the device before the
//!   instance. Everything made from a context holds an `Arc` of it, so the context is
//!   destroyed last.
//! - **V4 (host access).** The host reads or writes mapped memory only inside the mapped
//!   range, only when the device does not use it at the same time (a fence was waited for,
//!   or the buffer is a read-only constant), and through `&mut` for writes.
//! - **V5 (valid calls).** Each driver call gets handles that are alive and made on the same
//!   device or instance, and create infos whose pointers outlive the call.
//!
//! # Example
//!
//! ```no_run
//! use runcache::constant::ConstantKey;
//! use runcache::vulkan::{self, VulkanAllocator, VulkanContext};
//!
//! let ctx = VulkanContext::builder().build()?;
//! let gpu = VulkanAllocator::new(ctx)?;
//! let weights = vulkan::constant_cache(&gpu);
//! let bytes = vec![1u8; 1 << 20]; // reordered weights
//! let added = weights
//!     .get_or_add(ConstantKey::new(1, 42), bytes.len(), || gpu.upload_constant(&bytes))
//!     .expect("uploaded");
//! let on_device = added.buffer.device_memory::<vulkan::DeviceBuffer>().unwrap();
//! // The range to bind in a descriptor set: small buffers share a `vk::Buffer`.
//! let _bind_me = (on_device.buffer(), on_device.offset(), on_device.size());
//! # Ok::<(), runcache::VulkanError>(())
//! ```
//!
//! [gpu-allocator]: https://crates.io/crates/gpu-allocator

// No unsafe code here; the crate-wide `deny(unsafe_code)` holds, and only the child module
// that needs unsafe allows it (a `forbid` here would bind the children too).

mod allocator;
mod buffer;
mod builder;
mod context;
mod error;
mod fault;
mod retire;
mod shared;
mod slab;
mod staging;
mod transfer;
mod validation;

pub use allocator::{MemoryReport, VulkanAllocator};
pub use ash;
pub use buffer::DeviceBuffer;
pub use builder::VulkanAllocatorBuilder;
pub use context::{HeapBudget, VulkanContext, VulkanContextBuilder};
pub use error::{VulkanError, WrappedError};
pub use fault::Fault;
pub use slab::SLAB_MAX;
pub use validation::ValidationLog;

use crate::constant::{self, ConstantCache, DeviceKind};
use std::sync::{Mutex, MutexGuard};

const MIB: u64 = 1 << 20;

/// The default capacity of a GPU constant cache on `ctx`, in bytes: half of the budget
/// `VK_EXT_memory_budget` leaves this process on the largest device-local heap, or half of
/// that heap without the extension (see the [module docs](self)). 0 if the device reports no
/// device-local heap.
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// let half = runcache::vulkan::default_capacity(&ctx);
/// println!("a GPU constant cache holds {} MiB by default", half >> 20);
/// # Ok::<(), runcache::VulkanError>(())
/// ```
pub fn default_capacity(ctx: &VulkanContext) -> u64 {
    ctx.device_heap().map_or(0, |heap| {
        let available = match (heap.budget, heap.usage) {
            (Some(budget), Some(usage)) => budget.saturating_sub(usage),
            _ => heap.size,
        };
        available / 2
    })
}

/// A GPU constant cache for buffers made by `allocator`: its capacity is the `gpu:` field of
/// `RUNCACHE_CONSTANT_CACHE_CAPACITY` when that is set, else [`default_capacity`].
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// use runcache::DeviceKind;
///
/// let weights = runcache::vulkan::constant_cache(&gpu);
/// assert_eq!(weights.device(), DeviceKind::Gpu);
/// # Ok::<(), runcache::VulkanError>(())
/// ```
pub fn constant_cache(allocator: &VulkanAllocator) -> ConstantCache {
    let bytes = match constant::env_capacity_mb(DeviceKind::Gpu) {
        Some(mb) => mb.saturating_mul(MIB),
        None => default_capacity(allocator.context()),
    };
    ConstantCache::with_capacity_bytes(DeviceKind::Gpu, bytes)
}

/// Sizes the process-wide GPU cache ([`constant::cache`]`(DeviceKind::Gpu)`) from the device
/// budget, unless the environment variable set it; returns the capacity in bytes it now has.
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// use runcache::constant::{self, DeviceKind};
///
/// let bytes = runcache::vulkan::configure_process_cache(&ctx);
/// assert_eq!(constant::cache(DeviceKind::Gpu).capacity(), bytes);
/// # Ok::<(), runcache::VulkanError>(())
/// ```
pub fn configure_process_cache(ctx: &VulkanContext) -> u64 {
    let cache = constant::cache(DeviceKind::Gpu);
    if constant::env_capacity_mb(DeviceKind::Gpu).is_none() {
        // A shrink that stops short leaves the capacity it reached, which is what we return.
        let _ = cache.set_capacity_bytes(default_capacity(ctx));
    }
    cache.capacity()
}

/// Sets `cache`'s capacity to what the device's budget leaves for it now, and returns it:
/// half of the budget `VK_EXT_memory_budget` reports for the largest device-local heap, less
/// what other work uses of it (the heap's usage less the device memory `allocator` itself
/// holds, so the cache's own buffers do not shrink it). Call it now and then while serving
/// (the runtime calls it every 64 requests): the cache shrinks, least recently used first,
/// when other work takes device memory, and grows back when it returns. A MiB setting from
/// the user (the `gpu:` field of `RUNCACHE_CONSTANT_CACHE_CAPACITY`) wins: the capacity is
/// then left alone. Without the extension the budget is the heap's size, which never moves.
/// A shrink that stops short (see [`CapacityError`](crate::CapacityError)) returns the
/// capacity it reached; the next call tries again.
///
/// ```no_run
/// use runcache::vulkan::{self, VulkanAllocator, VulkanContext};
/// use runcache::{constant::ConstantCache, DeviceKind};
///
/// let gpu = VulkanAllocator::new(VulkanContext::builder().build()?)?;
/// let weights = ConstantCache::evicting(DeviceKind::Gpu, vulkan::default_capacity(gpu.context()));
/// // ... every so often while serving:
/// let capacity = vulkan::follow_budget(&gpu, &weights);
/// assert_eq!(weights.capacity(), capacity);
/// # Ok::<(), runcache::VulkanError>(())
/// ```
pub fn follow_budget(allocator: &VulkanAllocator, cache: &ConstantCache) -> u64 {
    if constant::env_capacity_mb(DeviceKind::Gpu).is_some() {
        return cache.capacity();
    }
    let Some(heap) = allocator.context().device_heap() else {
        return cache.capacity();
    };
    let available = match (heap.budget, heap.usage) {
        (Some(budget), Some(usage)) => {
            let others = usage.saturating_sub(allocator.memory_report().driver_bytes);
            budget.saturating_sub(others)
        }
        _ => heap.size,
    };
    let capacity = available / 2;
    if capacity != cache.capacity() && cache.set_capacity_bytes(capacity).is_err() {
        // The shrink stopped short (`CapacityError`): the capacity it reached is in force,
        // and the next call tries again.
        return cache.capacity();
    }
    capacity
}

/// Takes a lock of this layer (see the module docs, "Locks").
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding either lock leaves nothing half-done that a later caller could
    // observe (each critical section is one driver call or one allocator call), so a poisoned
    // lock is taken over.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
