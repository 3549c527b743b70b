//! Staging slots: a host-visible, coherent buffer in two halves, each with its own command
//! buffer and fence, recycled through a [`PoolManager`](crate::pool::PoolManager), through
//! which uploads and read-backs reach device-local memory that the host cannot map. An
//! upload alternates the halves, so the host copies chunk n + 1 into one while the device
//! copies chunk n out of the other.

#![allow(unsafe_code)]

use super::context::{VulkanContext, FENCE_TIMEOUT};
use super::error::VulkanError;
use super::fault::{Fault, Faults};
use ash::vk;
use std::sync::Arc;

/// A host-visible staging buffer in two halves, each with the command buffer and fence of
/// its one transfer in flight.
pub(super) struct Staging {
    pub(super) ctx: Arc<VulkanContext>,
    pub(super) buffer: vk::Buffer,
    pub(super) memory: vk::DeviceMemory,
    pub(super) mapped: *mut u8,
    /// The bytes of the whole buffer; each half is [`chunk`](Self::chunk) bytes.
    pub(super) size: u64,
    pub(super) pool: vk::CommandPool,
    pub(super) commands: [vk::CommandBuffer; 2],
    pub(super) fences: [vk::Fence; 2],
    /// Whether each half's last submission has not been waited for.
    pending: [bool; 2],
}

// SAFETY: (V2) the mapped pointer and the handles are used by one thread at a time (the slot is
// reserved from the pool manager), and Vulkan handles may move between threads.
unsafe impl Send for Staging {}

impl Staging {
    pub(super) fn new(ctx: &Arc<VulkanContext>, size: u64) -> Result<Self, VulkanError> {
        let d = &ctx.device;
        let mut s = Staging {
            ctx: Arc::clone(ctx),
            buffer: vk::Buffer::null(),
            memory: vk::DeviceMemory::null(),
            mapped: std::ptr::null_mut(),
            size,
            pool: vk::CommandPool::null(),
            commands: [vk::CommandBuffer::null(); 2],
            fences: [vk::Fence::null(); 2],
            pending: [false; 2],
        };
        // Every step stores its handle in `s` at once, so a failure drops `s` and destroys
        // what was made.
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: (V5) a valid device and create info.
        s.buffer = unsafe { d.create_buffer(&info, None) }
            .map_err(|r| VulkanError::from_vk("vkCreateBuffer", r, size))?;
        // SAFETY: (V5) the buffer was just made on this device.
        let req = unsafe { d.get_buffer_memory_requirements(s.buffer) };
        let wanted = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let index = (0..ctx.memory.memory_type_count)
            .find(|&i| {
                req.memory_type_bits & (1 << i) != 0 && ctx.memory_type_flags(i).contains(wanted)
            })
            .ok_or(VulkanError::NoMemoryType { requested: size })?;
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(index);
        // SAFETY: (V5) a valid allocate info for a type the buffer accepts.
        s.memory = unsafe { d.allocate_memory(&alloc, None) }
            .map_err(|r| VulkanError::from_vk("vkAllocateMemory", r, size))?;
        // SAFETY: (V5) the memory fits the buffer's requirements and is bound once.
        unsafe { d.bind_buffer_memory(s.buffer, s.memory, 0) }
            .map_err(|r| VulkanError::from_vk("vkBindBufferMemory", r, size))?;
        // SAFETY: (V4) host-visible memory, mapped once, whole.
        s.mapped =
            unsafe { d.map_memory(s.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }
                .map_err(|r| VulkanError::from_vk("vkMapMemory", r, size))?
                .cast();
        let info = vk::CommandPoolCreateInfo::default()
            .flags(
                vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER
                    | vk::CommandPoolCreateFlags::TRANSIENT,
            )
            .queue_family_index(ctx.queue_family);
        // SAFETY: (V5) a valid device and family.
        s.pool = unsafe { d.create_command_pool(&info, None) }
            .map_err(|r| VulkanError::from_vk("vkCreateCommandPool", r, 0))?;
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(s.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(2);
        // SAFETY: (V5) a valid pool.
        let commands = unsafe { d.allocate_command_buffers(&info) }
            .map_err(|r| VulkanError::from_vk("vkAllocateCommandBuffers", r, 0))?;
        s.commands.copy_from_slice(&commands[..2]);
        for fence in &mut s.fences {
            // SAFETY: (V5) a valid device.
            *fence = unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) }
                .map_err(|r| VulkanError::from_vk("vkCreateFence", r, 0))?;
        }
        Ok(s)
    }

    /// The bytes of one half: the most one transfer moves.
    pub(super) fn chunk(&self) -> u64 {
        self.size / 2
    }

    /// Where half `half` starts in the buffer and in the mapping.
    pub(super) fn half(&self, half: usize) -> (u64, *mut u8) {
        let at = half as u64 * self.chunk();
        // `at` is inside the mapped buffer (`half` is 0 or 1).
        (at, self.mapped.wrapping_add(at as usize))
    }

