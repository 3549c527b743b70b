//! The Vulkan engine behind `crate::vulkan`: every call into the driver lives here.
//!
//! - [`VulkanContext`] wraps an instance, a physical device, a device and one queue, either the
//!   application's own (borrowed, never destroyed) or made by [`VulkanContext::builder`].
//! - [`VulkanAllocator`] makes device-local buffers, sub-allocated by gpu-allocator from large
//!   blocks (a dedicated allocation above a threshold), and fills them either by mapping (when
//!   the memory is also host-visible and coherent: unified memory, ReBAR, lavapipe) or through
//!   a recycled staging slot, a transfer copy and a fence.
//! - Small buffers (up to [`SLAB_MAX`]) do not get a `vk::Buffer` of their own: they are
//!   ranges of a shared 4 MiB block buffer, one slot of a power-of-two size class, handed out
//!   from a free list. Making one is a pop from that list, with no driver call.
//! - [`DeviceBuffer`] owns one such buffer (or slot) and frees it when dropped.
//!
//! Locks: gpu-allocator's `Allocator` takes `&mut self`, and Vulkan requires queue submissions
//! and command pools to be externally synchronized, so this layer holds three `Mutex`es (the
//! slab free lists, the allocator, the queue; taken in that order when nested). All are taken
//! only when a buffer is made, filled, read or freed — the miss path — never on a cache hit,
//! which stays in the lock-free table.

use crate::constant::DeviceMemory;
use crate::error::VulkanError;
use crate::pool::{PoolManager, WhenExhausted};
use crate::{ConstantBuffer, DeviceKind};
use ash::vk;
use crossbeam_queue::SegQueue;
use gpu_allocator::vulkan::{
    Allocation, AllocationCreateDesc, AllocationScheme, Allocator, AllocatorCreateDesc,
};
use gpu_allocator::{AllocationError, AllocationSizes, AllocatorDebugSettings, MemoryLocation};
use std::ffi::{c_void, CStr};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// How long a transfer may take before [`VulkanError::Timeout`].
const FENCE_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest buffer that is a slot of a shared block rather than a `vk::Buffer` of its own.
pub const SLAB_MAX: u64 = 256 << 10;
/// The smallest slot: a multiple of every device's `minStorageBufferOffsetAlignment` and
/// `minUniformBufferOffsetAlignment` (the specification caps both at 256), so a slot's offset
/// can be bound directly.
const SLAB_MIN: u64 = 256;
/// Size classes: 256 B, 512 B, ... `SLAB_MAX`.
const SLAB_CLASSES: usize = (SLAB_MAX.trailing_zeros() - SLAB_MIN.trailing_zeros() + 1) as usize;
/// The bytes of one block buffer, cut into equal slots of its class.
const SLAB_BLOCK: u64 = 4 << 20;

/// Usage of every buffer this layer makes (a slot's block included).
const BUFFER_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw()
        | vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::UNIFORM_BUFFER.as_raw(),
);

/// The size class of a small request, and its slot size.
fn slab_class(size: u64) -> (usize, u64) {
    let slot = size.next_power_of_two().max(SLAB_MIN);
    (
        (slot.trailing_zeros() - SLAB_MIN.trailing_zeros()) as usize,
        slot,
    )
}

/// Where an allocation's bytes are: its device memory, the offset in it, and the host address
/// of its first byte when the memory is mapped, host-visible and coherent (else 0).
fn placement(a: &Allocation) -> (vk::DeviceMemory, u64, usize) {
    let coherent = a
        .memory_properties()
        .contains(vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT);
    let mapped = a
        .mapped_ptr()
        .filter(|_| coherent)
        .map_or(0, |p| p.as_ptr() as usize);
    // SAFETY: only reads the handle; the allocation is alive.
    (unsafe { a.memory() }, a.offset(), mapped)
}

/// One block of a size class: a 4 MiB buffer bound to its own sub-allocation.
struct SlabBlock {
    buffer: vk::Buffer,
    allocation: Allocation,
}

/// The small-buffer blocks and, per size class, the free slots as `(block, slot)`.
#[derive(Default)]
struct Slabs {
    blocks: Vec<SlabBlock>,
    free: [Vec<(u32, u32)>; SLAB_CLASSES],
}

/// Where a small buffer lives: its class, block and slot.
#[derive(Clone, Copy, Debug)]
struct SlotId {
    class: usize,
    block: u32,
    slot: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding either lock leaves nothing half-done that a later caller could
    // observe (each critical section is one driver call or one allocator call), so a poisoned
    // lock is taken over.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Validation-layer messages received by a context made with validation on.
#[derive(Debug, Default)]
struct ValidationSink {
    errors: AtomicU64,
    warnings: AtomicU64,
    messages: Mutex<Vec<String>>,
}

/// Receives validation messages. Runs on whatever thread made the failing call.
unsafe extern "system" fn on_validation_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: `user` is the `ValidationSink` the context registered, boxed and alive until the
    // messenger is destroyed; the layer passes valid callback data whose `p_message`, when not
    // null, is a NUL-terminated string.
    let (sink, text) = unsafe {
        let sink = &*(user as *const ValidationSink);
        let text = if data.is_null() || (*data).p_message.is_null() {
            String::from("(no message)")
        } else {
            CStr::from_ptr((*data).p_message)
                .to_string_lossy()
                .into_owned()
        };
        (sink, text)
    };
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        // Relaxed: a count read after the fact.
        sink.errors.fetch_add(1, Ordering::Relaxed);
        log::error!("vulkan validation: {text}");
    } else {
        sink.warnings.fetch_add(1, Ordering::Relaxed);
        log::warn!("vulkan validation: {text}");
    }
    lock(&sink.messages).push(text);
    vk::FALSE
}

struct Validation {
    loader: ash::ext::debug_utils::Instance,
    messenger: vk::DebugUtilsMessengerEXT,
    sink: Box<ValidationSink>,
}

/// One memory heap as the device reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeapBudget {
    /// The heap's size in bytes.
    pub size: u64,
    /// Whether the heap is device-local.
    pub device_local: bool,
    /// What this process may use, from `VK_EXT_memory_budget` (`None` without it).
    pub budget: Option<u64>,
    /// What this process uses now, from `VK_EXT_memory_budget` (`None` without it).
    pub usage: Option<u64>,
}

/// Makes a [`VulkanContext`] with its own instance and device.
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct VulkanContextBuilder {
    validation: bool,
}

