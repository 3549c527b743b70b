//! The async single-flight path against the peers' async caches, in one run.
//!
//! - `tasks/hit`: hits through the async `get_or_*` call on a warm 1,000-key cache, awaited
//!   one after another inside one task (polled once with a no-op waker: no executor in the
//!   measure), beside runcache's blocking `get_or_insert_with` hits in a loop (the async hit
//!   should stay within 1.2× of it), moka's `future::Cache::get_with` and quick_cache's
//!   `get_value_or_guard_async`, awaited the same way.
//! - `tasks/storm`: `TASKS` tasks on a four-worker tokio runtime ask for one missing key at
//!   once; the build is an async wait of `BUILD` (a compile on a remote service, say). One
//!   iteration is one storm on a fresh cache, timed from the spawn to the last task holding
//!   the value. Ideal: one build, and the storm about `BUILD` long.
//!
//! After the measurements the bench prints the builds per storm of each subject (1 for
//! single flight).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const KEYS: u64 = 1_000;
const TASKS: usize = 256;
const BUILD: Duration = Duration::from_millis(2);

/// Polls a future that must finish in one poll (hits only).
fn once<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a hit finishes in one poll"),
    }
}

/// Runs `iters` hits, each through `hit`, and returns the time they took: the async
/// subjects await them one after another inside one task (a server's request handler,
/// polled once since every hit is ready at once), the blocking one calls them in a loop.
fn hits(c: &mut Criterion) {
    let mut group = c.benchmark_group("tasks/hit");
    let rc = runcache::Cache::<u64, u64>::new(2 * KEYS);
    let moka = moka::future::Cache::<u64, u64>::new(2 * KEYS);
    let qc = quick_cache::sync::Cache::<u64, u64>::new(2 * KEYS as usize);
    for k in 0..KEYS {
        let _ = rc.insert(k, k);
        once(moka.insert(k, k));
        qc.insert(k, k);
    }
    group.bench_function(BenchmarkId::from_parameter("runcache-async"), |b| {
        b.iter_custom(|iters| {
            once(async {
                let t0 = Instant::now();
                for i in 0..iters {
                    let v = rc
                        .get_or_insert_with_async(black_box(i % KEYS), async { unreachable!() })
                        .await;
                    black_box(*v.expect("no recursion"));
                }
                t0.elapsed()
            })
        })
    });
    group.bench_function(BenchmarkId::from_parameter("runcache-blocking"), |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for i in 0..iters {
                black_box(*rc.get_or_insert_with(black_box(i % KEYS), || unreachable!()));
            }
            t0.elapsed()
        })
    });
    group.bench_function(BenchmarkId::from_parameter("moka-future"), |b| {
        b.iter_custom(|iters| {
            once(async {
                let t0 = Instant::now();
                for i in 0..iters {
                    black_box(
                        moka.get_with(black_box(i % KEYS), async { unreachable!() })
                            .await,
                    );
                }
                t0.elapsed()
            })
        })
    });
    group.bench_function(BenchmarkId::from_parameter("quick_cache-async"), |b| {
        b.iter_custom(|iters| {
            once(async {
                let t0 = Instant::now();
                for i in 0..iters {
                    match qc.get_value_or_guard_async(&black_box(i % KEYS)).await {
                        Ok(v) => black_box(v),
                        Err(_) => unreachable!("every key is cached"),
                    };
                }
                t0.elapsed()
            })
        })
    });
    group.finish();
}

/// One storm of `TASKS` tasks on `rt`: the time from the spawn to the last task's value.
fn storm<F, Fut>(rt: &tokio::runtime::Runtime, get: F) -> Duration
where
    F: Fn() -> Fut,
    Fut: Future<Output = u64> + Send + 'static,
{
    rt.block_on(async {
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..TASKS).map(|_| tokio::spawn(get())).collect();
        for t in tasks {
            black_box(t.await.expect("the task ran"));
        }
        t0.elapsed()
    })
}

async fn build(builds: Arc<AtomicU64>) -> u64 {
    builds.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(BUILD).await;
    7
}

fn subject_storm(subject: &str, rt: &tokio::runtime::Runtime, builds: &Arc<AtomicU64>) -> Duration {
    const KEY: u64 = 42;
    match subject {
        "runcache" => {
            let c = Arc::new(runcache::Cache::<u64, u64>::new(100));
            storm(rt, || {
                let (c, b) = (c.clone(), builds.clone());
                async move {
                    *c.get_or_insert_with_async(KEY, build(b))
                        .await
                        .expect("no recursion")
                }
            })
        }
        "moka" => {
            let c = moka::future::Cache::<u64, u64>::new(100);
            storm(rt, || {
                let (c, b) = (c.clone(), builds.clone());
                async move { c.get_with(KEY, build(b)).await }
            })
        }
        "quick_cache" => {
            let c = Arc::new(quick_cache::sync::Cache::<u64, u64>::new(100));
            storm(rt, || {
                let (c, b) = (c.clone(), builds.clone());
                async move {
                    c.get_or_insert_async(&KEY, async { Ok::<_, ()>(build(b).await) })
                        .await
                        .expect("the build cannot fail")
                }
            })
        }
        other => unreachable!("unknown subject {other}"),
    }
}

fn storms(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let mut group = c.benchmark_group(format!("tasks/storm-{TASKS}-tasks-{BUILD:?}-build"));
    let mut summary = Vec::new();
    for subject in ["runcache", "moka", "quick_cache"] {
        let builds = Arc::new(AtomicU64::new(0));
        let storms = Arc::new(AtomicU64::new(0));
        group.bench_function(BenchmarkId::from_parameter(subject), |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    elapsed += subject_storm(subject, &rt, &builds);
                    storms.fetch_add(1, Ordering::Relaxed);
                }
                elapsed
            })
        });
        let n = storms.load(Ordering::Relaxed).max(1);
        summary.push((subject, builds.load(Ordering::Relaxed) as f64 / n as f64));
    }
    group.finish();
    println!("\nasync single-flight storm: {TASKS} tasks, build {BUILD:?}");
    println!("{:<14} {:>16}", "subject", "builds per storm");
    for (subject, builds) in summary {
        println!("{subject:<14} {builds:>16.2}");
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(2));
    targets = hits, storms
}
criterion_main!(benches);
