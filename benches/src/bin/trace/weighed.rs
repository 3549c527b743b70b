//! The policies a weighted trace replays against. Each returns the hits of a trace at a
//! capacity in bytes and the bytes those hits asked for: the object and the byte hit ratio.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Hits and the bytes they asked for.
pub type Hits = (u64, u64);

/// Replays `trace` on `threads` threads, each claiming the next access from a shared cursor
/// (as `policies::concurrently` does for unit traces); `access(key, size)` says whether the
/// access hit.
pub fn concurrently(
    trace: &[(u64, u32)],
    threads: usize,
    access: impl Fn(u64, u32) -> bool + Sync,
) -> Hits {
    let (hits, bytes) = (AtomicU64::new(0), AtomicU64::new(0));
    let cursor = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let (mut h, mut b) = (0, 0);
                while let Some(&(k, size)) = trace.get(cursor.fetch_add(1, Ordering::Relaxed)) {
                    if access(k, size) {
                        h += 1;
                        b += u64::from(size);
                    }
                }
                hits.fetch_add(h, Ordering::Relaxed);
                bytes.fetch_add(b, Ordering::Relaxed);
            });
        }
    });
    (hits.into_inner(), bytes.into_inner())
}

/// An exact LRU by bytes: on a miss the entry is admitted (unless heavier than the capacity)
/// and the least recently used entries leave until the rest fits.
pub fn lru(trace: &[(u64, u32)], capacity: u64) -> Hits {
    let mut cache: lru::LruCache<u64, u32> = lru::LruCache::unbounded();
    let mut size = 0u64;
    let (mut hits, mut bytes) = (0, 0);
    for &(k, s) in trace {
        if cache.get(&k).is_some() {
            hits += 1;
            bytes += u64::from(s);
            continue;
        }
        if u64::from(s) > capacity {
            continue;
        }
        while size + u64::from(s) > capacity {
            let (_, v) = cache
                .pop_lru()
                .expect("a cache over its room holds entries");
            size -= u64::from(v);
        }
        cache.put(k, s);
        size += u64::from(s);
    }
    (hits, bytes)
}

/// runcache weighing each entry by its size, its hasher seeded as `policies::seeded` does;
/// each access goes through `get_or_insert_with` (see `policies::runcache`).
pub fn runcache(trace: &[(u64, u32)], capacity: u64, threads: usize, seed: u64) -> Hits {
    use rand::{Rng, SeedableRng};
    let spread = rand::rngs::StdRng::seed_from_u64(seed).random::<u64>();
    let cache = crate::policies::tuned(runcache::Cache::<u64, u32, _>::builder())
        .capacity(capacity)
        .weigher(|_, v| u64::from(*v))
        .hasher(foldhash::fast::FixedState::with_seed(spread))
        .build()
        .expect("default shards and checked tuning are valid");
    concurrently(trace, threads, |k, s| {
        let mut built = false;
        let _ = cache.get_or_insert_with(k, || {
            built = true;
            s
        });
        !built
    })
}

/// moka weighing each entry by its size, holding its capacity (its pending tasks run after
/// every insert, see `policies::moka`).
pub fn moka(trace: &[(u64, u32)], capacity: u64, threads: usize) -> Hits {
    let cache = moka::sync::Cache::<u64, u32>::builder()
        .max_capacity(capacity)
        .weigher(|_, v| *v)
        .build();
    concurrently(trace, threads, |k, s| {
        let hit = cache.get(&k).is_some();
        if !hit {
            cache.insert(k, s);
            cache.run_pending_tasks();
        }
        hit
    })
}

#[derive(Clone)]
struct Bytes;

impl quick_cache::Weighter<u64, u32> for Bytes {
    fn weight(&self, _: &u64, v: &u32) -> u64 {
        u64::from(*v)
    }
}

/// quick_cache weighing each entry by its size, told to expect the entries the capacity
/// holds at the trace's mean size (`entries`).
pub fn quick_cache(trace: &[(u64, u32)], capacity: u64, entries: usize, threads: usize) -> Hits {
    let cache = quick_cache::sync::Cache::with_weighter(entries.max(1), capacity, Bytes);
    concurrently(trace, threads, |k, s| {
        let hit = cache.get(&k).is_some();
        if !hit {
            cache.insert(k, s);
        }
        hit
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_by_bytes_evicts_the_least_recent_until_the_newcomer_fits() {
        // 10 + 20 + 30 = 60 fit in 60; 40 more push out 10, 20 and 30 in that order until
        // 40 fits (30 alone is left out: 30 + 40 > 60).
        let t = [
            (1, 10),
            (2, 20),
            (3, 30),
            (1, 10),
            (4, 40),
            (1, 10),
            (3, 30),
        ];
        assert_eq!(lru(&t, 60), (2, 20), "1 hits twice; 3 was pushed out by 4");
        assert_eq!(
            lru(&[(1, 61), (1, 61)], 60),
            (0, 0),
            "heavier than the capacity"
        );
    }

    #[test]
    fn every_replay_counts_hits_and_their_bytes() {
        let t: Vec<(u64, u32)> = (0..200u64).map(|i| (i % 4, 10 + (i % 4) as u32)).collect();
        // Four keys of 10-13 bytes in a 100-byte cache: all but the first access of each hit.
        let all = (196, (0..200u64).skip(4).map(|i| 10 + i % 4).sum::<u64>());
        assert_eq!(lru(&t, 100), all);
        assert_eq!(runcache(&t, 100, 1, 0), all);
        assert_eq!(moka(&t, 100, 1), all);
        assert_eq!(quick_cache(&t, 100, 8, 1), all);
        assert_eq!(runcache_bench::gdsf::replay(&t, 100), all);
        assert_eq!(
            runcache(&t, 100, 2, 1),
            all,
            "threads join one build per key"
        );
    }
}
