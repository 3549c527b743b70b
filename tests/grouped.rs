//! The grouped cache: oldest-first group eviction, clearing by session and owner, holds.

mod common;

use common::{drops, Tracked};
use runcache::grouped::{GroupedCache, OwnerId};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

type Blobs = GroupedCache<u32, Vec<usize>, String, u64>;

fn name(s: &str) -> String {
    s.to_string()
}

#[test]
fn set_get_and_single_flight_build() {
    let c = Blobs::new(0);
    assert!(c.set(&1, &vec![8], &name("w"), 5).is_none());
    assert_eq!(c.get(&1, &vec![8], "w").as_deref(), Some(&5));
    assert!(c.get(&2, &vec![8], "w").is_none(), "sessions are separate");
    assert_eq!(c.set(&1, &vec![8], &name("w"), 6).as_deref(), Some(&5));
    let builds = AtomicUsize::new(0);
    for _ in 0..3 {
        let v = c.get_or_insert_with(&1, &vec![16], &name("b"), || {
            builds.fetch_add(1, Ordering::SeqCst);
            9
        });
        assert_eq!(*v, 9);
    }
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    assert_eq!((c.len(), c.group_count(&1)), (2, 2));
}

#[test]
fn the_oldest_group_by_creation_is_evicted_whole() {
    let c = Blobs::new(2);
    for (i, shape) in [vec![1], vec![2], vec![3]].iter().enumerate() {
        for n in ["a", "b", "c"] {
            c.set(&0, shape, &name(n), i as u64);
        }
    }
    assert_eq!(c.group_count(&0), 2);
    assert!(["a", "b", "c"]
        .iter()
        .all(|n| c.get(&0, &vec![1], *n).is_none()));
    // Using a group does not make it younger: creation order decides.
    assert!(c.get(&0, &vec![2], "a").is_some());
    c.set(&0, &vec![4], &name("a"), 4);
    assert!(
        c.get(&0, &vec![2], "a").is_none(),
        "shape 2 was created before shape 3"
    );
    assert!(c.get(&0, &vec![3], "a").is_some());
    assert_eq!(c.len(), 3 + 1);
    // Other sessions keep their own groups.
    c.set(&1, &vec![1], &name("a"), 1);
    assert_eq!((c.group_count(&0), c.group_count(&1)), (2, 1));
}

