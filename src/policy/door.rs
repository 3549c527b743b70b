//! The aggregated duel: a candidate faces the main queue's victims it would displace and
//! takes their place only if the sketch counts it more often than all of them together (the
//! "aggregated victims" of Einziger, Eytan, Friedman and Manes, 2022, as moka admits). The
//! door uses it first for a newcomer heavier than the small queue's room, and a small-queue
//! leaver's sized duel (`leave.rs`) gathers its victims the same way.
//!
//! **P10 (the door).** A newcomer heavier than the small queue's room is judged before its
//! reservation takes anything: the main queue's victims it gathers are popped like
//! a duel's, and either all go back to the main queue (to its tail if the newcomer lost, as
//! entries the CLOCK hand passed; to its head, in their order, if the queue was too short to
//! judge by) or all leave the main queue's total and pass to the caller to evict (it won, and
//! joins the main queue at its admission). So a newcomer turned away displaced nothing, and a
//! victim another thread removed meanwhile only frees less. The small queue's room it is
//! judged by is a hint, like the share (P3).

#![forbid(unsafe_code)]

use super::{sketch, uncount, EvictionPolicy, Pass, Queued, DOOR_VICTIMS};
use crate::sync::Ordering;

/// The part of a victim's estimate `est` that counts against a candidate taking `taken` of
/// its `weight` (all of it when the candidate takes the whole; rounded down).
fn share(est: u64, taken: u64, weight: u64) -> u64 {
    if taken >= weight {
        return est;
    }
    // `taken < weight`, so the quotient is below `est` and fits.
    (u128::from(est) * u128::from(taken) / u128::from(weight)) as u64
}

/// The door's verdict on a newcomer (**P10**).
pub(crate) enum Door<T> {
    /// Not judged here (light enough for the small queue, or nothing yet to judge it by):
    /// room is made in the queues' order, and it joins the small queue.
    Open,
    /// It outcounted these victims, which have left the main queue (and its total) and are
    /// the caller's to evict; it joins the main queue.
    Admit(Vec<T>),
    /// It did not: it is not cached, and nothing was displaced.
    Refuse,
}

/// Up to `N` main-queue victims gathered for a duel, in the queue's order (kept inline: a
/// duel allocates nothing).
pub(super) struct Victims<T, const N: usize> {
    taken: [Option<T>; N],
    n: usize,
    /// Their weight.
    pub(super) freed: u64,
    /// Their estimates, each in proportion to the part of its weight the candidate takes
    /// (see [`gather`](EvictionPolicy::gather)), summed.
    pub(super) against: u64,
    /// How many of them are at the sketch's ceiling.
    at_ceiling: usize,
}

impl<T: Queued, const N: usize> Victims<T, N> {
    pub(super) fn len(&self) -> usize {
        self.n
    }

    fn drain(self) -> impl Iterator<Item = T> {
        self.taken.into_iter().flatten()
    }

    /// Whether a candidate estimated at `estimate` outcounts them by more than `margin`:
    /// more than all of them together, or, against several, at the sketch's ceiling while
    /// none of them is (counters the ceiling caps could never outcount a sum of several, and
    /// would keep a hot heavy entry out for good).
    pub(super) fn outcounted_by(&self, estimate: u64, margin: u64) -> bool {
        estimate > self.against.saturating_add(margin)
            || (self.len() > 1 && estimate >= sketch::MAX && self.at_ceiling == 0)
    }

    /// Whether every one of them is at the sketch's ceiling (see `Sketch::at_ceiling`).
    pub(super) fn all_at_ceiling(&self) -> bool {
        self.n > 0 && self.at_ceiling == self.n
    }

    /// Puts them back at the main queue's head, in their order (**P10**: a duel lost
    /// displaces nothing).
    pub(super) fn restore(self, queues: &EvictionPolicy<T>) {
        self.drain().for_each(|v| queues.front.push(v));
    }

    /// Puts them back at the main queue's tail, as entries the CLOCK hand passed (**P10**):
    /// outcounting a heavy newcomer earns them a round, as a hit does.
    fn pass(self, queues: &EvictionPolicy<T>) {
        self.drain().for_each(|v| queues.main.push(v));
    }

