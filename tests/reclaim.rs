//! Value lifetimes and reclamation: every value dropped once, alive while held, freed
//! soon after its last holder lets go, whichever threads retired it.

mod common;

use common::{drops, IdleWorker, Tracked};
use runcache::{Cache, WhenFull};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

#[test]
fn values_put_over_or_invalidated_drop_once_and_live_while_held() {
    let d = drops();
    {
        let c = Cache::<u64, Tracked>::new(10);
        c.put(1, Tracked::new(1, &d)).unwrap();
        let held = c.get(&1).unwrap();
        c.put(1, Tracked::new(2, &d)).unwrap();
        assert!(c.invalidate(&1));
        c.reclaim();
        assert_eq!(held.id, 1);
        assert_eq!(
            d.load(Ordering::SeqCst),
            1,
            "the second value went, the held one stays"
        );
        drop(held);
        c.reclaim();
        assert_eq!(d.load(Ordering::SeqCst), 2);
    }
    assert_eq!(d.load(Ordering::SeqCst), 2);
}

#[test]
fn removed_values_live_while_held_and_drop_exactly_once() {
    let d = drops();
    {
        let c = Cache::<u64, Tracked>::new(10);
        c.insert(1, Tracked::new(1, &d)).unwrap();
        let held = c.get(&1).unwrap();
        c.remove(&1).unwrap();
        c.clear();
        assert_eq!(held.id, 1);
        assert_eq!(d.load(Ordering::SeqCst), 0, "a held value must stay alive");
        drop(held);
    }
    assert_eq!(d.load(Ordering::SeqCst), 1);
}

#[test]
fn reclaim_drops_removed_values_nobody_holds_while_the_cache_lives() {
    let d = drops();
    let c = Cache::<u64, Tracked>::new(100);
    for k in 0..50 {
        c.insert(k, Tracked::new(k, &d)).unwrap();
    }
    let held = c.get(&7).unwrap();
    drop(c.remove(&3));
    c.clear();
    c.reclaim();
    assert_eq!(
        d.load(Ordering::SeqCst),
        49,
        "every removed value but the held one is dropped"
    );
    assert_eq!(held.id, 7);
    drop(held);
    assert_eq!(d.load(Ordering::SeqCst), 50, "the last holder drops it");
    assert!(c.is_empty());
}

#[test]
fn retired_values_reach_the_collector_by_weight() {
    // A thread hands what it removed, replaced or evicted to the collector at once if one
    // value weighs a sixty-fourth of the capacity, else once they weigh that much together
    // and number eight; until then they wait in its batch (or, full batches, on the cache's
    // ready stack). `__handed_over` counts what reached the collector: each removal retires
    // one item (the entry's node and value together), each table a migration replaced one
    // more.
    let d = drops();
    // A cache of `capacity` holding keys `0..held`, of which `0..removed` are then removed.
    let removed_from = |capacity: u64, held: u64, removed: u64| {
        let c = Cache::<u64, Tracked>::new(capacity);
        for k in 0..held {
            c.insert(k, Tracked::new(k, &d)).unwrap();
        }
        for k in 0..removed {
            drop(c.remove(&k));
        }
        c
    };
    // Capacity 64: every removal weighs a sixty-fourth, so it is handed over at once.
    let small = removed_from(64, 1, 1);
    assert!(
        small.__handed_over() >= 1,
        "a heavy removal is handed over at once"
    );

    // Capacity 6,400: a hundred removals make a sixty-fourth.
    let big = removed_from(6_400, 100, 99);
    assert_eq!(big.__handed_over(), 0, "99 light removals wait");
    drop(big.remove(&99));
    assert!(
        big.__handed_over() >= 100,
        "the hundredth removal hands all of them over"
    );

    // A sixty-fourth of 187 is 2: light values go eight at a time, not two.
    let small_light = removed_from(187, 8, 7);
    assert_eq!(small_light.__handed_over(), 0, "seven light removals wait");
    drop(small_light.remove(&7));
    assert!(
        small_light.__handed_over() >= 8,
        "the eighth hands all of them over"
    );

    // Evictions follow the same rule: in a full cache of 64, each one weighs a sixty-fourth.
    let full = removed_from(64, 65, 0);
    assert_eq!(full.stats().evictions, 1);
    assert!(
        full.__handed_over() >= 1,
        "a heavy eviction is handed over at once"
    );

    // Whatever waits, another thread's `reclaim` reaches it and frees it.
    let waiting = removed_from(6_400, 50, 40);
    assert_eq!(waiting.__handed_over(), 0);
    let before = d.load(Ordering::SeqCst);
    thread::scope(|s| {
        s.spawn(|| waiting.reclaim());
    });
    assert_eq!(
        d.load(Ordering::SeqCst) - before,
        40,
        "another thread's reclaim frees them"
    );
    drop((small, big, small_light, full, waiting));
    assert_eq!(d.load(Ordering::SeqCst), 1 + 100 + 8 + 65 + 50);
}

