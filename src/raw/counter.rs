//! Exact weight accounting ([`Budget`]) and per-thread statistics ([`StatsRegistry`]).
//!
//! # The budget
//!
//! A reservation takes weight from one word, the *room* (the capacity in force less the
//! weight reserved): a compare-and-swap from `r` to `r - w`, taken only when `w <= r`, so the
//! reserved weight can never pass the capacity, not even for an instant (invariant **I5**).
//! A release adds its weight back with one `fetch_add`. A second word publishes the capacity
//! in force; the weighted size is read as the capacity less the room.
//!
//! A capacity change moves both words, always by the same amount, and the room never goes
//! below 0: a grow raises the capacity by a CAS from the value it read, then adds the
//! difference to the room; a shrink takes what room there is (up to what the shrink needs)
//! by a CAS on the room, then lowers the capacity by as much with a CAS from the value it
//! read, giving the room back if another change got there first. So, with `L` the reserved
//! weight plus the room:
//!
//! - **B1.** The reserved weight is at most `L` at every instant (the room is unsigned).
//! - **B2.** The published capacity is at least `L` at every instant: a change either
//!   lowers `L` before the capacity (a shrink) or raises the capacity before `L` (a grow),
//!   and equals it once no change is half done. So `weighted_size() <= capacity()` for any
//!   one read of the two, and a read between the halves of a change sees the size too high
//!   by at most that change, never the capacity below what is reserved.
//!
//! A shrink never sets the capacity below the reserved weight: it lowers it by the room
//! only, evicts, and follows the size down, so `capacity()` honestly reports what the cache
//! holds until eviction has reached the target.
//!
//! These were one 128-bit word, `(size, capacity)`, changed by `cmpxchg16b` through
//! `portable-atomic`'s run-time dispatch (an outlined call for every load and CAS, and a
//! lock where the machine has no 128-bit CAS). Two 64-bit words cost a reservation one
//! inlined CAS and a release one `lock xadd`.
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

use crate::sync::{yield_now, AtomicPtr, AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

/// Exact weight accounting: the room left under the capacity, and the capacity; see the
/// module docs (**B1**, **B2**).
pub(crate) struct Budget {
    /// The capacity in force less the weight reserved.
    room: AtomicU64,
    /// The capacity in force (never below the reserved weight).
    capacity: AtomicU64,
    /// The capacity the latest `set_capacity` asked for.
    target: AtomicU64,
}

impl Budget {
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            room: AtomicU64::new(capacity),
            capacity: AtomicU64::new(capacity),
            target: AtomicU64::new(capacity),
        }
    }

    /// The weighted size: reserved weights of cached entries and of entries being published.
    pub(crate) fn size(&self) -> u64 {
        self.snapshot().0
    }

    /// `(size, capacity)`, the size read against the capacity read with it (**B2**: never
    /// above it).
    pub(crate) fn snapshot(&self) -> (u64, u64) {
        // Relaxed: the words protect no other memory; their invariants hold in each one.
        let capacity = self.capacity.load(Ordering::Relaxed);
        // Relaxed: as above.
        let room = self.room.load(Ordering::Relaxed);
        (capacity.saturating_sub(room), capacity)
    }

    /// The capacity in force (never below `size()`).
    pub(crate) fn capacity(&self) -> u64 {
        // Relaxed: see `snapshot`.
        self.capacity.load(Ordering::Relaxed)
    }

    /// Reserves `weight` if it fits; `false` leaves the budget unchanged.
    ///
    /// A weight of 0 fits exactly when the capacity is not 0, and changes nothing: one load
    /// decides it, with no write to the room, which every thread's reservations share (a
    /// replacement of equal weight reserves 0).
    #[must_use]
    #[inline]
    pub(crate) fn try_reserve(&self, weight: u64) -> bool {
        if weight == 0 {
            return self.capacity() > 0;
        }
        // Relaxed: see `snapshot`.
        let mut room = self.room.load(Ordering::Relaxed);
        loop {
            if weight > room {
                return false;
            }
            // Relaxed: see `snapshot`.
            match self.room.compare_exchange_weak(
                room,
                room - weight,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => room = now,
            }
        }
    }

    /// Returns `weight` that an earlier `try_reserve` took.
    #[inline]
    pub(crate) fn release(&self, weight: u64) {
        if weight != 0 {
            // Relaxed: see `snapshot`.
            let before = self.room.fetch_add(weight, Ordering::Relaxed);
            debug_assert!(
                before.checked_add(weight).is_some(),
                "released more weight than was reserved"
            );
        }
    }

    /// Moves the capacity to `target`, calling `evict_one(t)` while the size is above the
    /// target `t` in force.
    ///
    /// `evict_one` removes one cached entry (releasing its weight) and returns whether it found
    /// one. When a later call sets another target, this call works towards that one, and
    /// returns once the capacity is the target it read last: a call that stopped as soon as
    /// the target changed could still finish a step towards its own after the later call was
    /// done, and leave the capacity at neither (the loom model
    /// `a_grow_racing_a_shrink_keeps_the_budget` found it). Every change is followed by its
    /// maker's check of the target, so the last one leaves the capacity at the last target.
    ///
    /// When nothing is left to evict, what holds the rest is weight being published (a
    /// reservation whose entry lands in a moment): the call yields and tries again, for
    /// [`SHRINK_PATIENCE`] fruitless rounds in a row at most. Then it gives up, leaving the
    /// capacity where it got to: `Err((target, capacity))`.
    pub(crate) fn set_capacity(
        &self,
        target: u64,
        mut evict_one: impl FnMut(u64) -> bool,
    ) -> Result<(), (u64, u64)> {
        // Relaxed: the target is one word; coherence alone makes every caller see the latest.
        self.target.store(target, Ordering::Relaxed);
        let mut fruitless = 0;
        loop {
            // Relaxed: as above.
            let target = self.target.load(Ordering::Relaxed);
            let capacity = self.capacity();
            if capacity == target {
                return Ok(());
            }
            if target > capacity {
                // Grow: the capacity first, then the room (B2). Relaxed: see `snapshot`.
                if self
                    .capacity
                    .compare_exchange(capacity, target, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    self.room.fetch_add(target - capacity, Ordering::Relaxed);
                }
                // Checked again either way: a target set after ours was read may already
                // have been reached by its own call, which this grow would then undo.
                continue;
            }
            // Shrink: the room first (what there is, up to the difference), then the
            // capacity (B2). Relaxed: see `snapshot`.
            let room = self.room.load(Ordering::Relaxed);
            let take = room.min(capacity - target);
            if take > 0 {
                if self
                    .room
                    .compare_exchange(room, room - take, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
                {
                    continue;
                }
                if self
                    .capacity
                    .compare_exchange(
                        capacity,
                        capacity - take,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    )
                    .is_err()
                {
                    // Another change moved the capacity since we read it: give the room
                    // back, so that both words moved by the same amount, and read again.
                    self.room.fetch_add(take, Ordering::Relaxed);
                }
                continue;
            }
            // Still above the target with no room left: the capacity already stops new
            // reservations at the reserved weight.
            if evict_one(target) {
                fruitless = 0;
            } else {
                // Only weight that is being published right now should be left; it lands in
                // a moment, unless something holds it for good.
                fruitless += 1;
                if fruitless == SHRINK_PATIENCE {
                    return Err((target, capacity));
                }
                yield_now();
            }
        }
    }
}

