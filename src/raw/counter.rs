//! Exact weight accounting ([`Budget`]) and per-thread statistics ([`StatsRegistry`]).
//!
//! # The budget
//!
//! The weighted size and the capacity live in one [`AtomicPair`]. A reservation is a single
//! compare-and-swap from `(s, c)` to `(s + w, c)` taken only when `c > 0 && s + w <= c`, so the
//! size can never pass the capacity, not even for an instant (invariant **I5**). A shrink never
//! sets the capacity below the current size: it lowers `c` to `max(target, s)` and follows the
//! size down while the caller evicts, so `capacity()` honestly reports what the cache holds
//! until eviction has reached the target.
//!
//! # Statistics
//!
//! Each thread that touches a cache gets its own cache-line-aligned block of counters (found
//! through the same thread-local entry as its epoch handle). The owner bumps its counters with
//! a plain load and store, which is exact because it is the only writer; readers add the blocks
//! up. A lookup therefore writes only a line that no other thread writes.
//!
//! # Invariants of the registry
//!
//! - **R1 (publication).** A block is written only by the registering thread before the
//!   Release CAS that links it; after that its `next` never changes and every counter is an
//!   atomic, so any thread may read a linked block.
//! - **R2 (lifetime).** A linked block is freed only when the registry drops, so a block
//!   reached through `&self` stays allocated as long as that borrow.

#![allow(unsafe_code)]

