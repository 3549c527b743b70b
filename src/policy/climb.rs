//! The small queue's share of the capacity (**P3**), and aging when the hot set moves
//! (**P5**); `docs/DESIGN.md`, "What adapts, and what forgets", says what each does and why.
//!
//! At the close of each sampling period ([`Climber::sample`] accesses) the share moves by
//! [`Tuning::gain`] times the log of the ratio of the two queues' hit densities (hits per unit
//! of room), as Caffeine's window climber does for large caches (`ben-manes/caffeine`,
//! `.claude/docs/hill-climber.md`); both densities come from one period, so a change of the
//! workload's phase cancels in the ratio. Between closes the ghost's near returns nudge it
//! (`near.rs`). A period whose hit rate fell by [`Tuning::moved_fall`] opens a watch, and a
//! period of the watch with half the main queue's visits idle turns aging on for the next.
//!
//! Nothing here is written on the hit path: the hit rate comes from the cache's per-thread
//! statistics, summed by the evictor (`raw/evict.rs`), and a small-queue entry's hits are read
//! from its meta when it leaves the queue.
//!
//! **P3 (adaptive share).** The small queue's share is a hint that evictors read and one
//! evictor at a time moves: the thread whose compare-and-swap moves the sampling period's start
//! closes the period and writes the new share; the others go on with the share they read.
//! A pass counts the hits of the entries it takes off the small queue in its own
//! cell and adds them to the period's count once, when it ends, as it does its visits (P5). The
//! share stays within its bounds whatever the counts read, so a stale or torn view only sizes a
//! decision by the previous period, and hits counted into the next period only move one
//! period's share by their weight.
//!
//! **P5 (aging).** Aging is a hint, like the share: the evictor that closes a sampling period
//! writes it (P3), and every pass reads it once. A pass counts its visits of main-queue entries
//! in its own cells and adds them to the period's count once, when it ends (one
//! read-modify-write per pass, none per entry, none on a hit). A stale read ages, or spares,
//! the idle entries of one pass; a decay halves four counters with the sketch's own load and
//! store, so like an addition it can be lost to a racing update but never takes a counter out
//! of 0..=15.

use super::near::{Left, NearReturns};
use super::tuning::{Tuning, ONE};
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// `Climber::start` before the first period begins.
const NOT_BEGUN: u64 = u64::MAX;
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
    small_hits: AtomicU64,
    /// The periods left in the watch that a fall of the hit rate opened (**P5**).
    watch: AtomicU32,
    /// Whether the main queue's idle entries lose sketch counts in this period (**P5**).
    aging: AtomicBool,
    /// The queues' clocks and the batch of near returns under way (**P9**).
    near_returns: NearReturns,
    tuning: &'static Tuning,
}

impl Climber {
    /// A climber for a cache expected to hold `entries` entries, starting at
    /// [`Tuning::initial_share`].
    pub(super) fn new(entries: u64, tuning: &'static Tuning) -> Self {
        Self {
            share: AtomicU32::new(tuning.initial_share),
            rate: AtomicU64::new(f64::NAN.to_bits()),
            start: AtomicU64::new(NOT_BEGUN),
            start_hits: AtomicU64::new(0),
            entries: AtomicU64::new(entries),
            visits: AtomicU64::new(0),
            small_hits: AtomicU64::new(0),
            watch: AtomicU32::new(0),
            aging: AtomicBool::new(false),
            near_returns: NearReturns::new(tuning),
            tuning,
        }
    }

    /// Counts an entry leaving the small queue (`main` false) or evicted from the main
    /// queue on its queue's clock, and returns the [`Left`] the ghost keeps if it
    /// remembers the hash (**P9**).
    pub(super) fn depart(&self, main: bool) -> Left {
        self.near_returns.depart(main, self.entries())
    }

    /// A hash the ghost remembered as `left` came back (missed): if it is a near return,
    /// counts it, and moves the share by the batch it fills (**P9**). Returns whether it
    /// was near.
    pub(super) fn returned(&self, left: Left) -> bool {
        let entries = self.entries();
        let near = self.near_returns.is_near(left, entries);
        if near {
            if let Some(beyond) = self.near_returns.count(!left.main) {
                self.nudge(beyond);
            }
        }
        near
    }

    /// The batch of near returns under way: all of them, and the small queue's of them.
    #[cfg(test)]
    pub(super) fn nears(&self) -> (u64, u64) {
        self.near_returns.batch()
    }

