//! Trace replayer: hit ratios of runcache, LRU, the Bélády optimum, moka and quick_cache at
//! several capacities, measured in the same run. moka runs its pending tasks after every
//! insert, so that it holds its capacity as the others do (`policies::moka`).
//!
//! ```text
//! cargo run --release -p runcache-bench --bin trace -- [TRACE...] [options]
//!
//!   TRACE               an ARC `.lis` trace (plain or `.zst`), or a one-key-per-line file;
//!                       default: OLTP.lis.zst and P3.lis.zst in $RUNCACHE_TRACE_DIR when
//!                       that is set and they are present, else a synthetic trace
//!   --zipf K:S:N        a synthetic Zipf trace: N accesses over K keys with exponent S
//!   --scan-mix K:S:N    the same, with a one-pass scan of K/2 fresh keys every N/10 accesses
//!   --matrix            the workload matrix: the real traces (as above, when present) and
//!                       synthetic workloads that each favour another policy (Zipf 0.6, 0.9
//!                       and 1.2, a loop larger than the cache, a scan in a Zipf stream, a
//!                       hot set that shifts halfway), with runcache's margin to the best
//!                       peer on every row and a summary
//!   --sizes N           the policy's sizing check: Zipf 0.9 over ten keys per entry, twenty
//!                       accesses per entry, at 100, 1,000, ... up to N entries (10000000
//!                       takes about 25 minutes and 5 GB), by count and by weight with no
//!                       size hint, against LRU and the peers, one thread
//!   --fractions F,..    capacities as fractions of the unique keys (default
//!                       0.001,0.0025,0.005,0.01,0.025,0.05,0.1)
//!   --capacities C,..   capacities in entries (instead of --fractions)
//!   --threads T,..      thread counts for the concurrent caches (default 1); with --suite
//!                       one count T, and runcache is replayed on T threads too, under the
//!                       same seeds, with each cell's loss from one thread to T
//!   --limit N           replay only the first N accesses of each trace
//!   --svg-dir DIR       where the plots go (default target/trace)
//!   --suite             the training suite: every real trace in $RUNCACHE_TRACE_DIR (else
//!                       ../shared/traces beside the repository) at 1%, 5% and 10% of its
//!                       unique keys (and 0.1-0.5% when it has over 100,000), the synthetic
//!                       workloads beside them, runcache under several hasher seeds judged at
//!                       its worst, a reference W-TinyLFU column, moka as built (over its
//!                       capacity between its batches) beside the held one, and a summary
//!                       per family
//!   --quick             with --suite: a subset for iteration (one or two traces a family,
//!                       three capacities, three seeds unless --seeds says otherwise)
//!   --seeds N           with --suite: runcache's hasher seeds per cell (default 5)
//!   --only NAME,..      with --suite: only these traces or families (names as printed)
//!   --shares NAME@F     with --suite: replays suite trace NAME at fraction F of its unique
//!                       keys under each seed and plots the small queue's share over time
//!   --weighted          with --suite: the weighted suite instead, entries weighing their
//!                       size under budgets that are fractions of the unique bytes, object
//!                       and byte hit ratios against moka, quick_cache, LRU by bytes and
//!                       GDSF (the many-models stream, the real traces under four size
//!                       models, and every `key size` trace `*.sized[.zst]` of the folder)
//!   --frontier          with --suite --weighted: GDSF with its priorities divided by the
//!                       size to the powers 0, 0.25, 0.5, 0.75 and 1 too, and, per cell,
//!                       whether one of them holds the rule and whether one is ahead of
//!                       runcache on both figures
//!   --tune NAME=V,..    runcache's policy tuned by these values instead of the defaults
//!                       (`runcache::Tuning`'s fields, e.g. `--tune promote_hits=3`), for
//!                       an experiment with one value or a rule switched off
//! ```
//!
//! ARC traces (Megiddo and Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST
//! 2003) have lines `start nblocks ignored request`; each of the `nblocks` pages from `start`
//! counts as one access, as mokabench counts them. With several thread counts, the threads
//! share one cache and claim the trace one access at a time, in order.

