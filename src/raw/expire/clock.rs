//! The clocks a cache reads its deadlines against: the operating system's coarse clock
//! (the default), a clock read from one word that a thread of its own moves on (for the
//! cheapest reads), and a manual clock for tests.

#![allow(unsafe_code)]

use super::nanos;
#[cfg(not(target_os = "linux"))]
use super::NEVER;
use crate::sync::Ordering;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

/// Where a cache reads the time.
///
/// [`Clock::coarse`] (the default) is the operating system's monotonic clock at its coarse
/// resolution where it has one (Linux's `CLOCK_MONOTONIC_COARSE`, a read of the kernel's
/// last tick, a few milliseconds; elsewhere `std::time::Instant`). [`Clock::ticking`] is
/// read from one word that a thread of its own moves on every millisecond: the
/// cheapest read, for a cache whose hits must cost least. [`Clock::manual`] is a clock that
/// only moves when told to, for tests.
///
/// A clock never goes back: the coarse clock is monotonic, and a manual clock only
/// advances.
///
/// ```
/// use runcache::{Cache, Clock};
/// use std::time::Duration;
///
/// let (clock, hand) = Clock::manual();
/// let cache = Cache::<u32, u32>::builder()
///     .capacity(10)
///     .time_to_live(Duration::from_secs(60))
///     .clock(clock)
///     .build()?;
/// cache.put(1, 1).unwrap();
/// hand.advance(Duration::from_secs(59));
/// assert!(cache.get(&1).is_some());
/// hand.advance(Duration::from_secs(1));
/// assert!(cache.get(&1).is_none());
/// # Ok::<(), runcache::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Clock(Source);

#[derive(Clone, Debug, Default)]
enum Source {
    #[default]
    Coarse,
    /// The word a ticking thread moves on.
    Ticking(Arc<Ticker>),
    // A std atomic under loom too: the time is not part of any protocol the models check.
    Manual(Arc<AtomicU64>),
}

/// The hand of a [`Clock::manual`] clock: moves it forward.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicU64>);

impl Clock {
    /// The operating system's coarse monotonic clock (the default).
    ///
    /// ```
    /// use runcache::{Cache, Clock};
    /// use std::time::Duration;
    ///
    /// let cache = Cache::<u32, u32>::builder()
    ///     .time_to_live(Duration::from_secs(3_600))
    ///     .clock(Clock::coarse())
    ///     .build()?;
    /// cache.put(1, 1).unwrap();
    /// assert!(cache.get(&1).is_some());
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn coarse() -> Self {
        Self(Source::Coarse)
    }

    /// A clock read from one word, which a thread of its own (`runcache-clock`, one per
    /// process, shared by every ticking clock) sets from the monotonic clock every
    /// millisecond. A read is one load where the coarse clock's is a call into the
    /// kernel's shared page (1 ns against 7 on the machine of `docs/BENCHMARKS.md`), so a
    /// hit with a time to live costs about what one without does. The time lags by up to
    /// a period (more while the machine is too busy to run the thread), so entries live
    /// that much past their deadline; it never goes back. The thread wakes a thousand
    /// times a second while any ticking clock is alive and ends within a period of the
    /// last one's drop.
    ///
    /// # Errors
    /// The operating system's error if the thread cannot be started.
    ///
    /// ```
    /// use runcache::{Cache, Clock};
    /// use std::time::Duration;
    ///
    /// let cache = Cache::<u32, u32>::builder()
    ///     .time_to_live(Duration::from_secs(3_600))
    ///     .clock(Clock::ticking()?)
    ///     .build()?;
    /// cache.put(1, 1).unwrap();
    /// assert!(cache.get(&1).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ticking() -> std::io::Result<Self> {
        Ticker::shared().map(|t| Self(Source::Ticking(t)))
    }

    /// A clock that starts at zero and moves only by its hand's
    /// [`advance`](ManualClock::advance).
    ///
    /// ```
    /// use runcache::Clock;
    /// use std::time::Duration;
    ///
    /// let (_clock, hand) = Clock::manual();
    /// assert_eq!(hand.elapsed(), Duration::ZERO);
    /// ```
    pub fn manual() -> (Self, ManualClock) {
        let time = Arc::new(AtomicU64::new(0));
        (Self(Source::Manual(Arc::clone(&time))), ManualClock(time))
    }

    /// Now, in nanoseconds of this clock.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match &self.0 {
            Source::Coarse => coarse_now(),
            // Relaxed: as a manual clock's.
            Source::Ticking(t) => t.now.load(Ordering::Relaxed),
            // Relaxed: the time is a value of its own; an entry's deadline is compared with
            // it, never published through it.
            Source::Manual(t) => t.load(Ordering::Relaxed),
        }
    }
}

