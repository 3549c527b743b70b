//! The process-wide constant caches, configured from the environment as oneDNN's are:
//! `RUNCACHE_CONSTANT_CACHE_CAPACITY` gives each device kind a budget in MiB. A bad field is
//! reported with its token and byte position, and the other fields still apply; nothing
//! panics, and a kind left without a budget caches nothing (every use builds its constant).
//! `RUNCACHE_CONSTANT_CACHE_IDLE_SECS` gives every kind an idle time.
//!
//! ```text
//! RUNCACHE_CONSTANT_CACHE_CAPACITY='cpu:64;gpu:16' RUNCACHE_CONSTANT_CACHE_IDLE_SECS=600 \
//!     cargo run --example constant_env
//! RUNCACHE_CONSTANT_CACHE_CAPACITY='cpu:64;gpu:lots' cargo run --example constant_env
//! ```
//!
//! Unset, the example reads `cpu:1` (one MiB for the CPU cache).

use runcache::constant::{self, ConstantKey, DeviceKind};
use runcache::{AllocError, ConstantBuffer, Source};

/// Reorders a layer's weights into a new host buffer (here: fills it).
fn reorder(layer: u64, bytes: usize) -> Result<ConstantBuffer, AllocError> {
    let mut buffer = ConstantBuffer::host(bytes)?;
    buffer
        .as_mut_slice()
        .expect("host memory")
        .fill(layer as u8);
    Ok(buffer)
}

fn main() {
    if std::env::var_os(constant::ENV_VAR).is_none() {
        // Before any thread starts and before the caches first read it.
        std::env::set_var(constant::ENV_VAR, "cpu:1");
    }
    let report = constant::env_report();
    println!(
        "{}={:?}",
        constant::ENV_VAR,
        report.value.as_deref().unwrap_or("")
    );
    for error in &report.parsed.errors {
        // The typed error: what is wrong, the token, its byte position.
        println!(
            "  error ({:?} at byte {}): {error}",
            error.kind, error.position
        );
    }
    match &report.idle {
        Ok(Some(idle)) => println!("  idle time {} s", idle.as_secs()),
        Ok(None) => println!("  no idle time ({} unset)", constant::IDLE_ENV_VAR),
        Err(e) => println!("  idle time error: {e}"),
    }
    for kind in DeviceKind::ALL {
        match constant::env_capacity_mb(kind) {
            Some(mb) => println!("  {kind}: {mb} MiB"),
            None => println!("  {kind}: not set, so off (capacity 0)"),
        }
    }

    // Six layers of 256 KiB, asked for twice: the first pass builds, the second hits,
    // except what did not fit in the budget.
    let weights = constant::cache(DeviceKind::Cpu);
    for pass in ["first", "second"] {
        let mut sources = Vec::new();
        for layer in 0..6 {
            let added = weights
                .get_or_add(ConstantKey::new(0, layer), 256 << 10, || {
                    reorder(layer, 256 << 10)
                })
                .expect("host memory is there");
            sources.push(match added.source {
                Source::Hit => "hit",
                Source::Cached => "built, cached",
                Source::Uncached => "built, did not fit",
                _ => "shared",
            });
        }
        println!("{pass} pass: {sources:?}");
    }
    let (size, capacity) = weights.size_and_capacity();
    println!(
        "CPU cache: {} of {} KiB held, {} KiB rejected over the run",
        size >> 10,
        capacity >> 10,
        weights.rejected_bytes() >> 10
    );
}
