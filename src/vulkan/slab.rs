//! Small buffers: size classes of 256 B to [`SLAB_MAX`], each a list of 4 MiB block buffers
//! cut into equal slots, so that making a small buffer is a pop from a free list with no
//! driver call.

#![allow(unsafe_code)]

use ash::vk;
use gpu_allocator::vulkan::Allocation;

/// The largest buffer that is a slot of a shared block rather than a `vk::Buffer` of its own.
pub const SLAB_MAX: u64 = 256 << 10;
/// The smallest slot: a multiple of every device's `minStorageBufferOffsetAlignment` and
/// `minUniformBufferOffsetAlignment` (the specification caps both at 256), so a slot's offset
/// can be bound directly.
pub(super) const SLAB_MIN: u64 = 256;
/// Size classes: 256 B, 512 B, ... `SLAB_MAX`.
pub(super) const SLAB_CLASSES: usize =
    (SLAB_MAX.trailing_zeros() - SLAB_MIN.trailing_zeros() + 1) as usize;
/// The bytes of one block buffer, cut into equal slots of its class.
pub(super) const SLAB_BLOCK: u64 = 4 << 20;

/// Usage of every buffer this layer makes (a slot's block included).
pub(super) const BUFFER_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw()
        | vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::UNIFORM_BUFFER.as_raw(),
);

/// The size class of a small request, and its slot size.
pub(super) fn slab_class(size: u64) -> (usize, u64) {
    let slot = size.next_power_of_two().max(SLAB_MIN);
    (
        (slot.trailing_zeros() - SLAB_MIN.trailing_zeros()) as usize,
        slot,
    )
}

/// Where an allocation's bytes are: its device memory, the offset in it, and the host address
/// of its first byte when the memory is mapped, host-visible and coherent (else 0).
pub(super) fn placement(a: &Allocation) -> (vk::DeviceMemory, u64, usize) {
    let coherent = a
        .memory_properties()
        .contains(vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT);
    let mapped = a
        .mapped_ptr()
        .filter(|_| coherent)
        .map_or(0, |p| p.as_ptr() as usize);
    // SAFETY: (V3) only reads the handle; the allocation is alive.
    (unsafe { a.memory() }, a.offset(), mapped)
}

/// One block of a size class: a 4 MiB buffer bound to its own sub-allocation.
pub(super) struct SlabBlock {
    pub(super) buffer: vk::Buffer,
    pub(super) allocation: Allocation,
}

/// The small-buffer blocks and, per size class, the free slots as `(block, slot)`.
#[derive(Default)]
pub(super) struct Slabs {
    pub(super) blocks: Vec<SlabBlock>,
    pub(super) free: [Vec<(u32, u32)>; SLAB_CLASSES],
}

/// Where a small buffer lives: its class, block and slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct SlotId {
    pub(super) class: usize,
    pub(super) block: u32,
    pub(super) slot: u32,
}
