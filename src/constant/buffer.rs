//! [`ConstantBuffer`]: a processed constant tensor's memory.

use crate::error::AllocError;
use crate::raw::alloc::Allocation;
use crate::{BufferAllocator, DeviceKind, HostAllocator};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Byte counters shared by a constant cache and the buffers it handed out.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// Bytes of buffers outside the cache (evicted, removed, or never cached) still alive.
    pub(crate) pinned: AtomicU64,
    /// Bytes of buffers that were built but did not fit.
    pub(crate) rejected: AtomicU64,
}

/// The memory of one constant tensor: size, alignment, device, and the allocation, freed
/// through its allocator when the last `Arc` to the buffer drops.
pub struct ConstantBuffer {
    memory: Allocation,
    /// Set once a constant cache takes charge of the buffer.
    ledger: OnceLock<Arc<Ledger>>,
    /// Whether the buffer is outside its cache (and so counted in the ledger's `pinned`).
    outside: AtomicBool,
    /// The cache's recency clock when the buffer was last used.
    last_used: AtomicU64,
}

impl ConstantBuffer {
    /// Allocates `size` bytes aligned to `align` (a power of two) through `allocator`.
    ///
    /// # Errors
    /// [`AllocError`] when the layout is invalid or the memory cannot be had.
    pub fn new(
        allocator: Arc<dyn BufferAllocator>,
        size: usize,
        align: usize,
    ) -> Result<Self, AllocError> {
        Ok(Self {
            memory: Allocation::new(allocator, size, align)?,
            ledger: OnceLock::new(),
            outside: AtomicBool::new(false),
            last_used: AtomicU64::new(0),
        })
    }

    /// `size` bytes of host memory aligned to [`HostAllocator::ALIGN`] (64 bytes).
    ///
    /// # Errors
    /// [`AllocError`] when the memory cannot be had.
    pub fn host(size: usize) -> Result<Self, AllocError> {
        Self::new(Arc::new(HostAllocator), size, HostAllocator::ALIGN)
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        self.memory.size()
    }

    /// The alignment in bytes.
    pub fn align(&self) -> usize {
        self.memory.align()
    }

    /// The device the memory belongs to.
    pub fn device(&self) -> DeviceKind {
        self.memory.device()
    }

    /// The allocation's address (a device address for device memory).
    pub fn as_ptr(&self) -> *const u8 {
        self.memory.as_ptr()
    }

    /// The bytes, if the host can read this memory.
    pub fn as_slice(&self) -> Option<&[u8]> {
        self.memory.as_slice()
    }

    /// The bytes for writing, if the host can write this memory: the builder fills a buffer
    /// this way before handing it to the cache.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        self.memory.as_mut_slice()
    }

    /// Puts the buffer in a cache's charge (once).
    pub(crate) fn attach(&self, ledger: &Arc<Ledger>, now: u64) {
        let _ = self.ledger.set(Arc::clone(ledger));
        self.touch(now);
    }

    /// Records a use at `now` (writes only when the stamp changes).
    pub(crate) fn touch(&self, now: u64) {
        // Relaxed: a recency hint; nothing is published through it.
        if self.last_used.load(Ordering::Relaxed) != now {
            self.last_used.store(now, Ordering::Relaxed);
        }
    }

    pub(crate) fn last_used(&self) -> u64 {
        // Relaxed: see `touch`.
        self.last_used.load(Ordering::Relaxed)
    }

    /// The buffer left its cache (or never entered it): count it as pinned while it lives.
    pub(crate) fn mark_outside(&self) {
        if let Some(ledger) = self.ledger.get() {
            // Relaxed: the flag and the counter are byte statistics; `swap` makes the
            // transition happen once.
            if !self.outside.swap(true, Ordering::Relaxed) {
                ledger
                    .pinned
                    .fetch_add(self.size() as u64, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for ConstantBuffer {
    fn drop(&mut self) {
        if let Some(ledger) = self.ledger.get() {
            if *self.outside.get_mut() {
                // Relaxed: a byte statistic.
                ledger
                    .pinned
                    .fetch_sub(self.size() as u64, Ordering::Relaxed);
            }
        }
    }
}

impl fmt::Debug for ConstantBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConstantBuffer")
            .field("size", &self.size())
            .field("align", &self.align())
            .field("device", &self.device())
            .finish_non_exhaustive()
    }
}
