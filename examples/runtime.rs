//! The main job: a simulated inference runtime with dynamic input shapes.
//!
//! Worker threads serve a stream of requests for a BERT-like encoder. Each request has a batch
//! size and a sequence length drawn from a skewed mix (short sequences are common, long ones
//! rare, as in real traffic), and each layer of the model needs a compiled kernel per
//! `(op, batch, padded sequence length)`. Compiling a kernel does 0.1–1 ms of real work (it
//! generates and checksums a code buffer whose size grows with the shape). Kernels live in a
//! `runcache::Cache` shared by all workers, so each distinct kernel is compiled once no matter
//! how many workers need it at the same moment.
//!
//! Each layer's weights are reordered once into constant buffers held by the process-wide CPU
//! constant tensor cache (`runcache::constant`), with a byte budget: weights that do not fit
//! are reordered again on every use, as a memory-limited runtime would.
//!
//! Built with `--features vulkan`, the weights go to the GPU instead when a Vulkan device
//! exists (or with `--gpu`): they are uploaded once into device-local buffers
//! (`runcache::vulkan`) held by the process-wide GPU constant cache, whose budget comes from the
//! device (`--weights-mb` still wins). `--cpu` keeps them on the host.
//!
//! The run has two phases over the same request distribution: *cold* (empty cache) and *warm*
//! (the cache filled by the cold phase). It prints a table per phase.
//!
//! ```text
//! cargo run --release --example runtime -- [--threads N] [--requests N] [--capacity N]
//!                                          [--weights-mb N] [--gpu | --cpu]
//! ```

use runcache::constant::{self, ConstantKey};
use runcache::pool::PoolManager;
use runcache::{Cache, ConstantBuffer, DeviceKind};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The ops of one encoder layer that need a shape-specialized kernel.
const OPS: [&str; 8] = [
    "qkv_matmul",
    "attention_scores",
    "softmax",
    "attention_context",
    "out_projection",
    "layer_norm",
    "ffn_up_gelu",
    "ffn_down",
];
const LAYERS: usize = 4;
const BATCHES: [u32; 4] = [1, 2, 4, 8];
/// Hidden size of the model (kept small so the demo runs anywhere).
const HIDDEN: usize = 256;
/// The backend id under which the demo caches its weights.
const BACKEND: u64 = 1;

/// The weight tensor (rows, columns) of an op, if it has one.
fn weight_shape(op: &str) -> Option<(usize, usize)> {
    match op {
        "qkv_matmul" => Some((HIDDEN, 3 * HIDDEN)),
        "out_projection" => Some((HIDDEN, HIDDEN)),
        "ffn_up_gelu" => Some((HIDDEN, 4 * HIDDEN)),
        "ffn_down" => Some((4 * HIDDEN, HIDDEN)),
        "layer_norm" => Some((2, HIDDEN)),
        _ => None,
    }
}

/// "Reorders" a layer's weights: generates them and writes them transposed into a 64-byte
/// aligned constant buffer, as a runtime packs weights for its kernels.
fn reorder_weights(layer: usize, op: &str, rows: usize, cols: usize) -> ConstantBuffer {
    let mut buffer =
        ConstantBuffer::host(rows * cols * 4).expect("host memory for the demo's weights");
    let out = buffer
        .as_mut_slice()
        .expect("host buffers are host-accessible");
    let mut x = 0x9E37_79B9u32 ^ (layer as u32) << 16 ^ op.len() as u32;
    for r in 0..rows {
        for c in 0..cols {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let at = (c * rows + r) * 4;
            out[at..at + 4].copy_from_slice(&x.to_le_bytes());
        }
    }
    buffer
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct KernelKey {
    op: &'static str,
    batch: u32,
    seq: u32,
}

/// A "compiled" kernel: generated code and its checksum.
struct Kernel {
    code: Vec<u8>,
    checksum: u64,
    /// Per-run scratch memory (activations), sized for the kernel's shape and reused across
    /// runs instead of allocated on every run.
    scratch: PoolManager<Vec<u8>>,
}

impl Kernel {
    /// Generates code whose size grows with the shape: about 0.1 ms for the smallest shapes
    /// and about 1 ms for the largest on one core of a current x86 machine.
    fn compile(key: &KernelKey) -> Self {
        let len = 24_000 + (key.seq as usize * key.batch.ilog2() as usize + key.seq as usize) * 90;
        let mut code = Vec::with_capacity(len);
        let mut x = 0x243F_6A88_85A3_08D3u64 ^ (key.seq as u64) << 8 ^ key.batch as u64;
        for b in key.op.bytes() {
            x = x.rotate_left(5) ^ b as u64;
        }
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            code.push((x >> 24) as u8);
        }
        let checksum = code
            .chunks(8)
            .fold(0u64, |acc, c| acc.rotate_left(7) ^ c[0] as u64);
        // Activations of one op: batch x seq x hidden floats (capped for the demo).
        let scratch_len = (key.batch as usize * key.seq as usize * HIDDEN * 4).min(4 << 20);
        let scratch = PoolManager::new(1, move || vec![0u8; scratch_len])
            .expect("one pool per growth is a valid setting");
        Kernel {
            code,
            checksum,
            scratch,
        }
    }

    /// "Runs" the kernel: touches its code.
    fn run(&self, input: u64) -> u64 {
        let mut scratch = self
            .scratch
            .reserve()
            .expect("the scratch pool manager has no maximum");
        let i = (input as usize) % self.code.len();
        let at = (input as usize) % scratch.len();
        scratch[at] = self.code[i];
        self.checksum ^ u64::from(scratch[at])
    }
}

