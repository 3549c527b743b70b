//! Weights in GPU memory through Vulkan: four threads ask for the reordered weights of eight
//! layers; each layer is uploaded once into a device-local buffer and shared. The cache's
//! budget follows the device (half of what `VK_EXT_memory_budget` leaves this process)
//! unless `RUNCACHE_CONSTANT_CACHE_CAPACITY` sets `gpu:`.
//!
//! ```text
//! cargo run --release --features vulkan --example gpu_constants
//! ```
//!
//! Without a Vulkan driver it prints the typed error and exits 0 (1 with
//! `RUNCACHE_REQUIRE_VULKAN=1`). On a machine without a GPU, Mesa's lavapipe
//! (`apt-get install libvulkan1 mesa-vulkan-drivers`) is a real software driver.

use runcache::constant::ConstantKey;
use runcache::vulkan::{self, DeviceBuffer, VulkanAllocator, VulkanContext};
use runcache::{Source, VulkanError};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

fn main() {
    let required = std::env::var_os("RUNCACHE_REQUIRE_VULKAN").is_some_and(|v| v == "1");
    match serve() {
        Ok(()) => {}
        Err(e) => {
            eprintln!("no Vulkan device to use: {e}");
            std::process::exit(i32::from(required));
        }
    }
}

fn serve() -> Result<(), VulkanError> {
    let ctx = VulkanContext::builder().build()?;
    let gpu = VulkanAllocator::new(ctx.clone())?;
    let weights = vulkan::constant_cache(&gpu);
    println!(
        "{}: GPU constant cache of {} MiB",
        ctx.device_name(),
        weights.capacity_mb()
    );
    let uploads = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for layer in 0..8u64 {
                    // A layer's reordered weights: 1 MiB, the same bytes for every thread.
                    let bytes = vec![layer as u8; 1 << 20];
                    let added = weights
                        .get_or_add(ConstantKey::new(1, layer), bytes.len(), || {
                            uploads.fetch_add(1, Relaxed);
                            gpu.upload_constant(&bytes)
                        })
                        .expect("the device has room for 8 MiB");
                    let on_device = added
                        .buffer
                        .device_memory::<DeviceBuffer>()
                        .expect("a Vulkan buffer");
                    assert_eq!(on_device.size(), 1 << 20);
                    assert_ne!(added.source, Source::Uncached, "the budget holds all eight");
                }
            });
        }
    });
    let check = weights.get(ConstantKey::new(1, 5)).expect("cached");
    let buffer = check
        .device_memory::<DeviceBuffer>()
        .expect("a Vulkan buffer");
    assert_eq!(
        gpu.read(buffer, 0, 4)?,
        [5, 5, 5, 5],
        "the bytes reached the device"
    );
    let report = gpu.memory_report();
    println!(
        "8 layers asked for by 4 threads: {} uploads; {} MiB cached, {} MiB of device memory held",
        uploads.load(Relaxed),
        weights.size() >> 20,
        report.driver_bytes >> 20
    );
    assert_eq!(uploads.load(Relaxed), 8, "one upload per layer");
    Ok(())
}
