//! The small queue's share of the capacity, adapted on line by comparing what the two queues
//! earn for their room, as Caffeine's window climber does for caches over 4,096 entries
//! (`ben-manes/caffeine`, `.claude/docs/hill-climber.md`: its *density* tier).
//!
//! The cache's accesses are sampled in periods of [`Climber::sample`] accesses (four per
//! expected entry, at least [`MIN_SAMPLE`]). In each period the small queue's *density* is
//! the hits its entries had while in it, per unit of its share of the capacity, and the main
//! queue's is the period's other hits per unit of the rest. At the end of the period the
//! share moves by [`GAIN`] times the log of their ratio (at most [`MAX_MOVE`] of the
//! capacity): up while the small queue earns more per entry than the main queue, down while
//! it earns less. Both densities come from the same period, so a change of the workload's
//! phase (a scan, a burst of misses, a quiet spell) moves both and cancels in the ratio. The
//! share rests where the small queue's part of the hits equals its part of the capacity. The
//! share stays within [`MIN_SHARE`, `MAX_SHARE`]. Caffeine keeps its hit-rate climber below
//! 4,096 entries, where its periods are a few thousand accesses; here every period has at
//! least [`MIN_SAMPLE`] accesses, and on the training suite's 69 caches under 4,096 entries
//! the density steering did better than the hit-rate climber on 27 and worse on 2 (by more
//! than 0.05 points; +0.15 on average, `docs/DESIGN.md`).
//!
//! Between the closes, the share also follows the ghost's *near returns* (**P9**), which
//! steer it within a trace too short to close a period. Each queue has a clock, the entries
//! taken off it so far (the small queue's leavers, wherever they go; the main queue's
//! evictions), and the ghost dates each hash it remembers by its queue's clock
//! ([`Left`]). A miss on a hash the ghost remembers is a *near return* if fewer than
//! [`Climber::near`] entries left that queue since the hash did: so many more entries of
//! room for that queue would have kept it, and the miss would have been a hit. Near returns
//! are counted in batches of [`NEAR_BATCH`]; a batch in which one queue's outnumber the
//! other's by [`NEAR_GATE`] or more moves the share towards that queue by [`NUDGE`]
//! entries' worth for each one beyond, so the share rests where a little more room earns
//! each queue as many hits as the other: the queues' *marginal* hits, where the density
//! steering balances their average ones. The two differ where a queue's hits crowd at one
//! end: a small queue whose entries are hit soon after they arrive earns much per entry,
//! though its last entries earn nothing, and its room is better spent in the main queue
//! (the LIRS programs, Zipf); a main queue whose proven entries keep their hits while the
//! rest of it sits idle earns much per entry too, though a larger window would turn its
//! idle room into hits (the CPU traces, OLTP, sprite). Measured on the training suite
//! (`docs/DESIGN.md`): at a small queue of 10%, the near returns of the two queues point
//! the way of the better share on nearly every cell, and steering by them beside the
//! density gains 7.2 points of hits summed over its 87 cells, no cell losing more than 0.5.
//!
//! The climber also tells the policy when the hot set has moved (**P5**): a period whose hit
//! rate fell by [`MOVED_FALL`] or more from the last opens a watch of [`MOVED_WATCH`]
//! periods, and a period of the watch in which at least half the main queue's entries were
//! found idle (no hit since the policy's last visit, [`Climber::count_pass`]) turns *aging*
//! on for the next period: the main queue's idle entries then lose half their sketch counts
//! at each visit. A scan makes the rate fall too, but the main queue's entries keep their
//! hits through it, so it never ages them.
//!
//! Nothing here is written on the hit path: the hit rate comes from the cache's own per-thread
//! statistics, which the evictor sums now and then (`raw/evict.rs`), and a small-queue
//! entry's hits are read from its meta when it leaves the queue. Each period is closed by
//! exactly one thread, the one whose compare-and-swap moves the period's start; the others
//! carry on with the share as it is, so no evictor waits for another (**P3**).

use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

/// Where and when an evicted hash left the queues, as the ghost keeps it (**P9**): its
/// queue, and that queue's clock when it left, in grains of [`Climber::grain`] entries,
/// [`STAMP_BITS`] bits of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Left {
    /// The hash left the main queue (else the small one).
    pub(super) main: bool,
    /// Its queue's clock when it left, in grains, modulo `1 << STAMP_BITS`.
    pub(super) stamp: u32,
}

