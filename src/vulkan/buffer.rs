//! [`DeviceBuffer`]: one device-local buffer, or one slot of a shared block buffer, freed
//! through its allocator when dropped.

#![allow(unsafe_code)]

use super::lock;
use super::shared::Shared;
use super::slab::SlotId;
use crate::constant::DeviceKind;
use crate::constant::DeviceMemory;
use crate::sync::Ordering;
use ash::vk;
use gpu_allocator::vulkan::Allocation;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

/// A device-local Vulkan buffer made by a [`VulkanAllocator`](super::VulkanAllocator); freed when dropped.
///
/// **Contract:** the device must be done with the buffer before it drops. Hold its handle
/// (the cache's `Handle<ConstantBuffer>`) until every submission that reads it has completed, or
/// hand it to [`VulkanAllocator::retire_after`](super::VulkanAllocator::retire_after) with that submission's fence.
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// let buffer = gpu.upload(&[0u8; 1024])?;
/// // Bind this range in a descriptor set.
/// let (vk_buffer, offset, size) = (buffer.buffer(), buffer.offset(), buffer.size());
/// assert_eq!((offset % 256, size), (0, 1024));
/// # let _ = vk_buffer;
/// # Ok::<(), runcache::VulkanError>(())
/// ```
pub struct DeviceBuffer {
    /// Its own buffer, or (for a slot) its block's, which it does not own.
    pub(super) buffer: vk::Buffer,
    /// Where the buffer's range starts inside `buffer` (0 unless it is a slot).
    pub(super) offset: u64,
    /// Its own allocation (`None` for a slot).
    pub(super) allocation: Option<Allocation>,
    pub(super) slot: Option<SlotId>,
    pub(super) memory: vk::DeviceMemory,
    /// Where the range starts inside `memory`.
    pub(super) memory_offset: u64,
    /// Host address of the range's first byte when mapped and coherent, else 0.
    pub(super) mapped: usize,
    pub(super) size: u64,
    pub(super) align: u64,
    pub(super) shared: Arc<Shared>,
}

impl DeviceBuffer {
    /// The `vk::Buffer` to bind in descriptor sets or copy from. A small buffer (up to
    /// [`SLAB_MAX`](super::SLAB_MAX)) shares it with others: use the range from [`offset`](Self::offset) for
    /// [`size`](Self::size) bytes, never the whole buffer.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let (a, b) = (gpu.allocate(100)?, gpu.allocate(100)?);
    /// assert_eq!(a.buffer(), b.buffer(), "small buffers share a block buffer");
    /// assert_ne!(a.offset(), b.offset());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn buffer(&self) -> vk::Buffer {
        self.buffer
    }

    /// Where this buffer's bytes start inside [`buffer`](Self::buffer): 0 for a buffer of its
    /// own, the slot's offset for a small one (a multiple of 256, so it can be bound as a
    /// storage or uniform buffer offset on any device).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// assert_eq!(gpu.allocate(100)?.offset() % 256, 0);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The size in bytes (as requested).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// assert_eq!(gpu.allocate(100)?.size(), 100);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The device memory and the offset of this buffer's first byte in it.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let buffer = gpu.allocate(4096)?;
    /// let (memory, offset) = buffer.memory();
    /// println!("{memory:?} at {offset}");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn memory(&self) -> (vk::DeviceMemory, u64) {
        (self.memory, self.memory_offset)
    }

    /// Whether the buffer has a device allocation of its own (not sub-allocated).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// assert!(!gpu.allocate(1 << 10)?.is_dedicated());
    /// assert!(gpu.allocate(32 << 20)?.is_dedicated(), "16 MiB and more: an allocation of its own");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn is_dedicated(&self) -> bool {
        self.allocation.as_ref().is_some_and(|a| a.is_dedicated())
    }
}

impl DeviceMemory for DeviceBuffer {
    fn size(&self) -> usize {
        self.size as usize
    }

    fn align(&self) -> usize {
        self.align as usize
    }

    fn device(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let s = &self.shared;
        if let Some(SlotId { class, block, slot }) = self.slot {
            // The device is done with the range (the type's contract): its slot is free again.
            let mut slabs = lock(&s.slabs);
            slabs.free[class].push((block, slot));
            let now = Instant::now();
            if slabs.freed(block, now) {
                drop(slabs);
                s.emptied(now);
            }
        } else if self.buffer != vk::Buffer::null() {
            // SAFETY: (V3) made on this device; the device is done with it (the type's contract).
            unsafe { s.ctx.device.destroy_buffer(self.buffer, None) };
        }
        if let Some(a) = self.allocation.take() {
            if let Err(e) = lock(&s.gpu).free(a) {
                log::error!("runcache: gpu-allocator could not free a constant buffer: {e}");
            }
        }
        // Relaxed: a byte budget (see `allocate`).
        if s.used.fetch_sub(self.size, Ordering::Relaxed) == self.size {
            // The last live buffer: gpu-allocator may now hold an empty block.
            s.emptied(Instant::now());
        }
        if s.untidy() {
            s.tidy(false);
        }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("buffer", &self.buffer)
            .field("offset", &self.offset)
            .field("size", &self.size)
            .field("dedicated", &self.is_dedicated())
            .finish()
    }
}
