//! What the policy remembers beyond the entries it holds (the frequency sketch and the ghost
//! of evicted hashes, **P4**), and one eviction pass's view of it ([`Pass`]).
//!
//! **P4 (sized once, late).** The sketch and the ghost are published once, by the one evictor
//! that claims their sizing ([`EvictionPolicy::prepare`], a `SetOnce`): it allocates them for
//! the entries the cache holds at its first eviction, and no other thread waits for it. Until
//! they are published the policy runs without them: an admission is marked `UNRECORDED` (its
//! first visit records it, as for a cold one), the ghost remembers nothing, and a duel's
//! newcomer estimates 0, so the incumbent stays. Sized by what the cache holds, not by a guess,
//! a weighted cache's sketch fits its entries, and a cache that never fills allocates neither.

use super::meta::Queued;
use super::near::{Left, STAMP_BITS};
use super::sketch::Sketch;
use super::{EvictionPolicy, Tuning};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use std::cell::Cell;

/// What the ghost keeps of an evicted hash to know it again: 16 of the 32 bits that its
/// slot index (from the low 32 bits) does not use, never 0 (an empty slot). A wrong match
/// costs a misplaced entry, once in 2^15 lookups of a slot that holds another hash. The
/// slot's other bits say where and when the hash left ([`Left`], **P9**) and whether it was
/// [`DISPLACED`].
fn fingerprint(hash: u64) -> u32 {
    (hash >> 32) as u32 & FINGERPRINT | 1
}

/// The bits of a ghost slot that hold the [`fingerprint`].
const FINGERPRINT: u32 = (1 << 16) - 1;
/// The ghost slot's shift of a [`Left`]'s stamp (bits 16 to 29).
const STAMP_SHIFT: u32 = 16;
/// The ghost's mark on a hash that left the main queue (else it left the small one).
const FROM_MAIN: u32 = 1 << 30;
/// The ghost's mark on the hash of a main-queue entry that a leaver displaced by winning
/// its duel by one (`narrow.rs`): its return says what that win cost.
const DISPLACED: u32 = 1 << 31;

/// What the ghost recalls of a hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Recall {
    /// Not remembered (or its slot went to another hash since).
    Forgotten,
    /// Evicted recently.
    Evicted,
    /// Evicted recently from the main queue, displaced by a leaver that won by one.
    Displaced,
}

/// How many entries one pass of [`EvictionPolicy::victim`] (and each main-queue search in it) may
/// look at. Every entry can be passed over at most `MAX_FREQ + 1` times before it is evicted,
/// so the limit only stops a pass that other threads keep refilling: four times the queued
/// entries, plus 16. Counting the queues reads their shared ends, so it is counted only once
/// a pass has taken 16 steps, which few do.
pub(super) struct Pass<'a, T> {
    queues: &'a EvictionPolicy<T>,
    counted: Cell<Option<usize>>,
    /// The sketch and the ghost, read once per pass (**P4**).
    pub(super) memory: Option<&'a Memory>,
    /// Whether the main queue's idle entries lose sketch counts in this pass (**P5**), read
    /// once per pass.
    aging: bool,
    /// Main-queue entries this pass visited, and how many of them were idle: handed to the
    /// climber once, when the pass ends.
    visits: Cell<u32>,
    idle: Cell<u32>,
    /// Hits of the entries this pass took off the small queue, handed to the climber with
    /// the visits.
    small_hits: Cell<u64>,
}

impl<'a, T: Queued> Pass<'a, T> {
    /// The steps every pass may take without counting.
    const FREE: usize = 16;

    pub(super) fn new(queues: &'a EvictionPolicy<T>) -> Self {
        Self {
            queues,
            counted: Cell::new(None),
            memory: queues.memory.get(),
            aging: queues.climber.aging(),
            visits: Cell::new(0),
            idle: Cell::new(0),
            small_hits: Cell::new(0),
        }
    }

