//! The grouped cache with expiry: each value expires on its own, a group whose values have
//! all expired leaves its session and its count, and an expired group never pushes out a
//! live one. Time moves on a manual clock (no sleeps).

use runcache::grouped::{GroupedCache, GroupedCacheBuilder, OwnerId};
use runcache::{Clock, ConfigError, ManualClock};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

type Blobs = GroupedCache<u32, u32, &'static str, u64>;

const SECOND: Duration = Duration::from_secs(1);

type Builder = GroupedCacheBuilder<u32, u32, &'static str, u64>;

/// A grouped cache on a manual clock whose values follow `rule` (a time to live or idle).
fn built(groups_per_session: usize, rule: impl FnOnce(Builder) -> Builder) -> (Blobs, ManualClock) {
    let (clock, hand) = Clock::manual();
    let c = rule(Blobs::builder(groups_per_session).clock(clock))
        .build()
        .unwrap();
    (c, hand)
}

fn idle(groups_per_session: usize, idle: Duration) -> (Blobs, ManualClock) {
    built(groups_per_session, |b| b.time_to_idle(idle))
}

fn live(groups_per_session: usize, live: Duration) -> (Blobs, ManualClock) {
    built(groups_per_session, |b| b.time_to_live(live))
}

#[test]
fn an_expired_value_is_never_returned_and_is_built_again() {
    let (c, hand) = live(0, 10 * SECOND);
    c.set(&0, &1, &"a", 1);
    hand.advance(9 * SECOND);
    assert_eq!(c.get(&0, &1, "a").as_deref(), Some(&1));
    hand.advance(SECOND);
    assert!(c.get(&0, &1, "a").is_none(), "at its deadline");
    let builds = AtomicUsize::new(0);
    for _ in 0..3 {
        let v = c.get_or_insert_with(&0, &1, &"a", || {
            builds.fetch_add(1, Ordering::SeqCst);
            2
        });
        assert_eq!(*v, 2);
    }
    assert_eq!(builds.load(Ordering::SeqCst), 1, "built once, anew");
    assert_eq!((c.len(), c.group_count(&0)), (1, 1));
}

#[test]
fn a_group_whose_values_all_expired_leaves_its_session() {
    let (c, hand) = live(0, 10 * SECOND);
    c.set(&0, &1, &"a", 1);
    c.set(&0, &1, &"b", 2);
    c.set(&0, &2, &"a", 3);
    hand.advance(5 * SECOND);
    // A store over a value starts its time anew: group 2 keeps one live value.
    c.set(&0, &2, &"a", 4);
    hand.advance(5 * SECOND);
    assert_eq!(c.purge_expired(), 2);
    assert_eq!((c.len(), c.group_count(&0)), (1, 1));
    assert_eq!(c.get(&0, &2, "a").as_deref(), Some(&4));
    hand.advance(5 * SECOND);
    assert_eq!(c.purge_expired(), 1);
    assert_eq!((c.len(), c.group_count(&0)), (0, 0));
    assert_eq!(c.purge_expired(), 0, "nothing left");
}

#[test]
fn reads_keep_an_idle_group_alive() {
    let (c, hand) = idle(0, 10 * SECOND);
    c.set(&0, &1, &"a", 1);
    c.set(&0, &2, &"a", 2);
    for _ in 0..5 {
        hand.advance(6 * SECOND);
        assert!(c.get(&0, &1, "a").is_some(), "read within its idle time");
        c.purge_expired();
    }
    assert_eq!(c.group_count(&0), 1, "group 2 sat idle and went");
    assert!(c.get(&0, &2, "a").is_none());
    // A hit of get_or_insert_with is a read too.
    hand.advance(6 * SECOND);
    assert_eq!(*c.get_or_insert_with(&0, &1, &"a", || 9), 1);
    hand.advance(6 * SECOND);
    assert_eq!(c.purge_expired(), 0);
    assert_eq!(c.group_count(&0), 1);
}

#[test]
fn an_expired_group_never_pushes_out_a_live_one() {
    let (c, hand) = idle(2, 10 * SECOND);
    c.set(&0, &1, &"a", 1); // the oldest group, kept in use
    c.set(&0, &2, &"a", 2); // sits idle
    hand.advance(6 * SECOND);
    assert!(c.get(&0, &1, "a").is_some());
    hand.advance(6 * SECOND);
    // No purge ran: the write that makes group 3 takes the idle group out first.
    c.set(&0, &3, &"a", 3);
    assert_eq!(c.group_count(&0), 2);
    assert_eq!(
        c.get(&0, &1, "a").as_deref(),
        Some(&1),
        "the live oldest group stays"
    );
    assert_eq!(c.get(&0, &3, "a").as_deref(), Some(&3));
    assert!(c.get(&0, &2, "a").is_none());
}