impl VulkanContextBuilder {
    /// Turns the Khronos validation layer on (and fails with
    /// [`VulkanError::ValidationUnavailable`] if it is not installed). Messages are logged and
    /// counted; see [`VulkanContext::validation_errors`].
    pub fn validation(mut self, on: bool) -> Self {
        self.validation = on;
        self
    }

    /// Loads the Vulkan loader at run time, creates an instance and a device on the first
    /// physical device that has a queue family able to transfer, with `VK_EXT_memory_budget`
    /// when the device offers it.
    ///
    /// # Errors
    /// [`VulkanError::Loader`] when no loader can be loaded, [`VulkanError::NoDevice`] when no
    /// device qualifies, [`VulkanError::ValidationUnavailable`], or the driver's error.
    pub fn build(self) -> Result<Arc<VulkanContext>, VulkanError> {
        // SAFETY: loading the system's Vulkan loader runs its initialisers; that is the
        // documented way to use Vulkan without linking it at build time.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| VulkanError::Loader {
            reason: e.to_string(),
        })?;
        // SAFETY: `entry` is a loaded loader.
        let layers = unsafe { entry.enumerate_instance_layer_properties() }
            .map_err(|r| VulkanError::from_vk("vkEnumerateInstanceLayerProperties", r, 0))?;
        if self.validation
            && !layers
                .iter()
                .any(|l| l.layer_name_as_c_str() == Ok(VALIDATION_LAYER))
        {
            return Err(VulkanError::ValidationUnavailable);
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"runcache")
            .api_version(vk::API_VERSION_1_1);
        let layer_names = if self.validation {
            vec![VALIDATION_LAYER.as_ptr()]
        } else {
            vec![]
        };
        let ext_names = if self.validation {
            vec![ash::ext::debug_utils::NAME.as_ptr()]
        } else {
            vec![]
        };
        let info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layer_names)
            .enabled_extension_names(&ext_names);
        // SAFETY: the create info and the strings it points to outlive the call.
        let instance = unsafe { entry.create_instance(&info, None) }
            .map_err(|r| VulkanError::from_vk("vkCreateInstance", r, 0))?;
        // From here on, `partial` destroys what was made if a later step fails.
        let mut partial = Partial {
            instance: Some(instance.clone()),
            validation: None,
            device: None,
        };
        if self.validation {
            let sink = Box::<ValidationSink>::default();
            let loader = ash::ext::debug_utils::Instance::new(&entry, &instance);
            let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
                .message_severity(
                    vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                        | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
                )
                .message_type(
                    vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                        | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE
                        | vk::DebugUtilsMessageTypeFlagsEXT::GENERAL,
                )
                .pfn_user_callback(Some(on_validation_message))
                .user_data(&*sink as *const ValidationSink as *mut c_void);
            // SAFETY: the sink is boxed, so its address is stable, and it is dropped only
            // after the messenger is destroyed (`Partial::drop`, `VulkanContext::drop`).
            let messenger = unsafe { loader.create_debug_utils_messenger(&info, None) }
                .map_err(|r| VulkanError::from_vk("vkCreateDebugUtilsMessengerEXT", r, 0))?;
            partial.validation = Some(Validation {
                loader,
                messenger,
                sink,
            });
        }
        // SAFETY: a valid instance.
        let devices = unsafe { instance.enumerate_physical_devices() }
            .map_err(|r| VulkanError::from_vk("vkEnumeratePhysicalDevices", r, 0))?;
        let transfer =
            vk::QueueFlags::TRANSFER | vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE;
        let (physical, family) = devices
            .iter()
            .find_map(|&pd| {
                // SAFETY: `pd` came from this instance.
                let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
                families
                    .iter()
                    .position(|f| f.queue_count > 0 && f.queue_flags.intersects(transfer))
                    .map(|i| (pd, i as u32))
            })
            .ok_or(VulkanError::NoDevice)?;
        // SAFETY: `physical` came from this instance.
        let extensions = unsafe { instance.enumerate_device_extension_properties(physical) }
            .map_err(|r| VulkanError::from_vk("vkEnumerateDeviceExtensionProperties", r, 0))?;
        let memory_budget = extensions
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(ash::ext::memory_budget::NAME));
        let device_exts = if memory_budget {
            vec![ash::ext::memory_budget::NAME.as_ptr()]
        } else {
            vec![]
        };
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&priorities)];
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&device_exts);
        // SAFETY: `physical` belongs to `instance`; the create info outlives the call.
        let device = unsafe { instance.create_device(physical, &info, None) }
            .map_err(|r| VulkanError::from_vk("vkCreateDevice", r, 0))?;
        partial.device = Some(device.clone());
        // SAFETY: queue 0 of `family` was requested above.
        let queue = unsafe { device.get_device_queue(family, 0) };
        let validation = partial.validation.take();
        partial.device = None;
        partial.instance = None;
        // SAFETY: every handle was just made together, from this entry.
        Ok(Arc::new(unsafe {
            VulkanContext::assemble(
                entry,
                instance,
                physical,
                device,
                queue,
                family,
                memory_budget,
                true,
                validation,
            )
        }))
    }
}

/// Destroys what a failed `build` had made so far.
struct Partial {
    instance: Option<ash::Instance>,
    validation: Option<Validation>,
    device: Option<ash::Device>,
}

impl Drop for Partial {
    fn drop(&mut self) {
        // SAFETY: each handle was made by `build`, is used by nothing else, and is destroyed
        // once, children before their parent.
        unsafe {
            if let Some(d) = self.device.take() {
                d.destroy_device(None);
            }
            if let Some(v) = self.validation.take() {
                v.loader.destroy_debug_utils_messenger(v.messenger, None);
            }
            if let Some(i) = self.instance.take() {
                i.destroy_instance(None);
            }
        }
    }
}

/// An instance, a physical device, a device and a queue to transfer on.
pub struct VulkanContext {
    // Kept for the loader's lifetime: the function pointers below come from it.
    _entry: ash::Entry,
    instance: ash::Instance,
    physical: vk::PhysicalDevice,
    device: ash::Device,
    queue: vk::Queue,
    queue_family: u32,
    /// Whether `VK_EXT_memory_budget` is enabled on the device.
    memory_budget: bool,
    /// Whether this context made (and so destroys) the instance and device.
    owned: bool,
    validation: Option<Validation>,
    queue_lock: Mutex<()>,
    properties: vk::PhysicalDeviceProperties,
    memory: vk::PhysicalDeviceMemoryProperties,
    max_allocation_size: u64,
    /// The index of the largest device-local heap.
    device_heap: Option<usize>,
}

