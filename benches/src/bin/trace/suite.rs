//! The training suite (`trace --suite`): every real trace in the trace folder at 1%, 5% and
//! 10% of its unique keys (and 0.1%, 0.25% and 0.5% for traces over 100,000 unique keys),
//! beside the synthetic workloads, with runcache replayed under several hasher seeds and
//! judged at its worst seed. A summary per family and over everything: cells held, mean
//! margin to the best of moka and quick_cache, worst cell, widest spread over seeds, and the
//! mean against the reference W-TinyLFU.
//!
//! How the peers are held: moka at its capacity (its pending evictions applied after every
//! insert), and replayed [`PEER_RUNS`] times on short traces. runcache's seeds are the first of
//! a random stream of 64-bit seeds, as the default hasher's are (consecutive small seeds hash
//! a trace's dense keys nearly alike and hide the spread).

use crate::load::{load, matrix_workloads, unique, Trace};
use crate::policies::{lru, moka, moka_buffered, quick_cache, runcache, seeded, tinyufo};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The real traces of the suite (the files of `shared/traces/`), each with its family.
pub const REAL: &[(&str, &str)] = &[
    ("OLTP.lis.zst", "database"),
    ("orm-busy.trace.zst", "database"),
    ("P3.lis.zst", "disk"),
    ("2_pools.trace.zst", "programs (LIRS)"),
    ("cpp.trace.zst", "programs (LIRS)"),
    ("cs.trace.zst", "programs (LIRS)"),
    ("gli.trace.zst", "programs (LIRS)"),
    ("multi1.trace.zst", "programs (LIRS)"),
    ("multi2.trace.zst", "programs (LIRS)"),
    ("ps.trace.zst", "programs (LIRS)"),
    ("sprite.trace.zst", "programs (LIRS)"),
    ("loop.trace.zst", "patterns (LIRS)"),
    ("scan.trace.zst", "patterns (LIRS)"),
    ("zigzag.trace.zst", "patterns (LIRS)"),
    ("web07.trace.zst", "web"),
    ("gcc.trace.zst", "CPU addresses"),
    ("swim.trace.zst", "CPU addresses"),
    ("scarab-recs.trace.zst", "recommendations"),
];

/// The traces `--quick` keeps: one or two of each family, none over a million accesses.
const QUICK: &[&str] = &[
    "OLTP.lis.zst",
    "2_pools.trace.zst",
    "multi2.trace.zst",
    "sprite.trace.zst",
    "zigzag.trace.zst",
    "web07.trace.zst",
    "gcc.trace.zst",
    "zipf-0.9",
    "shift",
    "loop",
];

/// The capacities of every trace, as fractions of its unique keys.
const FRACTIONS: &[f64] = &[0.01, 0.05, 0.1];
/// The capacities added for traces over [`LARGE`] unique keys.
const SMALL_FRACTIONS: &[f64] = &[0.001, 0.0025, 0.005];
const LARGE: usize = 100_000;

/// Replays of a compared peer on a trace shorter than [`SHORT`] accesses: the rule compares
/// with the best of them. moka and quick_cache seed their hashers (and moka its sketch) at
/// random, and on the short traces one run's luck moves a cell by points (moka holding its
/// capacity on ps at 5% of its keys: 36.4 to 40.4 over five runs); longer traces move by a
/// few tenths, and one run each keeps the suite's time.
const PEER_RUNS: usize = 3;
/// See [`PEER_RUNS`].
const SHORT: usize = 200_000;

/// The hits of the best of `replay`'s runs: [`PEER_RUNS`] on a trace under [`SHORT`]
/// accesses, one on a longer one.
fn best_of(trace: &[u64], replay: impl Fn() -> u64) -> u64 {
    let runs = if trace.len() < SHORT { PEER_RUNS } else { 1 };
    (0..runs).map(|_| replay()).max().unwrap_or(0)
}

/// What `--suite` was asked for.
pub struct Suite {
    /// Where the real traces are.
    pub dir: PathBuf,
    pub quick: bool,
    /// runcache's hasher seeds: `0..seeds`.
    pub seeds: u64,
    /// `--shares NAME@FRACTION`: plot one cell's share over time instead.
    pub shares: Option<String>,
    /// `--only`: the traces or families to keep (all when empty).
    pub only: Vec<String>,
    /// `--threads`: above 1, runcache is replayed on this many threads too, under the same
    /// seeds, and each cell reports its loss from one thread.
    pub threads: usize,
    /// `--weighted`: the weighted suite (`weighted.rs`) instead.
    pub weighted: bool,
    /// `--frontier`: with `--weighted`, the size-aware references of several exponents.
    pub frontier: bool,
}

