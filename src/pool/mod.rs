//! Memory pool manager: cached objects keep their scratch pools and reuse them.
//!
//! Arm Compute Library found that allocating scratch memory on every run dominated inference
//! latency (ResNet-50 about 3× slower), and cached its primitives' memory pools instead. A
//! [`PoolManager`] is that pool cache,
//! lock-free:
//!
//! - [`PoolManager::reserve`] pops a free pool from a lock-free list and returns a
//!   [`PoolGuard`]; dropping the guard pushes the pool back.
//! - With no free pool, the manager creates `pools_per_growth` new ones with its factory (it
//!   grows) and hands one out; the others become free.
//! - With a maximum and every pool reserved, it waits (parked, optionally with a timeout) or
//!   fails with a typed [`PoolError`], as configured. Waiters queue in arrival order, and each
//!   returned pool wakes one of them, the longest waiting (a thread that comes along while a
//!   pool is free takes it without queueing).
//! - [`PoolManager::clear`] frees the free pools and never a reserved one; dropping the
//!   manager (when the cached object that owns it is evicted and its last holder lets go)
//!   frees them all.
//!
//! ```
//! use runcache::pool::PoolManager;
//!
//! // Scratch buffers of 1 MiB, created two at a time.
//! let pools = PoolManager::new(2, || vec![0u8; 1 << 20]).unwrap();
//! {
//!     let mut scratch = pools.reserve().unwrap();
//!     scratch[0] = 1; // use it for one run
//! } // back in the free list
//! let again = pools.reserve().unwrap();
//! assert_eq!(again[0], 1, "the same memory, reused");
//! assert_eq!(pools.stats().created, 2);
//! assert_eq!(pools.stats().reuses, 1);
//! ```

// No unsafe code here; the crate-wide `deny(unsafe_code)` holds, and only the child module
// that needs unsafe allows it (a `forbid` here would bind the children too).

mod error;
mod slots;

use crate::sync::{park, park_timeout, AtomicU64, AtomicUsize, Ordering};
pub use error::PoolError;
use slots::{PoolSlots, ReturnPool, Waiters};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

pub use slots::PoolGuard;

/// What [`PoolManager::reserve`] does when every pool is reserved and the maximum is reached.
///
/// ```
/// use runcache::pool::{PoolError, PoolManager, WhenExhausted};
/// use std::time::Duration;
///
/// let pools = PoolManager::builder(|| vec![0u8; 1024])
///     .max_pools(1)
///     .when_exhausted(WhenExhausted::WaitFor(Duration::from_millis(10)))
///     .build()?;
/// let _held = pools.reserve()?;
/// assert!(matches!(pools.reserve(), Err(PoolError::TimedOut { max_pools: 1, .. })));
/// # Ok::<(), PoolError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenExhausted {
    /// Park until a pool comes back (the default).
    #[default]
    Wait,
    /// Park until a pool comes back, at most this long, then fail with
    /// [`PoolError::TimedOut`].
    WaitFor(Duration),
    /// Fail at once with [`PoolError::Exhausted`].
    Fail,
}

/// Counters of a pool manager; exact once no reservation is in flight.
///
/// ```
/// use runcache::pool::PoolManager;
///
/// let pools = PoolManager::new(1, || vec![0u8; 64])?;
/// drop(pools.reserve()?);
/// drop(pools.reserve()?);
/// let stats = pools.stats();
/// assert_eq!((stats.created, stats.reserves, stats.reuses), (1, 2, 1));
/// # Ok::<(), runcache::PoolError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Pools the factory created.
    pub created: u64,
    /// Successful reservations.
    pub reserves: u64,
    /// Reservations served by a pool that was used before (an allocation avoided).
    pub reuses: u64,
    /// Reservations that had to wait for a pool to come back.
    pub waits: u64,
    /// The most pools reserved at once.
    pub peak_reserved: u64,
    /// Pools freed by `clear`.
    pub freed: u64,
}

