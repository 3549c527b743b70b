//! [`VulkanAllocatorBuilder`]: the allocator's settings, checked when it is built.

use super::allocator::VulkanAllocator;
use super::context::VulkanContext;
use super::error::VulkanError;
use super::fault::Faults;
use super::shared::{gpu_allocator, Shared};
use super::slab::*;
use crate::pool::{PoolManager, WhenExhausted};
use crate::sync::AtomicU64;
use crossbeam_queue::SegQueue;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
