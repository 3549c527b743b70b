//! The Vulkan memory layer against hand-written ash code, in the same run.
//!
//! - `upload_64mib`: runcache's `upload` (mapping where the memory allows it, and forced
//!   through staging) against a minimal hand-written staging-and-copy upload: a host-visible
//!   staging buffer, a device-local buffer, one copy, one fence.
//! - `small_buffers_10k`: 10,000 buffers of 4–64 KiB made and freed: runcache's slots of shared
//!   block buffers (warm: blocks kept from earlier iterations; cold: a fresh allocator, so the
//!   blocks are made inside the timing) against one `vkCreateBuffer` and one dedicated
//!   `vkAllocateMemory` per buffer.
//!
//! `VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json cargo bench -p runcache-bench
//! --features vulkan --bench vulkan` (lavapipe); without a driver it prints why and measures nothing.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use runcache::vulkan::ash::vk;
use runcache::vulkan::{VulkanAllocator, VulkanContext};
use std::hint::black_box;
use std::sync::Arc;

const UPLOAD: usize = 64 << 20;
const SMALL: usize = 10_000;

fn small_size(i: usize) -> u64 {
    4096 * (1 + (i as u64 * 7) % 16)
}

fn memory_type(ctx: &VulkanContext, bits: u32, wanted: vk::MemoryPropertyFlags) -> u32 {
    // SAFETY: the physical device belongs to the instance.
    let props = unsafe {
        ctx.instance()
            .get_physical_device_memory_properties(ctx.physical_device())
    };
    (0..props.memory_type_count)
        .find(|&i| {
            bits & (1 << i) != 0
                && props.memory_types[i as usize]
                    .property_flags
                    .contains(wanted)
        })
        .expect("a suitable memory type")
}

/// A buffer with a dedicated allocation, the way a hand-written loader makes one.
fn dedicated(
    ctx: &VulkanContext,
    size: u64,
    usage: vk::BufferUsageFlags,
    wanted: vk::MemoryPropertyFlags,
) -> (vk::Buffer, vk::DeviceMemory) {
    let d = ctx.device();
    let info = vk::BufferCreateInfo::default().size(size).usage(usage);
    // SAFETY: plain object creation on a valid device; every handle is destroyed by `free`.
    unsafe {
        let buffer = d.create_buffer(&info, None).unwrap();
        let req = d.get_buffer_memory_requirements(buffer);
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(memory_type(ctx, req.memory_type_bits, wanted));
        let memory = d.allocate_memory(&alloc, None).unwrap();
        d.bind_buffer_memory(buffer, memory, 0).unwrap();
        (buffer, memory)
    }
}

fn free(ctx: &VulkanContext, (buffer, memory): (vk::Buffer, vk::DeviceMemory)) {
    // SAFETY: made by `dedicated`, idle, freed once.
    unsafe {
        ctx.device().destroy_buffer(buffer, None);
        ctx.device().free_memory(memory, None);
    }
}

/// The hand-written baseline: staging buffer, device buffer, one copy, one fence.
fn hand_upload(
    ctx: &VulkanContext,
    pool: vk::CommandPool,
    bytes: &[u8],
) -> (vk::Buffer, vk::DeviceMemory) {
    let d = ctx.device();
    let size = bytes.len() as u64;
    let staging = dedicated(
        ctx,
        size,
        vk::BufferUsageFlags::TRANSFER_SRC,
        vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT,
    );
    let device = dedicated(
        ctx,
        size,
        vk::BufferUsageFlags::TRANSFER_DST | vk::BufferUsageFlags::STORAGE_BUFFER,
        vk::MemoryPropertyFlags::DEVICE_LOCAL,
    );
    // SAFETY: the staging memory is host-visible and `size` bytes long; the command buffer is
    // recorded, submitted and waited for on this thread; the queue is locked while submitting.
    unsafe {
        let p = d
            .map_memory(staging.1, 0, size, vk::MemoryMapFlags::empty())
            .unwrap();
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast(), bytes.len());
        d.unmap_memory(staging.1);
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        let cb = d.allocate_command_buffers(&info).unwrap()[0];
        d.begin_command_buffer(
            cb,
            &vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
        )
        .unwrap();
        d.cmd_copy_buffer(
            cb,
            staging.0,
            device.0,
            &[vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size,
            }],
        );
        d.end_command_buffer(cb).unwrap();
        let fence = d
            .create_fence(&vk::FenceCreateInfo::default(), None)
            .unwrap();
        let cbs = [cb];
        {
            let _q = ctx.queue_lock();
            d.queue_submit(
                ctx.queue().0,
                &[vk::SubmitInfo::default().command_buffers(&cbs)],
                fence,
            )
            .unwrap();
        }
        d.wait_for_fences(&[fence], true, u64::MAX).unwrap();
        d.destroy_fence(fence, None);
        d.free_command_buffers(pool, &cbs);
    }
    free(ctx, staging);
    device
}

