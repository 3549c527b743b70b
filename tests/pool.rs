//! The pool manager: reuse, growth, limits, waiting, clearing, and reservation storms.

mod common;

use common::{drops, Tracked};
use runcache::pool::{PoolManager, WhenExhausted};
use runcache::PoolError;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

#[test]
fn a_returned_pool_is_reused() {
    let pools = PoolManager::new(1, || vec![0u8; 4096]).unwrap();
    {
        let mut p = pools.reserve().unwrap();
        p[10] = 7;
    }
    let p = pools.reserve().unwrap();
    assert_eq!(p[10], 7);
    let s = pools.stats();
    assert_eq!((s.created, s.reserves, s.reuses), (1, 2, 1));
}

#[test]
fn growth_creates_num_pools_at_a_time() {
    let made = Arc::new(AtomicUsize::new(0));
    let m = made.clone();
    let pools = PoolManager::new(3, move || m.fetch_add(1, Ordering::SeqCst)).unwrap();
    let a = pools.reserve().unwrap();
    assert_eq!((pools.pools(), made.load(Ordering::SeqCst)), (3, 3));
    let b = pools.reserve().unwrap();
    let c = pools.reserve().unwrap();
    assert_eq!(
        made.load(Ordering::SeqCst),
        3,
        "the batch served three reservations"
    );
    let d = pools.reserve().unwrap();
    assert_eq!((pools.pools(), made.load(Ordering::SeqCst)), (6, 6));
    let mut seen = vec![*a, *b, *c, *d];
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 4, "four distinct pools");
    assert_eq!(pools.stats().peak_reserved, 4);
}

#[test]
fn at_the_maximum_fail_returns_a_typed_error() {
    let pools = PoolManager::builder(|| 0u32)
        .pools_per_growth(4)
        .max_pools(2)
        .when_exhausted(WhenExhausted::Fail)
        .build()
        .unwrap();
    let _a = pools.reserve().unwrap();
    let _b = pools.reserve().unwrap();
    assert_eq!(pools.pools(), 2, "growth stops at the maximum");
    let e = pools.reserve().unwrap_err();
    assert_eq!(e, PoolError::Exhausted { max_pools: 2 });
    assert!(e.to_string().contains("all 2 pools"), "{e}");
}

#[test]
fn at_the_maximum_a_timed_wait_times_out_or_gets_a_returned_pool() {
    let pools = Arc::new(
        PoolManager::builder(|| 0u32)
            .max_pools(1)
            .when_exhausted(WhenExhausted::WaitFor(Duration::from_millis(40)))
            .build()
            .unwrap(),
    );
    let held = pools.reserve().unwrap();
    let e = pools.reserve().unwrap_err();
    assert!(
        matches!(e, PoolError::TimedOut { max_pools: 1, .. }),
        "{e:?}"
    );
    drop(held);

    let started = Arc::new(Barrier::new(2));
    let holder = {
        let (pools, started) = (pools.clone(), started.clone());
        thread::spawn(move || {
            let g = pools.reserve().unwrap();
            started.wait();
            thread::sleep(Duration::from_millis(10));
            drop(g);
        })
    };
    started.wait();
    let got = pools.reserve();
    holder.join().unwrap();
    assert!(got.is_ok(), "the returned pool reached the waiter: {got:?}");
    assert!(pools.stats().waits >= 2);
}

#[test]
fn an_untimed_wait_gets_the_pool_when_it_comes_back() {
    let pools = Arc::new(PoolManager::builder(|| 5u32).max_pools(1).build().unwrap());
    let g = pools.reserve().unwrap();
    let waiter = {
        let pools = pools.clone();
        thread::spawn(move || *pools.reserve().unwrap())
    };
    thread::sleep(Duration::from_millis(20));
    drop(g);
    assert_eq!(waiter.join().unwrap(), 5);
}

