//! The policy's state in each entry (a byte of frequency, hit count and marks, the stage of
//! a cold admission, and the queued flag, **P1**), and what the policy asks of a queued entry.
//!
//! **P1 (one claim).** An entry is queued at most once in its life, by the one caller whose
//! swap turned its `queued` flag on ([`EntryMeta::claim`]): an admission of a queueing cache or
//! the engine's sweep, whichever comes first. A queued entry moves between queues by pop and
//! push and is never queued beside itself, so every queue entry is claimed and no entry is
//! counted twice in the queues' totals.

use crate::sync::{AtomicBool, AtomicU8, Ordering};
use std::cell::Cell;

/// The highest frequency an entry records (the state byte's bits 0–1).
pub(super) const MAX_FREQ: u8 = 3;
/// The state byte's bits of the frequency.
const FREQ: u8 = MAX_FREQ;
/// The most hits an entry counts between two visits of the policy (4 bits).
pub(super) const MAX_HITS: u8 = 15;
/// Where the hit count starts in the state byte (bits 2–5).
const HITS_SHIFT: u32 = 2;
/// The state byte of an entry whose frequency and hit count are both at their maxima.
const SATURATED: u8 = MAX_FREQ | MAX_HITS << HITS_SHIFT;
/// The meta bit of an entry admitted while the cache was under half full, whose admission
/// the sketch has not recorded yet: the policy's first visit records it with the hits.
pub(super) const UNRECORDED: u8 = 1 << 6;
/// The meta bit of an entry that won its place in the main queue by one, sent back by the
/// ghost alone (`narrow.rs`): it waits there for the hit that proves the win.
const WON_BY_ONE: u8 = 1 << 7;
/// The bits a hit and a visit keep beside the frequency and the hit count.
const MARKS: u8 = UNRECORDED | WON_BY_ONE;

/// Per-entry policy state, kept in the table's node.
#[derive(Debug)]
pub(crate) struct EntryMeta {
    /// The state byte. Bits 0–1: the CLOCK frequency (0..=`MAX_FREQ`); bits 2–5: hits since
    /// the policy last visited the entry (0..=`MAX_HITS`), which the visit adds to the
    /// sketch; bit 6: [`UNRECORDED`]; bit 7: [`WON_BY_ONE`]. Read and written through the
    /// methods below only.
    state: AtomicU8,
    /// Whether the entry was ever queued (**P1**): set once, by the one caller whose swap
    /// turns it on, which then queues the entry. A byte of its own: `touch` writes `state`
    /// with a plain store, which could lose a bit set beside it.
    queued: AtomicBool,
    /// For an entry admitted while the cache was under half full: how full it was then, in
    /// [`Tuning::stages`](super::Tuning::stages) stages of the half (**P6**). The engine's sweep
    /// enlists such entries in table order, which the hasher's seed decides; the stage puts them
    /// back in the order they came. Written once, before the entry is published to the queues.
    stage: AtomicU8,
}

