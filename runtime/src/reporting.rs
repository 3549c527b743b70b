//! What a run measured, and the three ways it is printed: a table per thread count, one JSON
//! object per run, or Markdown rows for `docs/BENCHMARKS.md`.

use crate::flags::{Options, TASKS_PER_THREAD};
use crate::store::Store;
use std::fmt::Write as _;
use std::time::Duration;

/// What one cache's run measured.
pub struct Report {
    pub name: &'static str,
    pub threads: usize,
    /// Requests taken, those refused at the row limit included.
    pub requests: usize,
    /// Requests that ran (all but the refused): the latencies' count.
    pub ran: usize,
    /// Distinct kernel shapes the requests needed.
    pub shapes: usize,
    /// Failed requests by kind: rows over the limit, compile, weights, other.
    pub failed: [usize; 4],
    /// Failures not injected on purpose.
    pub unexpected: usize,
    pub mismatches: usize,
    pub seconds: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
    /// Kernels compiled.
    pub compiles: usize,
    /// Compiles started, failed ones included.
    pub attempts: usize,
    /// Kernel lookups and weight lookups.
    pub lookups: usize,
    pub weight_lookups: usize,
    pub reorders: usize,
    /// The bytes of weights those reorders wrote.
    pub reordered_bytes: u64,
    pub compile_seconds: f64,
    /// The most bytes the caches held at a sample: kernels' code and weights.
    pub peak_bytes: u64,
    /// The weight budget, the samples of the weight cache's bytes, how many were over the
    /// budget, and the most it held.
    pub budget: u64,
    pub samples: u64,
    pub over_budget: u64,
    pub peak_weights: u64,
    /// The process's peak resident memory while this run served (0 where unknown).
    pub peak_rss: u64,
}

impl Report {
    /// Requests per second of serving: the requests that ran over the time the threads
    /// spent in them (the reference checks between requests are not counted).
    pub fn per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ran as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Kernel lookups that needed no compile (nor a failed try).
    pub fn avoided(&self) -> usize {
        self.lookups.saturating_sub(self.attempts)
    }

    /// The kernel cache's hit ratio.
    pub fn hit_ratio(&self) -> f64 {
        if self.lookups == 0 {
            return 0.0;
        }
        self.avoided() as f64 / self.lookups as f64
    }

    /// The weight cache's hit ratio: lookups that needed no reorder.
    pub fn weight_hit_ratio(&self) -> f64 {
        if self.weight_lookups == 0 {
            return 0.0;
        }
        self.weight_lookups.saturating_sub(self.reorders) as f64 / self.weight_lookups as f64
    }

    /// The weight bytes reordered per request served: what the weight cache's misses cost.
    pub fn reordered_per_request(&self) -> f64 {
        if self.ran == 0 {
            return 0.0;
        }
        self.reordered_bytes as f64 / self.ran as f64
    }

    /// The share of samples at which the weight cache held more than the budget.
    pub fn over_budget_share(&self) -> f64 {
        if self.samples == 0 {
            return 0.0;
        }
        self.over_budget as f64 / self.samples as f64
    }

    pub fn failures(&self) -> usize {
        self.failed.iter().sum()
    }
}

const MIB: f64 = (1 << 20) as f64;

pub fn print_json(reports: &[Report], o: &Options) {
    for r in reports {
        println!(
            "{{\"cache\":\"{}\",\"threads\":{},\"async\":{},\"hidden\":{},\"models\":{},\
             \"popularity\":{},\"shift\":{},\"requests\":{},\"shapes\":{},\
             \"failed\":{},\"failed_rows\":{},\"failed_compile\":{},\"failed_weights\":{},\
             \"failed_other\":{},\"unexpected_failures\":{},\"mismatches\":{},\
             \"requests_per_second\":{:.1},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"p999_ms\":{:.3},\
             \"compiles\":{},\"compiles_avoided\":{},\"hit_ratio\":{:.4},\
             \"weight_reorders\":{},\"weight_reordered_bytes\":{},\"weight_hit_ratio\":{:.4},\
             \"compile_seconds\":{:.3},\
             \"peak_cache_bytes\":{},\"weight_budget_bytes\":{},\"peak_weight_bytes\":{},\
             \"weight_samples\":{},\"weight_samples_over_budget\":{},\"peak_rss_bytes\":{}}}",
            r.name,
            r.threads,
            o.asynchronous,
            o.hidden,
            o.models,
            o.popularity,
            o.shift,
            r.requests,
            r.shapes,
            r.failures(),
            r.failed[0],
            r.failed[1],
            r.failed[2],
            r.failed[3],
            r.unexpected,
            r.mismatches,
            r.per_second(),
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.p999.as_secs_f64() * 1e3,
            r.compiles,
            r.avoided(),
            r.hit_ratio(),
            r.reorders,
            r.reordered_bytes,
            r.weight_hit_ratio(),
            r.compile_seconds,
            r.peak_bytes,
            r.budget,
            r.peak_weights,
            r.samples,
            r.over_budget,
            r.peak_rss
        );
    }
}

/// runcache's requests per second over `r`'s, in the same run and thread count.
fn speed_up(reports: &[Report], r: &Report) -> Option<f64> {
    let ours = runcache_beside(reports, r)?;
    (r.per_second() > 0.0).then(|| ours.per_second() / r.per_second())
}

