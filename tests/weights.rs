//! Weighted caches: what a weight of 0 means.

mod common;

use runcache::{Cache, WhenFull};

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
        cache.put(k, 1 + k % 3).unwrap();
        assert!(cache.weighted_size() <= 10);
    }
    assert!(
        (0..2_000).all(|k| cache.get(&k).is_some()),
        "no weightless entry was evicted"
    );
    assert!(cache.stats().evictions > 0);
    cache.__validate().unwrap();
    // A shrink keeps them too; a capacity of 0 disables the cache, which holds nothing.
    cache.set_capacity(2);
    assert_eq!((0..2_000).filter(|k| cache.get(k).is_some()).count(), 2_000);
    assert!(cache.weighted_size() <= 2);
    cache.set_capacity(0);
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
    cache.set_capacity(5);
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
            assert_eq!(
                cache.insert(k, w).is_ok(),
                w <= CAPACITY,
                "access {i}: weight {w} refused only when it cannot fit"
            );
        }
        assert!(cache.weighted_size() <= CAPACITY);
    }
    let zero = (0..5_000u64).filter(|k| k % 10 == 0);
    let seen = zero.filter(|k| cache.get(k).is_some()).count();
    assert!(seen > 400, "weightless entries stay once cached ({seen})");
    cache.__validate().unwrap();
}
