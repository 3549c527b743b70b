//! The policy's unit tests: queue moves, the admission duel, the ghost, and the frequency
//! marks, against small hand-built entries.

#![forbid(unsafe_code)]

use super::meta::MAX_FREQ;
use super::*;
// A std atomic on purpose: the tests run only outside the loom models.
use std::sync::atomic::AtomicBool as StdBool;
use std::sync::Arc;

mod narrow;

/// The values every cache is tuned by.
const T: &Tuning = &Tuning::DEFAULT;

struct Entry {
    hash: u64,
    meta: EntryMeta,
    cached: StdBool,
    weight: u64,
}

impl Queued for Arc<Entry> {
    fn meta(&self) -> &EntryMeta {
        &self.meta
    }
    fn weight(&self) -> u64 {
        self.weight
    }
    fn hash(&self) -> u64 {
        self.hash
    }
    fn is_cached(&self) -> bool {
        self.cached.load(Ordering::Relaxed)
    }
    fn id(&self) -> usize {
        Arc::as_ptr(self) as usize
    }
}

/// An entry of weight 1.
fn entry(hash: u64) -> Arc<Entry> {
    heavy(hash, 1)
}

fn heavy(hash: u64, weight: u64) -> Arc<Entry> {
    Arc::new(Entry {
        hash,
        meta: EntryMeta::new(),
        cached: StdBool::new(true),
        weight,
    })
}

/// Admits `e` as the engine does: records the admission, and queues the entry if the policy
/// says it joins the queues; `live` is the cache's entry count the compaction check sees.
fn admit(p: &EvictionPolicy<Arc<Entry>>, e: Arc<Entry>, warm: bool, live: usize) {
    if p.admit(&e.meta, e.hash, warm) {
        p.enqueue(e, false, || live);
    }
}

#[test]
fn one_hit_wonders_leave_first_and_hit_entries_are_promoted() {
    let p = evicted(64);
    let hot = entry(1);
    admit(&p, hot.clone(), true, 1);
    hot.meta.touch();
    for h in 2..10 {
        admit(&p, entry(h), true, 1);
    }
    // Capacity 10: the small queue is "heavy", so victims come from it, in FIFO order,
    // skipping (and promoting, the main queue having room) the entry that was hit.
    let v = p.victim(10).unwrap();
    assert_eq!(v.hash, 2);
    assert_eq!(p.main.len(), 1, "the hit entry moved to the main queue");
    // The evicted hash is in the ghost: re-admitted, it starts at frequency 1, so it will
    // leave the small queue like an entry that was hit, but with no hits of its own.
    let back = entry(2);
    admit(&p, back.clone(), true, 1);
    assert_eq!((back.meta.freq(), back.meta.take_hits().0), (1, 0));
    // (A real hash differs from 2's in its high bits, which the ghost keeps.)
    let fresh = entry(100 << 32 | 100);
    admit(&p, fresh.clone(), true, 1);
    assert_eq!(fresh.meta.freq(), 0);
}

#[test]
fn a_cache_under_half_full_defers_the_sketch_to_the_first_visit_and_skips_the_ghost() {
    let p = evicted(64);
    admit(&p, entry(7), true, 1);
    let first = p.victim(1).unwrap();
    assert_eq!(first.hash, 7, "evicted, so the ghost remembers 7");
    assert_eq!(p.estimate(7), 1);
    let cold = entry(7);
    admit(&p, cold.clone(), false, 1);
    assert_eq!(cold.meta.freq(), 0, "the ghost is not consulted while cold");
    assert_eq!(p.estimate(7), 1, "the sketch is not fed while cold");
    cold.meta.touch();
    assert_eq!(p.queued(), 1, "the entry is queued all the same");
    assert_eq!(p.victim(1).unwrap().hash, 7, "and can be evicted");
    assert_eq!(
        p.estimate(7),
        3,
        "the visit recorded the admission with the hit"
    );
}

/// A policy for `entries` entries whose cache has evicted already: its sketch and ghost
/// sized (P4), as the first eviction leaves them.
fn evicted(entries: usize) -> EvictionPolicy<Arc<Entry>> {
    let p = EvictionPolicy::new(entries, T);
    p.prepare(|| None);
    p
}

