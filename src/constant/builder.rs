//! The builder of a constant cache: its budget, what it does when full, and how long a
//! buffer nobody asks for keeps its bytes.

use super::{ConstantCache, DeviceKind, MIB};
use crate::cache::{Clock, WhenFull};
use std::time::Duration;

/// Configures a [`ConstantCache`]; made by [`ConstantCache::builder`].
///
/// ```
/// use runcache::constant::ConstantCache;
/// use runcache::DeviceKind;
/// use std::time::Duration;
///
/// let weights = ConstantCache::builder(DeviceKind::Cpu)
///     .capacity_mb(512)
///     .evicting()
///     .time_to_idle(Duration::from_secs(600))
///     .build();
/// assert_eq!(weights.capacity_mb(), 512);
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct ConstantCacheBuilder {
    device: DeviceKind,
    bytes: u64,
    when_full: WhenFull,
    idle: Option<Duration>,
    clock: Option<Clock>,
}

impl ConstantCacheBuilder {
    pub(super) fn new(device: DeviceKind) -> Self {
        Self {
            device,
            bytes: 0,
            when_full: WhenFull::Reject,
            idle: None,
            clock: None,
        }
    }

    /// The budget in bytes. Default: 0, a cache that is off until a capacity is set.
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// let cache = ConstantCache::builder(DeviceKind::Gpu).capacity_bytes(4096).build();
    /// assert_eq!(cache.capacity(), 4096);
    /// ```
    pub fn capacity_bytes(mut self, bytes: u64) -> Self {
        self.bytes = bytes;
        self
    }

    /// The budget in MiB, saturating at `u64::MAX` bytes.
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// let cache = ConstantCache::builder(DeviceKind::Cpu).capacity_mb(3).build();
    /// assert_eq!(cache.capacity(), 3 << 20);
    /// ```
    pub fn capacity_mb(self, mb: u64) -> Self {
        self.capacity_bytes(mb.saturating_mul(MIB))
    }

    /// Makes room for a new buffer by evicting cached ones, as
    /// [`ConstantCache::evicting`] does. Default: a buffer that does not fit is refused
    /// (returned to its caller uncached).
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{ConstantBuffer, DeviceKind, Source};
    ///
    /// let cache = ConstantCache::builder(DeviceKind::Cpu).capacity_bytes(64).evicting().build();
    /// for k in 0..3 {
    ///     let added = cache.get_or_add(ConstantKey::new(0, k), 64, || ConstantBuffer::host(64));
    ///     assert_eq!(added.unwrap().source, Source::Cached);
    /// }
    /// ```
    pub fn evicting(mut self) -> Self {
        self.when_full = WhenFull::Evict;
        self
    }

    /// A buffer no lookup has asked for in `idle` leaves the cache, its bytes back to the
    /// budget (see [`Cache`](crate::Cache)'s
    /// [`time_to_idle`](crate::CacheBuilder::time_to_idle)): the weights of a model nobody
    /// runs any more. Every hit, by [`get_or_add`](ConstantCache::get_or_add) or
    /// [`get`](ConstantCache::get), moves its deadline on. Expired buffers leave as builds
    /// step the cache's timer wheel, or at
    /// [`purge_expired`](ConstantCache::purge_expired); a caller that holds one keeps it
    /// (it then counts in [`pinned_bytes`](ConstantCache::pinned_bytes)). Zero expires every
    /// buffer as soon as it is cached: each lookup builds anew. Default: never.
    ///
    /// ```
    /// use runcache::constant::{ConstantCache, ConstantKey};
    /// use runcache::{Clock, ConstantBuffer, DeviceKind};
    /// use std::time::Duration;
    ///
    /// let (clock, hand) = Clock::manual();
    /// let cache = ConstantCache::builder(DeviceKind::Cpu)
    ///     .capacity_bytes(1 << 20)
    ///     .time_to_idle(Duration::from_secs(600))
    ///     .clock(clock)
    ///     .build();
    /// let key = ConstantKey::new(0, 1);
    /// cache.get_or_add(key, 4096, || ConstantBuffer::host(4096)).unwrap();
    /// hand.advance(Duration::from_secs(600));
    /// assert_eq!(cache.purge_expired(), 1);
    /// assert_eq!((cache.size(), cache.pinned_bytes()), (0, 0), "its bytes are back");
    /// ```
    pub fn time_to_idle(mut self, idle: Duration) -> Self {
        self.idle = Some(idle);
        self
    }

    /// The clock idle times are read against. Default: [`Clock::coarse`].
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::{Clock, DeviceKind};
    ///
    /// let (clock, _hand) = Clock::manual();
    /// let cache = ConstantCache::builder(DeviceKind::Cpu).clock(clock).build();
    /// assert_eq!(cache.capacity(), 0);
    /// ```
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The cache.
    ///
    /// ```
    /// use runcache::constant::ConstantCache;
    /// use runcache::DeviceKind;
    ///
    /// let cache = ConstantCache::builder(DeviceKind::Cpu).build();
    /// assert_eq!((cache.device(), cache.capacity()), (DeviceKind::Cpu, 0));
    /// ```
    pub fn build(self) -> ConstantCache {
        let mut core = crate::cache::Cache::builder()
            .capacity(self.bytes)
            .when_full(self.when_full)
            .weigher(|_, b: &super::ConstantBuffer| b.size() as u64)
            .on_evict(|_, b, _| b.mark_outside());
        if let Some(idle) = self.idle {
            core = core.time_to_idle(idle);
        }
        if let Some(clock) = self.clock {
            core = core.clock(clock);
        }
        // The default shard count is valid, and one expiry rule at most is set.
        ConstantCache::from_core(
            self.device,
            core.build()
                .expect("a constant cache's core configuration is valid"),
            self.idle,
        )
    }
}
