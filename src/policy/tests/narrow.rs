//! The check on narrow wins (**P8**, `narrow.rs`): the trust score, the marks a narrow win
//! leaves on its winner and in the ghost, and what they add up to.

use super::super::memory::Recall;
use super::super::narrow::NarrowWins;
use super::*;

#[test]
fn narrow_wins_are_refused_while_their_victims_come_back_and_one_in_explore_goes_ahead() {
    let n = NarrowWins::new(T);
    assert!(n.stands(), "trusted until measured");
    n.returned();
    assert_eq!(n.trust(), -1);
    // Below zero, the thread's refused wins go ahead one in T.explore, to keep measuring.
    let stood: Vec<bool> = (0..2 * T.explore).map(|_| n.stands()).collect();
    let ahead: Vec<usize> = (0..stood.len()).filter(|&i| stood[i]).collect();
    let every = T.explore as usize;
    assert_eq!(ahead, vec![every - 1, 2 * every - 1]);
    // A proof outweighs a return: trusted again.
    n.proved();
    assert_eq!(n.trust(), 1);
    assert!(n.stands());
}

#[test]
fn the_trust_score_stays_within_its_bound_and_turns_around_within_it() {
    let n = NarrowWins::new(T);
    for _ in 0..10_000 {
        n.returned();
    }
    assert_eq!(n.trust(), -64, "bounded below");
    // So 32 proofs (worth two returns each) bring it back to zero, however long the
    // returns ran before.
    for _ in 0..32 {
        n.proved();
    }
    assert_eq!(n.trust(), 0);
    for _ in 0..10_000 {
        n.proved();
    }
    assert_eq!(n.trust(), 64, "bounded above");
}

/// Admits `hash` as a newcomer the ghost remembers (evicted, unmarked) and that the sketch
/// counts at `estimate` with its miss.
fn remembered(p: &EvictionPolicy<Arc<Entry>>, hash: u64, estimate: u64) -> Arc<Entry> {
    p.memory.get().unwrap().remember(
        hash,
        0,
        super::super::near::Left {
            main: false,
            stamp: 0,
        },
    );
    let e = entry(hash);
    admit(p, e.clone(), true, 1);
    assert_eq!(e.meta.freq(), 1, "the ghost remembered {hash:#x}");
    p.record(hash, estimate - 1);
    assert_eq!(p.estimate(hash), estimate);
    e
}

#[test]
fn a_narrow_win_marks_its_victim_whose_return_refuses_the_next_one_but_not_a_clear_win() {
    // Nine main entries at an estimate of 2 fill capacity 10's main queue.
    let p = full(0..9, 0..0);
    // Newcomers' hashes differ from the main entries' in the high bits the ghost keeps.
    const FIRST: u64 = 300 << 32 | 100;
    const SECOND: u64 = 302 << 32 | 101;
    const CLEAR: u64 = 304 << 32 | 102;
    // A leaver the ghost sent back, never hit, estimated at 3 (its miss included) against
    // victim 0's 2: it wins by one, and victim 0 is remembered as displaced.
    let _first = remembered(&p, FIRST, 3);
    assert_eq!(p.victim(10).unwrap().hash, 0, "the narrow win stands");
    let ghost = p.memory.get().unwrap();
    assert_eq!(ghost.recall(0), Recall::Displaced);
    assert_eq!(ghost.recall(SECOND), Recall::Forgotten);
    // Victim 0 comes back: the win cost a miss.
    admit(&p, entry(0), true, 1);
    assert_eq!(p.narrow.trust(), -1);
    // So the next narrow wins are refused: victim 0 itself, back in the small queue and
    // remembered, leaves first and would beat victim 1 by one; then another such leaver.
    // Each leaves, and the incumbent keeps the head. (This test's thread refuses nothing
    // else, so neither is the one in T.explore that goes ahead.)
    let _second = remembered(&p, SECOND, 3);
    assert_eq!(p.estimate(0), 3);
    assert_eq!(p.victim(10).unwrap().hash, 0, "refused while distrusted");
    assert_eq!(
        p.victim(10).unwrap().hash,
        SECOND,
        "refused while distrusted"
    );
    assert_eq!(p.front.len(), 1);
    // A win by two is no narrow win: it stands whatever the score, and its victim is
    // remembered unmarked.
    let _clear = remembered(&p, CLEAR, 4);
    assert_eq!(p.victim(10).unwrap().hash, 1, "a clear win stands");
    assert_eq!(p.memory.get().unwrap().recall(1), Recall::Evicted);
    assert_eq!(p.narrow.trust(), -1, "nothing proved or returned since");
}

/// A capacity-2 policy (a main queue of one entry) whose main entry `victim` (estimated at
/// 2) has just been displaced by `winner`, a leaver the ghost sent back, never hit, that won
/// by one; returns the winner.
fn one_narrow_win(victim: u64, winner: u64) -> (EvictionPolicy<Arc<Entry>>, Arc<Entry>) {
    let p = evicted(64);
    assert_eq!(p.climber.small_room(2), 1);
    p.record(victim, 2);
    push(&p.main, &p.main_weight, entry(victim));
    let w = remembered(&p, winner, 3);
    assert_eq!(p.victim(2).unwrap().hash, victim, "the narrow win stands");
    assert_eq!(p.memory.get().unwrap().recall(victim), Recall::Displaced);
    (p, w)
}

#[test]
fn a_narrow_winner_hit_before_its_victim_returns_proves_the_win_once() {
    const WINNER: u64 = 300 << 32 | 0xC000_0000;
    let (p, w) = one_narrow_win(7, WINNER);
    // Hit in the main queue, the winner's visit proves the win: its victim's mark is
    // still in the ghost, and comes off.
    w.meta.touch();
    assert_eq!(
        p.victim(2).unwrap().hash,
        WINNER,
        "another round, then evicted"
    );
    assert_eq!(p.narrow.trust(), 2);
    assert_eq!(p.memory.get().unwrap().recall(7), Recall::Evicted);
    // The victim's return after the proof counts nothing more.
    admit(&p, entry(7), true, 1);
    assert_eq!(p.narrow.trust(), 2);
}

#[test]
fn a_victim_that_returns_before_its_winner_is_hit_counts_against_the_win_once() {
    const WINNER: u64 = 300 << 32 | 0xC000_0000;
    let (p, w) = one_narrow_win(7, WINNER);
    // The victim comes back first: the win cost a miss.
    admit(&p, entry(7), true, 1);
    assert_eq!(p.narrow.trust(), -1);
    // The winner's hit after that proves nothing (its victim's mark is gone)...
    w.meta.touch();
    let _ = p.victim(2);
    assert_eq!(p.narrow.trust(), -1);
    // ...and a winner never hit proves nothing when it comes round to be the victim.
    let (p, _w) = one_narrow_win(8, WINNER);
    assert_eq!(p.victim(2).unwrap().hash, WINNER);
    assert_eq!(p.narrow.trust(), 0);
    assert_eq!(p.memory.get().unwrap().recall(8), Recall::Displaced);
}
