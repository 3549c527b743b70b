//! The README's main job: serves a stream of requests whose shapes vary as serving traffic
//! does, with each cache in turn holding the compiled kernels and the reordered weights,
//! checks every response against the plain reference, and prints a table per cache with the
//! speed-up of runcache over each alternative in the same run.
//!
//! ```text
//! cargo run --release -p runcache-runtime -- [options]
//!
//!   --cache C,..        runcache, moka, quick_cache, mutex-hashmap, none (default: all five)
//!   --threads N,..      serving threads; a list runs each count in turn (default 2)
//!   --requests N        requests per cache and thread count (default 1500)
//!   --kernels N         kernels a cache holds (default 1024)
//!   --hidden N          width of the two hidden layers, a multiple of 8 up to 4096 (default 64)
//!   --seed N            the model's and the requests' seed (default 42)
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
//! RUNCACHE_CONSTANT_CACHE_CAPACITY   runcache's weight budget in MiB: the `cpu:` field
//!                                    (default 64), or `gpu:` with --gpu (default: half
//!                                    the device's budget)
//! ```
//!
//! On a terminal a progress bar follows each cache's run (plain lines otherwise); Ctrl-C
//! stops the run and prints the figures so far. The exit status is 1 when a response differs
//! from the reference or a request fails for a reason not injected, 2 for a bad flag or
//! environment.

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

/// The model's input and output widths; `--hidden` sets the two layers between.
const INPUT: usize = 32;
const OUTPUT: usize = 32;
/// The widest hidden layer `--hidden` takes.
const MAX_HIDDEN: usize = 4096;
/// The most rows one request may have: the model's limit. Traffic stays under it (at most
/// 8 × 32 × 8 = 2048 rows) unless `--inject oversize:P` sends requests over it.
const MAX_ROWS: usize = 4096;
/// Batch sizes and how often each comes (serving traffic: mostly small batches).
const BATCHES: [(usize, u64); 4] = [(1, 50), (2, 25), (4, 15), (8, 10)];
/// Sequence lengths are multiples of this, up to `SEQ_STEPS` of them.
const SEQ_STEP: usize = 8;
const SEQ_STEPS: usize = 32;
/// Sequence steps with weight 1/(s+1)^1.2: a few short lengths hot, a long tail cold.
/// Computed once, not per request.
static SEQ_WEIGHTS: std::sync::LazyLock<[f64; SEQ_STEPS]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|s| 1.0 / ((s + 1) as f64).powf(1.2)));

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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Output {
    Table,
    Json,
    Markdown,
}

/// Failures injected on purpose: each `Some(p)` fails one time in `p`.
#[derive(Clone, Copy, Default)]
struct Inject {
    compile: Option<usize>,
    oversize: Option<usize>,
}

struct Options {
    caches: Vec<Choice>,
    threads: Vec<usize>,
    requests: usize,
    kernels: usize,
    hidden: usize,
    seed: u64,
    inject: Inject,
    gpu: bool,
    asynchronous: bool,
    output: Output,
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

fn number(flag: &str, v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .map_err(|_| format!("{flag}: `{v}` is not a whole number"))
}

fn parse_inject(v: &str) -> Result<Inject, String> {
    let mut inject = Inject::default();
    for item in v.split(',') {
        let (what, every) = item.split_once(':').ok_or_else(|| {
            format!("--inject: `{item}` is not FAILURE:P (compile:P or oversize:P)")
        })?;
        let every = number(&format!("--inject {what}"), every)?;
        if every == 0 {
            return Err(format!(
                "--inject {what}: P must be at least 1 (1 in P fails)"
            ));
        }
        match what {
            "compile" => inject.compile = Some(every),
            "oversize" => inject.oversize = Some(every),
            other => {
                return Err(format!(
                    "--inject: unknown failure `{other}` (compile or oversize)"
                ))
            }
        }
    }
    Ok(inject)
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let mut o = Options {
        caches: Choice::ALL.to_vec(),
        threads: vec![2],
        requests: 1500,
        kernels: 1024,
        hidden: 64,
        seed: 42,
        inject: Inject::default(),
        gpu: false,
        asynchronous: false,
        output: Output::Table,
    };
    let mut args = args;
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
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
            "--threads" => {
                o.threads = value("--threads")?
                    .split(',')
                    .map(|t| number("--threads", t))
                    .collect::<Result<_, _>>()?;
            }
            "--requests" => o.requests = number("--requests", &value("--requests")?)?,
            "--kernels" => o.kernels = number("--kernels", &value("--kernels")?)?,
            "--hidden" => o.hidden = number("--hidden", &value("--hidden")?)?,
            "--seed" => o.seed = number("--seed", &value("--seed")?)? as u64,
            "--inject" => o.inject = parse_inject(&value("--inject")?)?,
            "--gpu" => o.gpu = true,
            "--async" => o.asynchronous = true,
            "--json" => o.output = Output::Json,
            "--markdown" => o.output = Output::Markdown,
            other => return Err(format!("unknown flag `{other}` (see --help)")),
        }
    }
    let fewest = o.threads.iter().copied().min().unwrap_or(0);
    for (flag, v) in [
        ("--threads", fewest),
        ("--requests", o.requests),
        ("--kernels", o.kernels),
    ] {
        if v == 0 {
            return Err(format!("{flag}: must be at least 1"));
        }
    }
    if o.hidden == 0 || !o.hidden.is_multiple_of(8) || o.hidden > MAX_HIDDEN {
        return Err(format!(
            "--hidden: {} is not a multiple of 8 from 8 to {MAX_HIDDEN}",
            o.hidden
        ));
    }
    Ok(Some(o))
}

