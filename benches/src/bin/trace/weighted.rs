//! The weighted training suite (`trace --suite --weighted`): traces whose entries weigh their
//! size in bytes, under budgets that are fractions of the trace's unique bytes. Each cell
//! reports two figures, the object hit ratio (hits / requests) and the byte hit ratio (bytes
//! hit / bytes requested), for runcache under several hasher seeds (judged at its worst seed,
//! figure by figure), moka (weigher), quick_cache (weighter), an exact LRU by bytes and the
//! size-aware reference GDSF (`runcache_bench::gdsf`).
//!
//! `--frontier` replays GDSF with its priorities divided by the size to the powers
//! [`EXPONENTS`] too (β = 0 is frequency alone, β = 1 is GDSF) and says, cell by cell, whether
//! one of these references meets the suite's rule, and whether one of them is ahead of
//! runcache on both figures: what a size-aware policy of this family can reach where the rule
//! asks for moka's object hit ratio and quick_cache's or LRU's byte hit ratio at once.
//!
//! The families: the many-models inference stream and its variants (`sized::Models`); every
//! real trace of the trace folder with sizes drawn from its keys' hashes, once per size model
//! (`sized::SizeModel`; the first [`REAL_LIMIT`] accesses of each); and every `key size` trace
//! of the folder (`*.sized` or `*.sized.zst`).

use crate::load::load;
use crate::sized::{load_sized, models_workloads, unique_bytes, SizeModel, Sized};
use crate::suite::{by_family, in_parallel, threads_note, timing, Suite, REAL};
use crate::weighed::{self, Hits};
use std::sync::Mutex;

/// The accesses of each real trace the weighted suite replays: the longest traces would
/// take most of its time otherwise.
pub const REAL_LIMIT: usize = 1_000_000;
/// Capacities of the many-models traces, as fractions of their unique bytes.
const MODEL_FRACTIONS: &[f64] = &[0.02, 0.05, 0.1, 0.25];
/// Capacities of the other traces.
const FRACTIONS: &[f64] = &[0.01, 0.05, 0.1];
/// The traces `--quick` keeps (with every size model) and the models streams it keeps.
const QUICK: &[&str] = &[
    "OLTP.lis.zst",
    "multi2.trace.zst",
    "sprite.trace.zst",
    "web07.trace.zst",
    "gcc.trace.zst",
    "models",
    "models-shift-batch",
];

/// The exponents of the size in the priorities of `--frontier`'s references.
const EXPONENTS: &[f64] = &[0.0, 0.25, 0.5, 0.75, 1.0];
/// How far ahead of runcache on both figures a reference must be to count as ahead, in
/// points: the rule's own tolerance.
const AHEAD: f64 = 0.5;

/// The figures of one subject in one cell, in %.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Ratio {
    object: f64,
    byte: f64,
}

impl Ratio {
    fn of((hits, bytes): Hits, trace: &[(u64, u32)], total_bytes: u64) -> Ratio {
        Ratio {
            object: 100.0 * hits as f64 / trace.len() as f64,
            byte: 100.0 * bytes as f64 / total_bytes.max(1) as f64,
        }
    }
    fn max(self, o: Ratio) -> Ratio {
        Ratio {
            object: self.object.max(o.object),
            byte: self.byte.max(o.byte),
        }
    }
    fn min(self, o: Ratio) -> Ratio {
        Ratio {
            object: self.object.min(o.object),
            byte: self.byte.min(o.byte),
        }
    }
    fn minus(self, o: Ratio) -> Ratio {
        Ratio {
            object: self.object - o.object,
            byte: self.byte - o.byte,
        }
    }
}

/// One trace × capacity cell.
struct Cell {
    family: String,
    trace: String,
    capacity: u64,
    fraction: f64,
    lru: Ratio,
    moka: Ratio,
    quick: Ratio,
    gdsf: Ratio,
    ours: Vec<Ratio>,
    threaded: Vec<Ratio>,
    /// `--frontier`'s references, one per exponent of [`EXPONENTS`] (empty without it).
    frontier: Vec<Ratio>,
}

