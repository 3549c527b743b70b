//! Single flight: one build per key among concurrent callers, failed and panicking builds,
//! recursion, and what each call reports.

mod common;

use common::with_caches;
use runcache::{Cache, Handle, Lookup};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

#[test]
fn a_disabled_cache_still_shares_one_build_among_concurrent_callers() {
    // Capacity 0 caches nothing, but eight callers of one key at once still build it once:
    // the build goes on until the other seven are parked on it.
    let c = Arc::new(Cache::<u32, u64>::new(0));
    let builds = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (c, builds) = (c.clone(), builds.clone());
            thread::spawn(move || {
                let waiter = c.clone();
                c.get_or_insert_with(7, move || {
                    builds.fetch_add(1, Ordering::SeqCst);
                    // (A second build means no single flight: stop waiting, and fail below.)
                    while waiter.stats().waits < 7 && builds.load(Ordering::SeqCst) == 1 {
                        thread::yield_now();
                    }
                    42
                })
            })
        })
        .collect();
    let values: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    assert!(values.iter().all(|v| Handle::ptr_eq(v, &values[0])));
    assert!(c.is_empty() && c.weighted_size() == 0, "nothing was cached");
    let s = c.stats();
    assert_eq!((s.builds, s.waits, s.rejections), (1, 7, 1));
    c.__validate().unwrap();
    // Later calls build again: nothing is kept.
    assert_eq!(*c.get_or_insert_with(7, || 43), 43);
}

#[test]
fn single_flight_one_build_for_many_callers() {
    with_caches::<u32, u64>(10, |c| {
        let c = Arc::new(c);
        let builds = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (c, builds, barrier) = (c.clone(), builds.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    c.get_or_insert_with(7, || {
                        builds.fetch_add(1, Ordering::SeqCst);
                        thread::sleep(Duration::from_millis(30));
                        42
                    })
                })
            })
            .collect();
        let values: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert!(values.iter().all(|v| Handle::ptr_eq(v, &values[0])));
        let s = c.stats();
        assert_eq!(s.builds, 1);
        assert!(
            s.waits >= 1,
            "callers that arrived during the build waited: {s:?}"
        );
    });
}

#[test]
fn failed_build_reaches_waiters_and_caches_nothing() {
    let c = Arc::new(Cache::<u32, u64>::new(10));
    let barrier = Arc::new(Barrier::new(4));
    let builds = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (c, barrier, builds) = (c.clone(), barrier.clone(), builds.clone());
            thread::spawn(move || {
                barrier.wait();
                c.try_get_or_insert_with(1, || {
                    builds.fetch_add(1, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(50));
                    Err::<u64, String>("compile error".into())
                })
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results
        .iter()
        .all(|r| r.as_ref().unwrap_err().failed().map(String::as_str) == Some("compile error")));
    // Usually one build shared by all; a caller that arrived after the attempt ended builds
    // again, which is the documented behaviour, so only bound it.
    let n = builds.load(Ordering::SeqCst);
    assert!((1..=4).contains(&n));
    assert!(!c.contains_key(&1));
    assert_eq!(c.stats().build_failures, n as u64);
    // The next call builds again and can succeed.
    assert_eq!(
        *c.try_get_or_insert_with(1, || Ok::<_, String>(5)).unwrap(),
        5
    );
    assert_eq!(c.get(&1).as_deref(), Some(&5));
}

#[test]
fn panicking_builder_hands_the_build_to_a_waiter() {
    let c = Arc::new(Cache::<u32, u64>::new(10));
    let started = Arc::new(Barrier::new(2));
    let panicker = {
        let (c, started) = (c.clone(), started.clone());
        thread::spawn(move || {
            c.get_or_insert_with(9, || {
                started.wait();
                thread::sleep(Duration::from_millis(50));
                panic!("builder exploded");
            })
        })
    };
    started.wait();
    // This caller waits on the panicking attempt, then takes the build over.
    let v = c.get_or_insert_with(9, || 99);
    assert_eq!(*v, 99);
    let err = panicker.join().unwrap_err();
    assert_eq!(err.downcast_ref::<&str>(), Some(&"builder exploded"));
    assert_eq!(c.get(&9).as_deref(), Some(&99));
    assert_eq!(c.weighted_size(), 1);
}

#[test]
fn panicking_weigher_releases_the_slot_and_changes_nothing() {
    let c = Cache::<u32, u64>::builder()
        .capacity(100)
        .weigher(|_, v| if *v == 13 { panic!("bad weight") } else { *v })
        .build()
        .unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.get_or_insert_with(1, || 13)
    }));
    assert!(r.is_err());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.insert(2, 13)));
    assert!(r.is_err());
    assert_eq!((c.len(), c.weighted_size()), (0, 0));
    assert_eq!(*c.get_or_insert_with(1, || 5), 5);
    assert_eq!(c.weighted_size(), 5);
}

#[test]
fn same_key_recursion_panics_with_a_clear_message() {
    let c = Cache::<u32, u64>::new(10);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.get_or_insert_with(1, || *c.get_or_insert_with(1, || 2))
    }));
    let msg = r.unwrap_err();
    let msg = msg
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| msg.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(msg.contains("same key"), "message was: {msg}");
    // Nothing is stuck: the key builds normally afterwards.
    assert_eq!(*c.get_or_insert_with(1, || 3), 3);
    // A builder may use other keys of the same cache.
    assert_eq!(
        *c.get_or_insert_with(2, || *c.get_or_insert_with(3, || 4) + 1),
        5
    );
}

#[test]
fn get_or_create_reports_hit_and_miss() {
    let c = Cache::<String, usize>::new(10);
    let (v, how) = c.get_or_create(&"conv".to_string(), |k| k.len());
    assert_eq!((*v, how), (4, Lookup::Miss));
    let (v, how) = c.get_or_create(&"conv".to_string(), |_| unreachable!());
    assert_eq!((*v, how), (4, Lookup::Hit));
    // Each call counts once: the miss is not counted by a first look and again by the build.
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.builds), (1, 1, 1));
}

#[test]
fn get_or_insert_with_counts_each_call_once() {
    let c = Cache::<u64, u64>::new(10);
    assert_eq!(*c.get_or_insert_with(1, || 10), 10);
    assert_eq!(*c.get_or_insert_with(1, || unreachable!()), 10);
    assert_eq!(
        c.try_get_or_insert_with(2, || Err::<u64, _>("no"))
            .unwrap_err()
            .failed(),
        Some(&"no")
    );
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.builds, s.build_failures), (1, 2, 2, 1));
}
