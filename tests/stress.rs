//! Multi-threaded stress: millions of mixed operations with failing and panicking builders.
//! Ignored in the default run; `.ci/run` runs it explicitly (and again under
//! `--cfg runcache_stress`, which starts every shard with a 4-slot table to force migrations).
//!
//! `RUNCACHE_STRESS_OPS` sets the operations per thread (default 400,000).

mod common;

use common::{drops, silence_planned_panics, Tracked, PLANNED};
use runcache::{BuildError, Cache};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::thread;

const THREADS: usize = 4;
/// Threads of the many-thread runs.
const MANY_THREADS: usize = 256;

/// Runs `work(t)` on `threads` scoped threads released together by a barrier; returns
/// what each returned, in thread order.
fn all_at_once<R: Send>(threads: usize, work: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let barrier = Barrier::new(threads);
    thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    work(t)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
const KEYS: u64 = 2048;

fn ops_per_thread() -> usize {
    std::env::var("RUNCACHE_STRESS_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400_000)
}

/// xorshift: a cheap deterministic generator per thread.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
#[ignore = "stress: run explicitly (see .ci/run)"]
fn mixed_operations_leak_nothing_and_account_exactly() {
    mixed_operations(THREADS, ops_per_thread());
}

/// The same operations spread over 256 threads (the same total: `RUNCACHE_STRESS_OPS` × 4),
/// so that many threads at once register with the cache's collector, park on the same
/// loading slots and race the same evictions, on 2 cores as on 200.
#[test]
#[ignore = "stress: run explicitly (see .ci/run)"]
fn hundreds_of_threads_leak_nothing_and_account_exactly() {
    mixed_operations(MANY_THREADS, ops_per_thread() * THREADS / MANY_THREADS);
}

/// `threads` threads × `n` mixed operations on one evicting, weighted cache.
fn mixed_operations(threads: usize, n: usize) {
    let created = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let dropped = drops();
    {
        let cache = Arc::new(
            Cache::<u64, Tracked>::builder()
                .capacity(3000)
                .shards(8)
                .weigher(|_, v| v.id % 4)
                .build()
                .unwrap(),
        );
        let barrier = Arc::new(Barrier::new(threads));
        silence_planned_panics();
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (cache, barrier) = (cache.clone(), barrier.clone());
                let (created, dropped) = (created.clone(), dropped.clone());
                thread::spawn(move || {
                    let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1);
                    let make = |id: u64| {
                        created.fetch_add(1, Ordering::Relaxed);
                        Tracked::new(id, &dropped)
                    };
                    barrier.wait();
                    for _ in 0..n {
                        let r = next(&mut rng);
                        let key = (r >> 8) % KEYS;
                        match r % 16 {
                            0..=5 => {
                                if let Some(v) = cache.get(&key) {
                                    assert_eq!(v.id / 8, key, "value of another key");
                                }
                            }
                            6 => {
                                let pinned = cache.pin();
                                if let Some(v) = pinned.get(&key) {
                                    assert_eq!(v.id / 8, key);
                                }
                            }
                            7 | 8 => {
                                let _ = cache.insert(key, make(key * 8 + (r >> 40) % 8));
                            }
                            9 | 10 => {
                                let v = cache.get_or_insert_with(key, || make(key * 8 + 1));
                                assert_eq!(v.id / 8, key);
                            }
                            11 => {
                                let res = cache.try_get_or_insert_with(key, || {
                                    if r & (1 << 20) == 0 {
                                        Err(key)
                                    } else {
                                        Ok(make(key * 8 + 2))
                                    }
                                });
                                match res {
                                    Ok(v) => assert_eq!(v.id / 8, key),
                                    Err(e) => assert_eq!(e.failed(), Some(&key)),
                                }
                            }
                            12 => {
                                let res = catch_unwind(AssertUnwindSafe(|| {
                                    cache.get_or_insert_with(key, || {
                                        if r & (1 << 21) == 0 {
                                            std::panic::panic_any(PLANNED);
                                        }
                                        make(key * 8 + 3)
                                    })
                                }));
                                if let Ok(v) = res {
                                    assert_eq!(v.id / 8, key);
                                }
                            }
                            13 | 14 => {
                                if let Some(v) = cache.remove(&key) {
                                    assert_eq!(v.id / 8, key);
                                }
                            }
                            _ => match (r >> 32) % 64 {
                                0 => cache.set_capacity(1000 + (r >> 48) % 3000).unwrap(),
                                1 => cache.clear(),
                                _ => {
                                    let _ = cache.contains_key(&key);
                                }
                            },
                        }
                        let (size, capacity) = cache.weighted_size_and_capacity();
                        assert!(size <= capacity, "size {size} above capacity {capacity}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a stress thread failed");
        }

        // Quiet now: the accounting must be exact.
        let pinned = cache.pin();
        let (mut count, mut weight) = (0usize, 0u64);
        for key in 0..KEYS {
            if let Some(v) = pinned.get(&key) {
                count += 1;
                weight += v.id % 4;
            }
        }
        drop(pinned);
        assert_eq!(cache.len(), count, "len must equal the entries found");
        assert_eq!(
            cache.weighted_size(),
            weight,
            "weighted size must equal live weights"
        );
        assert!(cache.weighted_size() <= cache.capacity());
        cache.__validate().unwrap();
        let s = cache.stats();
        assert!(s.builds > 0 && s.hits > 0 && s.build_failures > 0, "{s:?}");
        if cfg!(runcache_stress) {
            // Tiny tables: removals and failed builds leave dead slots, so the tables keep
            // migrating (to shed them, or to grow) while the other threads work.
            let migrations = cache.__migrations();
            assert!(migrations >= 20, "only {migrations} table migrations");
            println!("{migrations} table migrations");
        }
    }
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        created.load(Ordering::SeqCst),
        "every value created must be dropped exactly once"
    );
}

/// Many short rounds of three threads on three keys of a tiny cache (two shards, evicting
/// or rejecting, every kind of write), each round ending with the cache's own check: with
/// few keys, one key is replaced, removed and inserted again while a migration copies it,
/// which is where a late copy (a helper that read the frozen slot before another helper
/// moved it) once landed a dead, replaced node in the new table: a forward that no writer
/// swung, and under `runcache_stress` (tables of four slots, a pause inside the copy) a
/// table with no end, where lookups spun (H4, H6). `RUNCACHE_STRESS_OPS` / 16 rounds.
#[test]
#[ignore = "stress: run explicitly (see .ci/run)"]
fn few_keys_under_migration_leave_valid_tables() {
    let rounds = (ops_per_thread() / 16).max(1) as u64;
    for round in 0..rounds {
        let evict = round % 2 == 0;
        let cache: Cache<u64, u64> = Cache::builder()
            .capacity(2)
            .shards(2)
            .when_full(if evict {
                runcache::WhenFull::Evict
            } else {
                runcache::WhenFull::Reject
            })
            .build()
            .unwrap();
        all_at_once(3, |t| {
            let mut rng = round.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (t as u64 + 1) | 1;
            for _ in 0..200 {
                let r = next(&mut rng);
                let key = (r >> 8) % 3;
                match r % 10 {
                    0 | 1 => {
                        if let Some(v) = cache.get(&key) {
                            assert_eq!(*v % 3, key, "value of another key");
                        }
                    }
                    2..=4 => {
                        let _ = cache.insert(key, (r >> 16) / 3 * 3 + key);
                    }
                    5 | 6 => {
                        if let Some(v) = cache.remove(&key) {
                            assert_eq!(*v % 3, key, "value of another key");
                        }
                    }
                    7 => {
                        let v = cache.get_or_insert_with(key, || key);
                        assert_eq!(*v % 3, key, "value of another key");
                    }
                    8 if r & (1 << 40) == 0 => {
                        cache.clear();
                    }
                    8 => {
                        cache.retain(|k, _| k % 2 == 0);
                    }
                    _ => cache.set_capacity(1 + (r >> 32) % 6).unwrap(),
                }
            }
        });
        if let Err(e) = cache.__validate() {
            panic!("round {round}: {e}");
        }
    }
}

#[test]
#[ignore = "stress: run explicitly (see .ci/run)"]
fn single_key_storms_run_one_build_per_attempt() {
    for round in 0..200u64 {
        let cache = Arc::new(Cache::<u64, u64>::new(10));
        let builds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (cache, builds, barrier) = (cache.clone(), builds.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    *cache.get_or_insert_with(round, || {
                        builds.fetch_add(1, Ordering::SeqCst);
                        round * 3
                    })
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), round * 3);
        }
        assert_eq!(builds.load(Ordering::SeqCst), 1, "round {round}");
    }
}