/// A capacity-10 policy with `main` in the main queue, each seen twice (a miss and a
/// hit), then `small` fresh entries in the small queue.
fn full(main: std::ops::Range<u64>, small: std::ops::Range<u64>) -> EvictionPolicy<Arc<Entry>> {
    let p = evicted(64);
    for h in main {
        let e = entry(h);
        p.record(h, 2);
        push(&p.main, &p.main_weight, e);
    }
    for h in small {
        admit(&p, entry(h), true, 1);
    }
    p
}

#[test]
fn the_ghost_keeps_where_and_when_a_hash_left_beside_its_mark() {
    use super::near::{Left, STAMP_BITS};
    let p = evicted(64);
    let m = p.memory.get().unwrap();
    let (h, v) = (5 << 32 | 5, 6 << 32 | 6);
    let late = Left {
        main: true,
        stamp: (1 << STAMP_BITS) - 1,
    };
    m.remember(h, 0, late);
    assert_eq!(m.recall_left(h), (Recall::Evicted, Some(late)));
    assert_eq!(
        m.recall_left(7 << 32 | 5).0,
        Recall::Forgotten,
        "another fingerprint"
    );
    // A displaced victim keeps its date when its mark comes off, once.
    let early = Left {
        main: false,
        stamp: 3,
    };
    Pass::new(&p).remember_displaced(v, h, early);
    assert_eq!(m.recall_left(v), (Recall::Displaced, Some(early)));
    assert!(m.settle(v));
    assert!(!m.settle(v), "the mark comes off once");
    assert_eq!(m.recall_left(v), (Recall::Evicted, Some(early)));
}

#[test]
fn evictions_are_dated_by_their_queue_and_their_returns_counted_near() {
    // 100 leaves the small queue never hit and is evicted (the main queue is full and the
    // sketch barely knows it); it misses again before anything else left: a near return,
    // which a little more room in the small queue would have kept (P9).
    let p = full(0..9, 100..101);
    let m = p.memory.get().unwrap();
    assert_eq!(p.victim(10).unwrap().hash, 100);
    let (_, left) = m.recall_left(100);
    assert!(left.is_some_and(|l| !l.main), "{left:?}");
    admit(&p, entry(100), true, 1);
    // A main victim, back at once too.
    let pass = Pass::new(&p);
    let v = p.main_victim(&pass).unwrap();
    let v = p.evict_main(v, &pass);
    let (_, left) = m.recall_left(v.hash);
    assert!(left.is_some_and(|l| l.main), "{left:?}");
    admit(&p, entry(v.hash), true, 1);
    assert_eq!(p.climber.nears(), (2, 1), "one near return of each queue");
}

#[test]
fn a_full_main_queue_admits_only_leavers_more_frequent_than_its_victim() {
    // Nine main entries fill the main queue's share of capacity 10 (the small queue starts
    // at the least share, one entry here).
    let p = full(0..9, 100..102);
    assert_eq!(p.climber.small_room(10), 1);
    assert_eq!(p.main.len(), 9);
    // Both leavers were hit once, so they may duel (popped and pushed back in order).
    for _ in 0..2 {
        let e = p.small.pop().unwrap();
        e.meta.touch();
        p.small.push(e);
    }
    // Entry 100 leaves the small queue with two accesses (its miss and its hit) against
    // victim 0's two: the incumbent wins and stays at the head.
    let v = p.victim(10).unwrap();
    assert_eq!(v.hash, 100, "a tie or less keeps the incumbent");
    assert_eq!(
        p.front.len(),
        1,
        "the incumbent keeps the head of the main queue"
    );
    // Entry 101 has been missed often recently: it beats victim 0 and takes its place.
    p.record(101, 5);
    let v = p.victim(10).unwrap();
    assert_eq!(
        v.hash, 0,
        "the more frequent leaver displaces the main victim"
    );
    assert_eq!((p.front.len(), p.main.len()), (0, 9));
}

