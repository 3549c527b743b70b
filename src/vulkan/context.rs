//! The device context: an instance, a physical device, a device and one queue, either the
//! application's own (borrowed, never destroyed) or made by [`VulkanContext::builder`], with
//! validation-layer messages counted when validation is on.

#![allow(unsafe_code)]

use super::error::{VulkanError, WrappedError};
use super::lock;
use super::validation::{
    on_validation_message, Validation, ValidationLog, ValidationSink, VALIDATION_LAYER,
};
use crate::sync::{AtomicU64, Ordering};
use ash::vk;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long a transfer may take before [`VulkanError::Timeout`].
pub(super) const FENCE_TIMEOUT: Duration = Duration::from_secs(60);

/// One memory heap as the device reports it.
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// for heap in ctx.heaps().iter().filter(|h| h.device_local) {
///     println!("{} MiB, budget {:?}, used {:?}", heap.size >> 20, heap.budget, heap.usage);
/// }
/// # Ok::<(), runcache::VulkanError>(())
/// ```
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
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// let ctx = VulkanContext::builder().validation(cfg!(debug_assertions)).build()?;
/// println!("{}", ctx.device_name());
/// # Ok::<(), runcache::VulkanError>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct VulkanContextBuilder {
    pub(super) validation: bool,
}

impl VulkanContextBuilder {
    /// Turns the Khronos validation layer on (and fails with
    /// [`VulkanError::ValidationUnavailable`] if it is not installed). Messages are logged and
    /// counted; see [`VulkanContext::validation_errors`].
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use runcache::VulkanError;
    ///
    /// match VulkanContext::builder().validation(true).build() {
    ///     Ok(ctx) => assert!(ctx.validation_enabled()),
    ///     Err(VulkanError::ValidationUnavailable) => eprintln!("install the Khronos validation layer"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
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
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// use runcache::VulkanError;
    ///
    /// match VulkanContext::builder().build() {
    ///     Ok(ctx) => println!("{}", ctx.device_name()),
    ///     Err(VulkanError::Loader { source }) => eprintln!("no Vulkan here: {source}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn build(self) -> Result<Arc<VulkanContext>, VulkanError> {
        // SAFETY: (V5) loading the system's Vulkan loader runs its initialisers; that is the
        // documented way to use Vulkan without linking it at build time.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| VulkanError::Loader {
            source: WrappedError::new(e),
        })?;
        // SAFETY: (V5) `entry` is a loaded loader.
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
        // SAFETY: (V5) the create info and the strings it points to outlive the call.
        let instance = unsafe { entry.create_instance(&info, None) }
            .map_err(|r| VulkanError::from_vk("vkCreateInstance", r, 0))?;
        // From here on, `partial` destroys what was made if a later step fails.
        let mut partial = Partial {
            instance: Some(instance.clone()),
            validation: None,
            device: None,
        };
        if self.validation {
            let sink = Arc::<ValidationSink>::default();
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
            // SAFETY: (V1) the sink is behind an `Arc`, so its address is stable, and the
            // context's count of it is dropped only after the messenger is destroyed
            // (`Partial::drop`, `VulkanContext::drop`).
            let messenger = unsafe { loader.create_debug_utils_messenger(&info, None) }
                .map_err(|r| VulkanError::from_vk("vkCreateDebugUtilsMessengerEXT", r, 0))?;
            partial.validation = Some(Validation {
                loader,
                messenger,
                sink,
            });
        }
        // SAFETY: (V5) a valid instance.
        let devices = unsafe { instance.enumerate_physical_devices() }
            .map_err(|r| VulkanError::from_vk("vkEnumeratePhysicalDevices", r, 0))?;
        let transfer =
            vk::QueueFlags::TRANSFER | vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE;
        let (physical, family) = devices
            .iter()
            .find_map(|&pd| {
                // SAFETY: (V5) `pd` came from this instance.
                let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
                families
                    .iter()
                    .position(|f| f.queue_count > 0 && f.queue_flags.intersects(transfer))
                    .map(|i| (pd, i as u32))
            })
            .ok_or(VulkanError::NoDevice)?;
        // SAFETY: (V5) `physical` came from this instance.
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
        // SAFETY: (V5) `physical` belongs to `instance`; the create info outlives the call.
        let device = unsafe { instance.create_device(physical, &info, None) }
            .map_err(|r| VulkanError::from_vk("vkCreateDevice", r, 0))?;
        partial.device = Some(device.clone());
        // SAFETY: (V5) queue 0 of `family` was requested above.
        let queue = unsafe { device.get_device_queue(family, 0) };
        let validation = partial.validation.take();
        partial.device = None;
        partial.instance = None;
        // SAFETY: (V1) every handle was just made together, from this entry.
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
pub(super) struct Partial {
    pub(super) instance: Option<ash::Instance>,
    pub(super) validation: Option<Validation>,
    pub(super) device: Option<ash::Device>,
}

