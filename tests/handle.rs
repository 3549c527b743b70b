//! The counted handle a cache hands values out in: what it shares, how long the value lives,
//! and when the value's destructor runs.

use runcache::{Cache, Handle, RemovalCause, WhenFull};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Counts its drops.
struct Tracked {
    id: u64,
    drops: Arc<AtomicUsize>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

fn send_sync<T: Send + Sync + 'static>() {}

#[test]
fn a_handle_is_send_sync_and_static_when_its_value_is() {
    send_sync::<Handle<u64>>();
    send_sync::<Handle<String>>();
    send_sync::<runcache::WeakHandle<Vec<u8>>>();
}

#[test]
fn handles_of_one_entry_share_one_value() {
    let cache: Cache<u32, String> = Cache::new(10);
    cache.insert(1, "conv".to_string()).unwrap();
    let a = cache.get(&1).unwrap();
    let b = cache.get(&1).unwrap();
    assert!(Handle::ptr_eq(&a, &b));
    assert!(std::ptr::eq(&*a, &*b.clone()));
    assert_eq!(*a, "conv");
    // Comparisons, hashing and formatting go to the value.
    let other = Handle::new("conv".to_string());
    assert_eq!(a, other);
    assert!(!Handle::ptr_eq(&a, &other));
    assert_eq!(format!("{a} {a:?}"), "conv \"conv\"");
    let set: HashSet<Handle<String>> = [a.clone(), other].into_iter().collect();
    assert_eq!(set.len(), 1);
    assert!(a < Handle::new("gemm".to_string()));
}

#[test]
fn a_held_value_outlives_its_entry_and_drops_with_the_last_handle() {
    let drops = Arc::new(AtomicUsize::new(0));
    let cache: Cache<u32, Tracked> = Cache::new(10);
    cache
        .insert(
            1,
            Tracked {
                id: 7,
                drops: drops.clone(),
            },
        )
        .unwrap();
    let held = cache.get(&1).unwrap();
    let weak = Handle::downgrade(&held);
    let removed = cache.remove(&1).unwrap();
    assert!(Handle::ptr_eq(&held, &removed));
    drop(removed);
    cache.reclaim();
    assert_eq!(drops.load(Ordering::SeqCst), 0, "a handle still holds it");
    assert_eq!(weak.upgrade().map(|h| h.id), Some(7));
    drop(held);
    cache.reclaim();
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "dropped once, with the last handle"
    );
    assert!(weak.upgrade().is_none(), "a weak handle does not keep it");
    drop(cache);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn an_evicted_value_is_dropped_once_nobody_holds_it() {
    let drops = Arc::new(AtomicUsize::new(0));
    let cache: Cache<u64, Tracked> = Cache::builder().capacity(4).build().unwrap();
    for id in 0..64 {
        let t = Tracked {
            id,
            drops: drops.clone(),
        };
        cache.insert(id, t).unwrap();
    }
    cache.reclaim();
    assert_eq!(
        drops.load(Ordering::SeqCst),
        60,
        "every evicted value is dropped"
    );
    drop(cache);
    assert_eq!(drops.load(Ordering::SeqCst), 64);
}

#[test]
fn the_listener_gets_a_handle_it_may_keep() {
    type Heard = Vec<(u32, Handle<String>, RemovalCause)>;
    let kept: Arc<Mutex<Heard>> = Arc::default();
    let sink = kept.clone();
    let cache: Cache<u32, String> = Cache::builder()
        .capacity(1)
        .when_full(WhenFull::Evict)
        .on_evict(move |k: &u32, v: &Handle<String>, cause| {
            sink.lock().unwrap().push((*k, v.clone(), cause))
        })
        .build()
        .unwrap();
    cache.insert(1, "a".into()).unwrap();
    cache.insert(1, "b".into()).unwrap();
    cache.insert(2, "c".into()).unwrap();
    cache.reclaim();
    let kept = kept.lock().unwrap();
    let seen: Vec<_> = kept.iter().map(|(k, v, c)| (*k, v.as_str(), *c)).collect();
    assert_eq!(
        seen,
        [
            (1, "a", RemovalCause::Replaced),
            (1, "b", RemovalCause::Capacity)
        ]
    );
}

#[test]
fn an_arc_value_is_handed_out_as_an_arc_without_copying() {
    let cache: Cache<u32, Arc<Vec<u8>>> = Cache::new(10);
    let weights = Arc::new(vec![1u8; 1024]);
    cache.insert(1, weights.clone()).unwrap();
    let arc: Arc<Vec<u8>> = cache.get(&1).unwrap().as_ref().clone();
    assert!(Arc::ptr_eq(&arc, &weights));
    let cloned = cache.get_cloned(&1).unwrap();
    assert!(Arc::ptr_eq(&cloned, &weights));
    assert!(cache.get_cloned(&2).is_none());
}
