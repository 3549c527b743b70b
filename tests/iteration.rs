//! Iteration and `retain`: every entry cached throughout seen once, racing migrations and
//! writers.

mod common;

use common::with_caches;
use runcache::Cache;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::thread;

#[test]
fn iteration_yields_every_cached_entry_once_and_skips_the_rest() {
    with_caches::<u64, u64>(10_000, |c| {
        for i in 0..3_000 {
            c.insert(i, i * 3).unwrap();
        }
        for i in (0..3_000).step_by(3) {
            c.remove(&i);
        }
        for i in (1..3_000).step_by(3) {
            c.insert(i, i).unwrap();
        }
        // A failed build leaves nothing to yield.
        assert!(c
            .try_get_or_insert_with(9_999, || Err::<u64, ()>(()))
            .is_err());
        let before = c.stats();
        let pinned = c.pin();
        let mut seen: Vec<(u64, u64)> = pinned.iter().map(|(k, v)| (*k, *v)).collect();
        drop(pinned);
        seen.sort_unstable();
        let expected: Vec<(u64, u64)> = (0..3_000)
            .filter(|i| i % 3 != 0)
            .map(|i| (i, if i % 3 == 1 { i } else { i * 3 }))
            .collect();
        assert_eq!(seen, expected);
        // Iterating is not a lookup.
        assert_eq!(c.stats(), before);
    });
}

#[test]
fn an_entry_being_built_is_not_yielded() {
    let c = Arc::new(Cache::<u32, u32>::new(10));
    c.insert(1, 1).unwrap();
    let (started, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let builder = {
        let (c, started, release) = (c.clone(), started.clone(), release.clone());
        thread::spawn(move || {
            c.get_or_insert_with(2, || {
                started.wait();
                release.wait();
                2
            })
        })
    };
    started.wait();
    let keys: Vec<u32> = c.pin().iter().map(|(k, _)| *k).collect();
    release.wait();
    assert_eq!(*builder.join().unwrap(), 2);
    assert_eq!(keys, [1]);
    assert_eq!(c.pin().iter().count(), 2);
}

/// A writer keeps the tables migrating (new keys, each removed `WINDOW` keys later, never
/// inserted again) and another replaces the stable keys' values, while this thread iterates.
/// Each iteration must yield every key cached throughout it exactly once, with its value:
/// the stable keys, and the writer's keys inserted before the iteration began and not yet
/// removed when it ended, some of them inserted while a migration was in flight (so living
/// only in the migration's new table). No key may come twice. Under `--cfg runcache_stress`
/// the tables start at four slots and migrate two slots per write, so most iterations begin
/// during a migration.
#[test]
fn iteration_racing_migrations_yields_each_key_cached_throughout_once() {
    const STABLE: u64 = 1_000;
    const WINDOW: u64 = 4_000;
    // At least this many iterations, and on until the tables migrated under one (a release
    // build's writers take longer than 200 iterations to fill the presized tables), but
    // never more than `MAX_ROUNDS`.
    const ROUNDS: usize = 200;
    const MAX_ROUNDS: usize = 20_000;
    let c = two_shards_holding(STABLE, |k| k + 1);
    // Keys `STABLE + i` for `i < progress` have been inserted; those with `i + WINDOW <
    // progress` may have been removed since.
    let progress = std::sync::atomic::AtomicU64::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    let start = c.__migrations();
    let checked = thread::scope(|s| {
        let (c, progress, done) = (&c, &progress, &done);
        s.spawn(move || {
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                c.insert(STABLE + i, i).unwrap();
                // Release: pairs with the Acquire loads below; the insert happened before.
                progress.store(i + 1, Ordering::Release);
                if i >= WINDOW {
                    c.remove(&(STABLE + i - WINDOW));
                }
                i += 1;
            }
        });
        s.spawn(move || {
            let mut k = 0;
            while !done.load(Ordering::Relaxed) {
                c.insert(k, k + 1).unwrap();
                k = (k + 7) % STABLE;
            }
        });
        // Stops the writers however this thread leaves the scope (a failed assertion too:
        // the scope waits for them before it passes the panic on).
        let _stop = Stop(done);
        let mut checked = 0;
        for round in 0..MAX_ROUNDS {
            if round >= ROUNDS && c.__migrations() > start {
                break;
            }
            let before = progress.load(Ordering::Acquire);
            let pinned = c.pin();
            let mut seen = std::collections::HashSet::new();
            for (k, v) in pinned.iter() {
                let expected = if *k < STABLE { k + 1 } else { k - STABLE };
                assert_eq!(*v, expected, "key {k}");
                assert!(seen.insert(*k), "key {k} yielded twice");
            }
            drop(pinned);
            let after = progress.load(Ordering::Acquire);
            let throughout = after.saturating_sub(WINDOW)..before;
            checked += throughout.end.saturating_sub(throughout.start);
            let missed: Vec<u64> = (0..STABLE)
                .chain(throughout.map(|i| STABLE + i))
                .filter(|k| !seen.contains(k))
                .collect();
            assert!(
                missed.is_empty(),
                "cached throughout, not yielded: {missed:?}"
            );
        }
        checked
    });
    let migrated = c.__migrations() - start;
    assert!(migrated > 0, "no migration in {MAX_ROUNDS} iterations");
    assert!(
        checked > 0,
        "the writer's window never spanned an iteration"
    );
    c.__validate().unwrap();
}

