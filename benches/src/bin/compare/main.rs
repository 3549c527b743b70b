//! The comparison runner: a short version of every benchmark workload, runcache against its
//! peers in the same run, printed as one table of ratios (runcache / peer) with the machine it
//! ran on.
//!
//! ```text
//! cargo run --release -p runcache-bench --bin compare                # print the table
//! cargo run --release -p runcache-bench --bin compare -- --write     # also regenerate docs/BENCHMARKS.md
//!                                                      # and the plots in docs/bench/
//! cargo run --release -p runcache-bench --bin compare -- --quick     # a fraction of the operations
//! cargo run --release -p runcache-bench --bin compare -- --only=hits,churn   # some sections
//! cargo run --release -p runcache-bench --bin compare -- --only=mixes,threads --plots=DIR
//!                                                      # the throughput plots, to DIR
//! ```
//!
//! Workloads (the criterion benches measure each one in more detail): hits on Zipf and
//! uniform keys, conc-map-bench's three operation mixes at 1, 2 and 4 threads (and 8 and 16
//! where the machine has the cores), churn with eviction at 1, 2, 16 and 64 threads, curves
//! of hit and churn throughput against the same thread counts, the single-flight storm, iteration over every entry, memory per
//! entry (a counting global allocator), and hit ratio against capacity on a Zipf trace. Each throughput is the best of
//! five runs, taken in turn with the other subjects of its comparison (see [`interleaved`]).

use runcache_bench as support;

// What every section uses: each of them imports the root's names (`use super::*`), these and
// the other sections' items below.
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;

mod expiry;
mod hits;
mod iteration;
mod measure;
mod memory;
mod ratio;
mod report;
mod storm;
mod targets;
mod threads;

use expiry::*;
use hits::*;
use iteration::*;
use measure::*;
use memory::*;
use ratio::*;
use report::*;
use storm::*;
use targets::*;
use threads::*;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    const SECTIONS: [&str; 9] = [
        "memory",
        "hits",
        "expiry",
        "mixes",
        "threads",
        "churn",
        "storm",
        "iteration",
        "ratio",
    ];
    let mut only: Option<Vec<String>> = None;
    let mut plots_to: Option<PathBuf> = None;
    for a in &args {
        if let Some(list) = a.strip_prefix("--only=") {
            let list: Vec<String> = list.split(',').map(str::to_string).collect();
            if let Some(bad) = list.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                eprintln!("unknown section {bad:?} in --only; the sections: {SECTIONS:?}");
                return ExitCode::from(2);
            }
            only = Some(list);
        } else if let Some(dir) = a.strip_prefix("--plots=") {
            if dir.is_empty() {
                eprintln!("--plots= needs a folder");
                return ExitCode::from(2);
            }
            plots_to = Some(PathBuf::from(dir));
        } else if !matches!(a.as_str(), "--write" | "--quick") {
            eprintln!(
                "unknown argument {a:?}; expected --write, --quick, --only=SECTION,.. or \
                 --plots=FOLDER"
            );
            return ExitCode::from(2);
        }
    }
    let quick = args.iter().any(|a| a == "--quick");
    let write = args.iter().any(|a| a == "--write");
    if write && only.is_some() {
        eprintln!("--write regenerates the whole report: it cannot be combined with --only");
        return ExitCode::from(2);
    }
    let run = |section: &str| only.as_ref().is_none_or(|o| o.iter().any(|s| s == section));
    let scale = if quick {
        Scale {
            hits: 1 << 18,
            mix_ops: 1 << 16,
            churn_ops: 1 << 17,
            storms: 5,
            trace: 100_000,
        }
    } else {
        Scale {
            hits: 1 << 21,
            mix_ops: 1 << 18,
            churn_ops: 1 << 20,
            storms: 20,
            trace: 500_000,
        }
    };
    let started = Instant::now();
    let mut rows = Vec::new();
    if run("memory") {
        eprintln!("memory per entry ...");
        memory(&mut rows);
    }
    if run("hits") {
        eprintln!("hits ...");
        hits(&scale, &mut rows);
        hits_uniform(&scale, &mut rows);
        hits_two_threads(&scale, &mut rows);
    }
    if run("expiry") {
        eprintln!("expiry ...");
        expiry(&scale, &mut rows);
    }
    let mut mix_plots = Vec::new();
    if run("mixes") {
        eprintln!("mixes ...");
        mix_plots = mixes(&scale, &mut rows);
    }
    if run("threads") {
        eprintln!("throughput against threads ...");
        mix_plots.extend(scaling(&scale));
    }
    if run("churn") {
        eprintln!("churn ...");
        churn(&scale, &mut rows);
    }
    let mut storm_result = (f64::NAN, 0);
    if run("storm") {
        eprintln!("storm ...");
        storm_result = storm(&scale, &mut rows);
    }
    if run("iteration") {
        eprintln!("iteration ...");
        iteration(&mut rows);
    }
    let (mut capacities, mut ratio_series) = (Vec::new(), Vec::new());
    if run("ratio") {
        eprintln!("hit ratio ...");
        (capacities, ratio_series) = hit_ratio(&scale);
    }
    let storm = storm_result;
    let machine = machine();
    let table = table(&rows);
    let targets = targets(&rows, storm);
    println!("machine: {machine}\n\n{table}\n{targets}");
    println!(
        "hit ratio (%), Zipf s=0.9 over 100k keys, {} accesses:",
        scale.trace
    );
    for s in &ratio_series {
        let v: Vec<String> = s.values.iter().map(|v| format!("{v:.1}")).collect();
        println!("  {:<12} {}", s.label, v.join("  "));
    }
    println!("  capacities   {}", capacities.join("  "));
    let threads: Vec<String> = curve_threads().iter().map(|t| t.to_string()).collect();
    for (_, title, series) in &mix_plots {
        println!("{title} (M ops/s at {} threads):", threads.join(", "));
        for s in series {
            let v: Vec<String> = s.values.iter().map(|v| format!("{v:.1}")).collect();
            println!("  {:<16} {}", s.label, v.join("  "));
        }
    }
    eprintln!("took {:.0} s", started.elapsed().as_secs_f64());
    if let Some(dir) = &plots_to {
        match write_plots(dir, &mix_plots) {
            Ok(_) => println!("wrote the throughput plots to {}", dir.display()),
            Err(e) => {
                eprintln!("could not write the plots to {}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
        }
    }
    if write {
        if let Err(e) = write_docs(
            &machine,
            &table,
            &targets,
            &mix_plots,
            &capacities,
            &ratio_series,
            &scale,
        ) {
            eprintln!("could not write the report: {e}");
            return ExitCode::FAILURE;
        }
        println!("wrote docs/BENCHMARKS.md and docs/bench/*.svg");
    }
    ExitCode::SUCCESS
}