/// Builds a [`PoolManager`]; see [`PoolManager::builder`].
///
/// ```
/// use runcache::pool::{PoolManager, WhenExhausted};
///
/// let pools = PoolManager::builder(|| Vec::<f32>::with_capacity(1 << 16))
///     .pools_per_growth(2)
///     .max_pools(8)
///     .when_exhausted(WhenExhausted::Fail)
///     .build()?;
/// assert_eq!(pools.pools(), 0, "nothing is created before the first reservation");
/// # Ok::<(), runcache::PoolError>(())
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct PoolManagerBuilder<P> {
    factory: Box<dyn Fn() -> P + Send + Sync>,
    per_growth: usize,
    max_pools: Option<usize>,
    exhausted: WhenExhausted,
}

impl<P: Send> PoolManagerBuilder<P> {
    /// How many pools to create when none is free (the seed's `num_pools`). Default 1.
    ///
    /// ```
    /// use runcache::pool::PoolManager;
    ///
    /// let pools = PoolManager::builder(|| [0u8; 32]).pools_per_growth(4).build()?;
    /// let _one = pools.reserve()?;
    /// assert_eq!((pools.pools(), pools.reserved()), (4, 1));
    /// # Ok::<(), runcache::PoolError>(())
    /// ```
    pub fn pools_per_growth(mut self, n: usize) -> Self {
        self.per_growth = n;
        self
    }

    /// The most pools that may exist at once. Default: no limit.
    ///
    /// ```
    /// use runcache::pool::{PoolError, PoolManager, WhenExhausted};
    ///
    /// let pools = PoolManager::builder(|| 0u64)
    ///     .max_pools(2)
    ///     .when_exhausted(WhenExhausted::Fail)
    ///     .build()?;
    /// let (_a, _b) = (pools.reserve()?, pools.reserve()?);
    /// assert_eq!(pools.reserve().unwrap_err(), PoolError::Exhausted { max_pools: 2 });
    /// # Ok::<(), PoolError>(())
    /// ```
    pub fn max_pools(mut self, max: usize) -> Self {
        self.max_pools = Some(max);
        self
    }

    /// What a reservation does when the maximum is reached and none is free.
    ///
    /// ```
    /// use runcache::pool::{PoolManager, WhenExhausted};
    ///
    /// let pools = PoolManager::builder(|| 0u64).max_pools(1).when_exhausted(WhenExhausted::Wait).build()?;
    /// let held = pools.reserve()?;
    /// std::thread::scope(|s| {
    ///     let waiter = s.spawn(|| *pools.reserve().unwrap()); // parks until the pool comes back
    ///     std::thread::sleep(std::time::Duration::from_millis(10));
    ///     drop(held);
    ///     assert_eq!(waiter.join().unwrap(), 0);
    /// });
    /// # Ok::<(), runcache::PoolError>(())
    /// ```
    pub fn when_exhausted(mut self, policy: WhenExhausted) -> Self {
        self.exhausted = policy;
        self
    }

    /// Builds the manager (no pool is created before the first reservation).
    ///
    /// # Errors
    /// [`PoolError::InvalidConfig`] when `pools_per_growth` is 0 or the maximum is 0.
    ///
    /// ```
    /// use runcache::pool::{PoolError, PoolManager};
    ///
    /// let err = PoolManager::builder(|| 0u8).pools_per_growth(0).build().unwrap_err();
    /// assert!(matches!(err, PoolError::InvalidConfig { .. }));
    /// assert!(err.to_string().starts_with("invalid pool manager setting"));
    /// ```
    pub fn build(self) -> Result<PoolManager<P>, PoolError> {
        if self.per_growth == 0 {
            return Err(PoolError::InvalidConfig {
                reason: "pools_per_growth must be at least 1 (got 0)",
            });
        }
        if self.max_pools == Some(0) {
            return Err(PoolError::InvalidConfig {
                reason: "max_pools must be at least 1 (got 0)",
            });
        }
        Ok(PoolManager {
            slots: PoolSlots::new(),
            waiters: Waiters::new(),
            factory: self.factory,
            per_growth: self.per_growth,
            max_pools: self.max_pools,
            exhausted: self.exhausted,
            live: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            counters: Default::default(),
        })
    }
}

