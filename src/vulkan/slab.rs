//! Small buffers: size classes of 256 B to [`SLAB_MAX`], each a list of 4 MiB block buffers
//! cut into equal slots, so that making a small buffer is a pop from a free list with no
//! driver call.

#![allow(unsafe_code)]

use ash::vk;
use gpu_allocator::vulkan::Allocation;
use std::time::Instant;

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
    /// The size class it is cut for.
    pub(super) class: usize,
    /// Slots handed out and not yet freed.
    pub(super) live: u32,
    /// When its last live slot was freed; `None` while a slot is live.
    pub(super) empty_since: Option<Instant>,
}

/// The small-buffer blocks and, per size class, the free slots as `(block, slot)`.
#[derive(Default)]
pub(super) struct Slabs {
    /// Blocks by index; `None` where a released block was (its index is in `holes`).
    pub(super) blocks: Vec<Option<SlabBlock>>,
    pub(super) free: [Vec<(u32, u32)>; SLAB_CLASSES],
    /// Indexes of `blocks` that hold no block, for the next new one.
    pub(super) holes: Vec<u32>,
}

impl Slabs {
    /// The block at `index` (every index a slot names holds a block while the slot lives).
    pub(super) fn block(&mut self, index: u32) -> &mut SlabBlock {
        self.blocks[index as usize]
            .as_mut()
            .expect("a live slot's block is never released")
    }

    /// Counts a slot of block `index` handed out.
    pub(super) fn took(&mut self, index: u32) {
        let b = self.block(index);
        b.live += 1;
        b.empty_since = None;
    }

    /// Adds a block of `class` whose slots are all free but the first, which the caller
    /// takes; returns its index.
    pub(super) fn add(&mut self, block: SlabBlock, slot_size: u64) -> u32 {
        let class = block.class;
        let index = match self.holes.pop() {
            Some(i) => {
                self.blocks[i as usize] = Some(block);
                i
            }
            None => {
                self.blocks.push(Some(block));
                (self.blocks.len() - 1) as u32
            }
        };
        let slots = (SLAB_BLOCK / slot_size) as u32;
        // Hand slots out from the front of the block: pushed in reverse, popped first.
        self.free[class].extend((1..slots).rev().map(|i| (index, i)));
        index
    }

    /// Counts a slot of block `index` freed; `true` if that emptied the block.
    pub(super) fn freed(&mut self, index: u32, now: Instant) -> bool {
        let b = self.block(index);
        b.live -= 1;
        if b.live == 0 {
            b.empty_since = Some(now);
        }
        b.live == 0
    }

    /// Takes out every block empty since `before` or earlier (every empty block with
    /// `None`), with its free slots: the caller destroys its buffer and frees its memory.
    pub(super) fn take_empty(&mut self, before: Option<Instant>) -> Vec<SlabBlock> {
        let mut out = Vec::new();
        for i in 0..self.blocks.len() {
            let idle = self.blocks[i].as_ref().is_some_and(|b| {
                b.empty_since
                    .is_some_and(|t| before.is_none_or(|before| t <= before))
            });
            if !idle {
                continue;
            }
            let block = self.blocks[i].take().expect("checked above");
            let index = i as u32;
            self.free[block.class].retain(|&(b, _)| b != index);
            self.holes.push(index);
            out.push(block);
        }
        out
    }

    /// When the block empty the longest became empty, if any block is.
    pub(super) fn oldest_empty(&self) -> Option<Instant> {
        self.blocks
            .iter()
            .flatten()
            .filter_map(|b| b.empty_since)
            .min()
    }

    /// Blocks held, and how many of them are empty.
    pub(super) fn counts(&self) -> (usize, usize) {
        let held = self.blocks.iter().flatten();
        let empty = held.clone().filter(|b| b.live == 0).count();
        (held.count(), empty)
    }

    /// Bytes of the slots handed out.
    pub(super) fn live_slot_bytes(&self) -> u64 {
        self.blocks
            .iter()
            .flatten()
            .map(|b| u64::from(b.live) * (SLAB_MIN << b.class))
            .sum()
    }
}

/// Where a small buffer lives: its class, block and slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct SlotId {
    pub(super) class: usize,
    pub(super) block: u32,
    pub(super) slot: u32,
}