impl Drop for Partial {
    fn drop(&mut self) {
        // SAFETY: (V1, V3) each handle was made by `build`, is used by nothing else, and is
        // destroyed once, children before their parent.
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
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// use runcache::vulkan;
///
/// let ctx = VulkanContext::builder().build()?;
/// println!(
///     "{}: {} MiB for constants by default",
///     ctx.device_name(),
///     vulkan::default_capacity(&ctx) >> 20
/// );
/// # Ok::<(), runcache::VulkanError>(())
/// ```
pub struct VulkanContext {
    // Kept for the loader's lifetime: the function pointers below come from it.
    pub(super) _entry: ash::Entry,
    pub(super) instance: ash::Instance,
    pub(super) physical: vk::PhysicalDevice,
    pub(super) device: ash::Device,
    pub(super) queue: vk::Queue,
    pub(super) queue_family: u32,
    /// Whether `VK_EXT_memory_budget` is enabled on the device.
    pub(super) memory_budget: bool,
    /// Whether this context made (and so destroys) the instance and device.
    pub(super) owned: bool,
    pub(super) validation: Option<Validation>,
    pub(super) queue_lock: Mutex<()>,
    pub(super) properties: vk::PhysicalDeviceProperties,
    pub(super) memory: vk::PhysicalDeviceMemoryProperties,
    pub(super) max_allocation_size: u64,
    /// The index of the largest device-local heap.
    pub(super) device_heap: Option<usize>,
    /// A budget for that heap that overrides what the driver reports (`NO_OVERRIDE`: none),
    /// for tests of the paths that follow the budget on drivers whose budget never moves.
    pub(super) budget_override: AtomicU64,
}

/// `budget_override` when nothing overrides the driver's budget.
const NO_OVERRIDE: u64 = u64::MAX;

// SAFETY: (V2) Vulkan handles may be used from any thread; the calls that need external
// synchronization (queue submission) go through `queue_lock`, and command pools are owned by
// one staging slot at a time.
unsafe impl Send for VulkanContext {}
// SAFETY: (V2) as above.
unsafe impl Sync for VulkanContext {}

impl VulkanContext {
    /// A builder for a context with its own instance and device (the convenience path for
    /// programs that have no Vulkan objects of their own).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let ctx = VulkanContext::builder().build()?;
    /// assert!(!ctx.validation_enabled());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
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
        // SAFETY: (V1) the caller's contract.
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
    pub(super) unsafe fn assemble(
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
        // SAFETY: (V5) `physical` belongs to `instance` (the caller's contract).
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
            // SAFETY: (V5) a 1.1 device and a 1.1 instance; the chain outlives the call.
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
            budget_override: AtomicU64::new(NO_OVERRIDE),
        }
    }

    /// The raw device.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// // SAFETY: the device is alive while the context is.
    /// unsafe { ctx.device().device_wait_idle() }.expect("the device is alive");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn device(&self) -> &ash::Device {
        &self.device
    }