#[test]
fn a_heavy_leaver_must_outweigh_all_the_victims_it_would_displace() {
    // Nine main entries of weight 1 fill the main queue's share of capacity 10; two
    // leavers of weight 3, each hit once, would displace three of them.
    let p = full(0..9, 0..0);
    for h in [100, 101] {
        let e = heavy(h, 3);
        admit(&p, e.clone(), true, 1);
        e.meta.touch();
    }
    // 100 is estimated at 5 (its miss, its hit and three more misses): more than one
    // victim's 2, less than the 6 of the three victims it needs. It loses, and the three
    // keep the head of the main queue in their order.
    p.record(100, 3);
    assert_eq!(p.victim(10).unwrap().hash, 100);
    assert_eq!(p.front.len(), 3);
    // 101, at 7, outweighs the three: it moves in, and the three leave one after the other.
    p.record(101, 5);
    let evicted: Vec<u64> = (0..3).map(|_| p.victim(10).unwrap().hash).collect();
    assert_eq!(evicted, [0, 1, 2]);
    assert_eq!(
        p.main_weight.load(Ordering::Relaxed),
        9,
        "6 of weight 1 and 101's 3"
    );
    assert!(p.front.is_empty());
}

/// The door's verdict on `hash` of `weight` needing `need` under capacity 100 (P10), as the
/// hashes of its victims for an admission.
fn door(p: &EvictionPolicy<Arc<Entry>>, hash: u64, weight: u64, need: u64) -> Option<Vec<u64>> {
    match p.door(hash, weight, need, 100) {
        Door::Open => None,
        Door::Refuse => Some(Vec::new()),
        Door::Admit(v) => Some(v.iter().map(|e| e.hash).collect()),
    }
}

#[test]
fn a_newcomer_heavier_than_the_small_queue_is_judged_against_the_victims_it_would_displace() {
    // Capacity 100, a small queue's room of 9 at the starting share; 90 main entries of weight 1, each
    // seen twice.
    let p = evicted(100);
    for h in 0..90 {
        p.record(h, 2);
        push(&p.main, &p.main_weight, entry(h));
    }
    assert_eq!(p.climber.small_room(100), 9);
    assert_eq!(door(&p, 500, 9, 9), None, "within the small queue's room");
    assert_eq!(door(&p, 500, 20, 0), None, "it fits: nothing to judge");
    // Heavier than the small queue's room and needing 3: it must outcount three victims at 2 each.
    p.record(500, 4);
    assert_eq!(
        door(&p, 500, 20, 3),
        Some(vec![]),
        "5 (with this miss) against 6"
    );
    assert_eq!(
        (
            p.front.len(),
            p.main.len(),
            p.main_weight.load(Ordering::Relaxed)
        ),
        (0, 90, 90),
        "the victims went back to the main queue's tail, still counted"
    );
    assert_eq!(p.estimate(500), 5, "the miss was recorded");
    assert_eq!(
        door(&p, 500, 20, 3),
        Some(vec![]),
        "6 against the next three's 6: a tie keeps them"
    );
    assert_eq!(
        door(&p, 500, 20, 3),
        Some(vec![6, 7, 8]),
        "7 against 6: it displaces the three the hand reached next"
    );
    assert_eq!(p.main_weight.load(Ordering::Relaxed), 87);
    assert!(p.front.is_empty() && p.queueing());
    // The winner joins the main queue when it is admitted.
    let e = heavy(500, 20);
    assert!(p.admit_at(&e.meta, e.hash, 100, 100, true));
    p.enqueue(e, true, || 1);
    assert_eq!(p.main_weight.load(Ordering::Relaxed), 107);
    assert_eq!(p.estimate(500), 7, "its admission records nothing more");
}