impl Suite {
    /// Whether the suite replays trace `name` of `family`.
    fn keeps(&self, name: &str, family: &str) -> bool {
        (self.only.is_empty() || self.only.iter().any(|o| o == name || o == family))
            && (!self.quick || QUICK.contains(&name))
    }
}

/// One trace × capacity cell, hit ratios in %.
struct Cell {
    family: &'static str,
    trace: String,
    capacity: usize,
    fraction: f64,
    lru: f64,
    /// moka holding its capacity (`policies::moka`), the one the rule compares with.
    moka: f64,
    /// moka as built, over its capacity between its batches (`policies::moka_buffered`):
    /// reported, not compared with.
    moka_buffered: f64,
    quick: f64,
    reference: f64,
    tinyufo: f64,
    /// One per seed.
    ours: Vec<f64>,
    /// One per seed, on [`Suite::threads`] threads (empty on one thread).
    threaded: Vec<f64>,
}

impl Cell {
    fn best_peer(&self) -> f64 {
        self.moka.max(self.quick)
    }
    fn worst(&self) -> f64 {
        lowest(&self.ours)
    }
    /// The worst seed's loss from one thread to several (`None` on one thread).
    fn loss(&self) -> Option<f64> {
        (!self.threaded.is_empty()).then(|| self.worst() - lowest(&self.threaded))
    }
    fn spread(&self) -> f64 {
        self.ours.iter().copied().fold(f64::NEG_INFINITY, f64::max) - self.worst()
    }
    fn margin(&self) -> f64 {
        self.worst() - self.best_peer()
    }
    /// The margin against moka as built (and quick_cache), as the rule read before moka was
    /// held at its capacity.
    fn margin_buffered(&self) -> f64 {
        self.worst() - self.moka_buffered.max(self.quick)
    }
    /// The rule, at the worst seed: within 0.5 points of the best peer and of LRU.
    fn holds(&self) -> bool {
        self.holds_at(self.margin())
    }
    /// The rule against moka as built (see [`margin_buffered`](Self::margin_buffered)).
    fn holds_buffered(&self) -> bool {
        self.holds_at(self.margin_buffered())
    }
    /// The rule for a margin to the best peer: within 0.5 points of it and of LRU.
    fn holds_at(&self, margin: f64) -> bool {
        margin >= -0.5 && self.worst() - self.lru >= -0.5
    }
    /// The reference W-TinyLFU's margin to the best peer (one replay, no seed to take the
    /// worst of).
    fn reference_margin(&self) -> f64 {
        self.reference - self.best_peer()
    }
    /// The rule read for the reference W-TinyLFU instead of runcache: how far a
    /// Caffeine-class policy gets under the same judge.
    fn reference_holds(&self) -> bool {
        self.reference_margin() >= -0.5 && self.reference - self.lru >= -0.5
    }
}

/// The lowest of some hit ratios (a cell's worst seed).
fn lowest(ratios: &[f64]) -> f64 {
    ratios.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The subjects a cell replays; runcache once per seed.
#[derive(Clone, Copy)]
enum Subject {
    Lru,
    Moka,
    MokaBuffered,
    Quick,
    Reference,
    TinyUfo,
    Ours(u64),
    /// runcache on [`Suite::threads`] threads, under this seed.
    Threaded(u64),
}

/// Loads the suite's traces: the real ones present in the folder (a notice for each one
/// absent) and the synthetic ones.
fn traces(suite: &Suite) -> Result<Vec<(&'static str, String, Trace)>, String> {
    let mut out = Vec::new();
    let mut absent = Vec::new();
    for &(file, family) in REAL {
        if !suite.keeps(file, family) {
            continue;
        }
        let path = suite.dir.join(file);
        if !path.exists() {
            absent.push(file);
            continue;
        }
        out.push((family, file.to_string(), load(&path)?));
    }
    if !absent.is_empty() {
        println!(
            "notice: {} of the suite's real traces are absent from {} and skipped: {}",
            absent.len(),
            suite.dir.display(),
            absent.join(", ")
        );
    }
    for (name, trace) in matrix_workloads()? {
        let family = match name.as_str() {
            "zipf-0.6" | "zipf-0.9" | "zipf-1.2" => "synthetic Zipf",
            "loop" => "synthetic loop",
            "scan-mix" => "synthetic scan mix",
            _ => "synthetic moving hot set",
        };
        if suite.keeps(&name, family) {
            out.push((family, name, trace));
        }
    }
    Ok(out)
}

/// The folder of the real traces: `$RUNCACHE_TRACE_DIR`, else `shared/traces` beside the
/// repository.
pub fn default_dir() -> PathBuf {
    std::env::var_os("RUNCACHE_TRACE_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces"),
        PathBuf::from,
    )
}

