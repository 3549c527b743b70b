//! [`VulkanAllocator`]: device-local buffers sub-allocated by gpu-allocator from large blocks
//! (a dedicated allocation above a threshold), small ones as slots of shared block buffers,
//! filled by mapping or through a staging slot, with a soft limit and retirement after a
//! fence.

#![allow(unsafe_code)]

use super::buffer::DeviceBuffer;
use super::context::{VulkanContext, FENCE_TIMEOUT};
use super::error::VulkanError;
use super::fault::{Fault, Faults};
use super::lock;
use super::shared::{gpu_allocator, Shared};
use super::slab::*;
use super::staging::Staging;
use crate::cache::Handle;
use crate::constant::ConstantBuffer;
use crate::pool::{PoolManager, WhenExhausted};
use crate::sync::{AtomicU64, Ordering};
use ash::vk;
use crossbeam_queue::SegQueue;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};
use gpu_allocator::MemoryLocation;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Configures a [`VulkanAllocator`]; see [`VulkanAllocator::builder`].
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// let gpu = VulkanAllocator::builder(ctx)
///     .soft_limit(256 << 20) // at most 256 MiB of live buffers
///     .staging_slots(2)
///     .build()?;
/// assert_eq!(gpu.used_bytes(), 0);
/// # Ok::<(), runcache::VulkanError>(())
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct VulkanAllocatorBuilder {
    pub(super) ctx: Arc<VulkanContext>,
    pub(super) soft_limit: Option<u64>,
    pub(super) dedicated_threshold: u64,
    pub(super) block_size: u64,
    pub(super) staging_size: u64,
    pub(super) staging_slots: usize,
    pub(super) force_staging: bool,
    pub(super) prechecks: bool,
    pub(super) empty_ttl: Duration,
    pub(super) storage_range: bool,
}

impl VulkanAllocatorBuilder {
    /// At most this many bytes of live buffers; a request beyond it fails with
    /// [`VulkanError::SoftLimit`] before the driver is called. For testing out-of-memory paths
    /// on any device, or for sharing a device with other work. Default: none.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use runcache::VulkanError;
    ///
    /// let gpu = VulkanAllocator::builder(ctx).soft_limit(1 << 20).build()?;
    /// let err = gpu.allocate(2 << 20).unwrap_err();
    /// assert!(matches!(err, VulkanError::SoftLimit { .. }));
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn soft_limit(mut self, bytes: u64) -> Self {
        self.soft_limit = Some(bytes);
        self
    }