#[test]
fn dropping_a_cache_drops_what_a_live_idle_worker_removed() {
    // The shape of every runtime: a long-lived worker removes entries, lets go of the cache
    // and waits, alive and idle. Dropping the cache must drop everything, the worker's
    // removals included, before `drop` returns.
    for removals in [5_u64, 40, 100] {
        let d = drops();
        let c = Arc::new(Cache::<u64, Tracked>::new(1 << 20));
        for k in 0..200 {
            c.insert(k, Tracked::new(k, &d)).unwrap();
        }
        let worker = {
            let c = Arc::clone(&c);
            IdleWorker::after(move || {
                for k in 0..removals {
                    drop(c.remove(&k));
                }
                drop(c);
            })
        };
        drop(c);
        assert_eq!(
            d.load(Ordering::SeqCst),
            200,
            "every value drops with the cache, the worker still alive"
        );
        worker.finish();
        assert_eq!(d.load(Ordering::SeqCst), 200, "and none twice");
    }
}

#[test]
fn an_idle_threads_retirements_are_freed_by_other_threads_calls() {
    // A worker removes light values (they wait in its batch), then idles, alive. The main
    // thread's own calls (lookups only) must free them within the documented bound:
    // 384 x (ceil(R / 4) + 1) calls by one other thread (R = 2 registrations here).
    let d = drops();
    let c = Arc::new(Cache::<u64, Tracked>::new(1 << 20));
    for k in 0..100 {
        c.insert(k, Tracked::new(k, &d)).unwrap();
    }
    c.get(&99); // the main thread is registered before the worker
    let worker = {
        let c = Arc::clone(&c);
        IdleWorker::after(move || {
            for k in 0..10 {
                drop(c.remove(&k));
            }
        })
    };
    assert_eq!(
        d.load(Ordering::SeqCst),
        0,
        "light removals wait in the worker's batch"
    );
    const BOUND: usize = 384 * 2;
    let mut calls = 0;
    while d.load(Ordering::SeqCst) < 10 && calls < 100 * BOUND {
        assert!(c.get(&(50 + calls as u64 % 50)).is_some());
        calls += 1;
    }
    assert_eq!(
        d.load(Ordering::SeqCst),
        10,
        "the idle worker's removals are freed"
    );
    assert!(
        calls <= BOUND,
        "freed after {calls} calls, more than the bound {BOUND}"
    );
    worker.finish();
}

#[test]
fn scoped_workers_retirements_are_freed_though_the_scope_ends_first() {
    // A scope returns before its threads' thread-locals are destroyed, so their batches may
    // still be held when it does. `reclaim` reaches them anyway, and dropping the cache
    // frees everything, whether or not those threads finished exiting.
    for round in 0..20 {
        let d = drops();
        let c = Cache::<u64, Tracked>::new(1_000);
        thread::scope(|s| {
            for t in 0..4_u64 {
                let (c, d) = (&c, &d);
                s.spawn(move || {
                    for k in 0..500 {
                        let key = t * 10_000 + k;
                        c.insert(key, Tracked::new(key, d)).unwrap();
                        if k % 2 == 0 {
                            drop(c.remove(&key));
                        }
                    }
                });
            }
        });
        let made = 4 * 500;
        if round % 2 == 0 {
            c.reclaim();
            let live = c.len();
            assert_eq!(
                d.load(Ordering::SeqCst),
                made - live,
                "every value that left the cache is freed by reclaim"
            );
        }
        drop(c);
        assert_eq!(
            d.load(Ordering::SeqCst),
            made,
            "everything drops with the cache"
        );
    }
}

