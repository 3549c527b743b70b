//! runcache's benchmark harness: the workloads, subjects and plots shared by the criterion
//! benches (`benches/benches/*.rs`) and the two tools, `compare` (every workload against the
//! peers; regenerates `docs/BENCHMARKS.md` and its plots) and `trace` (hit ratios on traces).
//!
//! Every subject is a concurrent map or cache behind one small trait, so each workload runs
//! the same code against runcache and its peers. Values are `Arc<u64>` where the peer hands
//! values out by clone (quick_cache, moka, dashmap), so an `Arc` get is compared with an `Arc`
//! get; runcache's own `get` returns an `Arc` too.
#![allow(dead_code)]

pub mod gdsf;
pub mod wtinylfu;

use plotters::prelude::*;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The hasher of every subject that takes one, and of the unsynchronized `HashMap`.
pub type Hasher = foldhash::fast::RandomState;

/// `len` keys drawn uniformly from `0..keys`.
pub fn uniform_keys(keys: u64, len: usize, seed: u64) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(0..keys)).collect()
}

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

/// runcache's `get`, which hands out a counted `Handle` (an `Arc` before the value moved into
/// the node; the subject keeps its name so the rows and plots keep theirs).
pub struct RuncacheArc(pub runcache::Cache<u64, u64>);
/// runcache's `get_cloned`, which copies the value out under the pin (no count written).
pub struct RuncacheCloned(pub runcache::Cache<u64, u64>);
/// runcache's `pin().get`, which borrows the value with no reference-count write.
pub struct RuncachePinned(pub runcache::Cache<u64, u64>);
/// papaya's `pin().get` (it has no `Arc` get).
pub struct Papaya(pub papaya::HashMap<u64, u64, Hasher>);
/// papaya's `pin().get` over values stored as `Arc<u64>`, as runcache stores them: the same
/// lookup as [`Papaya`] plus the dereference of the value's own allocation.
pub struct PapayaArc(pub papaya::HashMap<u64, Arc<u64>, Hasher>);
/// quick_cache's `get` (clones the `Arc`).
pub struct QuickCache(pub quick_cache::sync::Cache<u64, Arc<u64>>);
/// quick_cache's `get` over values stored inline (copies the `u64` out).
pub struct QuickCacheInline(pub quick_cache::sync::Cache<u64, u64>);
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

/// The time to live of the `*-ttl` subjects and the time to idle of the `*-tti` ones: an
/// hour, so that a run expires nothing and measures what keeping the deadlines costs.
pub const SUBJECT_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// A runcache subject that expires entries after [`SUBJECT_TTL`]: from their write, or from
/// their last read (`idle`), on `Clock::ticking` or the default clock.
fn runcache_expiring(capacity: u64, idle: bool, ticking: bool) -> runcache::Cache<u64, u64> {
    let b = runcache::Cache::builder().capacity(capacity);
    let b = if idle {
        b.time_to_idle(SUBJECT_TTL)
    } else {
        b.time_to_live(SUBJECT_TTL)
    };
    let b = if ticking {
        b.clock(runcache::Clock::ticking().expect("a clock thread"))
    } else {
        b
    };
    b.build().expect("a valid configuration")
}

/// moka with the same setting as [`runcache_expiring`] (its own clock).
fn moka_expiring(capacity: u64, idle: bool) -> moka::sync::Cache<u64, Arc<u64>, Hasher> {
    let b = moka::sync::Cache::builder().max_capacity(capacity);
    let b = if idle {
        b.time_to_idle(SUBJECT_TTL)
    } else {
        b.time_to_live(SUBJECT_TTL)
    };
    b.build_with_hasher(Hasher::default())
}

impl Subject for RuncacheArc {
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some_and(|v| *v == k)
    }
    fn insert(&self, k: u64, v: u64) {
        // The old value is not wanted: `put` takes no count of it, as quick_cache's and
        // moka's inserts return nothing.
        let _ = self.0.put(k, v);
    }
    fn remove(&self, k: u64) {
        self.0.invalidate(&k);
    }
}

impl Subject for RuncacheCloned {
    fn get(&self, k: u64) -> bool {
        self.0.get_cloned(&k) == Some(k)
    }
    fn insert(&self, k: u64, v: u64) {
        // The old value is not wanted: `put` takes no count of it, as quick_cache's and
        // moka's inserts return nothing.
        let _ = self.0.put(k, v);
    }
    fn remove(&self, k: u64) {
        self.0.invalidate(&k);
    }
}