/// The bits of a [`Left`]'s stamp. The clock wraps at `1 << STAMP_BITS` grains, 128 to 256
/// near reaches (see `Climber::grain_shift`), 8 to 16 capacities' worth of the queue's
/// departures; the ghost forgets most hashes within three capacities' worth of evictions,
/// and a hash remembered longer than the wrap is taken for a near return once in 128 to
/// 256.
pub(super) const STAMP_BITS: u32 = 14;
/// The near reach's least length in grains (64), for caches whose reach is longer: a grain
/// is the power of two of departures that leaves 64 to 127 of them in the reach.
const REACH_GRAINS_SHIFT: u32 = 6;
/// The near reach, as a fraction of the expected entries: a return within 1/16 (a shift by
/// 4) of the capacity's worth of its queue's departures. Training suite (five seeds, one
/// thread, an exact record of evictions in place of the ghost): 1/16 gained 12.8 points
/// summed over its 87 cells, 1/8 gained 9.7 (`docs/EXPERIMENTS.md`).
const REACH_SHIFT: u32 = 4;
/// The shortest near reach, in departures.
const REACH_MIN: u64 = 2;
/// A near return's move of the share, in entries' worth of the capacity (at least one unit
/// of the share). Training suite, as for [`REACH_SHIFT`] and one return at a time: half
/// an entry gained 12.8 points summed, one entry 10.9, two entries 10.1, a quarter 10.4
/// (`docs/EXPERIMENTS.md`).
const NUDGE: f64 = 0.5;
/// The near returns counted before the share moves (**P9**): it moves by their balance,
/// and only if one queue's outnumber the other's by [`NEAR_GATE`]. Where the two come
/// about equally often (a zigzag, whose turns reward a larger small queue as much as its
/// fixed set rewards the main one), single returns walked the share at random, the
/// hasher's seed deciding where: moved one return at a time, the zigzag test
/// (`tests/policy.rs`) spread 1.05 points over its six seeds, and with a quarter-entry
/// nudge the moving hot set at 5% spread 1.05 over five. In batches of 32 gated at 12
/// (two standard deviations of a fair batch), 0.88 and 0.07 (the suite's widest 0.76),
/// for 7.8 points summed instead of 9.7 (cpp at 5% and 10%, whose short replays fill few
/// batches, 0.7 and 1.3 of it); batches of 16 gated at 6 spread cpp at 10% 1.19, batches
/// of 64 gated at 16 gained 7.4.
const NEAR_BATCH: u64 = 32;
/// See [`NEAR_BATCH`].
const NEAR_GATE: i64 = 12;

/// The share's unit: a share of `ONE` is the whole capacity.
const ONE: u32 = 1 << 16;
/// The share the climber starts from: 10% of the capacity, S3-FIFO's own split. On the
/// workload matrix (`trace --matrix`, one thread, under the hit-rate climber this steering
/// replaced) it held 51 of 56 rows within half a point of the best peer, against 49 starting
/// at 1% (Caffeine's start), which cost OLTP 0.6 to 2.8 points while it climbed towards the
/// 30% that OLTP wants, and 50 starting at 5%. On the training suite, a fixed 10% is the
/// best single share (`docs/DESIGN.md`), and traces shorter than a period keep it.
const INITIAL_SHARE: u32 = ONE / 10;
/// The least share of the small queue: 1% of the capacity (and at least one entry).
pub(super) const MIN_SHARE: u32 = ONE / 100;
/// The greatest share of the small queue: 80% of the capacity. The density steering takes
/// the share there only where the small queue keeps earning more per entry than the main
/// queue: on the training suite, orm-busy at 1% of its keys (a recency trace that LRU leads)
/// sat at the 40% ceiling the bold-driver climber needed (it wandered from 1% to 80% over
/// eight hasher seeds there), and it gains 0.67 points at 80% (75.30% to 75.97% at its worst
/// seed, spread 0.11), with no other cell of the suite moving by a tenth of a point.
pub(super) const MAX_SHARE: u32 = ONE / 5 * 4;
/// The share's move per period, as a fraction of the capacity per unit of the densities'
/// log ratio (Caffeine's 0.03).
const GAIN: f64 = 0.03;
/// The most the share moves in one period: 30% of the capacity (Caffeine's).
const MAX_MOVE: f64 = 0.30;
/// The hits each density counts beyond its own, so that a queue that earned nothing in a
/// period has a density, and one hit more or less in a sparse period moves little.
const PRIOR_HITS: f64 = 1.0;
/// A fall of the hit rate between two periods that opens the watch for a moved hot set.
const MOVED_FALL: f64 = 0.05;
/// The least window, in entries (a quarter of a smaller cache): with several threads, the
/// entries on their way into a one-entry small queue made it look over its share, and a
/// 47-entry cache on Zipf 1.2 lost 3.2 points from one thread to four (63.7 → 60.5); four
/// entries' worth held the loss to 0.3 and cost one thread nothing beyond the noise.
const FLOOR_ENTRIES: u64 = 4;
/// `Climber::start` before the first period begins.
const NOT_BEGUN: u64 = u64::MAX;
/// The fewest accesses in a period, so that small caches sample a rate, not noise.
pub(super) const MIN_SAMPLE: u64 = 65536;
/// The periods after a fall of the hit rate (by [`MOVED_FALL`] or more) in which an idle main
/// queue turns aging on (**P5**). The period of the fall itself rarely shows the main queue
/// idle (the hot set moves somewhere inside it); on a replay of the matrix's moving hot set
/// at 10% of its keys, a watch of two periods gained 1.4 points of hits where four gained
/// 2.5 (one run each).
const MOVED_WATCH: u32 = 4;
/// The fewest visits of main-queue entries in a period for its idle share to count.
const MIN_VISITS: u64 = 64;
/// `Climber::visits`: the low 32 bits count visits of main-queue entries, the high 32 those
/// that found the entry idle.
const VISITS: u64 = (1 << 32) - 1;

