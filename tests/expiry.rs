//! Expiry: time to live, time to idle and per-entry policies, read against a manual clock
//! (no test sleeps). An expired entry is never returned; it leaves as `Expired`, its weight
//! back to the budget, when writes or `purge_expired` reach it.

mod common;

use common::{on_threads, silence_planned_panics, PLANNED};
use runcache::{Cache, Clock, ConfigError, Expiry, ManualClock, RemovalCause};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SEC: Duration = Duration::from_secs(1);

/// The causes a cache's listener heard, in order.
type Heard = Arc<Mutex<Vec<(u32, RemovalCause)>>>;

fn ttl(live: Duration, capacity: u64) -> (Cache<u32, u32>, ManualClock, Heard) {
    let (clock, hand) = Clock::manual();
    let heard: Heard = Arc::default();
    let sink = Arc::clone(&heard);
    let cache = Cache::builder()
        .capacity(capacity)
        .time_to_live(live)
        .clock(clock)
        .on_evict(move |k, _, cause| sink.lock().unwrap().push((*k, cause)))
        .build()
        .unwrap();
    (cache, hand, heard)
}

/// A cache of `capacity` entries with a time to idle, on a manual clock.
fn tti(idle: Duration, capacity: u64) -> (Cache<u32, u32>, ManualClock) {
    let (clock, hand) = Clock::manual();
    let cache = Cache::builder()
        .capacity(capacity)
        .time_to_idle(idle)
        .clock(clock)
        .build()
        .unwrap();
    (cache, hand)
}

#[test]
fn an_entry_lives_until_its_deadline_and_is_never_returned_after() {
    let (cache, hand, heard) = ttl(10 * SEC, 100);
    cache.put(1, 1).unwrap();
    hand.advance(10 * SEC - Duration::from_nanos(1));
    assert_eq!(cache.get_cloned(&1), Some(1));
    assert!(cache.contains_key(&1));
    hand.advance(Duration::from_nanos(1));
    // Not yet taken out, but never returned: every read path misses it.
    assert_eq!(cache.get_cloned(&1), None);
    assert!(!cache.contains_key(&1));
    assert_eq!(cache.pin().iter().count(), 0);
    assert!(cache.remove(&1).is_none(), "nothing live to remove");
    assert_eq!(*heard.lock().unwrap(), [(1, RemovalCause::Expired)]);
    assert_eq!((cache.len(), cache.weighted_size()), (0, 0));
    assert_eq!(cache.stats().expirations, 1);
    cache.__validate().unwrap();
}

#[test]
fn get_or_insert_with_builds_an_expired_key_again_once_under_contention() {
    let (clock, hand) = Clock::manual();
    let cache = Arc::new(
        Cache::<u32, usize>::builder()
            .capacity(100)
            .time_to_live(SEC)
            .clock(clock)
            .build()
            .unwrap(),
    );
    let builds = Arc::new(AtomicUsize::new(0));
    for round in 1..=3 {
        let (c, b) = (Arc::clone(&cache), Arc::clone(&builds));
        on_threads(8, move |_| {
            for _ in 0..200 {
                let v = c.get_or_insert_with(7, || b.fetch_add(1, Ordering::SeqCst) + 1);
                assert_eq!(*v, round, "a value from this round's one build");
            }
        });
        assert_eq!(builds.load(Ordering::SeqCst), round);
        hand.advance(SEC);
    }
    assert_eq!(cache.stats().expirations, 2, "two rounds' values expired");
    cache.__validate().unwrap();
}

#[test]
fn an_async_build_replaces_an_expired_value() {
    let (clock, hand) = Clock::manual();
    let cache = Cache::<u32, u32>::builder()
        .capacity(10)
        .time_to_live(SEC)
        .clock(clock)
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let v = cache
            .get_or_insert_with_async(1, async { 1 })
            .await
            .unwrap();
        assert_eq!(*v, 1);
        hand.advance(SEC);
        let v = cache
            .get_or_insert_with_async(1, async { 2 })
            .await
            .unwrap();
        assert_eq!(*v, 2);
    });
    assert_eq!(cache.stats().expirations, 1);
}