#[test]
fn the_door_opens_when_the_main_queue_is_too_short_to_judge_and_refuses_what_it_cannot_weigh() {
    let p = evicted(100);
    for h in 0..2 {
        p.record(h, 1);
        push(&p.main, &p.main_weight, entry(h));
    }
    // Two victims free 2 of the 30 it needs, and it still outcounts them: the small queue
    // makes the room (without a record of the miss, which its admission makes).
    p.record(700, 6);
    assert_eq!(door(&p, 700, 40, 30), None);
    assert_eq!((p.front.len(), p.estimate(700)), (2, 6));
    // A newcomer at the sketch's ceiling outcounts victims none of which is there, however
    // many (up to the door's 64).
    let q = evicted(100);
    for h in 0..80 {
        q.record(h, 3);
        push(&q.main, &q.main_weight, entry(h));
    }
    q.record(800, 20);
    let won = door(&q, 800, 50, 50).expect("judged");
    assert_eq!(won.len(), 50);
    // One that would displace more than 64 loses.
    let r = evicted(100);
    for h in 0..80 {
        push(&r.main, &r.main_weight, entry(h));
    }
    r.record(900, 20);
    assert_eq!(door(&r, 900, 70, 70), Some(vec![]));
    assert_eq!(
        (r.front.len(), r.main.len()),
        (0, 80),
        "all 64 passed to the tail"
    );
}

#[test]
fn a_light_winner_takes_a_heavy_victims_place_and_the_main_total_falls_by_the_difference() {
    // Three main entries of weight 3 fill the main queue's share of capacity 10 (9); a
    // leaver of weight 1, hit once and estimated at 7, outweighs the first of them (2).
    let p = evicted(64);
    for h in 0..3 {
        p.record(h, 2);
        push(&p.main, &p.main_weight, heavy(h, 3));
    }
    let e = entry(100);
    admit(&p, e.clone(), true, 1);
    e.meta.touch();
    p.record(100, 5);
    assert_eq!(p.victim(10).unwrap().hash, 0, "the victim leaves");
    assert_eq!(
        (
            p.main_weight.load(Ordering::Relaxed),
            p.small_weight.load(Ordering::Relaxed)
        ),
        (7, 0),
        "two of weight 3 and the winner's 1; the small queue is empty"
    );
    assert_eq!(p.main.len(), 3);
}

#[test]
fn a_victim_counts_against_a_lighter_leaver_only_for_the_bytes_it_takes() {
    // One main entry of weight 9, estimated at 10, fills the main queue's share of capacity
    // 10. A leaver of weight 3 takes a third of its bytes, so it faces a third of its count
    // (3, rounded down). Each leaver counts its miss and its hit besides what it was seen:
    // 100 at 3 ties and loses, 101 at 4 wins (whole, the victim's 10 would keep both out).
    let p = evicted(64);
    p.record(0, 10);
    push(&p.main, &p.main_weight, heavy(0, 9));
    for (h, seen) in [(100, 1), (101, 2)] {
        let e = heavy(h, 3);
        admit(&p, e.clone(), true, 1);
        e.meta.touch();
        p.record(h, seen);
    }
    assert_eq!(
        p.victim(10).unwrap().hash,
        100,
        "3 against 3: the incumbent stays"
    );
    assert_eq!(
        p.victim(10).unwrap().hash,
        0,
        "4 against 3: the light one takes its place"
    );
    assert_eq!(p.main_weight.load(Ordering::Relaxed), 3);
}

#[test]
fn a_leaver_never_hit_duels_only_if_the_sketch_knows_it_well_and_then_by_a_margin() {
    // Victims 0..9 are estimated at 2 each (a miss and a hit); the three leavers were
    // never hit and the ghost does not know them. Each counts its own miss.
    let p = full(0..9, 100..103);
    // 100 was seen twice before (3 with its miss): under `T.known_estimate`, it is evicted
    // without a duel, and the main queue is untouched.
    p.record(100, 2);
    assert_eq!(p.estimate(100), T.known_estimate - 1);
    assert_eq!(p.victim(10).unwrap().hash, 100);
    assert_eq!((p.front.len(), p.main.len()), (0, 9));
    // 101 is known well (4) but not by the margin: 4 is not above 2 + 2. It duels and
    // loses, and victim 0 keeps the head.
    p.record(101, 3);
    assert_eq!(p.estimate(101), T.known_estimate);
    assert_eq!(p.victim(10).unwrap().hash, 101);
    assert_eq!(
        (p.front.len(), p.main.len()),
        (1, 8),
        "the incumbent holds the head"
    );
    // 102, at 5, beats victim 0 by more than the margin and takes its place.
    p.record(102, 4);
    assert_eq!(p.estimate(102), 2 + T.known_margin + 1);
    assert_eq!(p.victim(10).unwrap().hash, 0);
    assert_eq!(p.front.len() + p.main.len(), 9, "102 in, 0 out");
}

