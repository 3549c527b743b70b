//! The single-flight storm: `THREADS` threads ask for one missing key at the same moment and
//! the builder takes `BUILD` of busy work. One iteration is one storm on a fresh cache; the
//! measured time is the wall time from the release of the threads until the last one holds
//! the value. Ideal: one build, and everyone done about `BUILD` after the start.
//!
//! Compared in the same run with moka's `get_with` and quick_cache's `get_or_insert_with`
//! (both single-flight), and with a baseline where every thread builds for itself.
//!
//! After the measurements the bench prints, per subject, the builds per storm (which must be 1
//! for the single-flight subjects) and the mean storm time over the builder time.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const THREADS: usize = 8;
const BUILD: Duration = Duration::from_millis(2);

/// The costly builder: busy work for `BUILD` (a kernel compile, say).
fn build(builds: &AtomicU64) -> u64 {
    builds.fetch_add(1, Ordering::Relaxed);
    let t0 = Instant::now();
    let mut x = 1u64;
    while t0.elapsed() < BUILD {
        for _ in 0..64 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x | 1
}

/// One storm: returns the time from the first thread's start to the last thread holding the
/// value (each thread stamps both itself, so descheduling of the spawner does not count).
fn storm(get: &(dyn Fn(&AtomicU64) -> u64 + Sync), builds: &AtomicU64) -> Duration {
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    let t0 = Instant::now();
                    black_box(get(builds));
                    (t0, Instant::now())
                })
            })
            .collect();
        let spans: Vec<(Instant, Instant)> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        let first = spans.iter().map(|s| s.0).min().expect("threads ran");
        let last = spans.iter().map(|s| s.1).max().expect("threads ran");
        last - first
    })
}

const KEY: u64 = 42;

fn subject_storm(subject: &str, builds: &AtomicU64) -> Duration {
    match subject {
        "runcache" => {
            let c = runcache::Cache::<u64, u64>::new(100);
            storm(&|b| *c.get_or_insert_with(KEY, || build(b)), builds)
        }
        "moka" => {
            let c = moka::sync::Cache::<u64, u64>::new(100);
            storm(&|b| c.get_with(KEY, || build(b)), builds)
        }
        "quick_cache" => {
            let c = quick_cache::sync::Cache::<u64, u64>::new(100);
            storm(
                &|b| {
                    c.get_or_insert_with(&KEY, || Ok::<_, ()>(build(b)))
                        .unwrap()
                },
                builds,
            )
        }
        "no-single-flight" => storm(&build, builds),
        other => unreachable!("unknown subject {other}"),
    }
}

const SUBJECTS: [&str; 4] = ["runcache", "moka", "quick_cache", "no-single-flight"];

fn storms(c: &mut Criterion) {
    let mut group = c.benchmark_group(format!("storm/{THREADS}-threads-{BUILD:?}-build"));
    let mut summary = Vec::new();
    for subject in SUBJECTS {
        let builds = Arc::new(AtomicU64::new(0));
        let storms = Arc::new(AtomicU64::new(0));
        let total = Arc::new(AtomicU64::new(0));
        group.bench_function(BenchmarkId::from_parameter(subject), |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    let t = subject_storm(subject, &builds);
                    elapsed += t;
                    storms.fetch_add(1, Ordering::Relaxed);
                    total.fetch_add(t.as_nanos() as u64, Ordering::Relaxed);
                }
                elapsed
            })
        });
        let n = storms.load(Ordering::Relaxed).max(1);
        summary.push((
            subject,
            builds.load(Ordering::Relaxed) as f64 / n as f64,
            total.load(Ordering::Relaxed) as f64 / n as f64 / BUILD.as_nanos() as f64,
        ));
    }
    group.finish();
    println!("\nsingle-flight storm: {THREADS} threads, builder {BUILD:?}");
    println!(
        "{:<18} {:>16} {:>22}",
        "subject", "builds per storm", "storm time / builder"
    );
    for (subject, builds, ratio) in summary {
        println!("{subject:<18} {builds:>16.2} {ratio:>22.2}");
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(2));
    targets = storms
}
criterion_main!(benches);
