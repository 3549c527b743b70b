//! The eviction policy through the public API, under inputs that stress its adaptive state:
//! zero and near-capacity weights in one cache, a capacity of 1, and capacity changes while
//! the small queue's share adapts. Each run goes long enough (many sampling periods of the
//! policy's climber) for the share to move, and checks the cache's invariants throughout.

mod common;

use common::xorshift;
use runcache::Cache;
use std::collections::hash_map::DefaultHasher;
use std::hash::{BuildHasher, BuildHasherDefault};

/// A deterministic stream of keys: a hot set, a cold tail and a few scans.
fn stream(len: usize, keys: u64, seed: u64) -> impl Iterator<Item = u64> {
    let mut next = xorshift(seed);
    (0..len).map(move |i| {
        let x = next();
        match i % 1000 {
            // A scan of fresh keys every thousand accesses.
            0..=49 => 1_000_000 + i as u64,
            _ if x % 4 == 0 => x % keys,
            _ => x % (keys / 20).max(1),
        }
    })
}

/// Looks every key up and inserts it on a miss with `weight(key)`; checks the budget.
fn replay<S: BuildHasher>(
    cache: &Cache<u64, u64, S>,
    keys: impl Iterator<Item = u64>,
) -> (u64, u64) {
    let (mut hits, mut misses) = (0, 0);
    for k in keys {
        if cache.get(&k).is_some() {
            hits += 1;
        } else {
            misses += 1;
            let _ = cache.insert(k, k);
        }
        let (size, cap) = cache.weighted_size_and_capacity();
        assert!(size <= cap, "size {size} above capacity {cap}");
    }
    (hits, misses)
}

#[test]
fn weights_of_zero_and_near_the_capacity_share_a_cache_while_it_adapts() {
    const CAPACITY: u64 = 1_000;
    // Key % 7 == 0 weighs nothing, % 7 == 1 nearly the whole capacity, the rest 1.
    let cache: Cache<u64, u64> = Cache::builder()
        .capacity(CAPACITY)
        .weigher(|k, _| match k % 7 {
            0 => 0,
            1 => CAPACITY - 1,
            _ => 1,
        })
        .build()
        .unwrap();
    let (hits, misses) = replay(&cache, stream(400_000, 20_000, 7));
    assert!(hits > 0 && misses > 0);
    cache.__validate().expect("exact accounting and queues");
    assert!(
        cache.stats().evictions > 0,
        "the cache evicted while adapting"
    );
}

#[test]
fn a_capacity_of_one_adapts_without_overflow() {
    let cache: Cache<u64, u64> = Cache::builder().capacity(1).build().unwrap();
    let (hits, _) = replay(&cache, stream(300_000, 50, 3));
    assert!(hits > 0, "a one-entry cache still hits its hottest key");
    assert!(cache.len() <= 1);
    cache.__validate().expect("exact accounting and queues");
}

#[test]
fn capacity_changes_while_the_share_adapts_keep_the_budget() {
    let cache: Cache<u64, u64> = Cache::builder().capacity(2_000).build().unwrap();
    let capacities = [2_000u64, 300, 0, 1, 5_000, 50, 2_000];
    for (round, cap) in capacities.into_iter().enumerate() {
        cache.set_capacity(cap).unwrap();
        assert_eq!(cache.weighted_size_and_capacity().1, cap);
        replay(&cache, stream(150_000, 10_000, round as u64 + 11));
        assert!(cache.weighted_size() <= cap);
        cache.__validate().expect("exact accounting and queues");
    }
}

#[test]
fn threads_replaying_one_stream_keep_the_invariants_while_the_share_adapts() {
    let cache: Cache<u64, u64> = Cache::builder().capacity(500).build().unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let cache = &cache;
            s.spawn(move || {
                replay(cache, stream(100_000, 10_000, t + 21));
            });
        }
    });
    cache.__validate().expect("exact accounting and queues");
    assert!(cache.len() <= 500);
}

