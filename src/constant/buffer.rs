//! [`ConstantBuffer`]: a processed constant tensor's memory.

#![forbid(unsafe_code)]

use super::alloc::{AllocError, Allocation, BufferAllocator, DeviceKind, HostAllocator};
use crate::sync::{AtomicBool, AtomicU64, Ordering};
use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Byte counters shared by a constant cache and the buffers it handed out.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// Bytes of buffers outside the cache (evicted, removed, or never cached) still alive.
    pub(crate) pinned: AtomicU64,
    /// Bytes of buffers that were built but did not fit.
    pub(crate) rejected: AtomicU64,
}

/// Memory that a [`ConstantBuffer`] owns but that is not a host address: a Vulkan buffer
/// (`runcache::vulkan::DeviceBuffer`), or another API's handle. It is freed by its own `Drop`
/// when the last handle of the constant buffer drops.
///
/// [`ConstantBuffer::device_memory`] gets the concrete type back, so a backend can reach its
/// handle (the `vk::Buffer`, say) from a cached constant.
///
/// ```
/// use runcache::{ConstantBuffer, DeviceKind, DeviceMemory};
///
/// /// A tensor in another API's device memory, known by its handle.
/// #[derive(Debug)]
/// struct GpuTensor {
///     handle: u64,
///     bytes: usize,
/// }
///
/// impl DeviceMemory for GpuTensor {
///     fn size(&self) -> usize {
///         self.bytes
///     }
///     fn align(&self) -> usize {
///         256
///     }
///     fn device(&self) -> DeviceKind {
///         DeviceKind::Gpu
///     }
/// }
///
/// let buffer = ConstantBuffer::from_device_memory(GpuTensor { handle: 42, bytes: 1024 });
/// assert_eq!((buffer.size(), buffer.device()), (1024, DeviceKind::Gpu));
/// assert_eq!(buffer.device_memory::<GpuTensor>().unwrap().handle, 42);
/// ```
pub trait DeviceMemory: Any + Send + Sync + fmt::Debug {
    /// The size in bytes the constant occupies (what the cache charges for it).
    fn size(&self) -> usize;
    /// The alignment in bytes of the memory.
    fn align(&self) -> usize;
    /// The device the memory belongs to.
    fn device(&self) -> DeviceKind;
}

enum Memory {
    /// Memory at an address, from a [`BufferAllocator`].
    Pointer(Allocation),
    /// Memory behind a handle.
    Device(Box<dyn DeviceMemory>),
}

/// The memory of one constant tensor: size, alignment, device, and the allocation, freed
/// through its allocator (or its own `Drop`) when the last handle of the buffer drops.
///
/// ```
/// use runcache::ConstantBuffer;
///
/// let mut buffer = ConstantBuffer::host(16)?;
/// buffer.as_mut_slice().unwrap().copy_from_slice(&[7; 16]);
/// assert_eq!(buffer.as_slice().unwrap(), [7; 16]);
/// assert_eq!((buffer.size(), buffer.align()), (16, 64));
/// # Ok::<(), runcache::AllocError>(())
/// ```
pub struct ConstantBuffer {
    memory: Memory,
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
    ///
    /// ```
    /// use runcache::{ConstantBuffer, DeviceKind, HostAllocator};
    /// use std::sync::Arc;
    ///
    /// let buffer = ConstantBuffer::new(Arc::new(HostAllocator), 256, 128)?;
    /// assert_eq!((buffer.size(), buffer.align(), buffer.device()), (256, 128, DeviceKind::Cpu));
    /// # Ok::<(), runcache::AllocError>(())
    /// ```
    pub fn new(
        allocator: Arc<dyn BufferAllocator>,
        size: usize,
        align: usize,
    ) -> Result<Self, AllocError> {
        Ok(Self::with_memory(Memory::Pointer(Allocation::new(
            allocator, size, align,
        )?)))
    }

    /// A buffer that owns `memory`, memory behind a handle (a Vulkan buffer, say).
    ///
    /// ```
    /// use runcache::{ConstantBuffer, DeviceKind, DeviceMemory};
    ///
    /// #[derive(Debug)]
    /// struct Texture(u32);
    /// impl DeviceMemory for Texture {
    ///     fn size(&self) -> usize { 4096 }
    ///     fn align(&self) -> usize { 4096 }
    ///     fn device(&self) -> DeviceKind { DeviceKind::Gpu }
    /// }
    ///
    /// let buffer = ConstantBuffer::from_device_memory(Texture(3));
    /// assert!(buffer.as_slice().is_none(), "no host address");
    /// assert!(buffer.as_ptr().is_null());
    /// ```
    pub fn from_device_memory(memory: impl DeviceMemory) -> Self {
        Self::with_memory(Memory::Device(Box::new(memory)))
    }

    fn with_memory(memory: Memory) -> Self {
        Self {
            memory,
            ledger: OnceLock::new(),
            outside: AtomicBool::new(false),
            last_used: AtomicU64::new(0),
        }
    }

