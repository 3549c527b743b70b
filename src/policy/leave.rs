//! Where an entry leaving the small queue goes: the main queue (its room, or a place won in
//! the admission duel against the main queue's victims), or out of the cache. The queues
//! themselves, and the order they are popped in, are in `mod.rs`.
//!
//! **P7 (owed room).** `owed` is a hint, like the share: an evictor that takes a main victim
//! because the small queue was empty while the main queue was within its share adds the
//! victim's weight, and a leaver that wins the main queue's room back through the comparison
//! takes its own weight off (saturating at 0). Both are relaxed read-modify-writes on that path
//! only, never on a hit or an admission. A stale read makes one leaver compare when it need
//! not, or walk into the room when it should have compared: either places one entry less well.
//! The count only gates that choice, so no value of it, stale or racing, can lose an entry or
//! break the queues' totals.

#![forbid(unsafe_code)]

use super::near::Left;
use super::{push, subtract, uncount, EvictionPolicy, Pass, Queued, DUEL_VICTIMS};
use crate::sync::Ordering;

impl<T: Queued> EvictionPolicy<T> {
    /// Decides where an entry leaving the small queue goes (`docs/DESIGN.md`, "An entry's way
    /// through", step 4): to the main queue's room, to the main queue whatever it holds once
    /// proven ([`Tuning::promote_hits`](super::Tuning::promote_hits)), through the sized duel,
    /// or out. Returns the entry to evict (the leaver or the main queue's victim), or `None`
    /// if the leaver moved to the main queue without displacing anything.
    pub(super) fn leave_small(&self, c: T, main_capacity: u64, pass: &Pass<'_, T>) -> Option<T> {
        let (hits, accesses) = c.meta().take_hits();
        pass.record(c.hash(), accesses);
        pass.left_small(hits);
        // Every leaver moves the small queue's clock; the ghost dates an evicted one by it
        // (P9).
        let left = self.climber.depart(false);
        // Relaxed: a queue-size hint.
        let main = self.main_weight.load(Ordering::Relaxed);
        let room = main + c.weight() <= main_capacity;
        // What the leaver must add to the victims' estimates to win a duel.
        let mut margin = 0;
        if c.meta().freq() == 0 {
            // Never hit and not remembered: it fills the main queue's room if the sketch saw
            // it before this miss, and with no room it may duel if the sketch knows it well.
            let stays = if room {
                pass.estimate(c.hash()) >= 2
            } else {
                pass.knows(c.hash(), self.tuning.known_estimate)
            };
            if !stays {
                return Some(self.evict_small(c, pass, left));
            }
            if !room {
                margin = self.tuning.known_margin;
            }
        }
        // A remembered entry started at frequency 1 and gains one per hit, so its frequency
        // stays above its hits (up to `MAX_FREQ`, beyond which `promote_hits` decides).
        let returned_and_hit = hits >= 1 && c.meta().freq() > hits;
        let promoted = hits >= self.tuning.promote_hits || returned_and_hit;
        // Relaxed: a hint (P7).
        if room && !promoted && self.owed.load(Ordering::Relaxed) > 0 {
            return self.win_room(c, pass, left);
        }
        if room || promoted {
            self.move_to_main(c);
            return None;
        }
        // The duel, sized: a leaver heavier than the main queue's victim faces as many
        // victims as it would displace (up to `duel_victims`) and must outcount them all
        // (`door.rs`); entries of one weight meet one victim each, as TinyLFU's duel does.
        let victims =
            self.gather::<DUEL_VICTIMS>(c.weight(), u64::MAX, self.tuning.duel_victims, pass);
        if victims.len() == 0 {
            return Some(self.evict_small(c, pass, left));
        }
        // Incumbents all at the counters' ceiling cannot be outweighed: the sketch may halve
        // early (`Sketch::at_ceiling`).
        if victims.all_at_ceiling() {
            pass.at_ceiling();
        }
        // The victims' weights never left the main queue's total. Back at its head, the
        // other victims of a duel won are evicted next (the main queue is over its share by
        // the leaver's weight); those of a duel lost face the next leaver.
        //
        // A leaver the ghost alone sent back (`margin` 0, no hits) that wins by exactly one
        // wins on the miss that brought it back; the win stands only while such wins earn
        // their places (**P8**, `narrow.rs`).
        let estimate = pass.estimate(c.hash());
        let by_one = margin == 0 && hits == 0 && estimate == victims.against.saturating_add(1);
        let wins = victims.outcounted_by(estimate, margin) && (!by_one || self.narrow.stands());
        if !wins {
            victims.restore(self);
            return Some(self.evict_small(c, pass, left));
        }
        let Some((first, others)) = victims.split_first() else {
            return Some(self.evict_small(c, pass, left));
        };
        // Back at the main queue's head, its other victims are evicted next.
        others.for_each(|v| self.front.push(v));
        if by_one {
            c.meta().mark_won_by_one();
        }
        Some(self.swap_into_main(c, first, by_one, pass))
    }