mod load;
mod policies;
mod sized;
mod suite;
mod weighed;
mod weighted;

use load::*;
use policies::*;
use runcache_bench::{line_chart, Series, XAxis};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

// ---------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------

struct Options {
    traces: Vec<(String, Trace)>,
    fractions: Vec<f64>,
    capacities: Vec<usize>,
    threads: Vec<usize>,
    svg_dir: PathBuf,
    /// Print each row's margin to the best peer and a summary (`--matrix`).
    margins: bool,
    /// The largest cache of the sizing check (`--sizes`), if asked for.
    sizes: Option<usize>,
    /// The training suite (`--suite`), if asked for.
    suite: Option<suite::Suite>,
}

fn list<T: std::str::FromStr>(flag: &str, value: &str) -> Result<Vec<T>, String> {
    value
        .split(',')
        .map(|v| {
            v.parse()
                .map_err(|_| format!("{flag}: `{v}` is not a valid number"))
        })
        .collect()
}

fn synthetic_spec(flag: &str, value: &str) -> Result<(u64, f64, usize), String> {
    let parts: Vec<&str> = value.split(':').collect();
    let bad = || format!("{flag}: expected KEYS:EXPONENT:ACCESSES, got `{value}`");
    if parts.len() != 3 {
        return Err(bad());
    }
    let keys: u64 = parts[0].parse().map_err(|_| bad())?;
    let s: f64 = parts[1].parse().map_err(|_| bad())?;
    let len: usize = parts[2].parse().map_err(|_| bad())?;
    if keys == 0 || len == 0 || !s.is_finite() || s <= 0.0 {
        return Err(bad());
    }
    Ok((keys, s, len))
}

/// Sets the `--tune` values (`name=value` pairs, comma-separated) for every runcache cache
/// of the run.
fn tune(spec: &str) -> Result<(), String> {
    let mut tuning = runcache::Tuning::DEFAULT;
    for pair in spec.split(',') {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("--tune: expected NAME=VALUE, got `{pair}`"))?;
        tuning
            .set(name.trim(), value.trim())
            .map_err(|e| format!("--tune: {e}"))?;
    }
    tuning.check().map_err(|e| format!("--tune: {e}"))?;
    TUNING
        .set(Box::leak(Box::new(tuning)))
        .map_err(|_| "--tune: given twice; give every value in one list".to_string())
}

