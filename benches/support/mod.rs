//! Workloads, subjects and plots shared by the criterion benches (`benches/*.rs`) and the
//! comparison runner (`examples/compare.rs`, which includes this file by path).
//!
//! Every subject is a concurrent map or cache behind one small trait, so each workload runs
//! the same code against runcache and its peers. Values are `Arc<u64>` where the peer hands
//! values out by clone (quick_cache, moka, dashmap), so an `Arc` get is compared with an `Arc`
//! get; runcache's own `get` returns an `Arc` too.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The hasher of every subject that takes one, and of the unsynchronized `HashMap`.
pub type Hasher = foldhash::fast::RandomState;

/// `len` keys in `0..keys` drawn from a Zipf distribution with exponent `s` (rank 1 is key 0).
pub fn zipf_keys(keys: u64, s: f64, len: usize, seed: u64) -> Vec<u64> {
    let dist = rand_distr::Zipf::new(keys as f64, s).expect("valid Zipf parameters");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.sample(dist) as u64 - 1).collect()
}

/// A concurrent map or cache under test.
pub trait Subject: Send + Sync {
    /// Looks `k` up (reading the value); whether it was there.
    fn get(&self, k: u64) -> bool;
    /// Inserts or replaces.
    fn insert(&self, k: u64, v: u64);
    /// Removes.
    fn remove(&self, k: u64);
    /// Looks every key of `keys` up, under one guard where the subject has guards; returns
    /// the hits.
    fn get_batch(&self, keys: &[u64]) -> u64 {
        keys.iter().map(|k| u64::from(self.get(*k))).sum()
    }
    /// Gets `k`, inserting it on a miss (a cache's get-or-insert); whether it hit.
    fn access(&self, k: u64) -> bool {
        if self.get(k) {
            return true;
        }
        self.insert(k, k);
        false
    }
}

/// runcache's `get`, which hands out an `Arc`.
pub struct RuncacheArc(pub runcache::Cache<u64, u64>);
/// runcache's `pin().get`, which borrows the value with no reference-count write.
pub struct RuncachePinned(pub runcache::Cache<u64, u64>);
/// papaya's `pin().get` (it has no `Arc` get).
pub struct Papaya(pub papaya::HashMap<u64, u64, Hasher>);
/// papaya's `pin().get` over values stored as `Arc<u64>`, as runcache stores them: the same
/// lookup as [`Papaya`] plus the dereference of the value's own allocation.
pub struct PapayaArc(pub papaya::HashMap<u64, Arc<u64>, Hasher>);
/// quick_cache's `get` (clones the `Arc`).
pub struct QuickCache(pub quick_cache::sync::Cache<u64, Arc<u64>>);
/// moka's `get` (clones the `Arc`).
pub struct Moka(pub moka::sync::Cache<u64, Arc<u64>, Hasher>);
/// dashmap's `get`, cloning the `Arc` out of the shard's read guard.
pub struct Dash(pub dashmap::DashMap<u64, Arc<u64>, Hasher>);

fn runcache_with(capacity: u64) -> runcache::Cache<u64, u64> {
    runcache::Cache::builder()
        .capacity(capacity)
        .build()
        .expect("the default shard count is valid")
}

impl Subject for RuncacheArc {
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some_and(|v| *v == k)
    }
    fn insert(&self, k: u64, v: u64) {
        let _ = self.0.insert(k, v);
    }
    fn remove(&self, k: u64) {
        self.0.remove(&k);
    }
}

impl Subject for RuncachePinned {
    fn get(&self, k: u64) -> bool {
        self.0.pin().get(&k).is_some_and(|v| *v == k)
    }
    fn insert(&self, k: u64, v: u64) {
        let _ = self.0.insert(k, v);
    }
    fn remove(&self, k: u64) {
        self.0.remove(&k);
    }
    fn get_batch(&self, keys: &[u64]) -> u64 {
        let pinned = self.0.pin();
        keys.iter()
            .map(|k| u64::from(pinned.get(k).is_some_and(|v| v == k)))
            .sum()
    }
}

