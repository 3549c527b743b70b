//! Loom models of the whole cache: the table, the slot protocol, the budget and
//! crossbeam-epoch itself are explored together.
//!
//! ```text
//! RUSTFLAGS="--cfg runcache_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     CARGO_TARGET_DIR=target/loom cargo test --release -p runcache-loom-tests
//! ```
//!
//! Each model builds a fresh cache (and so a fresh epoch collector).
#![cfg(runcache_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use runcache::{Cache, CacheBuilder};
use std::hash::BuildHasherDefault;

/// loom replays each interleaving many times, so hashing must not be randomly seeded.
type Fixed = BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// The models check the table, slots and budget; none of them is about eviction, so they
/// reject when full (an evicting cache also runs crossbeam-queue's `SegQueue`, whose
/// internals would multiply the explored states).
fn builder<V: Send + Sync + 'static>() -> CacheBuilder<u32, V, Fixed> {
    Cache::<u32, V>::builder()
        .shards(1)
        .hasher(Fixed::default())
        .when_full(runcache::WhenFull::Reject)
}

fn cache(capacity: u64) -> Cache<u32, u64, Fixed> {
    builder()
        .capacity(capacity)
        .build()
        .expect("one shard is valid")
}

/// (a) Two threads and the main thread race `get_or_insert_with` on one key: one build, and
/// every caller gets the same `Arc`.
#[test]
fn racing_builders_build_once_and_share_the_value() {
    loom::model(|| {
        let c = Arc::new(cache(10));
        let builds = Arc::new(AtomicUsize::new(0));
        let spawn = |c: Arc<Cache<u32, u64, Fixed>>, builds: Arc<AtomicUsize>| {
            thread::spawn(move || {
                let v = c.get_or_insert_with(1, || {
                    builds.fetch_add(1, Ordering::Relaxed);
                    7
                });
                runcache::__loom_thread_exit();
                v
            })
        };
        let t1 = spawn(c.clone(), builds.clone());
        let mine = c.get_or_insert_with(1, || {
            builds.fetch_add(1, Ordering::Relaxed);
            7
        });
        let theirs = t1.join().unwrap();
        assert_eq!(
            builds.load(Ordering::Relaxed),
            1,
            "the builder ran more than once"
        );
        assert!(
            runcache::Handle::ptr_eq(&mine, &theirs),
            "callers got different values"
        );
        assert_eq!(*mine, 7);
        assert_eq!(c.len(), 1);
    });
}

/// (b) The first builder fails: the waiter gets that error or builds again itself; nobody
/// hangs (loom reports a deadlock if a parked thread is never woken).
#[test]
fn a_failed_build_never_strands_a_waiter() {
    loom::model(|| {
        let c = Arc::new(cache(10));
        let c2 = c.clone();
        let t = thread::spawn(move || {
            let r = c2.try_get_or_insert_with(1, || Err::<u64, u8>(9));
            runcache::__loom_thread_exit();
            r
        });
        let mine = c.try_get_or_insert_with(1, || Ok::<u64, u8>(5));
        let theirs = t.join().unwrap();
        match (&mine, &theirs) {
            // The failing builder ran first and this caller waited on its attempt.
            (Err(e), Err(f)) => assert_eq!((e.failed(), f.failed()), (Some(&9), Some(&9))),
            // This caller built (first, or after the failed attempt ended).
            (Ok(v), Err(f)) => assert_eq!((**v, f.failed()), (5, Some(&9))),
            // The failing caller arrived after the value was cached.
            (Ok(v), Ok(w)) => assert_eq!((**v, **w), (5, 5)),
            (Err(_), Ok(_)) => panic!("a cached value cannot come from the failing builder"),
        }
        assert_eq!(c.contains_key(&1), mine.is_ok());
    });
}

/// (b) The first builder panics: the waiter takes the build over.
#[test]
fn a_panicking_build_hands_over_to_a_waiter() {
    // Every explored interleaving panics on purpose; keep the output readable.
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<&str>() != Some(&"builder panics") {
            quiet(info);
        }
    }));
    loom::model(|| {
        let c = Arc::new(cache(10));
        let c2 = c.clone();
        let t = thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                c2.get_or_insert_with(1, || panic!("builder panics"))
            }));
            runcache::__loom_thread_exit();
            r.is_err()
        });
        let v = c.get_or_insert_with(1, || 3);
        let panicked = t.join().unwrap();
        assert_eq!(*v, 3);
        assert_eq!(c.get(&1).as_deref(), Some(&3));
        // The panicking builder ran unless it found the value already cached.
        let _ = panicked;
    });
}