#[test]
fn entries_hit_twice_in_the_small_queue_skip_the_duel() {
    let p = full(0..9, 100..101);
    let e = entry(101);
    admit(&p, e.clone(), true, 1);
    e.meta.touch();
    e.meta.touch();
    p.record(0, 10);
    // 100 leaves first, never hit, and is evicted; 101 was hit twice in the small queue, so it
    // moves to the main queue although victim 0 is far more frequent, and 0 is evicted
    // for it.
    assert_eq!(p.victim(10).unwrap().hash, 100);
    assert_eq!(p.victim(10).unwrap().hash, 0);
    assert!(p.main.len() + p.front.len() == 9);
}

#[test]
fn a_remembered_leaver_hit_in_the_small_queue_skips_the_duel_and_one_hit_alone_does_not() {
    let p = full(0..9, 0..0);
    p.record(0, 10);
    p.record(1, 10);
    // 101 comes back after an eviction (the ghost remembers it) and is hit once; 102 is
    // new and hit once. Both have far fewer accesses in the sketch than victims 0 and 1.
    // (The ghost keeps a hash's high bits, so 102's differ from 101's.)
    let (back, new) = (entry(101), entry(102 << 32 | 102));
    p.memory.get().unwrap().remember(
        back.hash,
        0,
        super::near::Left {
            main: false,
            stamp: 0,
        },
    );
    admit(&p, back.clone(), true, 1);
    admit(&p, new.clone(), true, 1);
    assert_eq!(back.meta.freq(), 1, "the ghost remembered 101");
    assert_eq!(new.meta.freq(), 0, "and not 102");
    back.meta.touch();
    new.meta.touch();
    // 101 moves to the main queue without a duel, and victim 0 is evicted for it...
    assert_eq!(p.victim(10).unwrap().hash, 0);
    // ...while 102 duels victim 1 and loses.
    assert_eq!(p.victim(10).unwrap().hash, new.hash);
    assert_eq!(p.front.len(), 1, "the incumbent keeps the head");
}

#[test]
fn incumbents_at_the_ceiling_give_way_once_duels_halve_the_sketch() {
    // Nine main entries whose keys the sketch counts at its ceiling, from a phase that is
    // over: no newcomer can be estimated above them.
    let p = full(0..9, 0..0);
    for h in 0..9 {
        p.record(h, 100);
    }
    assert_eq!(p.estimate(0), sketch::MAX);
    // Ten additions an entry of other keys (the sketch is sized for 64 entries), far short
    // of the small cache's period.
    for k in 0..700 {
        p.record(1_000_000 + k, 1);
    }
    // Hashes with high bits of their own (even, as the ghost's fingerprint sets the lowest),
    // so the ghost does not take one newcomer for another that it saw evicted.
    let hash = |h: u64| (2 * h) << 32 | h;
    let duel = |h: u64, extra: u64| {
        let e = entry(hash(h));
        admit(&p, e.clone(), true, 1);
        e.meta.touch();
        p.record(e.hash, extra);
        p.victim(10).unwrap().hash & 0xFFFF
    };
    // Sixteen newcomers, each hit once, lose their duels to victim 0 at the ceiling...
    for h in 0..16 {
        assert_eq!(duel(100 + h, 0), 100 + h, "duel {h} keeps the incumbent");
    }
    // ...and the sixteenth halved the sketch: the incumbent is estimated at 7, and a
    // newcomer seen eight times takes its place. Without the halving it would need 16.
    assert_eq!(p.estimate(0), 7);
    assert_eq!(duel(200, 6), 0, "the stale incumbent is evicted");
}