fn parse_args() -> Result<Option<Options>, String> {
    let mut opts = Options {
        traces: Vec::new(),
        fractions: vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1],
        capacities: Vec::new(),
        threads: vec![1],
        svg_dir: PathBuf::from("target/trace"),
        margins: false,
        sizes: None,
        suite: None,
    };
    let (mut suite, mut quick, mut seeds, mut shares) = (false, false, None, None);
    let mut weighted = false;
    let mut frontier = false;
    let mut only = Vec::new();
    let mut matrix = false;
    let mut limit = usize::MAX;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => {
                // The usage: the module doc's `text` block, between its fences.
                let usage: Vec<&str> = include_str!("main.rs")
                    .lines()
                    .map(|l| l.trim_start_matches("//! ").trim_start_matches("//!"))
                    .skip_while(|l| !l.starts_with("```"))
                    .skip(1)
                    .take_while(|l| !l.starts_with("```"))
                    .collect();
                println!("{}", usage.join("\n"));
                return Ok(None);
            }
            "--zipf" => {
                let v = value("--zipf")?;
                let (k, s, n) = synthetic_spec("--zipf", &v)?;
                opts.traces
                    .push((format!("zipf-{k}-{s}-{n}"), zipf(k, s, n, 1)?));
            }
            "--scan-mix" => {
                let v = value("--scan-mix")?;
                let (k, s, n) = synthetic_spec("--scan-mix", &v)?;
                opts.traces
                    .push((format!("scanmix-{k}-{s}-{n}"), scan_mix(k, s, n, 1)?));
            }
            "--matrix" => matrix = true,
            "--suite" => suite = true,
            "--quick" => quick = true,
            "--weighted" => weighted = true,
            "--frontier" => frontier = true,
            "--shares" => shares = Some(value("--shares")?),
            "--only" => only = value("--only")?.split(',').map(str::to_string).collect(),
            "--seeds" => {
                let n: u64 = value("--seeds")?
                    .parse()
                    .map_err(|_| "--seeds: not a number of seeds".to_string())?;
                if n == 0 {
                    return Err("--seeds: at least one seed replays anything".into());
                }
                seeds = Some(n);
            }
            "--sizes" => {
                let n: usize = value("--sizes")?
                    .parse()
                    .map_err(|_| "--sizes: not a number of entries".to_string())?;
                if n < 100 {
                    return Err(format!("--sizes: {n} entries; the check starts at 100"));
                }
                opts.sizes = Some(n);
            }
            "--fractions" => opts.fractions = list("--fractions", &value("--fractions")?)?,
            "--capacities" => opts.capacities = list("--capacities", &value("--capacities")?)?,
            "--threads" => {
                opts.threads = list("--threads", &value("--threads")?)?;
                if opts.threads.contains(&0) {
                    return Err("--threads: 0 threads cannot replay anything".into());
                }
            }
            "--limit" => {
                limit = value("--limit")?
                    .parse()
                    .map_err(|_| "--limit: not a number".to_string())?
            }
            "--svg-dir" => opts.svg_dir = PathBuf::from(value("--svg-dir")?),
            "--tune" => tune(&value("--tune")?)?,
            flag if flag.starts_with("--") => return Err(format!("unknown flag `{flag}`")),
            file => files.push(PathBuf::from(file)),
        }
    }
    if (quick || weighted || seeds.is_some() || shares.is_some() || !only.is_empty()) && !suite {
        return Err("--quick, --weighted, --seeds, --only and --shares go with --suite".into());
    }
    if frontier && !weighted {
        return Err("--frontier goes with --suite --weighted".into());
    }
    if weighted && shares.is_some() {
        return Err("--shares plots the unit suite's share; drop --weighted".into());
    }
    if suite {
        if matrix || opts.sizes.is_some() || !opts.traces.is_empty() || !files.is_empty() {
            return Err(
                "--suite replays its own traces; drop the others and --matrix, --sizes".into(),
            );
        }
        let threads = match opts.threads[..] {
            [t] => t,
            _ => {
                return Err(format!(
                    "--threads: --suite compares one thread with one count T, got {:?}",
                    opts.threads
                ))
            }
        };
        opts.suite = Some(suite::Suite {
            dir: suite::default_dir(),
            quick,
            seeds: seeds.unwrap_or(if quick { 3 } else { 5 }),
            shares,
            only,
            threads,
            weighted,
            frontier,
        });
        return Ok(Some(opts));
    }
    if matrix && !opts.traces.is_empty() {
        return Err("--matrix replays its own workloads; drop --zipf and --scan-mix".into());
    }
    if let Some(n) = opts.sizes {
        if matrix || !opts.traces.is_empty() || !files.is_empty() {
            return Err(format!(
                "--sizes {n} replays its own workloads; drop the traces, --matrix, --zipf and \
                 --scan-mix"
            ));
        }
        return Ok(Some(opts));
    }
    if files.is_empty() && (opts.traces.is_empty() || matrix) {
        match std::env::var_os("RUNCACHE_TRACE_DIR") {
            Some(dir) => {
                for name in ["OLTP.lis.zst", "P3.lis.zst"] {
                    let path = Path::new(&dir).join(name);
                    if path.exists() {
                        files.push(path);
                    } else {
                        println!("notice: {} is absent; skipping it", path.display());
                    }
                }
            }
            None => println!(
                "notice: no trace given and RUNCACHE_TRACE_DIR is not set (point it at a \
                 folder holding the ARC traces OLTP.lis.zst and P3.lis.zst)"
            ),
        }
        if files.is_empty() && !matrix {
            println!("notice: no real traces found; replaying a synthetic scan-mixed Zipf trace");
            opts.traces.push((
                "scanmix-100000-0.9-1000000".into(),
                scan_mix(100_000, 0.9, 1_000_000, 1)?,
            ));
        }
    }
    for file in files {
        let name = file
            .file_name()
            .map_or_else(|| "trace".into(), |n| n.to_string_lossy().into_owned());
        opts.traces.push((name, load(&file)?));
    }
    if matrix {
        opts.traces.extend(matrix_workloads()?);
        opts.margins = true;
    }
    for (_, t) in &mut opts.traces {
        t.truncate(limit);
    }
    Ok(Some(opts))
}