    /// Counts the visit of a main-queue entry that had `hits` hits since the last one, and
    /// ages it if it had none while aging is on (**P5**).
    pub(super) fn visit(&self, hash: u64, hits: u8) {
        self.visits.set(self.visits.get().saturating_add(1));
        if hits > 0 {
            return;
        }
        self.idle.set(self.idle.get().saturating_add(1));
        if self.aging {
            if let Some(m) = self.memory {
                m.sketch.decay(hash);
            }
        }
    }

    /// Counts the `hits` an entry leaving the small queue had while in it.
    pub(super) fn left_small(&self, hits: u8) {
        self.small_hits
            .set(self.small_hits.get().saturating_add(u64::from(hits)));
    }

    /// Adds `n` accesses of `hash` to the sketch, once there is one (**P4**).
    pub(super) fn record(&self, hash: u64, n: u64) {
        if let Some(m) = self.memory {
            m.sketch.add(hash, n);
        }
    }

    /// Whether the sketch estimates `hash`'s recent accesses at `k` or more; `false` before
    /// there is a sketch (**P4**).
    pub(super) fn knows(&self, hash: u64, k: u64) -> bool {
        self.memory.is_some_and(|m| m.sketch.at_least(hash, k))
    }

    /// The sketch's estimate of `hash`'s recent accesses; 0 before there is a sketch.
    pub(super) fn estimate(&self, hash: u64) -> u64 {
        self.memory.map_or(0, |m| m.sketch.estimate(hash))
    }

    /// Tells the sketch that a duel met its incumbents at the counters' ceiling
    /// ([`Sketch::at_ceiling`]), once there is one.
    pub(super) fn at_ceiling(&self) {
        if let Some(m) = self.memory {
            m.sketch.at_ceiling();
        }
    }

    /// Remembers an evicted hash in the ghost with where and when it `left`, once there is a
    /// ghost.
    pub(super) fn remember(&self, hash: u64, left: Left) {
        if let Some(m) = self.memory {
            m.remember(hash, 0, left);
        }
    }

    /// Remembers the hash of the main-queue entry `victim` that `winner` displaced by
    /// winning its duel by one, marked as such ([`Recall::Displaced`]), and links the two
    /// (**P8**), once there is a ghost.
    pub(super) fn remember_displaced(&self, victim: u64, winner: u64, left: Left) {
        if let Some(m) = self.memory {
            m.remember(victim, DISPLACED, left);
            m.link(winner, victim);
        }
    }

    /// A narrow winner `winner` was hit in the main queue: `true` if its victim had not
    /// come back yet, so the win proved itself first (**P8**). Settles the pair either way.
    pub(super) fn proved_first(&self, winner: u64) -> bool {
        self.memory.is_some_and(|m| {
            let victim = m.link_of(winner).swap(0, Ordering::Relaxed);
            victim != 0 && m.settle(victim)
        })
    }

    /// Whether a pass that has taken `steps` steps may take another.
    #[inline]
    pub(super) fn allows(&self, steps: usize) -> bool {
        steps < Self::FREE || steps < self.limit()
    }

    fn limit(&self) -> usize {
        if let Some(limit) = self.counted.get() {
            return limit;
        }
        let q = self.queues;
        let limit = 4 * (q.small_len() + q.main.len() + q.front.len()) + Self::FREE;
        self.counted.set(Some(limit));
        limit
    }
}

impl<T> Drop for Pass<'_, T> {
    fn drop(&mut self) {
        self.queues
            .climber
            .count_pass(self.visits.get(), self.idle.get(), self.small_hits.get());
    }
}

/// What the policy remembers beyond the entries it holds: the frequency sketch and the
/// ghost of evicted hashes, sized once, before the cache's first eviction (**P4**).
pub(super) struct Memory {
    pub(super) sketch: Sketch,
    /// Fingerprints of evicted hashes (see [`fingerprint`]), direct-mapped by the hash's
    /// low 32 bits; 0 is an empty slot.
    ghost: Box<[AtomicU32]>,
    /// The hash of the victim each narrow winner displaced (**P8**), direct-mapped by the
    /// winner's hash, one slot per four entries (winners are settled at their first visit
    /// in the main queue, so few are in flight); 0 is an empty slot (a victim whose hash is
    /// 0 goes unmeasured).
    links: Box<[AtomicU64]>,
}