    /// Either kind of memory, for what both answer.
    fn memory(&self) -> &dyn DeviceMemory {
        match &self.memory {
            Memory::Pointer(a) => a,
            Memory::Device(m) => m.as_ref(),
        }
    }

    /// The memory behind a handle, if the buffer was made by
    /// [`from_device_memory`](Self::from_device_memory) with a `T`.
    ///
    /// ```
    /// use runcache::{ConstantBuffer, DeviceKind, DeviceMemory};
    ///
    /// #[derive(Debug)]
    /// struct Handle(u64);
    /// impl DeviceMemory for Handle {
    ///     fn size(&self) -> usize { 8 }
    ///     fn align(&self) -> usize { 8 }
    ///     fn device(&self) -> DeviceKind { DeviceKind::Gpu }
    /// }
    ///
    /// let buffer = ConstantBuffer::from_device_memory(Handle(9));
    /// assert_eq!(buffer.device_memory::<Handle>().map(|h| h.0), Some(9));
    /// assert!(ConstantBuffer::host(8)?.device_memory::<Handle>().is_none());
    /// # Ok::<(), runcache::AllocError>(())
    /// ```
    pub fn device_memory<T: DeviceMemory>(&self) -> Option<&T> {
        match &self.memory {
            Memory::Device(m) => (m.as_ref() as &dyn Any).downcast_ref::<T>(),
            Memory::Pointer(_) => None,
        }
    }

    /// `size` bytes of host memory aligned to [`HostAllocator::ALIGN`] (64 bytes).
    ///
    /// # Errors
    /// [`AllocError`] when the memory cannot be had.
    ///
    /// ```
    /// let buffer = runcache::ConstantBuffer::host(100)?;
    /// assert_eq!(buffer.as_ptr() as usize % runcache::HostAllocator::ALIGN, 0);
    /// # Ok::<(), runcache::AllocError>(())
    /// ```
    pub fn host(size: usize) -> Result<Self, AllocError> {
        Self::new(Arc::new(HostAllocator), size, HostAllocator::ALIGN)
    }

    /// The size in bytes.
    ///
    /// ```
    /// assert_eq!(runcache::ConstantBuffer::host(100)?.size(), 100);
    /// # Ok::<(), runcache::AllocError>(())
    /// ```
    pub fn size(&self) -> usize {
        self.memory().size()
    }

    /// The alignment in bytes.
    ///
    /// ```
    /// assert_eq!(runcache::ConstantBuffer::host(100)?.align(), 64);
    /// # Ok::<(), runcache::AllocError>(())
    /// ```
    pub fn align(&self) -> usize {
        self.memory().align()
    }

    /// The device the memory belongs to.
    ///
    /// ```
    /// assert_eq!(runcache::ConstantBuffer::host(1)?.device(), runcache::DeviceKind::Cpu);
    /// # Ok::<(), runcache::AllocError>(())
    /// ```
    pub fn device(&self) -> DeviceKind {
        self.memory().device()
    }

    /// The allocation's address (a device address for device memory), or null for memory
    /// behind a handle (see [`device_memory`](Self::device_memory)).
    ///
    /// ```
    /// let buffer = runcache::ConstantBuffer::host(32)?;
    /// assert!(!buffer.as_ptr().is_null());
    /// # Ok::<(), runcache::AllocError>(())
    /// ```
    pub fn as_ptr(&self) -> *const u8 {
        match &self.memory {
            Memory::Pointer(a) => a.as_ptr(),
            Memory::Device(_) => std::ptr::null(),
        }
    }

    /// The bytes, if the host can read this memory through an address.
    ///
    /// ```
    /// let mut buffer = runcache::ConstantBuffer::host(4)?;
    /// buffer.as_mut_slice().unwrap().copy_from_slice(&[1, 2, 3, 4]);
    /// assert_eq!(buffer.as_slice(), Some(&[1u8, 2, 3, 4][..]));
    /// # Ok::<(), runcache::AllocError>(())
    /// ```
    pub fn as_slice(&self) -> Option<&[u8]> {
        match &self.memory {
            Memory::Pointer(a) => a.as_slice(),
            Memory::Device(_) => None,
        }
    }

    /// The bytes for writing, if the host can write this memory: the builder fills a buffer
    /// this way before handing it to the cache.
    ///
    /// ```
    /// let mut buffer = runcache::ConstantBuffer::host(8)?;
    /// let weights: &mut [u8] = buffer.as_mut_slice().expect("host memory");
    /// weights.fill(0xAB);
    /// assert!(buffer.as_slice().unwrap().iter().all(|&b| b == 0xAB));
    /// # Ok::<(), runcache::AllocError>(())
    /// ```
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        match &mut self.memory {
            Memory::Pointer(a) => a.as_mut_slice(),
            Memory::Device(_) => None,
        }
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
            // Relaxed: `&mut self`, so no other thread touches the flag any more.
            if self.outside.load(Ordering::Relaxed) {
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

impl DeviceMemory for Allocation {
    fn size(&self) -> usize {
        self.size
    }

    fn align(&self) -> usize {
        self.align
    }

    fn device(&self) -> DeviceKind {
        self.allocator.device()
    }
}
