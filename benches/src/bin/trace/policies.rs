//! The policies a trace replays against. Each returns the number of hits of a trace at a
//! capacity in entries.

use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

pub fn lru(trace: &[u64], capacity: usize) -> u64 {
    let Some(cap) = std::num::NonZeroUsize::new(capacity) else {
        return 0;
    };
    let mut cache = lru::LruCache::new(cap);
    let mut hits = 0;
    for &k in trace {
        if cache.get(&k).is_some() {
            hits += 1;
        } else {
            cache.put(k, ());
        }
    }
    hits
}

/// Bélády's optimum: on a miss with a full cache, evict the key whose next use is farthest.
/// Exact; offline (it reads the whole trace first).
pub fn belady(trace: &[u64], capacity: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    const NEVER: usize = usize::MAX;
    // next[i]: the index of the next access to trace[i] after i.
    let mut next = vec![NEVER; trace.len()];
    let mut last: HashMap<u64, usize> = HashMap::with_capacity(trace.len() / 4);
    for (i, &k) in trace.iter().enumerate().rev() {
        next[i] = last.insert(k, i).unwrap_or(NEVER);
    }
    // The cache maps key -> its next use; the heap holds (next use, key), lazily cleaned.
    let mut cached: HashMap<u64, usize> = HashMap::with_capacity(capacity * 2);
    let mut heap: BinaryHeap<(usize, u64)> = BinaryHeap::with_capacity(capacity * 2);
    let mut hits = 0;
    for (i, &k) in trace.iter().enumerate() {
        if cached.contains_key(&k) {
            hits += 1;
        } else if cached.len() == capacity {
            loop {
                let (when, victim) = heap.pop().expect("a full cache has heap entries");
                if cached.get(&victim) == Some(&when) {
                    cached.remove(&victim);
                    break;
                }
            }
        }
        cached.insert(k, next[i]);
        heap.push((next[i], k));
    }
    hits
}

