//! Serving: one run of one cache at one thread count. Each request takes its model's three
//! kernels and three weight buffers from the caches under test, runs in a scratch pool, and
//! is checked against the plain reference; the weight cache's bytes and the process's
//! resident memory are sampled while it serves.

use crate::backend::Backend;
use crate::failure::Failure;
use crate::flags::{Choice, Options, Output, TASKS_PER_THREAD};
use crate::reporting::Report;
use crate::store::{chain, Store};
use crate::traffic::{Traffic, MAX_ROWS};
use runcache::pool::PoolManager;
use runcache_runtime::model;
use runcache_runtime::{forward, Scratch, Shape};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Set by Ctrl-C: the serving threads stop taking requests.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Responses of an async serving thread that may wait for their reference check.
const UNCHECKED: usize = 1024;
/// The weight cache's bytes are sampled every this many requests, the process's resident
/// memory every `RSS_EVERY`.
const SAMPLE_EVERY: usize = 4;
const RSS_EVERY: usize = 16;

/// The process's resident memory, where `/proc/self/status` tells it.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What the serving threads of one run count together.
struct Tally {
    name: &'static str,
    next: AtomicUsize,
    bar: indicatif::ProgressBar,
    failed: [AtomicUsize; 4],
    unexpected: AtomicUsize,
    mismatches: AtomicUsize,
    /// The most bytes the caches held at a sample (kernels' code and weights).
    peak: AtomicU64,
    /// What the weight cache held against its budget.
    samples: AtomicU64,
    over_budget: AtomicU64,
    peak_weights: AtomicU64,
    peak_rss: AtomicU64,
    /// Nanoseconds async serving threads spent blocked on a full channel to their checker.
    blocked: AtomicU64,
}

/// A request to serve: its index, model, rows and input.
struct Request {
    r: usize,
    model: usize,
    m: usize,
    input: Vec<f32>,
}

impl Tally {
    /// The next request, or `None` once all are taken or Ctrl-C was pressed. A request over
    /// the model's limit is refused here, before any work, and left out of the latencies.
    fn take(&self, traffic: &Traffic, o: &Options) -> Option<Option<Request>> {
        let r = self.next.fetch_add(1, Ordering::Relaxed);
        if r >= o.requests || STOP.load(Ordering::Relaxed) {
            return None;
        }
        self.bar.inc(1);
        let ask = traffic.ask(r);
        if ask.rows > MAX_ROWS {
            let limit = MAX_ROWS;
            self.fail(
                r,
                Failure::Rows {
                    rows: ask.rows,
                    limit,
                },
            );
            return Some(None);
        }
        let mlp = &traffic.models[ask.model];
        let input = model::request_input(mlp, ask.rows, o.seed ^ r as u64);
        Some(Some(Request {
            r,
            model: ask.model,
            m: ask.rows,
            input,
        }))
    }

    fn fail(&self, r: usize, e: Failure) {
        self.failed[e.slot()].fetch_add(1, Ordering::Relaxed);
        if !e.injected() && self.unexpected.fetch_add(1, Ordering::Relaxed) < 3 {
            eprintln!("runtime: {}: request {r} failed: {e}", self.name);
        }
    }

    /// Samples the weight cache's bytes against the budget, and now and then the resident
    /// memory and the caches' whole footprint.
    fn sample(&self, r: usize, backend: &Backend) {
        if r.is_multiple_of(SAMPLE_EVERY) {
            let (held, budget) = backend.weight_usage();
            self.samples.fetch_add(1, Ordering::Relaxed);
            if held > budget {
                self.over_budget.fetch_add(1, Ordering::Relaxed);
            }
            self.peak_weights.fetch_max(held, Ordering::Relaxed);
        }
        if r.is_multiple_of(RSS_EVERY) {
            if let Some(rss) = resident_bytes() {
                self.peak_rss.fetch_max(rss, Ordering::Relaxed);
            }
        }
        if r.is_multiple_of(64) {
            self.peak.fetch_max(backend.bytes(), Ordering::Relaxed);
            backend.follow_budget();
        }
    }

