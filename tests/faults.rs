//! Fault injection: builders that fail, panic or stall at random, weighers that panic, and
//! allocators that run out of memory, all on several threads at once. Whatever fails, nothing
//! hangs, every value is dropped exactly once, the accounting stays exact (the cache's own
//! invariant check, `__validate`, passes afterwards), and every byte an allocator handed out
//! comes back.

mod common;

use common::{drops, on_threads, silence_planned_panics, TestAllocator, Tracked, PLANNED};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runcache::constant::{AddError, ConstantCache, ConstantKey};
use runcache::WhenFull;
use runcache::{AllocError, BufferAllocator, Cache, ConstantBuffer, DeviceKind};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

const THREADS: usize = 4;
const OPS: usize = 6_000;

/// What a faulty builder does on one call.
fn faulty(
    rng: &mut StdRng,
    id: u64,
    made: &AtomicUsize,
    drops: &Arc<AtomicUsize>,
) -> Result<Tracked, u64> {
    match rng.random_range(0..10) {
        0 => Err(id),
        1 => std::panic::panic_any(PLANNED),
        2 => {
            std::thread::sleep(Duration::from_micros(200));
            made.fetch_add(1, Ordering::SeqCst);
            Ok(Tracked::new(id, drops))
        }
        _ => {
            made.fetch_add(1, Ordering::SeqCst);
            Ok(Tracked::new(id, drops))
        }
    }
}

fn chaos(when_full: WhenFull, seed: u64) {
    silence_planned_panics();
    let made = Arc::new(AtomicUsize::new(0));
    let dropped = drops();
    {
        let cache = Cache::<u64, Tracked>::builder()
            .capacity(200)
            .shards(4)
            .when_full(when_full)
            .weigher(|_, v| {
                if v.id % 23 == 0 {
                    std::panic::panic_any(PLANNED);
                }
                v.id % 5
            })
            .build()
            .unwrap();
        let shared = Arc::new((cache, Barrier::new(THREADS), made.clone(), dropped.clone()));
        let work = shared.clone();
        on_threads(THREADS, move |t| {
            let (cache, barrier, made, dropped) = (&work.0, &work.1, &work.2, &work.3);
            let mut rng = StdRng::seed_from_u64(seed + t as u64);
            barrier.wait();
            for i in 0..OPS {
                let key = rng.random_range(0..300u64);
                let id = (t * OPS + i) as u64;
                let _ = catch_unwind(AssertUnwindSafe(|| match rng.random_range(0..10) {
                    0..=3 => {
                        let mut r = StdRng::seed_from_u64(id);
                        let _ =
                            cache.try_get_or_insert_with(key, || faulty(&mut r, id, made, dropped));
                    }
                    4 => {
                        made.fetch_add(1, Ordering::SeqCst);
                        let _ = cache.insert(key, Tracked::new(id, dropped));
                    }
                    5 => {
                        cache.remove(&key);
                    }
                    6 if i % 500 == 0 => cache.set_capacity(rng.random_range(50..300)).unwrap(),
                    _ => {
                        if let Some(v) = cache.get(&key) {
                            assert_ne!(v.id % 23, 0, "a value whose weigher panicked was cached");
                        }
                    }
                }));
            }
        });
        let cache = &shared.0;
        cache
            .__validate()
            .expect("exact accounting after the faults");
        assert!(cache.weighted_size() <= cache.capacity());
        let stats = cache.stats();
        assert!(
            stats.build_failures > 0,
            "the faults were injected: {stats:?}"
        );
    }
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        made.load(Ordering::SeqCst),
        "every value made was dropped exactly once"
    );
}

#[test]
fn random_build_and_weigher_faults_on_an_evicting_cache() {
    chaos(WhenFull::Evict, 1);
}

#[test]
fn random_build_and_weigher_faults_on_a_rejecting_cache() {
    chaos(WhenFull::Reject, 100);
}

#[test]
fn an_allocator_that_fails_at_random_leaks_nothing_and_keeps_the_budget() {
    let flaky = Arc::new(TestAllocator {
        fail_one_in: 8,
        ..TestAllocator::new(DeviceKind::Cpu)
    });
    let alloc: Arc<dyn BufferAllocator> = flaky.clone();
    let shared = Arc::new((
        ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 256 << 10),
        alloc,
        Barrier::new(THREADS),
    ));
    let work = shared.clone();
    on_threads(THREADS, move |t| {
        let (cache, alloc, barrier) = (&work.0, &work.1, &work.2);
        let mut rng = StdRng::seed_from_u64(7 + t as u64);
        let mut held = Vec::new();
        barrier.wait();
        for i in 0..2_000 {
            let key = ConstantKey::new(1, rng.random_range(0..64));
            let size = 1024 * (1 + (key.key as usize % 16));
            match rng.random_range(0..8) {
                0 => {
                    cache.remove_if_exist(key);
                }
                1 if i % 200 == 0 => cache
                    .set_capacity_bytes(rng.random_range(0..512) << 10)
                    .unwrap(),
                _ => match cache
                    .get_or_add(key, size, || ConstantBuffer::new(alloc.clone(), size, 64))
                {
                    Ok(added) => {
                        assert_eq!(added.buffer.size(), size);
                        if i % 7 == 0 {
                            held.push(added.buffer);
                        }
                    }
                    Err(e) => assert!(
                        matches!(&*e, AddError::Build(AllocError::OutOfMemory { .. })),
                        "only injected failures: {e}"
                    ),
                },
            }
            let (size, capacity) = cache.size_and_capacity();
            assert!(size <= capacity, "{size} > {capacity}");
            if held.len() > 16 {
                held.clear();
            }
        }
    });
    let (cache, alloc, _) =
        Arc::try_unwrap(shared).unwrap_or_else(|_| unreachable!("the workers have exited"));
    assert!(
        flaky.failed.load(Ordering::SeqCst) > 0,
        "the faults were injected"
    );
    cache.clear();
    assert_eq!(cache.size(), 0);
    assert_eq!(cache.pinned_bytes(), 0, "nobody holds a buffer any more");
    drop(cache);
    drop(alloc);
    assert_eq!(flaky.live.load(Ordering::SeqCst), 0, "every byte came back");
}