/// Runs `work` on every job, on as many threads as the machine has cores, each taking the
/// next job in order; returns how many threads ran.
pub fn in_parallel<J: Sync>(jobs: &[J], work: impl Fn(&J) + Sync) -> usize {
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                while let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    work(job);
                }
            });
        }
    });
    workers
}

/// Runs the suite and prints its tables and summaries.
pub fn run(suite: &Suite) -> Result<(), String> {
    let started = std::time::Instant::now();
    let traces = traces(suite)?;
    let mut cells = Vec::new();
    let mut jobs = Vec::new();
    for (t, (family, name, trace)) in traces.iter().enumerate() {
        let uniq = unique(trace);
        let mut fractions = Vec::new();
        if uniq > LARGE && !suite.quick {
            fractions.extend_from_slice(SMALL_FRACTIONS);
        }
        fractions.extend_from_slice(FRACTIONS);
        for f in fractions {
            let capacity = ((uniq as f64 * f).round() as usize).max(1);
            let c = cells.len();
            cells.push(Cell {
                family,
                trace: name.clone(),
                capacity,
                fraction: f,
                lru: 0.0,
                moka: 0.0,
                moka_buffered: 0.0,
                quick: 0.0,
                reference: 0.0,
                tinyufo: 0.0,
                ours: vec![0.0; suite.seeds as usize],
                threaded: if suite.threads > 1 {
                    vec![0.0; suite.seeds as usize]
                } else {
                    Vec::new()
                },
            });
            for s in [
                Subject::Lru,
                Subject::Moka,
                Subject::MokaBuffered,
                Subject::Quick,
                Subject::Reference,
                Subject::TinyUfo,
            ]
            .into_iter()
            .chain((0..suite.seeds).map(Subject::Ours))
            .chain(
                (0..suite.seeds)
                    .filter(|_| suite.threads > 1)
                    .map(Subject::Threaded),
            ) {
                jobs.push((t, c, capacity, s));
            }
        }
    }
    // The longest replays first, so the workers finish together.
    jobs.sort_by_key(|&(t, ..)| std::cmp::Reverse(traces[t].2.len()));
    let cells = Mutex::new(cells);
    let workers = in_parallel(&jobs, |&(t, c, capacity, subject)| {
        let trace = &traces[t].2;
        let hits = match subject {
            Subject::Lru => lru(trace, capacity),
            Subject::Moka => best_of(trace, || moka(trace, capacity, 1)),
            Subject::MokaBuffered => moka_buffered(trace, capacity, 1),
            Subject::Quick => best_of(trace, || quick_cache(trace, capacity, 1)),
            Subject::Reference => runcache_bench::wtinylfu::replay(trace, capacity),
            Subject::TinyUfo => tinyufo(trace, capacity),
            Subject::Ours(seed) => runcache(trace, capacity, 1, seed),
            Subject::Threaded(seed) => runcache(trace, capacity, suite.threads, seed),
        };
        let pct = 100.0 * hits as f64 / trace.len() as f64;
        let mut cells = cells.lock().unwrap();
        let cell = &mut cells[c];
        match subject {
            Subject::Lru => cell.lru = pct,
            Subject::Moka => cell.moka = pct,
            Subject::MokaBuffered => cell.moka_buffered = pct,
            Subject::Quick => cell.quick = pct,
            Subject::Reference => cell.reference = pct,
            Subject::TinyUfo => cell.tinyufo = pct,
            Subject::Ours(seed) => cell.ours[seed as usize] = pct,
            Subject::Threaded(seed) => cell.threaded[seed as usize] = pct,
        }
    });
    let cells = cells.into_inner().unwrap();
    print_cells(&cells);
    print_families(&cells);
    timing("suite", cells.len(), suite, started, workers);
    Ok(())
}