#[test]
fn frequency_saturates_and_main_queue_gives_second_chances() {
    let p = evicted(64);
    let e = entry(7);
    admit(&p, e.clone(), true, 1);
    for _ in 0..10 {
        e.meta.touch();
    }
    assert_eq!(e.meta.freq(), MAX_FREQ);
    // Only entry: it is promoted, then passed over MAX_FREQ times, then evicted.
    let v = p.victim(1).unwrap();
    assert_eq!(v.hash, 7);
    assert!(p.victim(1).is_none());
}

#[test]
fn dead_entries_are_skipped_and_compacted() {
    let p = evicted(64);
    let entries: Vec<_> = (0..3000).map(entry).collect();
    for e in &entries {
        e.cached.store(false, Ordering::Relaxed);
    }
    for e in &entries {
        admit(&p, e.clone(), true, 0);
    }
    assert!(
        p.queued() < 3000,
        "compaction dropped dead entries: {}",
        p.queued()
    );
    assert!(p.victim(100).is_none(), "no live entry to evict");
    assert_eq!(p.queued(), 0);
}

#[test]
fn a_compaction_round_is_spread_over_admissions() {
    let p = evicted(64);
    let (mut before, mut most, mut dropped) = (0usize, 0usize, 0usize);
    for i in 0..5000 {
        let e = entry(i);
        e.cached.store(false, Ordering::Relaxed);
        admit(&p, e, true, 0);
        let now = p.queued();
        // Each admission pushes one entry; whatever else left was dropped by its step.
        let gone = (before + 1).saturating_sub(now);
        most = most.max(gone);
        dropped += gone;
        before = now;
    }
    assert!(dropped > 3000, "rounds ran: {dropped} dead entries dropped");
    assert!(
        most <= COMPACT_STEP,
        "no admission looked at more than a step: {most}"
    );
}

#[test]
fn a_cold_cache_queues_nothing_until_it_is_first_warm_and_the_sweep_enlists_once() {
    let p = evicted(64);
    let cold = entry(1);
    admit(&p, cold.clone(), false, 1);
    assert_eq!(p.queued(), 0, "a cold admission is not queued");
    assert!(!p.queueing());
    assert!(p.victim(10).is_none(), "nothing queued, nothing to evict");
    assert!(
        p.enlist(&cold.meta, || cold.clone()),
        "the sweep enlists it"
    );
    assert!(
        !p.enlist(&cold.meta, || cold.clone()),
        "a second sweep does not queue it twice (P1)"
    );
    assert_eq!(p.queued(), 1);
    let warm = entry(2);
    admit(&p, warm.clone(), true, 2);
    assert!(p.queueing(), "the first warm admission turns queueing on");
    assert!(
        !p.enlist(&warm.meta, || warm.clone()),
        "an admitted entry is claimed"
    );
    let later = entry(3);
    admit(&p, later, false, 3);
    assert_eq!(
        p.queued(),
        3,
        "once queueing, cold admissions are queued too (P2)"
    );
    assert!(p.validate().is_ok());
}

#[test]
fn a_leaver_never_hit_fills_room_in_the_main_queue_only_if_seen_before() {
    let p = evicted(64);
    let (seen, unseen) = (entry(1), entry(2));
    admit(&p, seen.clone(), true, 2);
    admit(&p, unseen.clone(), true, 2);
    // One more access of key 1 before this one (a loop's previous round, say).
    p.record(1, 1);
    // Capacity 10, an empty main queue: room for both; only the key seen before takes it.
    assert_eq!(
        p.victim(10).unwrap().hash,
        2,
        "the key never seen before leaves"
    );
    assert_eq!(
        (p.small.len(), p.main.len()),
        (0, 1),
        "key 1 moved to the main queue"
    );
    assert_eq!(
        seen.meta.freq(),
        0,
        "without a hit: first in line for the main queue's victim"
    );
    assert!(p.validate().is_ok());
}