/// A kernel or a weight buffer as whichever cache handed it out: an `Arc` from the peers,
/// runcache's own counted handle (runcache stores the value itself, not an `Arc` of it).
enum Held<T> {
    Arc(Arc<T>),
    Handle(Handle<T>),
}

impl<T> Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            Held::Arc(a) => a,
            Held::Handle(h) => h,
        }
    }
}

/// A layer's reordered weights for one use: the cached buffer, and its floats copied back
/// when the buffer is in device memory (the kernels run on the host).
struct HeldWeights {
    buffer: Held<ConstantBuffer>,
    copy: Option<Vec<f32>>,
}

impl Deref for HeldWeights {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.copy {
            Some(copy) => copy,
            // A host buffer made by `Store::buffer`, checked there to be aligned for f32.
            None => bytemuck::cast_slice(self.buffer.as_slice().unwrap_or(&[])),
        }
    }
}

/// Why a request failed: counted per kind in the report.
#[derive(Clone, Debug)]
enum Failure {
    /// The request has more rows than the model's limit.
    Rows { rows: usize, limit: usize },
    /// A kernel failed to compile or run.
    Kernel(KernelError),
    /// A compile failed on purpose (`--inject compile:P`).
    InjectedCompile(Shape),
    /// The weights could not be made, stored or read back.
    Weights(String),
    /// No scratch pool could be had.
    Scratch(String),
    /// A cache's own error (an async build that would wait for itself, say).
    Cache(String),
}

impl Failure {
    /// Whether only a failure injected on purpose leads here.
    fn injected(&self) -> bool {
        matches!(self, Failure::Rows { .. } | Failure::InjectedCompile(_))
    }

    /// The report's count for this kind: rows, compile, weights or other.
    fn slot(&self) -> usize {
        match self {
            Failure::Rows { .. } => 0,
            Failure::Kernel(_) | Failure::InjectedCompile(_) => 1,
            Failure::Weights(_) => 2,
            Failure::Scratch(_) | Failure::Cache(_) => 3,
        }
    }
}

impl From<KernelError> for Failure {
    fn from(e: KernelError) -> Self {
        Failure::Kernel(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Rows { rows, limit } => {
                write!(f, "{rows} rows are over the model's limit of {limit}")
            }
            Failure::Kernel(e) => write!(f, "{e}"),
            Failure::InjectedCompile(shape) => {
                write!(f, "compiling {shape} failed (injected by --inject compile)")
            }
            Failure::Weights(e) => write!(f, "weights: {e}"),
            Failure::Scratch(e) => write!(f, "no scratch: {e}"),
            Failure::Cache(e) => write!(f, "cache: {e}"),
        }
    }
}

/// An error and its sources, each after a colon: what a user needs to see of a failure.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(source) = next {
        let _ = write!(text, ": {source}");
        next = source.source();
    }
    text
}

/// Where the reordered weights live. One is made per process and never moved, so its
/// variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Store {
    Host,
    /// Device-local buffers of this allocator.
    #[cfg(feature = "vulkan")]
    Device(runcache::vulkan::VulkanAllocator),
}

