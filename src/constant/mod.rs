//! Constant tensor caches: one per device kind, with byte budgets, environment configuration
//! and reference-counted buffers.
//!
//! Inference runtimes compute processed constant tensors — reordered weights, folded scales —
//! in the first iteration and reuse them in every later one, from many threads at once. This
//! is oneDNN Graph's constant tensor cache (its capacity-control RFC), done with runcache's
//! core:
//!
//! - [`ConstantCache::get_or_add`] has promise semantics: the first caller builds the buffer,
//!   concurrent callers for the same key wait and receive the same buffer, and a buffer that
//!   does not fit is still returned to its caller, uncached. [`Added::source`] says which.
//! - The budget is in bytes, exact at every instant; when full, new buffers are rejected (no
//!   eviction at insert), or, in a cache made by [`ConstantCache::evicting`], cached ones are
//!   evicted to make room. Shrinking the capacity removes least-recently-used buffers until
//!   the rest fits; growing it keeps everything; 0 clears and disables.
//! - [`ConstantCache::size`] never blocks on a pending build, and
//!   [`ConstantCache::pinned_bytes`] reports buffers that left the cache (or never entered it)
//!   but that callers still hold, so `size() + pinned_bytes()` is the real footprint.
//!
//! # Process-wide caches
//!
//! [`cache`] returns the process-wide cache of a device kind. Their capacities start at 0
//! (off), or at the values of the `RUNCACHE_CONSTANT_CACHE_CAPACITY` environment variable
//! (`cpu:10240;gpu:2048`, MiB), read once on first use; `RUNCACHE_CONSTANT_CACHE_IDLE_SECS`
//! gives them an idle time ([`IDLE_ENV_VAR`]). [`set_capacity_mb`] and
//! [`set_enabled`] override it. A bad value is reported once through the `log` crate, kept in
//! [`env_report`], and leaves only the bad field's kind at its default.
//!
//! ```
//! use runcache::constant::{ConstantCache, ConstantKey};
//! use runcache::{ConstantBuffer, DeviceKind, Source};
//!
//! let weights = ConstantCache::new(DeviceKind::Cpu);
//! weights.set_capacity_mb(64);
//! let key = ConstantKey::new(1, 0xC0FFEE); // (backend id, the backend's own key)
//! let added = weights
//!     .get_or_add(key, 4096, || {
//!         let mut buffer = ConstantBuffer::host(4096)?;
//!         buffer.as_mut_slice().unwrap().fill(7); // reorder the weights here
//!         Ok::<_, runcache::AllocError>(buffer)
//!     })
//!     .unwrap();
//! assert_eq!(added.source, Source::Cached);
//! assert_eq!(weights.size(), 4096);
//! ```

// No unsafe code here; the crate-wide `deny(unsafe_code)` holds, and only the child module
// that needs unsafe allows it (a `forbid` here would bind the children too).

mod alloc;
mod buffer;
mod builder;
mod config;
mod global;
mod key;

pub use alloc::{AllocError, BufferAllocator, DeviceKind, HostAllocator};
pub use buffer::{ConstantBuffer, DeviceMemory};
pub use builder::ConstantCacheBuilder;
pub use config::{
    parse_capacity_config, CapacityConfig, CapacityParseError, CapacityParseErrorKind,
    ParsedCapacity, MAX_CAPACITY_MB,
};
pub use global::{
    cache, capacity_mb, env_capacity_mb, env_report, is_enabled, parse_idle_secs, set_capacity_mb,
    set_enabled, EnvReport, IdleParseError,
};
pub use key::{AddError, Added, ConstantKey};

use crate::cache::{Cache, Fetched, Handle, Source, Stats};
use crate::error::BuildError;
use crate::sync::{AtomicU64, Ordering};
use buffer::Ledger;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

/// The environment variable read by the process-wide caches.
pub const ENV_VAR: &str = "RUNCACHE_CONSTANT_CACHE_CAPACITY";

/// The environment variable that gives every process-wide cache an idle time, in whole
/// seconds (see [`ConstantCacheBuilder::time_to_idle`]): `600` takes out the buffers no
/// lookup asked for in ten minutes. Read once, on first use, with [`ENV_VAR`]; unset, the
/// caches keep no idle time.
pub const IDLE_ENV_VAR: &str = "RUNCACHE_CONSTANT_CACHE_IDLE_SECS";