#[test]
fn the_sketch_and_ghost_are_sized_once_before_the_first_eviction() {
    let p = EvictionPolicy::<Arc<Entry>>::new(64, T);
    let (cold, warm) = (entry(1), entry(2));
    admit(&p, cold.clone(), false, 1);
    admit(&p, warm.clone(), true, 2);
    assert_eq!(p.sized_for(), None, "nothing allocated before an eviction");
    assert_eq!(p.estimate(2), 0);
    p.prepare(|| Some(5_000));
    assert_eq!(p.sized_for(), Some(5_000));
    p.prepare(|| panic!("sized twice"));
    assert_eq!(p.sized_for(), Some(5_000), "sized once");
    // The warm admission was left for the first visit to record (the cold entry waits for
    // the engine's sweep, P2).
    assert_eq!(p.victim(2).map(|e| e.hash), Some(2));
    assert_eq!((p.estimate(1), p.estimate(2)), (0, 1));

    // A cache that cannot tell keeps the guess; one that holds more than the most is capped.
    let guessed = EvictionPolicy::<Arc<Entry>>::new(64, T);
    guessed.prepare(|| None);
    assert_eq!(guessed.sized_for(), Some(64));
    let huge = EvictionPolicy::<Arc<Entry>>::new(64, T);
    huge.prepare(|| Some(u64::MAX));
    assert_eq!(huge.sized_for(), Some(T.max_entries));
}

