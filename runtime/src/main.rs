//! The README's main job: serves a stream of requests whose shapes vary as serving traffic
//! does, with each cache in turn holding the compiled kernels and the reordered weights,
//! checks every response against the plain reference, and prints a table per cache with the
//! speed-up of runcache over each alternative in the same run.
//!
//! ```text
//! cargo run --release -p runcache-runtime -- [options]
//!
//!   --cache C,..        runcache, moka, quick_cache, mutex-hashmap, none (default: all five)
//!   --threads N         serving threads (default 2)
//!   --requests N        requests per cache (default 1500)
//!   --kernels N         kernels a cache holds (default 1024)
//!   --seed N            the model's and the requests' seed (default 42)
//!   --json              one JSON object per cache instead of the table
//!   -h, --help          this text
//!
//! RUNCACHE_CONSTANT_CACHE_CAPACITY   runcache's weight budget (see runcache::constant)
//! ```
//!
//! On a terminal a progress bar follows each cache's run (plain lines otherwise); Ctrl-C
//! stops the run and prints the figures so far.

use runcache::constant::{self, ConstantKey};
use runcache::pool::PoolManager;
use runcache::{Cache, ConstantBuffer, DeviceKind, Handle};
use runcache_runtime::model::{self, reorder, Mlp};
use runcache_runtime::{forward, Kernel, KernelError, Scratch, Shape};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::ops::Deref;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Set by Ctrl-C: the serving threads stop taking requests.
static STOP: AtomicBool = AtomicBool::new(false);

/// The model's layer widths: input, two hidden layers, output.
const WIDTHS: [usize; 4] = [32, 64, 64, 32];
/// Batch sizes and how often each comes (serving traffic: mostly small batches).
const BATCHES: [(usize, u64); 4] = [(1, 50), (2, 25), (4, 15), (8, 10)];
/// Sequence lengths are multiples of this, up to `SEQ_STEPS` of them.
const SEQ_STEP: usize = 8;
const SEQ_STEPS: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Runcache,
    Moka,
    QuickCache,
    MutexHashMap,
    None,
}

impl Choice {
    const ALL: [Choice; 5] = [
        Choice::Runcache,
        Choice::Moka,
        Choice::QuickCache,
        Choice::MutexHashMap,
        Choice::None,
    ];

    fn name(self) -> &'static str {
        match self {
            Choice::Runcache => "runcache",
            Choice::Moka => "moka",
            Choice::QuickCache => "quick_cache",
            Choice::MutexHashMap => "mutex-hashmap",
            Choice::None => "none",
        }
    }
}

struct Options {
    caches: Vec<Choice>,
    threads: usize,
    requests: usize,
    kernels: usize,
    seed: u64,
    json: bool,
}

fn usage() -> String {
    let usage: Vec<&str> = include_str!("main.rs")
        .lines()
        .map(|l| l.trim_start_matches("//! ").trim_start_matches("//!"))
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    usage.join("\n")
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let mut o = Options {
        caches: Choice::ALL.to_vec(),
        threads: 2,
        requests: 1500,
        kernels: 1024,
        seed: 42,
        json: false,
    };
    let mut args = args;
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |flag: &str, v: String| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: `{v}` is not a whole number"))
        };
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{}", usage());
                return Ok(None);
            }
            "--cache" => {
                let v = value("--cache")?;
                o.caches = v
                    .split(',')
                    .map(|name| {
                        Choice::ALL
                            .into_iter()
                            .find(|c| c.name() == name)
                            .ok_or_else(|| {
                                format!(
                                    "--cache: unknown cache `{name}` (runcache, moka, \
                                     quick_cache, mutex-hashmap or none)"
                                )
                            })
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--threads" => o.threads = number("--threads", value("--threads")?)?,
            "--requests" => o.requests = number("--requests", value("--requests")?)?,
            "--kernels" => o.kernels = number("--kernels", value("--kernels")?)?,
            "--seed" => o.seed = number("--seed", value("--seed")?)? as u64,
            "--json" => o.json = true,
            other => return Err(format!("unknown flag `{other}` (see --help)")),
        }
    }
    for (flag, v) in [
        ("--threads", o.threads),
        ("--requests", o.requests),
        ("--kernels", o.kernels),
    ] {
        if v == 0 {
            return Err(format!("{flag}: must be at least 1"));
        }
    }
    Ok(Some(o))
}