/// The closing line of a suite's run: how many cells, seeds, seconds and threads.
pub fn timing(
    what: &str,
    cells: usize,
    suite: &Suite,
    started: std::time::Instant,
    workers: usize,
) {
    println!(
        "\n{what}: {cells} cells, {} seeds each, {:.0} s on {workers} worker(s)",
        suite.seeds,
        started.elapsed().as_secs_f64()
    );
}

fn print_cells(cells: &[Cell]) {
    let mut last = "";
    for c in cells {
        if c.trace != last {
            last = &c.trace;
            println!(
                "\n{} ({}): hit ratios in %, runcache at its worst seed",
                c.trace, c.family
            );
            println!(
                "{:>9} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7} {:>8} {:>8}",
                "capacity",
                "%keys",
                "lru",
                "moka",
                "moka-buf",
                "quick",
                "tinyufo",
                "w-tinylfu",
                "runcache",
                "spread",
                "margin",
                "vs lru"
            );
        }
        let loss = c
            .loss()
            .map_or(String::new(), |l| format!("  {l:+.3} lost on threads"));
        println!(
            "{:>9} {:>6.2} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>9.3} {:>9.3} {:>7.3} {:>+8.3} {:>+8.3}{}{loss}",
            c.capacity,
            100.0 * c.fraction,
            c.lru,
            c.moka,
            c.moka_buffered,
            c.quick,
            c.tinyufo,
            c.reference,
            c.worst(),
            c.spread(),
            c.margin(),
            c.worst() - c.lru,
            if c.holds() { "" } else { "  MISSED" }
        );
    }
}

/// The summary of some cells: held, mean margin, worst cell, widest spread, against the
/// reference.
fn summary(cells: &[&Cell]) -> String {
    let n = cells.len() as f64;
    let held = cells.iter().filter(|c| c.holds()).count();
    let mean = cells.iter().map(|c| c.margin()).sum::<f64>() / n;
    let reference = cells.iter().map(|c| c.worst() - c.reference).sum::<f64>() / n;
    let worst = cells
        .iter()
        .min_by(|a, b| a.margin().total_cmp(&b.margin()))
        .expect("a family has cells");
    let wide = cells
        .iter()
        .max_by(|a, b| a.spread().total_cmp(&b.spread()))
        .expect("a family has cells");
    let mut s = String::new();
    let _ = write!(
        s,
        "{held:>3}/{:<3} mean {mean:+6.2}  vs w-tinylfu {reference:+6.2}  worst {:+6.2} ({} at {:.2}%)  spread up to {:.2} ({} at {:.2}%)",
        cells.len(),
        worst.margin(),
        worst.trace,
        100.0 * worst.fraction,
        wide.spread(),
        wide.trace,
        100.0 * wide.fraction,
    );
    let losses: Vec<(f64, &str, f64)> = cells
        .iter()
        .filter_map(|c| c.loss().map(|l| (l, c.trace.as_str(), c.fraction)))
        .collect();
    s + &threads_note(&losses)
}

/// What a summary says of the cells' losses from one thread to several, each `(loss,
/// trace, fraction)`: the most lost, and how many lost over half a point; empty on one
/// thread.
pub fn threads_note(losses: &[(f64, &str, f64)]) -> String {
    let Some((l, trace, fraction)) = losses.iter().max_by(|a, b| a.0.total_cmp(&b.0)) else {
        return String::new();
    };
    let over = losses.iter().filter(|(l, ..)| *l > 0.5).count();
    format!(
        "  threads: most lost {l:+.2} ({trace} at {:.2}%), {over} over 0.5",
        100.0 * fraction
    )
}

/// Cells grouped by family, families in name order.
pub fn by_family<'a, C>(
    cells: &'a [C],
    family: impl Fn(&'a C) -> &'a str,
) -> BTreeMap<&'a str, Vec<&'a C>> {
    let mut families: BTreeMap<&str, Vec<&C>> = BTreeMap::new();
    for c in cells {
        families.entry(family(c)).or_default().push(c);
    }
    families
}

