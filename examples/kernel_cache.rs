//! A JIT kernel cache shared by threads: eight workers serve requests whose shapes repeat,
//! and each shape's kernel is compiled once, however many workers miss it at the same time
//! (the others wait for that compile and share its result).
//!
//! ```text
//! cargo run --release --example kernel_cache
//! ```
//!
//! It prints the compiles, the callers that shared another worker's compile, and the cache's
//! counters, and exits non-zero if any shape was compiled twice.

use runcache::{Cache, Source};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant};

/// What a kernel is compiled for: the operation and the matrix shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct KernelKey {
    op: &'static str,
    m: u32,
    n: u32,
    k: u32,
}

/// A compiled kernel (here the name of what would be machine code).
struct Kernel {
    symbol: String,
}

/// A JIT compile: milliseconds of work, counted.
fn compile(key: &KernelKey, compiles: &AtomicU64) -> Kernel {
    compiles.fetch_add(1, Relaxed);
    thread::sleep(Duration::from_millis(20));
    Kernel {
        symbol: format!("{}_{}x{}x{}", key.op, key.m, key.n, key.k),
    }
}

fn main() {
    const WORKERS: u32 = 8;
    const REQUESTS: u32 = 200;
    let kernels: Cache<KernelKey, Kernel> = Cache::new(64);
    let compiles = AtomicU64::new(0);
    let shared = AtomicU64::new(0);
    let start = Instant::now();
    thread::scope(|s| {
        for worker in 0..WORKERS {
            let (kernels, compiles, shared) = (&kernels, &compiles, &shared);
            s.spawn(move || {
                for request in 0..REQUESTS {
                    // Two operations at batch sizes 1 to 8: 16 shapes, which every worker
                    // meets from its first requests on.
                    let key = KernelKey {
                        op: if request % 3 == 0 { "softmax" } else { "gemm" },
                        m: 1 + (request + worker) % 8,
                        n: 768,
                        k: 768,
                    };
                    let fetched = kernels
                        .get_or_build(key, |k| Ok::<_, Infallible>(compile(k, compiles)))
                        .expect("the compile never fails nor asks the cache for its key");
                    if fetched.source == Source::Shared {
                        shared.fetch_add(1, Relaxed);
                    }
                    assert!(fetched.value.symbol.ends_with("x768x768"));
                }
            });
        }
    });
    let stats = kernels.stats();
    let compiles = compiles.load(Relaxed);
    println!(
        "{} requests on {WORKERS} threads in {:.0?}",
        WORKERS * REQUESTS,
        start.elapsed()
    );
    println!(
        "kernels compiled: {compiles} for {} shapes; callers that waited for another's compile: {}",
        kernels.len(),
        shared.load(Relaxed)
    );
    println!(
        "cache: {} hits, {} misses, {} builds, hit ratio {:.1}%",
        stats.hits,
        stats.misses,
        stats.builds,
        100.0 * stats.hit_ratio()
    );
    if compiles != kernels.len() as u64 {
        eprintln!("error: a shape was compiled more than once");
        std::process::exit(1);
    }
}