impl Subject for Papaya {
    fn get(&self, k: u64) -> bool {
        self.0.pin().get(&k).is_some_and(|v| *v == k)
    }
    fn insert(&self, k: u64, v: u64) {
        self.0.pin().insert(k, v);
    }
    fn remove(&self, k: u64) {
        self.0.pin().remove(&k);
    }
    fn get_batch(&self, keys: &[u64]) -> u64 {
        let pinned = self.0.pin();
        keys.iter()
            .map(|k| u64::from(pinned.get(k).is_some_and(|v| v == k)))
            .sum()
    }
}

impl Subject for PapayaArc {
    fn get(&self, k: u64) -> bool {
        self.0.pin().get(&k).is_some_and(|v| **v == k)
    }
    fn insert(&self, k: u64, v: u64) {
        self.0.pin().insert(k, Arc::new(v));
    }
    fn remove(&self, k: u64) {
        self.0.pin().remove(&k);
    }
    fn get_batch(&self, keys: &[u64]) -> u64 {
        let pinned = self.0.pin();
        keys.iter()
            .map(|k| u64::from(pinned.get(k).is_some_and(|v| **v == *k)))
            .sum()
    }
}

impl Subject for QuickCache {
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some_and(|v| *v == k)
    }
    fn insert(&self, k: u64, v: u64) {
        self.0.insert(k, Arc::new(v));
    }
    fn remove(&self, k: u64) {
        self.0.remove(&k);
    }
}

impl Subject for Moka {
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some_and(|v| *v == k)
    }
    fn insert(&self, k: u64, v: u64) {
        self.0.insert(k, Arc::new(v));
    }
    fn remove(&self, k: u64) {
        self.0.invalidate(&k);
    }
}

impl Subject for Dash {
    fn get(&self, k: u64) -> bool {
        self.0
            .get(&k)
            .map(|r| Arc::clone(r.value()))
            .is_some_and(|v| *v == k)
    }
    fn insert(&self, k: u64, v: u64) {
        self.0.insert(k, Arc::new(v));
    }
    fn remove(&self, k: u64) {
        self.0.remove(&k);
    }
}

/// The subjects compared in the map workloads (mixes and hits), by name.
pub const MAP_SUBJECTS: [&str; 6] = [
    "runcache",
    "runcache-pinned",
    "papaya",
    "quick_cache",
    "moka",
    "dashmap",
];

/// The subjects that evict (churn, hit ratio).
pub const CACHE_SUBJECTS: [&str; 3] = ["runcache", "quick_cache", "moka"];

/// A subject by name, holding up to `capacity` entries (no peer evicts below it).
pub fn subject(name: &str, capacity: u64) -> Box<dyn Subject> {
    match name {
        "runcache" => Box::new(RuncacheArc(runcache_with(capacity))),
        "runcache-pinned" => Box::new(RuncachePinned(runcache_with(capacity))),
        "papaya" => Box::new(Papaya(papaya::HashMap::with_hasher(Hasher::default()))),
        "papaya-arc" => Box::new(PapayaArc(papaya::HashMap::with_hasher(Hasher::default()))),
        "quick_cache" => Box::new(QuickCache(quick_cache::sync::Cache::new(capacity as usize))),
        "moka" => Box::new(Moka(
            moka::sync::Cache::builder()
                .max_capacity(capacity)
                .build_with_hasher(Hasher::default()),
        )),
        "dashmap" => Box::new(Dash(dashmap::DashMap::with_hasher(Hasher::default()))),
        other => unreachable!("unknown subject {other}"),
    }
}

/// A conc-map-bench operation mix, in percent.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    pub name: &'static str,
    pub read: u8,
    pub insert: u8,
    pub remove: u8,
    pub update: u8,
}

