//! [`VulkanAllocator`]: device-local buffers sub-allocated by gpu-allocator from large blocks
//! (a dedicated allocation above a threshold), small ones as slots of shared block buffers,
//! filled by mapping or through a staging slot, with a soft limit and retirement after a
//! fence.

#![allow(unsafe_code)]

use super::buffer::DeviceBuffer;
use super::context::VulkanContext;
use super::error::VulkanError;
use super::fault::Fault;
use super::lock;
use super::shared::Shared;
use super::slab::*;
use crate::cache::Handle;
use crate::constant::ConstantBuffer;
use crate::sync::Ordering;
use ash::vk;
use crossbeam_queue::SegQueue;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};
use gpu_allocator::MemoryLocation;
use std::fmt;
use std::sync::Arc;

/// Where an allocator's device memory goes ([`VulkanAllocator::memory_report`]), from what
/// callers asked for to what the driver holds. Each figure holds the one before it, so the
/// gaps are the costs: `slot_bytes − requested_bytes` is rounding (a small buffer takes a
/// power-of-two slot; a large one its alignment), `block_bytes − slot_bytes` the free slots
/// of blocks of small buffers, `driver_bytes − block_bytes` device memory held but not
/// handed out (free ranges of gpu-allocator's blocks).
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// let _weights = gpu.upload(&[0u8; 1000])?;
/// let report = gpu.memory_report();
/// assert!(report.requested_bytes <= report.slot_bytes && report.slot_bytes <= report.block_bytes);
/// println!("rounding: {} B, free slots: {} B", report.slot_bytes - report.requested_bytes, report.block_bytes - report.slot_bytes);
/// # Ok::<(), runcache::VulkanError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryReport {
    /// Bytes of live buffers, as requested.
    pub requested_bytes: u64,
    /// Bytes the live buffers occupy: their slots, or their own allocations.
    pub slot_bytes: u64,
    /// Bytes gpu-allocator has handed out: buffers of their own and whole blocks of small
    /// buffers.
    pub block_bytes: u64,
    /// Bytes of device memory the allocator holds from the driver (`vkAllocateMemory`).
    pub driver_bytes: u64,
    /// Device-memory allocations held ([`VulkanAllocator::device_allocations`]).
    pub device_allocations: usize,
    /// Blocks of small buffers held, and how many of them hold no live buffer.
    pub slab_blocks: usize,
    /// See `slab_blocks`.
    pub empty_slab_blocks: usize,
}

/// Makes device-local buffers and fills them; see the [module docs](crate::vulkan).
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// use runcache::constant::ConstantKey;
///
/// let weights = runcache::vulkan::constant_cache(&gpu);
/// let bytes = vec![0u8; 4096];
/// let added = weights.get_or_add(ConstantKey::new(0, 1), bytes.len(), || gpu.upload_constant(&bytes))
///     .expect("uploaded");
/// assert_eq!(added.buffer.size(), 4096);
/// # Ok::<(), runcache::VulkanError>(())
/// ```
pub struct VulkanAllocator {
    pub(super) shared: Arc<Shared>,
    /// Buffers waiting for a fence before they may be freed.
    pub(super) retired: SegQueue<(vk::Fence, Handle<ConstantBuffer>)>,
}

