//! Reserving and returning a cached 4 MiB scratch pool against allocating and freeing a 4 MiB
//! zeroed buffer per run (what a primitive without a pool manager does), in the same run; and
//! many threads taking turns at three pools, each holding its pool across a yield of the CPU
//! (as a holder doing real work would be preempted), so that most reservations wait.

use criterion::{criterion_group, criterion_main, Criterion};
use runcache::pool::PoolManager;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const SCRATCH: usize = 4 << 20;

fn pools(c: &mut Criterion) {
    let mut group = c.benchmark_group("scratch-4MiB");
    let manager = PoolManager::new(1, || vec![0u8; SCRATCH]).expect("valid settings");
    group.bench_function("pool-reserve-return", |b| {
        b.iter(|| {
            let mut scratch = manager.reserve().expect("no maximum set");
            scratch[0] = black_box(1);
            black_box(&scratch[..]);
        })
    });
    group.bench_function("alloc-zeroed-free", |b| {
        b.iter(|| {
            let mut scratch = vec![0u8; SCRATCH];
            scratch[0] = black_box(1);
            black_box(&scratch[..]);
        })
    });
    group.finish();
}

/// `threads` threads share three pools; one iteration is one reservation (spread over the
/// threads), timed from the first thread's start to the last one's end.
fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("three-pools-contended");
    for threads in [4usize, 16, 256] {
        group.bench_function(format!("{threads}-threads"), |b| {
            b.iter_custom(|iters| {
                let pools = PoolManager::builder(|| AtomicU64::new(0))
                    .max_pools(3)
                    .build()
                    .expect("valid settings");
                let per_thread = iters.div_ceil(threads as u64);
                let barrier = Barrier::new(threads);
                let base = Instant::now();
                let (first, last) = (AtomicU64::new(u64::MAX), AtomicU64::new(0));
                std::thread::scope(|s| {
                    for _ in 0..threads {
                        let (pools, barrier, first, last) = (&pools, &barrier, &first, &last);
                        s.spawn(move || {
                            barrier.wait();
                            first.fetch_min(base.elapsed().as_nanos() as u64, Ordering::Relaxed);
                            for _ in 0..per_thread {
                                let p = pools.reserve().expect("an untimed wait never fails");
                                p.fetch_add(1, Ordering::Relaxed);
                                std::thread::yield_now();
                            }
                            last.fetch_max(base.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        });
                    }
                });
                let ns = last.into_inner().saturating_sub(first.into_inner());
                // Scaled to `iters` reservations (the threads ran `per_thread` each).
                Duration::from_nanos(ns * iters / (per_thread * threads as u64))
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    targets = pools, contended
}
criterion_main!(benches);
