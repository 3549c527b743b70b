//! Soak: every layer at once, on several threads, for a bounded time; then caches and sessions
//! that come and go by the thousand (a quarter of that time). Ignored in the default
//! run; `.ci/run` runs it for `RUNCACHE_SOAK_SECS` seconds (default 30).
//!
//! Every value is a drop-counted `Tracked`, and every pool and constant buffer comes from a
//! counting factory or allocator. At the end: each cache passes its own invariant check, and
//! after everything is dropped every value was dropped exactly once, every pool was freed and
//! every byte came back.

mod common;

use common::{drops, on_threads, silence_planned_panics, TestAllocator, Tracked, PLANNED};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runcache::constant::{ConstantCache, ConstantKey};
use runcache::grouped::{GroupedCache, OwnerId};
use runcache::multi::MultiCache;
use runcache::pool::{PoolManager, WhenExhausted};
use runcache::{BufferAllocator, Cache, ConstantBuffer, DeviceKind};
use runcache::{RemovalCause, WhenFull};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const THREADS: usize = 4;

fn seconds() -> u64 {
    std::env::var("RUNCACHE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30)
}

/// Drop-counted pools.
struct Pool {
    _value: Tracked,
}

#[test]
#[ignore = "soak: run explicitly (see .ci/run)"]
fn every_layer_at_once_leaks_nothing_and_accounts_exactly() {
    silence_planned_panics();
    let made = Arc::new(AtomicUsize::new(0));
    let dropped = drops();
    let bytes = Arc::new(TestAllocator::new(DeviceKind::Cpu));
    let evicted = Arc::new(AtomicU64::new(0));
    {
        let heard = evicted.clone();
        let evicting = Cache::<u64, Tracked>::builder()
            .capacity(500)
            .weigher(|_, v| 1 + v.id % 3)
            .on_evict(move |_, _, cause| {
                if cause == RemovalCause::Capacity {
                    heard.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build()
            .unwrap();
        let rejecting = Cache::<u64, Tracked>::builder()
            .capacity(300)
            .when_full(WhenFull::Reject)
            .build()
            .unwrap();
        let grouped: GroupedCache<u8, u16, u16, Tracked> = GroupedCache::new(4);
        let multi = MultiCache::new(200);
        let constants = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
        let alloc: Arc<dyn BufferAllocator> = bytes.clone();
        let pool_drops = dropped.clone();
        let pool_made = made.clone();
        let pools = PoolManager::builder(move || {
            pool_made.fetch_add(1, Ordering::SeqCst);
            Pool {
                _value: Tracked::new(0, &pool_drops),
            }
        })
        .pools_per_growth(2)
        .max_pools(6)
        .when_exhausted(WhenExhausted::WaitFor(Duration::from_millis(5)))
        .build()
        .unwrap();
        let ops = AtomicU64::new(0);
        let shared = Arc::new((
            (evicting, rejecting, grouped, multi, constants, alloc, pools),
            (made.clone(), dropped.clone(), Barrier::new(THREADS), ops),
        ));
        let work = shared.clone();
        let seconds = seconds();
        on_threads(THREADS, move |t| {
            let (evicting, rejecting, grouped, multi, constants, alloc, pools) = &work.0;
            let (made, dropped, barrier, ops) = &work.1;
            let mut rng = StdRng::seed_from_u64(t as u64);
            let mut id = (t as u64) << 40;
            let mut track = || {
                id += 1;
                made.fetch_add(1, Ordering::SeqCst);
                Tracked::new(id, dropped)
            };
            barrier.wait();
            let deadline = Instant::now() + Duration::from_secs(seconds);
            let mut n = 0u64;
            while n % 256 != 0 || Instant::now() < deadline {
                n += 1;
                let k = rng.random_range(0..2000u64);
                let _ = catch_unwind(AssertUnwindSafe(|| match rng.random_range(0..16) {
                    0..=3 => {
                        let fail = rng.random_range(0..20);
                        let v = track();
                        let _ = evicting.try_get_or_insert_with(k % 800, || match fail {
                            0 => Err(()),
                            1 => std::panic::panic_any(PLANNED),
                            _ => Ok(v),
                        });
                    }
                    4 => {
                        let _ = evicting.insert(k % 800, track());
                    }
                    5 => {
                        evicting.remove(&(k % 800));
                    }
                    6 => {
                        let v = track();
                        rejecting.get_or_insert_with(k % 400, || v);
                    }
                    7 => {
                        rejecting.remove(&(k % 400));
                    }
                    8 => {
                        let (sess, group, name) = ((k % 3) as u8, (k % 11) as u16, (k % 7) as u16);
                        let v = track();
                        match k % 4 {
                            0 => drop(grouped.owner(OwnerId(k % 5)).set(&sess, &group, &name, v)),
                            1 => drop(grouped.get_or_insert_with(&sess, &group, &name, || v)),
                            2 => drop(grouped.get(&sess, &group, &name)),
                            _ => drop(v),
                        }
                    }
                    9 if k % 50 == 0 => grouped.clear_owner(OwnerId(k % 5)),
                    9 if k % 97 == 0 => grouped.clear_session(&((k % 3) as u8)),
                    10 => {
                        let v = track();
                        multi.get_or_create(&(k % 300), |_| v);
                    }
                    11 => {
                        let v = track();
                        multi.get_or_create(&((k % 300) as u16), |_| v);
                    }
                    12 => {
                        let key = ConstantKey::new(9, k % 64);
                        let size = 4096 * (1 + (k % 64) as usize % 8);
                        let _ = constants
                            .get_or_add(key, size, || ConstantBuffer::new(alloc.clone(), size, 64));
                    }
                    13 if k % 40 == 0 => {
                        constants.remove_if_exist(ConstantKey::new(9, k % 64));
                    }
                    14 => {
                        if let Ok(p) = pools.reserve() {
                            std::hint::black_box(&p._value.id);
                        }
                    }
                    15 if k % 500 == 0 => {
                        evicting.set_capacity(rng.random_range(200..800)).unwrap();
                        constants
                            .set_capacity_bytes(rng.random_range(256..2048) << 10)
                            .unwrap();
                    }
                    _ => {
                        evicting.get(&(k % 800));
                        rejecting.get(&(k % 400));
                    }
                }));
                let (size, capacity) = evicting.weighted_size_and_capacity();
                assert!(size <= capacity, "evicting: {size} > {capacity}");
                let (size, capacity) = constants.size_and_capacity();
                assert!(size <= capacity, "constants: {size} > {capacity}");
            }
            ops.fetch_add(n, Ordering::Relaxed);
        });
        let (evicting, rejecting, _, _, _, _, pools) = &shared.0;
        evicting.__validate().expect("the evicting cache");
        rejecting.__validate().expect("the rejecting cache");
        assert!(
            evicting.stats().evictions > 0,
            "the evicting cache was under pressure"
        );
        assert_eq!(
            evicting.stats().evictions,
            evicted.load(Ordering::Relaxed),
            "every eviction was reported"
        );
        assert_eq!(pools.reserved(), 0, "every pool came back");
        eprintln!(
            "soak: {} operations in {} s on {THREADS} threads, {} values made",
            shared.1 .3.load(Ordering::Relaxed),
            seconds,
            made.load(Ordering::SeqCst)
        );
        drop(shared);
    }
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        made.load(Ordering::SeqCst),
        "values and pools dropped exactly once"
    );
    assert_eq!(
        bytes.live.load(Ordering::SeqCst),
        0,
        "every constant byte came back"
    );
}

/// Resident memory of this process, in bytes (Linux's `/proc/self/statm`; 0 elsewhere).
fn resident() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// A cache of capacity 64 whose listener panics for keys that are multiples of `panics_on`
/// (0: never), weighing each value 1 + id % 4.
fn churned(panics_on: u64) -> Cache<u64, Tracked> {
    Cache::builder()
        .capacity(64)
        .weigher(|_, v: &Tracked| 1 + v.id % 4)
        .on_evict(move |k, _, _| {
            if panics_on > 0 && k % panics_on == 0 {
                std::panic::panic_any(PLANNED);
            }
        })
        .build()
        .unwrap()
}

/// A cache shared between threads, which any of them may replace.
type Slot = std::sync::Mutex<Arc<Cache<u64, Tracked>>>;

/// The budget matches the entries, and the structure is sound.
fn exact(cache: &Cache<u64, Tracked>) {
    let cached: u64 = cache.pin().iter().map(|(_, v)| 1 + v.id % 4).sum();
    assert_eq!(
        cache.weighted_size(),
        cached,
        "the budget is the entries' weight"
    );
    cache.__validate().unwrap();
}

#[test]
#[ignore = "soak: run explicitly (see .ci/run)"]
fn thousands_of_caches_and_sessions_come_and_go_with_nothing_left_behind() {
    // A quarter of the soak's time: caches and grouped sessions built and dropped from four
    // threads, some shared between threads, one cache in ten with a listener that panics.
    silence_planned_panics();
    let made = Arc::new(AtomicUsize::new(0));
    let dropped = drops();
    let seconds = (seconds() / 4).max(1);
    let shared: Arc<Vec<Slot>> = Arc::new(
        (0..16)
            .map(|i| std::sync::Mutex::new(Arc::new(churned(if i % 4 == 0 { 7 } else { 0 }))))
            .collect(),
    );
    let grouped: Arc<GroupedCache<u64, u64, u64, Tracked>> = Arc::new(GroupedCache::new(2));
    let warm = Arc::new(AtomicU64::new(0));
    let start = Barrier::new(THREADS);
    let work = (
        shared.clone(),
        grouped.clone(),
        made.clone(),
        dropped.clone(),
        warm.clone(),
    );
    let work = Arc::new((work, start));
    on_threads(THREADS, move |t| {
        let ((shared, grouped, made, dropped, warm), start) = &*work;
        let mut rng = StdRng::seed_from_u64(100 + t as u64);
        let mut id = (t as u64) << 40;
        let mut track = || {
            id += 1;
            made.fetch_add(1, Ordering::SeqCst);
            Tracked::new(id, dropped)
        };
        let mut mine: Vec<Cache<u64, Tracked>> = Vec::new();
        start.wait();
        let begin = Instant::now();
        let (mut round, mut warmed) = (0u64, false);
        while begin.elapsed() < Duration::from_secs(seconds) {
            round += 1;
            // Keep up to 500 caches of this thread's own, replacing one each round.
            let panics_on = if round % 10 == 0 { 3 } else { 0 };
            if mine.len() < 500 {
                mine.push(churned(panics_on));
            } else {
                let i = rng.random_range(0..mine.len());
                exact(&mine[i]);
                mine[i] = churned(panics_on);
            }
            let own = rng.random_range(0..mine.len());
            let slot = &shared[rng.random_range(0..shared.len())];
            let other = slot.lock().unwrap().clone();
            for _ in 0..64 {
                let k = rng.random_range(0..200u64);
                let cache = if k % 2 == 0 { &mine[own] } else { &*other };
                let _ = catch_unwind(AssertUnwindSafe(|| match k % 5 {
                    0 => drop(cache.insert(k, track())),
                    1 => drop(cache.remove(&k)),
                    _ => drop(cache.get_or_insert_with(k, &mut track)),
                }));
                let (size, capacity) = cache.weighted_size_and_capacity();
                assert!(size <= capacity, "{size} > {capacity}");
            }
            // A shared cache is now and then replaced: its last holder drops it.
            if round % 16 == 0 {
                *slot.lock().unwrap() = Arc::new(churned(if round % 32 == 0 { 5 } else { 0 }));
            }
            // Sessions: a new one each round, with an executor that uses and clears its shape
            // and an entry of no owner's, cleared when the session ends.
            let session = (t as u64) << 32 | round;
            let owner = OwnerId(session);
            grouped
                .owner(owner)
                .set(&session, &(round % 3), &0, track());
            drop(grouped.get_or_insert_with(&session, &1, &1, &mut track));
            grouped.clear_owner(owner);
            assert_eq!(
                grouped.group_count(&session),
                1,
                "the owner's group left with it"
            );
            grouped.clear_session(&session);
            // Warmed up after a fifth of the run: from there on, what is made is dropped.
            if !warmed && begin.elapsed() > Duration::from_secs(seconds) / 5 {
                warmed = true;
                warm.fetch_max(resident(), Ordering::Relaxed);
            }
        }
        for cache in &mine {
            exact(cache);
        }
    });
    for slot in shared.iter() {
        exact(&slot.lock().unwrap());
    }
    let warm = warm.load(Ordering::Relaxed);
    let end = resident();
    eprintln!(
        "soak of caches: resident {} MiB after the warm-up, {} MiB at the end",
        warm >> 20,
        end >> 20
    );
    // Flat within the allocator's slack (no `/proc` reads 0 for both): a leak of a few KiB
    // per cache made would be gigabytes here.
    assert!(
        end <= warm * 2 + (256 << 20),
        "resident memory grew: {warm} to {end}"
    );
    grouped.clear();
    assert!(grouped.is_empty());
    drop((shared, grouped));
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        made.load(Ordering::SeqCst),
        "every value dropped exactly once"
    );
}