pub(crate) const MIB: u64 = 1 << 20;

/// A cache of constant buffers for one device kind, with a byte budget.
///
/// ```
/// use runcache::constant::{ConstantCache, ConstantKey};
/// use runcache::{ConstantBuffer, DeviceKind, Source};
///
/// let weights = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 8 << 10);
/// let reorder = |bytes: usize| {
///     let mut buffer = ConstantBuffer::host(bytes)?;
///     buffer.as_mut_slice().unwrap().fill(1);
///     Ok::<_, runcache::AllocError>(buffer)
/// };
/// for layer in 0..3 {
///     let added = weights.get_or_add(ConstantKey::new(0, layer), 4 << 10, || reorder(4 << 10)).unwrap();
///     let expected = if layer < 2 { Source::Cached } else { Source::Uncached };
///     assert_eq!(added.source, expected, "the third layer does not fit: rejected, not evicting");
/// }
/// assert_eq!((weights.len(), weights.size()), (2, 8 << 10));
/// ```
pub struct ConstantCache {
    device: DeviceKind,
    cache: Cache<ConstantKey, ConstantBuffer>,
    /// Recency clock: advanced by every build; hits stamp their buffer with it.
    clock: AtomicU64,
    /// The idle time its builder gave it.
    idle: Option<std::time::Duration>,
    ledger: Arc<Ledger>,
}

// As the core cache (`Cache`'s impls): a panic of a build or an allocator leaves the cache
// and its ledger consistent; the allocator behind a buffer is the caller's own code.
impl std::panic::RefUnwindSafe for ConstantCache {}
impl std::panic::UnwindSafe for ConstantCache {}

impl ConstantCache {
    /// A cache for `device` with capacity 0: off until a capacity is set.
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// let cache = ConstantCache::new(DeviceKind::Cpu);
    /// assert_eq!(cache.capacity(), 0, "off until a capacity is set");
    /// cache.set_capacity_mb(16);
    /// assert_eq!(cache.capacity(), 16 << 20);
    /// ```
    pub fn new(device: DeviceKind) -> Self {
        Self::builder(device).build()
    }

    /// A builder for a cache of `device`: its budget, what it does when full, and how long
    /// a buffer nobody asks for keeps its bytes
    /// ([`time_to_idle`](ConstantCacheBuilder::time_to_idle)).
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// let cache = ConstantCache::builder(DeviceKind::Cpu).capacity_mb(16).build();
    /// assert_eq!(cache.capacity(), 16 << 20);
    /// ```
    pub fn builder(device: DeviceKind) -> ConstantCacheBuilder {
        ConstantCacheBuilder::new(device)
    }

