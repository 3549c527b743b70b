//! Loom models of the table's migration (`src/raw/table/`, H1–H4).
//!
//! Under the loom cfg a shard's first table has 4 slots and writers claim at most half, so
//! the third key of a shard starts a migration, copied two slots at a time. Each model fills
//! two keys first, then races the key that starts the migration against another operation,
//! and checks the result and the table's structure (`__validate`) afterwards.
#![cfg(runcache_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use runcache::Cache;
use std::hash::BuildHasherDefault;

type Fixed = BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// One shard holding keys 1 and 2: the next new key cannot be claimed in its table.
fn full_table() -> Arc<Cache<u32, u64, Fixed>> {
    let c = Cache::<u32, u64>::builder()
        .shards(1)
        .capacity(16)
        .hasher(Fixed::default())
        .when_full(runcache::WhenFull::Reject)
        .build()
        .expect("one shard is valid");
    c.insert(1, 1).unwrap();
    c.insert(2, 2).unwrap();
    Arc::new(c)
}

/// Runs a model with a higher branch limit than loom's default of 1,000: a migration, the
/// values' own counts (one count written per handle taken and dropped) and the collector's
/// queue at the cache's drop make executions longer than that.
fn check(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 10_000;
    builder.check(model);
}

/// Runs `insert(3, 3)`, which migrates the table, on another thread.
fn migrate(c: &Arc<Cache<u32, u64, Fixed>>) -> thread::JoinHandle<()> {
    let c = c.clone();
    thread::spawn(move || {
        c.insert(3, 3).unwrap();
        runcache::__loom_thread_exit();
    })
}

/// A reader never misses a key that is present throughout a migration.
#[test]
fn a_reader_sees_every_key_through_a_migration() {
    check(|| {
        let c = full_table();
        let t = migrate(&c);
        let pinned = c.pin();
        assert_eq!(pinned.get(&1), Some(&1));
        assert_eq!(pinned.get(&2), Some(&2));
        drop(pinned);
        t.join().unwrap();
        assert_eq!(c.get(&3).as_deref(), Some(&3));
        assert!(c.__migrations() + usize::from(c.__slots() > 4) >= 1);
        c.__validate().unwrap();
    });
}

/// A replacement racing the migration lands exactly once, and is not undone by a copy.
#[test]
fn a_replacement_racing_a_migration_is_kept() {
    check(|| {
        let c = full_table();
        let t = migrate(&c);
        assert_eq!(c.insert(1, 10).unwrap().as_deref(), Some(&1));
        t.join().unwrap();
        assert_eq!(c.get(&1).as_deref(), Some(&10));
        assert_eq!(c.get(&2).as_deref(), Some(&2));
        assert_eq!(c.get(&3).as_deref(), Some(&3));
        assert_eq!(c.len(), 3);
        assert_eq!(c.weighted_size(), 3);
        c.__validate().unwrap();
    });
}

/// A removal racing the migration is not undone by a copy of the removed entry.
#[test]
fn a_removal_racing_a_migration_stays_removed() {
    check(|| {
        let c = full_table();
        let t = migrate(&c);
        assert_eq!(c.remove(&1).as_deref(), Some(&1));
        t.join().unwrap();
        assert_eq!(c.get(&1), None);
        assert_eq!(c.get(&2).as_deref(), Some(&2));
        assert_eq!(c.get(&3).as_deref(), Some(&3));
        assert_eq!(c.len(), 2);
        c.__validate().unwrap();
    });
}

/// Two builders of the key that starts the migration: one build, one shared value, even when
/// the loading entry is copied into the new table while it builds.
#[test]
fn a_build_that_starts_a_migration_runs_once() {
    check(|| {
        let c = full_table();
        let builds = Arc::new(AtomicUsize::new(0));
        let (c2, b2) = (c.clone(), builds.clone());
        let t = thread::spawn(move || {
            let v = c2.get_or_insert_with(3, || {
                b2.fetch_add(1, Ordering::Relaxed);
                30
            });
            runcache::__loom_thread_exit();
            v
        });
        let mine = c.get_or_insert_with(3, || {
            builds.fetch_add(1, Ordering::Relaxed);
            30
        });
        let theirs = t.join().unwrap();
        assert_eq!(builds.load(Ordering::Relaxed), 1, "one build");
        assert!(runcache::Handle::ptr_eq(&mine, &theirs), "one shared value");
        assert_eq!(c.len(), 3);
        c.__validate().unwrap();
    });
}

/// `clear` racing a migration (which it finishes first if it is in flight) removes keys 1
/// and 2 wherever the migration has got to, and key 3, inserted by the migrating thread,
/// stays only if it landed after the clear passed it.
#[test]
fn a_clear_racing_a_migration_removes_what_was_there() {
    check(|| {
        let c = full_table();
        let t = migrate(&c);
        c.clear();
        t.join().unwrap();
        assert_eq!(c.get(&1), None);
        assert_eq!(c.get(&2), None);
        let three = c.get(&3).is_some();
        assert_eq!(c.len(), usize::from(three));
        assert_eq!(c.weighted_size(), c.len() as u64);
        c.__validate().unwrap();
    });
}

/// Iterating while another thread's insert migrates the table yields keys 1 and 2, cached
/// throughout, exactly once each, and key 3 at most once; once the insert has returned, key
/// 3 too, though the migration may be unfinished and key 3 only in the new table (an
/// iteration finishes a migration in flight before it walks the shard).
#[test]
fn an_iteration_racing_a_migration_yields_each_cached_key_once() {
    check(|| {
        let c = full_table();
        let t = migrate(&c);
        let mut seen: Vec<(u32, u64)> = c.pin().iter().map(|(k, v)| (*k, *v)).collect();
        t.join().unwrap();
        seen.sort_unstable();
        if seen.len() == 3 {
            assert_eq!(seen, [(1, 1), (2, 2), (3, 3)]);
        } else {
            assert_eq!(seen, [(1, 1), (2, 2)]);
        }
        // Key 3 may live only in the new table while the migration is unfinished.
        let mut all: Vec<(u32, u64)> = c.pin().iter().map(|(k, v)| (*k, *v)).collect();
        all.sort_unstable();
        assert_eq!(all, [(1, 1), (2, 2), (3, 3)]);
        c.__validate().unwrap();
    });
}

/// `retain` racing the migrating insert removes the refused key wherever the migration has
/// got to, keeps the others, and leaves the accounting exact.
#[test]
fn a_retain_racing_a_migration_removes_exactly_the_refused_key() {
    check(|| {
        let c = full_table();
        let t = migrate(&c);
        assert_eq!(c.retain(|k, _| *k != 1), 1);
        t.join().unwrap();
        assert_eq!(c.get(&1), None);
        assert_eq!(c.get(&2).as_deref(), Some(&2));
        assert_eq!(c.get(&3).as_deref(), Some(&3));
        assert_eq!(c.len(), 2);
        assert_eq!(c.weighted_size(), 2);
        c.__validate().unwrap();
    });
}