#[test]
fn idle_main_entries_lose_their_sketch_counts_only_while_aging() {
    // Hashes spread over the sketch, so that no two of these keys share a counter.
    let key = |i: u64| (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for aging in [false, true] {
        let p = evicted(64);
        for i in 0..4 {
            p.record(key(i), 12);
            push(&p.main, &p.main_weight, entry(key(i)));
        }
        p.climber.set_aging(aging);
        let halved = |n: u64| if aging { n / 2 } else { n };
        // Entry 1 was hit since the policy last saw it; the others were not.
        let e = p.main.pop().unwrap();
        p.main.push(e);
        let hit = p.main.pop().unwrap();
        assert_eq!(hit.hash, key(1));
        hit.meta.touch();
        p.main.push(hit);
        // The queue is 2, 3, 0, 1. One pass: 2 is the first entry at frequency 0.
        let pass = |expected: u64| {
            let pass = Pass::new(&p);
            let v = p.main_victim(&pass).unwrap();
            assert_eq!(v.hash, key(expected));
            v
        };
        let v = pass(2);
        assert_eq!(
            p.climber.visits(),
            (1, 1),
            "one visit, idle, counted at the pass's end"
        );
        assert_eq!(p.estimate(key(2)), halved(12), "aging: {aging}");
        // The victim keeps the head (`front`) after a duel: visited again at once, it is
        // neither aged nor counted again.
        p.front.push(v);
        p.main.push(pass(2));
        assert_eq!(p.estimate(key(2)), halved(12));
        assert_eq!(p.climber.visits(), (1, 1));
        // The queue's turn: 3 and 0 (idle), then 1 (hit: its hit reaches the sketch, it gets
        // another round), then 2 again, idle for a second round.
        p.main.push(pass(3));
        p.main.push(pass(0));
        let v = pass(2);
        assert_eq!(p.climber.visits(), (5, 4), "1's visit was not idle");
        assert_eq!(
            p.estimate(key(1)),
            13,
            "the hit entry kept its counts, plus the hit"
        );
        assert_eq!(p.estimate(key(0)), halved(12));
        assert_eq!(
            p.estimate(key(2)),
            halved(halved(12)),
            "idle for another round"
        );
        drop(v);
    }
}

#[test]
fn entries_admitted_cold_leave_in_the_order_they_came_whatever_the_sweep_met_first() {
    // Capacity 64: ten cold admissions at sizes 1..=10 of it, stages 0..=4 (P6). The sweep
    // meets them in "table order" (here: reversed); a warm admission comes meanwhile.
    let p = evicted(64);
    let cold: Vec<Arc<Entry>> = (1..=10u64).map(entry).collect();
    for (size, e) in (1..=10u64).zip(&cold) {
        assert!(
            !p.admit_at(&e.meta, e.hash, size, 64, false),
            "cold: not queued"
        );
    }
    assert_eq!(cold[0].meta.stage(), 0);
    assert_eq!(cold[9].meta.stage(), stage(10, 64, T.stages) as usize);
    assert!(cold[9].meta.stage() > cold[0].meta.stage());
    let warm = entry(99);
    assert!(
        p.admit_at(&warm.meta, warm.hash, 32, 64, false),
        "warm: queued"
    );
    p.enqueue(warm.clone(), false, || 11);
    for e in cold.iter().rev() {
        assert!(p.enlist(&e.meta, || e.clone()));
        assert!(!p.enlist(&e.meta, || e.clone()), "claimed once (P1)");
    }
    assert_eq!(p.queued(), 11);
    p.validate()
        .expect("the staged entries count in the small queue's weight");
    // Capacity 1: every victim comes from the small side; the cold entries leave by stage
    // (within a stage, in the sweep's order), then the warm one.
    let order: Vec<u64> = std::iter::from_fn(|| p.victim(1).map(|e| e.hash)).collect();
    let stages: Vec<usize> = order[..10]
        .iter()
        .map(|h| cold[*h as usize - 1].meta.stage())
        .collect();
    assert!(
        stages.windows(2).all(|w| w[0] <= w[1]),
        "{order:?} {stages:?}"
    );
    assert_eq!(order[10], 99, "{order:?}");
    assert!(p.small_is_empty());
}

#[test]
fn the_stage_of_a_cold_admission_stays_within_the_stages() {
    assert_eq!(stage(0, 0, T.stages), 0);
    assert_eq!(stage(0, 1, T.stages), 0);
    assert_eq!(stage(u64::MAX, u64::MAX, T.stages), T.stages - 1);
    assert_eq!(stage(u64::MAX, 2, T.stages), T.stages - 1);
    assert_eq!(stage(31, 64, T.stages), T.stages - 1);
    assert_eq!(stage(16, 64, T.stages), 7);
}

#[test]
fn main_entries_taken_while_the_small_queue_was_empty_come_back_only_through_duels() {
    // Nine main entries fill the main queue's share of capacity 10, and the small queue is
    // empty, as when other threads' newcomers are still on their way into it: the evictor
    // takes the main queue's victim without a duel, and the main queue owes its weight.
    let p = full(0..9, 0..0);
    // Newcomers' hashes differ from the main entries' in the high bits the ghost keeps, so
    // the ghost does not take them for evicted ones.
    const TIE: u64 = 200 << 32 | 100;
    const STRONG: u64 = 202 << 32 | 101;
    const FREE: u64 = 204 << 32 | 102;
    assert_eq!(p.victim(10).unwrap().hash, 0);
    assert_eq!(p.main_weight.load(Ordering::Relaxed), 8);
    assert_eq!(p.owed.load(Ordering::Relaxed), 1);
    // A leaver hit once, estimated at 2 as the main victim is, would have walked into the
    // room; while it is owed, it must beat the victim for it, and a tie keeps the room.
    let tie = entry(TIE);
    admit(&p, tie.clone(), true, 1);
    tie.meta.touch();
    assert_eq!(p.victim(10).unwrap().hash, TIE, "the tie leaves");
    assert_eq!(p.main_weight.load(Ordering::Relaxed), 8, "the room stays");
    assert_eq!(p.front.len(), 1, "the victim keeps the head");
    // A more frequent leaver wins the room and pays the debt. The small queue is empty
    // again, so the next victim is the main queue's head, taken without a duel once more.
    let strong = entry(STRONG);
    admit(&p, strong.clone(), true, 1);
    strong.meta.touch();
    p.record(STRONG, 5);
    assert_eq!(p.victim(10).unwrap().hash, 1);
    assert_eq!(p.main_weight.load(Ordering::Relaxed), 8, "101 in, 1 out");
    assert_eq!(p.owed.load(Ordering::Relaxed), 1, "paid by 101, owed for 1");
    // Nothing owed, a leaver that only ties walks into the room, as before the rule (and
    // the empty small queue gives up the main queue's head once more).
    p.owed.store(0, Ordering::Relaxed);
    let free = entry(FREE);
    admit(&p, free.clone(), true, 1);
    free.meta.touch();
    assert_eq!(p.victim(10).unwrap().hash, 2, "the tie moved in");
    assert_eq!(p.main_weight.load(Ordering::Relaxed), 8);
}