impl Store {
    /// Opens the device for `--gpu`.
    fn open(gpu: bool) -> Result<Store, String> {
        if !gpu {
            return Ok(Store::Host);
        }
        #[cfg(feature = "vulkan")]
        {
            use runcache::vulkan::{VulkanAllocator, VulkanContext};
            let ctx = VulkanContext::builder()
                .build()
                .map_err(|e| format!("--gpu: {}", chain(&e)))?;
            let allocator =
                VulkanAllocator::new(ctx).map_err(|e| format!("--gpu: {}", chain(&e)))?;
            Ok(Store::Device(allocator))
        }
        #[cfg(not(feature = "vulkan"))]
        Err(
            "--gpu needs the `vulkan` feature: cargo run --release -p runcache-runtime \
             --features vulkan -- --gpu"
                .into(),
        )
    }

    fn describe(&self) -> String {
        match self {
            Store::Host => "host memory".into(),
            #[cfg(feature = "vulkan")]
            Store::Device(a) => format!("Vulkan device buffers on {}", a.context().device_name()),
        }
    }

    /// runcache's weight cache here, with its budget.
    fn constant_cache(&self) -> constant::ConstantCache {
        match self {
            Store::Host => {
                let mb = constant::env_capacity_mb(DeviceKind::Cpu).unwrap_or(64);
                constant::ConstantCache::with_capacity_bytes(
                    DeviceKind::Cpu,
                    mb.saturating_mul(1 << 20),
                )
            }
            #[cfg(feature = "vulkan")]
            Store::Device(a) => runcache::vulkan::constant_cache(a),
        }
    }

    /// A buffer holding `weights`: host memory, or uploaded to the device.
    fn buffer(&self, weights: &[f32]) -> Result<ConstantBuffer, Failure> {
        match self {
            Store::Host => {
                let mut buffer = ConstantBuffer::host(weights.len() * 4)
                    .map_err(|e| Failure::Weights(chain(&e)))?;
                if !buffer.align().is_multiple_of(std::mem::align_of::<f32>()) {
                    return Err(Failure::Weights(format!(
                        "a host buffer aligned to {} bytes cannot hold f32",
                        buffer.align()
                    )));
                }
                let bytes = buffer
                    .as_mut_slice()
                    .ok_or_else(|| Failure::Weights("a host buffer without bytes".into()))?;
                bytes.copy_from_slice(bytemuck::cast_slice(weights));
                Ok(buffer)
            }
            #[cfg(feature = "vulkan")]
            Store::Device(a) => a
                .upload_constant(bytemuck::cast_slice(weights))
                .map_err(|e| Failure::Weights(chain(&e))),
        }
    }

    /// `buffer`'s floats for the host kernels: none needed for a host buffer, a copy read
    /// back for a device one.
    fn copy_back(&self, buffer: &ConstantBuffer) -> Result<Option<Vec<f32>>, Failure> {
        if buffer.as_slice().is_some() {
            return Ok(None);
        }
        match self {
            Store::Host => Err(Failure::Weights("a device buffer in the host store".into())),
            #[cfg(feature = "vulkan")]
            Store::Device(a) => {
                let device = buffer
                    .device_memory::<runcache::vulkan::DeviceBuffer>()
                    .ok_or_else(|| Failure::Weights("not a Vulkan buffer".into()))?;
                let bytes = a
                    .read(device, 0, buffer.size() as u64)
                    .map_err(|e| Failure::Weights(chain(&e)))?;
                Ok(Some(
                    bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ))
            }
        }
    }
}

/// A peer's cache of `V`s by `K`, holding `Arc`s: what a runtime would use instead of
/// runcache.
enum Peer<K, V> {
    Moka(moka::sync::Cache<K, Arc<V>>),
    /// moka's cache for async code (`--async`).
    MokaFuture(moka::future::Cache<K, Arc<V>>),
    QuickCache(quick_cache::sync::Cache<K, Arc<V>>),
    /// What a runtime without a cache library writes: a map behind a mutex, each value built
    /// outside the lock (two threads that miss together both build; the first insert wins).
    MutexHashMap(Mutex<HashMap<K, Arc<V>>>),
    /// Every lookup builds.
    None,
}