impl EntryMeta {
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU8::new(0),
            queued: AtomicBool::new(false),
            stage: AtomicU8::new(0),
        }
    }

    /// Starts the state of an entry being admitted: no hits, the frequency `freq` (1 for a
    /// hash the ghost remembered, else 0), and the [`UNRECORDED`] mark if the sketch has not
    /// heard the admission.
    pub(super) fn start(&self, freq: u8, unrecorded: bool) {
        let mark = if unrecorded { UNRECORDED } else { 0 };
        // Relaxed: see `touch`; written before the entry is queued.
        self.state
            .store(freq.min(MAX_FREQ) | mark, Ordering::Relaxed);
    }

    /// Records the stage of a cold admission (**P6**).
    pub(super) fn set_stage(&self, stage: u8) {
        // Relaxed: written before the entry is published; the queue push that hands the
        // entry to the sweep's readers orders it.
        self.stage.store(stage, Ordering::Relaxed);
    }

    /// The stage of the entry's cold admission (**P6**); 0 for one admitted warm.
    pub(super) fn stage(&self) -> usize {
        // Relaxed: see `set_stage`.
        usize::from(self.stage.load(Ordering::Relaxed))
    }

    /// Claims the right to queue the entry: `true` for the first caller only (**P1**).
    pub(crate) fn claim(&self) -> bool {
        // Relaxed: only the swap's atomicity matters (one claimer); the queue's own push
        // publishes the entry to whoever pops it.
        !self.queued.swap(true, Ordering::Relaxed)
    }

    /// Whether the entry was ever queued (for `validate`).
    pub(crate) fn is_claimed(&self) -> bool {
        // Relaxed: read in a quiet cache.
        self.queued.load(Ordering::Relaxed)
    }

    /// Records a hit: raises the frequency and the hit count unless both are at their
    /// maxima, so a hot entry's hits write nothing until the policy next visits it.
    #[inline]
    pub(crate) fn touch(&self) {
        // Relaxed: a frequency hint; a lost update (a hit racing the evictor's `fetch_and`,
        // say) only costs precision.
        let b = self.state.load(Ordering::Relaxed);
        if b & !MARKS == SATURATED {
            return;
        }
        let (f, h) = (b & FREQ, b >> HITS_SHIFT & MAX_HITS);
        let next = (f + 1).min(MAX_FREQ) | (h + 1).min(MAX_HITS) << HITS_SHIFT | b & MARKS;
        if next != b {
            self.state.store(next, Ordering::Relaxed);
        }
    }

    /// The CLOCK frequency.
    pub(super) fn freq(&self) -> u8 {
        // Relaxed: see `touch`.
        self.state.load(Ordering::Relaxed) & FREQ
    }

    /// Sets the CLOCK frequency to `f`, keeping the hit count and the marks.
    pub(super) fn set_freq(&self, f: u8) {
        // Relaxed: see `touch`.
        let _ = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b & !FREQ | f.min(MAX_FREQ))
            });
    }

    /// Takes the hits counted since the last visit: returns them, and the accesses the sketch
    /// has not recorded yet (the hits, plus the admission of an entry admitted cold).
    pub(super) fn take_hits(&self) -> (u8, u64) {
        // Relaxed: see `touch`.
        let b = self.state.fetch_and(FREQ | WON_BY_ONE, Ordering::Relaxed);
        let hits = b >> HITS_SHIFT & MAX_HITS;
        (hits, u64::from(hits) + u64::from(b & UNRECORDED != 0))
    }

    /// Marks an entry that won its place in the main queue by one (`narrow.rs`).
    pub(super) fn mark_won_by_one(&self) {
        // Relaxed: see `touch`. A hit's plain store racing this can lose the mark, which
        // only leaves one win unmeasured.
        self.state.fetch_or(WON_BY_ONE, Ordering::Relaxed);
    }

    /// Clears the entry's [`WON_BY_ONE`] mark; `true` if it was set.
    pub(super) fn settle_won_by_one(&self) -> bool {
        // Relaxed: see `touch`. Read first, so that the visits of unmarked entries (nearly
        // all) write nothing more.
        self.state.load(Ordering::Relaxed) & WON_BY_ONE != 0
            && self.state.fetch_and(!WON_BY_ONE, Ordering::Relaxed) & WON_BY_ONE != 0
    }
}

crate::sync::local_key! {
    /// The calling thread's admissions, modulo the compaction check's pace.
    pub(super) static ADMITS: Cell<u32> = Cell::new(0);
}

crate::sync::local_key! {
    /// The calling thread's evictions, modulo the climber's pace (see `EvictionPolicy::adapt_due`).
    pub(super) static EVICTS: Cell<u32> = Cell::new(0);
}

/// Counts one event on the calling thread's `counter`; `true` once every `every` events.
/// Pacing per thread keeps a shared counter's read-modify-write off every miss; a thread that
/// cannot read its counter (during teardown) always says `true`, which only checks sooner.
pub(crate) fn tick(counter: &'static crate::sync::LocalKey<Cell<u32>>, every: u32) -> bool {
    counter
        .try_with(|c| {
            let n = c.get() + 1;
            let due = n >= every;
            c.set(if due { 0 } else { n });
            due
        })
        .unwrap_or(true)
}

/// What the policy needs to know about a queued entry.
pub(crate) trait Queued {
    fn meta(&self) -> &EntryMeta;
    /// The entry's weight, fixed before it was admitted (the queues' totals count it).
    fn weight(&self) -> u64;
    /// The entry's hash (for the ghost).
    fn hash(&self) -> u64;
    /// Whether the entry still holds a cached value.
    fn is_cached(&self) -> bool;
    /// The entry's identity (its address), for
    /// [`EvictionPolicy::validate`](super::EvictionPolicy::validate).
    fn id(&self) -> usize;
}
