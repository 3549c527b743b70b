//! A count-min sketch of access frequencies (TinyLFU's, after Einziger, Friedman and Manes,
//! "TinyLFU: A Highly Efficient Cache Admission Policy", 2017).
//!
//! Every key counts in four 4-bit counters picked by its hash; its estimate is the smallest of
//! the four, which can only overestimate. Counters saturate at 15. Every `period` additions
//! all counters are halved, so old popularity fades and the sketch tracks the recent past;
//! and earlier, once the policy's duels keep finding their incumbents at 15 (see
//! [`Sketch::at_ceiling`]), so that a saturated sketch ranks keys again.
//!
//! The counters are packed sixteen to an atomic word and updated with a plain load and store,
//! not a compare-and-swap. Each store writes a word read by one load with one counter raised
//! within its four bits, so no counter ever leaves 0..=15. But two threads updating the same
//! word at once can lose one's addition (to any of its sixteen counters), and an addition
//! racing the halving can undo the halving of its word until the next one. Either costs only
//! precision, in a sketch that already overestimates by design, and four compare-and-swaps
//! per addition cost churn more (`docs/EXPERIMENTS.md`). Nothing here is on the hit path: hits
//! are counted in the entry itself and added here when the policy visits the entry.

#![forbid(unsafe_code)]

use super::Tuning;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// The largest value of a counter.
pub(super) const MAX: u64 = 15;
/// Per-row seeds (odd, from the SplitMix64 and golden-ratio families).
const SEEDS: [u64; 4] = [
    0x9E37_79B9_7F4A_7C15,
    0xBF58_476D_1CE4_E5B9,
    0x94D0_49BB_1331_11EB,
    0xD6E8_FEB8_6659_FD93,
];

/// Additions a thread makes before it adds them to the shared count. The per-thread count is
/// shared by every sketch the thread adds to, so a batch is credited to the sketch whose
/// addition completes it: each addition still counts once in expectation, and the halving
/// keeps its pace without a shared read-modify-write per addition.
const BATCH: usize = 16;

crate::sync::local_key! {
    /// The calling thread's additions not yet in any sketch's shared count.
    static ADDS: std::cell::Cell<u32> = std::cell::Cell::new(0);
}

crate::sync::local_key! {
    /// The calling thread's duels at the ceiling (see [`Sketch::at_ceiling`]), modulo
    /// [`Tuning::ceiling_duels`]; shared by every sketch the thread duels in, as `ADDS` is.
    static CEILINGS: std::cell::Cell<u32> = std::cell::Cell::new(0);
}

pub(crate) struct Sketch {
    words: Box<[AtomicU64]>,
    /// Additions since the last halving.
    added: AtomicUsize,
    /// Halve every `period` additions.
    period: usize,
    /// The fewest additions between two halvings: ten per entry, Caffeine's sample.
    shortest: usize,
    /// Duels at the ceiling (per thread) that halve early ([`Sketch::at_ceiling`]).
    ceiling_duels: u32,
}

/// The additions between two halvings for a cache of `entries` entries:
/// [`Tuning::period_per_entry`] per entry (Caffeine's sample size) from
/// [`Tuning::sketch_reach`] entries up, and as many per `√(entries × sketch_reach)` below.
///
/// A small cache's sketch that halves every ten additions per entry forgets a key before
/// it recurs on a trace whose popular keys come back tens of thousands of accesses apart
/// (P3's small caches; `docs/EXPERIMENTS.md` has what the longer period gives and costs).
fn period(entries: usize, t: &Tuning) -> usize {
    let mean = (entries as f64 * t.sketch_reach as f64).sqrt() as usize;
    (t.period_per_entry as usize).saturating_mul(entries.max(mean))
}

/// The words of a sketch for `entries` entries: two per entry (32 counters), and more when
/// the period is long enough that two per entry would put over [`Tuning::counter_load`] of
/// its increments on each counter (four counters per addition, so `4 × period / (16 ×
/// words)` a counter).
///
/// A cache of at least `sketch_reach` entries loads each counter with 1.25 increments a
/// period. A small cache's longer period loaded them far more at two words per entry, so
/// the four counters of a rare key were mostly other keys' counts and the frequent keys'
/// sat at the maximum together: the duel compared noise (`docs/EXPERIMENTS.md`).
fn words(entries: usize, t: &Tuning) -> usize {
    let by_load = period(entries, t).saturating_mul(4) / (16 * t.counter_load as usize);
    (2 * entries).max(by_load).next_power_of_two()
}

impl Sketch {
    /// A sketch for a cache of about `entries` entries: two words (32 counters) per entry,
    /// more for a small cache ([`words`]), halved every [`period`] additions (one word per
    /// entry, Caffeine's sizing, collided more, `docs/EXPERIMENTS.md`). Under loom, four words.
    pub(crate) fn new(entries: usize, tuning: &Tuning) -> Self {
        let entries = entries.clamp(16, 1 << 24);
        let words = if cfg!(runcache_loom) {
            4
        } else {
            words(entries, tuning)
        };
        Self {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            added: AtomicUsize::new(0),
            period: period(entries, tuning),
            shortest: (tuning.period_per_entry as usize).saturating_mul(entries),
            ceiling_duels: tuning.ceiling_duels,
        }
    }

