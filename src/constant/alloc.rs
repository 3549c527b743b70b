//! Raw buffer allocations for the constant tensor caches: the allocator trait (a
//! malloc/free pair per device, as a trait object), the host allocator, [`Allocation`], which
//! frees itself through the allocator that made it, and [`AllocError`].
//!
//! # Invariants
//!
//! - **A1 (allocator contract).** A [`BufferAllocator`] hands out either an error or `size`
//!   bytes aligned to `align` that stay valid until `deallocate` gets back the same pointer,
//!   size and alignment; host-accessible memory may be read and written by the host. The
//!   host allocator meets it with the global allocator and a layout built from the same pair.
//! - **A2 (single owner).** An [`Allocation`] is the only owner of its memory: it keeps the
//!   pointer, size, alignment and the allocator that made it, hands out shared bytes only
//!   through `&self` and mutable bytes only through `&mut self`, and frees once, in `Drop`.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// Where a buffer's memory lives.
///
/// ```
/// use runcache::DeviceKind;
///
/// assert_eq!(DeviceKind::ALL, [DeviceKind::Cpu, DeviceKind::Gpu]);
/// assert_eq!(DeviceKind::Gpu.to_string(), "gpu");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// Host memory.
    Cpu,
    /// Device memory of a GPU.
    Gpu,
}

impl DeviceKind {
    /// Every device kind, in a fixed order.
    pub const ALL: [DeviceKind; 2] = [DeviceKind::Cpu, DeviceKind::Gpu];

    /// The lowercase name used in configuration strings (`cpu`, `gpu`).
    ///
    /// ```
    /// use runcache::DeviceKind;
    ///
    /// assert_eq!(DeviceKind::Cpu.name(), "cpu");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            DeviceKind::Cpu => 0,
            DeviceKind::Gpu => 1,
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Makes and frees the memory of constant buffers: an allocate/deallocate pair per device
/// (oneDNN's `malloc_func_t`/`free_func_t`), as a trait.
///
/// # Safety
/// Implementations must return from `allocate` either an error or a pointer to `size` bytes
/// aligned to `align` that stay valid until `deallocate` is called with the same pointer,
/// size and alignment; and if `host_accessible` returns `true`, those bytes must be readable
/// and writable by the host.
///
/// ```
/// use runcache::{AllocError, BufferAllocator, ConstantBuffer, DeviceKind, HostAllocator};
/// use std::ptr::NonNull;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
///
/// /// Host memory, counted.
/// #[derive(Debug, Default)]
/// struct Counting {
///     live: AtomicUsize,
/// }
///
/// // SAFETY: every call goes to `HostAllocator`, which keeps the contract.
/// unsafe impl BufferAllocator for Counting {
///     fn device(&self) -> DeviceKind {
///         DeviceKind::Cpu
///     }
///     fn host_accessible(&self) -> bool {
///         true
///     }
///     fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
///         let ptr = HostAllocator.allocate(size, align)?;
///         self.live.fetch_add(size, Ordering::Relaxed);
///         Ok(ptr)
///     }
///     unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize) {
///         self.live.fetch_sub(size, Ordering::Relaxed);
///         // SAFETY: `ptr` came from `HostAllocator::allocate(size, align)` above.
///         unsafe { HostAllocator.deallocate(ptr, size, align) }
///     }
/// }
///
/// let counting = Arc::new(Counting::default());
/// let buffer = ConstantBuffer::new(counting.clone(), 4096, 64)?;
/// assert_eq!(counting.live.load(Ordering::Relaxed), 4096);
/// drop(buffer);
/// assert_eq!(counting.live.load(Ordering::Relaxed), 0, "freed through its allocator");
/// # Ok::<(), AllocError>(())
/// ```
pub unsafe trait BufferAllocator: Send + Sync + fmt::Debug {
    /// The device whose memory this allocator hands out.
    fn device(&self) -> DeviceKind;

    /// Whether the host may read and write the memory through the returned pointer.
    fn host_accessible(&self) -> bool;

    /// Allocates `size` bytes aligned to `align` (a power of two).
    ///
    /// # Errors
    /// [`AllocError`] when the memory cannot be had; nothing is allocated then.
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError>;