/// `r`'s p99 latency over runcache's, in the same run and thread count (above 1: runcache's
/// tail is shorter).
fn tail_ratio(reports: &[Report], r: &Report) -> Option<f64> {
    let ours = runcache_beside(reports, r)?;
    (ours.p99 > Duration::ZERO).then(|| r.p99.as_secs_f64() / ours.p99.as_secs_f64())
}

/// runcache's report at `r`'s thread count.
fn runcache_beside<'a>(reports: &'a [Report], r: &Report) -> Option<&'a Report> {
    reports
        .iter()
        .find(|x| x.name == "runcache" && x.threads == r.threads)
}

pub fn print_table(reports: &[Report], o: &Options) {
    let mut counts: Vec<usize> = reports.iter().map(|r| r.threads).collect();
    counts.dedup();
    let budget = reports.first().map_or(0, |r| r.budget);
    for threads in counts {
        let mode = if o.asynchronous { ", async tasks" } else { "" };
        println!(
            "\n{threads} thread(s){mode}, weight budget {:.1} MiB:",
            budget as f64 / MIB
        );
        println!(
            "{:<14} {:>8} {:>8} {:>7} {:>7} {:>7} {:>8} {:>6} {:>8} {:>8} {:>6} {:>9} {:>6} {:>7} {:>6}",
            "cache",
            "requests",
            "req/s",
            "p50 ms",
            "p99 ms",
            "p99.9",
            "compiles",
            "k-hit",
            "reorders",
            "KiB/req",
            "w-hit",
            "peak MiB",
            "over",
            "RSS MiB",
            "failed"
        );
        let rows: Vec<&Report> = reports.iter().filter(|r| r.threads == threads).collect();
        for r in &rows {
            println!(
                "{:<14} {:>8} {:>8.0} {:>7.3} {:>7.3} {:>7.3} {:>8} {:>5.1}% {:>8} {:>8.0} {:>5.1}% {:>9.1} {:>5.1}% {:>7.0} {:>6}",
                r.name,
                r.requests,
                r.per_second(),
                r.p50.as_secs_f64() * 1e3,
                r.p99.as_secs_f64() * 1e3,
                r.p999.as_secs_f64() * 1e3,
                r.compiles,
                100.0 * r.hit_ratio(),
                r.reorders,
                r.reordered_per_request() / 1024.0,
                100.0 * r.weight_hit_ratio(),
                r.peak_weights as f64 / MIB,
                100.0 * r.over_budget_share(),
                r.peak_rss as f64 / MIB,
                r.failures()
            );
        }
        for (what, ratio) in [
            (
                "requests/s",
                speed_up as fn(&[Report], &Report) -> Option<f64>,
            ),
            ("p99 latency", tail_ratio),
        ] {
            let mut line = format!("runcache speed-up ({what}):");
            let before = line.len();
            for r in rows.iter().filter(|r| r.name != "runcache") {
                if let Some(x) = ratio(reports, r) {
                    let _ = write!(line, " {x:.2}x {}", r.name);
                }
            }
            if line.len() > before {
                println!("{line}");
            }
        }
        let failures: Vec<String> = rows
            .iter()
            .filter(|r| r.failures() > 0)
            .map(|r| {
                format!(
                    "{}: {} over the row limit, {} compile, {} weights, {} other",
                    r.name, r.failed[0], r.failed[1], r.failed[2], r.failed[3]
                )
            })
            .collect();
        if !failures.is_empty() {
            println!("failed requests: {}", failures.join("; "));
        }
    }
}

pub fn print_markdown(reports: &[Report], o: &Options, store: &Store, models: &str) {
    let mode = if o.asynchronous {
        format!(", {TASKS_PER_THREAD} async tasks per thread")
    } else {
        String::new()
    };
    let budget = reports.first().map_or(0, |r| r.budget);
    println!(
        "{models}, {} requests per row, weights in {} under a budget of {:.1} MiB{mode}.\n",
        o.requests,
        store.describe(),
        budget as f64 / MIB
    );
    println!(
        "| threads | cache | requests/s | p50 ms | p99 ms | p99.9 ms | compiles | kernel hits | \
         reorders | KiB reordered per request | weight hits | peak weight MiB | \
         samples over budget | peak RSS MiB | runcache speed-up (req/s, p99) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        let x = match r.name {
            "runcache" => "—".to_string(),
            _ => match (speed_up(reports, r), tail_ratio(reports, r)) {
                (Some(a), Some(b)) => format!("{a:.2}×, {b:.2}×"),
                _ => "—".into(),
            },
        };
        println!(
            "| {} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {} | {:.1}% | {} | {:.0} | {:.1}% | {:.1} | {:.1}% | {:.0} | {} |",
            r.threads,
            r.name,
            r.per_second(),
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.p999.as_secs_f64() * 1e3,
            r.compiles,
            100.0 * r.hit_ratio(),
            r.reorders,
            r.reordered_per_request() / 1024.0,
            100.0 * r.weight_hit_ratio(),
            r.peak_weights as f64 / MIB,
            100.0 * r.over_budget_share(),
            r.peak_rss as f64 / MIB,
            x
        );
    }
}