fn benches(c: &mut Criterion) {
    let ctx = match VulkanContext::builder().build() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("vulkan benches skipped: {e}");
            return;
        }
    };
    eprintln!("vulkan device: {}", ctx.device_name());
    let bytes: Vec<u8> = (0..UPLOAD).map(|i| i as u8).collect();
    let mapped = VulkanAllocator::new(ctx.clone()).unwrap();
    let staged = VulkanAllocator::builder(ctx.clone())
        .force_staging(true)
        .build()
        .unwrap();
    // SAFETY: a command pool on our own device and queue family, destroyed at the end.
    let pool = unsafe {
        ctx.device().create_command_pool(
            &vk::CommandPoolCreateInfo::default().queue_family_index(ctx.queue().1),
            None,
        )
    }
    .unwrap();

    let mut g = c.benchmark_group("upload_64mib");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(UPLOAD as u64));
    g.bench_function("runcache", |b| {
        b.iter(|| black_box(mapped.upload(&bytes).unwrap()))
    });
    g.bench_function("runcache_staged", |b| {
        b.iter(|| black_box(staged.upload(&bytes).unwrap()))
    });
    g.bench_function("hand_written_ash", |b| {
        b.iter(|| free(&ctx, black_box(hand_upload(&ctx, pool, &bytes))))
    });
    g.finish();

    let mut g = c.benchmark_group("small_buffers_10k");
    g.sample_size(10);
    g.throughput(Throughput::Elements(SMALL as u64));
    // Warm: the allocator's small-buffer blocks exist from earlier iterations, so making a
    // buffer is a pop from its class's free list.
    g.bench_function("runcache", |b| {
        b.iter_batched(
            || (),
            |()| {
                let v: Vec<_> = (0..SMALL)
                    .map(|i| mapped.allocate(small_size(i)).unwrap())
                    .collect();
                drop(black_box(v));
            },
            BatchSize::PerIteration,
        )
    });
    // Cold: a fresh allocator per iteration (made and dropped outside the timing), so every
    // block buffer and its device memory is created inside it.
    g.bench_function("runcache_cold", |b| {
        b.iter_batched(
            || VulkanAllocator::new(ctx.clone()).unwrap(),
            |gpu| {
                let v: Vec<_> = (0..SMALL)
                    .map(|i| gpu.allocate(small_size(i)).unwrap())
                    .collect();
                drop(black_box(v));
                gpu
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("dedicated_vk_allocate_memory", |b| {
        b.iter(|| {
            let v: Vec<_> = (0..SMALL)
                .map(|i| {
                    dedicated(
                        &ctx,
                        small_size(i),
                        vk::BufferUsageFlags::TRANSFER_DST | vk::BufferUsageFlags::STORAGE_BUFFER,
                        vk::MemoryPropertyFlags::DEVICE_LOCAL,
                    )
                })
                .collect();
            for b in black_box(v) {
                free(&ctx, b);
            }
        })
    });
    g.finish();

    drop((mapped, staged));
    // SAFETY: every command buffer from the pool was freed and waited for.
    unsafe { ctx.device().destroy_command_pool(pool, None) };
    let _keep: Arc<VulkanContext> = ctx;
}

criterion_group!(vulkan, benches);
criterion_main!(vulkan);