    /// The word and the bit shift of the counter that row `row` gives `hash`.
    #[inline]
    fn spot(&self, hash: u64, row: usize) -> (&AtomicU64, u32) {
        let x = (hash ^ SEEDS[row]).wrapping_mul(SEEDS[(row + 1) & 3]);
        let x = x ^ (x >> 29);
        let word = (x >> 8) as usize & (self.words.len() - 1);
        (&self.words[word], ((x & 15) as u32) * 4)
    }

    /// Adds `n` accesses of `hash` (each counter saturates at 15).
    pub(crate) fn add(&self, hash: u64, n: u64) {
        if n == 0 {
            return;
        }
        for row in 0..4 {
            let (word, shift) = self.spot(hash, row);
            // Relaxed: the counters are statistics (see the module's doc on lost updates).
            let w = word.load(Ordering::Relaxed);
            let c = (w >> shift) & MAX;
            if c < MAX {
                word.store(w + (((c + n).min(MAX) - c) << shift), Ordering::Relaxed);
            }
        }
        // Each thread adds its additions to the shared count `BATCH` at a time. Relaxed: only
        // paces the halving.
        if super::tick(&ADDS, BATCH as u32) {
            let before = self.added.fetch_add(BATCH, Ordering::Relaxed);
            if before < self.period && before + BATCH >= self.period {
                self.halve();
            }
        }
    }