    /// The first of them, and the others.
    pub(super) fn split_first(self) -> Option<(T, impl Iterator<Item = T>)> {
        let mut it = self.drain();
        it.next().map(|first| (first, it))
    }
}

impl<T: Queued> EvictionPolicy<T> {
    /// Whether a newcomer of `weight` may be heavier than the small queue's room under
    /// `capacity`, and so worth asking the door about: that room is at least the least share
    /// of the capacity and at least 1, so most newcomers of most caches are known light
    /// without reading the share.
    #[inline]
    pub(crate) fn may_be_heavy(&self, weight: u64, capacity: u64) -> bool {
        let least = (u128::from(capacity) * u128::from(self.tuning.min_share)) >> 16;
        u128::from(weight) > least.max(1)
    }

    /// Takes main-queue victims, in the queue's order, until they weigh `need` or more, or `most`
    /// are taken (at most `N`), or (for a candidate `estimate`d below the sketch's
    /// ceiling) they outcount it: then the duel is lost whatever comes next.
    ///
    /// A victim counts against the candidate in proportion to the part of its weight the
    /// candidate needs (rounded down): all of it for each victim but the last, and for a
    /// victim heavier than the candidate only the candidate's share. So the duel compares
    /// accesses per byte, as a budget in bytes is spent: a light entry that outcounts a
    /// heavy one per byte takes its place (the heavy one's other bytes go to the next
    /// newcomers), where counting the heavy one whole kept many light entries out for one
    /// (`docs/EXPERIMENTS.md`, "Weighted admission"). Entries of one weight count whole.
    pub(super) fn gather<const N: usize>(
        &self,
        need: u64,
        estimate: u64,
        most: u8,
        pass: &Pass<'_, T>,
    ) -> Victims<T, N> {
        let most = usize::from(most).min(N);
        let mut v = Victims {
            taken: std::array::from_fn(|_| None),
            n: 0,
            freed: 0,
            against: 0,
            at_ceiling: 0,
        };
        while v.freed < need && v.n < most && (estimate >= sketch::MAX || v.against < estimate) {
            let Some(e) = self.main_victim(pass) else {
                break;
            };
            let est = pass.estimate(e.hash());
            let taken = need - v.freed;
            v.against = v.against.saturating_add(share(est, taken, e.weight()));
            v.freed = v.freed.saturating_add(e.weight());
            v.at_ceiling += usize::from(est >= sketch::MAX);
            v.taken[v.n] = Some(e);
            v.n += 1;
        }
        v
    }

    /// Judges a newcomer of `hash` and `weight` that needs `need` more than the room left
    /// under `capacity` (**P10**).
    pub(crate) fn door(&self, hash: u64, weight: u64, need: u64, capacity: u64) -> Door<T> {
        if weight <= self.climber.small_room(capacity) || need == 0 || self.memory.get().is_none() {
            return Door::Open;
        }
        let pass = Pass::new(self);
        // The miss that brought it counts, as it would at its admission.
        let estimate = pass.estimate(hash) + 1;
        let most = self.tuning.door_victims;
        let victims = self.gather::<DOOR_VICTIMS>(need, estimate, most, &pass);
        let judged = victims.freed >= need || victims.len() >= usize::from(most);
        if !judged && victims.outcounted_by(estimate, 0) {
            // The main queue holds too little to judge by: the small queue makes the room.
            victims.restore(self);
            return Door::Open;
        }
        pass.record(hash, 1);
        if victims.freed < need || !victims.outcounted_by(estimate, 0) {
            victims.pass(self);
            return Door::Refuse;
        }
        let mut out = Vec::with_capacity(victims.len());
        for v in victims.drain() {
            uncount(&self.main_weight, &v);
            pass.remember(v.hash(), self.climber.depart(true));
            out.push(v);
        }
        // Relaxed: a switch that only turns on (see `admit`); the winner is queued by its
        // admission, and a cache that evicts is past its cold start.
        self.queueing.store(true, Ordering::Relaxed);
        Door::Admit(out)
    }
}