impl<K, V> Peer<K, V>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    fn new(choice: Choice, capacity: usize, asynchronous: bool) -> Self {
        match choice {
            Choice::Moka if asynchronous => {
                Peer::MokaFuture(moka::future::Cache::new(capacity as u64))
            }
            Choice::Moka => Peer::Moka(moka::sync::Cache::new(capacity as u64)),
            Choice::QuickCache => Peer::QuickCache(quick_cache::sync::Cache::new(capacity)),
            Choice::MutexHashMap => Peer::MutexHashMap(Mutex::new(HashMap::new())),
            Choice::Runcache | Choice::None => Peer::None,
        }
    }

    /// The value for `key`, built by `build` on a miss.
    fn get_or_build(
        &self,
        key: K,
        build: impl FnOnce() -> Result<V, Failure>,
    ) -> Result<Arc<V>, Failure> {
        let build = || build().map(Arc::new);
        match self {
            Peer::Moka(c) => c.try_get_with(key, build).map_err(|e| (*e).clone()),
            Peer::MokaFuture(_) => Err(Failure::Cache(
                "moka's future cache has no blocking lookup".into(),
            )),
            Peer::QuickCache(c) => c.get_or_insert_with(&key, build),
            Peer::MutexHashMap(m) => match cached(m, &key) {
                Some(found) => Ok(found),
                None => Ok(keep(m, key, build()?)),
            },
            Peer::None => build(),
        }
    }

    /// The async form of [`get_or_build`](Self::get_or_build): moka's future cache and
    /// quick_cache's async lookup wait for another caller's build without blocking.
    async fn get_or_build_async(
        &self,
        key: K,
        build: impl std::future::Future<Output = Result<V, Failure>>,
    ) -> Result<Arc<V>, Failure> {
        let build = async { build.await.map(Arc::new) };
        match self {
            Peer::MokaFuture(c) => c.try_get_with(key, build).await.map_err(|e| (*e).clone()),
            Peer::QuickCache(c) => c.get_or_insert_async(&key, build).await,
            Peer::MutexHashMap(m) => match cached(m, &key) {
                Some(found) => Ok(found),
                None => Ok(keep(m, key, build.await?)),
            },
            Peer::None => build.await,
            Peer::Moka(_) => Err(Failure::Cache("moka's blocking cache in async code".into())),
        }
    }

    /// The sum of `measure` over the values held.
    fn sum(&self, measure: impl Fn(&V) -> u64) -> u64 {
        match self {
            Peer::Moka(c) => c.iter().map(|(_, v)| measure(&v)).sum(),
            Peer::MokaFuture(c) => c.iter().map(|(_, v)| measure(&v)).sum(),
            Peer::QuickCache(c) => c.iter().map(|(_, v)| measure(&v)).sum(),
            Peer::MutexHashMap(m) => lock(m).values().map(|v| measure(v)).sum(),
            Peer::None => 0,
        }
    }
}

/// The kernel and weight caches of one run. One is made per run and never moved after, so
/// its variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Caches {
    Runcache {
        kernels: Cache<Shape, Kernel>,
        /// A constant cache of the store's device, with its byte budget.
        weights: constant::ConstantCache,
    },
    Peer {
        kernels: Peer<Shape, Kernel>,
        weights: Peer<usize, ConstantBuffer>,
    },
}

/// One run's caches and counts.
struct Backend<'s> {
    caches: Caches,
    store: &'s Store,
    inject: Inject,
    /// Compiles started, failed ones included (for `--inject compile:P`).
    attempts: AtomicUsize,
    compiles: AtomicUsize,
    lookups: AtomicUsize,
    reorders: AtomicUsize,
    compile_nanos: AtomicU64,
}

/// Locks a map of the mutex-hashmap runtime (a panic elsewhere leaves the map usable).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The mutex-guarded map's value for `key`, if it holds one. The lock is held for the look
/// only (and never across a build: the guard ends with this call).
fn cached<K: std::hash::Hash + Eq, V>(m: &Mutex<HashMap<K, Arc<V>>>, key: &K) -> Option<Arc<V>> {
    lock(m).get(key).cloned()
}

/// Keeps `built` for `key` unless another caller's value got there first; returns the one
/// kept (the map's insert: the value was built outside the lock).
fn keep<K: std::hash::Hash + Eq, V>(
    m: &Mutex<HashMap<K, Arc<V>>>,
    key: K,
    built: Arc<V>,
) -> Arc<V> {
    Arc::clone(lock(m).entry(key).or_insert(built))
}

