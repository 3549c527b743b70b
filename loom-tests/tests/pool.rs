//! Loom model of the pool manager's free list: one pool, two threads that each reserve it,
//! write to it and hand it back. Pools sit in loom-tracked cells, so a pool handed to two
//! holders at once fails the model with a causality violation.
#![cfg(runcache_loom)]

use loom::sync::Arc;
use loom::thread;
use runcache::pool::PoolManager;

#[test]
fn one_pool_passes_between_two_holders_exclusively() {
    loom::model(|| {
        let pools = Arc::new(PoolManager::builder(|| 0u64).max_pools(1).build().unwrap());
        let other = {
            let pools = pools.clone();
            thread::spawn(move || {
                let mut p = pools.reserve().unwrap();
                *p += 1;
            })
        };
        {
            let mut p = pools.reserve().unwrap();
            *p += 1;
        }
        other.join().unwrap();
        assert_eq!(
            *pools.reserve().unwrap(),
            2,
            "both increments landed in the one pool"
        );
        assert_eq!(pools.pools(), 1);
        assert_eq!(pools.stats().created, 1);
    });
}

#[test]
fn a_growing_manager_hands_out_distinct_pools() {
    loom::model(|| {
        let pools = Arc::new(PoolManager::new(2, || 0u64).unwrap());
        let other = {
            let pools = pools.clone();
            thread::spawn(move || {
                let mut p = pools.reserve().unwrap();
                *p += 1;
                *p
            })
        };
        let mut p = pools.reserve().unwrap();
        *p += 10;
        let mine = *p;
        drop(p);
        let theirs = other.join().unwrap();
        // Each holder saw only its own writes if it had its own pool, or the other's too if
        // the pool was handed over; never a torn mix.
        assert!(
            matches!((mine, theirs), (10, 1) | (11, 1) | (10, 11)),
            "{mine} {theirs}"
        );
    });
}

/// Two threads wait for the one pool the main thread holds: each return wakes one waiter, a
/// waiter that finds the pool in its own look after a returner chose it passes that wake on,
/// and nobody sleeps forever (under the model, `park` is loom's, which fails the model as a
/// deadlock when every thread is parked).
#[test]
fn two_waiters_for_one_pool_no_wake_up_is_lost() {
    loom::model(|| {
        let pools = Arc::new(PoolManager::builder(|| 0u64).max_pools(1).build().unwrap());
        let held = pools.reserve().unwrap();
        let waiters: Vec<_> = [1u64, 10]
            .into_iter()
            .map(|add| {
                let pools = pools.clone();
                thread::spawn(move || {
                    let mut p = pools.reserve().unwrap();
                    *p += add;
                })
            })
            .collect();
        drop(held);
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(*pools.reserve().unwrap(), 11, "both waiters had the pool");
        assert_eq!(pools.stats().created, 1);
    });
}

/// Two threads wait for the two pools the main thread holds and returns one after the other;
/// each keeps its pool until both have one, so a pool comes back only if both waiters got
/// theirs. A waiter's own look may take the first pool while the second return's wake
/// chooses that same waiter; it must pass the wake on (W3 in `src/pool/slots.rs`), or the other
/// waiter sleeps beside a free pool and the model fails (a deadlock, or the first waiter's
/// wait for the second exhausting loom's branches).
#[test]
fn two_waiters_for_two_pools_a_wake_is_passed_on() {
    use loom::sync::atomic::{AtomicUsize, Ordering};
    loom::model(|| {
        let pools = Arc::new(PoolManager::builder(|| 0u64).max_pools(2).build().unwrap());
        let have = Arc::new(AtomicUsize::new(0));
        let (first, second) = (pools.reserve().unwrap(), pools.reserve().unwrap());
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (pools, have) = (pools.clone(), have.clone());
                thread::spawn(move || {
                    let mut p = pools.reserve().unwrap();
                    *p += 1;
                    have.fetch_add(1, Ordering::AcqRel);
                    while have.load(Ordering::Acquire) < 2 {
                        thread::yield_now();
                    }
                })
            })
            .collect();
        drop(first);
        drop(second);
        for w in waiters {
            w.join().unwrap();
        }
        let (a, b) = (pools.reserve().unwrap(), pools.reserve().unwrap());
        assert_eq!(*a + *b, 2, "each waiter had a pool");
        assert_eq!(pools.stats().created, 2);
    });
}

/// A task (under loom's `block_on`, which parks its thread until the task's waker is woken)
/// and a thread wait for the one pool the main thread holds: the return wakes one of them,
/// whichever queued first, and the other is woken by the first's return; a lost wake-up is
/// a deadlock the model reports.
#[test]
fn a_task_and_a_thread_wait_for_one_pool_no_wake_up_is_lost() {
    loom::model(|| {
        let pools = Arc::new(PoolManager::builder(|| 0u64).max_pools(1).build().unwrap());
        let held = pools.reserve().unwrap();
        let task = {
            let pools = pools.clone();
            thread::spawn(move || {
                let mut p = loom::future::block_on(pools.reserve_async()).unwrap();
                *p += 1;
            })
        };
        let waiter = {
            let pools = pools.clone();
            thread::spawn(move || {
                let mut p = pools.reserve().unwrap();
                *p += 10;
            })
        };
        drop(held);
        task.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(
            *pools.reserve().unwrap(),
            11,
            "both waiters used the one pool"
        );
    });
}