fn worst(ratios: &[Ratio]) -> Ratio {
    let start = Ratio {
        object: f64::INFINITY,
        byte: f64::INFINITY,
    };
    ratios.iter().fold(start, |a, &r| a.min(r))
}

impl Cell {
    /// runcache at its worst seed, figure by figure.
    fn worst(&self) -> Ratio {
        worst(&self.ours)
    }
    fn spread(&self) -> Ratio {
        let best = self.ours.iter().fold(Ratio::default(), |a, &r| a.max(r));
        best.minus(self.worst())
    }
    fn margin(&self) -> Ratio {
        self.worst().minus(self.moka.max(self.quick))
    }
    fn vs_lru(&self) -> Ratio {
        self.worst().minus(self.lru)
    }
    /// The rule: within 0.5 points of the best of moka and quick_cache, and of LRU,
    /// on both figures.
    fn holds(&self) -> bool {
        self.meets(self.worst())
    }
    /// Whether figures `r` would hold the rule in this cell.
    fn meets(&self, r: Ratio) -> bool {
        let (m, l) = (r.minus(self.moka.max(self.quick)), r.minus(self.lru));
        m.object >= -0.5 && m.byte >= -0.5 && l.object >= -0.5 && l.byte >= -0.5
    }
    /// The exponent of the first `--frontier` reference that holds the rule here.
    fn reached(&self) -> Option<f64> {
        let i = self.frontier.iter().position(|&r| self.meets(r))?;
        Some(EXPONENTS[i])
    }
    /// The exponent of the first `--frontier` reference ahead of runcache's worst seed on
    /// both figures by more than [`AHEAD`].
    fn passed_by(&self) -> Option<f64> {
        let w = self.worst();
        let i = self
            .frontier
            .iter()
            .position(|r| r.object > w.object + AHEAD && r.byte > w.byte + AHEAD)?;
        Some(EXPONENTS[i])
    }
    fn loss(&self) -> Option<Ratio> {
        (!self.threaded.is_empty()).then(|| self.worst().minus(worst(&self.threaded)))
    }
}

#[derive(Clone, Copy)]
enum Subject {
    Lru,
    Moka,
    Quick,
    Gdsf,
    /// `--frontier`'s reference of exponent `EXPONENTS[i]`.
    Frontier(usize),
    Ours(u64),
    Threaded(u64),
}

/// The suite's traces: (family, name, trace).
fn traces(suite: &Suite) -> Result<Vec<(String, String, Sized)>, String> {
    let keeps = |name: &str, family: &str| {
        (suite.only.is_empty() || suite.only.iter().any(|o| o == name || o == family))
            && (!suite.quick || QUICK.contains(&name))
    };
    let mut out = Vec::new();
    for (name, trace) in models_workloads() {
        if keeps(&name, "many models") {
            out.push(("many models".to_string(), name, trace));
        }
    }
    let mut absent = Vec::new();
    for &(file, _) in REAL {
        let path = suite.dir.join(file);
        let wanted = SizeModel::ALL
            .iter()
            .any(|m| keeps(file, &format!("real, {}", m.name())));
        if !wanted {
            continue;
        }
        if !path.exists() {
            absent.push(file);
            continue;
        }
        let mut unit = load(&path)?;
        unit.truncate(REAL_LIMIT);
        for m in SizeModel::ALL {
            let family = format!("real, {}", m.name());
            if keeps(file, &family) {
                out.push((family, format!("{file}/{}", m.name()), m.apply(&unit)));
            }
        }
    }
    if !absent.is_empty() {
        println!(
            "notice: {} of the suite's real traces are absent from {} and skipped: {}",
            absent.len(),
            suite.dir.display(),
            absent.join(", ")
        );
    }
    if let Ok(dir) = std::fs::read_dir(&suite.dir) {
        let mut files: Vec<_> = dir.filter_map(Result::ok).map(|e| e.path()).collect();
        files.sort();
        for path in files {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if (name.ends_with(".sized") || name.ends_with(".sized.zst"))
                && keeps(&name, "size-aware traces")
            {
                out.push(("size-aware traces".into(), name, load_sized(&path)?));
            }
        }
    }
    Ok(out)
}