impl Memory {
    /// A sketch, a ghost and the narrow wins' links for a cache of `entries` entries (64
    /// ghost slots and 16 links under loom).
    pub(super) fn new(entries: usize, tuning: &'static Tuning) -> Self {
        let (ghost, links) = if cfg!(runcache_loom) {
            (64, 16)
        } else {
            let per_entry = tuning.ghost_per_entry as usize;
            (per_entry * entries.max(64), (entries / 4).max(64))
        };
        Self {
            sketch: Sketch::new(entries, tuning),
            ghost: (0..ghost).map(|_| AtomicU32::new(0)).collect(),
            links: (0..links).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The ghost slot of `hash`: its low 32 bits scaled to the ghost's length (a multiply
    /// and a shift, so the length need not be a power of two), independent of the
    /// fingerprint's high bits.
    fn ghost_slot(&self, hash: u64) -> &AtomicU32 {
        let i = (u64::from(hash as u32) * self.ghost.len() as u64) >> 32;
        &self.ghost[i as usize]
    }

    /// What the ghost recalls of `hash` (or of a hash that shares its slot and
    /// fingerprint).
    #[cfg(test)]
    pub(super) fn recall(&self, hash: u64) -> Recall {
        self.recall_left(hash).0
    }

    /// What the ghost recalls of `hash`, and where and when it left if remembered (**P9**).
    pub(super) fn recall_left(&self, hash: u64) -> (Recall, Option<Left>) {
        // Relaxed: a hint.
        let slot = self.ghost_slot(hash).load(Ordering::Relaxed);
        if slot & FINGERPRINT != fingerprint(hash) {
            return (Recall::Forgotten, None);
        }
        let left = Left {
            main: slot & FROM_MAIN != 0,
            stamp: (slot >> STAMP_SHIFT) & ((1 << STAMP_BITS) - 1),
        };
        let recall = if slot & DISPLACED != 0 {
            Recall::Displaced
        } else {
            Recall::Evicted
        };
        (recall, Some(left))
    }

    /// Remembers `hash` in the ghost with `mark` (0 or [`DISPLACED`]) and where and when it
    /// `left`, in place of whatever held its slot.
    pub(super) fn remember(&self, hash: u64, mark: u32, left: Left) {
        let from = if left.main { FROM_MAIN } else { 0 };
        let stamp = (left.stamp & ((1 << STAMP_BITS) - 1)) << STAMP_SHIFT;
        // Relaxed: a hint.
        self.ghost_slot(hash)
            .store(fingerprint(hash) | from | stamp | mark, Ordering::Relaxed);
    }

    /// Takes the [`DISPLACED`] mark off `hash`'s slot if the slot still holds it: `true`
    /// for the one caller that does (**P8**), the victim's return or its winner's proof.
    pub(super) fn settle(&self, hash: u64) -> bool {
        let slot = self.ghost_slot(hash);
        // Relaxed: a hint; the swap's atomicity alone makes one caller the one.
        let held = slot.load(Ordering::Relaxed);
        held & FINGERPRINT == fingerprint(hash)
            && held & DISPLACED != 0
            && slot
                .compare_exchange(
                    held,
                    held & !DISPLACED,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// The link slot of the narrow winner `winner` (bits 16 to 47 of its hash, scaled, so
    /// its place does not follow its ghost slot's).
    fn link_of(&self, winner: u64) -> &AtomicU64 {
        let i = (u64::from((winner >> 16) as u32) * self.links.len() as u64) >> 32;
        &self.links[i as usize]
    }

    /// Links the narrow winner `winner` to the `victim` it displaced, in place of whatever
    /// link held its slot (that win goes unmeasured).
    fn link(&self, winner: u64, victim: u64) {
        // Relaxed: a hint.
        self.link_of(winner).store(victim, Ordering::Relaxed);
    }
}