    /// Waits for half `half`'s transfer in flight, if any, so its bytes and command buffer
    /// may be used again. A failed wait leaves the half pending: its next use waits again.
    pub(super) fn wait(&mut self, half: usize, faults: &Faults) -> Result<(), VulkanError> {
        if !self.pending[half] {
            return Ok(());
        }
        let d = &self.ctx.device;
        let fence = [self.fences[half]];
        let waited = match faults.strike(Fault::Wait) {
            // An injected result, with the same effect: the fence is left as it is.
            Some(r) => Err(r),
            // SAFETY: (V2) the fence is this slot's, and the slot is this thread's.
            None => unsafe { d.wait_for_fences(&fence, true, FENCE_TIMEOUT.as_nanos() as u64) },
        };
        match waited {
            Ok(()) => {}
            Err(vk::Result::TIMEOUT) => return Err(VulkanError::Timeout),
            Err(r) => return Err(VulkanError::from_vk("vkWaitForFences", r, 0)),
        }
        // SAFETY: (V2) as above; the fence signalled, so nothing uses it.
        unsafe { d.reset_fences(&fence) }
            .map_err(|r| VulkanError::from_vk("vkResetFences", r, 0))?;
        self.pending[half] = false;
        Ok(())
    }

    /// Waits until no transfer of this slot is in flight: a wait that times out is tried
    /// again (with a warning each time) rather than given up, because the caller's buffer
    /// that a transfer reads or writes may be freed once this returns. Only the device's own
    /// failure (a lost device: it runs nothing more) ends it early; the first error, after
    /// both halves.
    pub(super) fn settle(&mut self, faults: &Faults) -> Result<(), VulkanError> {
        let mut first = Ok(());
        for half in 0..2 {
            first = first.and(self.settle_half(half, faults));
        }
        first
    }

    /// [`settle`](Self::settle) for half `half` alone: its transfer in flight, if any, is
    /// over when this returns `Ok`, however long it took; only a lost device ends it early.
    pub(super) fn settle_half(&mut self, half: usize, faults: &Faults) -> Result<(), VulkanError> {
        loop {
            match self.wait(half, faults) {
                Err(VulkanError::Timeout) => log::warn!(
                    "a staged transfer is still running after {} s; waiting on, since its \
                     buffer may be freed once it ends",
                    FENCE_TIMEOUT.as_secs()
                ),
                done => return done,
            }
        }
    }

    /// Submits, on half `half`'s command buffer and fence, a copy of `region` from
    /// `buffers.0` to `buffers.1` followed by a barrier that makes the written bytes visible
    /// to `dst_stage`/`dst_access`, without waiting: [`wait`](Self::wait) for the half
    /// before its bytes or its command buffer are used again. Both buffers must stay alive
    /// until that wait (the caller's, who holds them).
    pub(super) fn submit(
        &mut self,
        half: usize,
        faults: &Faults,
        buffers: (vk::Buffer, vk::Buffer),
        region: vk::BufferCopy,
        dst_stage: vk::PipelineStageFlags,
        dst_access: vk::AccessFlags,
    ) -> Result<(), VulkanError> {
        self.wait(half, faults)?;
        let d = &self.ctx.device;
        let commands = self.commands[half];
        // The half's command buffer and fence belong to this slot, which one thread holds at
        // a time, and the half's previous submission was waited for and its fence reset.
        // SAFETY: (V2) so the command buffer may be reset and re-recorded; both buffers are
        // alive until the caller waits for the half (the function's contract).
        unsafe {
            d.reset_command_buffer(commands, vk::CommandBufferResetFlags::empty())
                .map_err(|r| VulkanError::from_vk("vkResetCommandBuffer", r, 0))?;
            let begin = vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            d.begin_command_buffer(commands, &begin)
                .map_err(|r| VulkanError::from_vk("vkBeginCommandBuffer", r, 0))?;
            d.cmd_copy_buffer(commands, buffers.0, buffers.1, &[region]);
            let barrier = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                .dst_access_mask(dst_access)];
            d.cmd_pipeline_barrier(
                commands,
                vk::PipelineStageFlags::TRANSFER,
                dst_stage,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            );
            d.end_command_buffer(commands)
                .map_err(|r| VulkanError::from_vk("vkEndCommandBuffer", r, 0))?;
            let buffers = [commands];
            let submit = [vk::SubmitInfo::default().command_buffers(&buffers)];
            {
                let _queue = self.ctx.queue_lock();
                // An injected failure is one the driver may return here, with the same effect:
                // nothing submitted, the fence untouched.
                if let Some(r) = faults.strike(Fault::Transfer) {
                    return Err(VulkanError::from_vk("vkQueueSubmit", r, 0));
                }
                d.queue_submit(self.ctx.queue, &submit, self.fences[half])
                    .map_err(|r| VulkanError::from_vk("vkQueueSubmit", r, 0))?;
            }
        }
        self.pending[half] = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // A half still pending after a failed wait is waited for (its transfer may still use
        // the staging buffer freed below).
        let _ = self.settle(&Faults::default());
        let d = &self.ctx.device;
        // SAFETY: (V2, V3) the slot's handles were made on this device and are idle (every
        // submission was waited for); null handles are ignored by the destroy calls.
        unsafe {
            for fence in self.fences {
                if fence != vk::Fence::null() {
                    d.destroy_fence(fence, None);
                }
            }
            if self.pool != vk::CommandPool::null() {
                d.destroy_command_pool(self.pool, None);
            }
            if self.buffer != vk::Buffer::null() {
                d.destroy_buffer(self.buffer, None);
            }
            if self.memory != vk::DeviceMemory::null() {
                d.free_memory(self.memory, None);
            }
        }
    }
}