    /// Checks a request's response against the reference (or counts its failure).
    fn check(
        &self,
        traffic: &Traffic,
        q: &Request,
        out: Result<&[f32], Failure>,
        backend: &Backend,
    ) {
        match out {
            Ok(out) => {
                if out != model::reference(&traffic.models[q.model], &q.input, q.m) {
                    self.mismatches.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => self.fail(q.r, e),
        }
        self.sample(q.r, backend);
    }
}

/// Serves `o.requests` requests of `traffic` on `threads` threads with the caches of
/// `choice`, the weights in `store` under `budget` bytes.
pub fn serve(
    traffic: &Traffic,
    choice: Choice,
    threads: usize,
    o: &Options,
    store: &Store,
    budget: u64,
) -> Report {
    let backend = Backend::new(choice, o, store, budget);
    // One scratch pool per request in flight at most; a pool keeps its buffers' capacity.
    let in_flight = if o.asynchronous {
        threads * TASKS_PER_THREAD
    } else {
        threads
    };
    let scratch = PoolManager::builder(Scratch::default)
        .max_pools(in_flight)
        .build()
        .expect("at least one pool");
    let bar = if std::io::stderr().is_terminal() && o.output == Output::Table {
        let bar = indicatif::ProgressBar::new(o.requests as u64);
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{msg:>22} [{bar:30}] {pos}/{len} {per_sec}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        let mode = if o.asynchronous { " async" } else { "" };
        bar.set_message(format!("{}{mode} x{threads}", choice.name()));
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let tally = Tally {
        name: choice.name(),
        next: AtomicUsize::new(0),
        bar,
        failed: Default::default(),
        unexpected: AtomicUsize::new(0),
        mismatches: AtomicUsize::new(0),
        peak: AtomicU64::new(0),
        samples: AtomicU64::new(0),
        over_budget: AtomicU64::new(0),
        peak_weights: AtomicU64::new(0),
        peak_rss: AtomicU64::new(0),
        blocked: AtomicU64::new(0),
    };
    let (backend, tally, scratch) = (&backend, &tally, &scratch);
    // The blocking serving thread: one request at a time.
    let blocking = || {
        let mut mine = Vec::new();
        while let Some(taken) = tally.take(traffic, o) {
            let Some(q) = taken else { continue };
            let mlp = &traffic.models[q.model];
            let began = Instant::now();
            // Activations go to a scratch pool reserved for the request.
            let mut pool = match scratch.reserve() {
                Ok(pool) => pool,
                Err(e) => {
                    tally.fail(q.r, Failure::Scratch(chain(&e)));
                    continue;
                }
            };
            let out = forward(
                mlp,
                &q.input,
                q.m,
                |_, shape| backend.kernel(shape),
                |l| backend.weights(mlp, q.model, l),
                &mut pool,
            );
            mine.push(began.elapsed());
            tally.check(traffic, &q, out, backend);
        }
        mine
    };
    // An async task: awaits its kernels and weights (compiles run on the blocking pool, and a
    // task whose kernel another task is building waits without blocking its thread). It hands
    // each response to `checked`, whose thread compares it with the reference, so that no
    // task's latency includes another's reference check.
    type Response = (Request, Result<Vec<f32>, Failure>);
    let task = |checked: std::sync::mpsc::SyncSender<Response>| async move {
        let mut mine = Vec::new();
        while let Some(taken) = tally.take(traffic, o) {
            let Some(q) = taken else { continue };
            let mlp = &traffic.models[q.model];
            let began = Instant::now();
            let out = async {
                let mut kernels = Vec::with_capacity(mlp.layers.len());
                let mut weights = Vec::with_capacity(mlp.layers.len());
                for (l, layer) in mlp.layers.iter().enumerate() {
                    let shape = Shape {
                        m: q.m,
                        k: layer.k,
                        n: layer.n,
                        relu: layer.relu,
                    };
                    kernels.push(backend.kernel_async(shape).await?);
                    weights.push(backend.weights_async(mlp, q.model, l).await?);
                }
                let mut pool = scratch
                    .reserve_async()
                    .await
                    .map_err(|e| Failure::Scratch(chain(&e)))?;
                let ok = |l: usize| Ok::<_, Failure>(l);
                forward(
                    mlp,
                    &q.input,
                    q.m,
                    |l, _| ok(l).map(|l| &*kernels[l]),
                    |l| ok(l).map(|l| &*weights[l]),
                    &mut pool,
                )
                .map(<[f32]>::to_vec)
            }
            .await;
            mine.push(began.elapsed());
            // Time blocked on a full channel stops the whole thread: it is not serving time.
            let waited = Instant::now();
            let sent = checked.send((q, out));
            tally
                .blocked
                .fetch_add(waited.elapsed().as_nanos() as u64, Ordering::Relaxed);
            if let Err(unchecked) = sent {
                // The checker is gone (it panicked): count the response as a mismatch.
                tally.fail(
                    unchecked.0 .0.r,
                    Failure::Cache("no reference check".into()),
                );
            }
        }
        mine
    };
    // Each serving thread's latencies, and with `--async` the wall time it served for.
    let served: Vec<(Vec<Duration>, Option<Duration>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    if !o.asynchronous {
                        return Ok((blocking(), None));
                    }
                    // Bounded: a checker that falls behind holds its serving thread back
                    // (the thread blocks on a full channel), so a long run's unchecked
                    // responses stay within the bound instead of piling up.
                    let (send, receive) = std::sync::mpsc::sync_channel::<Response>(UNCHECKED);
                    s.spawn(move || {
                        for (q, out) in receive {
                            tally.check(traffic, &q, out.as_deref().map_err(Clone::clone), backend);
                        }
                    });
                    // A current-thread runtime per serving thread, its tasks polled together.
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .map_err(|e| format!("a tokio runtime: {e}"))?;
                    let tasks: Vec<_> = (0..TASKS_PER_THREAD).map(|_| task(send.clone())).collect();
                    // The checker ends once the tasks, holding the other senders, are done.
                    drop(send);
                    let began = Instant::now();
                    let mine = rt.block_on(futures_util::future::join_all(tasks)).concat();
                    Ok::<_, String>((mine, Some(began.elapsed())))
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|w| match w.join().expect("a worker panicked") {
                Ok(mine) => Some(mine),
                Err(e) => {
                    eprintln!("runtime: {e}");
                    tally.unexpected.fetch_add(1, Ordering::Relaxed);
                    None
                }
            })
            .collect()
    });
    // Serving time per thread: the threads' time in requests (blocking), or their wall time
    // (async: a task's latency includes its waits for the thread, so latencies overlap).
    let busy: f64 = served
        .iter()
        .map(|(mine, wall)| match wall {
            Some(wall) => wall.as_secs_f64(),
            None => mine.iter().map(Duration::as_secs_f64).sum(),
        })
        .sum::<f64>()
        - tally.blocked.load(Ordering::Relaxed) as f64 / 1e9;
    let mut latencies: Vec<Duration> = served.into_iter().flat_map(|(mine, _)| mine).collect();
    tally.bar.finish_and_clear();
    let ran = latencies.len();
    let failed = tally.failed.each_ref().map(|f| f.load(Ordering::Relaxed));
    tally.peak.fetch_max(backend.bytes(), Ordering::Relaxed);
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((ran.max(1) - 1) as f64 * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    let taken = ran + failed[0];
    Report {
        name: choice.name(),
        threads,
        requests: taken,
        ran,
        shapes: (0..taken)
            .map(|r| traffic.ask(r))
            .filter(|a| a.rows <= MAX_ROWS)
            .flat_map(|a| {
                traffic.models[a.model]
                    .layers
                    .iter()
                    .map(move |l| (a.rows, l.k, l.n, l.relu))
            })
            .collect::<std::collections::HashSet<_>>()
            .len(),
        failed,
        unexpected: tally.unexpected.load(Ordering::Relaxed),
        mismatches: tally.mismatches.load(Ordering::Relaxed),
        seconds: busy / threads as f64,
        p50: at(0.5),
        p99: at(0.99),
        p999: at(0.999),
        compiles: backend.compiles.load(Ordering::Relaxed),
        attempts: backend.attempts.load(Ordering::Relaxed),
        lookups: backend.lookups.load(Ordering::Relaxed),
        weight_lookups: backend.weight_lookups.load(Ordering::Relaxed),
        reorders: backend.reorders.load(Ordering::Relaxed),
        reordered_bytes: backend.reordered_bytes.load(Ordering::Relaxed),
        compile_seconds: backend.compile_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        peak_bytes: tally.peak.load(Ordering::Relaxed),
        budget,
        samples: tally.samples.load(Ordering::Relaxed),
        over_budget: tally.over_budget.load(Ordering::Relaxed),
        peak_weights: tally.peak_weights.load(Ordering::Relaxed),
        peak_rss: tally.peak_rss.load(Ordering::Relaxed),
    }
}
