//! Weighted caches: what a weight of 0 means, heavy newcomers at the policy's door, and how
//! full the budget stays under sustained misses.

mod common;

use runcache::{Cache, WhenFull};
use std::sync::atomic::{AtomicU64, Ordering};

/// A cache whose weigher reads the weight from the value.
fn weighed(capacity: u64) -> Cache<u64, u64> {
    Cache::builder()
        .capacity(capacity)
        .weigher(|_, v| *v)
        .build()
        .unwrap()
}

#[test]
fn entries_of_weight_zero_are_never_evicted_to_make_room() {
    let cache = weighed(10);
    for k in 0..2_000 {
        cache.put(k, 0).unwrap();
    }
    assert_eq!(cache.len(), 2_000, "weightless entries take no room");
    assert_eq!(cache.weighted_size(), 0);
    // Mixed with weighted entries under pressure: only the weighted ones leave.
    for k in 10_000..20_000 {
        // Heavier than the policy's room for newcomers, some are turned away.
        if let Err(e) = cache.insert(k, 1 + k % 3) {
            assert!(e.turned_away, "{e}");
        }
        assert!(cache.weighted_size() <= 10);
    }
    assert!(
        (0..2_000).all(|k| cache.get(&k).is_some()),
        "no weightless entry was evicted"
    );
    assert!(cache.stats().evictions > 0);
    cache.__validate().unwrap();
    // A shrink keeps them too; a capacity of 0 disables the cache, which holds nothing.
    cache.set_capacity(2).unwrap();
    assert_eq!((0..2_000).filter(|k| cache.get(k).is_some()).count(), 2_000);
    assert!(cache.weighted_size() <= 2);
    cache.set_capacity(0).unwrap();
    assert_eq!(cache.len(), 0);
    cache.__validate().unwrap();
}

#[test]
fn weightless_entries_leave_by_removal_replacement_retain_and_clear() {
    let cache = weighed(10);
    for k in 0..100 {
        cache.put(k, 0).unwrap();
    }
    assert!(cache.remove(&0).is_some());
    // Replaced by a weighted value, an entry becomes an eviction candidate like any other.
    cache.put(1, 5).unwrap();
    for k in 1_000..1_100 {
        cache.put(k, 5).unwrap();
    }
    assert!(
        cache.get(&1).is_none(),
        "the weighted replacement was evicted"
    );
    cache.retain(|k, _| k % 2 == 0);
    assert!((2..100)
        .filter(|k| k % 2 == 1)
        .all(|k| cache.get(&k).is_none()));
    cache.__validate().unwrap();
    cache.clear();
    assert_eq!((cache.len(), cache.weighted_size()), (0, 0));
}

#[test]
fn a_rejecting_cache_keeps_weightless_entries_through_a_shrink() {
    let cache: Cache<u64, u64> = Cache::builder()
        .capacity(100)
        .weigher(|_, v| *v)
        .when_full(WhenFull::Reject)
        .build()
        .unwrap();
    for k in 0..50 {
        cache.put(k, k % 2).unwrap();
    }
    cache.set_capacity(5).unwrap();
    assert_eq!(
        (0..50)
            .filter(|k| k % 2 == 0 && cache.get(k).is_some())
            .count(),
        25,
        "every weightless entry stays"
    );
    assert!(cache.weighted_size() <= 5);
    cache.__validate().unwrap();
}

#[test]
fn weights_of_zero_one_and_near_the_capacity_share_a_cache() {
    const CAPACITY: u64 = 1_000;
    let cache = weighed(CAPACITY);
    let mut next = common::xorshift(1);
    for i in 0..200_000u64 {
        let k = next() % 5_000;
        let w = match k % 10 {
            0 => 0,
            1 => CAPACITY - 1,
            2 => u64::MAX,
            _ => 1,
        };
        if cache.get(&k).is_none() {
            match cache.insert(k, w) {
                Ok(_) => assert!(w <= CAPACITY),
                Err(e) => assert!(
                    w > CAPACITY && !e.turned_away || w <= CAPACITY && e.turned_away,
                    "access {i}: weight {w}: {e}"
                ),
            }
        }
        assert!(cache.weighted_size() <= CAPACITY);
    }
    let zero = (0..5_000u64).filter(|k| k % 10 == 0);
    let seen = zero.filter(|k| cache.get(k).is_some()).count();
    assert!(seen > 400, "weightless entries stay once cached ({seen})");
    cache.__validate().unwrap();
}

