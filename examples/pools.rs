//! Scratch memory pools for cached primitives, as Arm Compute Library keeps them: threads
//! reserve a pool for each run and hand it back, so memory is allocated once and reused. A
//! bounded manager makes callers wait for a pool, or fail with a typed error.
//!
//! ```text
//! cargo run --release --example pools
//! ```

use runcache::pool::{PoolError, PoolManager, WhenExhausted};
use std::thread;

/// One run of a primitive: fills its 256 KiB scratch pool and reads it back.
fn run(scratch: &mut [f32], input: f32) -> f32 {
    scratch.fill(input);
    scratch.iter().copied().fold(f32::MIN, f32::max)
}

fn main() -> Result<(), PoolError> {
    // At most four pools, created two at a time; a fifth caller waits for one.
    let pools = PoolManager::builder(|| vec![0f32; 64 << 10])
        .pools_per_growth(2)
        .max_pools(4)
        .build()?;
    thread::scope(|s| {
        for t in 0..8 {
            let pools = &pools;
            s.spawn(move || {
                for i in 0..500 {
                    let mut scratch = pools.reserve().expect("waits rather than fails");
                    let input = (t * 1000 + i) as f32;
                    assert_eq!(
                        run(&mut scratch, input),
                        input,
                        "no other run wrote this pool"
                    );
                }
            });
        }
    });
    let stats = pools.stats();
    println!(
        "4,000 runs on 8 threads: {} pools created, {} reservations, {} reuses, {} waits, at most {} reserved at once",
        stats.created, stats.reserves, stats.reuses, stats.waits, stats.peak_reserved
    );
    assert!(stats.created <= 4);

    // A manager that fails instead of waiting says why.
    let strict = PoolManager::builder(|| vec![0u8; 1024])
        .max_pools(1)
        .when_exhausted(WhenExhausted::Fail)
        .build()?;
    let held = strict.reserve()?;
    match strict.reserve() {
        Err(e) => println!("second reservation: {e}"),
        Ok(_) => unreachable!("one pool at most"),
    }
    drop(held);
    println!("freed {} idle pools", pools.clear());

    // A setting out of range is refused when built.
    match PoolManager::builder(|| 0u8).max_pools(0).build() {
        Err(e) => println!("max_pools(0): {e}"),
        Ok(_) => unreachable!("refused"),
    }
    Ok(())
}