#[derive(Default)]
struct Counters {
    created: AtomicU64,
    reserves: AtomicU64,
    reuses: AtomicU64,
    waits: AtomicU64,
    peak_reserved: AtomicU64,
    freed: AtomicU64,
}

/// A lock-free cache of reusable memory pools; see the [module docs](self).
///
/// ```
/// use runcache::pool::PoolManager;
///
/// // Scratch memory shared by every run of a cached primitive, from any thread.
/// let scratch = PoolManager::new(1, || vec![0f32; 4096])?;
/// std::thread::scope(|s| {
///     for t in 0..4 {
///         let scratch = &scratch;
///         s.spawn(move || {
///             let mut pool = scratch.reserve().unwrap();
///             pool[0] = t as f32; // exclusive while reserved
///         });
///     }
/// });
/// assert!(scratch.pools() <= 4);
/// assert_eq!(scratch.reserved(), 0);
/// # Ok::<(), runcache::PoolError>(())
/// ```
pub struct PoolManager<P> {
    slots: PoolSlots<P>,
    waiters: Waiters,
    factory: Box<dyn Fn() -> P + Send + Sync>,
    per_growth: usize,
    max_pools: Option<usize>,
    exhausted: WhenExhausted,
    /// Pools that exist (free or reserved).
    live: AtomicUsize,
    reserved: AtomicUsize,
    counters: Counters,
}

impl<P: Send> PoolManager<P> {
    /// A manager that creates `num_pools` pools with `factory` whenever none is free, without
    /// a maximum.
    ///
    /// # Errors
    /// [`PoolError::InvalidConfig`] when `num_pools` is 0.
    ///
    /// ```
    /// use runcache::pool::PoolManager;
    ///
    /// let pools = PoolManager::new(2, || String::with_capacity(256))?;
    /// assert_eq!(pools.pools(), 0);
    /// assert!(PoolManager::new(0, String::new).is_err());
    /// # Ok::<(), runcache::PoolError>(())
    /// ```
    pub fn new(
        num_pools: usize,
        factory: impl Fn() -> P + Send + Sync + 'static,
    ) -> Result<Self, PoolError> {
        Self::builder(factory).pools_per_growth(num_pools).build()
    }

    /// A builder for a manager whose pools `factory` creates.
    ///
    /// ```
    /// let pools = runcache::pool::PoolManager::builder(|| vec![0u8; 16]).max_pools(4).build()?;
    /// assert_eq!(pools.reserve()?.len(), 16);
    /// # Ok::<(), runcache::PoolError>(())
    /// ```
    pub fn builder(factory: impl Fn() -> P + Send + Sync + 'static) -> PoolManagerBuilder<P> {
        PoolManagerBuilder {
            factory: Box::new(factory),
            per_growth: 1,
            max_pools: None,
            exhausted: WhenExhausted::Wait,
        }
    }