fn print_families(cells: &[Cell]) {
    println!(
        "\nsummary (each cell at runcache's worst seed; rule: >= max(moka, quick_cache) - 0.5 and >= LRU - 0.5):"
    );
    for (family, cells) in &by_family(cells, |c| c.family) {
        println!("  {family:<26} {}", summary(cells));
    }
    let all: Vec<&Cell> = cells.iter().collect();
    if !all.is_empty() {
        println!("  {:<26} {}", "everything", summary(&all));
        let held = cells.iter().filter(|c| c.holds_buffered()).count();
        let mean = cells.iter().map(Cell::margin_buffered).sum::<f64>() / cells.len() as f64;
        println!(
            "  against moka as built (moka-buf: its evictions batched, over its capacity between batches): {held}/{} held, mean {mean:+.2}",
            cells.len()
        );
        let held = cells.iter().filter(|c| c.reference_holds()).count();
        let mean = cells.iter().map(Cell::reference_margin).sum::<f64>() / cells.len() as f64;
        println!(
            "  the reference w-tinylfu under the same rule: {held}/{} held, mean {mean:+.2}",
            cells.len()
        );
    }
    let under: Vec<String> = cells
        .iter()
        .filter(|c| c.tinyufo < c.lru - 0.5)
        .map(|c| {
            format!(
                "{} at {:.2}% ({:+.2})",
                c.trace,
                100.0 * c.fraction,
                c.tinyufo - c.lru
            )
        })
        .collect();
    println!(
        "  tinyufo under LRU - 0.5 on {} of {} cells{}{}",
        under.len(),
        cells.len(),
        if under.is_empty() { "" } else { ": " },
        under.join(", ")
    );
    for c in cells.iter().filter(|c| !c.holds()) {
        println!(
            "    missed: {} at {:.2}% ({} entries): {:+.2} to the best peer, {:+.2} to LRU, spread {:.2}",
            c.trace,
            100.0 * c.fraction,
            c.capacity,
            c.margin(),
            c.worst() - c.lru,
            c.spread()
        );
    }
}

/// The points of a share plot: one sample every `len / POINTS` accesses.
const POINTS: usize = 100;