// SAFETY: Vulkan handles may be used from any thread; the calls that need external
// synchronization (queue submission) go through `queue_lock`, and command pools are owned by
// one staging slot at a time.
unsafe impl Send for VulkanContext {}
// SAFETY: as above.
unsafe impl Sync for VulkanContext {}

impl VulkanContext {
    /// A builder for a context with its own instance and device (the convenience path for
    /// programs that have no Vulkan objects of their own).
    pub fn builder() -> VulkanContextBuilder {
        VulkanContextBuilder::default()
    }

    /// Wraps the application's own Vulkan objects; they are never destroyed by runcache.
    ///
    /// # Safety
    /// - Every handle is valid, `physical` is the device's physical device, `queue` is a queue
    ///   of family `queue_family` of `device`, and `entry`/`instance`/`device` are the loaders
    ///   those handles came from.
    /// - They stay valid until this context and everything made from it (allocators, buffers)
    ///   are dropped.
    /// - `memory_budget` is `true` only if `VK_EXT_memory_budget` was enabled on `device`.
    /// - The application does not submit to `queue` from another thread while runcache does,
    ///   unless it holds [`queue_lock`](Self::queue_lock) for its own submissions.
    pub unsafe fn from_raw(
        entry: ash::Entry,
        instance: ash::Instance,
        physical: vk::PhysicalDevice,
        device: ash::Device,
        queue: vk::Queue,
        queue_family: u32,
        memory_budget: bool,
    ) -> Arc<Self> {
        // SAFETY: the caller's contract.
        Arc::new(unsafe {
            Self::assemble(
                entry,
                instance,
                physical,
                device,
                queue,
                queue_family,
                memory_budget,
                false,
                None,
            )
        })
    }

    /// # Safety
    /// As [`from_raw`](Self::from_raw).
    #[allow(clippy::too_many_arguments)]
    unsafe fn assemble(
        entry: ash::Entry,
        instance: ash::Instance,
        physical: vk::PhysicalDevice,
        device: ash::Device,
        queue: vk::Queue,
        queue_family: u32,
        memory_budget: bool,
        owned: bool,
        validation: Option<Validation>,
    ) -> Self {
        // SAFETY: `physical` belongs to `instance` (the caller's contract).
        let (properties, memory) = unsafe {
            (
                instance.get_physical_device_properties(physical),
                instance.get_physical_device_memory_properties(physical),
            )
        };
        let largest_heap = memory.memory_heaps[..memory.memory_heap_count as usize]
            .iter()
            .map(|h| h.size)
            .max()
            .unwrap_or(0);
        let max_allocation_size = if properties.api_version >= vk::API_VERSION_1_1 {
            let mut m3 = vk::PhysicalDeviceMaintenance3Properties::default();
            let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut m3);
            // SAFETY: a 1.1 device and a 1.1 instance; the chain outlives the call.
            unsafe { instance.get_physical_device_properties2(physical, &mut p2) };
            m3.max_memory_allocation_size
        } else {
            largest_heap
        };
        Self {
            _entry: entry,
            instance,
            physical,
            device,
            queue,
            queue_family,
            memory_budget,
            owned,
            validation,
            queue_lock: Mutex::new(()),
            properties,
            memory,
            max_allocation_size,
            device_heap: (0..memory.memory_heap_count as usize)
                .filter(|&i| {
                    memory.memory_heaps[i]
                        .flags
                        .contains(vk::MemoryHeapFlags::DEVICE_LOCAL)
                })
                .max_by_key(|&i| memory.memory_heaps[i].size),
        }
    }

    /// The raw device.
    pub fn device(&self) -> &ash::Device {
        &self.device
    }

    /// The raw instance.
    pub fn instance(&self) -> &ash::Instance {
        &self.instance
    }

    /// The physical device.
    pub fn physical_device(&self) -> vk::PhysicalDevice {
        self.physical
    }

    /// The queue runcache submits its transfers to, and its family.
    pub fn queue(&self) -> (vk::Queue, u32) {
        (self.queue, self.queue_family)
    }

    /// The lock runcache holds while it submits to [`queue`](Self::queue). An application that
    /// submits to the same queue from other threads takes it too (Vulkan requires queue
    /// submissions to be externally synchronized).
    pub fn queue_lock(&self) -> MutexGuard<'_, ()> {
        lock(&self.queue_lock)
    }

    /// The device's name, as the driver reports it.
    pub fn device_name(&self) -> String {
        self.properties
            .device_name_as_c_str()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// `maxMemoryAllocationSize`: the largest single allocation the device accepts.
    pub fn max_allocation_size(&self) -> u64 {
        self.max_allocation_size
    }

    /// Whether `VK_EXT_memory_budget` is enabled.
    pub fn has_memory_budget(&self) -> bool {
        self.memory_budget
    }

    /// Every memory heap, with this process's budget and usage when `VK_EXT_memory_budget` is
    /// enabled (queried now: the budget changes as other processes use the device).
    pub fn heaps(&self) -> Vec<HeapBudget> {
        let budget = self.budget();
        (0..self.memory.memory_heap_count as usize)
            .map(|i| self.heap(i, budget.as_ref()))
            .collect()
    }

    fn heap(
        &self,
        i: usize,
        budget: Option<&vk::PhysicalDeviceMemoryBudgetPropertiesEXT<'_>>,
    ) -> HeapBudget {
        let h = &self.memory.memory_heaps[i];
        HeapBudget {
            size: h.size,
            device_local: h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL),
            budget: budget.map(|b| b.heap_budget[i]),
            usage: budget.map(|b| b.heap_usage[i]),
        }
    }

    /// The budget and usage of every heap, queried now; `None` without the extension.
    fn budget(&self) -> Option<vk::PhysicalDeviceMemoryBudgetPropertiesEXT<'static>> {
        if !self.memory_budget {
            return None;
        }
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mut p2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: the extension is enabled (the constructor's contract); the chain outlives
        // the call.
        unsafe {
            self.instance
                .get_physical_device_memory_properties2(self.physical, &mut p2)
        };
        budget.p_next = std::ptr::null_mut();
        Some(budget)
    }

    /// The largest device-local heap (the one constant buffers go to), with its budget.
    pub(crate) fn device_heap(&self) -> Option<HeapBudget> {
        let i = self.device_heap?;
        Some(self.heap(i, self.budget().as_ref()))
    }

    /// Validation errors reported so far (always 0 without validation).
    pub fn validation_errors(&self) -> u64 {
        self.validation
            .as_ref()
            .map_or(0, |v| v.sink.errors.load(Ordering::Relaxed))
    }

    /// Takes the validation messages received so far (errors and warnings) and resets the
    /// error count: for tests that provoke a message on purpose.
    pub fn take_validation_messages(&self) -> Vec<String> {
        match &self.validation {
            Some(v) => {
                v.sink.errors.store(0, Ordering::Relaxed);
                v.sink.warnings.store(0, Ordering::Relaxed);
                std::mem::take(&mut *lock(&v.sink.messages))
            }
            None => Vec::new(),
        }
    }

    /// Whether validation is on.
    pub fn validation_enabled(&self) -> bool {
        self.validation.is_some()
    }

    fn memory_type_flags(&self, memory_type_index: u32) -> vk::MemoryPropertyFlags {
        self.memory.memory_types[memory_type_index as usize].property_flags
    }
}