    /// Reserves a pool: a free one, or a new one if the manager may grow, or — at the maximum —
    /// waits or fails as configured.
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] or [`PoolError::TimedOut`] at the maximum, per
    /// [`WhenExhausted`]; [`PoolError::TooManyPools`] if the slot space is exhausted.
    ///
    /// ```
    /// let pools = runcache::pool::PoolManager::new(1, || vec![0u8; 8])?;
    /// {
    ///     let mut pool = pools.reserve()?;
    ///     pool.push(1); // the guard derefs to the pool
    ///     assert_eq!(pools.reserved(), 1);
    /// }
    /// assert_eq!(pools.reserved(), 0, "back in the free list");
    /// assert_eq!(pools.reserve()?.len(), 9, "the same pool, reused");
    /// # Ok::<(), runcache::PoolError>(())
    /// ```
    pub fn reserve(&self) -> Result<PoolGuard<'_, P>, PoolError> {
        self.reserve_with(self.exhausted)
    }

    /// Reserves a pool without ever waiting: a free one or a new one, else
    /// [`PoolError::Exhausted`].
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve) with [`WhenExhausted::Fail`].
    ///
    /// ```
    /// use runcache::pool::{PoolError, PoolManager};
    ///
    /// let pools = PoolManager::builder(|| 0u32).max_pools(1).build()?; // waits when exhausted
    /// let held = pools.reserve()?;
    /// assert_eq!(pools.try_reserve().unwrap_err(), PoolError::Exhausted { max_pools: 1 });
    /// drop(held);
    /// assert!(pools.try_reserve().is_ok());
    /// # Ok::<(), PoolError>(())
    /// ```
    pub fn try_reserve(&self) -> Result<PoolGuard<'_, P>, PoolError> {
        self.reserve_with(WhenExhausted::Fail)
    }

    /// The async form of [`reserve`](Self::reserve): at the maximum, with
    /// [`WhenExhausted::Wait`] or [`WhenExhausted::WaitFor`], the task waits in the same
    /// queue as parked threads (each returned pool wakes the longest waiting, thread or
    /// task) without blocking its thread. The core has no timer, so `WaitFor`'s limit does
    /// not apply here: wrap the future in the runtime's timeout. Dropping the future
    /// withdraws its registration, and passes on a wake it was given.
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] at the maximum with [`WhenExhausted::Fail`];
    /// [`PoolError::TooManyPools`] if the slot space is exhausted.
    ///
    /// ```
    /// use runcache::pool::PoolManager;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let pools = PoolManager::builder(|| vec![0u8; 64]).max_pools(1).build().unwrap();
    /// let mut pool = pools.reserve_async().await.unwrap();
    /// pool[0] = 1;
    /// drop(pool);
    /// assert_eq!(pools.reserve_async().await.unwrap()[0], 1);
    /// # });
    /// ```
    pub fn reserve_async(&self) -> Reserve<'_, P> {
        Reserve {
            manager: self,
            me: None,
            waited: false,
        }
    }

    /// A free pool, or a new one if the manager may grow; `None` at the maximum.
    fn reserve_now(&self) -> Result<Option<PoolGuard<'_, P>>, PoolError> {
        if let Some(index) = self.slots.pop_free() {
            // Relaxed (all counters): statistics.
            self.counters.reuses.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(self.hand_out(index)));
        }
        Ok(self.grow()?.map(|index| self.hand_out(index)))
    }

    fn reserve_with(&self, exhausted: WhenExhausted) -> Result<PoolGuard<'_, P>, PoolError> {
        let deadline = match exhausted {
            WhenExhausted::WaitFor(d) => Some((Instant::now() + d, d)),
            _ => None,
        };
        let mut waited = false;
        loop {
            if let Some(guard) = self.reserve_now()? {
                return Ok(guard);
            }
            let max_pools = self.max_pools.unwrap_or(usize::MAX);
            if exhausted == WhenExhausted::Fail {
                return Err(PoolError::Exhausted { max_pools });
            }
            if !waited {
                self.counters.waits.fetch_add(1, Ordering::Relaxed);
                waited = true;
            }
            // Registered, look for a pool once more, then park until a returner wakes this
            // registration (the waiter protocol, W1–W3, is in `pool/slots.rs`). Woken, start
            // over: a pool, a new one, or a new registration.
            let me = self.waiters.register();
            while !me.woken() {
                if let Some(guard) = self.take_registered(&me) {
                    return Ok(guard);
                }
                match deadline {
                    Some((at, after)) => {
                        let now = Instant::now();
                        if now >= at {
                            self.waiters.leave(&me);
                            return Err(PoolError::TimedOut { after, max_pools });
                        }
                        park_timeout(at - now);
                    }
                    // A spurious return only leads to another look.
                    None => park(),
                }
            }
        }
    }

    /// Takes a pool freed after a registration (the look that follows it, W1 in
    /// `pool/slots.rs`), withdrawing the registration; `None` if none is free.
    fn take_registered(&self, me: &slots::Waiter) -> Option<PoolGuard<'_, P>> {
        let index = self.slots.pop_free()?;
        // A wake that chose this waiter meanwhile goes on to the next (W3).
        self.waiters.leave(me);
        // Relaxed: a statistic.
        self.counters.reuses.fetch_add(1, Ordering::Relaxed);
        Some(self.hand_out(index))
    }

    /// Creates up to `pools_per_growth` pools within the maximum; keeps one for the caller and
    /// frees the others. `None` when the maximum allows no new pool.
    fn grow(&self) -> Result<Option<usize>, PoolError> {
        let max = self.max_pools.unwrap_or(usize::MAX);
        // Relaxed: the CAS below is the only thing that matters, and it is a single word.
        let mut live = self.live.load(Ordering::Relaxed);
        let n = loop {
            let n = self.per_growth.min(max.saturating_sub(live));
            if n == 0 {
                return Ok(None);
            }
            match self.live.compare_exchange_weak(
                live,
                live + n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break n,
                Err(actual) => live = actual,
            }
        };
        // If the factory panics, give back the count of the pools not made.
        struct Unmade<'a>(&'a AtomicUsize, usize);
        impl Drop for Unmade<'_> {
            fn drop(&mut self) {
                // Relaxed: see `grow`.
                self.0.fetch_sub(self.1, Ordering::Relaxed);
            }
        }
        let mut unmade = Unmade(&self.live, n);
        let mut mine = None;
        for _ in 0..n {
            let index = self
                .slots
                .pop_empty()
                .or_else(|| self.slots.claim_fresh())
                .ok_or(PoolError::TooManyPools)?;
            let pool = (self.factory)();
            self.slots.fill(index, pool);
            unmade.1 -= 1;
            self.counters.created.fetch_add(1, Ordering::Relaxed);
            match mine {
                None => mine = Some(index),
                Some(_) => {
                    self.slots.push_free(index);
                    self.waiters.after_return();
                }
            }
        }
        Ok(mine)
    }

    fn hand_out(&self, index: usize) -> PoolGuard<'_, P> {
        let now = self.reserved.fetch_add(1, Ordering::Relaxed) as u64 + 1;
        self.counters.reserves.fetch_add(1, Ordering::Relaxed);
        self.counters
            .peak_reserved
            .fetch_max(now, Ordering::Relaxed);
        PoolGuard {
            slots: &self.slots,
            index,
            owner: self,
        }
    }

    /// Frees every free pool (reserved pools are untouched); returns how many were freed.
    ///
    /// ```
    /// let pools = runcache::pool::PoolManager::new(3, || vec![0u8; 1 << 20])?;
    /// let held = pools.reserve()?; // creates three, reserves one
    /// assert_eq!(pools.clear(), 2, "the free ones go; the reserved one stays");
    /// assert_eq!(pools.pools(), 1);
    /// drop(held);
    /// # Ok::<(), runcache::PoolError>(())
    /// ```
    pub fn clear(&self) -> usize {
        let mut freed = 0;
        while let Some(index) = self.slots.pop_free() {
            drop(self.slots.take(index));
            self.slots.push_empty(index);
            self.live.fetch_sub(1, Ordering::Relaxed);
            freed += 1;
        }
        self.counters
            .freed
            .fetch_add(freed as u64, Ordering::Relaxed);
        freed
    }

    /// Pools that exist now, free or reserved.
    ///
    /// ```
    /// let pools = runcache::pool::PoolManager::new(2, || 0u8)?;
    /// assert_eq!(pools.pools(), 0);
    /// let _p = pools.reserve()?;
    /// assert_eq!(pools.pools(), 2);
    /// # Ok::<(), runcache::PoolError>(())
    /// ```
    pub fn pools(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Pools reserved now.
    ///
    /// ```
    /// let pools = runcache::pool::PoolManager::new(1, || 0u8)?;
    /// let (a, b) = (pools.reserve()?, pools.reserve()?);
    /// assert_eq!(pools.reserved(), 2);
    /// drop((a, b));
    /// assert_eq!(pools.reserved(), 0);
    /// # Ok::<(), runcache::PoolError>(())
    /// ```
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Waiter registrations queued now, abandoned ones included (for tests).
    #[doc(hidden)]
    pub fn __queued_waiters(&self) -> usize {
        self.waiters.queued()
    }

    /// The counters.
    ///
    /// ```
    /// let pools = runcache::pool::PoolManager::new(1, || 0u8)?;
    /// let (a, b) = (pools.reserve()?, pools.reserve()?);
    /// drop((a, b));
    /// let stats = pools.stats();
    /// assert_eq!((stats.created, stats.peak_reserved), (2, 2));
    /// # Ok::<(), runcache::PoolError>(())
    /// ```
    pub fn stats(&self) -> PoolStats {
        let c = &self.counters;
        PoolStats {
            created: c.created.load(Ordering::Relaxed),
            reserves: c.reserves.load(Ordering::Relaxed),
            reuses: c.reuses.load(Ordering::Relaxed),
            waits: c.waits.load(Ordering::Relaxed),
            peak_reserved: c.peak_reserved.load(Ordering::Relaxed),
            freed: c.freed.load(Ordering::Relaxed),
        }
    }
}