/// 256 callers on one missing key, three ways: a builder that succeeds (one build, one value
/// for all), builders that fail (every attempt's error reaches exactly the callers that
/// waited on it, nothing is cached), and builders of which the first five panic (each panic
/// reaches only its own caller, a waiter takes the build over, everyone else gets the one
/// value). Nobody is stranded: every thread returns.
#[test]
#[ignore = "stress: run explicitly (see .ci/run)"]
fn hundreds_of_callers_on_one_key_share_each_attempt_and_none_is_stranded() {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    silence_planned_panics();
    type Caller<'a> = dyn Fn(&Cache<u64, u64>, &AtomicUsize) -> Result<runcache::Handle<u64>, Arc<usize>>
        + Sync
        + 'a;
    let storm = |work: &Caller<'_>| {
        let cache = Cache::<u64, u64>::new(10);
        let attempts = AtomicUsize::new(0);
        let results = all_at_once(MANY_THREADS, |_| {
            catch_unwind(AssertUnwindSafe(|| work(&cache, &attempts)))
        });
        (cache, attempts.into_inner(), results)
    };
    let slow = || thread::sleep(Duration::from_millis(20));

    // One build, one value for every caller.
    let (cache, attempts, results) = storm(&|c, attempts| {
        Ok(c.get_or_insert_with(7, || {
            attempts.fetch_add(1, Ordering::SeqCst);
            slow();
            70
        }))
    });
    assert_eq!(attempts, 1);
    let first = results[0].as_ref().unwrap().as_ref().unwrap().clone();
    for r in &results {
        assert!(runcache::Handle::ptr_eq(
            r.as_ref().unwrap().as_ref().unwrap(),
            &first
        ));
    }
    let s = cache.stats();
    assert_eq!(s.builds, 1, "{s:?}");
    assert_eq!(
        s.misses + s.hits + s.waits,
        MANY_THREADS as u64,
        "each caller counts once, as the builder's miss, a hit or a wait: {s:?}"
    );

    // Every attempt fails: each caller gets the error of the attempt it built or waited on.
    let (cache, attempts, results) = storm(&|c, attempts| {
        c.try_get_or_insert_with(7, || {
            let n = attempts.fetch_add(1, Ordering::SeqCst);
            slow();
            Err(n)
        })
        .map_err(|e| match e {
            BuildError::Failed(e) => e,
            other => panic!("no build asks for its own key: {other}"),
        })
    });
    let mut errors: Vec<Arc<usize>> = Vec::new();
    for r in results {
        let e = r.unwrap().expect_err("nothing can succeed");
        if !errors.iter().any(|seen| Arc::ptr_eq(seen, &e)) {
            errors.push(e);
        }
    }
    let mut ids: Vec<usize> = errors.iter().map(|e| **e).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..attempts).collect::<Vec<_>>(),
        "each attempt's own error, shared by its waiters, and no other"
    );
    assert_eq!(cache.stats().build_failures, attempts as u64);
    assert!(cache.is_empty() && cache.get(&7).is_none());

    // The first five builders panic; a waiter takes each over, until one succeeds.
    let (cache, attempts, results) = storm(&|c, attempts| {
        Ok(c.get_or_insert_with(7, || {
            let n = attempts.fetch_add(1, Ordering::SeqCst);
            slow();
            if n < 5 {
                std::panic::panic_any(PLANNED);
            }
            70
        }))
    });
    assert_eq!(
        attempts, 6,
        "five panicking attempts, then one that succeeds"
    );
    let panics = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(panics, 5, "each panic reaches its own caller only");
    let values: Vec<_> = results.into_iter().filter_map(|r| r.ok()).collect();
    for v in &values {
        assert!(runcache::Handle::ptr_eq(
            v.as_ref().unwrap(),
            values[0].as_ref().unwrap()
        ));
    }
    assert_eq!(*cache.get(&7).unwrap(), 70);
}