impl Drop for VulkanContext {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: this context made the device and instance; everything made from them holds
        // an `Arc` of the context, so nothing is left that uses them. Children go first.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.device.destroy_device(None);
            if let Some(v) = self.validation.take() {
                v.loader.destroy_debug_utils_messenger(v.messenger, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

impl fmt::Debug for VulkanContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanContext")
            .field("device", &self.device_name())
            .field("queue_family", &self.queue_family)
            .field("memory_budget", &self.memory_budget)
            .field("owned", &self.owned)
            .field("validation", &self.validation.is_some())
            .finish_non_exhaustive()
    }
}

/// A host-visible staging buffer with the command buffer and fence of one transfer at a time.
struct Staging {
    ctx: Arc<VulkanContext>,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    mapped: *mut u8,
    size: u64,
    pool: vk::CommandPool,
    commands: vk::CommandBuffer,
    fence: vk::Fence,
}

// SAFETY: the mapped pointer and the handles are used by one thread at a time (the slot is
// reserved from the pool manager), and Vulkan handles may move between threads.
unsafe impl Send for Staging {}

impl Staging {
    fn new(ctx: &Arc<VulkanContext>, size: u64) -> Result<Self, VulkanError> {
        let d = &ctx.device;
        let mut s = Staging {
            ctx: Arc::clone(ctx),
            buffer: vk::Buffer::null(),
            memory: vk::DeviceMemory::null(),
            mapped: std::ptr::null_mut(),
            size,
            pool: vk::CommandPool::null(),
            commands: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
        };
        // Every step stores its handle in `s` at once, so a failure drops `s` and destroys
        // what was made.
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid device and create info.
        s.buffer = unsafe { d.create_buffer(&info, None) }
            .map_err(|r| VulkanError::from_vk("vkCreateBuffer", r, size))?;
        // SAFETY: the buffer was just made on this device.
        let req = unsafe { d.get_buffer_memory_requirements(s.buffer) };
        let wanted = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let index = (0..ctx.memory.memory_type_count)
            .find(|&i| {
                req.memory_type_bits & (1 << i) != 0 && ctx.memory_type_flags(i).contains(wanted)
            })
            .ok_or(VulkanError::NoMemoryType { requested: size })?;
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(index);
        // SAFETY: a valid allocate info for a type the buffer accepts.
        s.memory = unsafe { d.allocate_memory(&alloc, None) }
            .map_err(|r| VulkanError::from_vk("vkAllocateMemory", r, size))?;
        // SAFETY: the memory fits the buffer's requirements and is bound once.
        unsafe { d.bind_buffer_memory(s.buffer, s.memory, 0) }
            .map_err(|r| VulkanError::from_vk("vkBindBufferMemory", r, size))?;
        // SAFETY: host-visible memory, mapped once, whole.
        s.mapped =
            unsafe { d.map_memory(s.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }
                .map_err(|r| VulkanError::from_vk("vkMapMemory", r, size))?
                .cast();
        let info = vk::CommandPoolCreateInfo::default()
            .flags(
                vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER
                    | vk::CommandPoolCreateFlags::TRANSIENT,
            )
            .queue_family_index(ctx.queue_family);
        // SAFETY: a valid device and family.
        s.pool = unsafe { d.create_command_pool(&info, None) }
            .map_err(|r| VulkanError::from_vk("vkCreateCommandPool", r, 0))?;
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(s.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: a valid pool.
        s.commands = unsafe { d.allocate_command_buffers(&info) }
            .map_err(|r| VulkanError::from_vk("vkAllocateCommandBuffers", r, 0))?[0];
        // SAFETY: a valid device.
        s.fence = unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) }
            .map_err(|r| VulkanError::from_vk("vkCreateFence", r, 0))?;
        Ok(s)
    }

