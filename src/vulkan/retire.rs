//! Retirement: buffers kept alive until a fence signals, released by the allocator's next
//! calls and waited for when it drops.

#![allow(unsafe_code)]

use super::allocator::VulkanAllocator;
use super::context::FENCE_TIMEOUT;
use crate::cache::Handle;
use crate::constant::ConstantBuffer;
use ash::vk;

impl VulkanAllocator {
    /// Keeps `buffer` alive until `fence` signals, then lets it go (freeing it if this was the
    /// last handle). For a buffer evicted or removed from a cache while a submission that reads
    /// it may still run. Retired buffers are checked at every [`allocate`](Self::allocate),
    /// at [`collect_retired`](Self::collect_retired), and waited for when the allocator drops.
    ///
    /// The fence stays the caller's: it must stay valid (not destroyed or reset) until then.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use runcache::vulkan::ash::vk;
    ///
    /// let constant = runcache::Handle::new(gpu.upload_constant(&[0u8; 64])?);
    /// // SAFETY: a valid device and create info.
    /// let fence = unsafe { ctx.device().create_fence(&vk::FenceCreateInfo::default(), None) }
    ///     .expect("a fence");
    /// // ... submit work that reads `constant`, signalling `fence` ...
    /// gpu.retire_after(fence, constant); // freed once the fence has signalled
    /// assert_eq!(gpu.retired_pending(), 1);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn retire_after(&self, fence: vk::Fence, buffer: Handle<ConstantBuffer>) {
        self.retired.push((fence, buffer));
    }

    /// Lets go of every retired buffer whose fence has signalled; returns how many.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let released = gpu.collect_retired();
    /// println!("{released} retired buffers released; {} pending", gpu.retired_pending());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn collect_retired(&self) -> usize {
        let mut released = 0;
        for _ in 0..self.retired.len() {
            let Some((fence, buffer)) = self.retired.pop() else {
                break;
            };
            // SAFETY: (V3) the fence is valid until the buffer is released (`retire_after`'s
            // contract).
            match unsafe { self.shared.ctx.device.get_fence_status(fence) } {
                Ok(true) | Err(_) => {
                    // Signalled, or the device is lost (then nothing runs any more).
                    drop(buffer);
                    released += 1;
                }
                Ok(false) => self.retired.push((fence, buffer)),
            }
        }
        released
    }

    /// Buffers retired and not yet released.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// assert_eq!(gpu.retired_pending(), 0);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn retired_pending(&self) -> usize {
        self.retired.len()
    }
}

impl Drop for VulkanAllocator {
    fn drop(&mut self) {
        // Wait for the fences of retired buffers, so none is freed while the device may use
        // it; a lost device or a timeout gives up waiting (nothing more can be done).
        while let Some((fence, buffer)) = self.retired.pop() {
            // SAFETY: (V3) valid until released (`retire_after`'s contract).
            let _ = unsafe {
                self.shared.ctx.device.wait_for_fences(
                    &[fence],
                    true,
                    FENCE_TIMEOUT.as_nanos() as u64,
                )
            };
            drop(buffer);
        }
    }
}
