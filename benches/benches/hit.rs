//! Hit latency: runcache against papaya, quick_cache, moka and an unsynchronized `HashMap`,
//! all with foldhash, measured in the same run.
//!
//! - `hit/1-thread/*`: one thread, 10,000 cached keys looked up in a shuffled order.
//! - `hit/2-threads/*`: the same on two threads at once (each thread its own order).
//! - `*-ttl-arc`, `*-tti-arc`: runcache and moka with a time to live or to idle of an hour
//!   (nothing expires during the run): what reading each entry's deadline costs a hit, and
//!   for a time to idle what moving it costs; `*-ticking-arc` the same on runcache's
//!   `Clock::ticking` (one load for the time, against the coarse clock's call).
//!
//! One iteration is a batch of `BATCH` lookups (`Throughput::Elements(BATCH)`), so criterion
//! reports lookups per second. `Arc` subjects clone the value (`get`); pinned subjects borrow
//! it under one pin per batch (runcache `pin().get`, papaya `pin().get`).
//! `floor-epoch-pin-hashmap-arc` is not a peer: an unsynchronized `HashMap` of `Arc`s read
//! under a crossbeam-epoch pin per lookup, with the `Arc` cloned. A table that crossbeam-epoch
//! reclaims is not expected to do an `Arc` get for less (its lookup beating std's
//! unsynchronized one), so quick_cache's time over this one bounds the `Arc` target.
//!
//! ```text
//! cargo bench -p runcache-bench --bench hit                 # full run
//! cargo bench -p runcache-bench --bench hit -- --quick      # a quick look
//! ```

use runcache_bench as support;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

const KEYS: u64 = 10_000;
const BATCH: usize = 1024;
/// The expiring subjects' time: nothing expires during a run.
const HOUR: Duration = Duration::from_secs(3_600);

use support::{on_threads, Hasher};

/// Keys in a shuffled order (a fixed xorshift permutation per seed).
fn order(seed: u64) -> Vec<u64> {
    let mut keys: Vec<u64> = (0..KEYS).collect();
    let mut s = seed | 1;
    for i in (1..keys.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        keys.swap(i, (s % (i as u64 + 1)) as usize);
    }
    keys
}

/// Every subject, filled with the same keys.
struct Subjects {
    runcache: runcache::Cache<u64, u64>,
    /// The same cache refusing instead of evicting: the evicting one's hits must stay within
    /// 10% of it (the frequency bump must not cost a shared write per hit).
    reject: runcache::Cache<u64, u64>,
    /// OpenVINO-style multi-cache: its hit must stay within 0.8x of the core `Arc` hit.
    multi: runcache::multi::MultiCache,
    /// Grouped cache (session, group, name): its hit must stay within 0.8x of the core hit.
    grouped: runcache::grouped::GroupedCache<u32, u32, u64, u64>,
    papaya: papaya::HashMap<u64, u64, Hasher>,
    quick: quick_cache::sync::Cache<u64, Arc<u64>>,
    moka: moka::sync::Cache<u64, Arc<u64>, Hasher>,
    /// runcache and moka with a time to live, then a time to idle.
    ttl: runcache::Cache<u64, u64>,
    tti: runcache::Cache<u64, u64>,
    ttl_ticking: runcache::Cache<u64, u64>,
    tti_ticking: runcache::Cache<u64, u64>,
    moka_ttl: moka::sync::Cache<u64, Arc<u64>, Hasher>,
    moka_tti: moka::sync::Cache<u64, Arc<u64>, Hasher>,
    map: HashMap<u64, u64, Hasher>,
    /// The same keys as `Arc`s, read under a crossbeam-epoch pin per lookup: the floor of an
    /// `Arc` get for any table that crossbeam-epoch reclaims (see `get_batch_floor_arc`).
    map_arc: HashMap<u64, Arc<u64>, Hasher>,
}

impl Subjects {
    fn new() -> Self {
        let s = Subjects {
            runcache: runcache::Cache::builder()
                .capacity(KEYS * 2)
                .build()
                .unwrap(),
            reject: runcache::Cache::builder()
                .capacity(KEYS * 2)
                .when_full(runcache::WhenFull::Reject)
                .build()
                .unwrap(),
            multi: runcache::multi::MultiCache::new(KEYS * 2),
            grouped: runcache::grouped::GroupedCache::new(0),
            papaya: papaya::HashMap::with_hasher(Hasher::default()),
            quick: quick_cache::sync::Cache::new(KEYS as usize * 2),
            moka: moka::sync::Cache::builder()
                .max_capacity(KEYS * 2)
                .build_with_hasher(Hasher::default()),
            ttl: runcache::Cache::builder()
                .capacity(KEYS * 2)
                .time_to_live(HOUR)
                .build()
                .unwrap(),
            tti: runcache::Cache::builder()
                .capacity(KEYS * 2)
                .time_to_idle(HOUR)
                .build()
                .unwrap(),
            ttl_ticking: runcache::Cache::builder()
                .capacity(KEYS * 2)
                .time_to_live(HOUR)
                .clock(runcache::Clock::ticking().expect("a clock thread"))
                .build()
                .unwrap(),
            tti_ticking: runcache::Cache::builder()
                .capacity(KEYS * 2)
                .time_to_idle(HOUR)
                .clock(runcache::Clock::ticking().expect("a clock thread"))
                .build()
                .unwrap(),
            moka_ttl: moka::sync::Cache::builder()
                .max_capacity(KEYS * 2)
                .time_to_live(HOUR)
                .build_with_hasher(Hasher::default()),
            moka_tti: moka::sync::Cache::builder()
                .max_capacity(KEYS * 2)
                .time_to_idle(HOUR)
                .build_with_hasher(Hasher::default()),
            map: HashMap::with_hasher(Hasher::default()),
            map_arc: HashMap::with_hasher(Hasher::default()),
        };
        for k in 0..KEYS {
            s.runcache.insert(k, k).unwrap();
            s.reject.insert(k, k).unwrap();
            s.multi.get_or_create(&k, |k| *k);
            s.grouped.set(&0, &((k % 100) as u32), &k, k);
            s.papaya.pin().insert(k, k);
            s.quick.insert(k, Arc::new(k));
            s.moka.insert(k, Arc::new(k));
            s.ttl.insert(k, k).unwrap();
            s.tti.insert(k, k).unwrap();
            s.ttl_ticking.insert(k, k).unwrap();
            s.tti_ticking.insert(k, k).unwrap();
            s.moka_ttl.insert(k, Arc::new(k));
            s.moka_tti.insert(k, Arc::new(k));
        }
        let mut s = s;
        for k in 0..KEYS {
            s.map.insert(k, k);
            s.map_arc.insert(k, Arc::new(k));
        }
        s.moka.run_pending_tasks();
        s.moka_ttl.run_pending_tasks();
        s.moka_tti.run_pending_tasks();
        s
    }
}