/// (c) Concurrent inserts near capacity: the weighted size never exceeds the capacity, and at
/// the end equals the weights of the entries that are live.
#[test]
fn concurrent_inserts_near_capacity_never_overshoot() {
    loom::model(|| {
        let c = Arc::new(
            builder::<u64>()
                .capacity(3)
                .weigher(|_, v| *v)
                .build()
                .unwrap(),
        );
        let threads: Vec<_> = [(1u32, 2u64), (2, 2)]
            .into_iter()
            .map(|(k, w)| {
                let c = c.clone();
                thread::spawn(move || {
                    let ok = c.insert(k, w).is_ok();
                    let (size, cap) = c.weighted_size_and_capacity();
                    assert!(size <= cap, "size {size} above capacity {cap}");
                    runcache::__loom_thread_exit();
                    ok
                })
            })
            .collect();
        let ok: Vec<bool> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            ok.iter().filter(|b| **b).count(),
            1,
            "exactly one weight-2 entry fits in 3"
        );
        let live: u64 = [1u32, 2].iter().filter_map(|k| c.get(k)).map(|v| *v).sum();
        assert_eq!(c.weighted_size(), live);
        assert_eq!(live, 2);
    });
}

/// (c) A shrink races an insert: the size never passes the capacity in force, and the shrink
/// ends at or below its target.
#[test]
fn a_shrink_racing_an_insert_keeps_the_budget() {
    loom::model(|| {
        let c = Arc::new(cache(2));
        c.insert(1, 1).unwrap();
        let c2 = c.clone();
        let t = thread::spawn(move || {
            let _ = c2.insert(2, 2);
            let (size, cap) = c2.weighted_size_and_capacity();
            assert!(size <= cap);
            runcache::__loom_thread_exit();
        });
        c.set_capacity(1).unwrap();
        t.join().unwrap();
        let (size, cap) = c.weighted_size_and_capacity();
        assert!(size <= cap && cap == 1, "size {size}, capacity {cap}");
        assert_eq!(c.len() as u64, size);
    });
}

/// (c') A grow races a shrink of a full cache. The budget's two words (the room and the
/// capacity) move by the same amount in every change, the room first in a shrink and the
/// capacity first in a grow (B2): every reading shows the size within the capacity, and once
/// both are done the capacity is one of the targets and the size is what the cache holds,
/// whichever change lost a compare-and-swap to the other and gave its room back.
#[test]
fn a_grow_racing_a_shrink_keeps_the_budget() {
    loom::model(|| {
        let c = Arc::new(cache(2));
        c.insert(1, 1).unwrap();
        c.insert(2, 2).unwrap();
        let grower = c.clone();
        let g = thread::spawn(move || {
            grower.set_capacity(3).unwrap();
            let (size, cap) = grower.weighted_size_and_capacity();
            assert!(size <= cap, "size {size}, capacity {cap}");
            runcache::__loom_thread_exit();
        });
        c.set_capacity(1).unwrap();
        let (size, cap) = c.weighted_size_and_capacity();
        assert!(size <= cap, "size {size}, capacity {cap}");
        g.join().unwrap();
        let (size, cap) = c.weighted_size_and_capacity();
        assert!(
            cap == 1 || cap == 3,
            "the capacity {cap} is one of the targets"
        );
        assert!(size <= cap, "size {size}, capacity {cap}");
        assert_eq!(c.len() as u64, size, "the size is what the cache holds");
        if cap == 3 {
            assert!(
                c.insert(3, 3).is_ok(),
                "a grown cache has room for one more"
            );
        }
    });
}

/// A value whose drops are counted with a loom atomic.
struct Tracked(Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// (d) Remove while another thread holds the value: the destructor runs exactly once, after
/// the last holder.
#[test]
fn a_removed_value_drops_once_after_its_last_holder() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let c = Arc::new(builder::<Tracked>().build().unwrap());
        assert!(c.insert(1, Tracked(drops.clone())).is_ok());
        let (c2, d2) = (c.clone(), drops.clone());
        let reader = thread::spawn(move || {
            if let Some(v) = c2.get(&1) {
                assert_eq!(d2.load(Ordering::Relaxed), 0, "dropped while held");
                drop(v);
            }
            runcache::__loom_thread_exit();
        });
        let removed = c.remove(&1);
        assert!(removed.is_some());
        drop(removed);
        reader.join().unwrap();
        drop(c);
        assert_eq!(
            drops.load(Ordering::Relaxed),
            1,
            "the destructor must run exactly once"
        );
    });
}

/// A cache that checks, when the last handle drops it, that every value it owned is gone by
/// the time its `drop` returns.
struct CheckedDrop {
    cache: Option<Cache<u32, Tracked, Fixed>>,
    drops: Arc<AtomicUsize>,
    values: usize,
}