#[test]
fn time_to_idle_moves_on_with_each_read_but_not_with_a_peek() {
    let (cache, hand) = tti(10 * SEC, 10);
    cache.put(1, 1).unwrap();
    cache.put(2, 2).unwrap();
    for round in 0..5 {
        hand.advance(9 * SEC);
        assert!(cache.get(&1).is_some(), "read within its idle time");
        // A peek finds it within its first ten seconds, but does not move it on.
        assert_eq!(cache.contains_key(&2), round == 0);
    }
    hand.advance(10 * SEC);
    assert!(cache.get(&1).is_none());
}

#[test]
fn an_insert_over_an_expired_entry_is_a_fresh_insert() {
    let (cache, hand, heard) = ttl(SEC, 10);
    cache.put(1, 1).unwrap();
    hand.advance(SEC);
    assert!(
        cache.insert(1, 2).unwrap().is_none(),
        "nothing live was replaced"
    );
    assert_eq!(*heard.lock().unwrap(), [(1, RemovalCause::Expired)]);
    assert_eq!(cache.get_cloned(&1), Some(2));
    // A replacement starts the time to live anew.
    hand.advance(SEC / 2);
    assert!(cache.insert(1, 3).unwrap().is_some());
    hand.advance(SEC * 3 / 4);
    assert_eq!(cache.get_cloned(&1), Some(3));
    assert_eq!(cache.weighted_size(), 1);
}

/// A policy by the value: `v` seconds to live; reads of odd values give them `v` more;
/// an update keeps the old deadline unless the value is 0.
struct ByValue;

impl Expiry<u32, u32> for ByValue {
    fn after_create(&self, _: &u32, v: &u32) -> Option<Duration> {
        (*v != u32::MAX).then(|| SEC * *v)
    }
    fn after_read(&self, _: &u32, v: &u32, left: Option<Duration>) -> Option<Duration> {
        assert_eq!(
            left.is_none(),
            *v == u32::MAX,
            "only the entry that never expires"
        );
        (v % 2 == 1).then(|| SEC * *v)
    }
    fn after_update(&self, _: &u32, v: &u32, _: Option<Duration>) -> Option<Duration> {
        (*v == 0).then_some(Duration::ZERO)
    }
}

#[test]
fn a_policy_sets_each_deadline_on_create_read_and_update() {
    let (clock, hand) = Clock::manual();
    let cache = Cache::builder()
        .capacity(10)
        .expire_after(ByValue)
        .clock(clock)
        .build()
        .unwrap();
    cache.put(1, 2).unwrap(); // 2 s, reads do not move it
    cache.put(2, 3).unwrap(); // 3 s, each read gives 3 more
    cache.put(3, u32::MAX).unwrap(); // never
    hand.advance(SEC * 3 / 2);
    assert!(cache.get(&1).is_some());
    assert!(cache.get(&2).is_some());
    hand.advance(SEC);
    assert!(cache.get(&1).is_none(), "2 s after its creation");
    assert!(cache.get(&2).is_some(), "read at 1.5 s: due at 4.5 s");
    cache.insert(2, 5).unwrap(); // an update that keeps the deadline (5.5 s now)
    hand.advance(3 * SEC);
    assert!(cache.get(&2).is_none());
    cache.put(4, 9).unwrap();
    cache.insert(4, 0).unwrap(); // an update to zero: expires at once
    assert!(cache.get(&4).is_none());
    hand.advance(Duration::MAX);
    assert_eq!(
        cache.get_cloned(&3),
        Some(u32::MAX),
        "never, even at the clock's end"
    );
}

#[test]
fn a_zero_duration_expires_every_entry_as_it_is_cached() {
    let (cache, _hand, heard) = ttl(Duration::ZERO, 10);
    let v = cache.get_or_insert_with(1, || 10);
    assert_eq!(*v, 10, "the caller gets its value");
    assert!(cache.get(&1).is_none());
    cache.put(2, 20).unwrap();
    assert_eq!(
        cache.weighted_size(),
        0,
        "taken out by the write's own step"
    );
    assert_eq!(
        *heard.lock().unwrap(),
        [(1, RemovalCause::Expired), (2, RemovalCause::Expired)]
    );
}