#[test]
fn concurrent_inserts_keep_the_group_limit_and_leave_no_orphans() {
    let c = Arc::new(Blobs::new(3));
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4usize)
        .map(|t| {
            let (c, barrier) = (c.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for i in 0..50usize {
                    let shape = vec![t, i];
                    for n in 0..4u64 {
                        c.set(&9, &shape, &n.to_string(), n);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(c.group_count(&9), 3);
    // Exactly the counted groups hold entries, and every stored entry belongs to one of them.
    // (A group evicted while its creator was still filling it is created again by the next
    // `set`, holding only the names set after that: so a live group need not hold "0".)
    let held: Vec<usize> = (0..4usize)
        .flat_map(|t| (0..50usize).map(move |i| vec![t, i]))
        .map(|shape| {
            (0..4u64)
                .filter(|n| c.get(&9, &shape, &n.to_string()).is_some())
                .count()
        })
        .filter(|&names| names > 0)
        .collect();
    assert_eq!(held.len(), 3, "groups holding entries: {held:?}");
    assert_eq!(
        held.iter().sum::<usize>(),
        c.len(),
        "no entry outside a live group"
    );
}

#[test]
fn clearing_frees_entries_but_held_values_survive() {
    let d = drops();
    let c: GroupedCache<u32, u32, String, Tracked> = GroupedCache::new(0);
    c.set(&1, &1, &name("a"), Tracked::new(1, &d));
    c.set(&1, &2, &name("b"), Tracked::new(2, &d));
    c.set(&2, &1, &name("a"), Tracked::new(3, &d));
    let held = c.get(&1, &1, "a").unwrap();
    c.clear_session(&1);
    assert!(c.get(&1, &2, "b").is_none());
    assert_eq!((c.group_count(&1), c.group_count(&2), c.len()), (0, 1, 1));
    assert_eq!(held.id, 1, "a held value survives clear_session");
    c.clear();
    assert!(c.is_empty());
    drop(held);
    drop(c);
    assert_eq!(
        d.load(Ordering::SeqCst),
        3,
        "every value dropped exactly once"
    );
}

#[test]
fn clear_owner_removes_exactly_what_that_owner_stored() {
    let c = Blobs::new(0);
    let (a, b) = (c.owner(OwnerId(1)), c.owner(OwnerId(2)));
    a.set(&0, &vec![1], &name("x"), 1);
    a.set(&0, &vec![1], &name("y"), 2);
    b.set(&0, &vec![1], &name("z"), 3);
    b.set(&0, &vec![1], &name("y"), 20); // owner 2 replaced owner 1's value
    c.set(&0, &vec![1], &name("free"), 4);
    c.clear_owner(OwnerId(1));
    assert!(c.get(&0, &vec![1], "x").is_none());
    assert_eq!(
        c.get(&0, &vec![1], "y").as_deref(),
        Some(&20),
        "not owner 1's value anymore"
    );
    assert_eq!(c.get(&0, &vec![1], "z").as_deref(), Some(&3));
    assert_eq!(c.get(&0, &vec![1], "free").as_deref(), Some(&4));
    c.clear_owner(OwnerId(2));
    assert_eq!(c.len(), 1);
    assert_eq!(*a.get_or_insert_with(&0, &vec![2], &name("n"), || 7), 7);
    c.clear_owner(OwnerId(1));
    assert!(
        c.get(&0, &vec![2], "n").is_none(),
        "built entries are recorded too"
    );
}

#[test]
fn clear_owner_removes_the_groups_it_leaves_empty_and_only_those() {
    // Ten thousand executors, each with its own shape, each cleared when done: no empty
    // group is left behind (they used to stay until `clear_session`).
    let c = Blobs::new(0);
    for e in 0..10_000u64 {
        let owner = c.owner(OwnerId(e));
        owner.set(&0, &vec![e as usize], &name("w"), e);
        owner.get_or_insert_with(&0, &vec![e as usize], &name("b"), || e);
        c.clear_owner(OwnerId(e));
    }
    assert_eq!((c.len(), c.group_count(&0)), (0, 0));
    // A group that still holds another owner's entry, or an entry of no owner, stays.
    c.owner(OwnerId(1)).set(&0, &vec![1], &name("a"), 1);
    c.owner(OwnerId(2)).set(&0, &vec![1], &name("b"), 2);
    c.owner(OwnerId(1)).set(&0, &vec![2], &name("a"), 3);
    c.set(&0, &vec![2], &name("free"), 4);
    c.clear_owner(OwnerId(1));
    assert_eq!((c.len(), c.group_count(&0)), (2, 2));
    c.clear_owner(OwnerId(2));
    assert_eq!((c.len(), c.group_count(&0)), (1, 1));
    // The group limit still counts right after groups left: two more shapes fit, a third
    // evicts the oldest (shape 2, holding "free").
    let bounded = Blobs::new(2);
    bounded.owner(OwnerId(9)).set(&0, &vec![1], &name("a"), 1);
    bounded.set(&0, &vec![2], &name("free"), 2);
    bounded.clear_owner(OwnerId(9));
    assert_eq!(bounded.group_count(&0), 1);
    bounded.set(&0, &vec![3], &name("c"), 3);
    assert_eq!((bounded.group_count(&0), bounded.len()), (2, 2));
    bounded.set(&0, &vec![4], &name("d"), 4);
    assert_eq!((bounded.group_count(&0), bounded.len()), (2, 2));
    assert!(
        bounded.get(&0, &vec![2], "free").is_none(),
        "the oldest went"
    );
    // A shape made again after its group left is a new group, which a stale entry of the
    // old one in the session's order never evicts early.
    bounded.owner(OwnerId(10)).set(&0, &vec![3], &name("c"), 30);
    bounded.clear_owner(OwnerId(10));
    assert_eq!(bounded.group_count(&0), 1);
    bounded.set(&0, &vec![3], &name("again"), 5);
    bounded.set(&0, &vec![5], &name("e"), 6);
    assert_eq!(bounded.group_count(&0), 2);
    assert_eq!(bounded.get(&0, &vec![3], "again").as_deref(), Some(&5));
    assert_eq!(bounded.get(&0, &vec![5], "e").as_deref(), Some(&6));
    assert!(bounded.get(&0, &vec![4], "d").is_none());
}

#[test]
fn holds_defer_owner_clears_until_the_last_one_drops() {
    let c = Blobs::new(0);
    c.owner(OwnerId(5)).set(&0, &vec![1], &name("inner"), 1);
    let outer = c.hold_clears();
    {
        let _inner = c.hold_clears();
        c.clear_owner(OwnerId(5)); // the nested executor finishing
        assert!(
            c.get(&0, &vec![1], "inner").is_some(),
            "deferred while held"
        );
    }
    assert!(
        c.get(&0, &vec![1], "inner").is_some(),
        "the outer hold still lives"
    );
    drop(outer);
    assert!(
        c.get(&0, &vec![1], "inner").is_none(),
        "ran when the last hold dropped"
    );
}