/// Runs the weighted suite and prints its tables and summaries.
pub fn run(suite: &Suite) -> Result<(), String> {
    let started = std::time::Instant::now();
    let traces = traces(suite)?;
    if traces.is_empty() {
        return Err("--suite --weighted: no trace is left to replay (see --only)".into());
    }
    let totals: Vec<u64> = traces
        .iter()
        .map(|(_, _, t)| t.iter().map(|&(_, s)| u64::from(s)).sum())
        .collect();
    let mut cells = Vec::new();
    let mut jobs = Vec::new();
    for (t, (family, name, trace)) in traces.iter().enumerate() {
        let uniq = unique_bytes(trace);
        let fractions = if family == "many models" {
            MODEL_FRACTIONS
        } else {
            FRACTIONS
        };
        for &f in fractions {
            let capacity = ((uniq as f64 * f).round() as u64).max(1);
            let c = cells.len();
            let seeds = suite.seeds as usize;
            cells.push(Cell {
                family: family.clone(),
                trace: name.clone(),
                capacity,
                fraction: f,
                lru: Ratio::default(),
                moka: Ratio::default(),
                quick: Ratio::default(),
                gdsf: Ratio::default(),
                ours: vec![Ratio::default(); seeds],
                threaded: vec![Ratio::default(); if suite.threads > 1 { seeds } else { 0 }],
                frontier: vec![Ratio::default(); if suite.frontier { EXPONENTS.len() } else { 0 }],
            });
            let subjects = [Subject::Lru, Subject::Moka, Subject::Quick, Subject::Gdsf]
                .into_iter()
                .chain(
                    (0..EXPONENTS.len())
                        .filter(|_| suite.frontier)
                        .map(Subject::Frontier),
                )
                .chain((0..suite.seeds).map(Subject::Ours))
                .chain(
                    (0..suite.seeds)
                        .filter(|_| suite.threads > 1)
                        .map(Subject::Threaded),
                );
            for s in subjects {
                jobs.push((t, c, capacity, s));
            }
        }
    }
    jobs.sort_by_key(|&(t, ..)| std::cmp::Reverse(traces[t].2.len()));
    let cells = Mutex::new(cells);
    let workers = in_parallel(&jobs, |&(t, c, capacity, subject)| {
        let trace = &traces[t].2;
        let mean = (totals[t] / trace.len() as u64).max(1);
        let hits = match subject {
            Subject::Lru => weighed::lru(trace, capacity),
            Subject::Moka => weighed::moka(trace, capacity, 1),
            Subject::Quick => weighed::quick_cache(trace, capacity, (capacity / mean) as usize, 1),
            Subject::Gdsf => runcache_bench::gdsf::replay(trace, capacity),
            Subject::Frontier(i) => {
                runcache_bench::gdsf::replay_with(trace, capacity, EXPONENTS[i])
            }
            Subject::Ours(seed) => weighed::runcache(trace, capacity, 1, seed),
            Subject::Threaded(seed) => weighed::runcache(trace, capacity, suite.threads, seed),
        };
        let r = Ratio::of(hits, trace, totals[t]);
        let mut cells = cells.lock().unwrap();
        let cell = &mut cells[c];
        match subject {
            Subject::Lru => cell.lru = r,
            Subject::Moka => cell.moka = r,
            Subject::Quick => cell.quick = r,
            Subject::Gdsf => cell.gdsf = r,
            Subject::Frontier(i) => cell.frontier[i] = r,
            Subject::Ours(seed) => cell.ours[seed as usize] = r,
            Subject::Threaded(seed) => cell.threaded[seed as usize] = r,
        }
    });
    let cells = cells.into_inner().unwrap();
    print_cells(&cells);
    print_families(&cells);
    timing("weighted suite", cells.len(), suite, started, workers);
    Ok(())
}