#[test]
fn a_group_made_again_after_it_expired_is_the_youngest() {
    let (c, hand) = live(2, 10 * SECOND);
    c.set(&0, &1, &"a", 1);
    hand.advance(5 * SECOND);
    c.set(&0, &2, &"a", 2);
    hand.advance(5 * SECOND);
    // Group 1 expired; made again, it is younger than group 2.
    c.set(&0, &1, &"a", 3);
    c.set(&0, &3, &"a", 4);
    assert_eq!(c.group_count(&0), 2);
    assert!(c.get(&0, &2, "a").is_none(), "group 2 was the oldest");
    assert_eq!(c.get(&0, &1, "a").as_deref(), Some(&3));
    assert_eq!(c.get(&0, &3, "a").as_deref(), Some(&4));
}

#[test]
fn owners_and_expiry_uncount_each_value_once() {
    let (c, hand) = live(0, 10 * SECOND);
    c.owner(OwnerId(1)).set(&0, &1, &"a", 1);
    hand.advance(5 * SECOND);
    c.owner(OwnerId(2)).set(&0, &1, &"b", 2);
    hand.advance(5 * SECOND);
    // Owner 1's value expired; clearing owner 1 after it must not uncount it again.
    c.purge_expired();
    c.clear_owner(OwnerId(1));
    assert_eq!((c.len(), c.group_count(&0)), (1, 1));
    assert_eq!(c.get(&0, &1, "b").as_deref(), Some(&2));
    // And the other way round: cleared before its purge, a value expired meanwhile.
    c.owner(OwnerId(3)).set(&0, &1, &"c", 3);
    hand.advance(5 * SECOND);
    c.clear_owner(OwnerId(2)); // expired at this instant: taken out as expired
    assert_eq!(c.get(&0, &1, "c").as_deref(), Some(&3));
    c.purge_expired();
    assert_eq!(
        (c.len(), c.group_count(&0)),
        (1, 1),
        "owner 3's value holds the group"
    );
    c.clear_owner(OwnerId(3));
    c.purge_expired();
    assert_eq!((c.len(), c.group_count(&0)), (0, 0));
}

#[test]
fn a_zero_time_expires_every_value_at_once() {
    let (c, _hand) = live(1, Duration::ZERO);
    assert_eq!(
        *c.get_or_insert_with(&0, &1, &"a", || 7),
        7,
        "the caller gets it"
    );
    assert!(c.get(&0, &1, "a").is_none());
    c.set(&0, &2, &"a", 8);
    assert!(c.get(&0, &2, "a").is_none());
    c.purge_expired();
    assert_eq!((c.len(), c.group_count(&0)), (0, 0));
}

#[test]
fn a_time_past_the_clock_never_expires() {
    let (c, hand) = idle(0, Duration::MAX);
    c.set(&0, &1, &"a", 1);
    hand.advance(Duration::from_secs(100 * 365 * 24 * 3600));
    assert_eq!(c.purge_expired(), 0);
    assert_eq!(c.get(&0, &1, "a").as_deref(), Some(&1));
}

#[test]
fn both_rules_are_a_typed_error() {
    let both = Blobs::builder(0)
        .time_to_live(SECOND)
        .time_to_idle(SECOND)
        .build();
    assert!(matches!(both, Err(ConfigError::Expiry { .. })));
    let message = both.unwrap_err().to_string();
    assert!(
        message.contains("time_to_live") && message.contains("time_to_idle"),
        "{message}"
    );
}

#[test]
fn a_cache_without_expiry_purges_nothing() {
    let c = Blobs::new(0);
    c.set(&0, &1, &"a", 1);
    assert_eq!(c.purge_expired(), 0);
    assert_eq!(c.group_count(&0), 1);
}

#[test]
fn ten_thousand_idle_groups_leave_nothing_counted() {
    let (c, hand) = idle(4, 10 * SECOND);
    for session in 0..2_500u32 {
        for group in 0..4 {
            c.set(&session, &group, &"w", u64::from(group));
        }
    }
    hand.advance(10 * SECOND);
    assert_eq!(c.purge_expired(), 10_000);
    assert!(c.is_empty());
    assert!((0..2_500).all(|s| c.group_count(&s) == 0));
    // The sessions take new groups up to their capacity again, with nothing evicted.
    for session in 0..2_500u32 {
        for group in 10..14 {
            c.set(&session, &group, &"w", 0);
        }
    }
    assert_eq!(c.len(), 10_000);
    assert!((0..2_500).all(|s| c.group_count(&s) == 4));
}

#[test]
fn an_async_build_after_expiry_builds_anew_into_a_live_group() {
    let (c, hand) = idle(1, 10 * SECOND);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let first = c.get_or_insert_with_async(&0, &1, &"a", async { 1 }).await;
        assert_eq!(*first.unwrap(), 1);
        hand.advance(10 * SECOND);
        let again = c.get_or_insert_with_async(&0, &1, &"a", async { 2 }).await;
        assert_eq!(*again.unwrap(), 2, "built anew");
        let hit = c.get_or_insert_with_async(&0, &1, &"a", async { 3 }).await;
        assert_eq!(*hit.unwrap(), 2);
    });
    assert_eq!((c.len(), c.group_count(&0)), (1, 1));
}
