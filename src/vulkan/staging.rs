//! Staging slots: a host-visible, coherent buffer with its own command pool, command buffer
//! and fence, recycled through a [`PoolManager`](crate::pool::PoolManager), through which
//! uploads and read-backs reach device-local memory that the host cannot map.

#![allow(unsafe_code)]

use super::context::{VulkanContext, FENCE_TIMEOUT};
use super::error::VulkanError;
use ash::vk;
use std::sync::Arc;

/// A host-visible staging buffer with the command buffer and fence of one transfer at a time.
pub(super) struct Staging {
    pub(super) ctx: Arc<VulkanContext>,
    pub(super) buffer: vk::Buffer,
    pub(super) memory: vk::DeviceMemory,
    pub(super) mapped: *mut u8,
    pub(super) size: u64,
    pub(super) pool: vk::CommandPool,
    pub(super) commands: vk::CommandBuffer,
    pub(super) fence: vk::Fence,
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
            commands: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
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
            .command_buffer_count(1);
        // SAFETY: (V5) a valid pool.
        s.commands = unsafe { d.allocate_command_buffers(&info) }
            .map_err(|r| VulkanError::from_vk("vkAllocateCommandBuffers", r, 0))?[0];
        // SAFETY: (V5) a valid device.
        s.fence = unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) }
            .map_err(|r| VulkanError::from_vk("vkCreateFence", r, 0))?;
        Ok(s)
    }

    /// Copies `region` from `buffers.0` to `buffers.1` on the device, followed by a barrier
    /// that makes the written bytes visible to `dst_stage`/`dst_access`; submits and waits.
    /// Both buffers must stay alive until it returns (they do: it waits).
    pub(super) fn copy(
        &self,
        buffers: (vk::Buffer, vk::Buffer),
        region: vk::BufferCopy,
        dst_stage: vk::PipelineStageFlags,
        dst_access: vk::AccessFlags,
    ) -> Result<(), VulkanError> {
        let d = &self.ctx.device;
        // The command buffer, pool and fence belong to this slot, which one thread holds at a
        // time, and the slot's previous submission was waited for and its fence reset.
        // SAFETY: (V2) so the command buffer may be reset and re-recorded; both buffers are alive
        // (the caller holds them) until the fence wait below returns.
        unsafe {
            d.reset_command_buffer(self.commands, vk::CommandBufferResetFlags::empty())
                .map_err(|r| VulkanError::from_vk("vkResetCommandBuffer", r, 0))?;
            let begin = vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            d.begin_command_buffer(self.commands, &begin)
                .map_err(|r| VulkanError::from_vk("vkBeginCommandBuffer", r, 0))?;
            d.cmd_copy_buffer(self.commands, buffers.0, buffers.1, &[region]);
            let barrier = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                .dst_access_mask(dst_access)];
            d.cmd_pipeline_barrier(
                self.commands,
                vk::PipelineStageFlags::TRANSFER,
                dst_stage,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            );
            d.end_command_buffer(self.commands)
                .map_err(|r| VulkanError::from_vk("vkEndCommandBuffer", r, 0))?;
            let buffers = [self.commands];
            let submit = [vk::SubmitInfo::default().command_buffers(&buffers)];
            {
                let _queue = self.ctx.queue_lock();
                d.queue_submit(self.ctx.queue, &submit, self.fence)
                    .map_err(|r| VulkanError::from_vk("vkQueueSubmit", r, 0))?;
            }
            let waited = d.wait_for_fences(&[self.fence], true, FENCE_TIMEOUT.as_nanos() as u64);
            match waited {
                Ok(()) => {}
                Err(vk::Result::TIMEOUT) => return Err(VulkanError::Timeout),
                Err(r) => return Err(VulkanError::from_vk("vkWaitForFences", r, 0)),
            }
            d.reset_fences(&[self.fence])
                .map_err(|r| VulkanError::from_vk("vkResetFences", r, 0))?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let d = &self.ctx.device;
        // SAFETY: (V2, V3) the slot's handles were made on this device and are idle (every
        // submission was waited for); null handles are ignored by the destroy calls.
        unsafe {
            if self.fence != vk::Fence::null() {
                d.destroy_fence(self.fence, None);
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