/// `len` keys from 0..`keys` drawn with a power law (density ∝ k^-0.75, about Zipf 0.75:
/// a frequency-heavy stream).
fn power_law(len: usize, keys: u64, seed: u64) -> impl Iterator<Item = u64> {
    let mut next = xorshift(seed);
    (0..len).map(move |_| {
        let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
        (u.powi(4) * keys as f64) as u64
    })
}

#[test]
fn a_weighted_cache_sizes_its_sketch_for_what_it_holds_not_for_a_wrong_hint() {
    // The frequency sketch and the ghost are sized before the cache's first eviction, for the
    // entries its capacity holds at the mean weight of those cached then (P4). A hint that
    // says entries weigh 64 when they weigh 1 guessed 512 entries; sized by the guess, the
    // sketch forgot the stream's frequent keys and the hit ratio fell behind.
    const CAPACITY: u64 = 32_768;
    let by_count: Cache<u64, u64> = Cache::builder().capacity(CAPACITY).build().unwrap();
    let hinted: Cache<u64, u64> = Cache::builder()
        .capacity(CAPACITY)
        .weigher(|_, _| 1)
        .expected_entry_weight(64)
        .build()
        .unwrap();
    let ratio = |cache: &Cache<u64, u64>| {
        let (hits, misses) = replay(cache, power_law(20 * CAPACITY as usize, 10 * CAPACITY, 3));
        cache.__validate().expect("exact accounting and queues");
        100.0 * hits as f64 / (hits + misses) as f64
    };
    let (count, weighted) = (ratio(&by_count), ratio(&hinted));
    assert!(
        weighted >= count - 0.5,
        "weighted with a wrong hint: {weighted:.2}% of hits, by count: {count:.2}%"
    );
}

/// `len` keys from 0..`keys`, the key of rank `k` drawn about as often as with a Zipf
/// distribution of exponent `s` (< 1): a continuous power law, inverted.
fn zipf_like(len: usize, keys: u64, s: f64, seed: u64) -> impl Iterator<Item = u64> {
    let mut next = xorshift(seed);
    let top = (keys as f64).powf(1.0 - s) - 1.0;
    (0..len).map(move |_| {
        let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
        ((1.0 + u * top).powf(1.0 / (1.0 - s)) as u64 - 1).min(keys - 1)
    })
}

#[test]
fn a_hot_set_that_moves_takes_the_cache_over_within_a_few_periods() {
    // Zipf 0.9 over 50,000 keys whose keys all change at once: the old hot keys stop being
    // used, but their sketch counts would win the admission duels against the new ones
    // until the sketch's halvings wore them down. A fall of the hit rate followed by a main
    // queue that sits idle ages the idle entries' counts (P5), so the new hot set takes the
    // cache over within a few of the climber's sampling periods (65,536 accesses each).
    // The second 100,000 accesses after the move hit 62.2% against 68.0% before it; without
    // the aging, 57.9% (over 25 random hashers: 56-58% without, 60-63% with it; measured
    // before remembered leavers hit once skipped the duel, when 67.4% hit before the move).
    const CAPACITY: u64 = 5_000;
    const KEYS: u64 = 50_000;
    const PHASE: usize = 500_000;
    // A fixed hasher, so the sketch's collisions, and the figures, are the same every run.
    let cache: Cache<u64, u64, _> = Cache::builder()
        .capacity(CAPACITY)
        .hasher(BuildHasherDefault::<DefaultHasher>::default())
        .build()
        .unwrap();
    let ratio = |(hits, misses): (u64, u64)| 100.0 * hits as f64 / (hits + misses) as f64;
    let _ = replay(&cache, zipf_like(PHASE - 100_000, KEYS, 0.9, 11));
    let settled = ratio(replay(&cache, zipf_like(100_000, KEYS, 0.9, 12)));
    let moved = |seed| zipf_like(100_000, KEYS, 0.9, seed).map(|k| k + KEYS);
    let _ = replay(&cache, moved(13));
    let recovered = ratio(replay(&cache, moved(14)));
    cache.__validate().expect("exact accounting and queues");
    println!("{recovered:.2}% of hits on the moved hot set, {settled:.2}% before it moved");
    assert!(
        recovered >= settled - 7.5,
        "{recovered:.2}% of hits on the moved hot set, {settled:.2}% before it moved"
    );
}