impl Drop for CheckedDrop {
    fn drop(&mut self) {
        drop(self.cache.take());
        assert_eq!(
            self.drops.load(Ordering::Relaxed),
            self.values,
            "every value is dropped before the cache's drop returns"
        );
    }
}

/// (d') Dropping the cache races the last retirement of a thread that then exits: the
/// thread removes a value and lets go of the cache, the main thread lets go of its own
/// handle, and whichever is last drops the cache. Everything (the thread's batch, the ready
/// stack, the collector's queue) must be dropped before that `drop` returns, whether the
/// thread's exit releases its registration before, during or after it; nothing twice.
#[test]
fn dropping_the_cache_races_a_threads_last_retirement_and_exit() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let cache = builder::<Tracked>().build().unwrap();
        assert!(cache.insert(1, Tracked(drops.clone())).is_ok());
        assert!(cache.insert(2, Tracked(drops.clone())).is_ok());
        let c = Arc::new(CheckedDrop {
            cache: Some(cache),
            drops: drops.clone(),
            values: 2,
        });
        let c2 = c.clone();
        let worker = thread::spawn(move || {
            let cache = c2.cache.as_ref().expect("not dropped while held");
            drop(cache.remove(&1));
            drop(c2);
            runcache::__loom_thread_exit();
        });
        drop(c);
        worker.join().unwrap();
        assert_eq!(drops.load(Ordering::Relaxed), 2, "each value drops once");
    });
}

/// (e) A `clear` racing a build: the remover may empty the cell after the builder published
/// its value but before it finished the slot. Exactly one of them must then unlink the node —
/// it is neither marked while still building (a debug assertion) nor left dead and linked.
#[test]
fn a_clear_racing_a_build_leaves_no_dead_node_behind() {
    loom::model(|| {
        let c = Arc::new(cache(4));
        let c2 = c.clone();
        let builder = thread::spawn(move || {
            let v = c2.get_or_insert_with(1, || 7);
            assert_eq!(*v, 7);
            runcache::__loom_thread_exit();
        });
        c.clear();
        builder.join().unwrap();
        assert!(c.len() <= 1);
        c.__validate().unwrap();
        assert_eq!(c.weighted_size(), c.len() as u64);
    });
}

/// A cache whose entries weigh their value, holding key 1 with value (and weight) 2.
fn weighing_one_entry() -> Arc<Cache<u32, u64, Fixed>> {
    let c = builder::<u64>()
        .capacity(10)
        .weigher(|_, v| *v)
        .build()
        .unwrap();
    c.insert(1, 2).unwrap();
    Arc::new(c)
}

/// A replacement races a removal of the same key. Only two orders are possible: replace then
/// remove (the removal gets the new value) or remove then insert (the insert finds nothing).
/// The old value goes to exactly one of them and the weights end exact. A removal that meets
/// the forward the replacement left follows it.
#[test]
fn a_replacement_racing_a_removal_hands_each_value_to_one_caller() {
    loom::model(|| {
        let c = weighing_one_entry();
        let c2 = c.clone();
        let remover = thread::spawn(move || {
            let removed = c2.remove(&1).map(|v| *v);
            runcache::__loom_thread_exit();
            removed
        });
        let replaced = c.insert(1, 3).unwrap().map(|v| *v);
        let removed = remover.join().unwrap();
        let left = c.get(&1).map(|v| *v);
        match (replaced, removed) {
            (Some(2), Some(3)) => assert_eq!(left, None),
            (None, Some(2)) => assert_eq!(left, Some(3)),
            other => panic!("not a linearizable outcome: (replaced, removed) = {other:?}"),
        }
        assert_eq!(c.weighted_size(), left.unwrap_or(0));
        c.__validate().unwrap();
    });
}

/// `retain` refusing a value races the replacement of that value: the new value, which the
/// predicate never saw (or saw and accepted), survives. Either `retain` took the old value
/// before the replacement (which then inserts afresh) or it finds the entry replaced and
/// keeps it; the weights end exact either way.
#[test]
fn a_retain_racing_a_replacement_keeps_the_new_value() {
    loom::model(|| {
        let c = weighing_one_entry();
        let c2 = c.clone();
        let replacer = thread::spawn(move || {
            let old = c2.insert(1, 3).unwrap().map(|v| *v);
            runcache::__loom_thread_exit();
            old
        });
        let removed = c.retain(|_, v| *v != 2);
        let old = replacer.join().unwrap();
        match (removed, old) {
            (1, None) | (0, Some(2)) => {}
            other => panic!("not a linearizable outcome: (removed, replaced) = {other:?}"),
        }
        assert_eq!(c.get(&1).as_deref(), Some(&3));
        assert_eq!(c.weighted_size(), 3);
        c.__validate().unwrap();
    });
}