    /// Buffers of at least this many bytes get a dedicated device allocation; smaller ones
    /// are sub-allocated from shared blocks. Default 16 MiB (a quarter of a default block):
    /// a buffer of its own goes back to the driver as soon as it is freed, where large
    /// buffers freed from a shared block leave holes that hold the block. On a long random
    /// run of allocations and frees (`tests/vulkan.rs`), the device memory held was at most
    /// 1.56–1.75× the live bytes over five seeds with 16 MiB, 1.99–2.21× with 64 MiB.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let gpu = VulkanAllocator::builder(ctx).dedicated_threshold(4 << 20).build()?;
    /// assert!(gpu.allocate(8 << 20)?.is_dedicated());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn dedicated_threshold(mut self, bytes: u64) -> Self {
        self.dedicated_threshold = bytes;
        self
    }

    /// The size of the device-memory blocks small buffers are packed into. Default 64 MiB.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let gpu = VulkanAllocator::builder(ctx).block_size(256 << 20).build()?;
    /// let _small = gpu.allocate(1 << 20)?;
    /// assert_eq!(gpu.device_allocations(), 1);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn block_size(mut self, bytes: u64) -> Self {
        self.block_size = bytes;
        self
    }

    /// The size of each staging buffer, at least 2 bytes. An upload goes through it in
    /// chunks of half its size, alternating its halves so that the host copies one chunk
    /// while the device copies the one before. Default 16 MiB.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// // 4 MiB staging buffers: uploads move in 2 MiB chunks.
    /// let gpu = VulkanAllocator::builder(ctx).staging_size(4 << 20).build()?;
    /// let _weights = gpu.upload(&vec![1u8; 10 << 20])?;
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn staging_size(mut self, bytes: u64) -> Self {
        self.staging_size = bytes;
        self
    }

    /// How many staging slots may exist at once (concurrent transfers beyond it wait for a
    /// slot). Default 4.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// // At most 8 uploads in flight at once; more wait for a slot.
    /// let gpu = VulkanAllocator::builder(ctx).staging_slots(8).build()?;
    /// # let _ = gpu;
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn staging_slots(mut self, n: usize) -> Self {
        self.staging_slots = n;
        self
    }

    /// Always go through staging, even when the device memory is host-visible (to measure or
    /// test that path on unified-memory devices). Default off.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let gpu = VulkanAllocator::builder(ctx).force_staging(true).build()?;
    /// let buffer = gpu.upload(&[7u8; 64])?;
    /// assert_eq!(gpu.read(&buffer, 0, 64)?, [7u8; 64]);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn force_staging(mut self, on: bool) -> Self {
        self.force_staging = on;
        self
    }

    /// How long a block of small buffers, or the last block of device memory, may stay empty
    /// before it goes back to the driver. It goes at the first call of the allocator after
    /// that (an allocation, a buffer dropped, [`VulkanAllocator::trim`]); at once when a
    /// request finds the device budget or memory short. `Duration::ZERO` frees each block as
    /// soon as it is empty. Default 1 second: a burst that evicts and refills within it
    /// keeps its blocks.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use std::time::Duration;
    ///
    /// let gpu = VulkanAllocator::builder(ctx).empty_block_ttl(Duration::ZERO).build()?;
    /// drop(gpu.allocate(1024)?);
    /// let _next = gpu.allocate(1024)?; // the empty block went back first
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn empty_block_ttl(mut self, ttl: Duration) -> Self {
        self.empty_ttl = ttl;
        self
    }

    /// Refuse buffers larger than the device's `maxStorageBufferRange` with
    /// [`VulkanError::AboveStorageRange`], so that every buffer can be bound whole as a
    /// storage buffer. Default on. Off, larger buffers are made (up to
    /// `maxMemoryAllocationSize`), and the caller binds each in ranges of at most
    /// [`VulkanContext::max_storage_buffer_range`] bytes (128 MiB on lavapipe and on many
    /// mobile GPUs, 4 GiB on most discrete ones).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let gpu = VulkanAllocator::builder(ctx.clone()).limit_to_storage_range(false).build()?;
    /// let big = gpu.allocate(ctx.max_storage_buffer_range() + 1)?;
    /// // Bind it in ranges of at most `max_storage_buffer_range` bytes.
    /// assert!(big.size() > ctx.max_storage_buffer_range());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn limit_to_storage_range(mut self, on: bool) -> Self {
        self.storage_range = on;
        self
    }

    /// Check each request against `maxMemoryAllocationSize`, the heap size and the budget
    /// before calling the driver. Default on; off only to see what the driver itself says.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// // What does the driver itself say to an impossible request?
    /// let gpu = VulkanAllocator::builder(ctx).prechecks(false).build()?;
    /// println!("{:?}", gpu.allocate(u64::MAX / 2).unwrap_err());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn prechecks(mut self, on: bool) -> Self {
        self.prechecks = on;
        self
    }

    /// Makes the allocator.
    ///
    /// # Errors
    /// [`VulkanError::InvalidConfig`] for a zero size or slot count, or the allocator's own
    /// error.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use runcache::VulkanError;
    ///
    /// let err = VulkanAllocator::builder(ctx).staging_slots(0).build().unwrap_err();
    /// assert!(matches!(err, VulkanError::InvalidConfig { .. }));
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn build(self) -> Result<VulkanAllocator, VulkanError> {
        let bad = |reason: &'static str| Err(VulkanError::InvalidConfig { reason });
        if self.staging_size < 2 {
            return bad("staging_size must be at least 2 bytes (two halves of at least 1)");
        }
        if self.staging_slots == 0 {
            return bad("staging_slots must be at least 1 (got 0)");
        }
        if self.block_size < (1 << 20) || self.block_size % (4 << 10) != 0 {
            return bad("block_size must be at least 1 MiB and a multiple of 4 KiB");
        }
        let ctx = self.ctx;
        let gpu = gpu_allocator(&ctx, self.block_size)?;
        let staging = PoolManager::builder(|| None)
            .max_pools(self.staging_slots)
            .when_exhausted(WhenExhausted::Wait)
            .build()
            .expect("checked above: one pool per growth, a maximum of at least 1");
        Ok(VulkanAllocator {
            shared: Arc::new(Shared {
                staging,
                slabs: Mutex::new(Slabs::default()),
                gpu: Mutex::new(gpu),
                used: AtomicU64::new(0),
                soft_limit: AtomicU64::new(self.soft_limit.unwrap_or(u64::MAX)),
                due: AtomicU64::new(u64::MAX),
                born: Instant::now(),
                empty_ttl: self.empty_ttl,
                block_size: self.block_size,
                dedicated_threshold: self.dedicated_threshold,
                staging_size: self.staging_size,
                force_staging: self.force_staging,
                prechecks: self.prechecks,
                storage_range: self.storage_range,
                faults: Faults::default(),
                ctx,
            }),
            retired: SegQueue::new(),
        })
    }
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
    /// An allocator with the default settings.
    ///
    /// # Errors
    /// As [`VulkanAllocatorBuilder::build`].
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let gpu = VulkanAllocator::new(ctx)?;
    /// assert_eq!(gpu.used_bytes(), 0);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn new(ctx: Arc<VulkanContext>) -> Result<Self, VulkanError> {
        Self::builder(ctx).build()
    }

    /// A builder for an allocator on `ctx`.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let gpu = VulkanAllocator::builder(ctx).soft_limit(64 << 20).build()?;
    /// # let _ = gpu;
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn builder(ctx: Arc<VulkanContext>) -> VulkanAllocatorBuilder {
        VulkanAllocatorBuilder {
            ctx,
            soft_limit: None,
            dedicated_threshold: 16 << 20,
            block_size: 64 << 20,
            staging_size: 16 << 20,
            staging_slots: 4,
            force_staging: false,
            prechecks: true,
            empty_ttl: Duration::from_secs(1),
            storage_range: true,
        }
    }

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
    /// [`empty_block_ttl`]: VulkanAllocatorBuilder::empty_block_ttl
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
    /// [`limit_to_storage_range`](VulkanAllocatorBuilder::limit_to_storage_range) is off);
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

    /// A device-local buffer holding `bytes`.
    ///
    /// # Errors
    /// As [`allocate`](Self::allocate) and [`write`](Self::write).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let buffer = gpu.upload(&[1u8, 2, 3, 4])?;
    /// assert_eq!(gpu.read(&buffer, 0, 4)?, [1, 2, 3, 4]);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn upload(&self, bytes: &[u8]) -> Result<DeviceBuffer, VulkanError> {
        let mut buffer = self.allocate(bytes.len() as u64)?;
        self.write(&mut buffer, 0, bytes)?;
        Ok(buffer)
    }

    /// [`upload`](Self::upload), wrapped as a [`ConstantBuffer`] for a GPU constant cache.
    ///
    /// # Errors
    /// As [`upload`](Self::upload).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use runcache::DeviceKind;
    ///
    /// let constant = gpu.upload_constant(&[0u8; 256])?;
    /// assert_eq!((constant.size(), constant.device()), (256, DeviceKind::Gpu));
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn upload_constant(&self, bytes: &[u8]) -> Result<ConstantBuffer, VulkanError> {
        Ok(ConstantBuffer::from_device_memory(self.upload(bytes)?))
    }

    /// Writes `bytes` at `offset` into a buffer nobody else uses yet (`&mut`): by mapping when
    /// the memory is host-visible and coherent, else through a staging slot, a copy and a
    /// fence. When it returns, the data is on the device, or, after an error, no transfer
    /// into the buffer is in flight any more: a fence wait past its minute is retried with a
    /// warning rather than returned, since the caller may free the buffer next (only a lost
    /// device ends the wait early).
    ///
    /// # Errors
    /// [`VulkanError::OutOfRange`], [`VulkanError::NotFromThisAllocator`], or a staging or
    /// transfer error.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let mut buffer = gpu.allocate(8)?;
    /// gpu.write(&mut buffer, 4, &[9, 9, 9, 9])?;
    /// assert_eq!(gpu.read(&buffer, 4, 4)?, [9, 9, 9, 9]);
    /// assert!(gpu.write(&mut buffer, 6, &[0; 4]).is_err(), "past the end");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn write(
        &self,
        buffer: &mut DeviceBuffer,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), VulkanError> {
        self.check(buffer, offset, bytes.len() as u64)?;
        if let Some(dst) = self.mapped(buffer) {
            // SAFETY: (V4) `dst` maps the buffer's whole range (host-visible, coherent memory);
            // `check` kept the write inside it; `&mut` means no one else reads it now.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.add(offset as usize), bytes.len())
            };
            return Ok(());
        }
        let mut slot = self.staging()?;
        let staging = slot.as_mut().expect("filled by `staging`");
        let dst = buffer.buffer;
        let base = buffer.offset + offset;
        // Chunk n goes through half n % 2: its host copy waits only for the transfer of chunk
        // n - 2, so it overlaps the device's copy of chunk n - 1.
        let mut sent = || {
            for (i, chunk) in bytes.chunks(staging.chunk() as usize).enumerate() {
                let half = i % 2;
                staging.wait(half, &self.shared.faults)?;
                let (src_offset, host) = staging.half(half);
                // SAFETY: (V2, V4) the half is mapped, `chunk()` bytes long (at least
                // `chunk.len()`), and idle (its last transfer was waited for just above).
                unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), host, chunk.len()) };
                let region = vk::BufferCopy {
                    src_offset,
                    dst_offset: base + i as u64 * staging.chunk(),
                    size: chunk.len() as u64,
                };
                // Make the copy visible to whatever the application runs next.
                staging.submit(
                    half,
                    &self.shared.faults,
                    (staging.buffer, dst),
                    region,
                    vk::PipelineStageFlags::ALL_COMMANDS,
                    vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE,
                )?;
            }
            Ok(())
        };
        let sent = sent();
        // Every transfer into the buffer is over before it returns, even after an error or a
        // wait that timed out: the caller may free the buffer then.
        let done = staging.settle(&self.shared.faults);
        drop(slot);
        sent.and(done)
    }

    /// Copies `len` bytes at `offset` out of a buffer (for checks and debugging; a runtime
    /// reads its constants on the device).
    ///
    /// # Errors
    /// As [`write`](Self::write).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let buffer = gpu.upload(b"weights")?;
    /// assert_eq!(gpu.read(&buffer, 0, 7)?, b"weights");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn read(
        &self,
        buffer: &DeviceBuffer,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, VulkanError> {
        self.check(buffer, offset, len)?;
        let mut out = vec![0u8; len as usize];
        if let Some(src) = self.mapped(buffer) {
            // SAFETY: (V4) as in `write`; reading only, and the caller does not let the device
            // write this buffer meanwhile (constants are read-only on the device).
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(offset as usize), out.as_mut_ptr(), out.len())
            };
            return Ok(out);
        }
        let mut slot = self.staging()?;
        let staging = slot.as_mut().expect("filled by `staging`");
        let (total, step) = (out.len(), staging.chunk() as usize);
        let chunks = total.div_ceil(step);
        // The bytes of `out` that chunk `n` carries.
        let span = |n: usize| n * step..total.min((n + 1) * step);
        // Chunk n comes through half n % 2, and is sent before chunk n - 1 is copied out: the
        // device fills one half while the host empties the other. Half n % 2 last held chunk
        // n - 2, copied out a round earlier, so `submit`'s own wait for it returns at once.
        let mut received = || {
            for n in 0..=chunks {
                if n < chunks {
                    let region = vk::BufferCopy {
                        src_offset: buffer.offset + offset + span(n).start as u64,
                        dst_offset: staging.half(n % 2).0,
                        size: span(n).len() as u64,
                    };
                    // Make the copy visible to the host read after the fence.
                    staging.submit(
                        n % 2,
                        &self.shared.faults,
                        (buffer.buffer, staging.buffer),
                        region,
                        vk::PipelineStageFlags::HOST,
                        vk::AccessFlags::HOST_READ,
                    )?;
                }
                let Some(done) = n.checked_sub(1) else {
                    continue;
                };
                // The bytes are needed, so a wait past its minute waits on.
                staging.settle_half(done % 2, &self.shared.faults)?;
                let chunk = &mut out[span(done)];
                // SAFETY: (V2, V4) the transfer finished (fence) and the half holds
                // `chunk.len()` bytes of it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        staging.half(done % 2).1,
                        chunk.as_mut_ptr(),
                        chunk.len(),
                    )
                };
            }
            Ok(())
        };
        let received = received();
        // After an error, nothing may still read the buffer when this returns: the caller
        // could free it.
        let done = staging.settle(&self.shared.faults);
        drop(slot);
        received.and(done)?;
        Ok(out)
    }

    /// Keeps `buffer` alive until `fence` signals, then lets it go (freeing it if this was the
    /// last handle). For a buffer evicted or removed from a cache while a submission that reads
    /// it may still run. Retired buffers are checked at every [`allocate`](Self::allocate),
    /// at [`collect_retired`](Self::collect_retired), and waited for when the allocator drops.
    ///
    /// The fence stays the caller's: it must stay valid (not destroyed or reset) until then.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use runcache::vulkan::ash::vk;
    ///
    /// let constant = runcache::Handle::new(gpu.upload_constant(&[0u8; 64])?);
    /// // SAFETY: a valid device and create info.
    /// let fence = unsafe { ctx.device().create_fence(&vk::FenceCreateInfo::default(), None) }
    ///     .expect("a fence");
    /// // ... submit work that reads `constant`, signalling `fence` ...
    /// gpu.retire_after(fence, constant); // freed once the fence has signalled
    /// assert_eq!(gpu.retired_pending(), 1);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn retire_after(&self, fence: vk::Fence, buffer: Handle<ConstantBuffer>) {
        self.retired.push((fence, buffer));
    }

    /// Lets go of every retired buffer whose fence has signalled; returns how many.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let released = gpu.collect_retired();
    /// println!("{released} retired buffers released; {} pending", gpu.retired_pending());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn collect_retired(&self) -> usize {
        let mut released = 0;
        for _ in 0..self.retired.len() {
            let Some((fence, buffer)) = self.retired.pop() else {
                break;
            };
            // SAFETY: (V3) the fence is valid until the buffer is released (`retire_after`'s
            // contract).
            match unsafe { self.shared.ctx.device.get_fence_status(fence) } {
                Ok(true) | Err(_) => {
                    // Signalled, or the device is lost (then nothing runs any more).
                    drop(buffer);
                    released += 1;
                }
                Ok(false) => self.retired.push((fence, buffer)),
            }
        }
        released
    }

    /// Buffers retired and not yet released.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// assert_eq!(gpu.retired_pending(), 0);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn retired_pending(&self) -> usize {
        self.retired.len()
    }

    pub(super) fn check(
        &self,
        buffer: &DeviceBuffer,
        offset: u64,
        len: u64,
    ) -> Result<(), VulkanError> {
        if !Arc::ptr_eq(&buffer.shared, &self.shared) {
            return Err(VulkanError::NotFromThisAllocator);
        }
        if offset.checked_add(len).is_none_or(|end| end > buffer.size) {
            return Err(VulkanError::OutOfRange {
                offset,
                len,
                size: buffer.size,
            });
        }
        Ok(())
    }

    /// The host address of the buffer's first byte, if its memory is mapped and coherent and
    /// mapping is allowed.
    pub(super) fn mapped(&self, buffer: &DeviceBuffer) -> Option<*mut u8> {
        if self.shared.force_staging || buffer.mapped == 0 {
            return None;
        }
        Some(buffer.mapped as *mut u8)
    }

    /// A staging slot, made on first use.
    pub(super) fn staging(
        &self,
    ) -> Result<crate::pool::PoolGuard<'_, Option<Staging>>, VulkanError> {
        let mut slot = self
            .shared
            .staging
            .reserve()
            .map_err(|e| VulkanError::Staging { source: e })?;
        if slot.is_none() {
            *slot = Some(Staging::new(&self.shared.ctx, self.shared.staging_size)?);
        }
        Ok(slot)
    }
}

impl Drop for VulkanAllocator {
    fn drop(&mut self) {
        // Wait for the fences of retired buffers, so none is freed while the device may use
        // it; a lost device or a timeout gives up waiting (nothing more can be done).
        while let Some((fence, buffer)) = self.retired.pop() {
            // SAFETY: (V3) valid until released (`retire_after`'s contract).
            let _ = unsafe {
                self.shared.ctx.device.wait_for_fences(
                    &[fence],
                    true,
                    FENCE_TIMEOUT.as_nanos() as u64,
                )
            };
            drop(buffer);
        }
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