    /// The raw instance.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// // SAFETY: the handles are alive while the context is.
    /// let properties = unsafe { ctx.instance().get_physical_device_properties(ctx.physical_device()) };
    /// println!("API {}", properties.api_version);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn instance(&self) -> &ash::Instance {
        &self.instance
    }

    /// The physical device.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// // SAFETY: the handles are alive while the context is.
    /// let memory = unsafe { ctx.instance().get_physical_device_memory_properties(ctx.physical_device()) };
    /// assert!(memory.memory_heap_count >= 1);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn physical_device(&self) -> vk::PhysicalDevice {
        self.physical
    }

    /// The queue runcache submits its transfers to, and its family.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let (queue, family) = ctx.queue();
    /// println!("{queue:?} of family {family}");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn queue(&self) -> (vk::Queue, u32) {
        (self.queue, self.queue_family)
    }

    /// The lock runcache holds while it submits to [`queue`](Self::queue). An application that
    /// submits to the same queue from other threads takes it too (Vulkan requires queue
    /// submissions to be externally synchronized).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let (queue, _) = ctx.queue();
    /// let _submitting = ctx.queue_lock(); // runcache's transfers wait meanwhile
    /// // SAFETY: the queue is alive, and the lock makes this the only submitter.
    /// unsafe { ctx.device().queue_wait_idle(queue) }.expect("the queue is alive");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn queue_lock(&self) -> MutexGuard<'_, ()> {
        lock(&self.queue_lock)
    }

    /// The device's name, as the driver reports it.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// println!("uploading to {}", ctx.device_name());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn device_name(&self) -> String {
        self.properties
            .device_name_as_c_str()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// `maxMemoryAllocationSize`: the largest single allocation the device accepts.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// assert!(ctx.max_allocation_size() >= 1 << 30, "Vulkan 1.1 guarantees 1 GiB");
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn max_allocation_size(&self) -> u64 {
        self.max_allocation_size
    }

    /// `maxStorageBufferRange`: the largest range a storage-buffer descriptor may bind, and so
    /// the largest buffer the allocator makes (each is bound whole as a storage buffer).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// println!("bind at most {} MiB at once", ctx.max_storage_buffer_range() >> 20);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn max_storage_buffer_range(&self) -> u64 {
        u64::from(self.properties.limits.max_storage_buffer_range)
    }

    /// Whether `VK_EXT_memory_budget` is enabled.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// if ctx.has_memory_budget() {
    ///     assert!(ctx.heaps().iter().all(|h| h.budget.is_some()));
    /// }
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn has_memory_budget(&self) -> bool {
        self.memory_budget
    }

    /// Every memory heap, with this process's budget and usage when `VK_EXT_memory_budget` is
    /// enabled (queried now: the budget changes as other processes use the device).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let device_local: u64 = ctx.heaps().iter().filter(|h| h.device_local).map(|h| h.size).sum();
    /// println!("{} MiB of device-local memory", device_local >> 20);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn heaps(&self) -> Vec<HeapBudget> {
        let budget = self.budget();
        (0..self.memory.memory_heap_count as usize)
            .map(|i| self.heap(i, budget.as_ref()))
            .collect()
    }

    pub(super) fn heap(
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
    pub(super) fn budget(&self) -> Option<vk::PhysicalDeviceMemoryBudgetPropertiesEXT<'static>> {
        if !self.memory_budget {
            return None;
        }
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mut p2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: (V5) the extension is enabled (the constructor's contract); the chain outlives
        // the call.
        unsafe {
            self.instance
                .get_physical_device_memory_properties2(self.physical, &mut p2)
        };
        budget.p_next = std::ptr::null_mut();
        Some(budget)
    }

    /// The largest device-local heap (the one constant buffers go to), with its budget (or
    /// the budget [`__override_budget`](Self::__override_budget) set).
    pub(crate) fn device_heap(&self) -> Option<HeapBudget> {
        let i = self.device_heap?;
        let mut heap = self.heap(i, self.budget().as_ref());
        // Relaxed: a test's setting, read on its own.
        let forced = self.budget_override.load(Ordering::Relaxed);
        if forced != NO_OVERRIDE {
            heap.budget = Some(forced);
            heap.usage = Some(0);
        }
        Some(heap)
    }

    /// Fault injection, for tests: from now on the largest device-local heap's budget reads
    /// as `bytes` and its usage as 0 (`None`: as the driver reports them again), as if other
    /// work on the device had taken or given back memory. The allocator's budget checks and
    /// [`follow_budget`](super::follow_budget) see it; [`heaps`](Self::heaps) does not. Not
    /// part of the stable API.
    #[doc(hidden)]
    pub fn __override_budget(&self, bytes: Option<u64>) {
        // Relaxed: see `device_heap`.
        self.budget_override
            .store(bytes.unwrap_or(NO_OVERRIDE), Ordering::Relaxed);
    }

    pub(super) fn memory_type_flags(&self, memory_type_index: u32) -> vk::MemoryPropertyFlags {
        self.memory.memory_types[memory_type_index as usize].property_flags
    }

    /// Validation errors reported so far (always 0 without validation).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let ctx = VulkanContext::builder().validation(true).build()?;
    /// let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let _ = gpu.upload(&[0u8; 64])?;
    /// assert_eq!(ctx.validation_errors(), 0);
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn validation_errors(&self) -> u64 {
        self.validation
            .as_ref()
            .map_or(0, |v| v.sink.errors.load(Ordering::Relaxed))
    }

    /// Takes the validation messages received so far (errors and warnings) and resets the
    /// error count: for tests that provoke a message on purpose.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let ctx = VulkanContext::builder().validation(true).build()?;
    /// let first = ctx.take_validation_messages();
    /// assert!(ctx.take_validation_messages().len() <= first.len() || first.is_empty());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
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

    /// The validation messages, in a log that outlives the context (`None` without
    /// validation): a test drops the context and then checks that destroying the device
    /// reported nothing, such as an object never destroyed.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// assert!(VulkanContext::builder().build()?.validation_log().is_none());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn validation_log(&self) -> Option<ValidationLog> {
        self.validation
            .as_ref()
            .map(|v| ValidationLog(Arc::clone(&v.sink)))
    }

    /// Whether validation is on.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// assert!(VulkanContext::builder().validation(true).build()?.validation_enabled());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn validation_enabled(&self) -> bool {
        self.validation.is_some()
    }
}

impl Drop for VulkanContext {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: (V1, V3) this context made the device and instance; everything made from them
        // holds an `Arc` of the context, so nothing is left that uses them. Children go first.
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