    /// Copies `region` from `buffers.0` to `buffers.1` on the device, followed by a barrier
    /// that makes the written bytes visible to `dst_stage`/`dst_access`; submits and waits.
    /// Both buffers must stay alive until it returns (they do: it waits).
    fn copy(
        &self,
        buffers: (vk::Buffer, vk::Buffer),
        region: vk::BufferCopy,
        dst_stage: vk::PipelineStageFlags,
        dst_access: vk::AccessFlags,
    ) -> Result<(), VulkanError> {
        let d = &self.ctx.device;
        // The command buffer, pool and fence belong to this slot, which one thread holds at a
        // time, and the slot's previous submission was waited for and its fence reset.
        // SAFETY: so the command buffer may be reset and re-recorded; both buffers are alive
        // (the caller holds them) until the fence wait below returns.
        unsafe {
            d.reset_command_buffer(self.commands, vk::CommandBufferResetFlags::empty())
                .map_err(|r| VulkanError::from_vk("vkResetCommandBuffer", r, 0))?;
            let begin = vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            d.begin_command_buffer(self.commands, &begin)
                .map_err(|r| VulkanError::from_vk("vkBeginCommandBuffer", r, 0))?;
            d.cmd_copy_buffer(self.commands, buffers.0, buffers.1, &[region]);
            let barrier = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                .dst_access_mask(dst_access)];
            d.cmd_pipeline_barrier(
                self.commands,
                vk::PipelineStageFlags::TRANSFER,
                dst_stage,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            );
            d.end_command_buffer(self.commands)
                .map_err(|r| VulkanError::from_vk("vkEndCommandBuffer", r, 0))?;
            let buffers = [self.commands];
            let submit = [vk::SubmitInfo::default().command_buffers(&buffers)];
            {
                let _queue = self.ctx.queue_lock();
                d.queue_submit(self.ctx.queue, &submit, self.fence)
                    .map_err(|r| VulkanError::from_vk("vkQueueSubmit", r, 0))?;
            }
            let waited = d.wait_for_fences(&[self.fence], true, FENCE_TIMEOUT.as_nanos() as u64);
            match waited {
                Ok(()) => {}
                Err(vk::Result::TIMEOUT) => return Err(VulkanError::Timeout),
                Err(r) => return Err(VulkanError::from_vk("vkWaitForFences", r, 0)),
            }
            d.reset_fences(&[self.fence])
                .map_err(|r| VulkanError::from_vk("vkResetFences", r, 0))?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let d = &self.ctx.device;
        // SAFETY: the slot's handles were made on this device and are idle (every submission
        // was waited for); null handles are ignored by the destroy calls.
        unsafe {
            if self.fence != vk::Fence::null() {
                d.destroy_fence(self.fence, None);
            }
            if self.pool != vk::CommandPool::null() {
                d.destroy_command_pool(self.pool, None);
            }
            if self.buffer != vk::Buffer::null() {
                d.destroy_buffer(self.buffer, None);
            }
            if self.memory != vk::DeviceMemory::null() {
                d.free_memory(self.memory, None);
            }
        }
    }
}

/// Shared by an allocator and the buffers it made, so a buffer can free itself.
struct Shared {
    // Field order is drop order: staging slots and the allocator go before the context (the
    // slab blocks are freed by `Drop for Shared`, before any field).
    staging: PoolManager<Option<Staging>>,
    slabs: Mutex<Slabs>,
    gpu: Mutex<Allocator>,
    /// Bytes of live buffers made by this allocator.
    used: AtomicU64,
    soft_limit: AtomicU64,
    dedicated_threshold: u64,
    staging_size: u64,
    force_staging: bool,
    prechecks: bool,
    ctx: Arc<VulkanContext>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Every buffer holds an `Arc` of this, so no slot is in use; the blocks go before the
        // allocator they came from.
        let slabs = std::mem::take(self.slabs.get_mut().unwrap_or_else(|p| p.into_inner()));
        let gpu = self.gpu.get_mut().unwrap_or_else(|p| p.into_inner());
        for block in slabs.blocks {
            // SAFETY: made on this device; no buffer uses a slot of it any more.
            unsafe { self.ctx.device.destroy_buffer(block.buffer, None) };
            if let Err(e) = gpu.free(block.allocation) {
                log::error!("runcache: gpu-allocator could not free a block: {e}");
            }
        }
    }
}

/// Configures a [`VulkanAllocator`]; see [`VulkanAllocator::builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct VulkanAllocatorBuilder {
    ctx: Arc<VulkanContext>,
    soft_limit: Option<u64>,
    dedicated_threshold: u64,
    block_size: u64,
    staging_size: u64,
    staging_slots: usize,
    force_staging: bool,
    prechecks: bool,
}

impl VulkanAllocatorBuilder {
    /// At most this many bytes of live buffers; a request beyond it fails with
    /// [`VulkanError::SoftLimit`] before the driver is called. For testing out-of-memory paths
    /// on any device, or for sharing a device with other work. Default: none.
    pub fn soft_limit(mut self, bytes: u64) -> Self {
        self.soft_limit = Some(bytes);
        self
    }

    /// Buffers of at least this many bytes get a dedicated device allocation; smaller ones
    /// are sub-allocated from shared blocks. Default 64 MiB.
    pub fn dedicated_threshold(mut self, bytes: u64) -> Self {
        self.dedicated_threshold = bytes;
        self
    }

    /// The size of the device-memory blocks small buffers are packed into. Default 64 MiB.
    pub fn block_size(mut self, bytes: u64) -> Self {
        self.block_size = bytes;
        self
    }

    /// The size of each staging buffer (uploads larger than it go in several copies).
    /// Default 16 MiB.
    pub fn staging_size(mut self, bytes: u64) -> Self {
        self.staging_size = bytes;
        self
    }

    /// How many staging slots may exist at once (concurrent transfers beyond it wait for a
    /// slot). Default 4.
    pub fn staging_slots(mut self, n: usize) -> Self {
        self.staging_slots = n;
        self
    }

    /// Always go through staging, even when the device memory is host-visible (to measure or
    /// test that path on unified-memory devices). Default off.
    pub fn force_staging(mut self, on: bool) -> Self {
        self.force_staging = on;
        self
    }

    /// Check each request against `maxMemoryAllocationSize`, the heap size and the budget
    /// before calling the driver. Default on; off only to see what the driver itself says.
    pub fn prechecks(mut self, on: bool) -> Self {
        self.prechecks = on;
        self
    }

    /// Makes the allocator.
    ///
    /// # Errors
    /// [`VulkanError::InvalidConfig`] for a zero size or slot count, or the allocator's own
    /// error.
    pub fn build(self) -> Result<VulkanAllocator, VulkanError> {
        let bad = |reason: &'static str| Err(VulkanError::InvalidConfig { reason });
        if self.staging_size == 0 {
            return bad("staging_size must be at least 1 byte (got 0)");
        }
        if self.staging_slots == 0 {
            return bad("staging_slots must be at least 1 (got 0)");
        }
        if self.block_size < (1 << 20) || self.block_size % (4 << 10) != 0 {
            return bad("block_size must be at least 1 MiB and a multiple of 4 KiB");
        }
        let ctx = self.ctx;
        let gpu = Allocator::new(&AllocatorCreateDesc {
            instance: ctx.instance.clone(),
            device: ctx.device.clone(),
            physical_device: ctx.physical,
            debug_settings: AllocatorDebugSettings::default(),
            buffer_device_address: false,
            allocation_sizes: AllocationSizes::new(self.block_size, self.block_size),
        })
        .map_err(|e| VulkanError::from_allocator(e, 0))?;
        let staging = PoolManager::builder(|| None)
            .max_pools(self.staging_slots)
            .when_exhausted(WhenExhausted::Wait)
            .build()
            .expect("checked above: one pool per growth, a maximum of at least 1");
        Ok(VulkanAllocator {
            shared: Arc::new(Shared {
                staging,
                slabs: Mutex::new(Slabs::default()),
                gpu: Mutex::new(gpu),
                used: AtomicU64::new(0),
                soft_limit: AtomicU64::new(self.soft_limit.unwrap_or(u64::MAX)),
                dedicated_threshold: self.dedicated_threshold,
                staging_size: self.staging_size,
                force_staging: self.force_staging,
                prechecks: self.prechecks,
                ctx,
            }),
            retired: SegQueue::new(),
        })
    }
}