use crate::sync::{yield_now, AtomicPair, AtomicPtr, AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

/// Weighted size and capacity, updated together.
pub(crate) struct Budget {
    /// `(size, capacity)`.
    pair: AtomicPair,
    /// The capacity the latest `set_capacity` asked for.
    target: AtomicU64,
}

impl Budget {
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            pair: AtomicPair::new(0, capacity),
            target: AtomicU64::new(capacity),
        }
    }

    /// The weighted size: reserved weights of cached entries and of entries being published.
    pub(crate) fn size(&self) -> u64 {
        self.pair.load().0
    }

    /// `(size, capacity)` read together in one atomic load.
    pub(crate) fn snapshot(&self) -> (u64, u64) {
        self.pair.load()
    }

    /// The capacity in force (never below `size()`).
    pub(crate) fn capacity(&self) -> u64 {
        self.pair.load().1
    }

    /// Reserves `weight` if it fits; `false` leaves the budget unchanged.
    ///
    /// A weight of 0 fits exactly when the capacity is not 0, and changes nothing: one load
    /// decides it, with no write to the budget's word, which every thread's reservations
    /// share (a replacement of equal weight reserves 0).
    #[must_use]
    pub(crate) fn try_reserve(&self, weight: u64) -> bool {
        if weight == 0 {
            return self.capacity() > 0;
        }
        let mut cur = self.pair.load();
        loop {
            let (size, cap) = cur;
            let fits = cap > 0 && size.checked_add(weight).is_some_and(|n| n <= cap);
            if !fits {
                return false;
            }
            match self.pair.compare_exchange(cur, (size + weight, cap)) {
                Ok(()) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Returns `weight` that an earlier `try_reserve` took.
    pub(crate) fn release(&self, weight: u64) {
        if weight == 0 {
            return;
        }
        let mut cur = self.pair.load();
        loop {
            let (size, cap) = cur;
            debug_assert!(size >= weight, "released more weight than was reserved");
            match self
                .pair
                .compare_exchange(cur, (size.saturating_sub(weight), cap))
            {
                Ok(()) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Moves the capacity to `target`, calling `evict_one` while the size is above it.
    ///
    /// `evict_one` removes one cached entry (releasing its weight) and returns whether it found
    /// one. When a later call sets another target, this call stops and leaves the work to it.
    pub(crate) fn set_capacity(&self, target: u64, mut evict_one: impl FnMut() -> bool) {
        // Relaxed: the target is one word; coherence alone makes every caller see the latest.
        self.target.store(target, Ordering::Relaxed);
        loop {
            if self.target.load(Ordering::Relaxed) != target {
                return;
            }
            let cur = self.pair.load();
            let (size, cap) = cur;
            let next = target.max(size);
            if next != cap && self.pair.compare_exchange(cur, (size, next)).is_err() {
                continue;
            }
            if next == target {
                return;
            }
            // Still above the target: the capacity already stops new reservations at `size`.
            if !evict_one() {
                // Only weight that is being published right now is left; it lands in a moment.
                yield_now();
            }
        }
    }
}

/// What a statistics counter counts.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    Hit = 0,
    Miss,
    Build,
    BuildFailure,
    Wait,
    Rejection,
    Eviction,
    Removal,
}

const COUNTERS: usize = 8;

/// The fewest values lighter than a hand-over's due weight that a thread hands over at a
/// time (see [`StatsBlock::hand_over_due`]): it bounds the hand-overs, each a sealed ~2 KB
/// bag, to one per eight retirements in a cache of light entries.
pub(crate) const HAND_OVER_LIGHT: u64 = 8;

/// One thread's counters.
pub(crate) struct StatsBlock {
    counts: [AtomicU64; COUNTERS],
    /// The values this thread retired since it last handed its retirements to the collector:
    /// their weight (bits 8–63) and their count (bits 0–7); see `RawCache::retired`.
    unflushed: AtomicU64,
    /// Whether only one thread writes this block (then a load and a store are exact).
    owned: bool,
    next: *const CachePadded<StatsBlock>,
}

impl StatsBlock {
    #[inline]
    pub(crate) fn bump(&self, counter: Counter) {
        self.bump_by(counter, 1);
    }

    /// Adds `n` to a counter, as cheaply as the block's ownership allows.
    #[inline]
    pub(crate) fn bump_by(&self, counter: Counter, n: u64) {
        let c = &self.counts[counter as usize];
        if self.owned {
            // Relaxed: a statistic; the owning thread is the only writer of this block, so
            // the load-and-store loses nothing and is cheaper than a locked add.
            c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        } else {
            // Relaxed: a statistic shared by threads that could not use their own block.
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Notes a retired value of `weight`; `true` (and the tally back to zero) when it is time
    /// to hand the thread's bag over: at once for a value weighing `due` or more, else once
    /// the values retired since the last hand-over weigh `due` and number at least
    /// [`HAND_OVER_LIGHT`]. A block shared by several threads says `true` at once: its
    /// threads have no bag of their own to wait on (they pin through temporary handles).
    #[inline]
    pub(crate) fn hand_over_due(&self, weight: u64, due: u64) -> bool {
        if !self.owned {
            return true;
        }
        if weight >= due {
            // Relaxed: see below.
            self.unflushed.store(0, Ordering::Relaxed);
            return true;
        }
        // Relaxed: only the owning thread reads or writes it. The weight is in the high
        // bits, the count in the low byte (it saturates there, having done its job).
        let tally = self.unflushed.load(Ordering::Relaxed);
        let (sum, count) = (
            (tally >> 8).saturating_add(weight),
            (tally & 0xff).saturating_add(1).min(0xff),
        );
        let now = sum >= due && count >= HAND_OVER_LIGHT;
        let tally = if now {
            0
        } else {
            sum.min(u64::MAX >> 8) << 8 | count
        };
        self.unflushed.store(tally, Ordering::Relaxed);
        now
    }
}

/// The append-only list of every thread's block, owned by one cache.
pub(crate) struct StatsRegistry {
    head: AtomicPtr<CachePadded<StatsBlock>>,
    /// The block for callers with no thread-local entry (thread teardown, re-entrancy).
    shared: CachePadded<StatsBlock>,
}

// SAFETY: (R1) the registry owns its blocks; blocks hold only atomics and a `next` pointer that is
// written before the block is published (Release) and never changed afterwards.
unsafe impl Send for StatsRegistry {}
// SAFETY: (R1) as above; every access to a block's counters is atomic.
unsafe impl Sync for StatsRegistry {}

impl StatsRegistry {
    pub(crate) fn new() -> Self {
        Self {
            head: AtomicPtr::new(std::ptr::null_mut()),
            shared: CachePadded::new(new_block(false, std::ptr::null())),
        }
    }

    /// The block for callers that have no block of their own.
    pub(crate) fn shared(&self) -> &StatsBlock {
        &self.shared
    }

    /// Adds a block owned by the calling thread. It lives as long as the registry.
    pub(crate) fn register(&self) -> *const StatsBlock {
        let block = Box::into_raw(Box::new(CachePadded::new(new_block(
            true,
            std::ptr::null(),
        ))));
        // Relaxed: the loop's CAS publishes the block.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: (R1) `block` is ours until the CAS below publishes it.
            let mine = unsafe { &mut *block };
            mine.next = head;
            // Release: pairs with the Acquire load in `sum`, which then sees `next` and the
            // zeroed counters.
            match self
                .head
                .compare_exchange_weak(head, block, Ordering::Release, Ordering::Relaxed)
            {
                // SAFETY: (R2) `block` came from `Box::into_raw` above and is freed only when the
                // registry drops.
                Ok(_) => return unsafe { &**block },
                Err(actual) => head = actual,
            }
        }
    }

    /// The sum of one counter over every block.
    pub(crate) fn sum(&self, counter: Counter) -> u64 {
        let i = counter as usize;
        // Relaxed: statistics.
        let mut total = self.shared.counts[i].load(Ordering::Relaxed);
        // Acquire: pairs with the Release CAS in `register`.
        let mut p = self.head.load(Ordering::Acquire) as *const CachePadded<StatsBlock>;
        while !p.is_null() {
            // SAFETY: (R2) blocks are freed only when the registry drops, and `&self` keeps it
            // alive.
            let block = unsafe { &*p };
            total = total.wrapping_add(block.counts[i].load(Ordering::Relaxed));
            p = block.next;
        }
        total
    }
}

fn new_block(owned: bool, next: *const CachePadded<StatsBlock>) -> StatsBlock {
    StatsBlock {
        counts: std::array::from_fn(|_| AtomicU64::new(0)),
        unflushed: AtomicU64::new(0),
        owned,
        next,
    }
}

impl Drop for StatsRegistry {
    fn drop(&mut self) {
        // Relaxed: `&mut self` means no other thread can touch the list.
        let mut p = self.head.load(Ordering::Relaxed);
        while !p.is_null() {
            // SAFETY: (R2) every block came from `Box::into_raw` in `register` and is freed once.
            let block = unsafe { Box::from_raw(p) };
            p = block.next as *mut _;
        }
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_budget_word_is_lock_free_on_x86_64() {
        assert!(AtomicPair::is_lock_free());
    }

    #[test]
    fn reserve_respects_capacity_and_release_returns_weight() {
        let b = Budget::new(10);
        assert!(b.try_reserve(6));
        assert!(!b.try_reserve(5));
        assert!(b.try_reserve(4));
        assert_eq!((b.size(), b.capacity()), (10, 10));
        assert!(b.try_reserve(0), "a weight of 0 fits a full budget");
        assert_eq!(b.size(), 10);
        b.release(6);
        assert_eq!(b.size(), 4);
        assert!(!b.try_reserve(u64::MAX), "overflowing weights never fit");
    }

    #[test]
    fn zero_capacity_admits_nothing_not_even_weight_zero() {
        let b = Budget::new(0);
        assert!(!b.try_reserve(0));
        assert!(!b.try_reserve(1));
    }

    #[test]
    fn shrinking_never_puts_capacity_below_size() {
        let b = Budget::new(10);
        assert!(b.try_reserve(8));
        let mut steps = Vec::new();
        b.set_capacity(3, || {
            steps.push((b.size(), b.capacity()));
            assert!(b.size() <= b.capacity());
            b.release(1);
            true
        });
        assert_eq!((b.size(), b.capacity()), (3, 3));
        assert_eq!(steps.first(), Some(&(8, 8)));
    }
}