struct Config {
    threads: usize,
    requests: usize,
    capacity: u64,
    weights_mb: Option<u64>,
    /// `Some(true)`: `--gpu`; `Some(false)`: `--cpu`; `None`: the GPU if there is one.
    gpu: Option<bool>,
}

/// Where the weights live: the CPU constant cache, or device memory through Vulkan.
struct Store {
    device: DeviceKind,
    #[cfg(feature = "vulkan")]
    gpu: Option<runcache::vulkan::VulkanAllocator>,
}

static STORE: std::sync::OnceLock<Store> = std::sync::OnceLock::new();

fn store() -> &'static Store {
    STORE.get().expect("set in main before any worker starts")
}

/// Chooses where the weights live; `Err` when `--gpu` was asked for but cannot be had.
fn open_store(gpu: Option<bool>) -> Result<Store, String> {
    let cpu = Store {
        device: DeviceKind::Cpu,
        #[cfg(feature = "vulkan")]
        gpu: None,
    };
    if gpu == Some(false) {
        return Ok(cpu);
    }
    #[cfg(feature = "vulkan")]
    {
        use runcache::vulkan::{self, VulkanAllocator, VulkanContext};
        let made = VulkanContext::builder()
            .build()
            .and_then(|ctx| Ok((ctx.clone(), VulkanAllocator::new(ctx)?)));
        match made {
            Ok((ctx, allocator)) => {
                vulkan::configure_process_cache(&ctx);
                println!("weights on the GPU: {}", ctx.device_name());
                return Ok(Store {
                    device: DeviceKind::Gpu,
                    gpu: Some(allocator),
                });
            }
            Err(e) if gpu == Some(true) => return Err(format!("--gpu: {}", chain(&e))),
            Err(e) => println!("weights on the CPU (no Vulkan device: {})", chain(&e)),
        }
    }
    #[cfg(not(feature = "vulkan"))]
    if gpu == Some(true) {
        return Err(
            "--gpu needs the `vulkan` feature: cargo run --release --features vulkan \
                    --example runtime -- --gpu"
                .into(),
        );
    }
    Ok(cpu)
}

