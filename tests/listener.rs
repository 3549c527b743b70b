//! A listener that panics: for every cause, the operation that removed the value finishes
//! with the cache consistent (every budget at the cached entries' weight), the panic then
//! reaches that operation's caller, and the listener goes on hearing later removals.

mod common;

use common::{silence_planned_panics, PLANNED};
use runcache::{Cache, RemovalCause};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// What the listener heard, in order.
type Heard = Arc<Mutex<Vec<(u64, RemovalCause)>>>;

/// A cache of `capacity` whose weigher reads the weight from the value, and whose listener
/// records each removal, then panics for every key in `panics_on`.
fn panicking(capacity: u64, panics_on: &'static [u64]) -> (Cache<u64, u64>, Heard) {
    silence_planned_panics();
    let heard = Heard::default();
    let sink = heard.clone();
    let cache = Cache::builder()
        .capacity(capacity)
        .weigher(|_, v| *v)
        .on_evict(move |k: &u64, _, cause| {
            sink.lock().unwrap().push((*k, cause));
            if panics_on.contains(k) {
                std::panic::panic_any(PLANNED);
            }
        })
        .build()
        .unwrap();
    (cache, heard)
}

/// Runs `op`, which must panic with the listener's payload.
fn panics_with_the_listener<R>(op: impl FnOnce() -> R) {
    let err = catch_unwind(AssertUnwindSafe(op))
        .err()
        .expect("the listener's panic reaches the caller");
    assert_eq!(err.downcast_ref::<&str>(), Some(&PLANNED));
}

/// The cache holds exactly what its entries weigh, and its structure is sound.
fn consistent(cache: &Cache<u64, u64>) {
    let cached: u64 = cache.pin().iter().map(|(_, v)| *v).sum();
    assert_eq!(
        cache.weighted_size(),
        cached,
        "the budget matches the entries"
    );
    cache.__validate().unwrap();
}

#[test]
fn an_eviction_whose_listener_panics_still_makes_room_and_leaks_nothing() {
    // The reproducer: capacity 1, the second put evicts the first.
    let (cache, heard) = panicking(1, &[1]);
    cache.put(1, 1).unwrap();
    panics_with_the_listener(|| cache.put(2, 1));
    assert_eq!(
        cache.get(&2).as_deref(),
        Some(&1),
        "the newcomer was cached"
    );
    assert_eq!((cache.len(), cache.weighted_size()), (1, 1));
    consistent(&cache);
    // The listener is still installed and hears the next eviction.
    cache.put(3, 1).unwrap();
    assert_eq!(
        *heard.lock().unwrap(),
        [(1, RemovalCause::Capacity), (2, RemovalCause::Capacity)]
    );
    cache.set_capacity(0).unwrap();
    assert_eq!((cache.len(), cache.weighted_size()), (0, 0));
}

#[test]
fn a_byte_budget_gets_every_byte_back_after_panicking_evictions() {
    // Four panics in a 4 KiB cache used to leave all 4096 bytes reserved with nothing cached.
    let (cache, _) = panicking(4096, &[0, 1, 2, 3]);
    for k in 0..4 {
        cache.put(k, 1024).unwrap();
    }
    for k in 10..14 {
        panics_with_the_listener(|| cache.put(k, 1024));
        consistent(&cache);
    }
    assert_eq!(cache.weighted_size(), 4096);
    assert!((10..14).all(|k| cache.contains_key(&k)));
    cache.clear();
    assert_eq!(cache.weighted_size(), 0);
    for k in 20..24 {
        cache.put(k, 1024).unwrap();
    }
    assert_eq!(cache.len(), 4, "the whole budget is usable again");
}

#[test]
fn a_build_that_evicts_through_a_panicking_listener_still_caches_its_value() {
    let (cache, heard) = panicking(2, &[1]);
    cache.put(1, 1).unwrap();
    cache.put(2, 1).unwrap();
    panics_with_the_listener(|| cache.get_or_insert_with(3, || 2));
    assert_eq!(cache.get(&3).as_deref(), Some(&2));
    consistent(&cache);
    assert!(heard.lock().unwrap().contains(&(1, RemovalCause::Capacity)));
}

#[test]
fn an_async_build_that_evicts_through_a_panicking_listener_still_caches_its_value() {
    let (cache, _) = panicking(1, &[1]);
    cache.put(1, 1).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    panics_with_the_listener(|| rt.block_on(cache.get_or_insert_with_async(2, async { 1 })));
    assert_eq!(cache.get(&2).as_deref(), Some(&1));
    consistent(&cache);
}

