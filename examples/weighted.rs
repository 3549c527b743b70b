//! A cache with a byte budget: each entry weighs the bytes its tensor holds, the budget
//! holds at every instant (sampled after every insert here), and a listener hears of every
//! tensor that leaves the cache and why. An entry heavier than the whole budget is refused
//! and handed back, and a smaller budget set while running evicts down to it.
//!
//! ```text
//! cargo run --release --example weighted
//! ```

use runcache::{Cache, RemovalCause};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Bytes and entries that left the cache, by cause.
#[derive(Default)]
struct Departures {
    evicted: AtomicU64,
    evicted_bytes: AtomicU64,
    replaced: AtomicU64,
    removed: AtomicU64,
}

fn main() -> Result<(), runcache::ConfigError> {
    const BUDGET: u64 = 1 << 20; // 1 MiB
    let left = Arc::new(Departures::default());
    let listener = Arc::clone(&left);
    let tensors = Cache::<u32, Vec<f32>>::builder()
        .capacity(BUDGET)
        .weigher(|_, t| (t.len() * std::mem::size_of::<f32>()) as u64)
        .expected_entry_weight(16 << 10)
        .on_evict(move |_, tensor, cause| match cause {
            RemovalCause::Capacity => {
                listener.evicted.fetch_add(1, Relaxed);
                let bytes = (tensor.len() * std::mem::size_of::<f32>()) as u64;
                listener.evicted_bytes.fetch_add(bytes, Relaxed);
            }
            RemovalCause::Replaced => {
                listener.replaced.fetch_add(1, Relaxed);
            }
            _ => {
                listener.removed.fetch_add(1, Relaxed);
            }
        })
        .build()?;

    // 400 tensors of 4 to 64 KiB (sizes from a fixed seed), every fifth key written twice.
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut peak = 0;
    for i in 0..400u32 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let floats = 1024 * (1 + (seed % 16) as usize);
        let key = if i % 5 == 0 { i / 5 } else { i };
        tensors
            .put(key, vec![i as f32; floats])
            .expect("lighter than the budget");
        let (size, capacity) = tensors.weighted_size_and_capacity();
        assert!(size <= capacity, "the budget holds at every sample");
        peak = peak.max(size);
    }
    println!(
        "budget {} KiB; peak held {} KiB; {} tensors cached ({} KiB)",
        BUDGET >> 10,
        peak >> 10,
        tensors.len(),
        tensors.weighted_size() >> 10
    );
    println!(
        "left the cache: {} evicted ({} KiB), {} replaced",
        left.evicted.load(Relaxed),
        left.evicted_bytes.load(Relaxed) >> 10,
        left.replaced.load(Relaxed)
    );

    // Heavier than the whole budget: refused, nothing evicted, the tensor handed back.
    let huge = vec![0f32; (BUDGET as usize / 4) + 1];
    match tensors.insert(u32::MAX, huge) {
        Ok(_) => unreachable!("it cannot fit"),
        Err(refused) => {
            println!("refused: {refused}");
            let (key, tensor) = refused.into_inner();
            assert_eq!((key, tensor.len()), (u32::MAX, (BUDGET as usize / 4) + 1));
        }
    }

    // A smaller budget, set while running: the policy evicts down to it.
    let before = left.evicted.load(Relaxed);
    tensors.set_capacity(BUDGET / 4).unwrap();
    println!(
        "after set_capacity({} KiB): {} KiB held, {} more evicted",
        (BUDGET / 4) >> 10,
        tensors.weighted_size() >> 10,
        left.evicted.load(Relaxed) - before
    );
    assert!(tensors.weighted_size() <= BUDGET / 4);
    tensors.clear();
    println!("cleared: {} removed", left.removed.load(Relaxed));
    Ok(())
}