/// The weights of `(layer, op)`: cached, or reordered (and uploaded) now. Returns a byte of
/// them (host) or their size (device) for the demo's checksum.
fn use_weights(layer: usize, i: usize, op: &str, rows: usize, cols: usize, sink: u64) -> u64 {
    let store = store();
    let key = ConstantKey::new(BACKEND, (layer * OPS.len() + i) as u64);
    let w = constant::cache(store.device)
        .get_or_add(key, rows * cols * 4, || {
            let host = reorder_weights(layer, op, rows, cols);
            #[cfg(feature = "vulkan")]
            if let Some(gpu) = &store.gpu {
                let bytes = host.as_slice().expect("host buffer");
                return gpu.upload_constant(bytes).map_err(Into::into);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(host)
        })
        .unwrap_or_else(|e| panic!("the demo's weights could not be made: {e}"));
    match w.buffer.as_slice() {
        Some(bytes) => u64::from(bytes[(sink as usize) % bytes.len()]),
        None => w.buffer.size() as u64,
    }
}

/// The weights' budget when neither the flag nor the environment sets one: the model's
/// 12.4 MiB of weights fit. `--weights-mb 8` shows rejections: the weights that do not fit are
/// reordered again on every use.
const DEFAULT_WEIGHTS_MB: u64 = 16;

fn parse_args() -> Result<Option<Config>, String> {
    let mut cfg = Config {
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        requests: 4000,
        capacity: 4096,
        weights_mb: None,
        gpu: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            println!(
                "usage: runtime [--threads N] [--requests N] [--capacity N] [--weights-mb N]\n\
                 \x20              [--gpu | --cpu]\n\
                 \n  --threads N     worker threads (default: all cores, {})\
                 \n  --requests N    requests per phase (default: {})\
                 \n  --capacity N    kernels the cache may hold; 0 disables it (default: {})\
                 \n  --weights-mb N  constant cache budget in MiB (default: {} on the CPU,\
                 \n                  the device's budget on the GPU, or {} if set)\
                 \n  --gpu / --cpu   weights on the GPU (needs --features vulkan) or the host\
                 \n                  (default: the GPU when built with vulkan and one exists)",
                cfg.threads,
                cfg.requests,
                cfg.capacity,
                DEFAULT_WEIGHTS_MB,
                constant::ENV_VAR
            );
            return Ok(None);
        }
        if flag == "--gpu" || flag == "--cpu" {
            cfg.gpu = Some(flag == "--gpu");
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |what: &str| -> Result<u64, String> {
            value
                .parse::<u64>()
                .map_err(|_| format!("{what}: `{value}` is not a non-negative integer"))
        };
        match flag.as_str() {
            "--threads" => {
                cfg.threads = number("--threads")? as usize;
                if cfg.threads == 0 || cfg.threads > 4096 {
                    return Err(format!("--threads: {} is not in 1..=4096", cfg.threads));
                }
            }
            "--requests" => cfg.requests = number("--requests")? as usize,
            "--capacity" => cfg.capacity = number("--capacity")?,
            "--weights-mb" => cfg.weights_mb = Some(number("--weights-mb")?),
            other => return Err(format!("unknown flag `{other}` (try --help)")),
        }
    }
    Ok(Some(cfg))
}

/// A request's shape: a skewed mix of sequence lengths (padded to multiples of 16) and batches.
fn request_shape(rng: &mut u64) -> (u32, u32) {
    let r = xorshift(rng);
    // Geometric-like skew: most requests are short, few are long (up to 512 tokens).
    let tier = (r % 1000) as u32;
    let seq = match tier {
        0..=549 => 16 + 16 * ((r >> 10) % 4) as u32,   // 16..64
        550..=849 => 80 + 16 * ((r >> 10) % 6) as u32, // 80..160
        850..=969 => 176 + 16 * ((r >> 10) % 11) as u32, // 176..336
        _ => 352 + 16 * ((r >> 10) % 11) as u32,       // 352..512
    };
    let batch = BATCHES[((r >> 20) % 10).min(3) as usize];
    (batch, seq)
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

struct Phase {
    name: &'static str,
    requests: usize,
    elapsed: Duration,
    stats: runcache::Stats,
    weights: WeightBytes,
}

/// The CPU constant cache's bytes after a phase.
struct WeightBytes {
    cached: u64,
    rejected: u64,
    pinned: u64,
}

fn weight_bytes() -> WeightBytes {
    let w = constant::cache(store().device);
    WeightBytes {
        cached: w.size(),
        rejected: w.rejected_bytes(),
        pinned: w.pinned_bytes(),
    }
}

fn run_phase(
    name: &'static str,
    cache: &Arc<Cache<KernelKey, Kernel>>,
    cfg: &Config,
    seed: u64,
) -> Phase {
    let before = cache.stats();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..cfg.threads)
        .map(|t| {
            let (cache, next) = (Arc::clone(cache), Arc::clone(&next));
            let requests = cfg.requests;
            std::thread::spawn(move || {
                let mut rng = seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut sink = 0u64;
                while next.fetch_add(1, Ordering::Relaxed) < requests {
                    let (batch, seq) = request_shape(&mut rng);
                    for layer in 0..LAYERS {
                        for (i, op) in OPS.into_iter().enumerate() {
                            let key = KernelKey { op, batch, seq };
                            let kernel =
                                cache.get_or_insert_with(key.clone(), || Kernel::compile(&key));
                            sink ^= kernel.run(layer as u64 ^ sink);
                            if let Some((rows, cols)) = weight_shape(op) {
                                sink ^= use_weights(layer, i, op, rows, cols, sink);
                            }
                        }
                    }
                }
                sink
            })
        })
        .collect();
    let mut sink = 0;
    for w in workers {
        sink ^= w.join().expect("worker panicked");
    }
    std::hint::black_box(sink);
    let after = cache.stats();
    Phase {
        name,
        requests: cfg.requests,
        elapsed: start.elapsed(),
        stats: after.since(&before),
        weights: weight_bytes(),
    }
}

fn main() -> ExitCode {
    let cfg = match parse_args() {
        Ok(Some(cfg)) => cfg,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let store = match open_store(cfg.gpu) {
        Ok(store) => STORE.get_or_init(|| store),
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let weights = constant::cache(store.device);
    match (cfg.weights_mb, &constant::env_report().value) {
        (Some(mb), _) => weights.set_capacity_mb(mb),
        // The GPU cache was sized from the device's budget by `open_store`.
        (None, None) if store.device == DeviceKind::Gpu => {}
        (None, None) => weights.set_capacity_mb(DEFAULT_WEIGHTS_MB),
        (None, Some(_)) => {
            for e in &constant::env_report().parsed.errors {
                eprintln!("runtime: {}: {e}", constant::ENV_VAR);
            }
        }
    }
    let cache = Arc::new(
        Cache::<KernelKey, Kernel>::builder()
            .capacity(cfg.capacity)
            .build()
            .expect("the default shard count is always valid"),
    );
    println!(
        "runcache demo runtime: {} workers, {} requests per phase, {} ops x {} layers per request, \
         kernel cache capacity {}, {} constant cache {} MiB",
        cfg.threads,
        cfg.requests,
        OPS.len(),
        LAYERS,
        cfg.capacity,
        store.device,
        weights.capacity_mb()
    );
    let phases = [
        run_phase("cold", &cache, &cfg, 1),
        run_phase("warm", &cache, &cfg, 2),
    ];
    println!();
    println!(
        "{:<6} {:>9} {:>10} {:>8} {:>8} {:>8} {:>9} {:>12}",
        "phase", "requests", "hits", "misses", "builds", "shared", "hit ratio", "requests/s"
    );
    for p in &phases {
        println!(
            "{:<6} {:>9} {:>10} {:>8} {:>8} {:>8} {:>8.2}% {:>12.0}",
            p.name,
            p.requests,
            p.stats.hits,
            p.stats.misses,
            p.stats.builds,
            p.stats.waits,
            100.0 * p.stats.hit_ratio(),
            p.requests as f64 / p.elapsed.as_secs_f64()
        );
    }
    println!();
    println!(
        "{:<6} {:>18} {:>22} {:>14}",
        "phase", "weights cached", "weights rejected (sum)", "pinned"
    );
    for p in &phases {
        println!(
            "{:<6} {:>14.2} MiB {:>18.2} MiB {:>8} bytes",
            p.name,
            p.weights.cached as f64 / (1 << 20) as f64,
            p.weights.rejected as f64 / (1 << 20) as f64,
            p.weights.pinned
        );
    }
    // Scratch memory: every cached kernel's pool manager, summed.
    let (mut created, mut reserves) = (0, 0);
    for op in OPS {
        for batch in BATCHES {
            for seq in (16..=512).step_by(16) {
                if let Some(k) = cache.get(&KernelKey { op, batch, seq }) {
                    let s = k.scratch.stats();
                    created += s.created;
                    reserves += s.reserves;
                }
            }
        }
    }
    println!();
    println!(
        "scratch pools of the cached kernels: {reserves} runs, {created} pools allocated, \
         {} allocations avoided",
        reserves - created
    );
    let speedup = phases[0].elapsed.as_secs_f64() / phases[1].elapsed.as_secs_f64();
    println!();
    println!(
        "warm/cold throughput: {speedup:.1}x; kernels cached: {}; \"shared\" = callers that \
         waited for another worker's build instead of compiling the same kernel again; \
         rejected weights did not fit the constant cache and were reordered again on each use; \
         pinned = weight bytes outside the cache still held by callers",
        cache.len()
    );
    ExitCode::SUCCESS
}

/// An error and its sources, each after a colon: what a user needs to see of a failure.
#[cfg(feature = "vulkan")]
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(source) = next {
        text.push_str(&format!(": {source}"));
        next = source.source();
    }
    text
}