    /// Frees memory from [`allocate`](Self::allocate).
    ///
    /// # Safety
    /// - `ptr` came from `self.allocate(size, align)` and has not been freed.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize);
}

/// Host memory from the global allocator, aligned to at least [`HostAllocator::ALIGN`].
///
/// ```
/// use runcache::{ConstantBuffer, HostAllocator};
/// use std::sync::Arc;
///
/// let buffer = ConstantBuffer::new(Arc::new(HostAllocator), 1000, 4096)?;
/// assert_eq!(buffer.as_ptr() as usize % 4096, 0);
/// assert_eq!(HostAllocator::ALIGN, 64);
/// # Ok::<(), runcache::AllocError>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct HostAllocator;

impl HostAllocator {
    /// The default alignment of host constant buffers: one cache line, enough for AVX-512.
    pub const ALIGN: usize = 64;
}

// SAFETY: (A1) memory comes from the global allocator with a valid layout, is freed with the same
// layout, and is ordinary host memory. Zero-sized buffers get a dangling aligned pointer that
// is never freed.
unsafe impl BufferAllocator for HostAllocator {
    fn device(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn host_accessible(&self) -> bool {
        true
    }

    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        let layout = Layout::from_size_align(size, align)
            .map_err(|_| AllocError::InvalidLayout { size, align })?;
        if size == 0 {
            // A dangling pointer at the alignment: valid for zero bytes, never freed.
            return NonNull::new(align as *mut u8).ok_or(AllocError::InvalidLayout { size, align });
        }
        // SAFETY: (A1) the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        NonNull::new(p).ok_or(AllocError::OutOfMemory {
            device: DeviceKind::Cpu,
            size,
            align,
        })
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        if size == 0 {
            return;
        }
        // SAFETY: (A1) the caller passes what `allocate` returned, with the same size and
        // alignment, which formed a valid layout there.
        unsafe {
            std::alloc::dealloc(ptr.as_ptr(), Layout::from_size_align_unchecked(size, align))
        };
    }
}

/// Memory owned through the allocator that made it; freed on drop.
pub(crate) struct Allocation {
    ptr: NonNull<u8>,
    pub(super) size: usize,
    pub(super) align: usize,
    pub(super) allocator: Arc<dyn BufferAllocator>,
}

// SAFETY: (A2) an allocation is plain memory owned by this value; the allocator is `Send + Sync`.
unsafe impl Send for Allocation {}
// SAFETY: (A2) shared access only reads through `as_slice` (host memory) or hands out the pointer.
unsafe impl Sync for Allocation {}

impl Allocation {
    pub(crate) fn new(
        allocator: Arc<dyn BufferAllocator>,
        size: usize,
        align: usize,
    ) -> Result<Self, AllocError> {
        if !align.is_power_of_two() {
            return Err(AllocError::InvalidLayout { size, align });
        }
        let ptr = allocator.allocate(size, align)?;
        if ptr.as_ptr() as usize % align != 0 {
            // SAFETY: (A1) just allocated with these arguments.
            unsafe { allocator.deallocate(ptr, size, align) };
            return Err(AllocError::Misaligned {
                device: allocator.device(),
                align,
            });
        }
        Ok(Self {
            ptr,
            size,
            align,
            allocator,
        })
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn as_slice(&self) -> Option<&[u8]> {
        if !self.allocator.host_accessible() {
            return None;
        }
        // SAFETY: (A1, A2) host-accessible memory of `size` bytes owned by `self`
        // (BufferAllocator's contract); shared borrows only read.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.size) })
    }

    pub(crate) fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        if !self.allocator.host_accessible() {
            return None;
        }
        // SAFETY: (A1, A2) as in `as_slice`; `&mut self` makes the borrow unique.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.size) })
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: (A2) `ptr` came from this allocator with this size and alignment, and is freed
        // only here.
        unsafe { self.allocator.deallocate(self.ptr, self.size, self.align) };
    }
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("size", &self.size)
            .field("align", &self.align)
            .field("allocator", &self.allocator)
            .finish()
    }
}

/// A constant buffer that could not be allocated.
///
/// ```
/// use runcache::{AllocError, ConstantBuffer, HostAllocator};
/// use std::sync::Arc;
///
/// let err = ConstantBuffer::new(Arc::new(HostAllocator), 64, 3).unwrap_err();
/// assert_eq!(err, AllocError::InvalidLayout { size: 64, align: 3 });
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocError {
    /// The size and alignment do not form a valid layout (the alignment is not a power of two,
    /// or the size overflows when rounded up to it).
    InvalidLayout {
        /// The size asked for, in bytes.
        size: usize,
        /// The alignment asked for, in bytes.
        align: usize,
    },
    /// The device has no memory left for the request.
    OutOfMemory {
        /// The device asked.
        device: DeviceKind,
        /// The size asked for, in bytes.
        size: usize,
        /// The alignment asked for, in bytes.
        align: usize,
    },
    /// The allocator returned memory that is not aligned as asked (a broken allocator).
    Misaligned {
        /// The device asked.
        device: DeviceKind,
        /// The alignment asked for, in bytes.
        align: usize,
    },
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::InvalidLayout { size, align } => write!(
                f,
                "invalid buffer layout: size {size} with alignment {align} (the alignment must \
                 be a power of two and the rounded size must fit in usize)"
            ),
            AllocError::OutOfMemory {
                device,
                size,
                align,
            } => write!(
                f,
                "out of {device} memory allocating {size} bytes aligned to {align}"
            ),
            AllocError::Misaligned { device, align } => write!(
                f,
                "the {device} allocator returned memory not aligned to {align} bytes"
            ),
        }
    }
}

impl std::error::Error for AllocError {}