/// One batch of lookups through `subject`, starting at `at` in `keys`.
fn batch(subjects: &Subjects, subject: &str, keys: &[u64], at: usize) -> u64 {
    // A batch is a contiguous slice of the order, so choosing it costs nothing. (Skipping
    // into a cycled iterator walked up to `KEYS` elements per batch: a cost every subject
    // paid, which pulled every ratio towards 1.)
    let start = at % (keys.len() - BATCH + 1);
    let keys = &keys[start..start + BATCH];
    let mut sum = 0u64;
    match subject {
        "runcache-arc" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.runcache.get(k).unwrap());
            }
        }
        "grouped-get" => {
            for k in keys {
                let group = (*k % 100) as u32;
                sum = sum.wrapping_add(*subjects.grouped.get(&0, &group, k).unwrap());
            }
        }
        "multi-get_or_create" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.multi.get_or_create(k, |k| *k).0);
            }
        }
        "runcache-reject-arc" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.reject.get(k).unwrap());
            }
        }
        "runcache-pinned" => {
            let pinned = subjects.runcache.pin();
            for k in keys {
                sum = sum.wrapping_add(*pinned.get(k).unwrap());
            }
        }
        "papaya-pinned" => {
            let pinned = subjects.papaya.pin();
            for k in keys {
                sum = sum.wrapping_add(*pinned.get(k).unwrap());
            }
        }
        "quick_cache-arc" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.quick.get(k).unwrap());
            }
        }
        "moka-arc" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.moka.get(k).unwrap());
            }
        }
        "runcache-ttl-arc" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.ttl.get(k).unwrap());
            }
        }
        "runcache-tti-arc" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.tti.get(k).unwrap());
            }
        }
        "runcache-ttl-ticking-arc" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.ttl_ticking.get(k).unwrap());
            }
        }
        "runcache-tti-ticking-arc" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.tti_ticking.get(k).unwrap());
            }
        }
        "moka-ttl-arc" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.moka_ttl.get(k).unwrap());
            }
        }
        "moka-tti-arc" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.moka_tti.get(k).unwrap());
            }
        }
        "floor-epoch-pin-hashmap-arc" => {
            sum = sum.wrapping_add(support::get_batch_floor_arc(&subjects.map_arc, keys));
        }
        "hashmap-unsync" => {
            for k in keys {
                sum = sum.wrapping_add(*subjects.map.get(k).unwrap());
            }
        }
        other => unreachable!("unknown subject {other}"),
    }
    sum
}

const SUBJECTS: [&str; 16] = [
    "runcache-pinned",
    "runcache-arc",
    "runcache-reject-arc",
    "multi-get_or_create",
    "grouped-get",
    "papaya-pinned",
    "quick_cache-arc",
    "moka-arc",
    "runcache-ttl-arc",
    "runcache-tti-arc",
    "runcache-ttl-ticking-arc",
    "runcache-tti-ticking-arc",
    "moka-ttl-arc",
    "moka-tti-arc",
    "hashmap-unsync",
    "floor-epoch-pin-hashmap-arc",
];

fn hits(c: &mut Criterion) {
    let subjects = Subjects::new();
    let keys = order(7);

    let mut one = c.benchmark_group("hit/1-thread");
    one.throughput(Throughput::Elements(BATCH as u64));
    for subject in SUBJECTS {
        one.bench_function(BenchmarkId::from_parameter(subject), |b| {
            let mut at = 0;
            b.iter(|| {
                at += BATCH;
                black_box(batch(&subjects, subject, &keys, at))
            })
        });
    }
    one.finish();

    // The unsynchronized map cannot be shared for writes, but reads from two threads are fine.
    let mut two = c.benchmark_group("hit/2-threads");
    two.throughput(Throughput::Elements(2 * BATCH as u64));
    let orders = [order(7), order(11)];
    for subject in SUBJECTS {
        two.bench_function(BenchmarkId::from_parameter(subject), |b| {
            b.iter_custom(|iters| {
                on_threads(2, iters, |t, i| {
                    black_box(batch(&subjects, subject, &orders[t], i as usize * BATCH));
                })
            })
        });
    }
    two.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = hits
}
criterion_main!(benches);
