//! Many caches and many sessions: what a thread pays as the caches it has used, and a grouped
//! cache's sessions, accumulate.
//!
//! `cargo run --release -p runcache-bench --bin many [-- --quick] [--caches]` prints three tables
//! (`--caches`: the first two only):
//! - hits from one thread, round-robin over N live caches (one key each), runcache against
//!   quick_cache, at N = 10, 100, 1,000 and 10,000;
//! - building a cache and its first `put`, with N caches alive on the thread (each used);
//! - a grouped cache: the cost of a `set` that creates a session, after 10 … 100,000 sessions,
//!   and the heap bytes per group and per entry, beside the core cache's per entry (a counting
//!   allocator: allocation sizes, not the allocator's own overhead).
//!
//! Each figure is the best of a few rounds (the minimum is the least noisy estimate of a
//! cost that only grows under interference). Timings are for comparison within one run.

use quick_cache::sync::Cache as QuickCache;
use runcache::grouped::GroupedCache;
use runcache::Cache;
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const ROUNDS: usize = 5;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `--caches`: only the two tables of many caches (the grouped ones take minutes on an
    // engine whose sessions each build a cache).
    let caches_only = std::env::args().any(|a| a == "--caches");
    let counts: &[usize] = if quick {
        &[10, 1_000, 10_000]
    } else {
        &[10, 100, 1_000, 10_000]
    };
    // First, while the heap has nothing freed to reuse, so the bytes counted are what is made.
    if !caches_only {
        footprint();
    }
    hits_round_robin(counts);
    building(counts);
    if caches_only {
        return;
    }
    sessions(if quick {
        &[10, 10_000, 100_000]
    } else {
        &[10, 1_000, 10_000, 100_000]
    });
}

/// The best of `ROUNDS` runs of `f`, in nanoseconds per operation of `ops`.
fn best_ns(ops: usize, mut f: impl FnMut()) -> f64 {
    (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64 / ops as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// The best of `ROUNDS` times to make `made` things with `make`, in nanoseconds per thing;
/// each round's things are dropped after its clock stops, so every round starts with the
/// same things alive.
fn best_make_ns<T>(made: usize, make: impl Fn() -> T) -> f64 {
    (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            let fresh: Vec<T> = (0..made).map(|_| make()).collect();
            let ns = t.elapsed().as_nanos() as f64 / made as f64;
            drop(black_box(fresh));
            ns
        })
        .fold(f64::INFINITY, f64::min)
}

/// Nanoseconds per hit of `get(cache, i)` over `caches` in turn, `i` each one's key.
fn round_robin<C>(caches: &[C], get: impl Fn(&C, u64)) -> f64 {
    let passes = (200_000 / caches.len()).max(2);
    best_ns(passes * caches.len(), || {
        for _ in 0..passes {
            for (i, c) in caches.iter().enumerate() {
                get(c, i as u64);
            }
        }
    })
}

fn hits_round_robin(counts: &[usize]) {
    println!("## Hits from one thread, round-robin over N caches\n");
    println!("| caches | runcache ns/hit | quick_cache ns/hit | runcache / quick_cache |");
    println!("|---:|---:|---:|---:|");
    for &n in counts {
        let ours: Vec<Cache<u64, u64>> = (0..n).map(|_| Cache::new(16)).collect();
        let theirs: Vec<QuickCache<u64, u64>> = (0..n).map(|_| QuickCache::new(16)).collect();
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            a.put(i as u64, i as u64).unwrap();
            b.insert(i as u64, i as u64);
        }
        let r = round_robin(&ours, |c, k| {
            black_box(c.get(&k));
        });
        let q = round_robin(&theirs, |c, k| {
            black_box(c.get(&k));
        });
        println!("| {n} | {r:.1} | {q:.1} | {:.2} |", r / q);
    }
    println!();
}

fn building(counts: &[usize]) {
    println!("## Building a cache and its first put, with N caches alive and used\n");
    println!("| live caches | runcache µs | quick_cache µs |");
    println!("|---:|---:|---:|");
    for &n in counts {
        let ours: Vec<Cache<u64, u64>> = (0..n).map(|_| Cache::new(16)).collect();
        let theirs: Vec<QuickCache<u64, u64>> = (0..n).map(|_| QuickCache::new(16)).collect();
        for c in &ours {
            c.put(0, 0).unwrap();
        }
        for c in &theirs {
            c.insert(0, 0);
        }
        let r = best_make_ns(200, || {
            let c = Cache::<u64, u64>::new(16);
            c.put(1, 1).unwrap();
            c
        });
        let q = best_make_ns(200, || {
            let c = QuickCache::<u64, u64>::new(16);
            c.insert(1, 1);
            c
        });
        println!("| {n} | {:.2} | {:.2} |", r / 1e3, q / 1e3);
        drop((ours, theirs));
    }
    println!();
}

/// The system allocator, counting the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed to `System` unchanged; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated and not yet freed, by this process.
fn resident() -> u64 {
    LIVE.load(Ordering::Relaxed)
}

fn sessions(counts: &[usize]) {
    println!("## A grouped cache: a set that creates a session, after N sessions\n");
    println!("| sessions | µs per new session | fill of N sessions, ms |");
    println!("|---:|---:|---:|");
    for &n in counts {
        let g = GroupedCache::<u64, u64, String, u64>::new(0);
        let name = "w".to_string();
        let t = Instant::now();
        for s in 0..n as u64 {
            g.set(&s, &0, &name, s);
        }
        let fill = t.elapsed().as_secs_f64() * 1e3;
        let extra = 200u64;
        let mut next = n as u64;
        let ns = best_ns(extra as usize, || {
            for _ in 0..extra {
                g.set(&next, &0, &name, next);
                next += 1;
            }
        });
        println!("| {n} | {:.2} | {fill:.1} |", ns / 1e3);
    }
    println!();
}

fn footprint() {
    let n = 100_000u64;
    let before = resident();
    let g = GroupedCache::<u64, u64, u64, u64>::new(0);
    for s in 0..n {
        g.set(&s, &0, &0, s);
    }
    let per_group = (resident() - before) as f64 / n as f64;
    let before = resident();
    let one = GroupedCache::<u64, u64, u64, u64>::new(0);
    for k in 0..n {
        one.set(&0, &0, &k, k);
    }
    let per_grouped_entry = (resident() - before) as f64 / n as f64;
    let before = resident();
    let c = Cache::<u64, u64>::new(u64::MAX);
    for k in 0..n {
        c.put(k, k).unwrap();
    }
    let per_entry = (resident() - before) as f64 / n as f64;
    println!("## Heap memory per group and per entry (100,000 of each, bytes allocated)\n");
    println!("| what | bytes |");
    println!("|---|---:|");
    println!("| a group (a session with one shape and one entry) | {per_group:.0} |");
    println!("| an entry of one group | {per_grouped_entry:.0} |");
    println!("| an entry of the core cache | {per_entry:.0} |");
    black_box((g, one, c));
    println!();
}