impl<'s> Backend<'s> {
    fn new(choice: Choice, o: &Options, store: &'s Store) -> Self {
        let caches = match choice {
            Choice::Runcache => Caches::Runcache {
                kernels: Cache::builder()
                    .capacity(o.kernels as u64)
                    .build()
                    .expect("default shards are valid"),
                weights: store.constant_cache(),
            },
            peer => Caches::Peer {
                kernels: Peer::new(peer, o.kernels, o.asynchronous),
                weights: Peer::new(peer, 64, o.asynchronous),
            },
        };
        Backend {
            caches,
            store,
            inject: o.inject,
            attempts: AtomicUsize::new(0),
            compiles: AtomicUsize::new(0),
            lookups: AtomicUsize::new(0),
            reorders: AtomicUsize::new(0),
            compile_nanos: AtomicU64::new(0),
        }
    }

    /// Counts a compile about to start; `Err` for one `--inject compile:P` fails.
    fn attempt(&self, shape: Shape) -> Result<Instant, Failure> {
        let attempt = self.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        if self
            .inject
            .compile
            .is_some_and(|every| attempt.is_multiple_of(every))
        {
            return Err(Failure::InjectedCompile(shape));
        }
        Ok(Instant::now())
    }

    /// Counts a compile that ended.
    fn compiled(
        &self,
        start: Instant,
        kernel: Result<Kernel, KernelError>,
    ) -> Result<Kernel, Failure> {
        let kernel = kernel?;
        self.compile_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.compiles.fetch_add(1, Ordering::Relaxed);
        Ok(kernel)
    }

    fn compile(&self, shape: Shape) -> Result<Kernel, Failure> {
        let start = self.attempt(shape)?;
        self.compiled(start, Kernel::compile(shape))
    }

    /// [`compile`](Self::compile) on tokio's blocking pool, off the task's thread.
    async fn compile_async(&self, shape: Shape) -> Result<Kernel, Failure> {
        let start = self.attempt(shape)?;
        let kernel = tokio::task::spawn_blocking(move || Kernel::compile(shape))
            .await
            .map_err(|e| Failure::Cache(format!("the compile task of {shape}: {e}")))?;
        self.compiled(start, kernel)
    }

    fn kernel_async_error(e: runcache::BuildError<Shape, Failure>) -> Failure {
        match e {
            runcache::BuildError::Failed(e) => (*e).clone(),
            other => Failure::Cache(other.to_string()),
        }
    }

