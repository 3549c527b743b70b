//! Where the reordered weights live (host memory, or Vulkan device buffers with `--gpu`),
//! the weight budget every cache gets, and the handles a lookup hands back.

use crate::failure::Failure;
use runcache::constant::{self, ConstantCache};
use runcache::{ConstantBuffer, DeviceKind, Handle};
use std::fmt::Write as _;
use std::ops::Deref;
use std::sync::Arc;

/// The weight budget without `--budget-mib` or the environment, on the host.
const DEFAULT_BUDGET_MIB: u64 = 64;

/// A kernel or a weight buffer as whichever cache handed it out: an `Arc` from the peers,
/// runcache's own counted handle (runcache stores the value itself, not an `Arc` of it).
pub enum Held<T> {
    Arc(Arc<T>),
    Handle(Handle<T>),
}

impl<T> Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            Held::Arc(a) => a,
            Held::Handle(h) => h,
        }
    }
}

/// A layer's reordered weights for one use: the cached buffer, and its floats copied back
/// when the buffer is in device memory (the kernels run on the host).
pub struct HeldWeights {
    pub buffer: Held<ConstantBuffer>,
    pub copy: Option<Vec<f32>>,
}

impl Deref for HeldWeights {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.copy {
            Some(copy) => copy,
            // A host buffer made by `Store::buffer`, checked there to be aligned for f32.
            None => bytemuck::cast_slice(self.buffer.as_slice().unwrap_or(&[])),
        }
    }
}

/// An error and its sources, each after a colon: what a user needs to see of a failure.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(source) = next {
        let _ = write!(text, ": {source}");
        next = source.source();
    }
    text
}

/// Where the reordered weights live. One is made per process and never moved, so its
/// variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Store {
    Host,
    /// Device-local buffers of this allocator.
    #[cfg(feature = "vulkan")]
    Device(runcache::vulkan::VulkanAllocator),
}

impl Store {
    /// Opens the device for `--gpu`.
    pub fn open(gpu: bool) -> Result<Store, String> {
        if !gpu {
            return Ok(Store::Host);
        }
        #[cfg(feature = "vulkan")]
        {
            use runcache::vulkan::{VulkanAllocator, VulkanContext};
            let ctx = VulkanContext::builder()
                .build()
                .map_err(|e| format!("--gpu: {}", chain(&e)))?;
            let allocator =
                VulkanAllocator::new(ctx).map_err(|e| format!("--gpu: {}", chain(&e)))?;
            Ok(Store::Device(allocator))
        }
        #[cfg(not(feature = "vulkan"))]
        Err(
            "--gpu needs the `vulkan` feature: cargo run --release -p runcache-runtime \
             --features vulkan -- --gpu"
                .into(),
        )
    }

    pub fn describe(&self) -> String {
        match self {
            Store::Host => "host memory".into(),
            #[cfg(feature = "vulkan")]
            Store::Device(a) => format!("Vulkan device buffers on {}", a.context().device_name()),
        }
    }

    /// The weight budget in bytes, the same for every cache: `--budget-mib`, else the
    /// environment's field for this store's device, else 64 MiB on the host and half of what
    /// the device's memory budget leaves this process on a GPU.
    pub fn budget(&self, budget_mib: Option<u64>) -> u64 {
        let kind = match self {
            Store::Host => DeviceKind::Cpu,
            #[cfg(feature = "vulkan")]
            Store::Device(_) => DeviceKind::Gpu,
        };
        if let Some(mb) = budget_mib.or_else(|| constant::env_capacity_mb(kind)) {
            return mb.saturating_mul(1 << 20);
        }
        match self {
            Store::Host => DEFAULT_BUDGET_MIB << 20,
            #[cfg(feature = "vulkan")]
            Store::Device(a) => runcache::vulkan::default_capacity(a.context()),
        }
    }

    /// runcache's weight cache here: a constant cache of this store's device that evicts to
    /// make room (many models share one budget, and their popularity moves).
    pub fn constant_cache(&self, budget: u64) -> ConstantCache {
        match self {
            Store::Host => ConstantCache::evicting(DeviceKind::Cpu, budget),
            #[cfg(feature = "vulkan")]
            Store::Device(_) => ConstantCache::evicting(DeviceKind::Gpu, budget),
        }
    }

    /// A buffer holding `weights`: host memory, or uploaded to the device.
    pub fn buffer(&self, weights: &[f32]) -> Result<ConstantBuffer, Failure> {
        match self {
            Store::Host => {
                let mut buffer = ConstantBuffer::host(weights.len() * 4)
                    .map_err(|e| Failure::Weights(chain(&e)))?;
                if !buffer.align().is_multiple_of(std::mem::align_of::<f32>()) {
                    return Err(Failure::Weights(format!(
                        "a host buffer aligned to {} bytes cannot hold f32",
                        buffer.align()
                    )));
                }
                let bytes = buffer
                    .as_mut_slice()
                    .ok_or_else(|| Failure::Weights("a host buffer without bytes".into()))?;
                bytes.copy_from_slice(bytemuck::cast_slice(weights));
                Ok(buffer)
            }
            #[cfg(feature = "vulkan")]
            Store::Device(a) => a
                .upload_constant(bytemuck::cast_slice(weights))
                .map_err(|e| Failure::Weights(chain(&e))),
        }
    }

    /// `buffer`'s floats for the host kernels: none needed for a host buffer, a copy read
    /// back for a device one.
    pub fn copy_back(&self, buffer: &ConstantBuffer) -> Result<Option<Vec<f32>>, Failure> {
        if buffer.as_slice().is_some() {
            return Ok(None);
        }
        match self {
            Store::Host => Err(Failure::Weights("a device buffer in the host store".into())),
            #[cfg(feature = "vulkan")]
            Store::Device(a) => {
                let device = buffer
                    .device_memory::<runcache::vulkan::DeviceBuffer>()
                    .ok_or_else(|| Failure::Weights("not a Vulkan buffer".into()))?;
                let bytes = a
                    .read(device, 0, buffer.size() as u64)
                    .map_err(|e| Failure::Weights(chain(&e)))?;
                Ok(Some(
                    bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ))
            }
        }
    }
}
