//! The check on narrow wins (**P8**): whether the small-queue leavers that the ghost alone
//! sent back, and that win their duel by exactly one, earn the places they take. Such a win
//! rests on the miss that brought the leaver back: a real difference of frequency where keys
//! have them (a database, a disk), a chain of misses where every key has one frequency (a
//! zigzag), each victim coming back to win by one in turn (`docs/DESIGN.md`, step 4).
//!
//! Which comes first after a narrow win tells the two apart: the winner's hit in the main
//! queue (a proof), or its victim's return (a cost). The winner is marked, and the victim is
//! remembered in the ghost as *displaced*, linked to its winner (`memory.rs`); whichever event
//! comes first takes the marks off, so each win counts once. A trust score adds
//! [`Tuning::proved`] per proof and takes [`Tuning::returned`] off per cost, within
//! ±[`Tuning::trust_bound`], and is halved at each of the climber's period closes
//! ([`forget`](NarrowWins::forget)). While it is below zero a narrow win is refused (the
//! incumbent stays, as on a tie), except one in [`Tuning::explore`] of a thread's refused
//! wins, so that the score keeps measuring.
//!
//! **P8 (trust).** The score is a hint, like the share (P3): evictors add proofs when they visit
//! main-queue entries, admissions take returns off when the ghost recalls a displaced hash (on a
//! miss, never on a hit), each with one relaxed read-modify-write that keeps it within
//! ±[`Tuning::trust_bound`]. The displaced mark comes off by a compare-and-swap, so a proof and a
//! return that race count once. A stale read of the score refuses one win that could have stood, or
//! lets one through; no value of it can lose an entry, since a refused win is a lost duel.

#![forbid(unsafe_code)]

use super::meta::tick;
use super::Tuning;
use crate::sync::{AtomicI32, Ordering};
use std::cell::Cell;

crate::sync::local_key! {
    /// The calling thread's refused narrow wins, modulo [`Tuning::explore`].
    static REFUSED: Cell<u32> = Cell::new(0);
}

/// The trust score of narrow wins (**P8**).
pub(super) struct NarrowWins {
    trust: AtomicI32,
    tuning: &'static Tuning,
}

impl NarrowWins {
    pub(super) fn new(tuning: &'static Tuning) -> Self {
        Self {
            trust: AtomicI32::new(0),
            tuning,
        }
    }

    /// A narrow winner was hit in the main queue before its victim came back.
    pub(super) fn proved(&self) {
        self.add(self.tuning.proved);
    }

    /// A victim displaced by a narrow win came back, before its winner was hit, while the
    /// ghost remembered it as such.
    pub(super) fn returned(&self) {
        self.add(-self.tuning.returned);
    }

    /// Whether a narrow win may stand: the score is not below zero, or this is the calling
    /// thread's [`Tuning::explore`]th refused win since the last one let through.
    pub(super) fn stands(&self) -> bool {
        // Relaxed: a hint (P8).
        self.trust.load(Ordering::Relaxed) >= 0 || tick(&REFUSED, self.tuning.explore)
    }

    /// The score now (for tests).
    #[cfg(test)]
    pub(super) fn trust(&self) -> i32 {
        self.trust.load(Ordering::Relaxed)
    }

    /// Halves the score, at the close of each of the climber's sampling periods, so that
    /// what narrow wins earned in a phase of the workload that is over counts less each
    /// period (without it, a Zipf hot set that moved took the cache over more slowly, and
    /// `tests/policy.rs` failed).
    pub(super) fn forget(&self) {
        // Relaxed: a hint (P8).
        let _ = self
            .trust
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t / 2));
    }

    fn add(&self, d: i32) {
        let bound = self.tuning.trust_bound;
        // Relaxed: a hint (P8); the update is atomic, so the bound always holds.
        let _ = self
            .trust
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(d).clamp(-bound, bound))
            });
    }
}
