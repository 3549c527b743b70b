//! The state a [`VulkanAllocator`](super::VulkanAllocator) shares with every buffer it made:
//! the staging slots, the slab blocks, gpu-allocator's allocator and the context. Each
//! [`DeviceBuffer`](super::DeviceBuffer) holds an `Arc` of it, so it (and the device) outlives
//! every buffer. It also gives device memory back: [`Shared::tidy`] frees slab blocks that
//! have stayed empty, and gpu-allocator's last block once nothing is allocated.

#![allow(unsafe_code)]

use super::context::VulkanContext;
use super::error::VulkanError;
use super::fault::Faults;
use super::lock;
use super::slab::Slabs;
use super::staging::Staging;
use crate::pool::PoolManager;
use crate::sync::{AtomicU64, Ordering};
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};
use gpu_allocator::{AllocationSizes, AllocatorDebugSettings};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shared by an allocator and the buffers it made, so a buffer can free itself.
pub(super) struct Shared {
    // Field order is drop order: staging slots and the allocator go before the context (the
    // slab blocks are freed by `Drop for Shared`, before any field).
    pub(super) staging: PoolManager<Option<Staging>>,
    pub(super) slabs: Mutex<Slabs>,
    pub(super) gpu: Mutex<Allocator>,
    /// Bytes of live buffers made by this allocator.
    pub(super) used: AtomicU64,
    pub(super) soft_limit: AtomicU64,
    /// When [`tidy`](Shared::tidy) may next find a block old enough to free, in nanoseconds
    /// from `born`; `u64::MAX` while nothing is empty. A hint that keeps the clock and the
    /// locks off the calls with nothing to free.
    pub(super) due: AtomicU64,
    pub(super) born: Instant,
    /// How long a slab block, or gpu-allocator's last block, stays empty before it is freed.
    pub(super) empty_ttl: Duration,
    pub(super) block_size: u64,
    pub(super) dedicated_threshold: u64,
    pub(super) staging_size: u64,
    pub(super) force_staging: bool,
    pub(super) prechecks: bool,
    /// Refuse buffers above `maxStorageBufferRange`.
    pub(super) storage_range: bool,
    pub(super) faults: Faults,
    pub(super) ctx: Arc<VulkanContext>,
}

/// A gpu-allocator allocator on `ctx` with blocks of `block_size` bytes.
pub(super) fn gpu_allocator(
    ctx: &VulkanContext,
    block_size: u64,
) -> Result<Allocator, VulkanError> {
    Allocator::new(&AllocatorCreateDesc {
        instance: ctx.instance.clone(),
        device: ctx.device.clone(),
        physical_device: ctx.physical,
        debug_settings: AllocatorDebugSettings::default(),
        buffer_device_address: false,
        allocation_sizes: AllocationSizes::new(block_size, block_size),
    })
    .map_err(|e| VulkanError::from_allocator(e, 0))
}

impl Shared {
    /// Whether [`tidy`](Self::tidy) may find something old enough to free now.
    pub(super) fn untidy(&self) -> bool {
        // Relaxed: a hint; `tidy` decides under the locks.
        let due = self.due.load(Ordering::Relaxed);
        due != u64::MAX && self.nanos(Instant::now()) >= due
    }

    /// Notes that something became empty at `at`: a slab block lost its last slot, or the
    /// last live buffer was freed (gpu-allocator may then hold an empty block).
    pub(super) fn emptied(&self, at: Instant) {
        let due = self
            .nanos(at)
            .saturating_add(self.empty_ttl.as_nanos() as u64);
        // Relaxed: see `untidy`.
        self.due.fetch_min(due, Ordering::Relaxed);
    }

    fn nanos(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.born).as_nanos() as u64
    }

    /// Gives device memory back to the driver: every slab block empty for at least the
    /// allocator's `empty_ttl` (every empty one with `now_all`), and, when gpu-allocator then
    /// holds no allocation at all, the blocks it keeps (it frees an empty block unless it is
    /// the last of its memory type; a fresh allocator holds none). Without `now_all`, it runs
    /// once [`due`](Self::due) has passed, which the last buffer's free sets a ttl ahead, so
    /// gpu-allocator's last block has been unused for about that long. Returns the bytes of
    /// device memory freed.
    pub(super) fn tidy(&self, now_all: bool) -> u64 {
        let now = Instant::now();
        // Blocks empty since `cutoff` or earlier are old enough. A process younger than the
        // ttl has none.
        let cutoff = if now_all {
            None
        } else {
            match now.checked_sub(self.empty_ttl) {
                Some(t) => Some(t),
                None => return 0,
            }
        };
        let mut slabs = lock(&self.slabs);
        let blocks = slabs.take_empty(cutoff);
        // The next block to come of age, if any. Stored under the slab lock: a block emptied
        // after this is noted by its `emptied` after the lock is released.
        let next = slabs.oldest_empty().map_or(u64::MAX, |t| {
            self.nanos(t)
                .saturating_add(self.empty_ttl.as_nanos() as u64)
        });
        // Relaxed: see `untidy`.
        self.due.store(next, Ordering::Relaxed);
        let mut gpu = lock(&self.gpu);
        let before = gpu.capacity();
        for block in blocks {
            // SAFETY: (V3) made on this device; no live slot is in it (`take_empty`), so the
            // device is done with it (the buffers' contract).
            unsafe { self.ctx.device.destroy_buffer(block.buffer, None) };
            if let Err(e) = gpu.free(block.allocation) {
                log::error!("runcache: gpu-allocator could not free a block: {e}");
            }
        }
        if gpu.capacity() > 0 && gpu.generate_report().allocations.is_empty() {
            match gpu_allocator(&self.ctx, self.block_size) {
                // The old allocator holds no allocation: dropping it frees its blocks.
                Ok(fresh) => *gpu = fresh,
                Err(e) => log::warn!("runcache: could not renew gpu-allocator: {e}"),
            }
        }
        drop(slabs);
        before.saturating_sub(gpu.capacity())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Every buffer holds an `Arc` of this, so no slot is in use; the blocks go before the
        // allocator they came from.
        let slabs = std::mem::take(self.slabs.get_mut().unwrap_or_else(|p| p.into_inner()));
        let gpu = self.gpu.get_mut().unwrap_or_else(|p| p.into_inner());
        for block in slabs.blocks.into_iter().flatten() {
            // SAFETY: (V3) made on this device; no buffer uses a slot of it any more.
            unsafe { self.ctx.device.destroy_buffer(block.buffer, None) };
            if let Err(e) = gpu.free(block.allocation) {
                log::error!("runcache: gpu-allocator could not free a block: {e}");
            }
        }
    }
}