    /// The main queue's room for a leaver while some of it is owed (**P7**): the room was
    /// made by evicting a main entry without a duel, so the leaver takes it only if the
    /// sketch estimates it more frequent than the main queue's victim, which keeps the head
    /// either way; a winner pays its weight off the debt. Returns the entry to evict (the
    /// loser), or `None` if the leaver moved to the main queue.
    fn win_room(&self, c: T, pass: &Pass<'_, T>, left: Left) -> Option<T> {
        let Some(v) = self.main_victim(pass) else {
            self.move_to_main(c);
            return None;
        };
        let wins = pass.estimate(c.hash()) > pass.estimate(v.hash());
        self.front.push(v);
        if !wins {
            return Some(self.evict_small(c, pass, left));
        }
        // Saturating, as a racing winner may have paid it first (P7).
        subtract(&self.owed, c.weight());
        self.move_to_main(c);
        None
    }

    /// Takes a small-queue leaver off the queue's total and remembers it in the ghost, dated
    /// by the small queue's clock when it `left` (**P9**).
    fn evict_small(&self, c: T, pass: &Pass<'_, T>, left: Left) -> T {
        uncount(&self.small_weight, &c);
        pass.remember(c.hash(), left);
        c
    }

    /// Swaps a duel's winner into the main queue's tail for its victim `first`, which it
    /// returns to evict, remembered in the ghost (as displaced if the winner won `by_one`,
    /// **P8**). The main queue's total moves by the difference of their weights only: moved
    /// in whole before the victim's weight came off, it read over the queue's share for an
    /// instant, and a concurrent evictor that read it then took a main entry without a duel.
    fn swap_into_main(&self, c: T, first: T, by_one: bool, pass: &Pass<'_, T>) -> T {
        // The victim leaves the main queue: its clock moves, and dates it in the ghost (P9).
        let left = self.climber.depart(true);
        // Linked before the winner is queued, where an evictor may visit it (P8).
        if by_one {
            pass.remember_displaced(first.hash(), c.hash(), left);
        } else {
            pass.remember(first.hash(), left);
        }
        c.meta().set_freq(0);
        let (w, off) = (c.weight(), first.weight());
        // Relaxed: queue-size hints. A heavier winner adds its excess before it is queued,
        // a lighter one takes the victim's excess off after, so the total never misses it.
        if w > off {
            self.main_weight.fetch_add(w - off, Ordering::Relaxed);
        }
        self.main.push(c);
        if off > w {
            subtract(&self.main_weight, off - w);
        }
        subtract(&self.small_weight, w);
        first
    }

    /// Moves an entry popped from the small queue to the main queue's tail.
    fn move_to_main(&self, c: T) {
        c.meta().set_freq(0);
        let w = c.weight();
        // Added before it is taken off, so neither total ever misses the entry.
        push(&self.main, &self.main_weight, c);
        subtract(&self.small_weight, w);
    }
}
