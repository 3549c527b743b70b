//! conc-map-bench's operation mixes — read-heavy (98% get, 1% insert, 1% remove), exchange
//! (10/40/40 and 10% update) and rapid-grow (5/80/5 and 10% update) — on uniform keys, half of
//! them present at the start, at 1, 2 and 4 threads: runcache against papaya, quick_cache,
//! moka and dashmap, plus an unsynchronized `HashMap` at 1 thread (the per-core limit).
//!
//! One iteration is a batch of `BATCH` operations per thread (`Throughput::Elements`).
//!
//! ```text
//! cargo bench -p runcache-bench --bench mixes -- --quick
//! ```

use runcache_bench as support;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
use support::{mix_ops, mix_subject, mix_unsync, on_threads, run_ops, run_ops_unsync, MIXES};

const BATCH: usize = 1024;
const OPS: usize = 1 << 18;

fn mixes(c: &mut Criterion) {
    for mix in MIXES {
        let streams: Vec<_> = (0..4).map(|t| mix_ops(mix, OPS, 17 + t)).collect();
        for threads in [1usize, 2, 4] {
            let mut group = c.benchmark_group(format!("mix/{}/{threads}-threads", mix.name));
            group.throughput(Throughput::Elements((threads * BATCH) as u64));
            for name in ["runcache", "papaya", "quick_cache", "moka", "dashmap"] {
                let subject = mix_subject(name);
                group.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter_custom(|iters| {
                        on_threads(threads, iters, |t, i| {
                            let at = (i as usize * BATCH) % (OPS - BATCH);
                            black_box(run_ops(&*subject, &streams[t][at..at + BATCH]));
                        })
                    })
                });
            }
            if threads == 1 {
                let mut map = mix_unsync();
                group.bench_function(BenchmarkId::from_parameter("hashmap-unsync"), |b| {
                    let mut i = 0;
                    b.iter(|| {
                        i += 1;
                        let at = (i * BATCH) % (OPS - BATCH);
                        black_box(run_ops_unsync(&mut map, &streams[0][at..at + BATCH]))
                    })
                });
            }
            group.finish();
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = mixes
}
criterion_main!(benches);