    /// Moves the share by `times` nudges (each an entry's worth times [`Tuning::nudge`], at
    /// least one unit of the share), up for a positive `times`: a batch of near returns' move.
    fn nudge(&self, times: i64) {
        let step =
            (self.tuning.nudge * f64::from(ONE) / self.entries().max(1) as f64).max(1.0) as i64;
        self.shift(step.saturating_mul(times));
    }

    /// Moves the share by `by` units, within [`Tuning::min_share`, `Tuning::max_share`].
    fn shift(&self, by: i64) {
        let (least, most) = (self.tuning.min_share, self.tuning.max_share);
        // Relaxed: the share is a hint (P3); one read-modify-write, so a nudge racing a
        // period's close (or another nudge) adds to it instead of being overwritten.
        let _ = self
            .share
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |share| {
                let next = (i64::from(share) + by).clamp(i64::from(least), i64::from(most));
                // In bounds, so the cast keeps the value.
                Some(next as u32)
            });
    }

    /// Counts what one eviction pass saw: `visits` visits of main-queue entries, `idle` of
    /// which found the entry not hit since the policy's last visit, and `small_hits` hits
    /// of the entries that left the small queue. An evictor calls it once per pass, not per
    /// entry.
    pub(super) fn count_pass(&self, visits: u32, idle: u32, small_hits: u64) {
        // Relaxed: statistics for the period's close. A period with over 2^32 visits would
        // carry into the idle count; the close treats an idle count above the visits as
        // nothing seen.
        if visits > 0 {
            self.visits
                .fetch_add(u64::from(idle) << 32 | u64::from(visits), Ordering::Relaxed);
        }
        if small_hits > 0 {
            self.small_hits.fetch_add(small_hits, Ordering::Relaxed);
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
    pub(super) fn small_hits(&self) -> u64 {
        self.small_hits.load(Ordering::Relaxed)
    }

    /// Closes the watch's part of a period whose hit rate changed by `change` and whose visits
    /// `counts` counted (packed as in the `visits` field): opens the watch on a fall of
    /// [`Tuning::moved_fall`] or more, and turns aging on for the next period if the watch is open
    /// and at least half of the period's visits found the entry idle.
    fn close_watch(&self, change: f64, counts: u64) {
        let (visits, idle) = (counts & VISITS, counts >> 32);
        let idle_main = visits >= self.tuning.min_visits && idle <= visits && 2 * idle >= visits;
        // Relaxed: see `aging`; only the thread that closes the period writes these.
        let watch = if change <= -self.tuning.moved_fall {
            self.tuning.moved_watch
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

    /// Sizes the floor of the small queue's room and the sampling period for `entries` entries
    /// (**P4**).
    pub(super) fn resize(&self, entries: u64) {
        // Relaxed: see `entries`.
        self.entries.store(entries, Ordering::Relaxed);
    }

    /// The small queue's part of `capacity` now: the share's, but at least
    /// [`Tuning::floor_entries`] entries' worth or a quarter of the capacity, whichever is less,
    /// and at least 1.
    pub(super) fn small_room(&self, capacity: u64) -> u64 {
        // Relaxed: a sizing hint; a stale share only sizes one decision by the last period.
        let share = u128::from(self.share.load(Ordering::Relaxed));
        let room = (u128::from(capacity) * share) >> 16;
        let floor = (u128::from(self.tuning.floor_entries) * u128::from(capacity)
            / u128::from(self.entries().max(1)))
        .min(u128::from(capacity / 4)) as u64;
        (room as u64).max(floor).clamp(1.min(capacity), capacity)
    }

    /// The current share, in 1/65,536 of the capacity.
    pub(super) fn share(&self) -> u32 {
        // Relaxed: as in `small_room`.
        self.share.load(Ordering::Relaxed)
    }

    /// Accesses per period: four per expected entry, at least [`Tuning::min_sample`].
    pub(super) fn sample(&self) -> u64 {
        self.entries().saturating_mul(4).max(self.tuning.min_sample)
    }

    /// The share's move, in 1/65,536 of the capacity, for a period in which a small queue
    /// of `share` earned `small_hits` of the `hits`: [`Tuning::gain`] times the log of the
    /// ratio of the two queues' densities, within [`Tuning::max_move`] either way.
    fn steer(&self, share: u32, hits: u64, small_hits: u64) -> i64 {
        let Tuning {
            gain,
            max_move,
            prior_hits,
            ..
        } = *self.tuning;
        let w = f64::from(share.clamp(1, ONE - 1)) / f64::from(ONE);
        // Counted as they leave the small queue, a period's small-queue hits can include hits of
        // the period before; the main queue's are what is left, never below 0.
        let main_hits = hits.saturating_sub(small_hits) as f64;
        let small = (small_hits as f64 + prior_hits) / w;
        let main = (main_hits + prior_hits) / (1.0 - w);
        // Both densities are positive and finite, so the log is finite.
        let error = (small / main).ln();
        ((gain * error).clamp(-max_move, max_move) * f64::from(ONE)) as i64
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
        let small_hits = self.small_hits.swap(0, Ordering::Relaxed);
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
        self.shift(self.steer(share, period_hits, small_hits));
        true
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;

    const T: &Tuning = &Tuning::DEFAULT;
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
            let c = Climber::new(100, T);
            assert!(!c.observe(0, 1_000), "the first call only begins a period");
            Self {
                c,
                hits: 0,
                accesses: 1_000,
            }
        }

        /// Runs one full period per `(rate, small)`: the period hits at `rate`, and the
        /// small queue's leavers had `small` of those hits. Returns the share after each.
        fn split(&mut self, periods: &[(f64, f64)]) -> Vec<u32> {
            let n = self.c.sample();
            periods
                .iter()
                .map(|&(rate, small)| {
                    let hits = (rate * n as f64) as u64;
                    self.c.count_pass(0, 0, (small * hits as f64) as u64);
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
            let small = f64::from(self.c.share()) / f64::from(ONE);
            let split: Vec<_> = rates.iter().map(|&r| (r, small)).collect();
            self.split(&split)
        }
    }

    #[test]
    fn the_first_call_begins_a_period_and_a_period_closes_when_full() {
        let mut f = Feed::new();
        assert_eq!(
            f.c.sample(),
            T.min_sample,
            "small caches sample at least T.min_sample"
        );
        assert!(
            !f.c.observe(10, f.accesses + T.min_sample - 1),
            "a period not yet full"
        );
        f.c.count_pass(0, 0, 7);
        assert_eq!(f.c.small_hits(), 7);
        f.periods(&[0.5]);
        assert!(f.c.rate.load(Ordering::Relaxed) == 0.5f64.to_bits());
        assert_eq!(f.c.small_hits(), 0, "each close starts over");
    }

    #[test]
    fn the_share_follows_the_queue_that_earns_more_for_its_room() {
        let mut f = Feed::new();
        // At a 10% share, a small queue earning 30% of the hits is three times as dense as
        // the main queue: the share grows, and goes on growing while that holds.
        let up = f.split(&[(0.4, 0.3), (0.4, 0.3)]);
        assert!(up[0] > T.initial_share && up[1] > up[0], "{up:?}");
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
        let w = T.initial_share;
        let mild = Climber::new(100, T).steer(w, 10_000, 2_000);
        let strong = Climber::new(100, T).steer(w, 10_000, 8_000);
        assert!(0 < mild && mild < strong, "{mild} {strong}");
        // A log ratio of 2 (densities e² apart) moves the share by 2 × T.gain.
        let main_hits = 9_000.0;
        let small = (main_hits + T.prior_hits) / 9.0 * 2f64.exp() - T.prior_hits;
        let two = Climber::new(100, T).steer(w, main_hits as u64 + small as u64, small as u64);
        let expected = 2.0 * T.gain * f64::from(ONE);
        assert!((two as f64 - expected).abs() < 0.01 * expected, "{two}");
        // Hits only in the small queue, or only in the main one, move by at most T.max_move.
        let most = (T.max_move * f64::from(ONE)) as i64;
        assert!(Climber::new(100, T).steer(T.min_share, u64::MAX, u64::MAX) <= most);
        assert!(Climber::new(100, T).steer(T.max_share, u64::MAX, 0) >= -most);
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
        assert_eq!(*all_small.last().unwrap(), T.max_share);
        let all_main = f.split(&[(0.5, 0.0); 100]);
        assert_eq!(*all_main.last().unwrap(), T.min_share);
        let none = f.split(&[(0.0, 0.0); 10]);
        assert!(none.iter().all(|s| (T.min_share..=T.max_share).contains(s)));
    }

    #[test]
    fn the_small_room_is_within_one_and_the_capacity() {
        let c = Climber::new(1_000, T);
        assert_eq!(c.small_room(0), 0);
        assert_eq!(c.small_room(1), 1);
        assert_eq!(c.small_room(10), 1);
        assert_eq!(
            c.small_room(100_000),
            (100_000 * u64::from(T.initial_share)) >> 16
        );
        assert!(c.small_room(u64::MAX) < u64::MAX / 9);
        let small = Climber::new(100, T);
        small.share.store(T.min_share, Ordering::Relaxed);
        assert_eq!(
            small.small_room(100),
            4,
            "four entries' worth, above the 1% share"
        );
        let tiny = Climber::new(8, T);
        tiny.share.store(T.min_share, Ordering::Relaxed);
        assert_eq!(tiny.small_room(8), 2, "a quarter of a smaller capacity");
        assert_eq!(small.small_room(1_000), 40, "a heavier entry's four");
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
        let few = T.min_visits as u32 - 1;
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
        let c = Climber::new(160, T);
        assert_eq!(NearReturns::new(T).near(160), 10);
        let step = (T.nudge * f64::from(ONE) / 160.0) as u32;
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
            T.initial_share,
            "nothing moves before the batch is full"
        );
        // The batch fills with 22 small-queue returns of 32: 12 beyond the main queue's, at
        // the gate, so the share grows by twelve nudges.
        (0..20).for_each(|_| assert!(back(false, 1)));
        (0..8).for_each(|_| assert!(back(true, 1)));
        assert_eq!(c.nears(), (31, 21));
        assert!(back(false, 0));
        assert_eq!(c.nears(), (0, 0), "a full batch starts the next");
        assert_eq!(c.share(), T.initial_share + 12 * step);
        // A batch within the gate (21 to 11, 10 beyond) moves nothing; one the other way
        // (10 to 22) moves the share down by twelve.
        (0..21).for_each(|_| {
            let _ = back(false, 0);
        });
        (0..11).for_each(|_| {
            let _ = back(true, 0);
        });
        assert_eq!(c.share(), T.initial_share + 12 * step);
        (0..10).for_each(|_| {
            let _ = back(false, 0);
        });
        (0..22).for_each(|_| {
            let _ = back(true, 0);
        });
        assert_eq!(c.share(), T.initial_share);
    }

    #[test]
    fn nudges_stay_within_the_bounds_and_add_to_a_close() {
        let c = Climber::new(4, T);
        let batches = |main: bool, n: u64| {
            for _ in 0..n * T.near_batch {
                let left = c.depart(main);
                c.returned(left);
            }
        };
        // A batch's move of 32 half-entries of four is four capacities: the bound holds.
        assert_eq!(T.near_batch, 32);
        batches(false, 3);
        assert_eq!(c.share(), T.max_share);
        batches(true, 3);
        assert_eq!(c.share(), T.min_share);
        // A close moves the share from where the nudges left it.
        let mut f = Feed::new();
        for _ in 0..T.near_batch {
            let left = f.c.depart(false);
            f.c.returned(left);
        }
        let nudged = f.c.share();
        assert!(nudged > T.initial_share);
        let held = f.periods(&[0.4])[0];
        assert!(held.abs_diff(nudged) <= 2, "{nudged} -> {held}");
    }

    proptest! {
        /// Whatever the counts (lagging, out of step, wrapping, huge; visits, small-queue hits
        /// and the ghost's returns too), the share stays within its bounds, every move is
        /// finite and within T.max_move, the watch never passes its length, and nothing
        /// overflows or divides by zero.
        #[test]
        fn any_counts_keep_the_state_in_bounds(
            entries in 0u64..u64::MAX,
            steps in proptest::collection::vec(
                (0u64..u64::MAX, 0u64..=u64::MAX, 0u64..=u64::MAX),
                1..200,
            ),
        ) {
            let c = Climber::new(entries, T);
            let mut accesses = 0u64;
            let most = (T.max_move * f64::from(ONE)) as i64;
            for (hits, jump, small) in steps {
                c.count_pass(jump as u32, (jump >> 32) as u32, small >> (jump % 64));
                accesses = accesses.wrapping_add(jump % c.sample().saturating_mul(4));
                let before = c.share();
                c.observe(hits, accesses);
                prop_assert!((T.min_share..=T.max_share).contains(&c.share()));
                prop_assert!(i64::from(c.share()).abs_diff(i64::from(before)) <= most as u64);
                // Returns of any date, from either queue, near or not.
                c.returned(Left { main: jump & 1 == 1, stamp: hits as u32 });
                let _ = c.depart(small & 1 == 1);
                prop_assert!((T.min_share..=T.max_share).contains(&c.share()));
                let share = (small as u32).clamp(T.min_share, T.max_share);
                let moved = Climber::new(100, T).steer(share, hits, small);
                prop_assert!(moved.abs() <= most);
                prop_assert!(c.small_room(jump) <= jump);
                prop_assert!(c.watch.load(Ordering::Relaxed) <= T.moved_watch);
            }
        }
    }
}
