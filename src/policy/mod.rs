//! Eviction: the queues of S3-FIFO (Yang et al., SOSP 2023) with TinyLFU's frequency duel
//! (Einziger et al., 2017), sized by weight.
//!
//! New entries join a small queue; one that proves itself there (hit, or remembered by the
//! ghost of evicted hashes) moves to the main queue, a CLOCK; the others leave to the ghost
//! unless a count-min sketch counts them more often than the main queue's victims they would
//! displace. A newcomer heavier than the small queue's room is judged that way at the door,
//! before it takes any. The small queue's share adapts to what each queue earns. A hit writes
//! only the entry's own state byte, and only while it can still grow. `docs/DESIGN.md`,
//! "Eviction", describes each rule, `docs/EXPERIMENTS.md` the measurements behind it, and
//! [`Tuning`] holds every value they are tuned by.
//!
//! The queues are `crossbeam_queue::SegQueue`s (a loom-visible model under loom, see
//! `crate::sync::Queue`) of counts of the table's nodes, so a popped node is always valid. An
//! entry is queued only once its value is published, so one being built is never evicted, and
//! one of weight 0 never (I8). Removal from the table does not touch the queues: dead entries
//! are skipped when popped and compacted away when they outnumber the live ones (`upkeep.rs`).
//!
//! # Invariants
//!
//! Each is stated in full in the file named; P2 and P6 here.
//!
//! - **P1 (one claim)**, `meta.rs`: an entry is queued at most once in its life.
//! - **P2 (queueing).** Admissions join the queues once the policy is *queueing*, a switch
//!   the first admission of a warm cache (at least half full) turns on for good. Entries
//!   admitted before, or by a thread that read the switch late, stay unclaimed until the
//!   engine's sweep enlists them (a step per admission once the switch is on; whole when the
//!   queues give no victim while entries are cached, or look short of the cache
//!   ([`EvictionPolicy::short_of`]) before one whole sweep has run; `raw/evict.rs`). So
//!   every cached entry is claimed and queued, or reached by the sweep.
//! - **P3 (adaptive share)** and **P5 (aging)**, `climb.rs`: hints written by the one
//!   evictor that closes a sampling period.
//! - **P4 (sized once, late)**, `memory.rs`: the sketch and the ghost are published once;
//!   nobody waits for them.
//! - **P6 (cold order).** The sweep walks its tables in hash order, which the hasher's seed
//!   decides; so each cold admission records its *stage* (how full the cache was, in
//!   [`Tuning::stages`] parts of the half), and the sweep's entries wait in one staging queue
//!   per stage, which the small queue's evictions drain lowest stage first, before its own
//!   entries. Staged entries count in the small queue's weight; the staging queues are
//!   published once by the sweep's first enlistment ([`SetOnce`]), and an enlister that finds
//!   them not yet there queues its entry in the small queue, which only orders it less well.
//! - **P7 (owed room)**, `leave.rs`, **P8 (trust in narrow wins)**, `narrow.rs`, and **P9
//!   (near returns)**, `near.rs`: bounded hints; no value of one can lose an entry.
//! - **P10 (the door)**, `door.rs`: a newcomer turned away at the door displaced nothing.

#![forbid(unsafe_code)]

mod climb;
mod door;
mod leave;
mod memory;
mod meta;
mod narrow;
mod near;
mod sketch;
mod tuning;
mod upkeep;

use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering, Queue, SetOnce};
use climb::Climber;
pub(crate) use door::Door;
use memory::{Memory, Pass, Recall};
pub(crate) use meta::{tick, EntryMeta, Queued};
use meta::{ADMITS, EVICTS};
use narrow::NarrowWins;
pub use tuning::Tuning;
#[cfg(feature = "tuning")]
pub use tuning::TuningError;

/// Queue entries one compaction step looks at (two under loom, so the models reach rounds
/// of several steps).
const COMPACT_STEP: usize = if cfg!(runcache_loom) { 2 } else { 32 };
/// The most main-queue victims a small-queue leaver's duel gathers, the bound of
/// [`Tuning::duel_victims`]: they are kept inline, so a duel allocates nothing, and a
/// larger array would cost every duel its initialization and moves.
const DUEL_VICTIMS: usize = 8;
/// The same for the door, the bound of [`Tuning::door_victims`].
const DOOR_VICTIMS: usize = 64;