    /// A cache for `device` holding at most `bytes` bytes.
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Gpu, 3 << 20);
    /// assert_eq!((cache.device(), cache.capacity_mb()), (DeviceKind::Gpu, 3));
    /// ```
    pub fn with_capacity_bytes(device: DeviceKind, bytes: u64) -> Self {
        Self::builder(device).capacity_bytes(bytes).build()
    }

    /// A cache for `device` holding at most `bytes` bytes that makes room for a new buffer
    /// by evicting cached ones (runcache's scan-resistant policy,
    /// [`WhenFull::Evict`](crate::WhenFull::Evict)) instead of refusing it: for many models under one budget whose popularity moves,
    /// where a rejecting cache would keep the first models' weights for good. A buffer
    /// heavier than the whole budget is still refused (returned to its caller uncached), and
    /// an evicted buffer that callers hold counts in [`pinned_bytes`](Self::pinned_bytes)
    /// until they let go. Shrinks by [`set_capacity_bytes`](Self::set_capacity_bytes) still
    /// remove the least recently used first.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind, Source};
    ///
    /// let weights = ConstantCache::evicting(DeviceKind::Cpu, 8 << 10);
    /// for model in 0..3 {
    ///     let added = weights
    ///         .get_or_add(ConstantKey::new(model, 0), 4 << 10, || ConstantBuffer::host(4 << 10))
    ///         .unwrap();
    ///     assert_eq!(added.source, Source::Cached, "room is made for every model in turn");
    /// }
    /// assert_eq!((weights.len(), weights.size()), (2, 8 << 10));
    /// ```
    pub fn evicting(device: DeviceKind, bytes: u64) -> Self {
        Self::builder(device)
            .capacity_bytes(bytes)
            .evicting()
            .build()
    }

    /// A constant cache over `cache`, whose listener marks each buffer that leaves as
    /// outside (the builder's).
    fn from_core(
        device: DeviceKind,
        cache: Cache<ConstantKey, ConstantBuffer>,
        idle: Option<std::time::Duration>,
    ) -> Self {
        Self {
            idle,
            device,
            cache,
            clock: AtomicU64::new(1),
            ledger: Arc::default(),
        }
    }

    /// How long a buffer no lookup asks for keeps its bytes, if the cache has an idle time
    /// (see [`ConstantCacheBuilder::time_to_idle`], and [`IDLE_ENV_VAR`] for the
    /// process-wide caches).
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    /// use std::time::Duration;
    ///
    /// let cache = ConstantCache::builder(DeviceKind::Cpu).time_to_idle(Duration::from_secs(60)).build();
    /// assert_eq!(cache.time_to_idle(), Some(Duration::from_secs(60)));
    /// assert_eq!(ConstantCache::new(DeviceKind::Cpu).time_to_idle(), None);
    /// ```
    pub fn time_to_idle(&self) -> Option<std::time::Duration> {
        self.idle
    }

    /// The device kind of this cache.
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// assert_eq!(ConstantCache::new(DeviceKind::Gpu).device(), DeviceKind::Gpu);
    /// ```
    pub fn device(&self) -> DeviceKind {
        self.device
    }

    /// The buffer for `key`, built by `build` if missing; `size_bytes` is the size the buffer
    /// will have. Single-flight: concurrent callers for one key share one build. A buffer that
    /// does not fit is returned to its caller (and to those waiting on it) but not cached.
    ///
    /// # Errors
    /// [`AddError`], shared by this caller and everyone who waited on the same attempt: the
    /// builder's error, or a built buffer of another size or device (handed back inside the
    /// error). Nothing is cached; the next call builds again. [`AddError::Recursion`] if
    /// `build` asks for its own key on its own thread.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind, Source};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
    /// let key = ConstantKey::new(0, 7);
    /// let first = cache.get_or_add(key, 256, || ConstantBuffer::host(256)).unwrap();
    /// assert_eq!(first.source, Source::Cached);
    /// let second = cache.get_or_add(key, 256, || -> Result<_, runcache::AllocError> { unreachable!() });
    /// assert_eq!(second.unwrap().source, Source::Hit);
    /// // A failed build reaches its caller and is not cached.
    /// let failed = cache.get_or_add(ConstantKey::new(0, 8), 64, || Err("reorder failed"));
    /// assert!(failed.is_err());
    /// assert_eq!(cache.len(), 1);
    /// ```
    pub fn get_or_add<E>(
        &self,
        key: ConstantKey,
        size_bytes: usize,
        build: impl FnOnce() -> Result<ConstantBuffer, E>,
    ) -> Result<Added, Arc<AddError<E>>>
    where
        E: Send + Sync + 'static,
    {
        let fetched = self
            .cache
            .get_or_build(key, |_| {
                let now = self.tick();
                self.check(build(), size_bytes, now)
            })
            .map_err(add_error)?;
        Ok(self.added(fetched))
    }

    /// The async form of [`get_or_add`](Self::get_or_add): `build` is polled only on a miss,
    /// by one caller per key at a time, and concurrent callers wait without blocking their
    /// thread (as [`Cache::get_or_insert_with_async`]). Dropping the building caller's future
    /// hands the build to a waiting caller.
    ///
    /// # Errors
    /// As [`get_or_add`](Self::get_or_add), and [`AddError::Recursion`] if `build` asks for
    /// its own key from inside its poll.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind, Source};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
    /// let added = cache
    ///     .get_or_add_async(ConstantKey::new(0, 1), 512, async { ConstantBuffer::host(512) })
    ///     .await
    ///     .unwrap();
    /// assert_eq!((added.source, cache.size()), (Source::Cached, 512));
    /// # });
    /// ```
    pub async fn get_or_add_async<E, F>(
        &self,
        key: ConstantKey,
        size_bytes: usize,
        build: F,
    ) -> Result<Added, Arc<AddError<E>>>
    where
        E: Send + Sync + 'static,
        F: Future<Output = Result<ConstantBuffer, E>>,
    {
        let fetched = self
            .cache
            .get_or_build_async(key, async {
                let now = self.tick();
                self.check(build.await, size_bytes, now)
            })
            .await
            .map_err(add_error)?;
        Ok(self.added(fetched))
    }

    /// Advances the recency clock for a build starting now; returns the new time.
    fn tick(&self) -> u64 {
        // Relaxed: a recency clock; nothing is published through it.
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A built buffer, accounted from `now`, if it has the declared size and this cache's
    /// device; else the error, with the buffer handed back.
    fn check<E>(
        &self,
        built: Result<ConstantBuffer, E>,
        size_bytes: usize,
        now: u64,
    ) -> Result<ConstantBuffer, AddError<E>> {
        let buffer = built.map_err(AddError::Build)?;
        buffer.attach(&self.ledger, now);
        if buffer.size() != size_bytes {
            let buffer = Handle::new(buffer);
            buffer.mark_outside();
            return Err(AddError::SizeMismatch {
                declared: size_bytes,
                buffer,
            });
        }
        if buffer.device() != self.device {
            let buffer = Handle::new(buffer);
            buffer.mark_outside();
            return Err(AddError::WrongDevice {
                expected: self.device,
                buffer,
            });
        }
        Ok(buffer)
    }

    /// What a single-flight lookup hands out, with the buffer's accounting updated for how
    /// it was served.
    fn added(&self, fetched: Fetched<ConstantBuffer>) -> Added {
        match fetched.source {
            Source::Uncached => {
                // The attempt's record still holds the buffer for late waiters; let it go, so
                // the buffer lives exactly as long as its callers hold it.
                self.cache.reclaim();
                fetched.value.mark_outside();
                // Relaxed: a byte statistic.
                self.ledger
                    .rejected
                    .fetch_add(fetched.value.size() as u64, Ordering::Relaxed);
            }
            Source::Cached => {}
            _ => fetched.value.touch(self.clock.load(Ordering::Relaxed)),
        }
        Added {
            buffer: fetched.value,
            source: fetched.source,
        }
    }

    /// The cached buffer for `key`, if any.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
    /// let key = ConstantKey::new(0, 1);
    /// assert!(cache.get(key).is_none());
    /// cache.get_or_add(key, 64, || ConstantBuffer::host(64)).unwrap();
    /// assert_eq!(cache.get(key).unwrap().size(), 64);
    /// ```
    pub fn get(&self, key: ConstantKey) -> Option<Handle<ConstantBuffer>> {
        let buffer = self.cache.get(&key)?;
        // Relaxed: see `get_or_add`.
        buffer.touch(self.clock.load(Ordering::Relaxed));
        Some(buffer)
    }

    /// Removes the buffer for `key` if it is cached; returns whether it was. Callers that
    /// hold the buffer keep it (it then counts in [`pinned_bytes`](Self::pinned_bytes)).
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
    /// let key = ConstantKey::new(0, 1);
    /// let held = cache.get_or_add(key, 64, || ConstantBuffer::host(64)).unwrap().buffer;
    /// assert!(cache.remove_if_exist(key));
    /// assert!(!cache.remove_if_exist(key));
    /// assert_eq!((cache.size(), cache.pinned_bytes()), (0, 64), "held outside the cache");
    /// drop(held);
    /// assert_eq!(cache.pinned_bytes(), 0);
    /// ```
    pub fn remove_if_exist(&self, key: ConstantKey) -> bool {
        let removed = self.cache.remove(&key).is_some();
        self.cache.reclaim();
        removed
    }

    /// Removes every cached buffer. Buffers nobody holds are freed before it returns (unless
    /// another thread is in the middle of a lookup that could still see them).
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
    /// for k in 0..4 {
    ///     cache.get_or_add(ConstantKey::new(0, k), 64, || ConstantBuffer::host(64)).unwrap();
    /// }
    /// cache.clear();
    /// assert_eq!((cache.len(), cache.size(), cache.pinned_bytes()), (0, 0, 0));
    /// ```
    pub fn clear(&self) {
        self.cache.clear();
        self.cache.reclaim();
    }

    /// Takes out every buffer past its idle time (see
    /// [`time_to_idle`](ConstantCacheBuilder::time_to_idle)) and frees those nobody holds;
    /// returns how many left. Builds do this a little at a time already: call it where the
    /// cache may sit without builds while its bytes should come back (a timer of the
    /// runtime's). Without an idle time it does nothing.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{Clock, ConstantBuffer, DeviceKind};
    /// use std::time::Duration;
    ///
    /// let (clock, hand) = Clock::manual();
    /// let cache = ConstantCache::builder(DeviceKind::Cpu)
    ///     .capacity_bytes(1 << 20)
    ///     .time_to_idle(Duration::from_secs(60))
    ///     .clock(clock)
    ///     .build();
    /// for layer in 0..4 {
    ///     cache.get_or_add(ConstantKey::new(0, layer), 1024, || ConstantBuffer::host(1024)).unwrap();
    /// }
    /// hand.advance(Duration::from_secs(30));
    /// cache.get(ConstantKey::new(0, 0)); // in use: its idle time starts again
    /// hand.advance(Duration::from_secs(30));
    /// assert_eq!(cache.purge_expired(), 3);
    /// assert_eq!((cache.len(), cache.size()), (1, 1024));
    /// ```
    pub fn purge_expired(&self) -> usize {
        let out = self.cache.purge_expired();
        self.cache.reclaim();
        out
    }

    /// For tests: holds this cache's epoch on the calling thread, as a reader in the middle of
    /// a lookup does, until the handle drops (so buffers removed meanwhile cannot be freed).
    #[doc(hidden)]
    pub fn __hold_epoch(&self) -> crate::cache::Pinned<'_, ConstantKey, ConstantBuffer> {
        self.cache.pin()
    }

    /// Bytes of cached buffers. Never blocks, not even while a build is in flight.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
    /// cache.get_or_add(ConstantKey::new(0, 1), 1000, || ConstantBuffer::host(1000)).unwrap();
    /// cache.get_or_add(ConstantKey::new(0, 2), 24, || ConstantBuffer::host(24)).unwrap();
    /// assert_eq!(cache.size(), 1024);
    /// ```
    pub fn size(&self) -> u64 {
        self.cache.weighted_size()
    }

    /// Bytes cached and the capacity, read together in one atomic load: the first is never
    /// above the second, even while other threads change either.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 4096);
    /// cache.get_or_add(ConstantKey::new(0, 1), 1024, || ConstantBuffer::host(1024)).unwrap();
    /// let (size, capacity) = cache.size_and_capacity();
    /// assert_eq!((size, capacity), (1024, 4096));
    /// ```
    pub fn size_and_capacity(&self) -> (u64, u64) {
        self.cache.weighted_size_and_capacity()
    }

    /// The capacity in bytes.
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 5000);
    /// assert_eq!(cache.capacity(), 5000);
    /// ```
    pub fn capacity(&self) -> u64 {
        self.cache.capacity()
    }

    /// The capacity in MiB (rounded down).
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, (3 << 20) + 5);
    /// assert_eq!(cache.capacity_mb(), 3, "rounded down");
    /// ```
    pub fn capacity_mb(&self) -> u64 {
        self.capacity() / MIB
    }

    /// Sets the capacity in bytes: a larger one keeps every buffer, a smaller one removes the
    /// least recently used until the rest fits, 0 clears the cache and turns it off. A
    /// [`CapacityError`](crate::CapacityError) if buffers still being added held weight the
    /// shrink could not free (the capacity stays where it got to; see
    /// [`Cache::set_capacity`](crate::Cache::set_capacity)).
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 300);
    /// for k in 0..3 {
    ///     cache.get_or_add(ConstantKey::new(0, k), 100, || ConstantBuffer::host(100)).unwrap();
    /// }
    /// cache.get(ConstantKey::new(0, 0)); // key 0 is now the most recently used
    /// cache.set_capacity_bytes(200)?; // removes the least recently used, key 1
    /// assert!(cache.get(ConstantKey::new(0, 0)).is_some());
    /// assert!(cache.get(ConstantKey::new(0, 1)).is_none());
    /// # Ok::<(), runcache::CapacityError>(())
    /// ```
    pub fn set_capacity_bytes(&self, bytes: u64) -> Result<(), crate::error::CapacityError> {
        let shrunk = self.cache.set_capacity_by(bytes, |_, b| b.last_used());
        self.cache.reclaim();
        shrunk
    }

    /// Sets the capacity in MiB (saturating at `u64::MAX` bytes); see
    /// [`set_capacity_bytes`](Self::set_capacity_bytes).
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// let cache = ConstantCache::new(DeviceKind::Cpu);
    /// cache.set_capacity_mb(2)?;
    /// assert_eq!(cache.capacity(), 2 << 20);
    /// cache.set_capacity_mb(u64::MAX)?;
    /// assert_eq!(cache.capacity(), u64::MAX, "saturates");
    /// # Ok::<(), runcache::CapacityError>(())
    /// ```
    pub fn set_capacity_mb(&self, mb: u64) -> Result<(), crate::error::CapacityError> {
        self.set_capacity_bytes(mb.saturating_mul(MIB))
    }

    /// Bytes of buffers that are not in the cache — evicted, removed, or built but not cached
    /// — and still allocated: because callers hold them, or, for a moment after the last
    /// holder lets go, because epoch reclamation has not run yet.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 100);
    /// // Does not fit: handed back uncached, and counted as pinned while held.
    /// let big = cache.get_or_add(ConstantKey::new(0, 1), 400, || ConstantBuffer::host(400)).unwrap();
    /// assert_eq!(cache.size() + cache.pinned_bytes(), 400, "the real footprint");
    /// drop(big);
    /// assert_eq!(cache.pinned_bytes(), 0);
    /// ```
    pub fn pinned_bytes(&self) -> u64 {
        // Relaxed: a byte statistic.
        self.ledger.pinned.load(Ordering::Relaxed)
    }

    /// Bytes of buffers built by this cache's callers that did not fit, since creation.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 100);
    /// cache.get_or_add(ConstantKey::new(0, 1), 60, || ConstantBuffer::host(60)).unwrap();
    /// cache.get_or_add(ConstantKey::new(0, 2), 60, || ConstantBuffer::host(60)).unwrap();
    /// assert_eq!(cache.rejected_bytes(), 60, "the second did not fit");
    /// ```
    pub fn rejected_bytes(&self) -> u64 {
        // Relaxed: a byte statistic.
        self.ledger.rejected.load(Ordering::Relaxed)
    }

    /// The number of cached buffers.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
    /// cache.get_or_add(ConstantKey::new(0, 1), 8, || ConstantBuffer::host(8)).unwrap();
    /// assert_eq!(cache.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether no buffer is cached.
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// assert!(ConstantCache::new(DeviceKind::Cpu).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// The activity counters of the underlying cache.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind};
    ///
    /// let cache = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
    /// let key = ConstantKey::new(0, 1);
    /// for _ in 0..3 {
    ///     cache.get_or_add(key, 8, || ConstantBuffer::host(8)).unwrap();
    /// }
    /// let stats = cache.stats();
    /// assert_eq!((stats.builds, stats.hits), (1, 2));
    /// ```
    pub fn stats(&self) -> Stats {
        self.cache.stats()
    }
}

/// The error of a failed `get_or_add`: the build's (or the check's) error, shared with every
/// caller that waited on the attempt, or the key of a build that asked for its own key.
fn add_error<E>(e: BuildError<ConstantKey, AddError<E>>) -> Arc<AddError<E>> {
    match e {
        BuildError::Failed(e) => e,
        BuildError::Recursion(r) => Arc::new(AddError::Recursion { key: r.key }),
    }
}

impl fmt::Debug for ConstantCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConstantCache")
            .field("device", &self.device)
            .field("size", &self.size())
            .field("capacity", &self.capacity())
            .field("pinned_bytes", &self.pinned_bytes())
            .finish()
    }
}