fn print_cells(cells: &[Cell]) {
    let mut last = "";
    for c in cells {
        if c.trace != last {
            last = &c.trace;
            println!(
                "\n{} ({}): object / byte hit ratios in %, runcache at its worst seed",
                c.trace, c.family
            );
            println!(
                "{:>6} {:>9} {:>13} {:>13} {:>13} {:>13} {:>13} {:>11} {:>13} {:>13}",
                "%bytes",
                "MiB",
                "lru",
                "moka",
                "quick",
                "gdsf",
                "runcache",
                "spread",
                "margin",
                "vs lru"
            );
        }
        let pair = |r: Ratio| format!("{:.2}/{:.2}", r.object, r.byte);
        let signed = |r: Ratio| format!("{:+.2}/{:+.2}", r.object, r.byte);
        let loss = c.loss().map_or(String::new(), |l| {
            format!("  {} lost on threads", signed(l))
        });
        println!(
            "{:>6.2} {:>9.2} {:>13} {:>13} {:>13} {:>13} {:>13} {:>11} {:>13} {:>13}{}{loss}",
            100.0 * c.fraction,
            c.capacity as f64 / f64::from(1 << 20),
            pair(c.lru),
            pair(c.moka),
            pair(c.quick),
            pair(c.gdsf),
            pair(c.worst()),
            pair(c.spread()),
            signed(c.margin()),
            signed(c.vs_lru()),
            if c.holds() { "" } else { "  MISSED" }
        );
        if !c.frontier.is_empty() {
            let all: Vec<String> = c.frontier.iter().map(|&r| pair(r)).collect();
            let at = |b: Option<f64>| b.map_or("none".to_string(), |b| format!("β={b}"));
            println!(
                "{:>17} frontier {}  reached by {}, ahead: {}",
                "",
                all.join(" "),
                at(c.reached()),
                at(c.passed_by())
            );
        }
    }
}

/// The summary of some cells: held, mean margins, worst cells, widest spread, against GDSF.
fn summary(cells: &[&Cell]) -> String {
    let n = cells.len() as f64;
    let held = cells.iter().filter(|c| c.holds()).count();
    let mean = |f: &dyn Fn(&Cell) -> f64| cells.iter().map(|c| f(c)).sum::<f64>() / n;
    let lowest = |f: &dyn Fn(&Cell) -> f64| {
        let c = cells
            .iter()
            .min_by(|a, b| f(a).total_cmp(&f(b)))
            .expect("a family has cells");
        format!("{:+.2} ({} at {:.1}%)", f(c), c.trace, 100.0 * c.fraction)
    };
    let widest = cells
        .iter()
        .map(|c| c.spread().object.max(c.spread().byte))
        .fold(0.0, f64::max);
    let mut s = format!(
        "{held:>3}/{:<3} mean {:+6.2}/{:+6.2}  vs gdsf {:+6.2}/{:+6.2}  worst obj {} byte {}  spread up to {widest:.2}",
        cells.len(),
        mean(&|c| c.margin().object),
        mean(&|c| c.margin().byte),
        mean(&|c| c.worst().object - c.gdsf.object),
        mean(&|c| c.worst().byte - c.gdsf.byte),
        lowest(&|c| c.margin().object),
        lowest(&|c| c.margin().byte),
    );
    let losses: Vec<(f64, &str, f64)> = cells
        .iter()
        .filter_map(|c| {
            let l = c.loss()?;
            Some((l.object.max(l.byte), c.trace.as_str(), c.fraction))
        })
        .collect();
    s.push_str(&threads_note(&losses));
    if cells.iter().any(|c| !c.frontier.is_empty()) {
        let count = |f: &dyn Fn(&Cell) -> bool| cells.iter().filter(|c| f(c)).count();
        let reached = count(&|c| c.reached().is_some());
        let held = count(&|c| c.reached().is_some() && c.holds());
        let passed = count(&|c| c.passed_by().is_some());
        s.push_str(&format!(
            "\n{:>29}a reference reaches the rule in {reached}/{} (runcache holds {held} of them), is ahead of runcache on both in {passed}",
            "",
            cells.len()
        ));
    }
    s
}