impl VulkanAllocator {
    /// The context.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// println!("allocating on {}", gpu.context().device_name());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn context(&self) -> &Arc<VulkanContext> {
        &self.shared.ctx
    }

    /// Bytes of live buffers made by this allocator.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let buffer = gpu.allocate(1000)?;
    /// assert_eq!(gpu.used_bytes(), 1000);
    /// drop(buffer);
    /// assert_eq!(gpu.used_bytes(), 0);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn used_bytes(&self) -> u64 {
        self.shared.used.load(Ordering::Relaxed)
    }

    /// Changes the soft limit (`None`: no limit). Live buffers are kept.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// gpu.set_soft_limit(Some(1 << 20));
    /// assert!(gpu.allocate(2 << 20).is_err());
    /// gpu.set_soft_limit(None);
    /// assert!(gpu.allocate(2 << 20).is_ok());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn set_soft_limit(&self, bytes: Option<u64>) {
        // Relaxed: a bound checked by the reservation's own compare-and-swap loop.
        self.shared
            .soft_limit
            .store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Device-memory blocks and dedicated allocations the allocator holds now (each is one
    /// `vkAllocateMemory`).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let _a = gpu.allocate(1024)?;
    /// let _b = gpu.allocate(1024)?; // same block of small buffers
    /// assert_eq!(gpu.device_allocations(), 1);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn device_allocations(&self) -> usize {
        lock(&self.shared.gpu).generate_report().blocks.len()
    }

    /// Where the allocator's device memory goes now, from what callers asked for to what the
    /// driver holds: see [`MemoryReport`]. Staging memory is not in it.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let _buffer = gpu.allocate(300)?;
    /// let report = gpu.memory_report();
    /// assert_eq!(report.requested_bytes, 300);
    /// assert_eq!(report.slot_bytes, 512, "the smallest power-of-two slot that holds it");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn memory_report(&self) -> MemoryReport {
        let s = &self.shared;
        let slabs = lock(&s.slabs);
        let gpu = lock(&s.gpu);
        let report = gpu.generate_report();
        let (slab_blocks, empty_slab_blocks) = slabs.counts();
        let slab_bytes = slab_blocks as u64 * SLAB_BLOCK;
        MemoryReport {
            // Relaxed: a statistic.
            requested_bytes: s.used.load(Ordering::Relaxed),
            slot_bytes: slabs.live_slot_bytes()
                + report.total_allocated_bytes.saturating_sub(slab_bytes),
            block_bytes: report.total_allocated_bytes,
            driver_bytes: report.total_capacity_bytes,
            device_allocations: report.blocks.len(),
            slab_blocks,
            empty_slab_blocks,
        }
    }

    /// Makes a driver call fail as the driver would, for tests of the failure paths: the
    /// `skip + 1`-th device allocation or transfer submission from now returns `result` (one
    /// of `ERROR_OUT_OF_DEVICE_MEMORY`, `ERROR_OUT_OF_HOST_MEMORY`, `ERROR_DEVICE_LOST`).
    /// Replaces any fault armed before. Not part of the stable API.
    #[doc(hidden)]
    pub fn __inject(&self, at: Fault, skip: u32, result: vk::Result) {
        self.shared.faults.arm(at, skip, result);
    }

    /// Gives every empty block back to the driver now, whatever its age: the blocks of
    /// small buffers with no live slot, and, when no buffer is left, the device memory
    /// gpu-allocator keeps for the next request. Returns the bytes of device memory freed.
    /// Without a call, empty blocks go back after [`empty_block_ttl`] at the allocator's next
    /// call, or at once when a request finds the device short of memory.
    ///
    /// [`empty_block_ttl`]: super::VulkanAllocatorBuilder::empty_block_ttl
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// drop(gpu.allocate(1 << 20)?);
    /// let freed = gpu.trim();
    /// assert_eq!(gpu.memory_report().driver_bytes, 0);
    /// println!("{freed} bytes back to the driver");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn trim(&self) -> u64 {
        self.collect_retired();
        self.shared.tidy(true)
    }

    /// An uninitialized device-local buffer of `size` bytes.
    ///
    /// # Errors
    /// [`VulkanError::ZeroSize`]; with prechecks on, [`VulkanError::TooLarge`],
    /// [`VulkanError::AboveHeap`] or [`VulkanError::OverBudget`] before the driver is called;
    /// [`VulkanError::AboveStorageRange`] (unless
    /// [`limit_to_storage_range`](super::VulkanAllocatorBuilder::limit_to_storage_range) is off);
    /// [`VulkanError::SoftLimit`]; or the driver's error ([`VulkanError::OutOfDeviceMemory`]
    /// and the others). Nothing is left allocated after an error.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use runcache::VulkanError;
    ///
    /// let mut activations = gpu.allocate(1 << 20)?;
    /// gpu.write(&mut activations, 0, &[1, 2, 3])?;
    /// assert_eq!(gpu.allocate(0).unwrap_err(), VulkanError::ZeroSize);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn allocate(&self, size: u64) -> Result<DeviceBuffer, VulkanError> {
        self.collect_retired();
        if self.shared.untidy() {
            self.shared.tidy(false);
        }
        match self.try_allocate(size) {
            // Short of device memory: give back every empty block, and try once more if
            // that freed any.
            Err(VulkanError::OverBudget { .. } | VulkanError::OutOfDeviceMemory { .. })
                if self.shared.tidy(true) > 0 =>
            {
                self.try_allocate(size)
            }
            done => done,
        }
    }

    /// [`allocate`](Self::allocate), once.
    fn try_allocate(&self, size: u64) -> Result<DeviceBuffer, VulkanError> {
        let s = &self.shared;
        if size == 0 {
            return Err(VulkanError::ZeroSize);
        }
        if s.prechecks {
            let max = s.ctx.max_allocation_size;
            if size > max {
                return Err(VulkanError::TooLarge {
                    requested: size,
                    max_allocation_size: max,
                });
            }
            if let Some(heap) = s.ctx.device_heap() {
                if size > heap.size {
                    return Err(VulkanError::AboveHeap {
                        requested: size,
                        heap_size: heap.size,
                    });
                }
                if let (Some(budget), Some(usage)) = (heap.budget, heap.usage) {
                    let available = budget.saturating_sub(usage);
                    if size > available {
                        return Err(VulkanError::OverBudget {
                            requested: size,
                            available,
                        });
                    }
                }
            }
        }
        let range = s.ctx.max_storage_buffer_range();
        if s.storage_range && size > range {
            return Err(VulkanError::AboveStorageRange {
                requested: size,
                max_storage_buffer_range: range,
            });
        }
        // Reserve against the soft limit first, so concurrent requests cannot overshoot it.
        let mut used = s.used.load(Ordering::Relaxed);
        loop {
            let limit = s.soft_limit.load(Ordering::Relaxed);
            if used.checked_add(size).is_none_or(|total| total > limit) {
                return Err(VulkanError::SoftLimit {
                    requested: size,
                    used,
                    limit,
                });
            }
            // Relaxed: a byte budget; nothing is published through it.
            match s.used.compare_exchange_weak(
                used,
                used + size,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => used = now,
            }
        }
        let mut buffer = DeviceBuffer {
            buffer: vk::Buffer::null(),
            offset: 0,
            allocation: None,
            slot: None,
            memory: vk::DeviceMemory::null(),
            memory_offset: 0,
            mapped: 0,
            size,
            align: 1,
            shared: Arc::clone(s),
        };
        // From here, dropping `buffer` undoes every step done so far.
        if size <= SLAB_MAX {
            self.take_slot(&mut buffer)?;
            return Ok(buffer);
        }
        let (vk_buffer, allocation, align) = self.bound_buffer(
            size,
            size >= s.dedicated_threshold,
            "runcache constant",
            size,
        )?;
        (buffer.memory, buffer.memory_offset, buffer.mapped) = placement(&allocation);
        buffer.buffer = vk_buffer;
        buffer.allocation = Some(allocation);
        buffer.align = align;
        Ok(buffer)
    }

    /// A new device-local buffer of `size` bytes bound to memory of its own (a dedicated
    /// allocation, or a gpu-allocator sub-allocation), with its alignment. On an error nothing
    /// is left made; `requested` is the size the caller asked for (for the error).
    pub(super) fn bound_buffer(
        &self,
        size: u64,
        dedicated: bool,
        name: &'static str,
        requested: u64,
    ) -> Result<(vk::Buffer, Allocation, u64), VulkanError> {
        let s = &self.shared;
        let d = &s.ctx.device;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(BUFFER_USAGE)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: (V5) a valid device and create info.
        let buffer = unsafe { d.create_buffer(&info, None) }
            .map_err(|r| VulkanError::from_vk("vkCreateBuffer", r, requested))?;
        // SAFETY: (V5) the buffer was just made on this device.
        let requirements = unsafe { d.get_buffer_memory_requirements(buffer) };
        if let Some(r) = s.faults.strike(Fault::Allocation) {
            // SAFETY: (V3) made above, never bound or used.
            unsafe { d.destroy_buffer(buffer, None) };
            return Err(VulkanError::from_vk("vkAllocateMemory", r, requested));
        }
        let allocated = lock(&s.gpu).allocate(&AllocationCreateDesc {
            name,
            requirements,
            location: MemoryLocation::GpuOnly,
            linear: true,
            allocation_scheme: if dedicated {
                AllocationScheme::DedicatedBuffer(buffer)
            } else {
                AllocationScheme::GpuAllocatorManaged
            },
        });
        let allocation = match allocated {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: (V3) made above, never bound or used.
                unsafe { d.destroy_buffer(buffer, None) };
                return Err(VulkanError::from_allocator(e, requested));
            }
        };
        // SAFETY: (V5) the allocation's memory satisfies the buffer's requirements (gpu-allocator
        // allocated it for them) at its offset; the buffer is bound once.
        let bound =
            unsafe { d.bind_buffer_memory(buffer, allocation.memory(), allocation.offset()) };
        if let Err(r) = bound {
            // SAFETY: (V3) made above and not in use; the allocation is freed right after.
            unsafe { d.destroy_buffer(buffer, None) };
            if let Err(e) = lock(&s.gpu).free(allocation) {
                log::error!("runcache: gpu-allocator could not free an allocation: {e}");
            }
            return Err(VulkanError::from_vk("vkBindBufferMemory", r, requested));
        }
        Ok((buffer, allocation, requirements.alignment.max(1)))
    }

    /// Makes `buffer` (small, reserved, not yet backed) a free slot of its size class, adding
    /// a block to the class when it has none free.
    pub(super) fn take_slot(&self, buffer: &mut DeviceBuffer) -> Result<(), VulkanError> {
        let s = &self.shared;
        let (class, slot_size) = slab_class(buffer.size);
        let mut slabs = lock(&s.slabs);
        let (block, slot) = match slabs.free[class].pop() {
            Some((block, slot)) => {
                // A block that was empty is no longer; `due` may stay early, which only
                // costs one `tidy` that finds it young.
                slabs.took(block);
                (block, slot)
            }
            None => {
                if slabs.holes.is_empty() && u32::try_from(slabs.blocks.len()).is_err() {
                    return Err(VulkanError::TooManyBlocks);
                }
                let new = self.new_block(class, buffer.size)?;
                (slabs.add(new, slot_size), 0)
            }
        };
        let b = slabs.block(block);
        let (memory, memory_offset, mapped) = placement(&b.allocation);
        let offset = u64::from(slot) * slot_size;
        buffer.buffer = b.buffer;
        buffer.offset = offset;
        buffer.slot = Some(SlotId { class, block, slot });
        buffer.memory = memory;
        buffer.memory_offset = memory_offset + offset;
        buffer.mapped = if mapped == 0 {
            0
        } else {
            mapped + offset as usize
        };
        buffer.align = slot_size;
        Ok(())
    }

    /// A new 4 MiB block buffer for small buffers of `class`, bound to a sub-allocation of
    /// its own, its first slot counted as taken. `requested` is the size of the request that
    /// needed it (for errors).
    pub(super) fn new_block(&self, class: usize, requested: u64) -> Result<SlabBlock, VulkanError> {
        let (buffer, allocation, _) =
            self.bound_buffer(SLAB_BLOCK, false, "runcache small-buffer block", requested)?;
        Ok(SlabBlock {
            buffer,
            allocation,
            class,
            live: 1,
            empty_since: None,
        })
    }
}

impl fmt::Debug for VulkanAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanAllocator")
            .field("context", &self.shared.ctx)
            .field("used_bytes", &self.used_bytes())
            .field("retired_pending", &self.retired.len())
            .finish_non_exhaustive()
    }
}
