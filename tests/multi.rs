//! The multi-cache: one evicting cache per key type, shared by every thread.

use runcache::multi::MultiCache;
use runcache::Lookup;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ConvKey(u32);
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct MatMulKey(u32);

#[test]
fn each_key_type_has_its_own_cache() {
    let c = MultiCache::new(10);
    let (a, how) = c.get_or_create(&ConvKey(1), |k| format!("conv {}", k.0));
    assert_eq!((a.as_str(), how), ("conv 1", Lookup::Miss));
    let (b, how) = c.get_or_create(&MatMulKey(1), |k| format!("matmul {}", k.0));
    assert_eq!((b.as_str(), how), ("matmul 1", Lookup::Miss));
    let (a2, how) = c.get_or_create(&ConvKey(1), |_| -> String { unreachable!() });
    assert!(runcache::Handle::ptr_eq(&a, &a2) && how == Lookup::Hit);
    assert_eq!(c.type_count(), 2);
    let s = c.stats::<ConvKey, String>();
    // One miss that built, one hit: each call counted once.
    assert_eq!((s.builds, s.misses, s.hits), (1, 1, 1));
    assert_eq!(
        c.remove::<ConvKey, String>(&ConvKey(1)).as_deref(),
        Some(&"conv 1".to_string())
    );
}

#[test]
fn each_per_type_cache_evicts_at_the_capacity() {
    let c = MultiCache::new(16);
    for i in 0..200 {
        c.get_or_create(&ConvKey(i), |k| k.0);
    }
    let s = c.stats::<ConvKey, u32>();
    assert_eq!(s.builds, 200);
    assert_eq!(s.evictions, 200 - 16);
    assert_eq!(MultiCache::default().capacity(), 5000);
}

#[test]
fn capacity_zero_builds_every_time_and_reports_a_miss() {
    let c = MultiCache::new(0);
    let builds = AtomicUsize::new(0);
    for _ in 0..3 {
        let (v, how) = c.get_or_create(&ConvKey(7), |k| {
            builds.fetch_add(1, Ordering::SeqCst);
            k.0
        });
        assert_eq!((*v, how), (7, Lookup::Miss));
    }
    assert_eq!(builds.load(Ordering::SeqCst), 3);
}

#[test]
fn a_builder_without_a_value_caches_nothing_and_is_asked_again() {
    let c = MultiCache::new(10);
    assert!(c.get_or_create_opt(&ConvKey(1), |_| None::<u32>).is_none());
    let e = c
        .try_get_or_create(&ConvKey(1), |_| Err::<u32, _>("no kernel"))
        .unwrap_err();
    assert_eq!(e.failed(), Some(&"no kernel"));
    let (v, how) = c.get_or_create_opt(&ConvKey(1), |k| Some(k.0 + 1)).unwrap();
    assert_eq!((*v, how), (2, Lookup::Miss));
    let (v, how) = c
        .try_get_or_create(&ConvKey(1), |_| Err::<u32, &str>("unused"))
        .unwrap();
    assert_eq!((*v, how), (2, Lookup::Hit));
}

#[test]
fn one_cache_for_all_threads_builds_each_key_once() {
    let c = Arc::new(MultiCache::new(1000));
    let builds = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (c, builds, barrier) = (c.clone(), builds.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for i in 0..100 {
                    c.get_or_create(&MatMulKey(i), |k| {
                        builds.fetch_add(1, Ordering::SeqCst);
                        thread::yield_now();
                        k.0 * 2
                    });
                    c.get_or_create(&ConvKey(i), |k| k.0);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        builds.load(Ordering::SeqCst),
        100,
        "each key built once across 4 threads"
    );
    assert_eq!(c.type_count(), 2, "each per-type cache created once");
}

#[test]
fn clear_drops_every_value_but_held_ones_survive() {
    let c = MultiCache::new(10);
    let (held, _) = c.get_or_create(&ConvKey(1), |_| vec![1u8; 16]);
    c.clear();
    assert_eq!(c.type_count(), 1, "the per-type cache stays, emptied");
    assert_eq!(held.len(), 16);
    let (_, how) = c.get_or_create(&ConvKey(1), |_| vec![2u8; 16]);
    assert_eq!(how, Lookup::Miss);
}