/// Replays `trace` on `threads` threads against one cache, keeping the trace's order as far
/// as concurrency allows: each thread claims the next access from a shared cursor, so
/// accesses run at most about `threads` places out of order. `access` returns whether the
/// access hit.
///
/// Coarser hand-outs reorder the trace, and the reordering, not the concurrency, then moves
/// the hit ratio: with 64-access chunks, OLTP at 0.1% on 2 threads lost 0.73 points for
/// runcache even with a mutex around every access (no concurrency in the cache at all), and
/// 0.17 with one access at a time. (Handing each thread every T-th access lets one thread
/// run ahead, which reorders it further.)
pub fn concurrently(trace: &[u64], threads: usize, access: impl Fn(u64) -> bool + Sync) -> u64 {
    const CHUNK: usize = 1;
    let hits = AtomicU64::new(0);
    let cursor = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (hits, access, cursor) = (&hits, &access, &cursor);
            s.spawn(move || {
                let mut mine = 0;
                loop {
                    let start = cursor.fetch_add(CHUNK, Ordering::Relaxed);
                    let Some(chunk) = trace.get(start..(start + CHUNK).min(trace.len())) else {
                        break;
                    };
                    if chunk.is_empty() {
                        break;
                    }
                    for &k in chunk {
                        mine += u64::from(access(k));
                    }
                }
                hits.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    hits.into_inner()
}

/// Replays against a shared cache: look up, and insert on a miss.
pub fn get_or_insert<C: Sync>(
    trace: &[u64],
    threads: usize,
    cache: &C,
    get: impl Fn(&C, u64) -> bool + Sync,
    insert: impl Fn(&C, u64) + Sync,
) -> u64 {
    concurrently(trace, threads, |k| {
        let hit = get(cache, k);
        if !hit {
            insert(cache, k);
        }
        hit
    })
}

/// runcache by count, its hasher seeded with `seed` (the default hasher is seeded at random:
/// the suite replays several seeds to see what the seed alone moves).
///
/// Each access goes through `get_or_insert_with`, as a runtime builds its values; it hits
/// when its builder does not run. On one thread that is a look-up and an insert on a miss.
/// On several, two threads that miss one key join one build; with two inserts, the second
/// would replace the first one's entry and lose the hit that entry would have had (web07 at
/// 1% to 10% of its keys lost 0.6 to 0.8 points from one thread to four that way, 0.03 to
/// 0.16 through the single-flight lookup, `docs/EXPERIMENTS.md`).
pub fn runcache(trace: &[u64], capacity: usize, threads: usize, seed: u64) -> u64 {
    let cache = seeded(capacity, seed);
    concurrently(trace, threads, |k| {
        let mut built = false;
        let _ = cache.get_or_insert_with(k, || built = true);
        !built
    })
}

/// The policy's tuning values `--tune` set, once, before any replay; the defaults if none.
pub static TUNING: std::sync::OnceLock<&'static runcache::Tuning> = std::sync::OnceLock::new();

/// `builder` tuned by the `--tune` values, if any.
pub fn tuned<K, V, S>(builder: runcache::CacheBuilder<K, V, S>) -> runcache::CacheBuilder<K, V, S> {
    match TUNING.get() {
        Some(tuning) => builder.tuning(tuning),
        None => builder,
    }
}

/// A runcache cache of `capacity` entries by count, its hasher seeded by `seed`: the `seed`th
/// of a random stream of 64-bit seeds, as the default hasher's random seeds are.
///
/// foldhash folds its seed into the key before multiplying, so seeds 0, 1, 2, ... flip only
/// the low bits of the keys: over a trace of dense integer keys they hash nearly the same
/// set of keys, and the cache's sketch, ghost and sweep see nearly the same collisions. The
/// seeds 0 to 4 spread zigzag at 10% of its keys by 0.25 points; the first five of this
/// stream spread it by 3.02 (5.70% to 8.72%, `docs/EXPERIMENTS.md`).
pub fn seeded(capacity: usize, seed: u64) -> runcache::Cache<u64, (), foldhash::fast::FixedState> {
    use rand::{Rng, SeedableRng};
    let spread = rand::rngs::StdRng::seed_from_u64(seed).random::<u64>();
    tuned(runcache::Cache::<u64, ()>::builder())
        .capacity(capacity as u64)
        .hasher(foldhash::fast::FixedState::with_seed(spread))
        .build()
        .expect("default shards and checked tuning are valid")
}

/// runcache by weight (every entry weighs 1) with no `expected_entry_weight`, one thread.
pub fn runcache_weighted(trace: &[u64], capacity: usize) -> u64 {
    let cache = tuned(runcache::Cache::<u64, ()>::builder())
        .capacity(capacity as u64)
        .weigher(|_, _| 1)
        .build()
        .expect("default shards and checked tuning are valid");
    get_or_insert(
        trace,
        1,
        &cache,
        |c, k| c.get(&k).is_some(),
        |c, k| {
            let _ = c.insert(k, ());
        },
    )
}

/// moka holding its capacity: its pending tasks run after every insert, so its evictions
/// (and the reads its policy learns from) are applied before the next access, as every other
/// policy here applies its own. moka as built applies them in batches, once 64 writes or
/// reads are pending ([`moka_buffered`]), and between batches it holds up to 64 entries over
/// its capacity: a 12-entry moka holds all 20 keys of a 20-key loop, and on the LIRS cpp
/// trace at 12 entries it hits 18.7 to 19.0% of the accesses against 15.0 to 15.3% holding
/// 12 (two runs; moka seeds its sketch at random). Hit ratios
/// compare caches of one size, so the comparisons use this one.
pub fn moka(trace: &[u64], capacity: usize, threads: usize) -> u64 {
    moka_replay(trace, capacity, threads, true)
}

/// moka as built: its maintenance applies evictions once 64 writes are pending, so it holds
/// more than its capacity between batches (see [`moka`]); the suite reports it beside the
/// comparisons, not in them.
pub fn moka_buffered(trace: &[u64], capacity: usize, threads: usize) -> u64 {
    moka_replay(trace, capacity, threads, false)
}

/// Replays against moka, running its pending tasks after every insert when `held`.
fn moka_replay(trace: &[u64], capacity: usize, threads: usize, held: bool) -> u64 {
    let cache = moka::sync::Cache::<u64, ()>::new(capacity as u64);
    get_or_insert(
        trace,
        threads,
        &cache,
        |c, k| c.get(&k).is_some(),
        |c, k| {
            c.insert(k, ());
            if held {
                c.run_pending_tasks();
            }
        },
    )
}

pub fn quick_cache(trace: &[u64], capacity: usize, threads: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let cache = quick_cache::sync::Cache::<u64, ()>::new(capacity);
    get_or_insert(
        trace,
        threads,
        &cache,
        |c, k| c.get(&k).is_some(),
        |c, k| c.insert(k, ()),
    )
}

/// TinyUFO (pingora's S3-FIFO with TinyLFU admission), one thread: its sketch counts
/// admissions only (a hit touches no counter), a small-queue leaver needs two hits to reach
/// the main queue, and no ghost remembers what left.
pub fn tinyufo(trace: &[u64], capacity: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let cache = tinyufo::TinyUfo::<u64, ()>::new(capacity, capacity);
    trace
        .iter()
        .map(|&k| {
            let hit = cache.get(&k).is_some();
            if !hit {
                cache.put(k, (), 1);
            }
            u64::from(hit)
        })
        .sum()
}