#[test]
fn duration_max_never_expires() {
    let (cache, hand, _) = ttl(Duration::MAX, 10);
    cache.put(1, 1).unwrap();
    hand.advance(Duration::MAX);
    assert_eq!(cache.get_cloned(&1), Some(1));
    assert_eq!(cache.purge_expired(), 0);
}

#[test]
fn two_rules_are_refused_with_both_names() {
    let err = Cache::<u32, u32>::builder()
        .time_to_live(SEC)
        .time_to_idle(2 * SEC)
        .build()
        .unwrap_err();
    assert!(matches!(
        err,
        ConfigError::Expiry {
            first: "time_to_live",
            second: "time_to_idle"
        }
    ));
    assert!(err
        .to_string()
        .contains("`time_to_live` and `time_to_idle`"));
    let err = Cache::<u32, u32>::builder()
        .expire_after(ByValue)
        .time_to_live(SEC)
        .build()
        .unwrap_err();
    assert!(err
        .to_string()
        .contains("`expire_after` and `time_to_live`"));
}

/// A policy that panics on the entries whose value is 13, at whichever step it is asked.
struct Unlucky;

impl Expiry<u32, u32> for Unlucky {
    fn after_create(&self, _: &u32, v: &u32) -> Option<Duration> {
        if *v == 13 {
            std::panic::panic_any(PLANNED);
        }
        Some(SEC)
    }
    fn after_read(&self, k: &u32, _: &u32, _: Option<Duration>) -> Option<Duration> {
        if *k == 13 {
            std::panic::panic_any(PLANNED);
        }
        None
    }
}

#[test]
fn a_panicking_policy_loses_no_entry_and_leaks_no_weight() {
    silence_planned_panics();
    let (clock, _hand) = Clock::manual();
    let cache = Cache::builder()
        .capacity(10)
        .expire_after(Unlucky)
        .clock(clock)
        .build()
        .unwrap();
    // On create, by insert and by a build: nothing cached, nothing reserved.
    assert!(catch_unwind(AssertUnwindSafe(|| cache.put(1, 13))).is_err());
    assert!(catch_unwind(AssertUnwindSafe(|| cache.get_or_insert_with(2, || 13))).is_err());
    assert_eq!((cache.len(), cache.weighted_size()), (0, 0));
    // The build is not stranded: the next caller builds.
    assert_eq!(*cache.get_or_insert_with(2, || 2), 2);
    // On read: the caller unwinds, the entry stays as it was.
    cache.put(13, 1).unwrap();
    assert!(catch_unwind(AssertUnwindSafe(|| cache.get(&13))).is_err());
    assert!(cache.contains_key(&13));
    assert_eq!(cache.weighted_size(), 2);
    cache.__validate().unwrap();
}

#[test]
fn writes_take_expired_entries_out_a_little_at_a_time() {
    let (cache, hand, _) = ttl(SEC, 100_000);
    for i in 0..10_000 {
        cache.put(i, i).unwrap();
    }
    hand.advance(SEC);
    // Each write steps the wheel: a bounded share of the expired entries per write.
    let mut writes = 0;
    while cache.stats().expirations < 10_000 {
        cache.put(1_000_000 + writes, 0).unwrap();
        writes += 1;
        assert!(
            writes <= 100,
            "10,000 expired entries, still there after 100 writes"
        );
    }
    assert!(writes > 1, "one write did not take out all of them");
    assert_eq!(cache.len(), writes as usize);
}

