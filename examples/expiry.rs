//! Expiry in a runtime: reordered weights that give their bytes back when no request has
//! used them for ten minutes, and query plans whose lifetime depends on what they were
//! built from. Time is moved by hand here (`Clock::manual`), so the example runs at once;
//! a real cache keeps the default coarse clock.
//!
//! ```text
//! cargo run --example expiry
//! ```

use runcache::{Cache, Clock, Expiry, RemovalCause};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MIN: Duration = Duration::from_secs(60);

/// A plan lives as long as the statistics it was built from stay fresh: an hour for a plan
/// from fresh statistics, a minute for one from a guess; a read changes nothing.
struct PlanAge;

struct Plan {
    cost: u64,
    from_fresh_stats: bool,
}

impl Expiry<String, Plan> for PlanAge {
    fn after_create(&self, _: &String, plan: &Plan) -> Option<Duration> {
        Some(if plan.from_fresh_stats { 60 * MIN } else { MIN })
    }
}

fn main() -> Result<(), runcache::ConfigError> {
    let (clock, hand) = Clock::manual();

    // Weights: a byte budget; a model idle for ten minutes gives its memory back.
    let freed = Arc::new(AtomicU64::new(0));
    let sink = Arc::clone(&freed);
    let weights = Cache::<&str, Vec<u8>>::builder()
        .capacity(64 << 20)
        .weigher(|_, w| w.len() as u64)
        .time_to_idle(10 * MIN)
        .clock(clock.clone())
        .on_evict(move |_, w, cause| {
            if cause == RemovalCause::Expired {
                sink.fetch_add(w.len() as u64, Ordering::Relaxed);
            }
        })
        .build()?;
    weights.put("resnet50/conv1", vec![0; 8 << 20]).unwrap();
    weights.put("bert/embeddings", vec![0; 16 << 20]).unwrap();
    for _ in 0..3 {
        hand.advance(6 * MIN);
        // Every request uses resnet: it stays; bert sits idle.
        assert!(weights.get("resnet50/conv1").is_some());
    }
    // Nothing was written for 18 minutes: the bytes come back at the purge (a runtime calls it
    // from its own timer, or lets its writes do it).
    assert!(weights.get("bert/embeddings").is_none());
    weights.purge_expired();
    println!(
        "weights: {} MiB cached, {} MiB given back by idle models",
        weights.weighted_size() >> 20,
        freed.load(Ordering::Relaxed) >> 20
    );

    // Plans: each one's lifetime decided by what it was built from.
    let plans = Cache::builder()
        .capacity(1_000)
        .expire_after(PlanAge)
        .clock(clock)
        .build()?;
    let plan = |fresh: bool| {
        move || Plan {
            cost: if fresh { 10 } else { 99 },
            from_fresh_stats: fresh,
        }
    };
    plans.get_or_insert_with("q1".to_string(), plan(true));
    plans.get_or_insert_with("q2".to_string(), plan(false));
    hand.advance(2 * MIN);
    let q1 = plans.get_or_insert_with("q1".to_string(), plan(true));
    let q2 = plans.get_or_insert_with("q2".to_string(), plan(true));
    println!(
        "plans: q1 cost {} (kept), q2 cost {} (rebuilt after its guess expired), {} builds",
        q1.cost,
        q2.cost,
        plans.stats().builds
    );
    assert_eq!(plans.stats().builds, 3);
    Ok(())
}