/// The climber's state (**P3**).
pub(super) struct Climber {
    /// The small queue's share of the capacity, in 1/65,536.
    share: AtomicU32,
    /// The hit rate of the last period (`f64` bits); NaN before the first period ends.
    rate: AtomicU64,
    /// The cache's accesses when the current period began.
    start: AtomicU64,
    /// The cache's hits when the current period began.
    start_hits: AtomicU64,
    /// The entries the cache is expected to hold (an entry's weight is `capacity / entries`):
    /// the builder's guess, then what the cache held at its first eviction (**P4**).
    entries: AtomicU64,
    /// This period's visits of main-queue entries: idle ones in the high 32 bits, all in the
    /// low 32 (see [`VISITS`]). Swapped to 0 when the period closes.
    visits: AtomicU64,
    /// This period's hits of small-queue entries, counted as they leave the queue. Swapped to
    /// 0 when the period closes.
    window_hits: AtomicU64,
    /// The periods left in the watch that a fall of the hit rate opened (**P5**).
    watch: AtomicU32,
    /// Whether the main queue's idle entries lose sketch counts in this period (**P5**).
    aging: AtomicBool,
    /// The queues' clocks (**P9**): the entries taken off the small queue (`[0]`) and
    /// evicted from the main queue (`[1]`) so far. On a cache line of their own: every
    /// eviction writes them, and every evictor reads the share and the entries above.
    clocks: CachePadded<[AtomicU64; 2]>,
    /// The near returns of the batch under way (**P9**): all of them in the low 32 bits
    /// ([`NEARS`]), the small queue's in the high 32.
    nears: AtomicU64,
}

/// `Climber::nears`'s count of the batch's near returns.
const NEARS: u64 = (1 << 32) - 1;

impl Climber {
    /// A climber for a cache expected to hold `entries` entries, starting at [`INITIAL_SHARE`].
    pub(super) fn new(entries: u64) -> Self {
        Self {
            share: AtomicU32::new(INITIAL_SHARE),
            rate: AtomicU64::new(f64::NAN.to_bits()),
            start: AtomicU64::new(NOT_BEGUN),
            start_hits: AtomicU64::new(0),
            entries: AtomicU64::new(entries),
            visits: AtomicU64::new(0),
            window_hits: AtomicU64::new(0),
            watch: AtomicU32::new(0),
            aging: AtomicBool::new(false),
            clocks: CachePadded::new([AtomicU64::new(0), AtomicU64::new(0)]),
            nears: AtomicU64::new(0),
        }
    }

    /// The near reach (**P9**): a return to the ghost within this many departures of its
    /// queue is near. A sixteenth of the expected entries ([`REACH_SHIFT`]), at least
    /// [`REACH_MIN`].
    pub(super) fn near(&self) -> u64 {
        (self.entries() >> REACH_SHIFT).max(REACH_MIN)
    }

    /// The departures one unit of a [`Left`]'s stamp counts, as a shift: 1 while the near
    /// reach is under 128 departures, else the power of two that leaves 64 to 127 grains
    /// in the reach, so that the stamp's bits span 128 to 256 reaches whatever the cache's
    /// size. (Shifts, not divisions: a departure and a return each take one.)
    fn grain_shift(&self) -> u32 {
        (self.near() >> REACH_GRAINS_SHIFT).max(1).ilog2()
    }

    /// The departures one unit of a [`Left`]'s stamp counts.
    #[cfg(test)]
    fn grain(&self) -> u64 {
        1 << self.grain_shift()
    }

    /// Counts an entry leaving the small queue (`main` false) or evicted from the main
    /// queue, and returns the [`Left`] the ghost keeps if it remembers the hash.
    pub(super) fn depart(&self, main: bool) -> Left {
        // Relaxed: a clock of hints (P9). A load and a store, not a read-modify-write (a
        // locked add on every eviction cost the churn benchmark 3% on one thread): racing
        // departures may count once, so under contention the clock runs a little slow and
        // dates a hash a step early or late.
        let clock = &self.clocks[usize::from(main)];
        let clock_now = clock.load(Ordering::Relaxed).wrapping_add(1);
        clock.store(clock_now, Ordering::Relaxed);
        let clock = clock_now;
        Left {
            main,
            stamp: self.stamp(clock),
        }
    }

    /// A clock reading in grains, modulo `1 << STAMP_BITS`.
    fn stamp(&self, clock: u64) -> u32 {
        ((clock >> self.grain_shift()) & ((1 << STAMP_BITS) - 1)) as u32
    }