fn print_families(cells: &[Cell]) {
    println!(
        "\nsummary, object/byte (each cell at runcache's worst seed; rule: both figures >= max(moka, quick_cache) - 0.5 and >= LRU - 0.5):"
    );
    for (family, cells) in &by_family(cells, |c| c.family.as_str()) {
        println!("  {family:<26} {}", summary(cells));
    }
    let all: Vec<&Cell> = cells.iter().collect();
    println!("  {:<26} {}", "everything", summary(&all));
    for c in cells.iter().filter(|c| !c.holds()) {
        let (m, l) = (c.margin(), c.vs_lru());
        println!(
            "    missed: {} at {:.1}%: {:+.2}/{:+.2} to the best peer, {:+.2}/{:+.2} to LRU",
            c.trace,
            100.0 * c.fraction,
            m.object,
            m.byte,
            l.object,
            l.byte
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(ours: &[(f64, f64)], moka: (f64, f64), lru: (f64, f64)) -> Cell {
        let r = |(object, byte)| Ratio { object, byte };
        Cell {
            family: "f".into(),
            trace: "t".into(),
            capacity: 10,
            fraction: 0.01,
            lru: r(lru),
            moka: r(moka),
            quick: r((0.0, 0.0)),
            gdsf: r((0.0, 0.0)),
            ours: ours.iter().map(|&o| r(o)).collect(),
            threaded: Vec::new(),
            frontier: Vec::new(),
        }
    }

    #[test]
    fn the_frontier_says_which_reference_holds_and_which_is_ahead() {
        let r = |object, byte| Ratio { object, byte };
        let mut c = cell(&[(40.0, 30.0)], (50.0, 20.0), (10.0, 31.0));
        assert!(!c.holds());
        c.frontier = vec![
            r(30.0, 40.0),
            r(45.0, 35.0),
            r(49.6, 30.6),
            r(60.0, 20.0),
            r(60.0, 10.0),
        ];
        // The third holds the rule (within 0.5 of moka's objects and LRU's bytes); the
        // second is the first ahead of runcache by more than half a point on both.
        assert_eq!(c.reached(), Some(EXPONENTS[2]));
        assert_eq!(c.passed_by(), Some(EXPONENTS[1]));
        c.frontier = vec![r(40.4, 40.0); EXPONENTS.len()];
        assert_eq!(c.reached(), None);
        assert_eq!(
            c.passed_by(),
            None,
            "half a point ahead is within the rule's tolerance"
        );
    }

    #[test]
    fn a_cell_is_judged_at_its_worst_seed_on_each_figure() {
        // Seed 0 is worst on objects, seed 1 on bytes: both worsts count.
        let c = cell(&[(40.0, 30.0), (41.0, 29.0)], (40.2, 29.2), (10.0, 10.0));
        assert_eq!(
            c.worst(),
            Ratio {
                object: 40.0,
                byte: 29.0
            }
        );
        assert!(c.holds());
        assert!((c.spread().object - 1.0).abs() < 1e-9);
        assert!(
            !cell(&[(40.0, 28.4)], (40.0, 29.0), (0.0, 0.0)).holds(),
            "bytes"
        );
        assert!(
            !cell(&[(39.4, 30.0)], (40.0, 29.0), (0.0, 0.0)).holds(),
            "objects"
        );
        assert!(
            !cell(&[(40.0, 30.0)], (0.0, 0.0), (40.0, 30.6)).holds(),
            "LRU"
        );
    }
}
