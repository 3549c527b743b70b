//! Hits on Zipf-distributed keys (exponent 0.5 and 1.0, 10k and 1M keys, every key present):
//! runcache's `Arc` get and pinned get against papaya's pinned get, quick_cache's, moka's and
//! dashmap's get, and an unsynchronized `HashMap` (the per-core limit), one thread.
//!
//! One iteration is a batch of `BATCH` lookups (`Throughput::Elements`); pinned subjects take
//! one pin per batch.
//!
//! ```text
//! cargo bench -p runcache-bench --bench zipf -- --quick
//! ```

use runcache_bench as support;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::collections::HashMap;
use std::hint::black_box;
use std::time::Duration;
use support::{get_batch_unsync, hit_subject, zipf_keys, Hasher, MAP_SUBJECTS};

const BATCH: usize = 1024;
const STREAM: usize = 1 << 20;

fn zipf_hits(c: &mut Criterion) {
    for keys in [10_000u64, 1_000_000] {
        for s in [0.5, 1.0] {
            let stream = zipf_keys(keys, s, STREAM, 5);
            let mut group = c.benchmark_group(format!("zipf-hit/{keys}-keys/s={s}"));
            group.throughput(Throughput::Elements(BATCH as u64));
            for name in MAP_SUBJECTS {
                let subject = hit_subject(name, keys);
                group.bench_function(BenchmarkId::from_parameter(name), |b| {
                    let mut i = 0;
                    b.iter(|| {
                        i += 1;
                        let at = (i * BATCH) % (STREAM - BATCH);
                        black_box(subject.get_batch(&stream[at..at + BATCH]))
                    })
                });
            }
            let map: HashMap<u64, u64, Hasher> = (0..keys).map(|k| (k, k)).collect();
            group.bench_function(BenchmarkId::from_parameter("hashmap-unsync"), |b| {
                let mut i = 0;
                b.iter(|| {
                    i += 1;
                    let at = (i * BATCH) % (STREAM - BATCH);
                    let hits = get_batch_unsync(&map, &stream[at..at + BATCH]);
                    black_box(hits)
                })
            });
            group.finish();
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = zipf_hits
}
criterion_main!(benches);