#[test]
fn clear_frees_free_pools_and_never_a_reserved_one() {
    let d = drops();
    let next = AtomicU64::new(0);
    let dd = d.clone();
    let pools = PoolManager::new(3, move || {
        Tracked::new(next.fetch_add(1, Ordering::SeqCst), &dd)
    })
    .unwrap();
    let held = pools.reserve().unwrap();
    assert_eq!(pools.clear(), 2);
    assert_eq!(d.load(Ordering::SeqCst), 2);
    assert_eq!(pools.pools(), 1);
    let id = held.id;
    drop(held);
    assert_eq!(pools.clear(), 1);
    assert_eq!(d.load(Ordering::SeqCst), 3);
    // Growth reuses the emptied slots.
    let again = pools.reserve().unwrap();
    assert_ne!(again.id, id, "a fresh pool after clearing");
    assert_eq!(pools.stats().freed, 3);
}

#[test]
fn dropping_the_manager_frees_every_pool_once() {
    let d = drops();
    {
        let dd = d.clone();
        let pools = PoolManager::new(4, move || Tracked::new(0, &dd)).unwrap();
        let _a = pools.reserve().unwrap();
        let _b = pools.reserve().unwrap();
    }
    assert_eq!(d.load(Ordering::SeqCst), 4);
}

#[test]
fn bad_settings_are_typed_errors() {
    assert!(matches!(
        PoolManager::new(0, || 0u8),
        Err(PoolError::InvalidConfig { .. })
    ));
    let e = PoolManager::builder(|| 0u8)
        .max_pools(0)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("max_pools"), "{e}");
}

#[test]
fn a_panicking_factory_leaves_the_counts_right() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let pools = PoolManager::builder(move || {
        if c.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("allocation failed");
        }
        1u32
    })
    .max_pools(1)
    .when_exhausted(WhenExhausted::Fail)
    .build()
    .unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pools.reserve().map(|g| *g)));
    assert!(r.is_err());
    assert_eq!(pools.pools(), 0);
    assert_eq!(
        *pools.reserve().unwrap(),
        1,
        "the maximum was not used up by the panic"
    );
}

/// A pool that records who holds it.
struct Owned {
    owner: AtomicU64,
    uses: AtomicU64,
}

#[test]
fn a_reservation_storm_never_hands_one_pool_to_two_holders() {
    for max in [1usize, 3] {
        let pools = Arc::new(
            PoolManager::builder(|| Owned {
                owner: AtomicU64::new(0),
                uses: AtomicU64::new(0),
            })
            .pools_per_growth(2)
            .max_pools(max)
            .build()
            .unwrap(),
        );
        let handles: Vec<_> = (1..=6u64)
            .map(|me| {
                let pools = pools.clone();
                thread::spawn(move || {
                    for _ in 0..5_000 {
                        let p = pools.reserve().unwrap();
                        let before = p.owner.swap(me, Ordering::SeqCst);
                        assert_eq!(before, 0, "pool held by {before} handed to {me}");
                        p.uses.fetch_add(1, Ordering::Relaxed);
                        p.owner.store(0, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert!(pools.pools() <= max);
        let s = pools.stats();
        assert_eq!(s.reserves, 30_000);
        assert!(s.peak_reserved as usize <= max);
        assert_eq!(s.created as usize, pools.pools());
    }
}

#[test]
fn waiters_that_keep_timing_out_do_not_pile_up() {
    let pools = PoolManager::builder(|| 0u8)
        .max_pools(1)
        .when_exhausted(WhenExhausted::WaitFor(Duration::from_micros(1)))
        .build()
        .unwrap();
    let held = pools.reserve().unwrap();
    for _ in 0..5_000 {
        assert!(matches!(
            pools.reserve(),
            Err(PoolError::TimedOut { max_pools: 1, .. })
        ));
    }
    // Each timeout leaves its registration queued; sweeps keep them under about a thousand.
    let queued = pools.__queued_waiters();
    assert!(queued < 1024, "{queued} registrations left behind");
    assert_eq!(pools.stats().waits, 5_000);
    drop(held);
    assert!(
        pools.reserve().is_ok(),
        "the pool comes back to the next caller"
    );
}