/// The hit ratio of a cache of `capacity` entries, replaying `keys`, its hasher seeded by
/// `seed`: the `seed`th of a random stream of 64-bit seeds. (foldhash folds its seed into
/// the key, so seeds 0, 1, 2, ... over dense integer keys would hash nearly one set of
/// keys and hide what the seed moves.)
fn seeded_ratio(capacity: u64, seed: u64, keys: impl Iterator<Item = u64>) -> f64 {
    use rand::{Rng, SeedableRng};
    let spread = rand::rngs::StdRng::seed_from_u64(seed).random::<u64>();
    let cache: Cache<u64, u64, _> = Cache::builder()
        .capacity(capacity)
        .hasher(foldhash::fast::FixedState::with_seed(spread))
        .build()
        .unwrap();
    let (hits, misses) = replay(&cache, keys);
    cache.__validate().expect("exact accounting and queues");
    100.0 * hits as f64 / (hits + misses) as f64
}

/// Fails unless `ratio` (a hit ratio in %, given a hasher seed) moves by at most a point
/// over six seeds ([`seeded_ratio`]'s 0 to 5).
fn assert_within_a_point_over_six_seeds(ratio: impl Fn(u64) -> f64) {
    let ratios: Vec<f64> = (0..6).map(ratio).collect();
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    println!("ratios over seeds: {ratios:.3?}");
    assert!(
        hi - lo <= 1.0,
        "the hit ratio spreads by {:.2} points over six hasher seeds: {ratios:.2?}",
        hi - lo
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a release test: .ci/test runs it optimized"
)]
fn the_hit_ratio_of_a_frequency_heavy_stream_moves_under_a_point_with_the_hasher_seed() {
    // The hasher's seed decides the sketch's collisions, the ghost's slots and the order of
    // the sweep; none may decide the outcome. Zipf 0.8 over 400,000 keys with a burst of
    // fresh keys every 100,000 accesses (each burst makes the hit rate fall by more than the
    // 5 points that open the climber's watch for a moved hot set), a cache of 8% of the
    // keys, six seeds.
    const CAPACITY: u64 = 32_000;
    const KEYS: u64 = 400_000;
    let stream = |seed| {
        let mut fresh = 10 * KEYS;
        zipf_like(1_500_000, KEYS, 0.8, seed)
            .enumerate()
            .flat_map(move |(i, k)| {
                let burst = if i % 100_000 == 99_999 { 20_000 } else { 0 };
                fresh += burst;
                (fresh - burst..fresh).chain(std::iter::once(k))
            })
    };
    assert_within_a_point_over_six_seeds(|seed| seeded_ratio(CAPACITY, seed, stream(21)));
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a release test: .ci/test runs it optimized"
)]
fn a_zigzag_keeps_what_it_keeps_whatever_the_hasher_seed() {
    // LIRS's zigzag: 2,001 keys up and down thirteen times, through a cache of a tenth of
    // them. Every key has one frequency, so a leaver the ghost sent back wins its duel by
    // the one miss that brought it back, its victim comes back and wins in turn; which keys
    // the sketch's collisions favour, a matter of the seed, decided whether those wins
    // chained into churn (5.07% to 7.59% over these six seeds, 2.53 points). The check on
    // narrow wins (P8) refuses them while their victims come back first: 7.94% to 8.91%.
    let zigzag = || {
        (0..13u64)
            .flat_map(|pass| {
                let up = pass % 2 == 0;
                (0..2_000u64).map(move |i| if up { i } else { 2_000 - i })
            })
            .chain(std::iter::once(0))
    };
    assert_within_a_point_over_six_seeds(|seed| seeded_ratio(200, seed, zigzag()));
}