/// The three mixes of conc-map-bench.
pub const MIXES: [Mix; 3] = [
    Mix {
        name: "read-heavy",
        read: 98,
        insert: 1,
        remove: 1,
        update: 0,
    },
    Mix {
        name: "exchange",
        read: 10,
        insert: 40,
        remove: 40,
        update: 10,
    },
    Mix {
        name: "rapid-grow",
        read: 5,
        insert: 80,
        remove: 5,
        update: 10,
    },
];

/// Keys of the mixes: half of them are present after the prefill.
pub const MIX_KEYS: u64 = 1 << 17;

/// One operation of a mix.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Read(u64),
    Insert(u64),
    Remove(u64),
    Update(u64),
}

/// `len` operations of `mix` over uniform keys in `0..MIX_KEYS`.
pub fn mix_ops(mix: Mix, len: usize, seed: u64) -> Vec<Op> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len)
        .map(|_| {
            let k = rng.random_range(0..MIX_KEYS);
            let p = rng.random_range(0..100u8);
            if p < mix.read {
                Op::Read(k)
            } else if p < mix.read + mix.insert {
                Op::Insert(k)
            } else if p < mix.read + mix.insert + mix.remove {
                Op::Remove(k)
            } else {
                Op::Update(k)
            }
        })
        .collect()
}

/// A subject for a mix, prefilled with every even key; capacity twice the key space, so no
/// cache evicts.
pub fn mix_subject(name: &str) -> Box<dyn Subject> {
    let s = subject(name, MIX_KEYS * 2);
    for k in (0..MIX_KEYS).step_by(2) {
        s.insert(k, k);
    }
    s
}

/// Applies `ops` to `s`.
pub fn run_ops(s: &dyn Subject, ops: &[Op]) -> u64 {
    let mut hits = 0;
    for op in ops {
        match *op {
            Op::Read(k) => hits += u64::from(s.get(k)),
            Op::Insert(k) | Op::Update(k) => s.insert(k, k),
            Op::Remove(k) => s.remove(k),
        }
    }
    hits
}

/// The unsynchronized baseline of a mix: a `HashMap` with the same hasher, one thread.
pub fn run_ops_unsync(map: &mut HashMap<u64, u64, Hasher>, ops: &[Op]) -> u64 {
    let mut hits = 0;
    for op in ops {
        match *op {
            Op::Read(k) => hits += u64::from(map.get(&k).is_some_and(|v| *v == k)),
            Op::Insert(k) | Op::Update(k) => {
                map.insert(k, k);
            }
            Op::Remove(k) => {
                map.remove(&k);
            }
        }
    }
    hits
}

/// A prefilled unsynchronized baseline for the mixes.
pub fn mix_unsync() -> HashMap<u64, u64, Hasher> {
    let mut map = HashMap::with_hasher(Hasher::default());
    for k in (0..MIX_KEYS).step_by(2) {
        map.insert(k, k);
    }
    map
}

