//! Churn: Zipf-distributed keys over a key space larger than the cache, so 15–17% of lookups
//! miss and insert, evicting something. runcache against quick_cache and moka (all evicting,
//! all with the same capacity), at 1 and 2 threads; and runcache and moka with a time to live
//! of an hour (`*-ttl`: nothing expires in a run, so the rows measure the cost of keeping
//! deadlines).
//!
//! One iteration is a batch of `BATCH` get-or-insert operations per thread
//! (`Throughput::Elements`). After the measurements the bench prints each subject's miss
//! ratio, so the band can be checked.

use runcache_bench as support;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use support::{on_threads, subject, zipf_keys, CACHE_SUBJECTS, TTL_SUBJECTS};

const KEYS: u64 = 100_000;
/// At this capacity 15–17% of this bench's warm batches miss (18–19% in `compare`, whose runs
/// start cold), inside the 10–20% band.
const CAPACITY: u64 = 15_000;
const BATCH: usize = 1024;
const ZIPF_S: f64 = 1.0;

fn churn(c: &mut Criterion) {
    let streams = [
        zipf_keys(KEYS, ZIPF_S, 1 << 20, 1),
        zipf_keys(KEYS, ZIPF_S, 1 << 20, 2),
    ];
    let mut misses = Vec::new();
    for threads in [1usize, 2] {
        let mut group = c.benchmark_group(format!("churn/{threads}-threads"));
        group.throughput(Throughput::Elements((threads * BATCH) as u64));
        for name in CACHE_SUBJECTS.into_iter().chain(TTL_SUBJECTS) {
            let subject = subject(name, CAPACITY);
            let (hits, total) = (AtomicU64::new(0), AtomicU64::new(0));
            group.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| {
                    on_threads(threads, iters, |t, i| {
                        let stream = &streams[t];
                        let at = (t * 7919 + i as usize * BATCH) % (stream.len() - BATCH);
                        let mine = stream[at..at + BATCH]
                            .iter()
                            .filter(|k| subject.access(**k))
                            .count();
                        hits.fetch_add(mine as u64, Ordering::Relaxed);
                        total.fetch_add(BATCH as u64, Ordering::Relaxed);
                    })
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
