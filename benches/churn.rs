//! Churn: Zipf-distributed keys over a key space larger than the cache, so 10–20% of lookups
//! miss and insert, evicting something. runcache against quick_cache and moka (all evicting,
//! all with the same capacity), at 1 and 2 threads.
//!
//! One iteration is a batch of `BATCH` get-or-insert operations (`Throughput::Elements`). After
//! the measurements the bench prints each subject's miss ratio, so the 10–20% band can be
//! checked.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const KEYS: u64 = 100_000;
const CAPACITY: u64 = 10_000;
const BATCH: usize = 1024;
const ZIPF_S: f64 = 1.0;

type Hasher = foldhash::fast::RandomState;

fn keys(seed: u64) -> Vec<u64> {
    let dist = rand_distr::Zipf::new(KEYS as f64, ZIPF_S).expect("valid Zipf parameters");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..1 << 20).map(|_| rng.sample(dist) as u64).collect()
}

/// A cache under test: `get` or, on a miss, `insert`; returns whether it hit.
trait Subject: Sync {
    fn access(&self, k: u64) -> bool;
}

impl Subject for runcache::Cache<u64, u64> {
    fn access(&self, k: u64) -> bool {
        if self.get(&k).is_some() {
            return true;
        }
        let _ = self.insert(k, k);
        false
    }
}

impl Subject for quick_cache::sync::Cache<u64, u64> {
    fn access(&self, k: u64) -> bool {
        if self.get(&k).is_some() {
            return true;
        }
        self.insert(k, k);
        false
    }
}

impl Subject for moka::sync::Cache<u64, u64, Hasher> {
    fn access(&self, k: u64) -> bool {
        if self.get(&k).is_some() {
            return true;
        }
        self.insert(k, k);
        false
    }
}

fn make(name: &str) -> Box<dyn Subject> {
    match name {
        "runcache" => Box::new(
            runcache::Cache::<u64, u64>::builder()
                .capacity(CAPACITY)
                .build()
                .unwrap(),
        ),
        "quick_cache" => Box::new(quick_cache::sync::Cache::<u64, u64>::new(CAPACITY as usize)),
        "moka" => Box::new(
            moka::sync::Cache::builder()
                .max_capacity(CAPACITY)
                .build_with_hasher(Hasher::default()),
        ),
        other => unreachable!("unknown subject {other}"),
    }
}

fn churn(c: &mut Criterion) {
    let streams = [keys(1), keys(2)];
    let mut misses = Vec::new();
    for threads in [1usize, 2] {
        let mut group = c.benchmark_group(format!("churn/{threads}-threads"));
        group.throughput(Throughput::Elements((threads * BATCH) as u64));
        for name in ["runcache", "quick_cache", "moka"] {
            let subject = make(name);
            let (hits, total) = (AtomicU64::new(0), AtomicU64::new(0));
            group.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| {
                    let start = Barrier::new(threads + 1);
                    std::thread::scope(|s| {
                        for (t, stream) in streams.iter().enumerate().take(threads) {
                            let (start, subject) = (&start, &subject);
                            let (hits, total) = (&hits, &total);
                            s.spawn(move || {
                                start.wait();
                                let mut at = (t * 7919) % stream.len();
                                let mut mine = 0;
                                for _ in 0..iters {
                                    for _ in 0..BATCH {
                                        mine += u64::from(subject.access(stream[at]));
                                        at = (at + 1) % stream.len();
                                    }
                                }
                                hits.fetch_add(mine, Ordering::Relaxed);
                                total.fetch_add(iters * BATCH as u64, Ordering::Relaxed);
                            });
                        }
                        start.wait();
                        let t0 = Instant::now();
                        // The scope joins every thread before returning.
                        t0
                    })
                    .elapsed()
                })
            });
            let (h, n) = (
                hits.load(Ordering::Relaxed),
                total.load(Ordering::Relaxed).max(1),
            );
            misses.push((threads, name, 100.0 * (n - h) as f64 / n as f64));
            black_box(&subject);
        }
        group.finish();
    }
    println!("\nchurn: Zipf s={ZIPF_S} over {KEYS} keys, capacity {CAPACITY}");
    for (threads, name, miss) in misses {
        println!("{threads} thread(s) {name:<12} miss ratio {miss:5.1}%");
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = churn
}
criterion_main!(benches);
