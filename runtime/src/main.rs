//! The README's main job: serves a stream of requests whose shapes vary as serving traffic
//! does, with each cache in turn holding the compiled kernels and the reordered weights,
//! checks every response against the plain reference, and prints a table per cache with the
//! speed-up of runcache over each alternative in the same run. With `--models N` it serves
//! many models of different widths under one weight budget, chosen by a skewed popularity
//! that `--shift` moves halfway: where the choice of cache shows under memory pressure.
//!
//! ```text
//! cargo run --release -p runcache-runtime -- [options]
//!
//!   --cache C,..        runcache, moka, quick_cache, mutex-hashmap, none (default: all five)
//!   --threads N,..      serving threads; a list runs each count in turn (default 2)
//!   --requests N        requests per cache and thread count (default 1500)
//!   --kernels N         kernels each kernel cache holds (default 1024)
//!   --models N          models served, hidden widths drawn from 64 to 1024 by --seed
//!                       (default 1, whose width --hidden sets)
//!   --popularity S      Zipf exponent of the models' popularity, 0 or more (default 1)
//!   --shift             halfway through, the popularity moves: rank k becomes model
//!                       k + N/2, so cold models turn hot (default: off)
//!   --budget-mib N      the weight budget of every cache, in MiB; wins over the
//!                       environment (default: the environment, else 64, or half the
//!                       device's budget with --gpu)
//!   --hidden N          width of the one model's hidden layers, a multiple of 8 up to
//!                       4096 (default 64)
//!   --seed N            the models' and the requests' seed (default 42)
//!   --inject F:P,..     fail on purpose, 1 time in P: `compile` (a kernel's compile) or
//!                       `oversize` (a request over the model's 4096 rows) (default: none)
//!   --gpu               reordered weights in Vulkan device buffers (build with
//!                       --features vulkan); the kernels still run here (default: host)
//!   --async             serve from async tasks, four per thread, each thread its own
//!                       tokio runtime; lookups await (default: blocking threads)
//!   --json              one JSON object per cache and thread count instead of the table
//!   --markdown          the table as Markdown, for docs/BENCHMARKS.md
//!   -h, --help          this text
//!
//! RUNCACHE_CONSTANT_CACHE_CAPACITY   the weight budget in MiB when --budget-mib is not
//!                                    given: the `cpu:` field, or `gpu:` with --gpu
//! ```
//!
//! Each run starts with an unmeasured warm-up (up to 100 requests with no cache). Every
//! cache gets the same kernel capacity (entries) and the same weight budget (bytes,
//! each buffer weighing its size): runcache an evicting constant cache, moka its weigher,
//! quick_cache its weighter, the mutex-guarded map its least recently used entries evicted
//! by weight. On a terminal a progress bar follows each cache's run (plain lines otherwise);
//! Ctrl-C stops the run and prints the figures so far. The exit status is 1 when a response
//! differs from the reference or a request fails for a reason not injected, 2 for a bad flag
//! or environment, or models that would not fit in memory.

mod backend;
mod failure;
mod flags;
mod peers;
mod reporting;
mod serving;
mod store;
mod traffic;

use flags::{Output, MAX_HIDDEN};
use runcache::constant;
use serving::STOP;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use store::Store;
use traffic::{Traffic, INPUT, OUTPUT};

fn main() -> ExitCode {
    let o = match flags::parse_args(std::env::args().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(problem) = constant::env_report().parsed.errors.first() {
        eprintln!("runtime: {}: {problem}", constant::ENV_VAR);
        return ExitCode::from(2);
    }
    let store = match Store::open(o.gpu) {
        Ok(store) => store,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let budget = store.budget(o.budget_mib);
    let widths = traffic::widths(&o);
    debug_assert!(widths.iter().all(|&h| h <= MAX_HIDDEN));
    if let Err(e) = traffic::check_memory(&widths, budget) {
        eprintln!("runtime: {e}");
        return ExitCode::from(2);
    }
    let traffic = Traffic::new(&o, &widths);
    let models = if o.models == 1 {
        format!("MLP {:?}", [INPUT, o.hidden, o.hidden, OUTPUT])
    } else {
        format!(
            "{} MLPs [{INPUT}, h, h, {OUTPUT}] with h from {} to {} ({:.1} MiB of weights, the \
             smallest {:.2} MiB), popularity Zipf {}{}",
            o.models,
            widths.iter().min().unwrap_or(&0),
            widths.iter().max().unwrap_or(&0),
            traffic.weight_bytes() as f64 / (1u64 << 20) as f64,
            traffic.smallest_model_bytes() as f64 / (1u64 << 20) as f64,
            o.popularity,
            if o.shift { ", shifted halfway" } else { "" }
        )
    };
    if o.output == Output::Table {
        println!(
            "model: {models}; kernels JIT-compiled per (rows, layer) with Cranelift, at most {} \
             cached; weights in {} under {:.1} MiB; {} requests per cache",
            o.kernels,
            store.describe(),
            budget as f64 / (1u64 << 20) as f64,
            o.requests
        );
    }
    if let Err(e) = ctrlc::set_handler(|| STOP.store(true, Ordering::Relaxed)) {
        eprintln!("runtime: Ctrl-C will not print the figures so far: {e}");
    }
    // An unmeasured warm-up, so that the first cache measured does not pay for the process's
    // first page faults, allocator growth and JIT set-up alone: up to 100 requests served
    // with no cache (every kernel compiled, every weight reordered).
    let warm_up = flags::Options {
        requests: o.requests.min(100),
        output: Output::Json,
        ..o.clone()
    };
    let first = o.threads.first().copied().unwrap_or(1);
    let warmed = serving::serve(
        &traffic,
        flags::Choice::None,
        first,
        &warm_up,
        &store,
        budget,
    );
    if o.output != Output::Json && !std::io::stderr().is_terminal() {
        eprintln!(
            "warm-up: {} requests with no cache in {:.2} s of serving time",
            warmed.requests, warmed.seconds
        );
    }
    let mut reports = Vec::new();
    'runs: for &threads in &o.threads {
        for &c in &o.caches {
            let report = serving::serve(&traffic, c, threads, &o, &store, budget);
            if o.output != Output::Json && !std::io::stderr().is_terminal() {
                eprintln!(
                    "{} on {threads} thread(s): {} requests served in {:.2} s of serving time",
                    report.name, report.requests, report.seconds
                );
            }
            reports.push(report);
            if STOP.load(Ordering::Relaxed) {
                eprintln!("runtime: interrupted; the figures so far:");
                break 'runs;
            }
        }
    }
    match o.output {
        Output::Json => reporting::print_json(&reports, &o),
        Output::Table => reporting::print_table(&reports, &o),
        Output::Markdown => reporting::print_markdown(&reports, &o, &store, &models),
    }
    if reports.iter().any(|r| r.mismatches > 0) {
        eprintln!("runtime: a response differed from the reference");
        return ExitCode::FAILURE;
    }
    if reports.iter().any(|r| r.unexpected > 0) {
        eprintln!("runtime: requests failed (see above)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
