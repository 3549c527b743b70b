//! The state a [`VulkanAllocator`](super::VulkanAllocator) shares with every buffer it made:
//! the staging slots, the slab blocks, gpu-allocator's allocator and the context. Each
//! [`DeviceBuffer`](super::DeviceBuffer) holds an `Arc` of it, so it (and the device) outlives
//! every buffer.

#![allow(unsafe_code)]

use super::context::VulkanContext;
use super::slab::Slabs;
use super::staging::Staging;
use crate::pool::PoolManager;
use crate::sync::AtomicU64;
use gpu_allocator::vulkan::Allocator;
use std::sync::{Arc, Mutex};

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
    pub(super) dedicated_threshold: u64,
    pub(super) staging_size: u64,
    pub(super) force_staging: bool,
    pub(super) prechecks: bool,
    pub(super) ctx: Arc<VulkanContext>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Every buffer holds an `Arc` of this, so no slot is in use; the blocks go before the
        // allocator they came from.
        let slabs = std::mem::take(self.slabs.get_mut().unwrap_or_else(|p| p.into_inner()));
        let gpu = self.gpu.get_mut().unwrap_or_else(|p| p.into_inner());
        for block in slabs.blocks {
            // SAFETY: (V3) made on this device; no buffer uses a slot of it any more.
            unsafe { self.ctx.device.destroy_buffer(block.buffer, None) };
            if let Err(e) = gpu.free(block.allocation) {
                log::error!("runcache: gpu-allocator could not free a block: {e}");
            }
        }
    }
}