#[test]
fn a_threads_light_retirements_reach_the_collector_when_it_exits() {
    // Light removals wait in the removing thread's batch (under a sixty-fourth of the
    // capacity, fewer than a batch). When the thread exits, its batch goes to the collector
    // with its registration, so another thread's `reclaim` frees every one of them.
    let d = drops();
    let c = Arc::new(Cache::<u64, Tracked>::new(6_400));
    for k in 0..20 {
        c.insert(k, Tracked::new(k, &d)).unwrap();
    }
    // A plain `join`, not a scope: a scope may end before its threads' thread-locals are
    // destroyed, `join` waits for the thread to be gone.
    let worker = Arc::clone(&c);
    thread::spawn(move || {
        for k in 0..10 {
            drop(worker.remove(&k));
        }
    })
    .join()
    .unwrap();
    c.reclaim();
    assert_eq!(
        d.load(Ordering::SeqCst),
        10,
        "the exited thread's removals are freed"
    );
    assert_eq!(c.len(), 10);
    drop(c);
    assert_eq!(d.load(Ordering::SeqCst), 20, "the rest drop with the cache");
}

#[test]
fn reclaim_frees_what_other_threads_retired_while_a_reader_held_the_epoch_back() {
    // A reader pinned on this thread keeps the epoch from advancing, so the worker's retired
    // items pile up in the collector: removed values with their nodes, then uncached values
    // (too heavy to cache), which live in the unlinked build records of their keys. Once the
    // reader and the worker are gone, one `reclaim` must free all of them, however many of
    // the collector's bags they fill.
    const ROUNDS: u64 = 2_000;
    let d = drops();
    let c = Arc::new(
        Cache::<u64, Tracked>::builder()
            .capacity(1_000)
            .weigher(|k, _| if *k < ROUNDS / 2 { 1 } else { 10_000 })
            .when_full(WhenFull::Reject)
            .build()
            .unwrap(),
    );
    let reader = c.pin();
    let worker = {
        let (c, d) = (Arc::clone(&c), Arc::clone(&d));
        thread::spawn(move || {
            for k in 0..ROUNDS {
                let v = c.get_or_insert_with(k, || Tracked::new(k, &d));
                assert_eq!(v.id, k);
                if k < ROUNDS / 2 {
                    drop(c.remove(&k));
                }
            }
        })
    };
    worker.join().unwrap();
    assert!(
        (d.load(Ordering::SeqCst) as u64) < ROUNDS,
        "the pinned reader held the epoch back"
    );
    drop(reader);
    c.reclaim();
    assert_eq!(
        d.load(Ordering::SeqCst) as u64,
        ROUNDS,
        "every value, uncached or removed, is freed by one reclaim"
    );
    assert!(c.is_empty());
}

/// Not under `--cfg runcache_stress`: its tables migrate two slots per write, so a migration
/// may still be under way when the entry is evicted, and a slot that a migration has frozen
/// is left to it (the old table keeps its count of the node until the table itself is
/// retired). With the normal 128-slot chunks, a table this small moves in one step.
#[cfg(not(runcache_stress))]
mod evicted_keys {
    use super::*;

    /// A key that counts its drops.
    struct CountedKey(u64, Arc<AtomicUsize>);

    impl PartialEq for CountedKey {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }

    impl Eq for CountedKey {}

