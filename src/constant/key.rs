//! A constant's key, and what a lookup hands back: the buffer with where it came from, or why
//! there is none.

use super::{ConstantBuffer, DeviceKind};
use crate::cache::{Handle, Source};
use std::fmt;

/// A constant's key: the backend's id and the backend's own key, both kept whole.
///
/// (oneDNN packs them into one `size_t` by shifting the backend key left by 4, losing its top
/// bits; two keys that differ only there collide. Here they cannot.)
///
/// ```
/// use runcache::constant::ConstantKey;
///
/// // Both halves are kept whole: keys that differ only in their top bits stay apart.
/// let a = ConstantKey::new(1, u64::MAX);
/// let b = ConstantKey::new(1, u64::MAX >> 4);
/// assert_ne!(a, b);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConstantKey {
    /// Which backend made the constant.
    pub backend: u64,
    /// The backend's own key for it.
    pub key: u64,
}

impl ConstantKey {
    /// A key from a backend id and the backend's own key.
    ///
    /// ```
    /// use runcache::constant::ConstantKey;
    ///
    /// const WEIGHTS: ConstantKey = ConstantKey::new(2, 0xBEEF);
    /// assert_eq!((WEIGHTS.backend, WEIGHTS.key), (2, 0xBEEF));
    /// ```
    pub const fn new(backend: u64, key: u64) -> Self {
        Self { backend, key }
    }
}

/// Why [`ConstantCache::get_or_add`](super::ConstantCache::get_or_add) returned no buffer.
/// Shared (in an `Arc`) by the caller that built and every caller that waited on that
/// attempt; nothing is cached.
///
/// ```
/// use runcache::constant::{AddError, ConstantCache, ConstantKey};
/// use runcache::{ConstantBuffer, DeviceKind};
///
/// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
/// // The builder made 64 bytes where the caller declared 100.
/// let err = cache
///     .get_or_add(ConstantKey::new(0, 1), 100, || ConstantBuffer::host(64))
///     .unwrap_err();
/// match &*err {
///     AddError::SizeMismatch { declared, buffer } => assert_eq!((*declared, buffer.size()), (100, 64)),
///     other => panic!("unexpected error: {other}"),
/// }
/// assert!(cache.is_empty(), "nothing is cached");
/// ```
#[non_exhaustive]
pub enum AddError<E> {
    /// The builder failed.
    Build(E),
    /// The built buffer's size differs from the size the caller declared.
    SizeMismatch {
        /// The size passed to `get_or_add`.
        declared: usize,
        /// The buffer that was built, handed back.
        buffer: Handle<ConstantBuffer>,
    },
    /// The built buffer belongs to another device than the cache.
    WrongDevice {
        /// The cache's device.
        expected: DeviceKind,
        /// The buffer that was built, handed back.
        buffer: Handle<ConstantBuffer>,
    },
    /// A build asked for the key it is building: a blocking one
    /// ([`ConstantCache::get_or_add`](super::ConstantCache::get_or_add)) on its own thread,
    /// or an async one
    /// ([`ConstantCache::get_or_add_async`](super::ConstantCache::get_or_add_async)) from
    /// inside its own poll. Waiting would wait for itself; nothing was built by the call
    /// that got this.
    Recursion {
        /// The key that was asked for.
        key: ConstantKey,
    },
}

impl<E: fmt::Display> fmt::Display for AddError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddError::Build(e) => write!(f, "building the constant buffer failed: {e}"),
            AddError::SizeMismatch { declared, buffer } => write!(
                f,
                "the built constant buffer has {} bytes but {declared} were declared",
                buffer.size()
            ),
            AddError::WrongDevice { expected, buffer } => write!(
                f,
                "the built constant buffer is {} memory but the cache is for {expected}",
                buffer.device()
            ),
            AddError::Recursion { key } => write!(
                f,
                "the build of constant {key:?} asked for that same constant from inside its own \
                 poll: waiting would wait for itself forever"
            ),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for AddError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddError::Build(e) => f.debug_tuple("Build").field(e).finish(),
            AddError::SizeMismatch { declared, buffer } => f
                .debug_struct("SizeMismatch")
                .field("declared", declared)
                .field("actual", &buffer.size())
                .finish(),
            AddError::WrongDevice { expected, buffer } => f
                .debug_struct("WrongDevice")
                .field("expected", expected)
                .field("actual", &buffer.device())
                .finish(),
            AddError::Recursion { key } => f.debug_struct("Recursion").field("key", key).finish(),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for AddError<E> {}

/// A buffer from [`ConstantCache::get_or_add`](super::ConstantCache::get_or_add) and where it
/// came from.
///
/// ```
/// use runcache::constant::{ConstantCache, ConstantKey};
/// use runcache::{ConstantBuffer, DeviceKind, Source};
///
/// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 100);
/// let key = ConstantKey::new(0, 1);
/// // 128 bytes do not fit in 100: the caller still gets its buffer, uncached.
/// let added = cache.get_or_add(key, 128, || ConstantBuffer::host(128)).unwrap();
/// assert_eq!((added.source, added.buffer.size()), (Source::Uncached, 128));
/// assert_eq!(cache.rejected_bytes(), 128);
/// ```
#[derive(Debug)]
pub struct Added {
    /// The buffer; it stays alive while held, even after it leaves the cache.
    pub buffer: Handle<ConstantBuffer>,
    /// [`Source::Hit`] (cached), [`Source::Shared`] (built by a concurrent caller),
    /// [`Source::Cached`] (built by this call and cached) or [`Source::Uncached`] (built by
    /// this call but it did not fit).
    pub source: Source,
}
