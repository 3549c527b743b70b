//! The ghost's *near returns* (**P9**), which move the small queue's share between the
//! climber's period closes (`climb.rs`), and within traces too short to close one. Each queue
//! has a clock, the entries taken off it so far, and the ghost dates each hash it remembers by
//! its queue's clock ([`Left`]). A miss on a remembered hash is *near* if fewer than
//! [`NearReturns::near`] entries left that queue since: that much more room would have kept
//! it. Near returns are counted in batches of [`Tuning::near_batch`]; a batch leaning to one
//! queue by [`Tuning::near_gate`] or more moves the share towards it, so the share rests
//! where a little more room earns each queue as much: the queues' marginal hits, where the
//! density steering balances their average ones (`docs/DESIGN.md`, "What adapts").
//!
//! **P9 (near returns).** The queues' clocks and the ghost's stamps are hints, like
//! the share: a departure is a relaxed load and store of its queue's clock on the eviction path
//! (racing departures may count once, so the clock may run slow), and a stamp is written with
//! the hash's ghost slot, never on a hit. A stale or slow clock, a stamp that wrapped or a slot
//! another hash took misdates one return, which counts it in the wrong batch or in none; a
//! batch moves the share by a bounded step. Nudges and a period's close move the share by
//! read-modify-writes clamped to its bounds, so none is lost to another and no value leaves the
//! share's bounds (`climb.rs`).

use super::Tuning;
use crate::sync::{AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

/// Where and when an evicted hash left the queues, as the ghost keeps it (**P9**): its
/// queue, and that queue's clock when it left, in grains ([`NearReturns::grain_shift`]),
/// [`STAMP_BITS`] bits of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Left {
    /// The hash left the main queue (else the small one).
    pub(super) main: bool,
    /// Its queue's clock when it left, in grains, modulo `1 << STAMP_BITS`.
    pub(super) stamp: u32,
}

/// The bits of a [`Left`]'s stamp. The clock wraps at `1 << STAMP_BITS` grains, 128 to 256
/// near reaches, 8 to 16 capacities' worth of the queue's departures; the ghost forgets
/// most hashes within three capacities' worth of evictions, and a hash remembered longer
/// than the wrap is taken for a near return once in 128 to 256.
pub(super) const STAMP_BITS: u32 = 14;
/// The mask of a stamp's bits.
const STAMP_MASK: u32 = (1 << STAMP_BITS) - 1;
/// The near reach's least length in grains (64), for caches whose reach is longer: a grain
/// is the power of two of departures that leaves 64 to 127 of them in the reach.
const REACH_GRAINS_SHIFT: u32 = 6;
/// [`NearReturns::nears`]'s count of the batch's near returns (its low 32 bits).
const NEARS: u64 = (1 << 32) - 1;

/// The queues' clocks and the batch of near returns under way (**P9**).
pub(super) struct NearReturns {
    /// The entries taken off the small queue (`[0]`) and evicted from the main queue
    /// (`[1]`) so far. On a cache line of their own: every eviction writes them, and every
    /// evictor reads the climber's share and entries beside them.
    clocks: CachePadded<[AtomicU64; 2]>,
    /// The near returns of the batch under way: all of them in the low 32 bits
    /// ([`NEARS`]), the small queue's in the high 32.
    nears: AtomicU64,
    tuning: &'static Tuning,
}

impl NearReturns {
    pub(super) fn new(tuning: &'static Tuning) -> Self {
        Self {
            clocks: CachePadded::new([AtomicU64::new(0), AtomicU64::new(0)]),
            nears: AtomicU64::new(0),
            tuning,
        }
    }

    /// The near reach of a cache expected to hold `entries` entries: a return to the ghost
    /// within this many departures of its queue is near: the entries shifted by
    /// [`Tuning::reach_shift`], at least [`Tuning::reach_min`].
    pub(super) fn near(&self, entries: u64) -> u64 {
        (entries >> self.tuning.reach_shift).max(self.tuning.reach_min)
    }

    /// The departures one unit of a [`Left`]'s stamp counts, as a shift: 1 while the near
    /// reach is under 128 departures, else the power of two that leaves 64 to 127 grains
    /// in the reach, so that the stamp's bits span 128 to 256 reaches whatever the cache's
    /// size. (Shifts, not divisions: a departure and a return each take one.)
    fn grain_shift(&self, entries: u64) -> u32 {
        (self.near(entries) >> REACH_GRAINS_SHIFT).max(1).ilog2()
    }