/// How many rounds in a row a shrink finds nothing to evict (each round yields the thread)
/// before it stops and reports the weight it could not free: more waits longer for a
/// publisher that was preempted between its reservation and its link; fewer gives up sooner
/// on weight that never comes back (a defect elsewhere).
pub(crate) const SHRINK_PATIENCE: u32 = 1 << 14;

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
    /// Entries this thread made cached, less those it took out of the cache (wrapping: a
    /// thread may take out more than it made). The sum over every thread is `len`.
    Live,
    /// Entries taken out because their deadline passed.
    Expiration,
}

const COUNTERS: usize = 10;

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

    /// Takes one from a counter (wrapping), as cheaply as [`bump`](Self::bump) adds one.
    #[inline]
    pub(crate) fn unbump(&self, counter: Counter) {
        self.bump_by(counter, u64::MAX);
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
        b.set_capacity(3, |_| {
            steps.push((b.size(), b.capacity()));
            assert!(b.size() <= b.capacity());
            b.release(1);
            true
        })
        .unwrap();
        assert_eq!((b.size(), b.capacity()), (3, 3));
        assert_eq!(steps.first(), Some(&(8, 8)));
    }

    #[test]
    fn a_shrink_that_can_free_nothing_gives_up_and_says_where_it_stopped() {
        // Weight that never comes back (nothing to evict holds it) must not hold the shrink
        // for ever: it takes the free room, then stops after its patience.
        let b = Budget::new(10);
        assert!(b.try_reserve(8));
        let mut tries = 0;
        let stuck = b.set_capacity(3, |_| {
            tries += 1;
            false
        });
        assert_eq!(stuck, Err((3, 8)));
        assert_eq!(tries, SHRINK_PATIENCE);
        assert_eq!((b.size(), b.capacity()), (8, 8));
        // Once the weight returns, the next call finishes the job.
        b.release(8);
        assert_eq!(b.set_capacity(3, |_| false), Ok(()));
        assert_eq!((b.size(), b.capacity()), (0, 3));
    }
}