/// The stage of an admission that found `size` of `capacity` taken (**P6**): which of
/// `stages` equal parts of the cache's first half it fell in.
fn stage(size: u64, capacity: u64, stages: u8) -> u8 {
    let half = u128::from(capacity / 2) + 1;
    let stages = u128::from(stages.max(1));
    let stage = (u128::from(size) * stages / half).min(stages - 1);
    // At most `stages - 1`, so the cast keeps the value.
    stage as u8
}

/// The S3-FIFO queues of one cache.
pub(crate) struct EvictionPolicy<T> {
    small: Queue<T>,
    main: Queue<T>,
    /// Main-queue victims that won their admission duel: they keep the head of the main
    /// queue (popped before `main`), as if the queue could be peeked.
    front: Queue<T>,
    /// The sketch and the ghost, sized before the cache's first eviction (**P4**).
    memory: SetOnce<Memory>,
    /// The sweep's entries by the stage of their admission, until evictions take them
    /// (**P6**); allocated by the first enlistment.
    staged: SetOnce<Box<[Queue<T>]>>,
    /// Entries in the staging queues (a hint for evictors, to skip them when empty).
    staged_len: AtomicUsize,
    small_weight: AtomicU64,
    main_weight: AtomicU64,
    /// The entries of the small, front and main queues that the compaction round under way
    /// has still to look at (all 0 between rounds; see [`compact`](Self::compact)).
    compact_left: [AtomicUsize; 3],
    /// Whether admissions join the queues (**P2**): off until the cache is first half full.
    queueing: AtomicBool,
    /// The weight the main queue gave up without a duel while the small queue was empty and
    /// the main queue within its share, not yet won back (**P7**).
    owed: AtomicU64,
    /// Whether leavers the ghost sent back that win their duels by one earn their places
    /// (**P8**, `narrow.rs`).
    narrow: NarrowWins,
    /// The small queue's share of the capacity, adapted to the hit rate (**P3**).
    climber: Climber,
    /// The values the rules are tuned by.
    tuning: &'static Tuning,
}

impl<T: Queued> EvictionPolicy<T> {
    /// Queues for a cache guessed to hold about `entries` entries. The guess sizes the
    /// sketch and the ghost only if the cache cannot tell better at its first eviction (see
    /// [`prepare`](Self::prepare)); nothing is allocated for them before.
    pub(crate) fn new(entries: usize, tuning: &'static Tuning) -> Self {
        Self {
            small: Queue::new(),
            main: Queue::new(),
            front: Queue::new(),
            staged: SetOnce::new(),
            staged_len: AtomicUsize::new(0),
            memory: SetOnce::new(),
            small_weight: AtomicU64::new(0),
            main_weight: AtomicU64::new(0),
            compact_left: std::array::from_fn(|_| AtomicUsize::new(0)),
            queueing: AtomicBool::new(false),
            owed: AtomicU64::new(0),
            narrow: NarrowWins::new(tuning),
            climber: Climber::new(entries as u64, tuning),
            tuning,
        }
    }

    /// New queues for the same guess of entries, tuned by `tuning` (before any use).
    #[cfg(feature = "tuning")]
    pub(crate) fn tuned(self, tuning: &'static Tuning) -> Self {
        Self::new(self.climber.entries() as usize, tuning)
    }

    /// Sizes the sketch and the ghost (**P4**) for `held` entries, or for the guess the
    /// queues were built with if the cache could not tell; the climber's periods follow.
    /// Only the caller that claimed the sizing calls it.
    fn size(&self, held: Option<u64>) {
        let entries = held
            .unwrap_or_else(|| self.climber.entries())
            .clamp(1, self.tuning.max_entries);
        self.climber.resize(entries);
        self.memory
            .publish(Memory::new(entries as usize, self.tuning));
    }

    /// The entries the sketch and the ghost are sized for, once they are (**P4**).
    #[cfg(test)]
    pub(crate) fn sized_for(&self) -> Option<u64> {
        self.memory.get().map(|_| self.climber.entries())
    }

    /// The sketch's estimate of `hash`'s recent accesses; 0 before there is a sketch.
    #[cfg(test)]
    fn estimate(&self, hash: u64) -> u64 {
        Pass::new(self).estimate(hash)
    }

    /// Adds `n` accesses of `hash` to the sketch, once there is one.
    #[cfg(test)]
    fn record(&self, hash: u64, n: u64) {
        Pass::new(self).record(hash, n);
    }