    async fn kernel_async(&self, shape: Shape) -> Result<Held<Kernel>, Failure> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        Ok(match &self.caches {
            Caches::Runcache { kernels, .. } => Held::Handle(
                kernels
                    .try_get_or_insert_with_async(shape, self.compile_async(shape))
                    .await
                    .map_err(Self::kernel_async_error)?,
            ),
            Caches::Peer { kernels, .. } => Held::Arc(
                kernels
                    .get_or_build_async(shape, self.compile_async(shape))
                    .await?,
            ),
        })
    }

    /// The async form of [`weights`](Self::weights) (the reorder itself runs in the task).
    async fn weights_async(&self, mlp: &Mlp, layer: usize) -> Result<HeldWeights, Failure> {
        let reordered = async { self.reordered(mlp, layer) };
        let buffer = match &self.caches {
            Caches::Runcache { weights, .. } => {
                let l = &mlp.layers[layer];
                let added = weights
                    .get_or_add_async(ConstantKey::new(1, layer as u64), l.k * l.n * 4, reordered)
                    .await
                    .map_err(|e| Failure::Weights(chain(&e)))?;
                Held::Handle(added.buffer)
            }
            Caches::Peer { weights, .. } => {
                Held::Arc(weights.get_or_build_async(layer, reordered).await?)
            }
        };
        let copy = self.store.copy_back(&buffer)?;
        Ok(HeldWeights { buffer, copy })
    }

    fn kernel(&self, shape: Shape) -> Result<Held<Kernel>, Failure> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let compile = || self.compile(shape);
        Ok(match &self.caches {
            Caches::Runcache { kernels, .. } => Held::Handle(
                kernels
                    .try_get_or_insert_with(shape, compile)
                    .map_err(|e| (*e).clone())?,
            ),
            Caches::Peer { kernels, .. } => Held::Arc(kernels.get_or_build(shape, compile)?),
        })
    }

    /// Layer `layer`'s weights reordered into a buffer of the store.
    fn reordered(&self, mlp: &Mlp, layer: usize) -> Result<ConstantBuffer, Failure> {
        self.reorders.fetch_add(1, Ordering::Relaxed);
        let l = &mlp.layers[layer];
        self.store.buffer(&reorder(&l.weights, l.k, l.n))
    }

    fn weights(&self, mlp: &Mlp, layer: usize) -> Result<HeldWeights, Failure> {
        let reordered = || self.reordered(mlp, layer);
        let buffer = match &self.caches {
            Caches::Runcache { weights, .. } => {
                let l = &mlp.layers[layer];
                // A weight the budget cannot hold comes back uncached: reordered again next
                // time, as a memory-limited runtime must.
                let added = weights
                    .get_or_add(ConstantKey::new(1, layer as u64), l.k * l.n * 4, reordered)
                    .map_err(|e| Failure::Weights(chain(&e)))?;
                Held::Handle(added.buffer)
            }
            Caches::Peer { weights, .. } => Held::Arc(weights.get_or_build(layer, reordered)?),
        };
        let copy = self.store.copy_back(&buffer)?;
        Ok(HeldWeights { buffer, copy })
    }

    /// Bytes the caches hold now: the kernels' code and the weights.
    fn bytes(&self) -> u64 {
        let code = |k: &Kernel| k.code_bytes() as u64;
        match &self.caches {
            Caches::Runcache { kernels, weights } => {
                kernels.pin().iter().map(|(_, k)| code(k)).sum::<u64>() + weights.size()
            }
            Caches::Peer { kernels, weights } => {
                kernels.sum(code) + weights.sum(|w| w.size() as u64)
            }
        }
    }
}