impl ManualClock {
    /// Moves the clock forward by `by` (saturating at the clock's end, some 584 years on).
    ///
    /// ```
    /// use runcache::Clock;
    /// use std::time::Duration;
    ///
    /// let (_clock, hand) = Clock::manual();
    /// hand.advance(Duration::from_secs(2));
    /// hand.advance(Duration::MAX);
    /// assert_eq!(hand.elapsed(), Duration::from_nanos(u64::MAX));
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = nanos(by);
        // Relaxed: see `Clock::now`.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// The time on the clock, from its start.
    ///
    /// ```
    /// use runcache::Clock;
    /// use std::time::Duration;
    ///
    /// let (_clock, hand) = Clock::manual();
    /// hand.advance(Duration::from_millis(3));
    /// assert_eq!(hand.elapsed(), Duration::from_millis(3));
    /// ```
    pub fn elapsed(&self) -> Duration {
        // Relaxed: see `Clock::now`.
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

/// The coarse monotonic clock, in nanoseconds.
#[cfg(target_os = "linux")]
#[inline]
fn coarse_now() -> u64 {
    // CLOCK_MONOTONIC_COARSE exists on every Linux since 2.6.32.
    linux_now(libc::CLOCK_MONOTONIC_COARSE)
}

/// Linux's clock `id`, in nanoseconds.
#[cfg(target_os = "linux")]
#[inline]
fn linux_now(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec, and the callers pass clocks every Linux
    // they run on has, so the call cannot fail.
    unsafe { libc::clock_gettime(id, &mut ts) };
    // Seconds since boot times 10^9 stay under 2^64 for 584 years: no overflow to check.
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// The monotonic clock, in nanoseconds since the first read.
#[cfg(not(target_os = "linux"))]
fn coarse_now() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(NEVER - 1)
}

/// How often a [`Clock::ticking`] clock's thread sets its time: how far such a clock may
/// lag, against a thousand wake-ups a second.
pub(crate) const TICKING_PERIOD: Duration = Duration::from_millis(1);

/// The word every ticking clock reads, and the thread that moves it on.
#[derive(Debug)]
struct Ticker {
    now: AtomicU64,
}

/// The live ticker, if any: ticking clocks share it, and its thread ends once none holds it.
static TICKER: Mutex<Weak<Ticker>> = Mutex::new(Weak::new());

impl Ticker {
    /// The process's ticker, started if none is alive.
    fn shared() -> std::io::Result<Arc<Ticker>> {
        // A poisoned lock still guards a valid `Weak` (nothing panics while it is held).
        let mut live = TICKER.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = live.upgrade() {
            return Ok(t);
        }
        let ticker = Arc::new(Ticker {
            now: AtomicU64::new(fine_now()),
        });
        let weak = Arc::downgrade(&ticker);
        std::thread::Builder::new()
            .name("runcache-clock".into())
            .spawn(move || loop {
                std::thread::sleep(TICKING_PERIOD);
                let Some(t) = weak.upgrade() else { break };
                // Relaxed: see `Clock::now`; `fetch_max` keeps the time from going back.
                t.now.fetch_max(fine_now(), Ordering::Relaxed);
            })?;
        *live = Arc::downgrade(&ticker);
        Ok(ticker)
    }
}

/// The monotonic clock at full resolution, in nanoseconds (a ticker's thread reads it once
/// a period).
#[cfg(target_os = "linux")]
fn fine_now() -> u64 {
    linux_now(libc::CLOCK_MONOTONIC)
}

/// The monotonic clock, in nanoseconds since the first read.
#[cfg(not(target_os = "linux"))]
fn fine_now() -> u64 {
    coarse_now()
}
