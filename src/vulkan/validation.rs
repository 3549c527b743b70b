//! Validation-layer messages: the callback that counts and keeps them, and the log a
//! test reads, which outlives its context.

#![allow(unsafe_code)]

use super::lock;
use crate::sync::{AtomicU64, Ordering};
use ash::vk;
use std::ffi::{c_void, CStr};
use std::fmt;
use std::sync::{Arc, Mutex};

pub(super) const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Validation-layer messages received by a context made with validation on.
#[derive(Debug, Default)]
pub(super) struct ValidationSink {
    pub(super) errors: AtomicU64,
    pub(super) warnings: AtomicU64,
    pub(super) messages: Mutex<Vec<String>>,
}

/// Receives validation messages. Runs on whatever thread made the failing call.
pub(super) unsafe extern "system" fn on_validation_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: (V1) `user` is the `ValidationSink` the context registered, behind an `Arc`
    // and alive until the messenger is destroyed; the layer passes valid callback data whose
    // `p_message`, when not null, is a NUL-terminated string.
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

pub(super) struct Validation {
    pub(super) loader: ash::ext::debug_utils::Instance,
    pub(super) messenger: vk::DebugUtilsMessengerEXT,
    pub(super) sink: Arc<ValidationSink>,
}

/// The validation messages of a context, kept past its end: read it after the context is
/// dropped to see what the layer said at `vkDestroyDevice` (objects never destroyed, for
/// one). From [`VulkanContext::validation_log`](super::VulkanContext::validation_log).
///
/// ```no_run
/// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
/// # let ctx = VulkanContext::builder().build()?;
/// # let gpu = VulkanAllocator::new(ctx.clone())?;
/// let ctx = VulkanContext::builder().validation(true).build()?;
/// let log = ctx.validation_log().expect("validation is on");
/// drop(ctx);
/// assert_eq!(log.errors(), 0, "the log outlives the context");
/// # Ok::<(), runcache::VulkanError>(())
/// ```
#[derive(Clone)]
pub struct ValidationLog(pub(super) Arc<ValidationSink>);

impl ValidationLog {
    /// Errors reported since the last [`VulkanContext::take_validation_messages`](super::VulkanContext::take_validation_messages).
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let ctx = VulkanContext::builder().validation(true).build()?;
    /// let log = ctx.validation_log().unwrap();
    /// assert_eq!(log.errors(), ctx.validation_errors());
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn errors(&self) -> u64 {
        // Relaxed: a count read after the fact.
        self.0.errors.load(Ordering::Relaxed)
    }

    /// The messages (errors and warnings) received and not yet taken.
    ///
    /// ```no_run
    /// # use runcache::vulkan::{VulkanAllocator, VulkanContext};
    /// # let ctx = VulkanContext::builder().build()?;
    /// # let gpu = VulkanAllocator::new(ctx.clone())?;
    /// let ctx = VulkanContext::builder().validation(true).build()?;
    /// for message in ctx.validation_log().unwrap().messages() {
    ///     eprintln!("{message}");
    /// }
    /// # Ok::<(), runcache::VulkanError>(())
    /// ```
    pub fn messages(&self) -> Vec<String> {
        lock(&self.0.messages).clone()
    }
}

impl fmt::Debug for ValidationLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValidationLog")
            .field("errors", &self.errors())
            .finish_non_exhaustive()
    }
}