impl<P> ReturnPool for PoolManager<P> {
    fn return_pool(&self, index: usize) {
        // Relaxed: a statistic.
        self.reserved.fetch_sub(1, Ordering::Relaxed);
        self.slots.push_free(index);
        self.waiters.after_return();
    }
}

impl<P> fmt::Debug for PoolManagerBuilder<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolManagerBuilder")
            .field("pools_per_growth", &self.per_growth)
            .field("max_pools", &self.max_pools)
            .field("when_exhausted", &self.exhausted)
            .finish_non_exhaustive()
    }
}

impl<P> fmt::Debug for PoolManager<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolManager")
            .field("pools", &self.live.load(Ordering::Relaxed))
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
            .field("per_growth", &self.per_growth)
            .field("max_pools", &self.max_pools)
            .finish_non_exhaustive()
    }
}

/// The future of [`PoolManager::reserve_async`]: a pool, once one is free or may be made.
///
/// ```
/// use runcache::pool::PoolManager;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let pools = PoolManager::builder(|| 0u8).max_pools(1).build().unwrap();
/// let held = pools.reserve().unwrap();
/// // The core has no timer: bound the wait with the runtime's.
/// let waited = tokio::time::timeout(std::time::Duration::from_millis(5), pools.reserve_async()).await;
/// assert!(waited.is_err(), "still reserved");
/// drop(held);
/// assert!(pools.reserve_async().await.is_ok());
/// # });
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Reserve<'a, P> {
    manager: &'a PoolManager<P>,
    /// This task's registration in the waiters' queue, while it waits.
    me: Option<Arc<slots::Waiter>>,
    /// Whether the wait was counted.
    waited: bool,
}