/// Makes device-local buffers and fills them; see the [module docs](crate::vulkan).
pub struct VulkanAllocator {
    shared: Arc<Shared>,
    /// Buffers waiting for a fence before they may be freed.
    retired: SegQueue<(vk::Fence, Arc<ConstantBuffer>)>,
}

impl VulkanAllocator {
    /// An allocator with the default settings.
    ///
    /// # Errors
    /// As [`VulkanAllocatorBuilder::build`].
    pub fn new(ctx: Arc<VulkanContext>) -> Result<Self, VulkanError> {
        Self::builder(ctx).build()
    }

    /// A builder for an allocator on `ctx`.
    pub fn builder(ctx: Arc<VulkanContext>) -> VulkanAllocatorBuilder {
        VulkanAllocatorBuilder {
            ctx,
            soft_limit: None,
            dedicated_threshold: 64 << 20,
            block_size: 64 << 20,
            staging_size: 16 << 20,
            staging_slots: 4,
            force_staging: false,
            prechecks: true,
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<VulkanContext> {
        &self.shared.ctx
    }

    /// Bytes of live buffers made by this allocator.
    pub fn used_bytes(&self) -> u64 {
        self.shared.used.load(Ordering::Relaxed)
    }

    /// Changes the soft limit (`None`: no limit). Live buffers are kept.
    pub fn set_soft_limit(&self, bytes: Option<u64>) {
        // Relaxed: a bound checked by the reservation's own compare-and-swap loop.
        self.shared
            .soft_limit
            .store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Device-memory blocks and dedicated allocations the allocator holds now (each is one
    /// `vkAllocateMemory`).
    pub fn device_allocations(&self) -> usize {
        lock(&self.shared.gpu).generate_report().blocks.len()
    }

    /// An uninitialized device-local buffer of `size` bytes.
    ///
    /// # Errors
    /// [`VulkanError::ZeroSize`]; with prechecks on, [`VulkanError::TooLarge`],
    /// [`VulkanError::AboveHeap`] or [`VulkanError::OverBudget`] before the driver is called;
    /// [`VulkanError::SoftLimit`]; or the driver's error ([`VulkanError::OutOfDeviceMemory`]
    /// and the others). Nothing is left allocated after an error.
    pub fn allocate(&self, size: u64) -> Result<DeviceBuffer, VulkanError> {
        let s = &self.shared;
        self.collect_retired();
        if size == 0 {
            return Err(VulkanError::ZeroSize);
        }
        if s.prechecks {
            let max = s.ctx.max_allocation_size;
            if size > max {
                return Err(VulkanError::TooLarge {
                    requested: size,
                    max_allocation_size: max,
                });
            }
            if let Some(heap) = s.ctx.device_heap() {
                if size > heap.size {
                    return Err(VulkanError::AboveHeap {
                        requested: size,
                        heap_size: heap.size,
                    });
                }
                if let (Some(budget), Some(usage)) = (heap.budget, heap.usage) {
                    let available = budget.saturating_sub(usage);
                    if size > available {
                        return Err(VulkanError::OverBudget {
                            requested: size,
                            available,
                        });
                    }
                }
            }
        }
        // Reserve against the soft limit first, so concurrent requests cannot overshoot it.
        let mut used = s.used.load(Ordering::Relaxed);
        loop {
            let limit = s.soft_limit.load(Ordering::Relaxed);
            if used.checked_add(size).is_none_or(|total| total > limit) {
                return Err(VulkanError::SoftLimit {
                    requested: size,
                    used,
                    limit,
                });
            }
            // Relaxed: a byte budget; nothing is published through it.
            match s.used.compare_exchange_weak(
                used,
                used + size,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => used = now,
            }
        }
        let mut buffer = DeviceBuffer {
            buffer: vk::Buffer::null(),
            offset: 0,
            allocation: None,
            slot: None,
            memory: vk::DeviceMemory::null(),
            memory_offset: 0,
            mapped: 0,
            size,
            align: 1,
            shared: Arc::clone(s),
        };
        // From here, dropping `buffer` undoes every step done so far.
        if size <= SLAB_MAX {
            self.take_slot(&mut buffer)?;
            return Ok(buffer);
        }
        let (vk_buffer, allocation, align) = self.bound_buffer(
            size,
            size >= s.dedicated_threshold,
            "runcache constant",
            size,
        )?;
        (buffer.memory, buffer.memory_offset, buffer.mapped) = placement(&allocation);
        buffer.buffer = vk_buffer;
        buffer.allocation = Some(allocation);
        buffer.align = align;
        Ok(buffer)
    }

    /// A new device-local buffer of `size` bytes bound to memory of its own (a dedicated
    /// allocation, or a gpu-allocator sub-allocation), with its alignment. On an error nothing
    /// is left made; `requested` is the size the caller asked for (for the error).
    fn bound_buffer(
        &self,
        size: u64,
        dedicated: bool,
        name: &'static str,
        requested: u64,
    ) -> Result<(vk::Buffer, Allocation, u64), VulkanError> {
        let s = &self.shared;
        let d = &s.ctx.device;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(BUFFER_USAGE)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid device and create info.
        let buffer = unsafe { d.create_buffer(&info, None) }
            .map_err(|r| VulkanError::from_vk("vkCreateBuffer", r, requested))?;
        // SAFETY: the buffer was just made on this device.
        let requirements = unsafe { d.get_buffer_memory_requirements(buffer) };
        let allocated = lock(&s.gpu).allocate(&AllocationCreateDesc {
            name,
            requirements,
            location: MemoryLocation::GpuOnly,
            linear: true,
            allocation_scheme: if dedicated {
                AllocationScheme::DedicatedBuffer(buffer)
            } else {
                AllocationScheme::GpuAllocatorManaged
            },
        });
        let allocation = match allocated {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: made above, never bound or used.
                unsafe { d.destroy_buffer(buffer, None) };
                return Err(VulkanError::from_allocator(e, requested));
            }
        };
        // SAFETY: the allocation's memory satisfies the buffer's requirements (gpu-allocator
        // allocated it for them) at its offset; the buffer is bound once.
        let bound =
            unsafe { d.bind_buffer_memory(buffer, allocation.memory(), allocation.offset()) };
        if let Err(r) = bound {
            // SAFETY: made above and not in use; the allocation is freed right after.
            unsafe { d.destroy_buffer(buffer, None) };
            if let Err(e) = lock(&s.gpu).free(allocation) {
                log::error!("runcache: gpu-allocator could not free an allocation: {e}");
            }
            return Err(VulkanError::from_vk("vkBindBufferMemory", r, requested));
        }
        Ok((buffer, allocation, requirements.alignment.max(1)))
    }

    /// Makes `buffer` (small, reserved, not yet backed) a free slot of its size class, adding
    /// a block to the class when it has none free.
    fn take_slot(&self, buffer: &mut DeviceBuffer) -> Result<(), VulkanError> {
        let s = &self.shared;
        let (class, slot_size) = slab_class(buffer.size);
        let mut slabs = lock(&s.slabs);
        let (block, slot) = match slabs.free[class].pop() {
            Some(free) => free,
            None => {
                let block =
                    u32::try_from(slabs.blocks.len()).map_err(|_| VulkanError::Allocator {
                        reason: "more than 2^32 small-buffer blocks".to_string(),
                    })?;
                slabs.blocks.push(self.new_block(buffer.size)?);
                let slots = (SLAB_BLOCK / slot_size) as u32;
                // Hand slots out from the front of the block: pushed in reverse, popped first.
                slabs.free[class].extend((1..slots).rev().map(|i| (block, i)));
                (block, 0)
            }
        };
        let b = &slabs.blocks[block as usize];
        let (memory, memory_offset, mapped) = placement(&b.allocation);
        let offset = u64::from(slot) * slot_size;
        buffer.buffer = b.buffer;
        buffer.offset = offset;
        buffer.slot = Some(SlotId { class, block, slot });
        buffer.memory = memory;
        buffer.memory_offset = memory_offset + offset;
        buffer.mapped = if mapped == 0 {
            0
        } else {
            mapped + offset as usize
        };
        buffer.align = slot_size;
        Ok(())
    }

    /// A new 4 MiB block buffer for small buffers, bound to a sub-allocation of its own.
    /// `requested` is the size of the request that needed it (for errors).
    fn new_block(&self, requested: u64) -> Result<SlabBlock, VulkanError> {
        let (buffer, allocation, _) =
            self.bound_buffer(SLAB_BLOCK, false, "runcache small-buffer block", requested)?;
        Ok(SlabBlock { buffer, allocation })
    }

    /// A device-local buffer holding `bytes`.
    ///
    /// # Errors
    /// As [`allocate`](Self::allocate) and [`write`](Self::write).
    pub fn upload(&self, bytes: &[u8]) -> Result<DeviceBuffer, VulkanError> {
        let mut buffer = self.allocate(bytes.len() as u64)?;
        self.write(&mut buffer, 0, bytes)?;
        Ok(buffer)
    }

    /// [`upload`](Self::upload), wrapped as a [`ConstantBuffer`] for a GPU constant cache.
    ///
    /// # Errors
    /// As [`upload`](Self::upload).
    pub fn upload_constant(&self, bytes: &[u8]) -> Result<ConstantBuffer, VulkanError> {
        Ok(ConstantBuffer::from_device_memory(self.upload(bytes)?))
    }

    /// Writes `bytes` at `offset` into a buffer nobody else uses yet (`&mut`): by mapping when
    /// the memory is host-visible and coherent, else through a staging slot, a copy and a
    /// fence. When it returns, the data is on the device.
    ///
    /// # Errors
    /// [`VulkanError::OutOfRange`], [`VulkanError::NotFromThisAllocator`], or a staging or
    /// transfer error.
    pub fn write(
        &self,
        buffer: &mut DeviceBuffer,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), VulkanError> {
        self.check(buffer, offset, bytes.len() as u64)?;
        if let Some(dst) = self.mapped(buffer) {
            // SAFETY: `dst` maps the buffer's whole range (host-visible, coherent memory);
            // `check` kept the write inside it; `&mut` means no one else reads it now.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.add(offset as usize), bytes.len())
            };
            return Ok(());
        }
        let slot = self.staging()?;
        let staging = slot.as_ref().expect("filled by `staging`");
        for (i, chunk) in bytes.chunks(staging.size as usize).enumerate() {
            let at = offset + i as u64 * staging.size;
            // SAFETY: the staging buffer is mapped, at least `chunk.len()` bytes long, and
            // idle (its last transfer was waited for).
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), staging.mapped, chunk.len()) };
            let region = vk::BufferCopy {
                src_offset: 0,
                dst_offset: at,
                size: chunk.len() as u64,
            };
            // Make the copy visible to whatever the application runs next.
            staging.copy(
                (staging.buffer, buffer.buffer),
                vk::BufferCopy {
                    dst_offset: buffer.offset + region.dst_offset,
                    ..region
                },
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE,
            )?;
        }
        drop(slot);
        Ok(())
    }

    /// Copies `len` bytes at `offset` out of a buffer (for checks and debugging; a runtime
    /// reads its constants on the device).
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub fn read(
        &self,
        buffer: &DeviceBuffer,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, VulkanError> {
        self.check(buffer, offset, len)?;
        let mut out = vec![0u8; len as usize];
        if let Some(src) = self.mapped(buffer) {
            // SAFETY: as in `write`; reading only, and the caller does not let the device
            // write this buffer meanwhile (constants are read-only on the device).
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(offset as usize), out.as_mut_ptr(), out.len())
            };
            return Ok(out);
        }
        let slot = self.staging()?;
        let staging = slot.as_ref().expect("filled by `staging`");
        for (i, chunk) in out.chunks_mut(staging.size as usize).enumerate() {
            let at = offset + i as u64 * staging.size;
            let region = vk::BufferCopy {
                src_offset: at,
                dst_offset: 0,
                size: chunk.len() as u64,
            };
            // Make the copy visible to the host read after the fence.
            staging.copy(
                (buffer.buffer, staging.buffer),
                vk::BufferCopy {
                    src_offset: buffer.offset + region.src_offset,
                    ..region
                },
                vk::PipelineStageFlags::HOST,
                vk::AccessFlags::HOST_READ,
            )?;
            // SAFETY: the transfer finished (fence) and the staging buffer holds `chunk.len()`
            // bytes of it.
            unsafe {
                std::ptr::copy_nonoverlapping(staging.mapped, chunk.as_mut_ptr(), chunk.len())
            };
        }
        Ok(out)
    }

    /// Keeps `buffer` alive until `fence` signals, then lets it go (freeing it if this was the
    /// last `Arc`). For a buffer evicted or removed from a cache while a submission that reads
    /// it may still run. Retired buffers are checked at every [`allocate`](Self::allocate),
    /// at [`collect_retired`](Self::collect_retired), and waited for when the allocator drops.
    ///
    /// The fence stays the caller's: it must stay valid (not destroyed or reset) until then.
    pub fn retire_after(&self, fence: vk::Fence, buffer: Arc<ConstantBuffer>) {
        self.retired.push((fence, buffer));
    }

    /// Lets go of every retired buffer whose fence has signalled; returns how many.
    pub fn collect_retired(&self) -> usize {
        let mut released = 0;
        for _ in 0..self.retired.len() {
            let Some((fence, buffer)) = self.retired.pop() else {
                break;
            };
            // SAFETY: the fence is valid until the buffer is released (`retire_after`'s
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
    pub fn retired_pending(&self) -> usize {
        self.retired.len()
    }

    fn check(&self, buffer: &DeviceBuffer, offset: u64, len: u64) -> Result<(), VulkanError> {
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
    fn mapped(&self, buffer: &DeviceBuffer) -> Option<*mut u8> {
        if self.shared.force_staging || buffer.mapped == 0 {
            return None;
        }
        Some(buffer.mapped as *mut u8)
    }

    /// A staging slot, made on first use.
    fn staging(&self) -> Result<crate::pool::PoolGuard<'_, Option<Staging>>, VulkanError> {
        let mut slot = self
            .shared
            .staging
            .reserve()
            .map_err(|e| VulkanError::Staging {
                reason: e.to_string(),
            })?;
        if slot.is_none() {
            *slot = Some(Staging::new(&self.shared.ctx, self.shared.staging_size)?);
        }
        Ok(slot)
    }
}

impl Drop for VulkanAllocator {
    fn drop(&mut self) {
        // Wait for the fences of retired buffers, so none is freed while the device may use
        // it; a lost device or a timeout gives up waiting (nothing more can be done).
        while let Some((fence, buffer)) = self.retired.pop() {
            // SAFETY: valid until released (`retire_after`'s contract).
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

impl fmt::Debug for VulkanAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanAllocator")
            .field("context", &self.shared.ctx)
            .field("used_bytes", &self.used_bytes())
            .field("retired_pending", &self.retired.len())
            .finish_non_exhaustive()
    }
}

/// A device-local Vulkan buffer made by a [`VulkanAllocator`]; freed when dropped.
///
/// **Contract:** the device must be done with the buffer before it drops. Hold its `Arc`
/// (the cache's `Arc<ConstantBuffer>`) until every submission that reads it has completed, or
/// hand it to [`VulkanAllocator::retire_after`] with that submission's fence.
pub struct DeviceBuffer {
    /// Its own buffer, or (for a slot) its block's, which it does not own.
    buffer: vk::Buffer,
    /// Where the buffer's range starts inside `buffer` (0 unless it is a slot).
    offset: u64,
    /// Its own allocation (`None` for a slot).
    allocation: Option<Allocation>,
    slot: Option<SlotId>,
    memory: vk::DeviceMemory,
    /// Where the range starts inside `memory`.
    memory_offset: u64,
    /// Host address of the range's first byte when mapped and coherent, else 0.
    mapped: usize,
    size: u64,
    align: u64,
    shared: Arc<Shared>,
}

impl DeviceBuffer {
    /// The `vk::Buffer` to bind in descriptor sets or copy from. A small buffer (up to
    /// [`SLAB_MAX`]) shares it with others: use the range from [`offset`](Self::offset) for
    /// [`size`](Self::size) bytes, never the whole buffer.
    pub fn buffer(&self) -> vk::Buffer {
        self.buffer
    }

    /// Where this buffer's bytes start inside [`buffer`](Self::buffer): 0 for a buffer of its
    /// own, the slot's offset for a small one (a multiple of 256, so it can be bound as a
    /// storage or uniform buffer offset on any device).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The size in bytes (as requested).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The device memory and the offset of this buffer's first byte in it.
    pub fn memory(&self) -> (vk::DeviceMemory, u64) {
        (self.memory, self.memory_offset)
    }

    /// Whether the buffer has a device allocation of its own (not sub-allocated).
    pub fn is_dedicated(&self) -> bool {
        self.allocation.as_ref().is_some_and(|a| a.is_dedicated())
    }
}

impl DeviceMemory for DeviceBuffer {
    fn size(&self) -> usize {
        self.size as usize
    }

    fn align(&self) -> usize {
        self.align as usize
    }

    fn device(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let s = &self.shared;
        if let Some(SlotId { class, block, slot }) = self.slot {
            // The device is done with the range (the type's contract): its slot is free again.
            lock(&s.slabs).free[class].push((block, slot));
        } else if self.buffer != vk::Buffer::null() {
            // SAFETY: made on this device; the device is done with it (the type's contract).
            unsafe { s.ctx.device.destroy_buffer(self.buffer, None) };
        }
        if let Some(a) = self.allocation.take() {
            if let Err(e) = lock(&s.gpu).free(a) {
                log::error!("runcache: gpu-allocator could not free a constant buffer: {e}");
            }
        }
        // Relaxed: a byte budget (see `allocate`).
        s.used.fetch_sub(self.size, Ordering::Relaxed);
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("buffer", &self.buffer)
            .field("offset", &self.offset)
            .field("size", &self.size)
            .field("dedicated", &self.is_dedicated())
            .finish()
    }
}

impl VulkanError {
    /// Maps a driver result; `requested` is the size of the request that failed (0 if none).
    pub(crate) fn from_vk(call: &'static str, result: vk::Result, requested: u64) -> Self {
        match result {
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => VulkanError::OutOfDeviceMemory { requested },
            vk::Result::ERROR_OUT_OF_HOST_MEMORY => VulkanError::OutOfHostMemory { requested },
            vk::Result::ERROR_DEVICE_LOST => VulkanError::DeviceLost,
            result => VulkanError::Driver { call, result },
        }
    }

    fn from_allocator(e: AllocationError, requested: u64) -> Self {
        match e {
            AllocationError::OutOfMemory => VulkanError::OutOfDeviceMemory { requested },
            AllocationError::NoCompatibleMemoryTypeFound => VulkanError::NoMemoryType { requested },
            other => VulkanError::Allocator {
                reason: other.to_string(),
            },
        }
    }
}