    /// Records the admission of an entry whose value was just published, and says whether it
    /// joins the queues now: `true` hands the caller the entry's claim (**P1**), and the
    /// caller passes the entry to [`enqueue`](Self::enqueue). `warm`: the cache is at least
    /// half full.
    ///
    /// A cache under half full evicts nothing soon, so its admissions skip the sketch and the ghost
    /// (up to five cache misses): the entry is marked [`UNRECORDED`](meta::UNRECORDED), and the
    /// policy's first visit records the admission in the sketch with the entry's hits, as it does
    /// before the sketch exists (**P4**). Nor are such entries queued until the first admission of
    /// a warm cache turns [`queueing`](Self::queueing) on for good (**P2**): a cache that never
    /// fills half its capacity pays nothing for an eviction order it never uses. The engine enlists
    /// the entries admitted before ([`enlist`](Self::enlist)).
    pub(crate) fn admit(&self, meta: &EntryMeta, hash: u64, warm: bool) -> bool {
        let (freq, unrecorded) = match self.memory.get() {
            Some(m) if warm => {
                // The miss that led here counts as an access.
                m.sketch.add(hash, 1);
                // The ghost is direct-mapped and lossy: a collision only costs a misplaced
                // entry. A remembered entry starts with frequency 1, so it leaves the small
                // queue for the main one like an entry that was hit (through the duel when
                // the main queue is full), but it has no hits of its own to skip the duel
                // with. A victim of a narrow win that comes back says what the win cost
                // (P8).
                // A return within the near reach of its queue's departures moves the share
                // towards that queue (P9).
                let (recall, left) = m.recall_left(hash);
                if let Some(left) = left {
                    self.climber.returned(left);
                }
                match recall {
                    Recall::Forgotten => (0, false),
                    Recall::Evicted => (1, false),
                    Recall::Displaced => {
                        if m.settle(hash) {
                            self.narrow.returned();
                        }
                        (1, false)
                    }
                }
            }
            // Cold, or before the first eviction: the policy's first visit records the
            // admission.
            _ => (0, true),
        };
        meta.start(freq, unrecorded);
        if !self.queueing() {
            if !warm {
                return false;
            }
            // Relaxed: a switch that only ever turns on; whoever reads it late queues
            // nothing, and the engine's sweep or its fallback enlists the entry (P2).
            self.queueing.store(true, Ordering::Relaxed);
        }
        meta.claim()
    }

    /// [`admit`](Self::admit)s an entry whose admission found `size` of `capacity` taken:
    /// warm at half full or more; a cold admission records its stage (**P6**).
    pub(crate) fn admit_at(
        &self,
        meta: &EntryMeta,
        hash: u64,
        size: u64,
        capacity: u64,
        judged: bool,
    ) -> bool {
        if judged {
            // The door recorded its miss and made its room in the main queue (P10).
            meta.start(0, false);
            return meta.claim();
        }
        let warm = size >= capacity / 2;
        if !warm {
            meta.set_stage(stage(size, capacity, self.tuning.stages));
        }
        self.admit(meta, hash, warm)
    }

    /// Sizes the sketch and the ghost before the cache's first eviction (**P4**), for the
    /// entries its capacity holds at the mean weight of those cached then: `held` says how
    /// many, or `None` if the cache cannot tell (then the guess given to [`new`](Self::new)
    /// stands). The one caller that claims the sizing allocates; every other call, and every
    /// evictor while the allocation is under way, goes on at once (without a sketch, an
    /// evictor only decides its duels by the incumbent).
    #[inline]
    pub(crate) fn prepare(&self, held: impl FnOnce() -> Option<u64>) {
        if self.memory.get().is_none() && self.memory.claim() {
            self.size(held());
        }
    }

    /// Queues an entry that [`admit`](Self::admit) said joins the queues, and takes a step of
    /// the compaction of removed entries when one is due.
    pub(crate) fn enqueue(&self, entry: T, judged: bool, live: impl FnOnce() -> usize) {
        if judged {
            push(&self.main, &self.main_weight, entry);
        } else {
            push(&self.small, &self.small_weight, entry);
        }
        // A compaction round under way takes a step at every admission; otherwise the check
        // for one runs once every 64 of this thread's admissions.
        if self.compacting() {
            self.compact_step();
        } else if tick(&ADMITS, 64) {
            self.compact(live());
        }
    }