    /// Tells the sketch that a duel found every incumbent it weighed at the counters'
    /// ceiling ([`MAX`]), where no newcomer can be estimated above it: the sketch no longer
    /// ranks the keys at the cache's edge. After [`Tuning::ceiling_duels`] such duels, and once
    /// ten additions per entry have passed since the last halving, every counter is halved now
    /// instead of at the end of the period.
    ///
    /// A small cache's period is long ([`period`]); where a few keys come back far more
    /// often (a program's loops), their counters reach 15 long before it ends, a phase that
    /// is over holds the main queue on ceiling counts, and newcomers lose every duel (the
    /// LIRS traces' main queues froze). The ceiling halves such a sketch as often as its keys
    /// saturate it; one whose counters stay under the ceiling keeps its period.
    pub(crate) fn at_ceiling(&self) {
        // Each thread counts its own duels at the ceiling, as it counts its additions, so a
        // duel adds no shared read-modify-write to the eviction path.
        if !super::tick(&CEILINGS, self.ceiling_duels) {
            return;
        }
        // Relaxed: paces the halving, as the additions do. The one thread whose update takes
        // the count of additions back to 0 halves.
        if self
            .added
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
                (a >= self.shortest).then_some(0)
            })
            .is_ok()
        {
            self.halve();
        }
    }

    /// The estimated recent access count of `hash`.
    pub(crate) fn estimate(&self, hash: u64) -> u64 {
        (0..4)
            .map(|row| {
                let (word, shift) = self.spot(hash, row);
                // Relaxed: see `add`.
                (word.load(Ordering::Relaxed) >> shift) & MAX
            })
            .min()
            .unwrap_or(0)
    }

    /// Whether `hash`'s estimate is at least `k`: [`estimate`](Self::estimate) `>= k`, but
    /// it stops at the first counter under `k`, which for most keys (seen once or twice)
    /// is the first one read.
    pub(crate) fn at_least(&self, hash: u64, k: u64) -> bool {
        (0..4).all(|row| {
            let (word, shift) = self.spot(hash, row);
            // Relaxed: see `add`.
            (word.load(Ordering::Relaxed) >> shift) & MAX >= k
        })
    }

    /// Halves the four counters of `hash`: a frequent key that stopped being used loses its
    /// weight in the duel at once instead of at the next halving of every counter (**P5**).
    /// The counters it shares with other keys are halved for them too, as every halving
    /// halves them; an addition racing the decay may undo it for one word, as it may undo a
    /// halving (see the module's doc).
    pub(crate) fn decay(&self, hash: u64) {
        for row in 0..4 {
            let (word, shift) = self.spot(hash, row);
            // Relaxed: see `add`.
            let w = word.load(Ordering::Relaxed);
            let c = (w >> shift) & MAX;
            // Takes the counter from c to c / 2, within its four bits.
            word.store(w - ((c - c / 2) << shift), Ordering::Relaxed);
        }
    }

    /// Halves every counter. Only the thread whose addition reached the period runs it, or
    /// the one whose duel at the ceiling took the additions' count back to 0
    /// ([`at_ceiling`](Self::at_ceiling)).
    fn halve(&self) {
        for word in self.words.iter() {
            // Relaxed: see `add`.
            word.store(
                (word.load(Ordering::Relaxed) >> 1) & 0x7777_7777_7777_7777,
                Ordering::Relaxed,
            );
        }
        // Relaxed: see `add`.
        self.added.store(0, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;

    const T: &Tuning = &Tuning::DEFAULT;
    const REACH: usize = T.sketch_reach as usize;
    const LOAD: usize = T.counter_load as usize;
    const CEILING_DUELS: u32 = T.ceiling_duels;

    #[test]
    fn estimates_count_additions_saturate_and_fade() {
        let s = Sketch::new(1024, T);
        assert_eq!(s.estimate(42), 0);
        s.add(42, 3);
        s.add(42, 1);
        assert_eq!(s.estimate(42), 4);
        s.add(42, 100);
        assert_eq!(s.estimate(42), MAX, "counters saturate");
        assert!(s.at_least(42, MAX) && !s.at_least(7, 2));
        s.add(43, 3);
        assert!(
            s.at_least(43, 3) && !s.at_least(43, 4),
            "as the estimate, 3"
        );
        // Nothing else was added, so no other key shares all four counters.
        assert!(s.estimate(7) <= 1);
        // Reaching the period halves everything (additions reach the shared count in batches,
        // so one more batch makes sure it is crossed).
        for k in 0..(s.period + BATCH) as u64 {
            s.add(1_000_000 + k, 1);
        }
        assert!(s.estimate(42) <= 8, "halved: {}", s.estimate(42));
    }

    #[test]
    fn duels_at_the_ceiling_halve_early_but_not_within_ten_additions_an_entry() {
        let s = Sketch::new(64, T);
        assert_eq!((s.shortest, s.period), (640, 10_240));
        s.add(42, 100);
        assert_eq!(s.estimate(42), MAX);
        // Too soon after the last halving: the duels are counted, nothing is halved.
        for _ in 0..2 * CEILING_DUELS {
            s.at_ceiling();
        }
        assert_eq!(
            s.estimate(42),
            MAX,
            "under ten additions an entry since the start"
        );
        // Ten additions an entry later (well short of the period), the sixteenth duel at the
        // ceiling halves every counter, once.
        for k in 0..(s.shortest + BATCH) as u64 {
            s.add(1_000_000 + k, 1);
        }
        for _ in 0..CEILING_DUELS - 1 {
            s.at_ceiling();
        }
        assert_eq!(s.estimate(42), MAX, "fifteen duels are not enough");
        s.at_ceiling();
        assert_eq!(s.estimate(42), 7, "halved once");
        // It starts over: the next halving needs as many duels and additions again.
        for _ in 0..CEILING_DUELS {
            s.at_ceiling();
        }
        assert_eq!(s.estimate(42), 7, "no additions since the halving");
        for k in 0..(s.shortest + BATCH) as u64 {
            s.add(2_000_000 + k, 1);
        }
        for _ in 0..CEILING_DUELS - 1 {
            s.at_ceiling();
        }
        assert_eq!(s.estimate(42), 7);
        s.at_ceiling();
        assert_eq!(s.estimate(42), 3);
    }

    #[test]
    fn a_decay_halves_one_keys_counters() {
        let s = Sketch::new(1024, T);
        s.add(42, 13);
        s.add(7, 9);
        s.decay(42);
        assert_eq!(s.estimate(42), 6, "13 halved, rounded down");
        assert_eq!(s.estimate(7), 9, "another key keeps its counts");
        s.decay(42);
        s.decay(42);
        s.decay(42);
        assert_eq!(s.estimate(42), 0, "down to 0, never below");
        s.decay(42);
        assert_eq!(s.estimate(42), 0);
        s.add(42, 1);
        assert_eq!(s.estimate(42), 1, "a decayed key counts again from 0");
    }

    #[test]
    fn small_sketches_halve_later_large_ones_at_ten_per_entry() {
        // Below `REACH` entries the period is ten per √(entries × REACH)...
        assert_eq!(period(1024, T), 10 * 4096);
        assert_eq!(period(16, T), 10 * 512);
        // ...which never falls under ten per entry, and meets it at `REACH`.
        assert_eq!(period(REACH, T), 10 * REACH);
        assert_eq!(period(1 << 20, T), 10 << 20);
        for entries in [16, 100, 763, 5000, REACH - 1, REACH + 1, 1 << 22] {
            assert!(period(entries, T) >= 10 * entries, "{entries}");
        }
    }

    #[test]
    fn small_sketches_widen_so_no_counter_takes_over_five_increments_a_period() {
        // Two words an entry where that keeps the load under five: every cache from 1,024 up.
        assert_eq!(words(REACH, T), 2 * REACH);
        assert_eq!(words(1 << 20, T), 2 << 20);
        assert_eq!(words(1024, T), 2048);
        assert_eq!(words(763, T), 2048, "4 × 35,350 / 80 = 1,767 words");
        // Below, the width follows the period: 47 entries halve every 8,770 additions.
        assert_eq!(words(47, T), 512, "4 × 8,770 / 80 = 438 words, not 128");
        for entries in [
            16,
            47,
            100,
            763,
            1023,
            1024,
            5000,
            REACH - 1,
            REACH,
            1 << 22,
        ] {
            let counters = 16 * words(entries, T);
            let load = (4 * period(entries, T)) as f64 / counters as f64;
            assert!(
                load <= LOAD as f64,
                "{entries} entries: {load} increments a counter"
            );
            assert!(
                words(entries, T) >= 2 * entries,
                "{entries}: two words an entry at least"
            );
        }
    }
}