/// Threads that use the cache for a moment and exit, 32 at a time for 16 rounds (512 in
/// all): their registrations with the collector go away with them, and what they removed,
/// replaced or evicted is not stranded in their epoch bags: once they are gone, `reclaim`
/// frees all of it, leaving alive exactly the values still cached.
#[test]
#[ignore = "stress: run explicitly (see .ci/run)"]
fn threads_that_come_and_go_strand_nothing() {
    let created = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let dropped = drops();
    let cache = Arc::new(
        Cache::<u64, Tracked>::builder()
            .capacity(500)
            .build()
            .unwrap(),
    );
    for round in 0..16u64 {
        let handles: Vec<_> = (0..32u64)
            .map(|t| {
                let (cache, created, dropped) = (cache.clone(), created.clone(), dropped.clone());
                thread::spawn(move || {
                    let mut rng = 0x2545_F491_4F6C_DD1D ^ (round << 8 | t);
                    for _ in 0..300 {
                        let r = next(&mut rng);
                        let key = (r >> 8) % KEYS;
                        let make = || {
                            created.fetch_add(1, Ordering::SeqCst);
                            Tracked::new(key, &dropped)
                        };
                        match r % 4 {
                            0 => drop(cache.insert(key, make())),
                            1 => drop(cache.remove(&key)),
                            _ => assert_eq!(cache.get_or_insert_with(key, make).id, key),
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a short-lived thread failed");
        }
    }
    cache.reclaim();
    cache.__validate().unwrap();
    let (made, gone) = (
        created.load(Ordering::SeqCst),
        dropped.load(Ordering::SeqCst),
    );
    assert!(cache.stats().evictions > 0, "the cache must have been full");
    assert_eq!(
        made - gone,
        cache.len(),
        "alive after reclaim: exactly the cached values ({made} made, {gone} dropped)"
    );
    drop(cache);
    assert_eq!(dropped.load(Ordering::SeqCst), made);
}

/// 256 threads share three memory pools, waiting whenever all three are out: parked with no
/// timeout, then with a 2 ms timeout (a thread that times out tries again, so waiters leave
/// the queue on their own while others are being woken). A pool is never held by two threads
/// at once, and no waiter misses the return it waits for: a lost wake-up leaves an untimed
/// waiter parked forever, and the test hanging.
#[test]
#[ignore = "stress: run explicitly (see .ci/run)"]
fn hundreds_of_threads_wait_for_three_pools_and_none_is_stranded() {
    use runcache::pool::{PoolManager, WhenExhausted};
    use runcache::PoolError;
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;
    const MAX: usize = 3;
    const ROUNDS: u64 = 20;
    for exhausted in [
        WhenExhausted::Wait,
        WhenExhausted::WaitFor(Duration::from_millis(2)),
    ] {
        let pools = PoolManager::builder(|| AtomicU64::new(0))
            .max_pools(MAX)
            .when_exhausted(exhausted)
            .build()
            .unwrap();
        let timeouts = AtomicU64::new(0);
        all_at_once(MANY_THREADS, |t| {
            let me = t as u64 + 1;
            let mut done = 0;
            while done < ROUNDS {
                let holder = match pools.reserve() {
                    Ok(holder) => holder,
                    Err(PoolError::TimedOut { .. }) => {
                        timeouts.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => panic!("{exhausted:?}: {e}"),
                };
                let before = holder.swap(me, Ordering::SeqCst);
                assert_eq!(before, 0, "a pool held by {before} was handed to {me}");
                thread::yield_now();
                holder.store(0, Ordering::SeqCst);
                done += 1;
            }
        });
        let s = pools.stats();
        assert_eq!(s.reserves, MANY_THREADS as u64 * ROUNDS, "{exhausted:?}");
        assert!(
            pools.pools() <= MAX && s.peak_reserved as usize <= MAX,
            "{exhausted:?}: {s:?}"
        );
        assert_eq!(pools.reserved(), 0);
        if exhausted == WhenExhausted::Wait {
            assert_eq!(timeouts.load(Ordering::Relaxed), 0);
        }
        println!(
            "{exhausted:?}: {} waits, {} timeouts",
            s.waits,
            timeouts.load(Ordering::Relaxed)
        );
    }
}

/// 256 threads at once ask a fresh multi-cache for three key types it has never seen (so they
/// race to create each per-type cache) and a grouped cache for the same entries of two
/// sessions: every (type, key) and every (session, group, name) is built exactly once, and
/// every caller gets the one value built.
#[test]
#[ignore = "stress: run explicitly (see .ci/run)"]
fn hundreds_of_threads_build_each_key_once_in_the_multi_and_grouped_caches() {
    use runcache::grouped::GroupedCache;
    use runcache::multi::MultiCache;
    use std::sync::atomic::AtomicUsize;
    const KEYS: u32 = 8;
    let multi = MultiCache::new(1024);
    let grouped: GroupedCache<u32, u32, u32, u64> = GroupedCache::new(0);
    let builds: Vec<AtomicUsize> = (0..4 * KEYS).map(|_| AtomicUsize::new(0)).collect();
    all_at_once(MANY_THREADS, |t| {
        let t = t as u32;
        for i in 0..KEYS {
            let k = (i + t) % KEYS;
            let count = |slot: u32| {
                builds[slot as usize].fetch_add(1, Ordering::SeqCst);
            };
            let (a, _) = multi.get_or_create(&k, |k| {
                count(*k);
                u64::from(*k)
            });
            let (b, _) = multi.get_or_create(&u64::from(k), |k| {
                count(KEYS + *k as u32);
                *k as u32
            });
            let (c, _) = multi.get_or_create(&(k as u16), |k| {
                count(2 * KEYS + u32::from(*k));
                i64::from(*k)
            });
            assert_eq!((*a, *b, *c), (u64::from(k), k, i64::from(k)));
            let v = grouped.get_or_insert_with(&(k % 2), &(k / 2), &k, || {
                count(3 * KEYS + k);
                100 + u64::from(k)
            });
            assert_eq!(*v, 100 + u64::from(k));
        }
    });
    for (slot, n) in builds.iter().enumerate() {
        assert_eq!(
            n.load(Ordering::SeqCst),
            1,
            "entry {slot} was built more than once or never"
        );
    }
    assert_eq!(multi.type_count(), 3);
    assert_eq!(grouped.len(), KEYS as usize);
}