#[test]
fn a_replacement_removal_or_retain_whose_listener_panics_completes() {
    let (cache, heard) = panicking(100, &[1, 2, 3]);
    for k in 1..=5 {
        cache.put(k, 10).unwrap();
    }
    // Replaced: the new value is in, with its weight.
    panics_with_the_listener(|| cache.put(1, 20));
    assert_eq!(cache.get(&1).as_deref(), Some(&20));
    consistent(&cache);
    // Removed, by `remove` and by `invalidate`.
    panics_with_the_listener(|| cache.remove(&2));
    panics_with_the_listener(|| cache.invalidate(&3));
    assert!(!cache.contains_key(&2) && !cache.contains_key(&3));
    consistent(&cache);
    // Removed by `retain`: every refused entry goes, though the first removal panicked.
    cache.put(2, 10).unwrap();
    cache.put(3, 10).unwrap();
    panics_with_the_listener(|| cache.retain(|k, _| *k > 3));
    assert_eq!(cache.len(), 2);
    consistent(&cache);
    let heard = heard.lock().unwrap();
    assert_eq!(heard[0], (1, RemovalCause::Replaced));
    assert_eq!(
        heard[1..3],
        [(2, RemovalCause::Removed), (3, RemovalCause::Removed)]
    );
    assert_eq!(heard.len(), 6, "retain told the listener of all three");
}

#[test]
fn a_clear_or_shrink_whose_listener_panics_removes_everything_it_must() {
    let (cache, heard) = panicking(100, &[1, 2, 3, 4, 5, 6, 7, 8]);
    for k in 1..=8 {
        cache.put(k, 10).unwrap();
    }
    // A shrink, in policy order and in rank order: the capacity is reached.
    panics_with_the_listener(|| cache.set_capacity(50));
    assert!(cache.weighted_size() <= 50);
    assert_eq!(cache.capacity(), 50);
    consistent(&cache);
    panics_with_the_listener(|| cache.set_capacity_by(20, |k, _| *k));
    assert_eq!((cache.capacity(), cache.weighted_size()), (20, 20));
    consistent(&cache);
    // `clear` removes every entry, though each removal panicked.
    panics_with_the_listener(|| cache.clear());
    assert_eq!((cache.len(), cache.weighted_size()), (0, 0));
    assert_eq!(heard.lock().unwrap().len(), 8);
    assert!(heard
        .lock()
        .unwrap()
        .iter()
        .skip(6)
        .all(|(_, c)| *c == RemovalCause::Cleared));
}

#[test]
fn a_listener_that_panics_on_every_removal_of_a_long_run_leaks_nothing() {
    // Every key panics: thousands of evictions from several threads, each panic caught by
    // its caller, and the budget still matches the cache at the end.
    silence_planned_panics();
    let cache: Cache<u64, u64> = Cache::builder()
        .capacity(64)
        .on_evict(|_, _, _| std::panic::panic_any(PLANNED))
        .build()
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let cache = &cache;
            s.spawn(move || {
                for i in 0..2_000 {
                    let _ = catch_unwind(AssertUnwindSafe(|| {
                        cache.get_or_insert_with(t * 10_000 + i % 500, || i)
                    }));
                }
            });
        }
    });
    assert_eq!(cache.weighted_size(), cache.len() as u64);
    assert!(cache.len() <= 64 && cache.stats().evictions > 0);
    cache.__validate().unwrap();
    panics_with_the_listener(|| cache.set_capacity(0));
    assert_eq!((cache.len(), cache.weighted_size()), (0, 0));
}

#[test]
fn a_cache_can_be_used_inside_catch_unwind_without_asserting_unwind_safety() {
    // Every layer too: each holds its state in core caches and atomics.
    fn unwind_safe<T: std::panic::RefUnwindSafe + std::panic::UnwindSafe>(_: &T) {}
    let (cache, _) = panicking(10, &[]);
    unwind_safe(&cache);
    unwind_safe(&runcache::grouped::GroupedCache::<u32, u32, u32, u32>::new(
        0,
    ));
    unwind_safe(&runcache::constant::ConstantCache::new(
        runcache::DeviceKind::Cpu,
    ));
    let built = catch_unwind(|| cache.get_or_insert_with(1, || 1));
    assert_eq!(built.as_deref().ok(), Some(&1));
    let failed = catch_unwind(|| cache.get_or_insert_with(2, || std::panic::panic_any(PLANNED)));
    assert!(failed.is_err());
    assert!(!cache.contains_key(&2));
    consistent(&cache);
}