/// A kernel, as whichever cache handed it out.
enum HeldKernel {
    Arc(Arc<Kernel>),
    Handle(Handle<Arc<Kernel>>),
}

impl Deref for HeldKernel {
    type Target = Kernel;
    fn deref(&self) -> &Kernel {
        match self {
            HeldKernel::Arc(a) => a,
            HeldKernel::Handle(h) => h,
        }
    }
}

/// Reordered weights, as whichever cache handed them out.
enum HeldWeights {
    Arc(Arc<[f32]>),
    /// A host constant buffer made by `weights_buffer` (aligned for `f32`).
    Buffer(Handle<ConstantBuffer>),
}

impl Deref for HeldWeights {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            HeldWeights::Arc(a) => a,
            HeldWeights::Buffer(b) => bytemuck::cast_slice(b.as_slice().unwrap_or(&[])),
        }
    }
}

/// Why a request failed.
#[derive(Debug)]
enum Failure {
    Kernel(KernelError),
    Weights(String),
}

impl From<KernelError> for Failure {
    fn from(e: KernelError) -> Self {
        Failure::Kernel(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Kernel(e) => write!(f, "{e}"),
            Failure::Weights(e) => write!(f, "weights: {e}"),
        }
    }
}

/// The kernel and weight caches of one run. One is made per run and never moved after, so
/// its variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Caches {
    Runcache {
        kernels: Cache<Shape, Arc<Kernel>>,
        /// A CPU constant cache, with its byte budget.
        weights: constant::ConstantCache,
    },
    Moka {
        kernels: moka::sync::Cache<Shape, Arc<Kernel>>,
        weights: moka::sync::Cache<usize, Arc<[f32]>>,
    },
    QuickCache {
        kernels: quick_cache::sync::Cache<Shape, Arc<Kernel>>,
        weights: quick_cache::sync::Cache<usize, Arc<[f32]>>,
    },
    /// What a runtime without a cache library writes: a map behind a mutex, each kernel
    /// compiled outside the lock (two threads that miss together both compile).
    MutexHashMap {
        kernels: Mutex<HashMap<Shape, Arc<Kernel>>>,
        weights: Mutex<HashMap<usize, Arc<[f32]>>>,
    },
    /// Every request compiles its kernels and reorders its weights.
    None,
}

/// One run's caches and counts.
struct Backend {
    caches: Caches,
    compiles: AtomicUsize,
    lookups: AtomicUsize,
    reorders: AtomicUsize,
    compile_nanos: AtomicU64,
}