    /// Hands the climber the cache's lookups so far (`accesses`, `hits` of them hits); at the
    /// end of a sampling period it moves the small queue's share (**P3**, `climb.rs`). The
    /// engine calls it now and then from the eviction path, never on a hit.
    pub(crate) fn adapt(&self, hits: u64, accesses: u64) {
        if self.climber.observe(hits, accesses) {
            self.narrow.forget();
        }
    }

    /// The small queue's share of the capacity now, in [0, 1] (**P3**): a hint, as the
    /// evictors read it.
    pub(crate) fn small_share(&self) -> f64 {
        f64::from(self.climber.share()) / f64::from(1u32 << 16)
    }

    /// Whether this eviction should hand the climber the counts: once every 16 of the calling
    /// thread's evictions, so that summing the per-thread statistics stays off most of them.
    pub(crate) fn adapt_due(&self) -> bool {
        tick(&EVICTS, 16)
    }

    /// Whether admissions join the queues: once the cache has been at least half full (**P2**).
    pub(crate) fn queueing(&self) -> bool {
        // Relaxed: see `admit`.
        self.queueing.load(Ordering::Relaxed)
    }

    /// Whether the queues look short of a cache that holds `size`: the small queue is empty,
    /// or the queues' weights add up to less than `size`. Entries the engine's sweep missed
    /// (**P2**) are one cause; reservations on their way to the queues are another, so it is
    /// a hint for the engine's one whole walk, not a count.
    pub(crate) fn short_of(&self, size: u64) -> bool {
        // Relaxed: queue-size hints.
        self.small_is_empty()
            || self
                .small_weight
                .load(Ordering::Relaxed)
                .saturating_add(self.main_weight.load(Ordering::Relaxed))
                < size
    }

    /// Queues a cached entry that was admitted while the cache was cold, unless it is queued
    /// already (**P1**): the engine's sweep of its tables (P2). It joins the small queue as it
    /// was admitted, `UNRECORDED`, its hits since counted in its meta; `entry` makes the
    /// count the queue holds, only once the claim is won. Returns whether it was queued here.
    pub(crate) fn enlist(&self, meta: &EntryMeta, entry: impl FnOnce() -> T) -> bool {
        if !meta.claim() {
            return false;
        }
        if self.staged.get().is_none() && self.staged.claim() {
            self.staged
                .publish((0..self.tuning.stages).map(|_| Queue::new()).collect());
        }
        match self.staged.get() {
            Some(staged) => {
                let queue = &staged[meta.stage().min(staged.len() - 1)];
                push(queue, &self.small_weight, entry());
                // Relaxed: a hint; an evictor that reads it late pops the small queue first,
                // which only orders one entry less well.
                self.staged_len.fetch_add(1, Ordering::Relaxed);
            }
            // The staging queues are on their way (another thread allocates them): the small
            // queue keeps the entry, a little out of order (P6).
            None => push(&self.small, &self.small_weight, entry()),
        }
        true
    }

    /// Pops the next entry to leave the small queue: the sweep's entries first, lowest stage
    /// first, then the small queue's own (**P6**).
    fn pop_small(&self) -> Option<T> {
        // Relaxed: see `enlist`.
        if self.staged_len.load(Ordering::Relaxed) > 0 {
            if let Some(staged) = self.staged.get() {
                if let Some(e) = staged.iter().find_map(Queue::pop) {
                    self.staged_len.fetch_sub(1, Ordering::Relaxed);
                    return Some(e);
                }
            }
        }
        self.small.pop()
    }

    /// Entries in the small queue and the staging queues (**P6**), a hint as `len` is.
    pub(super) fn small_len(&self) -> usize {
        // Relaxed: see `enlist`.
        self.small.len() + self.staged_len.load(Ordering::Relaxed)
    }

    /// Whether the small queue and the staging queues are empty (**P6**).
    fn small_is_empty(&self) -> bool {
        // Relaxed: see `enlist`.
        self.small.is_empty() && self.staged_len.load(Ordering::Relaxed) == 0
    }