/// A heavy newcomer the sketch has never seen does not push out a cache of light entries
/// that are all in use: it is judged at the door against what it would displace, and
/// refused, having displaced nothing.
#[test]
fn a_cold_heavy_newcomer_displaces_nothing_from_a_cache_of_proven_light_entries() {
    let cache = weighed(1_000);
    // 100 light entries of weight 10 fill the budget, each used many times, while one-off
    // light entries pass through: the cache evicts, and its sketch learns the light keys.
    for i in 0..100 {
        for k in 0..100 {
            if cache.get(&k).is_none() {
                let _ = cache.insert(k, 10);
            }
        }
        let _ = cache.get_or_insert_with(500_000 + i, || 10);
    }
    for round in 0..3 {
        for k in 0..100 {
            if cache.get(&k).is_none() {
                let _ = cache.insert(k, 10);
            }
        }
        let before = (0..100).filter(|k| cache.get(k).is_some()).count();
        // Fresh heavy keys, each heavier than the small queue can ever be (at most 80% of
        // the capacity), each seen once.
        for h in 0..20 {
            let k = 1_000_000 + round * 100 + h;
            let _ = cache.get_or_insert_with(k, || 900);
        }
        let after = (0..100).filter(|k| cache.get(k).is_some()).count();
        assert_eq!(
            after, before,
            "round {round}: the heavy one-offs pushed out light entries in use"
        );
    }
    assert!(cache.stats().rejections > 0, "heavy one-offs were refused");
    cache.__validate().unwrap();
}

/// A heavy entry asked for often enough gets in, through the door, even when every
/// entry it displaces is in use.
#[test]
fn a_heavy_entry_asked_for_more_often_than_its_victims_wins_its_place() {
    let cache = weighed(1_000);
    let builds = AtomicU64::new(0);
    for round in 0..200 {
        for k in 0..90 {
            if round % 4 == 0 && cache.get(&k).is_none() {
                let _ = cache.insert(k, 10);
            }
        }
        let _ = cache.get_or_insert_with(7_777, || {
            builds.fetch_add(1, Ordering::Relaxed);
            300
        });
    }
    assert!(
        builds.load(Ordering::Relaxed) < 20,
        "the hot heavy entry was built {} times in 200 asks",
        builds.load(Ordering::Relaxed)
    );
    cache.__validate().unwrap();
}

/// Under a stream of misses of entries of widely different weights (16 KiB to 16 MiB in a
/// 64 MiB budget), the cache stays mostly full: a victim heavier than what a newcomer needs
/// leaves a hole that the next newcomers fill. (A floor on what holds today, about 90% on
/// average and 76% at the 10th percentile, not the 95% and 85% the policy aims at: the
/// victims are chosen by use, not by how well their weight fits the need.)
#[test]
fn the_budget_stays_mostly_full_under_sustained_weighted_misses() {
    const CAPACITY: u64 = 64 << 20;
    let cache: Cache<u64, u64> = Cache::builder()
        .capacity(CAPACITY)
        .weigher(|_, v| *v)
        .build()
        .unwrap();
    let mut next = common::xorshift(9);
    let mut samples = Vec::new();
    for i in 0..200_000u64 {
        let x = next();
        // 16 KiB to 16 MiB, log-uniform; keys mostly fresh, a few thousand reused.
        let w = 16_384u64 << (x % 11);
        let k = if x % 4 == 0 { x % 3_000 } else { i + 1_000_000 };
        let _ = cache.get_or_insert_with(k, || w);
        if i > 20_000 && i % 64 == 0 {
            samples.push(cache.weighted_size() as f64 / CAPACITY as f64);
        }
    }
    samples.sort_by(f64::total_cmp);
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    let p10 = samples[samples.len() / 10];
    assert!(mean >= 0.85, "mean fill {mean:.3}");
    assert!(p10 >= 0.70, "10th percentile fill {p10:.3}");
    cache.__validate().unwrap();
}