impl Subject for QuickCacheInline {
    fn get(&self, k: u64) -> bool {
        self.0.get(&k) == Some(k)
    }
    fn insert(&self, k: u64, v: u64) {
        self.0.insert(k, v);
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
        // The old value is not wanted: `put` takes no count of it, as quick_cache's and
        // moka's inserts return nothing.
        let _ = self.0.put(k, v);
    }
    fn remove(&self, k: u64) {
        self.0.invalidate(&k);
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

/// The evicting subjects with a time to live ([`SUBJECT_TTL`]), for churn; runcache on its
/// default clock and on `Clock::ticking`.
pub const TTL_SUBJECTS: [&str; 3] = ["runcache-ttl", "runcache-ttl-ticking", "moka-ttl"];

/// A subject by name, holding up to `capacity` entries (no peer evicts below it).
pub fn subject(name: &str, capacity: u64) -> Box<dyn Subject> {
    match name {
        "runcache" => Box::new(RuncacheArc(runcache_with(capacity))),
        "runcache-pinned" => Box::new(RuncachePinned(runcache_with(capacity))),
        "runcache-cloned" => Box::new(RuncacheCloned(runcache_with(capacity))),
        "runcache-ttl" => Box::new(RuncacheArc(runcache_expiring(capacity, false, false))),
        "runcache-ttl-ticking" => Box::new(RuncacheArc(runcache_expiring(capacity, false, true))),
        "runcache-tti" => Box::new(RuncacheArc(runcache_expiring(capacity, true, false))),
        "runcache-tti-ticking" => Box::new(RuncacheArc(runcache_expiring(capacity, true, true))),
        "moka-ttl" => Box::new(Moka(moka_expiring(capacity, false))),
        "moka-tti" => Box::new(Moka(moka_expiring(capacity, true))),
        "quick_cache-inline" => Box::new(QuickCacheInline(quick_cache::sync::Cache::new(
            capacity as usize,
        ))),
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

/// The x axis of a chart.
pub enum XAxis<'a> {
    /// Category labels, spaced evenly (thread counts, capacities).
    Categories(&'a [String]),
    /// Numbers on a linear scale (accesses into a replay).
    Linear {
        /// The x value of each position.
        values: &'a [f64],
        /// What the axis measures.
        label: &'a str,
    },
    /// Numbers on a logarithmic scale (capacities over several decades).
    Log {
        /// The x value of each position.
        values: &'a [f64],
        /// What the axis measures.
        label: &'a str,
    },
}

/// Line colours, one per series, in order.
const COLORS: [RGBColor; 11] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0x00, 0x00, 0x00),
    RGBColor(0x88, 0x88, 0x88),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0xbc, 0xbd, 0x22),
];

/// Draws a chart's legend in its upper left corner.
fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

/// Draws the mesh (`x_labels` labels on the x axis, described by `x_desc`; the y axis by
/// `y_desc`) and one line per series at the x `values`, with the legend.
fn lines<'a, X>(
    chart: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<X, plotters::coord::types::RangedCoordf64>,
    >,
    (x_labels, x_desc, y_desc): (usize, &str, &str),
    values: &[f64],
    series: &[Series],
) -> Result<(), String>
where
    X: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_labels(x_labels)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| e.to_string())?;
    for (j, s) in series.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        let points = values.iter().copied().zip(s.values.iter().copied());
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    legend(chart)
}

/// A line chart as SVG text, drawn with plotters: y from 0 to the largest value (or `y_max`),
/// one line per series with a legend.
pub fn line_chart(
    title: &str,
    y_label: &str,
    x: XAxis<'_>,
    series: &[Series],
    y_max: Option<f64>,
) -> Result<String, String> {
    let top = y_max.unwrap_or_else(|| {
        series
            .iter()
            .flat_map(|s| s.values.iter().copied())
            .fold(0.0, f64::max)
            * 1.1
    });
    let top = if top > 0.0 { top } else { 1.0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56);
        match x {
            XAxis::Categories(labels) => {
                let n = labels.len().max(1);
                let mut chart = builder
                    .build_cartesian_2d(0..n - 1, 0.0..top)
                    .map_err(|e| e.to_string())?;
                chart
                    .configure_mesh()
                    .x_labels(n)
                    .x_label_formatter(&|i| labels.get(*i).cloned().unwrap_or_default())
                    .light_line_style(WHITE)
                    .y_desc(y_label)
                    .draw()
                    .map_err(|e| e.to_string())?;
                for (j, s) in series.iter().enumerate() {
                    let color = COLORS[j % COLORS.len()];
                    let points = s.values.iter().enumerate().map(|(i, v)| (i, *v));
                    chart
                        .draw_series(LineSeries::new(points, color.stroke_width(2)))
                        .map_err(|e| e.to_string())?
                        .label(s.label.as_str())
                        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
                }
                legend(&mut chart)?;
            }
            XAxis::Linear { values, label } => {
                let hi = values.iter().copied().fold(1.0, f64::max);
                let mut chart = builder
                    .build_cartesian_2d(0.0..hi, 0.0..top)
                    .map_err(|e| e.to_string())?;
                lines(&mut chart, (6, label, y_label), values, series)?;
            }
            XAxis::Log { values, label } => {
                let lo = values.iter().copied().fold(f64::MAX, f64::min).max(1.0);
                let hi = values.iter().copied().fold(1.0, f64::max).max(lo * 10.0);
                let mut chart = builder
                    .build_cartesian_2d((lo..hi).log_scale(), 0.0..top)
                    .map_err(|e| e.to_string())?;
                lines(
                    &mut chart,
                    (values.len().min(8), label, y_label),
                    values,
                    series,
                )?;
            }
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}