    impl std::hash::Hash for CountedKey {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            self.0.hash(state);
        }
    }

    impl Drop for CountedKey {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn an_evicted_entry_gives_back_its_key_at_once_not_at_the_next_table_growth() {
        let keys = drops();
        let c = Cache::<CountedKey, u64>::builder()
            .capacity(10)
            .shards(1)
            .build()
            .unwrap();
        for k in 0..10 {
            c.insert(CountedKey(k, Arc::clone(&keys)), k).unwrap();
        }
        c.reclaim();
        let (dropped, migrations) = (keys.load(Ordering::SeqCst), c.__migrations());
        // One more key: the cache evicts one entry, in a table with room to spare.
        c.insert(CountedKey(10, Arc::clone(&keys)), 10).unwrap();
        assert_eq!(c.len(), 10);
        assert_eq!(c.__migrations(), migrations, "the table did not grow");
        c.reclaim();
        assert_eq!(
            keys.load(Ordering::SeqCst),
            dropped + 1,
            "the evicted entry's key is dropped once reclaimed"
        );
        drop(c);
        assert_eq!(keys.load(Ordering::SeqCst), 11, "every key dropped once");
    }
}

#[test]
fn dropping_the_cache_drops_every_value_once() {
    let d = drops();
    let n = 10_000;
    {
        let c = Cache::<u64, Tracked>::builder().shards(8).build().unwrap();
        for i in 0..n {
            c.insert(i, Tracked::new(i, &d)).unwrap();
        }
        for i in 0..n / 2 {
            c.insert(i, Tracked::new(i, &d)).unwrap(); // replaced values are garbage
        }
        for i in 0..n / 4 {
            c.remove(&i);
        }
    }
    assert_eq!(d.load(Ordering::SeqCst), (n + n / 2) as usize);
}

#[test]
fn values_used_on_other_threads_drop_once_after_those_threads_exit() {
    let d = drops();
    {
        let c = Arc::new(Cache::<u64, Tracked>::new(1000));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (c, d) = (Arc::clone(&c), Arc::clone(&d));
                thread::spawn(move || {
                    for i in 0..500 {
                        let k = t * 1000 + i;
                        c.insert(k, Tracked::new(k, &d)).unwrap();
                        c.remove(&k);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    assert_eq!(d.load(Ordering::SeqCst), 2000);
}

#[test]
fn a_value_holding_a_cache_can_be_dropped_by_reclamation() {
    // Nested caches: dropping a value that owns a cache runs inside epoch reclamation.
    let outer = Cache::<u32, Cache<u32, u32>>::new(100);
    for i in 0..300 {
        let inner = Cache::new(10);
        inner.insert(i, i).unwrap();
        inner.get(&i).unwrap();
        outer.insert(i % 7, inner).unwrap();
        outer.remove(&(i % 5));
    }
    drop(outer);
}

#[test]
fn a_value_read_on_another_thread_drops_once_when_the_cache_drops() {
    let d = drops();
    let c = Arc::new(Cache::<u32, Tracked>::builder().shards(1).build().unwrap());
    c.insert(1, Tracked::new(1, &d)).unwrap();
    let (c2, d2) = (c.clone(), d.clone());
    let reader = thread::spawn(move || {
        let v = c2.get(&1).expect("inserted before the thread started");
        assert_eq!(d2.load(Ordering::SeqCst), 0, "dropped while held");
        drop(v);
    });
    reader.join().unwrap();
    drop(c.remove(&1));
    drop(c);
    assert_eq!(d.load(Ordering::SeqCst), 1);
}

#[test]
fn a_removed_value_is_destroyed_soon_after_its_last_holder_lets_go() {
    // Removal flushes the thread's epoch bag, so a quiet thread does not keep garbage.
    let d = drops();
    let c = Cache::<u32, Tracked>::new(10);
    c.insert(1, Tracked::new(1, &d)).unwrap();
    drop(c.remove(&1));
    let mut pins = 0;
    while d.load(Ordering::SeqCst) == 0 && pins < 10_000 {
        c.get(&2); // each lookup pins and unpins, which lets the epoch advance
        pins += 1;
    }
    assert_eq!(
        d.load(Ordering::SeqCst),
        1,
        "not reclaimed after {pins} pins"
    );
    assert!(pins < 10_000);
}