    /// Counts an entry leaving the small queue (`main` false) or evicted from the main
    /// queue, and returns the [`Left`] the ghost keeps if it remembers the hash.
    pub(super) fn depart(&self, main: bool, entries: u64) -> Left {
        // Relaxed: a clock of hints (P9). A load and a store, not a read-modify-write (a
        // locked add on every eviction slowed churn, `docs/EXPERIMENTS.md`): racing
        // departures may count once, so under contention the clock runs a little slow and
        // dates a hash a step early or late.
        let clock = &self.clocks[usize::from(main)];
        let now = clock.load(Ordering::Relaxed).wrapping_add(1);
        clock.store(now, Ordering::Relaxed);
        Left {
            main,
            stamp: self.stamp(now, entries),
        }
    }

    /// A clock reading in grains, modulo `1 << STAMP_BITS`.
    fn stamp(&self, clock: u64, entries: u64) -> u32 {
        (clock >> self.grain_shift(entries)) as u32 & STAMP_MASK
    }

    /// Whether a hash that `left` its queue comes back within the near reach of that
    /// queue's departures.
    pub(super) fn is_near(&self, left: Left, entries: u64) -> bool {
        // Relaxed: see `depart`.
        let clock = self.clocks[usize::from(left.main)].load(Ordering::Relaxed);
        let age = self.stamp(clock, entries).wrapping_sub(left.stamp) & STAMP_MASK;
        u64::from(age) < (self.near(entries) >> self.grain_shift(entries)).max(1)
    }

    /// Counts a near return of a small-queue leaver (`small`) or of a main-queue victim into
    /// the batch under way. The call that fills the batch ([`Tuning::near_batch`]) starts
    /// the next one and returns the near returns of the small queue beyond the main queue's
    /// (negative for fewer) if they differ by [`Tuning::near_gate`] or more: the share's
    /// move.
    pub(super) fn count(&self, small: bool) -> Option<i64> {
        let (batch, gate) = (self.tuning.near_batch, self.tuning.near_gate);
        let add = if small { 1 << 32 | 1 } else { 1 };
        // Relaxed: a hint (P9); the update's atomicity gives each return to one batch and
        // each batch to the one call that fills it.
        let Ok(before) = self
            .nears
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(if (n & NEARS) + 1 >= batch { 0 } else { n + add })
            })
        else {
            return None;
        };
        if (before & NEARS) + 1 < batch {
            return None;
        }
        // The batch's small-queue returns, this one included, at most the batch (both
        // within `Tuning::near_batch`'s range, so the casts keep them).
        let small = ((before + add) >> 32).min(batch) as i64;
        let beyond = 2 * small - batch as i64;
        (beyond.abs() >= gate).then_some(beyond)
    }

    /// The batch under way: its near returns, and the small queue's of them.
    #[cfg(test)]
    pub(super) fn batch(&self) -> (u64, u64) {
        let n = self.nears.load(Ordering::Relaxed);
        (n & NEARS, n >> 32)
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;

    const T: &Tuning = &Tuning::DEFAULT;

    #[test]
    fn large_caches_date_departures_in_grains_and_the_stamp_wraps() {
        const ENTRIES: u64 = 1 << 20;
        let n = NearReturns::new(T);
        let grain = 1 << n.grain_shift(ENTRIES);
        assert_eq!((n.near(ENTRIES), grain), (1 << 16, 1 << 10));
        // A hash leaves one departure before the stamp's clock wraps...
        n.clocks[0].store((1 << STAMP_BITS) * grain - 2, Ordering::Relaxed);
        let left = n.depart(false, ENTRIES);
        assert_eq!(left.stamp, (1 << STAMP_BITS) - 1);
        // ...and comes back three grains later, after the wrap: near.
        n.clocks[0].fetch_add(3 * grain, Ordering::Relaxed);
        assert!(n.is_near(left, ENTRIES));
        // A whole reach of grains later: far.
        let left = n.depart(false, ENTRIES);
        n.clocks[0].fetch_add((1 << REACH_GRAINS_SHIFT) * grain, Ordering::Relaxed);
        assert!(!n.is_near(left, ENTRIES));
        // Small caches count every departure: 160 entries reach back 10.
        assert_eq!((n.near(160), n.grain_shift(160)), (10, 0));
    }

    #[test]
    fn a_full_batch_returns_its_balance_past_the_gate_and_starts_the_next() {
        let n = NearReturns::new(T);
        let fill = |small: u64| {
            let moves: Vec<_> = (0..T.near_batch).map(|i| n.count(i < small)).collect();
            assert!(moves[..T.near_batch as usize - 1]
                .iter()
                .all(Option::is_none));
            assert_eq!(n.batch(), (0, 0), "a full batch starts the next");
            moves[T.near_batch as usize - 1]
        };
        // 22 small-queue returns of 32 are 12 beyond the main queue's, at the gate.
        assert_eq!(fill(22), Some(12));
        assert_eq!(fill(21), None, "10 beyond: within the gate");
        assert_eq!(fill(10), Some(-12));
        assert_eq!(fill(32), Some(32));
    }
}