/// Entries with deadlines spread over ten seconds, the clock moved a millisecond at a time:
/// each leaves within a tick of its deadline, and each step's work is the entries that
/// expire in it (the listener hears no more than those).
#[test]
fn spread_deadlines_leave_within_a_tick_with_work_bound_by_what_expires() {
    // A million locally (`RUNCACHE_EXPIRY_ENTRIES=1000000`, release: about a second).
    let n: u32 = std::env::var("RUNCACHE_EXPIRY_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    const STEP: Duration = Duration::from_millis(1);
    let (clock, hand) = Clock::manual();
    let late = Arc::new(AtomicUsize::new(0));
    let hand2 = hand.clone();
    let late2 = Arc::clone(&late);
    struct Spread;
    impl Expiry<u32, u32> for Spread {
        fn after_create(&self, _: &u32, v: &u32) -> Option<Duration> {
            Some(Duration::from_micros(u64::from(*v)))
        }
    }
    let cache = Cache::builder()
        .capacity(u64::from(n))
        .expire_after(Spread)
        .clock(clock)
        .on_evict(move |_, v, cause| {
            assert_eq!(cause, RemovalCause::Expired);
            let deadline = Duration::from_micros(u64::from(**v));
            // One tick of the wheel (about a millisecond) and one step of the test's clock.
            if hand2.elapsed() > deadline + 2 * STEP + Duration::from_micros(100) {
                late2.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build()
        .unwrap();
    let mut next = common::xorshift(5);
    for i in 0..n {
        // Deadlines up to ten seconds.
        cache.put(i, (next() % 10_000_000) as u32).unwrap();
    }
    let mut out = 0;
    while hand.elapsed() < Duration::from_secs(11) {
        hand.advance(STEP);
        out += cache.purge_expired();
    }
    assert_eq!(out, n as usize);
    assert_eq!(late.load(Ordering::Relaxed), 0, "entries that left late");
    assert_eq!((cache.len(), cache.weighted_size()), (0, 0));
}

#[test]
fn capacity_changes_while_entries_expire_keep_the_budget_exact() {
    let (cache, hand, heard) = ttl(SEC, 1_000);
    for i in 0..1_000 {
        cache.put(i, i).unwrap();
        if i % 100 == 99 {
            hand.advance(SEC / 10);
        }
    }
    // Half of them have expired: the shrink evicts in policy order, the wheel takes the
    // expired ones, and every value leaves once.
    cache.set_capacity(300).unwrap();
    assert!(cache.weighted_size() <= 300);
    cache.purge_expired();
    hand.advance(SEC);
    cache.purge_expired();
    assert_eq!((cache.len(), cache.weighted_size()), (0, 0));
    let heard = heard.lock().unwrap();
    let mut keys: Vec<u32> = heard.iter().map(|(k, _)| *k).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 1_000, "each value heard once");
    assert_eq!(heard.len(), 1_000);
    cache.__validate().unwrap();
}

#[test]
fn an_expired_value_a_caller_holds_stays_alive() {
    let (cache, hand, _) = ttl(SEC, 10);
    let held = cache.get_or_insert_with(1, || 5);
    hand.advance(SEC);
    assert_eq!(cache.purge_expired(), 1);
    assert_eq!(*held, 5);
}

#[test]
fn insert_expiring_gives_one_entry_its_own_deadline() {
    let (cache, hand, heard) = ttl(60 * SEC, 10);
    assert!(cache.insert_expiring(1, 1, 5 * SEC).unwrap().is_none());
    cache.put(2, 2).unwrap();
    // A replacement by `insert_expiring` restarts the entry with its own time.
    cache.put(3, 3).unwrap();
    hand.advance(4 * SEC);
    let old = cache
        .insert_expiring(3, 30, 2 * SEC)
        .unwrap()
        .expect("the replaced value");
    assert_eq!(*old, 3);
    hand.advance(SEC);
    assert_eq!(cache.get_cloned(&1), None, "5 s, its own");
    assert_eq!(cache.get_cloned(&3), Some(30), "1 s into its 2 s");
    hand.advance(SEC);
    assert_eq!(cache.get_cloned(&3), None);
    assert_eq!(cache.get_cloned(&2), Some(2), "the cache's 60 s");
    assert_eq!(cache.purge_expired(), 2);
    let mut causes = heard.lock().unwrap().clone();
    // One purge takes them out in the wheel's order, not the deadlines'.
    causes[1..].sort_unstable_by_key(|(k, _)| *k);
    assert_eq!(
        causes,
        [
            (3, RemovalCause::Replaced),
            (1, RemovalCause::Expired),
            (3, RemovalCause::Expired)
        ]
    );
    // A plain insert over an entry with its own deadline gives it the rule's.
    cache.insert_expiring(4, 4, SEC).unwrap();
    cache.put(4, 40).unwrap();
    hand.advance(59 * SEC);
    assert_eq!(cache.get_cloned(&4), Some(40));
    // Zero expires at once (the caller's call still succeeds); `Duration::MAX` never.
    cache.insert_expiring(5, 5, Duration::ZERO).unwrap();
    cache.insert_expiring(6, 6, Duration::MAX).unwrap();
    assert_eq!(cache.get_cloned(&5), None);
    hand.advance(Duration::MAX);
    assert_eq!(cache.get_cloned(&6), Some(6));
    cache.purge_expired();
    assert_eq!((cache.len(), cache.weighted_size()), (1, 1));
    cache.__validate().unwrap();
}

#[test]
fn insert_expiring_in_an_idle_cache_follows_the_idle_time_after_a_read() {
    let (cache, hand) = tti(10 * SEC, 10);
    cache.insert_expiring(1, 1, 2 * SEC).unwrap();
    cache.insert_expiring(2, 2, 2 * SEC).unwrap();
    hand.advance(SEC);
    assert!(
        cache.get(&1).is_some(),
        "the read moves its deadline to 10 s from now"
    );
    hand.advance(5 * SEC);
    assert_eq!(cache.get_cloned(&1), Some(1));
    assert_eq!(cache.get_cloned(&2), None, "unread: its own 2 s");
}

#[test]
fn insert_expiring_without_an_expiry_rule_hands_the_entry_back() {
    let cache = Cache::<u32, String>::builder()
        .capacity(100)
        .weigher(|_, v: &String| v.len() as u64)
        .build()
        .unwrap();
    cache.put(1, "one".into()).unwrap();
    let err = cache.insert_expiring(1, "uno".into(), SEC).unwrap_err();
    assert!(err.no_expiry && !err.turned_away);
    assert_eq!((err.weight, err.capacity), (3, 100));
    assert!(err.to_string().contains("without an expiry rule"), "{err}");
    assert_eq!(err.into_inner(), (1, "uno".to_string()));
    // Nothing changed: the old value stays, and no rejection is counted.
    assert_eq!(cache.get_cloned(&1).as_deref(), Some("one"));
    assert_eq!((cache.len(), cache.weighted_size()), (1, 3));
    assert_eq!(cache.stats().rejections, 0);
}

/// A write that finds no room takes expired entries out first: a full rejecting cache whose
/// entries expired accepts a newcomer, and a full evicting one hands the room of expired
/// entries over before it evicts anything live.
#[test]
fn room_held_by_expired_entries_is_given_before_anything_live() {
    let (clock, hand) = Clock::manual();
    let heard: Heard = Arc::default();
    let sink = Arc::clone(&heard);
    let rejecting = Cache::<u32, u32>::builder()
        .capacity(8)
        .when_full(runcache::WhenFull::Reject)
        .time_to_live(SEC)
        .clock(clock.clone())
        .on_evict(move |k, _, cause| sink.lock().unwrap().push((*k, cause)))
        .build()
        .unwrap();
    for k in 0..8 {
        rejecting.put(k, k).unwrap();
    }
    assert!(rejecting.put(100, 0).is_err(), "full, nothing expired yet");
    hand.advance(2 * SEC);
    rejecting
        .put(100, 0)
        .expect("the expired entries make room");
    assert!(heard
        .lock()
        .unwrap()
        .iter()
        .all(|(_, c)| *c == RemovalCause::Expired));
    assert_eq!(
        rejecting.weighted_size(),
        1 + (8 - heard.lock().unwrap().len() as u64)
    );
    rejecting.__validate().unwrap();

    let (cache, hand, heard) = ttl(10 * SEC, 8);
    for k in 0..4 {
        cache.put(k, k).unwrap();
    }
    hand.advance(5 * SEC);
    for k in 4..8 {
        cache.put(k, k).unwrap();
    }
    hand.advance(5 * SEC + SEC / 2);
    // 0..4 are past their deadline, 4..8 are not: four newcomers take the old ones' room.
    for k in 8..12 {
        cache.put(k, k).unwrap();
    }
    let heard = heard.lock().unwrap().clone();
    assert_eq!(heard.len(), 4, "{heard:?}");
    assert!(
        heard
            .iter()
            .all(|&(k, c)| k < 4 && c == RemovalCause::Expired),
        "{heard:?}"
    );
    assert!((4..12).all(|k| cache.contains_key(&k)));
    cache.__validate().unwrap();
}

/// A key that counts how many of its kind are alive (the wheel holds nodes, and a node its
/// key).
struct Counted(u32, Arc<AtomicUsize>);

impl Counted {
    fn new(k: u32, alive: &Arc<AtomicUsize>) -> Self {
        alive.fetch_add(1, Ordering::Relaxed);
        Self(k, Arc::clone(alive))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_sub(1, Ordering::Relaxed);
    }
}

impl PartialEq for Counted {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for Counted {}

impl std::hash::Hash for Counted {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.hash(h);
    }
}

/// Entries evicted long before their deadline leave the wheel too: under churn with a time
/// to live of an hour, what the cache keeps alive stays bound by its live entries, not by
/// every entry it ever cached (which it was: the wheel drained its inbox only when a
/// deadline came due).
#[test]
fn entries_evicted_before_their_deadline_are_not_kept_by_the_wheel() {
    const CAPACITY: u64 = 1_000;
    let alive = Arc::new(AtomicUsize::new(0));
    let (clock, _hand) = Clock::manual();
    let cache = Cache::<Counted, u32>::builder()
        .capacity(CAPACITY)
        .time_to_live(3_600 * SEC)
        .clock(clock)
        .build()
        .unwrap();
    for k in 0..100_000 {
        cache.put(Counted::new(k, &alive), k).unwrap();
        if k % 10_000 == 0 {
            // Replacements too: the replaced node leaves as an evicted one does.
            cache.put(Counted::new(k, &alive), k + 1).unwrap();
        }
    }
    cache.reclaim();
    let kept = alive.load(Ordering::Relaxed);
    // The live entries and what the epoch has yet to free: the wheel's records own no node
    // (X4), so no key waits for a sweep of the wheel.
    assert!(
        kept <= CAPACITY as usize + 256,
        "{kept} keys alive for {} entries",
        cache.len()
    );
    drop(cache);
    assert_eq!(
        alive.load(Ordering::Relaxed),
        0,
        "every key dropped with the cache"
    );
}

/// Waits, yielding, until `done` holds; fails after ten seconds (a stalled clock, not a
/// slow one: the wait is for a millisecond's tick).
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < 10 * SEC,
            "{what}: still not after ten seconds"
        );
        std::thread::yield_now();
    }
}

/// A ticking clock moves on by itself, and starts again after every ticking clock dropped.
#[test]
fn a_ticking_clock_moves_on_and_starts_again_after_its_last_drop() {
    for round in 0..2 {
        let cache = Cache::<u32, u32>::builder()
            .capacity(10)
            .time_to_live(Duration::from_millis(2))
            .clock(Clock::ticking().expect("a thread for the clock"))
            .build()
            .unwrap();
        let twin = Cache::<u32, u32>::builder()
            .time_to_live(Duration::from_secs(3_600))
            .clock(Clock::ticking().unwrap())
            .build()
            .unwrap();
        cache.put(round, round).unwrap();
        twin.put(round, round).unwrap();
        wait_until("an entry of 2 ms to expire", || cache.get(&round).is_none());
        assert_eq!(
            twin.get_cloned(&round),
            Some(round),
            "an hour has not passed"
        );
        // Taken out once the wheel's tick after the deadline's has come.
        let mut out = 0;
        wait_until("the purge to take it out", || {
            out += cache.purge_expired();
            out == 1
        });
        assert_eq!((cache.len(), twin.len()), (0, 1));
    }
}