/// Runs `work(thread, iteration)` `iters` times on each of `threads` threads, started
/// together; returns the time from the first thread's start to the last one's end.
///
/// Each thread takes its own timestamps: with more threads than cores, the thread that
/// released the barrier may not run again until the others are done, so its clock would miss
/// most of the work.
pub fn on_threads(threads: usize, iters: u64, work: impl Fn(usize, u64) + Sync) -> Duration {
    let start = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (start, work) = (&start, &work);
                s.spawn(move || {
                    start.wait();
                    let t0 = Instant::now();
                    for i in 0..iters {
                        work(t, i);
                    }
                    (t0, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a bench thread panicked"))
            .collect()
    });
    let first = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let last = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    last - first
}

/// The unsynchronized baseline of a hit batch: looks every key of `keys` up in `map`;
/// returns the hits.
pub fn get_batch_unsync(map: &HashMap<u64, u64, Hasher>, keys: &[u64]) -> u64 {
    keys.iter()
        .map(|k| u64::from(map.get(k).is_some_and(|v| v == k)))
        .sum()
}

/// The unsynchronized lookup over values stored as `Arc<u64>`.
pub fn get_batch_unsync_arc(map: &HashMap<u64, Arc<u64>, Hasher>, keys: &[u64]) -> u64 {
    keys.iter()
        .map(|k| u64::from(map.get(k).is_some_and(|v| **v == *k)))
        .sum()
}

/// The floor of an `Arc` get under the mandates: per lookup, a crossbeam-epoch pin
/// (its own thread-local fast path, `crossbeam_epoch::pin`: what any table reclaimed by
/// crossbeam-epoch pays per `get`) around an unsynchronized `HashMap` lookup and an `Arc`
/// clone. A concurrent table's lookup is not expected to beat std's unsynchronized one
/// (neither runcache's nor papaya's does), so a peer's figure divided by this one bounds
/// what such a design can reach against that peer.
pub fn get_batch_floor_arc(map: &HashMap<u64, Arc<u64>, Hasher>, keys: &[u64]) -> u64 {
    keys.iter()
        .map(|k| {
            let guard = crossbeam_epoch::pin();
            let value = map.get(k).cloned();
            drop(guard);
            u64::from(value.is_some_and(|v| *v == *k))
        })
        .sum()
}

/// A subject for hit benches: `keys` keys, all present, capacity twice that.
pub fn hit_subject(name: &str, keys: u64) -> Box<dyn Subject> {
    let s = subject(name, keys * 2);
    for k in 0..keys {
        s.insert(k, k);
    }
    s
}

/// One series of a line chart: a label and a y value per x position.
pub struct Series {
    pub label: String,
    pub values: Vec<f64>,
}

/// A line chart as SVG text: `xs` are category labels spaced evenly, y from 0 to the largest
/// value (or `y_max`).
pub fn line_chart(
    title: &str,
    y_label: &str,
    xs: &[String],
    series: &[Series],
    y_max: Option<f64>,
) -> String {
    let (w, h, m) = (720.0, 420.0, 60.0);
    let top = y_max.unwrap_or_else(|| {
        series
            .iter()
            .flat_map(|s| s.values.iter().copied())
            .fold(0.0, f64::max)
            * 1.1
    });
    let top = if top > 0.0 { top } else { 1.0 };
    let n = xs.len().max(2) - 1;
    let x = |i: usize| m + i as f64 / n as f64 * (w - 2.0 * m - 130.0);
    let y = |v: f64| h - m - v / top * (h - 2.0 * m);
    let colors = [
        "#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#000000",
    ];
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n\
         <rect width='100%' height='100%' fill='white'/>\n\
         <text x='{m}' y='24' font-size='15'>{title}</text>\n\
         <text x='14' y='{}' transform='rotate(-90 14 {})' text-anchor='middle'>{y_label}</text>\n\
         <line x1='{m}' y1='{}' x2='{}' y2='{}' stroke='black'/>\n\
         <line x1='{m}' y1='{m}' x2='{m}' y2='{}' stroke='black'/>\n",
        h / 2.0,
        h / 2.0,
        h - m,
        w - m - 130.0,
        h - m,
        h - m
    );
    for i in 0..=4 {
        let v = top * i as f64 / 4.0;
        let yy = y(v);
        let _ = writeln!(
            svg,
            "<text x='{}' y='{}' text-anchor='end'>{}</text>\n<line x1='{m}' y1='{yy}' x2='{}' y2='{yy}' stroke='#eee'/>",
            m - 6.0,
            yy + 4.0,
            short(v),
            w - m - 130.0
        );
    }
    for (i, label) in xs.iter().enumerate() {
        let _ = writeln!(
            svg,
            "<text x='{}' y='{}' text-anchor='middle'>{label}</text>",
            x(i),
            h - m + 16.0
        );
    }
    for (j, s) in series.iter().enumerate() {
        let color = colors[j % colors.len()];
        let points: Vec<String> = s
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill='none' stroke='{color}' stroke-width='2' points='{}'/>",
            points.join(" ")
        );
        let _ = writeln!(
            svg,
            "<text x='{}' y='{}' fill='{color}'>{}</text>",
            w - m - 120.0,
            m + 16.0 * j as f64,
            s.label
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// A compact number for axis labels.
fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
