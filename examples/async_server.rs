//! An async model server in miniature: many tasks on a few tokio worker threads serve
//! requests, each needing a compiled kernel for its shape. Kernels are cached in a
//! `runcache::Cache` through `get_or_insert_with_async`, so a storm of requests for a new
//! shape compiles it once while the other tasks wait without blocking a worker thread.
//!
//! ```text
//! cargo run --release --example async_server
//! ```
//!
//! It prints, per phase, the requests served, the kernels compiled and the cache's counters,
//! and exits non-zero if any shape was compiled more than once.

use runcache::{Cache, Handle};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A request's shape: batch size and sequence length.
type Shape = (u32, u32);

/// A "compiled kernel": its code and the shape it was compiled for.
struct Kernel {
    shape: Shape,
    code: Vec<u8>,
}

/// Compiles a kernel: some CPU work off the async workers (`spawn_blocking`), and an await
/// on a slow resource (a driver's compiler service, say).
async fn compile(shape: Shape, compiles: Arc<AtomicU64>) -> Kernel {
    compiles.fetch_add(1, Ordering::Relaxed);
    let code = tokio::task::spawn_blocking(move || {
        let mut x = u64::from(shape.0) << 32 | u64::from(shape.1);
        (0..4096)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect::<Vec<u8>>()
    })
    .await
    .expect("the compile task ran");
    tokio::time::sleep(Duration::from_millis(20)).await;
    Kernel { shape, code }
}

/// Serves one request: gets the kernel for its shape and "runs" it.
async fn serve(
    kernels: Arc<Cache<Shape, Kernel>>,
    compiles: Arc<AtomicU64>,
    shape: Shape,
) -> Result<u64, String> {
    let kernel: Handle<Kernel> = kernels
        .get_or_insert_with_async(shape, compile(shape, compiles))
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(kernel.shape, shape, "the kernel of another shape");
    Ok(kernel.code.iter().map(|&b| u64::from(b)).sum())
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let kernels = Arc::new(Cache::<Shape, Kernel>::new(64));
    let compiles = Arc::new(AtomicU64::new(0));
    let shapes: Vec<Shape> = [1, 2, 4, 8]
        .iter()
        .flat_map(|&b| [128, 256, 512].map(|s| (b, s)))
        .collect();
    let mut failed = false;
    println!(
        "async model server: 2 worker threads, {} shapes",
        shapes.len()
    );
    println!(
        "{:<28} {:>9} {:>9} {:>8} {:>8} {:>8} {:>10}",
        "phase", "requests", "compiles", "hits", "waits", "misses", "time"
    );
    for (phase, requests) in [
        ("storm: every shape is new", 10_000usize),
        ("steady: every shape cached", 10_000),
    ] {
        let before = (kernels.stats(), compiles.load(Ordering::Relaxed));
        let t0 = Instant::now();
        let served = rt.block_on(async {
            let tasks: Vec<_> = (0..requests)
                .map(|i| {
                    let shape = shapes[i % shapes.len()];
                    tokio::spawn(serve(kernels.clone(), compiles.clone(), shape))
                })
                .collect();
            let mut served = 0;
            for t in tasks {
                match t.await.expect("the request task ran") {
                    Ok(_) => served += 1,
                    Err(e) => eprintln!("request failed: {e}"),
                }
            }
            served
        });
        let s = kernels.stats().since(&before.0);
        let compiled = compiles.load(Ordering::Relaxed) - before.1;
        println!(
            "{:<28} {:>9} {:>9} {:>8} {:>8} {:>8} {:>10.1?}",
            phase,
            served,
            compiled,
            s.hits,
            s.waits,
            s.misses,
            t0.elapsed()
        );
        failed |= served != requests;
    }
    let total = compiles.load(Ordering::Relaxed);
    println!(
        "kernels compiled: {total} for {} shapes (one per shape: {})",
        shapes.len(),
        if total == shapes.len() as u64 {
            "yes"
        } else {
            "NO"
        }
    );
    if failed || total != shapes.len() as u64 {
        std::process::exit(1);
    }
}