/// Locks a map of the mutex-hashmap runtime (a panic elsewhere leaves the map usable).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Backend {
    fn new(choice: Choice, kernels: usize) -> Self {
        let caches = match choice {
            Choice::Runcache => {
                // The weight budget: the `cpu:` field of RUNCACHE_CONSTANT_CACHE_CAPACITY in
                // MiB when set, else 64 MiB.
                let mb = constant::env_capacity_mb(DeviceKind::Cpu).unwrap_or(64);
                Caches::Runcache {
                    kernels: Cache::builder()
                        .capacity(kernels as u64)
                        .build()
                        .expect("default shards are valid"),
                    weights: constant::ConstantCache::with_capacity_bytes(
                        DeviceKind::Cpu,
                        mb.saturating_mul(1 << 20),
                    ),
                }
            }
            Choice::Moka => Caches::Moka {
                kernels: moka::sync::Cache::new(kernels as u64),
                weights: moka::sync::Cache::new(64),
            },
            Choice::QuickCache => Caches::QuickCache {
                kernels: quick_cache::sync::Cache::new(kernels),
                weights: quick_cache::sync::Cache::new(64),
            },
            Choice::MutexHashMap => Caches::MutexHashMap {
                kernels: Mutex::new(HashMap::new()),
                weights: Mutex::new(HashMap::new()),
            },
            Choice::None => Caches::None,
        };
        Backend {
            caches,
            compiles: AtomicUsize::new(0),
            lookups: AtomicUsize::new(0),
            reorders: AtomicUsize::new(0),
            compile_nanos: AtomicU64::new(0),
        }
    }

    fn compile(&self, shape: Shape) -> Result<Arc<Kernel>, KernelError> {
        let start = Instant::now();
        let kernel = Kernel::compile(shape)?;
        self.compile_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.compiles.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(kernel))
    }

    fn kernel(&self, shape: Shape) -> Result<HeldKernel, Failure> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let compile = || self.compile(shape);
        Ok(match &self.caches {
            Caches::Runcache { kernels, .. } => HeldKernel::Handle(
                kernels
                    .try_get_or_insert_with(shape, compile)
                    .map_err(|e| Failure::Kernel((*e).clone()))?,
            ),
            Caches::Moka { kernels, .. } => HeldKernel::Arc(
                kernels
                    .try_get_with(shape, compile)
                    .map_err(|e| Failure::Kernel((*e).clone()))?,
            ),
            Caches::QuickCache { kernels, .. } => {
                HeldKernel::Arc(kernels.get_or_insert_with(&shape, compile)?)
            }
            Caches::MutexHashMap { kernels, .. } => {
                let found = lock(kernels).get(&shape).cloned();
                match found {
                    Some(k) => HeldKernel::Arc(k),
                    None => {
                        let k = compile()?;
                        HeldKernel::Arc(Arc::clone(lock(kernels).entry(shape).or_insert(k)))
                    }
                }
            }
            Caches::None => HeldKernel::Arc(compile()?),
        })
    }

    fn reordered(&self, mlp: &Mlp, layer: usize) -> Arc<[f32]> {
        self.reorders.fetch_add(1, Ordering::Relaxed);
        let l = &mlp.layers[layer];
        reorder(&l.weights, l.k, l.n).into()
    }

    fn weights(&self, mlp: &Mlp, layer: usize) -> Result<HeldWeights, Failure> {
        let reordered = || self.reordered(mlp, layer);
        Ok(match &self.caches {
            Caches::Runcache { weights, .. } => {
                let l = &mlp.layers[layer];
                // A weight the budget cannot hold comes back uncached: reordered again next
                // time, as a memory-limited runtime must.
                let added = weights
                    .get_or_add(ConstantKey::new(1, layer as u64), l.k * l.n * 4, || {
                        weights_buffer(&reordered())
                    })
                    .map_err(|e| Failure::Weights(e.to_string()))?;
                HeldWeights::Buffer(added.buffer)
            }
            Caches::Moka { weights, .. } => HeldWeights::Arc(weights.get_with(layer, reordered)),
            Caches::QuickCache { weights, .. } => HeldWeights::Arc(
                weights.get_or_insert_with(&layer, || Ok::<_, Failure>(reordered()))?,
            ),
            Caches::MutexHashMap { weights, .. } => HeldWeights::Arc(Arc::clone(
                lock(weights).entry(layer).or_insert_with(reordered),
            )),
            Caches::None => HeldWeights::Arc(reordered()),
        })
    }

    /// Bytes the caches hold now: the kernels' code and the weights.
    fn bytes(&self) -> u64 {
        let code = |k: &Kernel| k.code_bytes() as u64;
        let floats = |w: &[f32]| w.len() as u64 * 4;
        match &self.caches {
            Caches::Runcache { kernels, weights } => {
                kernels.pin().iter().map(|(_, k)| code(k)).sum::<u64>() + weights.size()
            }
            Caches::Moka { kernels, weights } => {
                kernels.iter().map(|(_, k)| code(&k)).sum::<u64>()
                    + weights.iter().map(|(_, w)| floats(&w)).sum::<u64>()
            }
            Caches::QuickCache { kernels, weights } => {
                kernels.iter().map(|(_, k)| code(&k)).sum::<u64>()
                    + weights.iter().map(|(_, w)| floats(&w)).sum::<u64>()
            }
            Caches::MutexHashMap { kernels, weights } => {
                lock(kernels).values().map(|k| code(k)).sum::<u64>()
                    + lock(weights).values().map(|w| floats(w)).sum::<u64>()
            }
            Caches::None => 0,
        }
    }
}

/// A host constant buffer holding `weights`.
fn weights_buffer(weights: &[f32]) -> Result<ConstantBuffer, String> {
    let mut buffer = ConstantBuffer::host(weights.len() * 4).map_err(|e| e.to_string())?;
    if !buffer.align().is_multiple_of(std::mem::align_of::<f32>()) {
        return Err(format!(
            "a host buffer aligned to {} bytes cannot hold f32",
            buffer.align()
        ));
    }
    let bytes = buffer.as_mut_slice().ok_or("a host buffer has bytes")?;
    bytes.copy_from_slice(bytemuck::cast_slice(weights));
    Ok(buffer)
}