impl<'a, P: Send> Future for Reserve<'a, P> {
    type Output = Result<PoolGuard<'a, P>, PoolError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let m = self.manager;
        if let Some(me) = self.me.take() {
            if !me.woken() {
                // Still registered: a pool freed since is ours (the look after registering,
                // W1); else wait on, registering anew if the task's waker changed.
                if let Some(guard) = m.take_registered(&me) {
                    return Poll::Ready(Ok(guard));
                }
                if me.wakes(cx.waker()) {
                    self.me = Some(me);
                    return Poll::Pending;
                }
                m.waiters.leave(&me);
            }
            // Woken (or leaving for a new waker): start over.
        }
        if let Some(guard) = m.reserve_now()? {
            return Poll::Ready(Ok(guard));
        }
        if m.exhausted == WhenExhausted::Fail {
            let max_pools = m.max_pools.unwrap_or(usize::MAX);
            return Poll::Ready(Err(PoolError::Exhausted { max_pools }));
        }
        if !self.waited {
            // Relaxed: a statistic.
            m.counters.waits.fetch_add(1, Ordering::Relaxed);
            self.waited = true;
        }
        let me = m.waiters.register_task(cx.waker());
        if let Some(guard) = m.take_registered(&me) {
            return Poll::Ready(Ok(guard));
        }
        self.me = Some(me);
        Poll::Pending
    }
}

impl<P> Drop for Reserve<'_, P> {
    fn drop(&mut self) {
        if let Some(me) = self.me.take() {
            // Withdraws the registration; a wake it was given goes on to the next (W3).
            self.manager.waiters.leave(&me);
        }
    }
}

impl<P> fmt::Debug for Reserve<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reserve")
            .field("waiting", &self.me.is_some())
            .finish_non_exhaustive()
    }
}
