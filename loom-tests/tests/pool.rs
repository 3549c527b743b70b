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