/// The rows of request `r`: a batch size and a sequence length drawn from skewed mixes.
fn request_rows(seed: u64, r: usize) -> usize {
    let mut next = model::xorshift(seed ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let total: u64 = BATCHES.iter().map(|b| b.1).sum();
    let mut pick = next() % total;
    let batch = BATCHES
        .iter()
        .find(|(_, w)| {
            let hit = pick < *w;
            pick = pick.saturating_sub(*w);
            hit
        })
        .map_or(1, |b| b.0);
    // Sequence steps with weight 1/(s+1)^1.2: a few short lengths hot, a long tail cold.
    let weights: Vec<f64> = (0..SEQ_STEPS)
        .map(|s| 1.0 / ((s + 1) as f64).powf(1.2))
        .collect();
    let sum: f64 = weights.iter().sum();
    let mut u = (next() >> 11) as f64 / (1u64 << 53) as f64 * sum;
    let step = weights
        .iter()
        .position(|w| {
            u -= w;
            u < 0.0
        })
        .unwrap_or(SEQ_STEPS - 1);
    batch * (step + 1) * SEQ_STEP
}

/// What one cache's run measured.
struct Report {
    name: &'static str,
    requests: usize,
    /// Distinct kernel shapes the requests needed.
    shapes: usize,
    failed: usize,
    mismatches: usize,
    seconds: f64,
    p50: Duration,
    p99: Duration,
    compiles: usize,
    lookups: usize,
    reorders: usize,
    compile_seconds: f64,
    peak_bytes: u64,
}

impl Report {
    /// Requests per second of serving: the requests over the time the threads spent in
    /// them (the reference checks between requests are not counted).
    fn per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.requests as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn hit_ratio(&self) -> f64 {
        if self.lookups == 0 {
            return 0.0;
        }
        1.0 - self.compiles as f64 / self.lookups as f64
    }
}

fn serve(mlp: &Mlp, choice: Choice, o: &Options) -> Report {
    let backend = Backend::new(choice, o.kernels);
    // One scratch pool per serving thread at most; a pool keeps its buffers' capacity.
    let scratch = PoolManager::builder(Scratch::default)
        .max_pools(o.threads)
        .build()
        .expect("at least one pool");
    let next = AtomicUsize::new(0);
    let bar = if std::io::stderr().is_terminal() && !o.json {
        let bar = indicatif::ProgressBar::new(o.requests as u64);
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{msg:>14} [{bar:30}] {pos}/{len} {per_sec}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(choice.name());
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let failed = AtomicUsize::new(0);
    let mismatches = AtomicUsize::new(0);
    let peak = AtomicU64::new(0);
    let mut latencies: Vec<Duration> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..o.threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let r = next.fetch_add(1, Ordering::Relaxed);
                        if r >= o.requests || STOP.load(Ordering::Relaxed) {
                            break mine;
                        }
                        bar.inc(1);
                        let m = request_rows(o.seed, r);
                        let input = model::request_input(mlp, m, o.seed ^ r as u64);
                        let began = Instant::now();
                        // Activations go to a scratch pool reserved for the request.
                        let mut scratch = match scratch.reserve() {
                            Ok(s) => s,
                            Err(e) => {
                                eprintln!("runtime: request {r}: no scratch: {e}");
                                failed.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                        };
                        let out = forward(
                            mlp,
                            &input,
                            m,
                            |_, shape| backend.kernel(shape),
                            |l| backend.weights(mlp, l),
                            &mut scratch,
                        );
                        mine.push(began.elapsed());
                        match out {
                            Ok(out) => {
                                if out != model::reference(mlp, &input, m) {
                                    mismatches.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Err(e) => {
                                if failed.fetch_add(1, Ordering::Relaxed) < 3 {
                                    eprintln!("runtime: request {r} failed: {e}");
                                }
                            }
                        }
                        if r.is_multiple_of(64) {
                            peak.fetch_max(backend.bytes(), Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a worker panicked"))
            .collect()
    });
    bar.finish_and_clear();
    let served = latencies.len();
    let busy: f64 = latencies.iter().map(Duration::as_secs_f64).sum();
    let seconds = busy / o.threads as f64;
    peak.fetch_max(backend.bytes(), Ordering::Relaxed);
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((served.max(1) - 1) as f64 * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    Report {
        name: choice.name(),
        requests: served,
        shapes: (0..served)
            .flat_map(|r| {
                let m = request_rows(o.seed, r);
                mlp.layers.iter().map(move |l| (m, l.k, l.n, l.relu))
            })
            .collect::<std::collections::HashSet<_>>()
            .len(),
        failed: failed.into_inner(),
        mismatches: mismatches.into_inner(),
        seconds,
        p50: at(0.5),
        p99: at(0.99),
        compiles: backend.compiles.load(Ordering::Relaxed),
        lookups: backend.lookups.load(Ordering::Relaxed),
        reorders: backend.reorders.load(Ordering::Relaxed),
        compile_seconds: backend.compile_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        peak_bytes: peak.into_inner(),
    }
}

fn main() -> ExitCode {
    let o = match parse_args(std::env::args().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(problem) = constant::env_report().parsed.errors.first() {
        eprintln!("runtime: RUNCACHE_CONSTANT_CACHE_CAPACITY: {problem}");
        return ExitCode::from(2);
    }
    let mlp = Mlp::generate(&WIDTHS, o.seed).expect("the built-in widths are valid");
    if !o.json {
        println!(
            "model: MLP {WIDTHS:?}, kernels JIT-compiled per (rows, layer) with Cranelift; \
             {} requests per cache on {} thread(s)",
            o.requests, o.threads
        );
    }
    if let Err(e) = ctrlc::set_handler(|| STOP.store(true, Ordering::Relaxed)) {
        eprintln!("runtime: Ctrl-C will not print the figures so far: {e}");
    }
    let mut reports = Vec::new();
    for &c in &o.caches {
        let report = serve(&mlp, c, &o);
        if !o.json && !std::io::stderr().is_terminal() {
            eprintln!(
                "{}: {} requests served in {:.2} s of serving time",
                report.name, report.requests, report.seconds
            );
        }
        reports.push(report);
        if STOP.load(Ordering::Relaxed) {
            eprintln!("runtime: interrupted; the figures so far:");
            break;
        }
    }
    if o.json {
        for r in &reports {
            println!(
                "{{\"cache\":\"{}\",\"requests\":{},\"shapes\":{},\"failed\":{},\"mismatches\":{},\
                 \"requests_per_second\":{:.1},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\
                 \"compiles\":{},\"compiles_avoided\":{},\"hit_ratio\":{:.4},\
                 \"weight_reorders\":{},\"compile_seconds\":{:.3},\"peak_cache_bytes\":{}}}",
                r.name,
                r.requests,
                r.shapes,
                r.failed,
                r.mismatches,
                r.per_second(),
                r.p50.as_secs_f64() * 1e3,
                r.p99.as_secs_f64() * 1e3,
                r.compiles,
                r.lookups - r.compiles,
                r.hit_ratio(),
                r.reorders,
                r.compile_seconds,
                r.peak_bytes
            );
        }
    } else {
        print_table(&reports);
    }
    let bad = reports.iter().any(|r| r.mismatches > 0);
    if bad {
        eprintln!("runtime: a response differed from the reference");
        return ExitCode::FAILURE;
    }
    if reports.iter().any(|r| r.failed > 0) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn print_table(reports: &[Report]) {
    println!(
        "\n{:<14} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>7} {:>9} {:>11}",
        "cache",
        "requests",
        "req/s",
        "p50 ms",
        "p99 ms",
        "compiles",
        "avoided",
        "hits",
        "reorders",
        "peak bytes"
    );
    for r in reports {
        println!(
            "{:<14} {:>9} {:>9.0} {:>8.3} {:>8.3} {:>9} {:>9} {:>6.1}% {:>9} {:>11}",
            r.name,
            r.requests,
            r.per_second(),
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.compiles,
            r.lookups - r.compiles,
            100.0 * r.hit_ratio(),
            r.reorders,
            r.peak_bytes
        );
    }
    if let Some(ours) = reports.iter().find(|r| r.name == "runcache") {
        let mut line = String::from("\nruncache speed-up (requests/s):");
        for r in reports
            .iter()
            .filter(|r| r.name != "runcache" && r.per_second() > 0.0)
        {
            let _ = write!(
                line,
                " {:.2}x {}",
                ours.per_second() / r.per_second(),
                r.name
            );
        }
        println!("{line}");
    }
}
