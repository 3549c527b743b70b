//! Unit tests of the timer wheel and the deadline arithmetic.

use super::*;
use std::collections::hash_map::RandomState;
use std::sync::atomic::AtomicBool as StdBool;
use std::sync::Arc;

/// A test record: the deadline it was scheduled with, and whether its node is cached.
#[derive(Clone)]
struct N(u64, Arc<StdBool>);

impl N {
    fn new(deadline: u64) -> Self {
        Self(deadline, Arc::new(StdBool::new(true)))
    }

    fn remove(&self) {
        self.1.store(false, Ordering::Relaxed);
    }
}

impl Scheduled for N {
    fn deadline(&self) -> u64 {
        self.0
    }
}

/// A sweep keeps the records of cached nodes.
fn keep(n: &N, _: u8) -> bool {
    n.1.load(Ordering::Relaxed)
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
        w.schedule(n.clone(), keep);
    }
    for &d in &deadlines {
        if d > TICK {
            assert_eq!(w.step(d - TICK - 1, usize::MAX, keep, |_| {}), 0, "{d}");
        }
        let mut got = Vec::new();
        w.step(d + TICK, usize::MAX, keep, |n| got.push(n.deadline()));
        assert_eq!(got, [d]);
    }
    assert_eq!(w.scheduled(), 0);
}

#[test]
fn a_sweep_drops_the_records_of_removed_nodes_once_they_outnumber_the_kept() {
    let w = wheel();
    // The first sweep comes at 1,024 records and keeps them all; the next at SWEEP_AT ×
    // 1,024 + 1,024, and drops the removed ones.
    let total = (SWEEP_AT as u64 + 1) * 1_024 + 100;
    let nodes: Vec<N> = (0..total).map(|i| N::new((1_000 + i) * TICK)).collect();
    for n in &nodes[..2_000] {
        w.schedule(n.clone(), keep);
    }
    nodes[..1_500].iter().for_each(N::remove);
    for n in &nodes[2_000..] {
        w.schedule(n.clone(), keep);
    }
    let left = total as usize - 1_500;
    assert_eq!(
        w.scheduled(),
        left,
        "the removed nodes' records were dropped"
    );
    let mut got = Vec::new();
    w.step((2_000 + total) * TICK, usize::MAX, keep, |n| {
        got.push(n.deadline())
    });
    assert_eq!(got.len(), left);
    assert!(got.iter().all(|&d| d >= 2_500 * TICK));
}

#[test]
fn a_step_hands_out_at_most_its_share_and_the_rest_stays_due() {
    let w = wheel();
    let nodes: Vec<N> = (0..1_000).map(|i| N::new(i * 7)).collect();
    for n in &nodes {
        w.schedule(n.clone(), keep);
    }
    assert_eq!(w.step(TICK * 10, 300, keep, |_| {}), 300);
    assert!(w.step_due(TICK * 10));
    assert_eq!(w.step(TICK * 10, usize::MAX, keep, |_| {}), 700);
    assert!(!w.step_due(TICK * 10));
}

#[test]
fn a_long_idle_costs_the_entries_not_the_ticks() {
    let w = wheel();
    let far = N::new(NEVER - 1);
    let soon = N::new(3 * TICK);
    w.schedule(far.clone(), keep);
    w.schedule(soon.clone(), keep);
    // Some 500 years of ticks: turned bucket by bucket, this would never end.
    assert_eq!(w.step(NEVER - (1 << 40), usize::MAX, keep, |_| {}), 1);
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

/// A cache of `u64`s whose entries live for an hour on a manual clock.
fn hour_cache() -> (RawCache<u64, u64, RandomState>, ManualClock) {
    let (clock, hand) = Clock::manual();
    let c = RawCache::<u64, u64, _>::new(8, 1_000, RandomState::new(), None, None, true, None)
        .with_expiry(clock, Rule::Live(nanos(Duration::from_secs(3_600))));
    (c, hand)
}

/// Records of the wheel, in its inbox and its buckets.
fn records(c: &RawCache<u64, u64, RandomState>) -> usize {
    c.expiry.as_ref().expect("an expiring cache").scheduled()
}

/// A key removed and put again, the clock standing still, gets its node at the address its
/// last one had (the allocator hands the block back): every old record then names the new
/// node. The sweep keeps one per node (X4), so the wheel stays bound by the live entries;
/// and the entry still expires.
#[test]
fn records_of_a_key_put_again_at_the_same_address_do_not_pile_up() {
    let (c, hand) = hour_cache();
    for round in 0..100_000u64 {
        assert!(c.insert(7, round, false, None).is_ok());
        assert!(c.remove(&7).is_some());
        c.reclaim();
    }
    assert!(c.insert(7, 0, false, None).is_ok());
    let held = records(&c);
    assert!(
        held <= 2 * (SWEEP_AT + 1) * 1_024,
        "{held} records for one entry"
    );
    hand.advance(Duration::from_secs(3_601));
    assert_eq!(c.purge_expired(), 1);
    assert_eq!(c.len(), 0);
}

/// A time-to-idle entry read after it was scheduled comes due at its first deadline, is
/// found alive with a later one, and is scheduled again for that one.
#[test]
fn a_record_due_before_a_read_moved_its_deadline_is_scheduled_again() {
    let (clock, hand) = Clock::manual();
    let c = RawCache::<u64, u64, _>::new(8, 1_000, RandomState::new(), None, None, true, None)
        .with_expiry(clock, Rule::Idle(nanos(Duration::from_secs(10))));
    assert!(c.insert(1, 1, false, None).is_ok());
    hand.advance(Duration::from_secs(8));
    assert!(
        c.get(&1, &c.pin()).is_some(),
        "read at 8 s: due at 18 s now"
    );
    hand.advance(Duration::from_secs(4));
    assert_eq!(c.purge_expired(), 0, "not expired at 12 s");
    assert_eq!(records(&c), 1, "scheduled again");
    hand.advance(Duration::from_secs(7));
    assert_eq!(c.purge_expired(), 1, "expired at 19 s");
}

/// Under churn the records of evicted entries are swept: what the wheel holds stays bound
/// by the live entries, not by the writes.
#[test]
fn records_of_evicted_entries_are_swept_under_churn() {
    let (c, _hand) = hour_cache();
    for k in 0..200_000u64 {
        assert!(c.insert(k, k, false, None).is_ok());
    }
    let held = records(&c);
    let bound = 2 * (SWEEP_AT + 1) * (c.len() + 1_024);
    assert!(held <= bound, "{held} records for {} entries", c.len());
}