/// `--shares NAME@FRACTION`: replays one suite trace at one capacity under each seed, and
/// plots the small queue's share of the capacity over the replay, one line per seed, beside
/// the hit ratio each seed reached (the controller's stability, seen from inside).
pub fn shares(suite: &Suite, spec: &str, svg_dir: &Path) -> Result<(), String> {
    let bad = || format!("--shares: expected NAME@FRACTION (a suite trace), got `{spec}`");
    let (name, fraction) = spec.split_once('@').ok_or_else(bad)?;
    let fraction: f64 = fraction.parse().map_err(|_| bad())?;
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(bad());
    }
    // Only the named trace is loaded (and found among the suite's, or not).
    let one = Suite {
        dir: suite.dir.clone(),
        quick: false,
        seeds: suite.seeds,
        shares: None,
        only: vec![name.to_string()],
        threads: 1,
        weighted: false,
        frontier: false,
    };
    let (_, _, trace) = traces(&one)?
        .into_iter()
        .find(|(_, n, _)| n == name)
        .ok_or_else(|| format!("--shares: `{name}` is not a suite trace (or it is absent)"))?;
    let capacity = ((unique(&trace) as f64 * fraction).round() as usize).max(1);
    let every = (trace.len() / POINTS).max(1);
    let mut series = Vec::new();
    println!(
        "\n{name} at {:.2}% ({capacity} entries): the small queue's share over the replay",
        100.0 * fraction
    );
    for seed in 0..suite.seeds {
        let cache = seeded(capacity, seed);
        let mut hits = 0u64;
        let mut values = Vec::with_capacity(POINTS + 1);
        for (i, &k) in trace.iter().enumerate() {
            if cache.get(&k).is_some() {
                hits += 1;
            } else {
                let _ = cache.insert(k, ());
            }
            if (i + 1) % every == 0 {
                values.push(100.0 * cache.admission_share().unwrap_or(0.0));
            }
        }
        let ratio = 100.0 * hits as f64 / trace.len() as f64;
        let shown: Vec<String> = values
            .iter()
            .step_by((values.len() / 10).max(1))
            .map(|v| format!("{v:.0}"))
            .collect();
        println!(
            "  seed {seed}: hit ratio {ratio:.3}%, share % at each tenth: {}",
            shown.join(" ")
        );
        series.push(runcache_bench::Series {
            label: format!("seed {seed} ({ratio:.2}%)"),
            values,
        });
    }
    std::fs::create_dir_all(svg_dir).map_err(|e| format!("{}: {e}", svg_dir.display()))?;
    let path = svg_dir.join(format!("share-{name}-{fraction}.svg"));
    let xs: Vec<f64> = (1..=series[0].values.len())
        .map(|i| (i * every) as f64)
        .collect();
    let svg = runcache_bench::line_chart(
        &format!("{name} at {:.2}%: small queue's share", 100.0 * fraction),
        "share of the capacity %",
        runcache_bench::XAxis::Linear {
            values: &xs,
            label: "accesses",
        },
        &series,
        Some(80.0),
    )?;
    std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("plot: {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(ours: &[f64], moka: f64, quick: f64, lru: f64) -> Cell {
        Cell {
            family: "f",
            trace: "t".into(),
            capacity: 10,
            fraction: 0.01,
            lru,
            moka,
            moka_buffered: moka,
            quick,
            reference: 0.0,
            tinyufo: 0.0,
            ours: ours.to_vec(),
            threaded: Vec::new(),
        }
    }

    #[test]
    fn a_cell_is_judged_at_its_worst_seed() {
        // The best seed is ahead of both peers; the worst is 0.6 behind moka.
        let c = cell(&[50.0, 49.0, 49.8], 49.6, 48.0, 30.0);
        assert_eq!(c.worst(), 49.0);
        assert!((c.spread() - 1.0).abs() < 1e-9);
        assert!((c.margin() + 0.6).abs() < 1e-9);
        assert!(!c.holds());
        assert!(cell(&[49.2, 49.3], 49.6, 48.0, 30.0).holds());
        // Within half a point of the peers but under LRU by more: missed.
        assert!(!cell(&[40.0], 40.1, 39.0, 40.6).holds());
        // moka as built is reported beside, not compared with.
        let mut c = cell(&[49.2, 49.3], 49.6, 48.0, 30.0);
        c.moka_buffered = 52.0;
        assert!(c.holds());
        assert!((c.margin_buffered() + 2.8).abs() < 1e-9);
        assert!(!c.holds_buffered());
    }

    #[test]
    fn the_reference_is_judged_by_the_same_rule_whatever_runcache_did() {
        let mut c = cell(&[20.0], 49.6, 48.0, 30.0);
        c.reference = 49.2;
        assert!((c.reference_margin() + 0.4).abs() < 1e-9);
        assert!(c.reference_holds() && !c.holds());
        c.reference = 49.0;
        assert!(!c.reference_holds(), "0.6 under moka");
        // Within half a point of the peers but under LRU by more: missed.
        let mut c = cell(&[40.0], 40.1, 39.0, 40.6);
        c.reference = 40.0;
        assert!(!c.reference_holds());
    }

    #[test]
    fn a_peer_is_taken_at_its_best_of_three_runs_on_a_short_trace_and_run_once_on_a_long_one() {
        let runs = std::cell::Cell::new(0u64);
        let replay = || {
            runs.set(runs.get() + 1);
            [5, 9, 7][(runs.get() - 1) as usize % 3]
        };
        assert_eq!(best_of(&vec![0; SHORT - 1], replay), 9);
        assert_eq!(runs.get(), PEER_RUNS as u64);
        runs.set(0);
        assert_eq!(best_of(&vec![0; SHORT], replay), 5);
        assert_eq!(runs.get(), 1);
    }

    #[test]
    fn the_loss_on_threads_is_taken_between_the_worst_seeds() {
        let mut c = cell(&[50.0, 49.0], 49.6, 48.0, 30.0);
        assert_eq!(c.loss(), None, "one thread only");
        // The threaded worst (48.2) against the one-thread worst (49.0), whichever seed.
        c.threaded = vec![48.2, 49.5];
        assert!((c.loss().unwrap() - 0.8).abs() < 1e-9);
        // A gain on threads is a negative loss.
        c.threaded = vec![49.4, 49.6];
        assert!((c.loss().unwrap() + 0.4).abs() < 1e-9);
    }

    #[test]
    fn the_suite_keeps_what_only_names_and_quick_its_subset() {
        let suite = |quick, only: &[&str]| Suite {
            dir: PathBuf::new(),
            quick,
            seeds: 1,
            shares: None,
            only: only.iter().map(|s| s.to_string()).collect(),
            threads: 1,
            weighted: false,
            frontier: false,
        };
        assert!(suite(false, &[]).keeps("P3.lis.zst", "disk"));
        assert!(!suite(true, &[]).keeps("P3.lis.zst", "disk"));
        assert!(suite(true, &[]).keeps("OLTP.lis.zst", "database"));
        assert!(suite(false, &["disk"]).keeps("P3.lis.zst", "disk"));
        assert!(!suite(false, &["web07.trace.zst"]).keeps("P3.lis.zst", "disk"));
    }
}