/// Column name and hit count at one capacity.
type Row = Vec<(String, u64)>;

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(Some(o)) => o,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trace: {e}");
            return ExitCode::from(2);
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "machine: {} cores ({}); runcache {}; hit ratios in %",
        cores,
        std::env::consts::ARCH,
        env!("CARGO_PKG_VERSION")
    );
    if let Some(tuned) = TUNING.get() {
        // Every value that differs from the default, so that the figures name their policy.
        let changed = tuned.changed();
        if changed.is_empty() {
            println!("runcache tuned: every value as the default");
        } else {
            println!("runcache tuned: {}", changed.join(", "));
        }
    }
    let mut margins = Vec::new();
    if let Some(suite) = &opts.suite {
        let run = match &suite.shares {
            Some(spec) => suite::shares(suite, spec, &opts.svg_dir),
            None if suite.weighted => weighted::run(suite),
            None => suite::run(suite),
        };
        return match run {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("trace: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(most) = opts.sizes {
        return match sizes(most) {
            Ok(margins) => {
                print_summary(&margins, &[1]);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("trace: {e}");
                ExitCode::FAILURE
            }
        };
    }
    for (name, trace) in &opts.traces {
        let uniq = unique(trace);
        println!("\n{name}: {} accesses, {uniq} unique keys", trace.len());
        let capacities: Vec<usize> = if opts.capacities.is_empty() {
            opts.fractions
                .iter()
                .map(|f| ((uniq as f64 * f).round() as usize).max(1))
                .collect()
        } else {
            opts.capacities.clone()
        };
        let mut rows: Vec<(usize, Row)> = Vec::new();
        for &cap in &capacities {
            let mut row: Row = vec![
                ("belady".into(), belady(trace, cap)),
                ("lru".into(), lru(trace, cap)),
            ];
            for &t in &opts.threads {
                let tag = |p| column(p, t, &opts.threads);
                row.push((tag("runcache"), runcache(trace, cap, t, 0)));
                row.push((tag("moka"), moka(trace, cap, t)));
                row.push((tag("quick_cache"), quick_cache(trace, cap, t)));
            }
            rows.push((cap, row));
        }
        print_table(trace.len(), uniq, &rows);
        if opts.margins {
            margins.extend(print_margins(name, trace.len(), &rows, &opts.threads));
        }
        match write_svg(&opts.svg_dir, name, trace.len(), &rows) {
            Ok(path) => println!("plot: {}", path.display()),
            Err(e) => eprintln!("trace: could not write the plot: {e}"),
        }
    }
    if opts.margins {
        print_summary(&margins, &opts.threads);
    }
    ExitCode::SUCCESS
}

/// The policy's sizing check (`--sizes`): at 100, 1,000, ... up to `most` entries, Zipf 0.9
/// over ten keys per entry, twenty accesses per entry. runcache runs by count and by weight
/// without `expected_entry_weight` (its policy then sizes itself from the entries it holds);
/// each has its margin to the best peer.
fn sizes(most: usize) -> Result<Vec<Margin>, String> {
    println!(
        "\nsizing: Zipf 0.9 over 10 keys per entry, 20 accesses per entry, one thread; hit ratios in %"
    );
    println!(
        "{:>10} {:>9} {:>9} {:>11} {:>9} {:>11}  margin (count, weighted)",
        "entries", "lru", "runcache", "runcache-w", "moka", "quick_cache"
    );
    let mut margins = Vec::new();
    let mut n = 100;
    while n <= most {
        let trace = zipf(10 * n as u64, 0.9, 20 * n, 6)?;
        let pct = |hits: u64| 100.0 * hits as f64 / trace.len() as f64;
        let lru = pct(lru(&trace, n));
        let ours = [
            pct(runcache(&trace, n, 1, 0)),
            pct(runcache_weighted(&trace, n)),
        ];
        let (moka, quick) = (pct(moka(&trace, n, 1)), pct(quick_cache(&trace, n, 1)));
        let best = moka.max(quick);
        for (how, ours) in ["by count", "by weight"].into_iter().zip(ours) {
            margins.push(Margin {
                workload: format!("sizes {how}"),
                capacity: n,
                threads: 1,
                margin: ours - best,
                over_lru: ours - lru,
            });
        }
        println!(
            "{n:>10} {lru:>9.3} {:>9.3} {:>11.3} {moka:>9.3} {quick:>11.3}  {:+.3}, {:+.3}",
            ours[0],
            ours[1],
            ours[0] - best,
            ours[1] - best
        );
        n = n.saturating_mul(10);
    }
    Ok(margins)
}

/// The column of policy `p` at `t` threads: its name alone when one thread count runs.
fn column(p: &str, t: usize, threads: &[usize]) -> String {
    if threads.len() > 1 {
        format!("{p}@{t}")
    } else {
        p.to_string()
    }
}

/// One row of the matrix at one thread count: runcache's margin to the best peer, in points.
struct Margin {
    workload: String,
    capacity: usize,
    threads: usize,
    /// runcache − max(moka, quick_cache).
    margin: f64,
    /// runcache − LRU.
    over_lru: f64,
}

impl Margin {
    /// The issue's rule for every row: within 0.5 points of the best peer, and not below LRU.
    fn holds(&self) -> bool {
        self.margin >= -0.5 && self.over_lru >= 0.0
    }
}

/// Prints runcache's margin to the best peer and to LRU on each row, per thread count.
fn print_margins(
    name: &str,
    accesses: usize,
    rows: &[(usize, Row)],
    threads: &[usize],
) -> Vec<Margin> {
    let pct = |hits: u64| 100.0 * hits as f64 / accesses.max(1) as f64;
    let mut out = Vec::new();
    for (cap, row) in rows {
        let get = |col: &str| row.iter().find(|(c, _)| c == col).map_or(0, |(_, h)| *h);
        let lru = pct(get("lru"));
        let mut line = format!("{cap:>10}  margin to the best peer (to LRU):");
        for &t in threads {
            let tag = |p| column(p, t, threads);
            let ours = pct(get(&tag("runcache")));
            let best = pct(get(&tag("moka")).max(get(&tag("quick_cache"))));
            let m = Margin {
                workload: name.to_string(),
                capacity: *cap,
                threads: t,
                margin: ours - best,
                over_lru: ours - lru,
            };
            let _ = write!(
                line,
                "  {t} thread(s) {:+.3} ({:+.3}){}",
                m.margin,
                m.over_lru,
                if m.holds() { "" } else { " MISSED" }
            );
            out.push(m);
        }
        println!("{line}");
    }
    out
}

/// The matrix's summary: rows that hold the rule, the mean margin, the worst rows.
fn print_summary(margins: &[Margin], threads: &[usize]) {
    println!(
        "
summary (rule: runcache >= max(moka, quick_cache) - 0.5 points and >= LRU):"
    );
    for &t in threads {
        let rows: Vec<&Margin> = margins.iter().filter(|m| m.threads == t).collect();
        if rows.is_empty() {
            continue;
        }
        let held = rows.iter().filter(|m| m.holds()).count();
        let mean = rows.iter().map(|m| m.margin).sum::<f64>() / rows.len() as f64;
        println!(
            "  {t} thread(s): {held} of {} rows hold; mean margin to the best peer {mean:+.3} points",
            rows.len()
        );
        let mut worst: Vec<&&Margin> = rows.iter().filter(|m| !m.holds()).collect();
        worst.sort_by(|a, b| a.margin.total_cmp(&b.margin));
        for m in worst {
            println!(
                "    missed: {} at {}: {:+.3} to the best peer, {:+.3} to LRU",
                m.workload, m.capacity, m.margin, m.over_lru
            );
        }
    }
}

fn print_table(accesses: usize, uniq: usize, rows: &[(usize, Row)]) {
    let Some((_, first)) = rows.first() else {
        return;
    };
    let mut header = format!("{:>10} {:>8}", "capacity", "% uniq");
    for (col, _) in first {
        let _ = write!(header, " {col:>14}");
    }
    println!("{header}");
    for (cap, row) in rows {
        let mut line = format!(
            "{cap:>10} {:>7.2}%",
            100.0 * *cap as f64 / uniq.max(1) as f64
        );
        for (_, hits) in row {
            let _ = write!(
                line,
                " {:>14.3}",
                100.0 * *hits as f64 / accesses.max(1) as f64
            );
        }
        println!("{line}");
    }
}

/// Hit ratio against capacity (log scale), one line per policy, drawn with plotters.
fn write_svg(
    dir: &Path,
    name: &str,
    accesses: usize,
    rows: &[(usize, Row)],
) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{name}.svg"));
    let capacities: Vec<f64> = rows.iter().map(|(c, _)| *c as f64).collect();
    let columns = rows.first().map_or(0, |(_, r)| r.len());
    let series: Vec<Series> = (0..columns)
        .map(|col| Series {
            label: rows[0].1[col].0.clone(),
            values: rows
                .iter()
                .map(|(_, r)| 100.0 * r[col].1 as f64 / accesses.max(1) as f64)
                .collect(),
        })
        .collect();
    let svg = line_chart(
        &format!("{name}: hit ratio vs capacity"),
        "hit ratio %",
        XAxis::Log {
            values: &capacities,
            label: "capacity (entries)",
        },
        &series,
        Some(100.0),
    )?;
    std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Optimal hits by exhaustive search over every eviction choice (tiny traces only).
    fn brute_force_optimum(trace: &[u64], capacity: usize) -> u64 {
        fn go(trace: &[u64], i: usize, cache: &mut Vec<u64>, capacity: usize) -> u64 {
            let Some(&k) = trace.get(i) else { return 0 };
            if cache.contains(&k) {
                return 1 + go(trace, i + 1, cache, capacity);
            }
            if cache.len() < capacity {
                cache.push(k);
                let r = go(trace, i + 1, cache, capacity);
                cache.pop();
                return r;
            }
            (0..cache.len())
                .map(|j| {
                    let old = std::mem::replace(&mut cache[j], k);
                    let r = go(trace, i + 1, cache, capacity);
                    cache[j] = old;
                    r
                })
                .max()
                .unwrap_or(0)
        }
        go(trace, 0, &mut Vec::new(), capacity)
    }

    #[test]
    fn belady_on_a_hand_made_trace() {
        // Cyclic 1 2 3 with room for 2: the optimum keeps the key used soonest.
        let trace = [1, 2, 3, 1, 2, 3];
        assert_eq!(belady(&trace, 2), 2);
        assert_eq!(lru(&trace, 2), 0);
        assert_eq!(brute_force_optimum(&trace, 2), 2);
    }

    #[test]
    fn belady_equals_the_exhaustive_optimum_on_small_random_traces() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..200 {
            let len = 4 + (s % 9) as usize;
            let trace: Vec<u64> = (0..len)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s % 5
                })
                .collect();
            for cap in 1..=3 {
                assert_eq!(
                    belady(&trace, cap),
                    brute_force_optimum(&trace, cap),
                    "{trace:?} at {cap}"
                );
            }
        }
    }

    #[test]
    fn lru_on_a_cyclic_scan_never_hits() {
        let trace: Vec<u64> = (0..10).cycle().take(1000).collect();
        assert_eq!(lru(&trace, 9), 0);
        assert_eq!(lru(&trace, 10), 990);
    }

    #[test]
    fn runcache_is_never_below_lru_on_a_scan_mixed_zipf() {
        let trace = scan_mix(5_000, 0.9, 100_000, 7).unwrap();
        for cap in [50, 250, 1000] {
            let (ours, lru) = (runcache(&trace, cap, 1, 0), lru(&trace, cap));
            assert!(ours >= lru, "capacity {cap}: runcache {ours} < LRU {lru}");
        }
    }

    #[test]
    fn the_matrix_loop_cycles_and_the_shift_moves_its_hot_set_halfway() {
        assert_eq!(loop_trace(3, 7), vec![0, 1, 2, 0, 1, 2, 0]);
        let t = shifting(100, 0.9, 1_001, 5).unwrap();
        assert_eq!(t.len(), 1_001);
        assert!(
            t[..500].iter().all(|&k| k <= 100),
            "first half: the first keys"
        );
        assert!(t[500..].iter().all(|&k| k > 100), "second half: other keys");
        // A cache of the loop's length less one hits nothing under LRU, something under
        // Bélády.
        let l = loop_trace(10, 1_000);
        assert_eq!(lru(&l, 9), 0);
        assert!(belady(&l, 9) > 0);
    }

    #[test]
    fn moka_held_at_its_capacity_hits_within_what_its_capacity_allows_and_buffered_it_does_not() {
        // A loop of 20 keys through 12 entries. In one round every key comes once, and a key
        // hit in the round was cached from its previous access on, so every key hit in a
        // round is cached at the round's first hit: a cache that never holds more than 12
        // hits at most 12 a round, none in the first. moka as built holds all 20 until 64
        // writes are pending, and hits more.
        let l = loop_trace(20, 2_000);
        let most = 12 * (2_000 / 20 - 1);
        let held = moka(&l, 12, 1);
        assert!(held <= most, "held: {held} against at most {most}");
        let buffered = moka_buffered(&l, 12, 1);
        assert!(
            buffered > most,
            "buffered: {buffered} against at most {most}"
        );
    }

    #[test]
    fn lis_lines_expand_to_pages_and_lines_that_are_not_keys_are_errors() {
        let t = parse("10 3 0 0\n100 1 0 1\n".as_bytes(), true).unwrap();
        assert_eq!(t, vec![10, 11, 12, 100]);
        assert_eq!(parse("5\n\n7\n".as_bytes(), false).unwrap(), vec![5, 7]);
        let e = parse("5\nabc\n".as_bytes(), false).unwrap_err();
        assert!(e.contains("line 2") && e.contains("abc"), "{e}");
        assert!(parse("10 x 0 0\n".as_bytes(), true)
            .unwrap_err()
            .contains("line 1"));
    }

    #[test]
    fn an_empty_trace_file_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("runcache-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.trace");
        std::fs::write(&empty, "\n\n").unwrap();
        let e = load(&empty).unwrap_err();
        assert!(e.contains("empty.trace") && e.contains("no access"), "{e}");
        let bad = dir.join("bad.trace");
        std::fs::write(&bad, "1\n2\n0x3\n").unwrap();
        let e = load(&bad).unwrap_err();
        assert!(e.contains("bad.trace") && e.contains("line 3"), "{e}");
        assert!(load(&dir.join("absent.trace"))
            .unwrap_err()
            .contains("absent.trace"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_trace_of_one_key_hits_every_access_but_the_first_in_every_policy() {
        let trace = vec![42u64; 1_000];
        for cap in [1, 10] {
            assert_eq!(lru(&trace, cap), 999);
            assert_eq!(belady(&trace, cap), 999);
            assert_eq!(runcache(&trace, cap, 1, 7), 999);
            assert_eq!(moka(&trace, cap, 1), 999);
            assert_eq!(quick_cache(&trace, cap, 1), 999);
            assert_eq!(tinyufo(&trace, cap), 999);
            assert_eq!(runcache_bench::wtinylfu::replay(&trace, cap), 999);
        }
    }

    #[test]
    fn runcache_replayed_on_threads_builds_each_key_once_when_nothing_is_evicted() {
        // Every key read eight times in a row: threads that miss one key at once join one
        // build, so exactly one access per key misses, as on one thread.
        let trace: Vec<u64> = (0..200u64).flat_map(|k| [k; 8]).collect();
        for threads in [1, 4] {
            assert_eq!(
                runcache(&trace, 1_000, threads, 3),
                200 * 7,
                "{threads} threads"
            );
        }
    }
}