#[test]
fn retain_removes_what_the_predicate_refuses_and_reports_it() {
    use runcache::RemovalCause;
    use std::sync::Mutex;
    let heard: Arc<Mutex<Vec<(u32, RemovalCause)>>> = Arc::default();
    let log = heard.clone();
    let c = Cache::<u32, u32>::builder()
        .capacity(1_000)
        .weigher(|_, v| u64::from(*v % 5 + 1))
        .on_evict(move |k, _, cause| log.lock().unwrap().push((*k, cause)))
        .build()
        .unwrap();
    for i in 0..300 {
        c.insert(i, i).unwrap();
    }
    let held = c.get(&7).unwrap();
    let mut asked = 0;
    assert_eq!(
        c.retain(|k, v| {
            asked += 1;
            assert_eq!(k, v);
            k % 4 != 3
        }),
        75
    );
    assert_eq!(asked, 300);
    assert_eq!(c.len(), 225);
    let weight: u64 = (0..300u32)
        .filter(|k| k % 4 != 3)
        .map(|k| u64::from(k % 5 + 1))
        .sum();
    assert_eq!(c.weighted_size(), weight);
    assert!((0..300).all(|k| c.contains_key(&k) == (k % 4 != 3)));
    assert_eq!(c.stats().removals, 75);
    // A removed value lives on while a caller holds it.
    assert_eq!(*held, 7);
    let mut heard = heard.lock().unwrap().clone();
    heard.sort_unstable_by_key(|e| e.0);
    let expected: Vec<_> = (0..300)
        .filter(|k| k % 4 == 3)
        .map(|k| (k, RemovalCause::Removed))
        .collect();
    assert_eq!(heard, expected);
    // Nothing refused: nothing removed.
    assert_eq!(c.retain(|_, _| true), 0);
    c.__validate().unwrap();
}

#[test]
fn retain_racing_writers_removes_every_refused_stable_entry() {
    const STABLE: u64 = 3_000;
    let c = two_shards_holding(STABLE, |k| k);
    let done = std::sync::atomic::AtomicBool::new(false);
    let removed = thread::scope(|s| {
        let (c2, done2) = (&c, &done);
        s.spawn(move || {
            let mut k = STABLE;
            while !done2.load(Ordering::Relaxed) {
                c2.insert(k, k).unwrap();
                if k >= STABLE + 300 {
                    c2.remove(&(k - 300));
                }
                k += 1;
            }
        });
        let _stop = Stop(&done);
        c.retain(|k, _| *k >= STABLE || k % 2 == 0)
    });
    assert_eq!(removed, (STABLE / 2) as usize);
    assert!((0..STABLE).all(|k| c.contains_key(&k) == (k % 2 == 0)));
    c.__validate().unwrap();
}

/// A two-shard cache with room for a million entries, holding keys `0..n` with `value(key)`.
fn two_shards_holding(n: u64, value: impl Fn(u64) -> u64) -> Cache<u64, u64> {
    let c = Cache::<u64, u64>::builder()
        .capacity(1 << 20)
        .shards(2)
        .build()
        .unwrap();
    for k in 0..n {
        c.insert(k, value(k)).unwrap();
    }
    c
}

/// Sets its flag when dropped: stops a test's writer threads even when the test fails.
struct Stop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
