//! Filling and reading device buffers: by mapping when the memory is host-visible and
//! coherent, else through a staging slot, a copy and a fence.

#![allow(unsafe_code)]

use super::allocator::VulkanAllocator;
use super::buffer::DeviceBuffer;
use super::error::VulkanError;
use super::staging::Staging;
use crate::constant::ConstantBuffer;
use ash::vk;
use std::sync::Arc;

impl VulkanAllocator {
    /// A device-local buffer holding `bytes`.
    ///
    /// # Errors
    /// As [`allocate`](Self::allocate) and [`write`](Self::write).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let buffer = gpu.upload(&[1u8, 2, 3, 4])?;
    /// assert_eq!(gpu.read(&buffer, 0, 4)?, [1, 2, 3, 4]);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn upload(&self, bytes: &[u8]) -> Result<DeviceBuffer, VulkanError> {
        let mut buffer = self.allocate(bytes.len() as u64)?;
        self.write(&mut buffer, 0, bytes)?;
        Ok(buffer)
    }

    /// [`upload`](Self::upload), wrapped as a [`ConstantBuffer`] for a GPU constant cache.
    ///
    /// # Errors
    /// As [`upload`](Self::upload).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use runcache::DeviceKind;
    ///
    /// let constant = gpu.upload_constant(&[0u8; 256])?;
    /// assert_eq!((constant.size(), constant.device()), (256, DeviceKind::Gpu));
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn upload_constant(&self, bytes: &[u8]) -> Result<ConstantBuffer, VulkanError> {
        Ok(ConstantBuffer::from_device_memory(self.upload(bytes)?))
    }

    /// Writes `bytes` at `offset` into a buffer nobody else uses yet (`&mut`): by mapping when
    /// the memory is host-visible and coherent, else through a staging slot, a copy and a
    /// fence. When it returns, the data is on the device, or, after an error, no transfer
    /// into the buffer is in flight any more: a fence wait past its minute is retried with a
    /// warning rather than returned, since the caller may free the buffer next (only a lost
    /// device ends the wait early).
    ///
    /// # Errors
    /// [`VulkanError::OutOfRange`], [`VulkanError::NotFromThisAllocator`], or a staging or
    /// transfer error.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let mut buffer = gpu.allocate(8)?;
    /// gpu.write(&mut buffer, 4, &[9, 9, 9, 9])?;
    /// assert_eq!(gpu.read(&buffer, 4, 4)?, [9, 9, 9, 9]);
    /// assert!(gpu.write(&mut buffer, 6, &[0; 4]).is_err(), "past the end");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn write(
        &self,
        buffer: &mut DeviceBuffer,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), VulkanError> {
        self.check(buffer, offset, bytes.len() as u64)?;
        if let Some(dst) = self.mapped(buffer) {
            // SAFETY: (V4) `dst` maps the buffer's whole range (host-visible, coherent memory);
            // `check` kept the write inside it; `&mut` means no one else reads it now.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.add(offset as usize), bytes.len())
            };
            return Ok(());
        }
        let mut slot = self.staging()?;
        let staging = slot.as_mut().expect("filled by `staging`");
        let dst = buffer.buffer;
        let base = buffer.offset + offset;
        // Chunk n goes through half n % 2: its host copy waits only for the transfer of chunk
        // n - 2, so it overlaps the device's copy of chunk n - 1.
        let mut sent = || {
            for (i, chunk) in bytes.chunks(staging.chunk() as usize).enumerate() {
                let half = i % 2;
                staging.wait(half, &self.shared.faults)?;
                let (src_offset, host) = staging.half(half);
                // SAFETY: (V2, V4) the half is mapped, `chunk()` bytes long (at least
                // `chunk.len()`), and idle (its last transfer was waited for just above).
                unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), host, chunk.len()) };
                let region = vk::BufferCopy {
                    src_offset,
                    dst_offset: base + i as u64 * staging.chunk(),
                    size: chunk.len() as u64,
                };
                // Make the copy visible to whatever the application runs next.
                staging.submit(
                    half,
                    &self.shared.faults,
                    (staging.buffer, dst),
                    region,
                    vk::PipelineStageFlags::ALL_COMMANDS,
                    vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE,
                )?;
            }
            Ok(())
        };
        let sent = sent();
        // Every transfer into the buffer is over before it returns, even after an error or a
        // wait that timed out: the caller may free the buffer then.
        let done = staging.settle(&self.shared.faults);
        drop(slot);
        sent.and(done)
    }

    /// Copies `len` bytes at `offset` out of a buffer (for checks and debugging; a runtime
    /// reads its constants on the device).
    ///
    /// # Errors
    /// As [`write`](Self::write).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let buffer = gpu.upload(b"weights")?;
    /// assert_eq!(gpu.read(&buffer, 0, 7)?, b"weights");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn read(
        &self,
        buffer: &DeviceBuffer,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, VulkanError> {
        self.check(buffer, offset, len)?;
        let mut out = vec![0u8; len as usize];
        if let Some(src) = self.mapped(buffer) {
            // SAFETY: (V4) as in `write`; reading only, and the caller does not let the device
            // write this buffer meanwhile (constants are read-only on the device).
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(offset as usize), out.as_mut_ptr(), out.len())
            };
            return Ok(out);
        }
        let mut slot = self.staging()?;
        let staging = slot.as_mut().expect("filled by `staging`");
        let (total, step) = (out.len(), staging.chunk() as usize);
        let chunks = total.div_ceil(step);
        // The bytes of `out` that chunk `n` carries.
        let span = |n: usize| n * step..total.min((n + 1) * step);
        // Chunk n comes through half n % 2, and is sent before chunk n - 1 is copied out: the
        // device fills one half while the host empties the other. Half n % 2 last held chunk
        // n - 2, copied out a round earlier, so `submit`'s own wait for it returns at once.
        let mut received = || {
            for n in 0..=chunks {
                if n < chunks {
                    let region = vk::BufferCopy {
                        src_offset: buffer.offset + offset + span(n).start as u64,
                        dst_offset: staging.half(n % 2).0,
                        size: span(n).len() as u64,
                    };
                    // Make the copy visible to the host read after the fence.
                    staging.submit(
                        n % 2,
                        &self.shared.faults,
                        (buffer.buffer, staging.buffer),
                        region,
                        vk::PipelineStageFlags::HOST,
                        vk::AccessFlags::HOST_READ,
                    )?;
                }
                let Some(done) = n.checked_sub(1) else {
                    continue;
                };
                // The bytes are needed, so a wait past its minute waits on.
                staging.settle_half(done % 2, &self.shared.faults)?;
                let chunk = &mut out[span(done)];
                // SAFETY: (V2, V4) the transfer finished (fence) and the half holds
                // `chunk.len()` bytes of it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        staging.half(done % 2).1,
                        chunk.as_mut_ptr(),
                        chunk.len(),
                    )
                };
            }
            Ok(())
        };
        let received = received();
        // After an error, nothing may still read the buffer when this returns: the caller
        // could free it.
        let done = staging.settle(&self.shared.faults);
        drop(slot);
        received.and(done)?;
        Ok(out)
    }

    pub(super) fn check(
        &self,
        buffer: &DeviceBuffer,
        offset: u64,
        len: u64,
    ) -> Result<(), VulkanError> {
        if !Arc::ptr_eq(&buffer.shared, &self.shared) {
            return Err(VulkanError::NotFromThisAllocator);
        }
        if offset.checked_add(len).is_none_or(|end| end > buffer.size) {
            return Err(VulkanError::OutOfRange {
                offset,
                len,
                size: buffer.size,
            });
        }
        Ok(())
    }

    /// The host address of the buffer's first byte, if its memory is mapped and coherent and
    /// mapping is allowed.
    pub(super) fn mapped(&self, buffer: &DeviceBuffer) -> Option<*mut u8> {
        if self.shared.force_staging || buffer.mapped == 0 {
            return None;
        }
        Some(buffer.mapped as *mut u8)
    }

    /// A staging slot, made on first use.
    pub(super) fn staging(
        &self,
    ) -> Result<crate::pool::PoolGuard<'_, Option<Staging>>, VulkanError> {
        let mut slot = self
            .shared
            .staging
            .reserve()
            .map_err(|e| VulkanError::Staging { source: e })?;
        if slot.is_none() {
            *slot = Some(Staging::new(&self.shared.ctx, self.shared.staging_size)?);
        }
        Ok(slot)
    }
}