    /// Pops the main queue's next victim: the first live entry at frequency zero, giving the
    /// others another round at frequency − 1. Every entry it looks at hands its hits to the
    /// sketch.
    ///
    /// The victim's weight still counts in the main queue's total: the caller either evicts
    /// it ([`evict_main`](Self::evict_main)) or puts it back at the head. Entries passing
    /// through for another round keep counting too. Otherwise a concurrent evictor would see
    /// the main queue short of what it holds, find "room" that is not there, and let
    /// newcomers in without their duel.
    fn main_victim(&self, pass: &Pass<'_, T>) -> Option<T> {
        let mut steps = 0;
        while pass.allows(steps) {
            steps += 1;
            // An entry from `front` is the head that won a duel, visited again at once: only
            // a visit in the queue's turn says whether it sat idle for a round.
            let (e, in_turn) = match self.front.pop() {
                Some(e) => (e, false),
                None => (self.main.pop()?, true),
            };
            if !e.is_cached() {
                uncount(&self.main_weight, &e);
                continue;
            }
            let (hits, accesses) = e.meta().take_hits();
            pass.record(e.hash(), accesses);
            if in_turn {
                pass.visit(e.hash(), hits);
            }
            let f = e.meta().freq();
            // A narrow winner hit since it won proved the win, if its victim has not come
            // back first (P8); one never hit proves nothing, and its victim's return says so.
            if hits > 0 && e.meta().settle_won_by_one() && pass.proved_first(e.hash()) {
                self.narrow.proved();
            }
            if f > 0 {
                e.meta().set_freq(f - 1);
                self.main.push(e);
                continue;
            }
            return Some(e);
        }
        None
    }

    /// Takes the victim [`main_victim`](Self::main_victim) chose off the main queue's total
    /// and remembers it in the ghost.
    fn evict_main(&self, v: T, pass: &Pass<'_, T>) -> T {
        uncount(&self.main_weight, &v);
        pass.remember(v.hash(), self.climber.depart(true));
        v
    }

    /// Pops the next entry to evict under `capacity`, or `None` when no queued entry holds a
    /// value. The caller removes it from the table (which may fail if another thread removed
    /// it first; then it asks again).
    pub(crate) fn victim(&self, capacity: u64) -> Option<T> {
        let pass = Pass::new(self);
        let small_room = self.climber.small_room(capacity);
        let mut steps = 0;
        while pass.allows(steps) {
            steps += 1;
            // The main queue gives up entries only beyond its share of the capacity. (Asking
            // "is the small queue over its share?" instead is the same question while the
            // queues hold the whole budget, but not while other threads' reservations are on
            // their way to the small queue: then the small queue looks light and the main
            // queue loses entries without a duel.) Relaxed: a queue-size hint.
            let main_over =
                self.main_weight.load(Ordering::Relaxed) > capacity.saturating_sub(small_room);
            if !main_over || (self.main.is_empty() && self.front.is_empty()) {
                // The leaver's weight stays in the small queue's total until `leave_small`
                // decides where it goes, as `main_victim` explains for the main queue.
                if let Some(c) = self.pop_small() {
                    if !c.is_cached() {
                        uncount(&self.small_weight, &c);
                        continue;
                    }
                    match self.leave_small(c, capacity.saturating_sub(small_room), &pass) {
                        Some(e) => return Some(e),
                        None => continue,
                    }
                }
            }
            match self.main_victim(&pass) {
                Some(e) => {
                    if !main_over {
                        // The small queue was empty though the main queue is within its
                        // share: other threads' newcomers are on their way into it (P7).
                        // Relaxed: a hint.
                        self.owed.fetch_add(e.weight(), Ordering::Relaxed);
                    }
                    return Some(self.evict_main(e, &pass));
                }
                None if self.small_is_empty() => return None,
                None => {}
            }
        }
        None
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests;

/// Takes an entry's weight off a queue's total.
fn uncount<T: Queued>(total: &AtomicU64, e: &T) {
    subtract(total, e.weight());
}

/// Takes `w` off a queue's total.
fn subtract(total: &AtomicU64, w: u64) {
    // Relaxed: a queue-size hint; saturating, since the totals are hints too.
    let _ = total.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
        Some(t.saturating_sub(w))
    });
}

/// Appends an entry to a queue and adds its weight to the queue's total.
fn push<T: Queued>(queue: &Queue<T>, total: &AtomicU64, e: T) {
    // Relaxed: a queue-size hint.
    total.fetch_add(e.weight(), Ordering::Relaxed);
    queue.push(e);
}
