//! Unit tests of the timer wheel and the deadline arithmetic.

use super::*;
use std::sync::atomic::AtomicBool as StdBool;
use std::sync::Arc;

/// A test node: a deadline and whether it is cached.
#[derive(Clone)]
struct N(Arc<(std::sync::atomic::AtomicU64, StdBool)>);

impl N {
    fn new(deadline: u64) -> Self {
        Self(Arc::new((
            std::sync::atomic::AtomicU64::new(deadline),
            StdBool::new(true),
        )))
    }
}

impl Scheduled for N {
    fn deadline(&self) -> u64 {
        self.0 .0.load(Ordering::Relaxed)
    }
    fn is_cached(&self) -> bool {
        self.0 .1.load(Ordering::Relaxed)
    }
}

fn wheel() -> Expiring<(), (), N> {
    Expiring::new(Clock::manual().0, Rule::Live(0))
}

#[test]
fn nodes_come_due_within_a_tick_of_their_deadlines_at_every_level() {
    let w = wheel();
    // Deadlines at every level's reach and past the last one.
    let deadlines = [
        0,
        5 * TICK,
        70 * TICK,
        5_000 * TICK,
        300_000 * TICK,
        1 << 45,
    ];
    let nodes: Vec<N> = deadlines.iter().map(|&d| N::new(d)).collect();
    for n in &nodes {
        w.schedule(n.clone(), n.deadline());
    }
    for &d in &deadlines {
        if d > TICK {
            assert_eq!(w.step(d - TICK - 1, usize::MAX, |_| {}), 0, "{d}");
        }
        let mut got = Vec::new();
        w.step(d + TICK, usize::MAX, |n| got.push(n.deadline()));
        assert_eq!(got, [d]);
    }
    assert_eq!(w.scheduled(), 0);
}

#[test]
fn a_moved_deadline_waits_again_and_a_removed_node_is_dropped() {
    let w = wheel();
    let (moved, removed) = (N::new(10 * TICK), N::new(10 * TICK));
    w.schedule(moved.clone(), moved.deadline());
    w.schedule(removed.clone(), removed.deadline());
    moved.0 .0.store(100 * TICK, Ordering::Relaxed);
    removed.0 .1.store(false, Ordering::Relaxed);
    assert_eq!(w.step(50 * TICK, usize::MAX, |_| {}), 0);
    assert_eq!(w.scheduled(), 1, "the removed node was dropped");
    assert_eq!(w.step(101 * TICK, usize::MAX, |_| {}), 1);
}

#[test]
fn a_step_hands_out_at_most_its_share_and_the_rest_stays_due() {
    let w = wheel();
    let nodes: Vec<N> = (0..1_000).map(|i| N::new(i * 7)).collect();
    for n in &nodes {
        w.schedule(n.clone(), n.deadline());
    }
    assert_eq!(w.step(TICK * 10, 300, |_| {}), 300);
    assert!(w.step_due(TICK * 10));
    assert_eq!(w.step(TICK * 10, usize::MAX, |_| {}), 700);
    assert!(!w.step_due(TICK * 10));
}

#[test]
fn a_long_idle_costs_the_entries_not_the_ticks() {
    let w = wheel();
    let far = N::new(NEVER - 1);
    let soon = N::new(3 * TICK);
    w.schedule(far.clone(), far.deadline());
    w.schedule(soon.clone(), soon.deadline());
    // Some 500 years of ticks: turned bucket by bucket, this would never end.
    assert_eq!(w.step(NEVER - (1 << 40), usize::MAX, |_| {}), 1);
    assert_eq!(w.scheduled(), 1);
}

#[test]
fn durations_saturate_at_the_clock_end() {
    assert_eq!(after(5, Duration::MAX), NEVER);
    assert_eq!(after(NEVER - 1, Duration::from_nanos(2)), NEVER);
    assert_eq!(left(10, NEVER), None);
    assert_eq!(left(10, 4), Some(Duration::ZERO));
    let (clock, hand) = Clock::manual();
    hand.advance(Duration::MAX);
    assert_eq!(clock.now(), u64::MAX);
}