    /// A hash the ghost remembered as `left` came back (missed): counts a near return of
    /// its queue if it came back within the near reach of that queue's departures (**P9**).
    /// Returns whether it was near.
    pub(super) fn returned(&self, left: Left) -> bool {
        // Relaxed: see `depart`.
        let now = self.stamp(self.clocks[usize::from(left.main)].load(Ordering::Relaxed));
        let age = u64::from(now.wrapping_sub(left.stamp) & ((1 << STAMP_BITS) - 1));
        let near = age < (self.near() >> self.grain_shift()).max(1);
        if near {
            self.count_near(!left.main);
        }
        near
    }

    /// Counts a near return of a small-queue leaver (`small`) or of a main-queue victim into
    /// the batch under way; the call that fills the batch ([`NEAR_BATCH`]) starts the next
    /// one and moves the share by a [`NUDGE`] for each near return of one queue beyond the
    /// other's, towards the queue with more, if they differ by [`NEAR_GATE`] or more.
    fn count_near(&self, small: bool) {
        let add = if small { 1 << 32 | 1 } else { 1 };
        // Relaxed: a hint (P9); the update's atomicity gives each return to one batch and
        // each batch to the one call that fills it.
        let Ok(before) = self
            .nears
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(if (n & NEARS) + 1 >= NEAR_BATCH {
                    0
                } else {
                    n + add
                })
            })
        else {
            return;
        };
        if (before & NEARS) + 1 < NEAR_BATCH {
            return;
        }
        // The batch's small-queue returns, this one included, at most NEAR_BATCH.
        let small = ((before + add) >> 32).min(NEAR_BATCH) as i64;
        let beyond = 2 * small - NEAR_BATCH as i64;
        if beyond.abs() >= NEAR_GATE {
            self.nudge(beyond);
        }
    }

    /// The batch under way: its near returns, and the small queue's of them.
    #[cfg(test)]
    pub(super) fn nears(&self) -> (u64, u64) {
        let n = self.nears.load(Ordering::Relaxed);
        (n & NEARS, n >> 32)
    }

    /// Moves the share by `times` [`NUDGE`]s (each an entry's worth times `NUDGE`, at least
    /// one unit of the share), up for a positive `times`.
    fn nudge(&self, times: i64) {
        let step = (NUDGE * f64::from(ONE) / self.entries().max(1) as f64).max(1.0) as i64;
        self.shift(step.saturating_mul(times));
    }

    /// Moves the share by `by` units, within [`MIN_SHARE`, `MAX_SHARE`].
    fn shift(&self, by: i64) {
        // Relaxed: the share is a hint (P3); one read-modify-write, so a nudge racing a
        // period's close (or another nudge) adds to it instead of being overwritten.
        let _ = self
            .share
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |share| {
                let next =
                    (i64::from(share) + by).clamp(i64::from(MIN_SHARE), i64::from(MAX_SHARE));
                // In bounds, so the cast keeps the value.
                Some(next as u32)
            });
    }

    /// Counts what one eviction pass saw: `visits` visits of main-queue entries, `idle` of
    /// which found the entry not hit since the policy's last visit, and `window_hits` hits
    /// of the entries that left the small queue. An evictor calls it once per pass, not per
    /// entry.
    pub(super) fn count_pass(&self, visits: u32, idle: u32, window_hits: u64) {
        // Relaxed: statistics for the period's close. A period with over 2^32 visits would
        // carry into the idle count; the close treats an idle count above the visits as
        // nothing seen.
        if visits > 0 {
            self.visits
                .fetch_add(u64::from(idle) << 32 | u64::from(visits), Ordering::Relaxed);
        }
        if window_hits > 0 {
            self.window_hits.fetch_add(window_hits, Ordering::Relaxed);
        }
    }

    /// Whether the main queue's idle entries lose half their sketch counts at each visit in
    /// this period: the hot set has moved (**P5**).
    pub(super) fn aging(&self) -> bool {
        // Relaxed: a hint written at a period's close; a stale read ages, or spares, the
        // entries of one pass.
        self.aging.load(Ordering::Relaxed)
    }

    /// Turns aging on or off, as a period's close would.
    #[cfg(test)]
    pub(super) fn set_aging(&self, on: bool) {
        self.aging.store(on, Ordering::Relaxed);
    }

    /// This period's visits so far: `(visits, idle)`.
    #[cfg(test)]
    pub(super) fn visits(&self) -> (u64, u64) {
        let counts = self.visits.load(Ordering::Relaxed);
        (counts & VISITS, counts >> 32)
    }

    /// This period's hits of small-queue leavers so far.
    #[cfg(test)]
    pub(super) fn window_hits(&self) -> u64 {
        self.window_hits.load(Ordering::Relaxed)
    }

    /// Closes the watch's part of a period whose hit rate changed by `change` and whose
    /// visits `counts` counted (packed as in the `visits` field): opens the watch on a fall
    /// of [`MOVED_FALL`] or more, and turns aging on for the next period if the watch is open
    /// and at least half of the period's visits found the entry idle.
    fn close_watch(&self, change: f64, counts: u64) {
        let (visits, idle) = (counts & VISITS, counts >> 32);
        let idle_main = visits >= MIN_VISITS && idle <= visits && 2 * idle >= visits;
        // Relaxed: see `aging`; only the thread that closes the period writes these.
        let watch = if change <= -MOVED_FALL {
            MOVED_WATCH
        } else {
            self.watch.load(Ordering::Relaxed).saturating_sub(1)
        };
        self.watch.store(watch, Ordering::Relaxed);
        self.aging.store(watch > 0 && idle_main, Ordering::Relaxed);
    }

    /// The entries the cache is expected to hold.
    pub(super) fn entries(&self) -> u64 {
        // Relaxed: a sizing hint, written once (`resize`).
        self.entries.load(Ordering::Relaxed)
    }

    /// Sizes the floor of the window and the sampling period for `entries` entries (**P4**).
    pub(super) fn resize(&self, entries: u64) {
        // Relaxed: see `entries`.
        self.entries.store(entries, Ordering::Relaxed);
    }

    /// The small queue's part of `capacity` now: the share's, but at least [`FLOOR_ENTRIES`]
    /// entries' worth or a quarter of the capacity, whichever is less, and at least 1.
    pub(super) fn window(&self, capacity: u64) -> u64 {
        // Relaxed: a sizing hint; a stale share only sizes one decision by the last period.
        let share = u128::from(self.share.load(Ordering::Relaxed));
        let window = (u128::from(capacity) * share) >> 16;
        let floor = (u128::from(FLOOR_ENTRIES) * u128::from(capacity)
            / u128::from(self.entries().max(1)))
        .min(u128::from(capacity / 4)) as u64;
        (window as u64).max(floor).clamp(1.min(capacity), capacity)
    }

    /// The current share, in 1/65,536 of the capacity.
    pub(super) fn share(&self) -> u32 {
        // Relaxed: as in `window`.
        self.share.load(Ordering::Relaxed)
    }

    /// Accesses per period: four per expected entry, at least [`MIN_SAMPLE`].
    pub(super) fn sample(&self) -> u64 {
        self.entries().saturating_mul(4).max(MIN_SAMPLE)
    }

    /// The share's move, in 1/65,536 of the capacity, for a period in which a small queue
    /// of `share` earned `window_hits` of the `hits`: [`GAIN`] times the log of the ratio
    /// of the two queues' densities, within [`MAX_MOVE`] either way.
    fn steer(share: u32, hits: u64, window_hits: u64) -> i64 {
        let w = f64::from(share.clamp(1, ONE - 1)) / f64::from(ONE);
        // Counted as they leave the small queue, a period's window hits can include hits of
        // the period before; the main queue's are what is left, never below 0.
        let main_hits = hits.saturating_sub(window_hits) as f64;
        let small = (window_hits as f64 + PRIOR_HITS) / w;
        let main = (main_hits + PRIOR_HITS) / (1.0 - w);
        // Both densities are positive and finite, so the log is finite.
        let error = (small / main).ln();
        ((GAIN * error).clamp(-MAX_MOVE, MAX_MOVE) * f64::from(ONE)) as i64
    }

    /// Closes the period if `accesses` (the cache's lookups so far, `hits` of them hits) ends
    /// it, and moves the share; `true` if this call closed it. Counts read from per-thread
    /// statistics may lag a little or run out of step with each other: every difference is
    /// saturating and the rate clamped to [0, 1], so no input overflows or divides by zero.
    pub(super) fn observe(&self, hits: u64, accesses: u64) -> bool {
        // Relaxed: the period's start is claimed by one compare-and-swap; the other fields
        // are hints written by the claimer, and a reader of a stale one adjusts by one period
        // less precisely.
        let start = self.start.load(Ordering::Relaxed);
        // The first call only begins the first period: the cache filling is no sample of
        // either queue's density.
        let begun = start != NOT_BEGUN;
        let seen = accesses.saturating_sub(start);
        if (begun && seen < self.sample())
            || self
                .start
                .compare_exchange(start, accesses, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let start_hits = self.start_hits.swap(hits, Ordering::Relaxed);
        // Every close starts the counts over, the first ones included (what came before the
        // first period, and during it, counts in none).
        let visits = self.visits.swap(0, Ordering::Relaxed);
        let window_hits = self.window_hits.swap(0, Ordering::Relaxed);
        if !begun {
            return false;
        }
        let period_hits = hits.saturating_sub(start_hits);
        let rate = (period_hits as f64 / seen as f64).clamp(0.0, 1.0);
        let last = f64::from_bits(self.rate.swap(rate.to_bits(), Ordering::Relaxed));
        if !last.is_nan() {
            self.close_watch(rate - last, visits);
        }
        let share = self.share.load(Ordering::Relaxed);
        self.shift(Self::steer(share, period_hits, window_hits));
        true
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A climber and the cache's counts so far.
    struct Feed {
        c: Climber,
        hits: u64,
        accesses: u64,
    }

    impl Feed {
        /// A climber for 100 entries whose first period has begun.
        fn new() -> Self {
            let c = Climber::new(100);
            assert!(!c.observe(0, 1_000), "the first call only begins a period");
            Self {
                c,
                hits: 0,
                accesses: 1_000,
            }
        }

        /// Runs one full period per `(rate, window)`: the period hits at `rate`, and the
        /// small queue's leavers had `window` of those hits. Returns the share after each.
        fn split(&mut self, periods: &[(f64, f64)]) -> Vec<u32> {
            let n = self.c.sample();
            periods
                .iter()
                .map(|&(rate, window)| {
                    let hits = (rate * n as f64) as u64;
                    self.c.count_pass(0, 0, (window * hits as f64) as u64);
                    self.accesses += n;
                    self.hits += hits;
                    assert!(
                        self.c.observe(self.hits, self.accesses),
                        "a full period closes"
                    );
                    self.c.share()
                })
                .collect()
        }

        /// Runs one full period per rate, the small queue earning its share's part of the
        /// hits (so the share holds); returns the share after each.
        fn periods(&mut self, rates: &[f64]) -> Vec<u32> {
            let window = f64::from(self.c.share()) / f64::from(ONE);
            let split: Vec<_> = rates.iter().map(|&r| (r, window)).collect();
            self.split(&split)
        }
    }

    #[test]
    fn the_first_call_begins_a_period_and_a_period_closes_when_full() {
        let mut f = Feed::new();
        assert_eq!(
            f.c.sample(),
            MIN_SAMPLE,
            "small caches sample at least MIN_SAMPLE"
        );
        assert!(
            !f.c.observe(10, f.accesses + MIN_SAMPLE - 1),
            "a period not yet full"
        );
        f.c.count_pass(0, 0, 7);
        assert_eq!(f.c.window_hits(), 7);
        f.periods(&[0.5]);
        assert!(f.c.rate.load(Ordering::Relaxed) == 0.5f64.to_bits());
        assert_eq!(f.c.window_hits(), 0, "each close starts over");
    }

    #[test]
    fn the_share_follows_the_queue_that_earns_more_for_its_room() {
        let mut f = Feed::new();
        // At a 10% share, a small queue earning 30% of the hits is three times as dense as
        // the main queue: the share grows, and goes on growing while that holds.
        let up = f.split(&[(0.4, 0.3), (0.4, 0.3)]);
        assert!(up[0] > INITIAL_SHARE && up[1] > up[0], "{up:?}");
        // Earning less than its share of the hits, it shrinks.
        let down = f.split(&[(0.4, 0.01)]);
        assert!(down[0] < up[1], "{down:?} after {up:?}");
        // Earning exactly its share's part, it holds (within the rounding of the counts).
        let share = f.c.share();
        let held = f.periods(&[0.4])[0];
        assert!(held.abs_diff(share) <= 2, "{share} -> {held}");
    }

    #[test]
    fn the_move_grows_with_the_imbalance_and_is_capped() {
        let w = INITIAL_SHARE;
        let mild = Climber::steer(w, 10_000, 2_000);
        let strong = Climber::steer(w, 10_000, 8_000);
        assert!(0 < mild && mild < strong, "{mild} {strong}");
        // A log ratio of 2 (densities e² apart) moves the share by 2 × GAIN.
        let main_hits = 9_000.0;
        let window = (main_hits + PRIOR_HITS) / 9.0 * 2f64.exp() - PRIOR_HITS;
        let two = Climber::steer(w, main_hits as u64 + window as u64, window as u64);
        let expected = 2.0 * GAIN * f64::from(ONE);
        assert!((two as f64 - expected).abs() < 0.01 * expected, "{two}");
        // Hits only in the small queue, or only in the main one, move by at most MAX_MOVE.
        let most = (MAX_MOVE * f64::from(ONE)) as i64;
        assert!(Climber::steer(MIN_SHARE, u64::MAX, u64::MAX) <= most);
        assert!(Climber::steer(MAX_SHARE, u64::MAX, 0) >= -most);
    }

    #[test]
    fn a_change_of_the_workloads_phase_cancels_in_the_ratio() {
        // The same split of the hits at a hit rate of 5% and of 50% moves the share alike:
        // a phase that changes how often the cache hits says nothing about the split.
        let (mut quiet, mut busy) = (Feed::new(), Feed::new());
        let a = quiet.split(&[(0.05, 0.2), (0.05, 0.05)]);
        let b = busy.split(&[(0.50, 0.2), (0.05, 0.05)]);
        assert!(a[0].abs_diff(b[0]) <= 2 * ONE / 1000, "{a:?} {b:?}");
        assert!(a[1] < a[0] && b[1] < b[0], "{a:?} {b:?}");
    }

    #[test]
    fn the_share_stays_within_its_bounds() {
        let mut f = Feed::new();
        let all_small = f.split(&[(0.5, 1.0); 100]);
        assert_eq!(*all_small.last().unwrap(), MAX_SHARE);
        let all_main = f.split(&[(0.5, 0.0); 100]);
        assert_eq!(*all_main.last().unwrap(), MIN_SHARE);
        let none = f.split(&[(0.0, 0.0); 10]);
        assert!(none.iter().all(|s| (MIN_SHARE..=MAX_SHARE).contains(s)));
    }

    #[test]
    fn window_is_within_one_and_the_capacity() {
        let c = Climber::new(1_000);
        assert_eq!(c.window(0), 0);
        assert_eq!(c.window(1), 1);
        assert_eq!(c.window(10), 1);
        assert_eq!(
            c.window(100_000),
            (100_000 * u64::from(INITIAL_SHARE)) >> 16
        );
        assert!(c.window(u64::MAX) < u64::MAX / 9);
        let small = Climber::new(100);
        small.share.store(MIN_SHARE, Ordering::Relaxed);
        assert_eq!(
            small.window(100),
            4,
            "four entries' worth, above the 1% share"
        );
        let tiny = Climber::new(8);
        tiny.share.store(MIN_SHARE, Ordering::Relaxed);
        assert_eq!(tiny.window(8), 2, "a quarter of a smaller capacity");
        assert_eq!(small.window(1_000), 40, "a heavier entry's four");
    }

    /// A climber whose last period hit at `start`, then one period per `(rate, visits,
    /// idle)`, counting the visits before it closes; whether aging was on after each.
    fn aging_after(start: f64, periods: &[(f64, u32, u32)]) -> (Feed, Vec<bool>) {
        let mut f = Feed::new();
        f.periods(&[start]);
        let aging = periods
            .iter()
            .map(|&(rate, visits, idle)| {
                f.c.count_pass(visits, idle, 0);
                f.periods(&[rate]);
                f.c.aging()
            })
            .collect();
        (f, aging)
    }

    #[test]
    fn a_fall_then_an_idle_main_queue_ages_it_for_the_watch() {
        // The fall's own period shows a busy main queue; the next ones an idle one (the hot
        // set moved), until the watch of four periods ends.
        let moved = [
            (0.45, 1_000, 300),
            (0.55, 1_000, 800),
            (0.60, 1_000, 900),
            (0.62, 1_000, 500),
            (0.63, 1_000, 900),
        ];
        let (f, aging) = aging_after(0.70, &moved);
        assert_eq!(aging, [false, true, true, true, false]);
        assert_eq!(f.c.visits(), (0, 0), "each close starts over");
    }

    #[test]
    fn a_fall_with_a_busy_main_queue_or_an_idle_one_without_a_fall_ages_nothing() {
        // A scan: the rate falls and comes back, the main queue keeps its hits.
        let scan = [(0.40, 1_000, 300), (0.70, 1_000, 200), (0.45, 1_000, 400)];
        assert_eq!(aging_after(0.70, &scan).1, [false; 3]);
        // A loop: the main queue sits idle, the rate holds.
        let idle = [(0.31, 1_000, 990), (0.29, 1_000, 1_000)];
        assert_eq!(aging_after(0.30, &idle).1, [false; 2]);
    }

    #[test]
    fn too_few_visits_or_counts_out_of_step_age_nothing() {
        let few = MIN_VISITS as u32 - 1;
        let periods = [
            (0.40, few, few),
            (0.41, 0, 0),
            // More idle visits than visits (a wrapped count): nothing seen.
            (0.42, 100, 200),
            (0.43, 100, 100),
        ];
        assert_eq!(aging_after(0.70, &periods).1, [false, false, false, true]);
    }

    #[test]
    fn near_returns_move_the_share_by_their_balance_a_batch_at_a_time() {
        // 160 entries: returns within 10 departures of their queue are near, and a nudge is
        // half an entry's worth of the share.
        let c = Climber::new(160);
        assert_eq!((c.near(), c.grain()), (10, 1));
        let step = (NUDGE * f64::from(ONE) / 160.0) as u32;
        let back = |main: bool, later: u64| {
            let left = c.depart(main);
            (0..later).for_each(|_| {
                let _ = c.depart(main);
            });
            c.returned(left)
        };
        // A small-queue leaver back before any other departure, and a main victim back
        // after nine more main evictions, are near; small-queue departures do not age a
        // main victim, and ten of its own do.
        assert!(back(false, 0) && back(true, 9));
        let left = c.depart(true);
        (0..50).for_each(|_| {
            let _ = c.depart(false);
        });
        assert!(
            c.returned(left),
            "small-queue departures do not age a main victim"
        );
        assert!(!back(true, 10), "ten main departures ago: far");
        assert_eq!(c.nears(), (3, 1), "the far return counts in no batch");
        assert_eq!(
            c.share(),
            INITIAL_SHARE,
            "nothing moves before the batch is full"
        );
        // The batch fills with 22 small-queue returns of 32: 12 beyond the main queue's, at
        // the gate, so the share grows by twelve nudges.
        (0..20).for_each(|_| assert!(back(false, 1)));
        (0..8).for_each(|_| assert!(back(true, 1)));
        assert_eq!(c.nears(), (31, 21));
        assert!(back(false, 0));
        assert_eq!(c.nears(), (0, 0), "a full batch starts the next");
        assert_eq!(c.share(), INITIAL_SHARE + 12 * step);
        // A batch within the gate (21 to 11, 10 beyond) moves nothing; one the other way
        // (10 to 22) moves the share down by twelve.
        (0..21).for_each(|_| {
            let _ = back(false, 0);
        });
        (0..11).for_each(|_| {
            let _ = back(true, 0);
        });
        assert_eq!(c.share(), INITIAL_SHARE + 12 * step);
        (0..10).for_each(|_| {
            let _ = back(false, 0);
        });
        (0..22).for_each(|_| {
            let _ = back(true, 0);
        });
        assert_eq!(c.share(), INITIAL_SHARE);
    }

    #[test]
    fn large_caches_date_departures_in_grains_and_the_stamp_wraps() {
        let c = Climber::new(1 << 20);
        let grain = c.grain();
        assert_eq!((c.near(), grain), (1 << 16, 1 << 10));
        // A hash leaves one departure before the stamp's clock wraps...
        c.clocks[0].store((1 << STAMP_BITS) * grain - 2, Ordering::Relaxed);
        let left = c.depart(false);
        assert_eq!(left.stamp, (1 << STAMP_BITS) - 1);
        // ...and comes back three grains later, after the wrap: near.
        c.clocks[0].fetch_add(3 * grain, Ordering::Relaxed);
        assert!(c.returned(left));
        // A whole reach of grains later: far.
        let left = c.depart(false);
        c.clocks[0].fetch_add((1 << REACH_GRAINS_SHIFT) * grain, Ordering::Relaxed);
        assert!(!c.returned(left));
        // One unit of the share is the least nudge (half an entry is less here): a batch
        // of small-queue returns alone moves the share by 32 units.
        for _ in 0..NEAR_BATCH {
            let left = c.depart(false);
            assert!(c.returned(left));
        }
        assert_eq!(c.share(), INITIAL_SHARE + NEAR_BATCH as u32);
    }

    #[test]
    fn nudges_stay_within_the_bounds_and_add_to_a_close() {
        let c = Climber::new(4);
        let batches = |main: bool, n: u64| {
            for _ in 0..n * NEAR_BATCH {
                let left = c.depart(main);
                c.returned(left);
            }
        };
        // A batch's move of 32 half-entries of four is four capacities: the bound holds.
        batches(false, 3);
        assert_eq!(c.share(), MAX_SHARE);
        batches(true, 3);
        assert_eq!(c.share(), MIN_SHARE);
        // A close moves the share from where the nudges left it.
        let mut f = Feed::new();
        for _ in 0..NEAR_BATCH {
            let left = f.c.depart(false);
            f.c.returned(left);
        }
        let nudged = f.c.share();
        assert!(nudged > INITIAL_SHARE);
        let held = f.periods(&[0.4])[0];
        assert!(held.abs_diff(nudged) <= 2, "{nudged} -> {held}");
    }

    proptest! {
        /// Whatever the counts (lagging, out of step, wrapping, huge; visits, window hits and
        /// the ghost's returns too), the share stays within its bounds, every move is finite and within
        /// MAX_MOVE, the watch never passes its length, and nothing overflows or divides by
        /// zero.
        #[test]
        fn any_counts_keep_the_state_in_bounds(
            entries in 0u64..u64::MAX,
            steps in proptest::collection::vec(
                (0u64..u64::MAX, 0u64..=u64::MAX, 0u64..=u64::MAX),
                1..200,
            ),
        ) {
            let c = Climber::new(entries);
            let mut accesses = 0u64;
            let most = (MAX_MOVE * f64::from(ONE)) as i64;
            for (hits, jump, window) in steps {
                c.count_pass(jump as u32, (jump >> 32) as u32, window >> (jump % 64));
                accesses = accesses.wrapping_add(jump % c.sample().saturating_mul(4));
                let before = c.share();
                c.observe(hits, accesses);
                prop_assert!((MIN_SHARE..=MAX_SHARE).contains(&c.share()));
                prop_assert!(i64::from(c.share()).abs_diff(i64::from(before)) <= most as u64);
                // Returns of any date, from either queue, near or not.
                c.returned(Left { main: jump & 1 == 1, stamp: hits as u32 });
                let _ = c.depart(window & 1 == 1);
                prop_assert!((MIN_SHARE..=MAX_SHARE).contains(&c.share()));
                let share = (window as u32).clamp(MIN_SHARE, MAX_SHARE);
                let moved = Climber::steer(share, hits, window);
                prop_assert!(moved.abs() <= most);
                prop_assert!(c.window(jump) <= jump);
                prop_assert!(c.watch.load(Ordering::Relaxed) <= MOVED_WATCH);
            }
        }
    }
}