/// The rows of request `r`: a batch size and a sequence length drawn from skewed mixes, or
/// over the model's limit for a request `--inject oversize:P` picks.
fn request_rows(o: &Options, r: usize) -> usize {
    if o.inject
        .oversize
        .is_some_and(|every| (r + 1).is_multiple_of(every))
    {
        return MAX_ROWS + SEQ_STEP;
    }
    let mut next = model::xorshift(o.seed ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
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
    let weights = &*SEQ_WEIGHTS;
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
    threads: usize,
    /// Requests taken, those refused at the row limit included.
    requests: usize,
    /// Requests that ran (all but the refused): the latencies' count.
    ran: usize,
    /// Distinct kernel shapes the requests needed.
    shapes: usize,
    /// Failed requests by kind: rows over the limit, compile, weights, other.
    failed: [usize; 4],
    /// Failures not injected on purpose.
    unexpected: usize,
    mismatches: usize,
    seconds: f64,
    p50: Duration,
    p99: Duration,
    /// Kernels compiled.
    compiles: usize,
    /// Compiles started, failed ones included.
    attempts: usize,
    lookups: usize,
    reorders: usize,
    compile_seconds: f64,
    peak_bytes: u64,
}

impl Report {
    /// Requests per second of serving: the requests that ran over the time the threads
    /// spent in them (the reference checks between requests are not counted).
    fn per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ran as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Kernel lookups that needed no compile (nor a failed try).
    fn avoided(&self) -> usize {
        self.lookups.saturating_sub(self.attempts)
    }

    fn hit_ratio(&self) -> f64 {
        if self.lookups == 0 {
            return 0.0;
        }
        self.avoided() as f64 / self.lookups as f64
    }

    fn failures(&self) -> usize {
        self.failed.iter().sum()
    }
}

impl std::error::Error for Failure {}

/// What the serving threads of one run count together.
struct Tally {
    name: &'static str,
    next: AtomicUsize,
    bar: indicatif::ProgressBar,
    failed: [AtomicUsize; 4],
    unexpected: AtomicUsize,
    mismatches: AtomicUsize,
    peak: AtomicU64,
    /// Nanoseconds async serving threads spent blocked on a full channel to their checker.
    blocked: AtomicU64,
}

/// A request to serve: its index, rows and input.
struct Request {
    r: usize,
    m: usize,
    input: Vec<f32>,
}

impl Tally {
    /// The next request, or `None` once all are taken or Ctrl-C was pressed. A request over
    /// the model's limit is refused here, before any work, and left out of the latencies.
    fn take(&self, mlp: &Mlp, o: &Options) -> Option<Option<Request>> {
        let r = self.next.fetch_add(1, Ordering::Relaxed);
        if r >= o.requests || STOP.load(Ordering::Relaxed) {
            return None;
        }
        self.bar.inc(1);
        let m = request_rows(o, r);
        if m > MAX_ROWS {
            let limit = MAX_ROWS;
            self.fail(r, Failure::Rows { rows: m, limit });
            return Some(None);
        }
        let input = model::request_input(mlp, m, o.seed ^ r as u64);
        Some(Some(Request { r, m, input }))
    }

    fn fail(&self, r: usize, e: Failure) {
        self.failed[e.slot()].fetch_add(1, Ordering::Relaxed);
        if !e.injected() && self.unexpected.fetch_add(1, Ordering::Relaxed) < 3 {
            eprintln!("runtime: {}: request {r} failed: {e}", self.name);
        }
    }

    /// Checks a request's response against the reference (or counts its failure).
    fn check(&self, mlp: &Mlp, q: &Request, out: Result<&[f32], Failure>, backend: &Backend) {
        match out {
            Ok(out) => {
                if out != model::reference(mlp, &q.input, q.m) {
                    self.mismatches.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => self.fail(q.r, e),
        }
        if q.r.is_multiple_of(64) {
            self.peak.fetch_max(backend.bytes(), Ordering::Relaxed);
        }
    }
}

/// Concurrent requests per serving thread with `--async`.
const TASKS_PER_THREAD: usize = 4;
/// Responses of an async serving thread that may wait for their reference check.
const UNCHECKED: usize = 1024;

fn serve(mlp: &Mlp, choice: Choice, threads: usize, o: &Options, store: &Store) -> Report {
    let backend = Backend::new(choice, o, store);
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
        blocked: AtomicU64::new(0),
    };
    let (backend, tally, scratch) = (&backend, &tally, &scratch);
    // The blocking serving thread: one request at a time.
    let blocking = || {
        let mut mine = Vec::new();
        while let Some(taken) = tally.take(mlp, o) {
            let Some(q) = taken else { continue };
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
                |l| backend.weights(mlp, l),
                &mut pool,
            );
            mine.push(began.elapsed());
            tally.check(mlp, &q, out, backend);
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
        while let Some(taken) = tally.take(mlp, o) {
            let Some(q) = taken else { continue };
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
                    weights.push(backend.weights_async(mlp, l).await?);
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
                            tally.check(mlp, &q, out.as_deref().map_err(Clone::clone), backend);
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
    let seconds = busy / threads as f64;
    tally.peak.fetch_max(backend.bytes(), Ordering::Relaxed);
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((ran.max(1) - 1) as f64 * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    Report {
        name: choice.name(),
        threads,
        requests: ran + failed[0],
        ran,
        shapes: (0..ran + failed[0])
            .map(|r| request_rows(o, r))
            .filter(|&m| m <= MAX_ROWS)
            .flat_map(|m| mlp.layers.iter().map(move |l| (m, l.k, l.n, l.relu)))
            .collect::<std::collections::HashSet<_>>()
            .len(),
        failed,
        unexpected: tally.unexpected.load(Ordering::Relaxed),
        mismatches: tally.mismatches.load(Ordering::Relaxed),
        seconds,
        p50: at(0.5),
        p99: at(0.99),
        compiles: backend.compiles.load(Ordering::Relaxed),
        attempts: backend.attempts.load(Ordering::Relaxed),
        lookups: backend.lookups.load(Ordering::Relaxed),
        reorders: backend.reorders.load(Ordering::Relaxed),
        compile_seconds: backend.compile_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        peak_bytes: tally.peak.load(Ordering::Relaxed),
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
    let widths = [INPUT, o.hidden, o.hidden, OUTPUT];
    let mlp = Mlp::generate(&widths, o.seed).expect("--hidden was checked");
    if o.output == Output::Table {
        println!(
            "model: MLP {widths:?}, kernels JIT-compiled per (rows, layer) with Cranelift, \
             weights in {}; {} requests per cache",
            store.describe(),
            o.requests
        );
    }
    if let Err(e) = ctrlc::set_handler(|| STOP.store(true, Ordering::Relaxed)) {
        eprintln!("runtime: Ctrl-C will not print the figures so far: {e}");
    }
    let mut reports = Vec::new();
    'runs: for &threads in &o.threads {
        for &c in &o.caches {
            let report = serve(&mlp, c, threads, &o, &store);
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
        Output::Json => print_json(&reports, &o),
        Output::Table => print_table(&reports, &o),
        Output::Markdown => print_markdown(&reports, &o, &store),
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

fn print_json(reports: &[Report], o: &Options) {
    for r in reports {
        println!(
            "{{\"cache\":\"{}\",\"threads\":{},\"async\":{},\"hidden\":{},\"requests\":{},\"shapes\":{},\
             \"failed\":{},\"failed_rows\":{},\"failed_compile\":{},\"failed_weights\":{},\
             \"failed_other\":{},\"unexpected_failures\":{},\"mismatches\":{},\
             \"requests_per_second\":{:.1},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\
             \"compiles\":{},\"compiles_avoided\":{},\"hit_ratio\":{:.4},\
             \"weight_reorders\":{},\"compile_seconds\":{:.3},\"peak_cache_bytes\":{}}}",
            r.name,
            r.threads,
            o.asynchronous,
            o.hidden,
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
            r.compiles,
            r.avoided(),
            r.hit_ratio(),
            r.reorders,
            r.compile_seconds,
            r.peak_bytes
        );
    }
}

/// runcache's requests per second over `r`'s, in the same run and thread count.
fn speed_up(reports: &[Report], r: &Report) -> Option<f64> {
    let ours = reports
        .iter()
        .find(|x| x.name == "runcache" && x.threads == r.threads)?;
    (r.per_second() > 0.0).then(|| ours.per_second() / r.per_second())
}

fn print_table(reports: &[Report], o: &Options) {
    let mut counts: Vec<usize> = reports.iter().map(|r| r.threads).collect();
    counts.dedup();
    for threads in counts {
        let mode = if o.asynchronous { ", async tasks" } else { "" };
        println!("\n{threads} thread(s){mode}:");
        println!(
            "{:<14} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>7} {:>9} {:>11} {:>7}",
            "cache",
            "requests",
            "req/s",
            "p50 ms",
            "p99 ms",
            "compiles",
            "avoided",
            "hits",
            "reorders",
            "peak bytes",
            "failed"
        );
        let rows: Vec<&Report> = reports.iter().filter(|r| r.threads == threads).collect();
        for r in &rows {
            println!(
                "{:<14} {:>9} {:>9.0} {:>8.3} {:>8.3} {:>9} {:>9} {:>6.1}% {:>9} {:>11} {:>7}",
                r.name,
                r.requests,
                r.per_second(),
                r.p50.as_secs_f64() * 1e3,
                r.p99.as_secs_f64() * 1e3,
                r.compiles,
                r.avoided(),
                100.0 * r.hit_ratio(),
                r.reorders,
                r.peak_bytes,
                r.failures()
            );
        }
        let mut line = String::from("runcache speed-up (requests/s):");
        let before = line.len();
        for r in rows.iter().filter(|r| r.name != "runcache") {
            if let Some(x) = speed_up(reports, r) {
                let _ = write!(line, " {x:.2}x {}", r.name);
            }
        }
        if line.len() > before {
            println!("{line}");
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

fn print_markdown(reports: &[Report], o: &Options, store: &Store) {
    let mode = if o.asynchronous {
        format!(", {TASKS_PER_THREAD} async tasks per thread")
    } else {
        String::new()
    };
    println!(
        "MLP {:?}, {} requests per row, weights in {}{}.\n",
        [INPUT, o.hidden, o.hidden, OUTPUT],
        o.requests,
        store.describe(),
        mode
    );
    println!(
        "| threads | cache | requests/s | p50 ms | p99 ms | compiles | hit ratio | \
         peak cache bytes | runcache speed-up |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        let x = match r.name {
            "runcache" => "—".to_string(),
            _ => speed_up(reports, r).map_or("—".into(), |x| format!("{x:.2}×")),
        };
        println!(
            "| {} | {} | {:.0} | {:.3} | {:.3} | {} | {:.1}% | {} | {} |",
            r.threads,
            r.name,
            r.per_second(),
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.compiles,
            100.0 * r.hit_ratio(),
            r.peak_bytes,
            x
        );
    }
}
