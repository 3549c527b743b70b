//! Reserving and returning a cached 4 MiB scratch pool against allocating and freeing a 4 MiB
//! zeroed buffer per run (what a primitive without a pool manager does), in the same run.

use criterion::{criterion_group, criterion_main, Criterion};
use runcache::pool::PoolManager;
use std::hint::black_box;
use std::time::Duration;

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

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    targets = pools
}
criterion_main!(benches);
