//! Loom models of an evicting cache: the S3-FIFO queues (crossbeam-queue's `SegQueue`) join the
//! table, the slots and the budget in the explored state.
//!
//! ```text
//! RUSTFLAGS="--cfg runcache_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     CARGO_TARGET_DIR=target/loom cargo test --release -p runcache-loom-tests --test eviction
//! ```
#![cfg(runcache_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use runcache::{Cache, RemovalCause};
use std::hash::BuildHasherDefault;

/// loom replays each interleaving many times, so hashing must not be randomly seeded.
type Fixed = BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// A value whose drops are counted with a loom atomic.
struct Tracked {
    key: u32,
    drops: Arc<AtomicUsize>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs a model with a higher branch limit than loom's default of 1,000: the policy's sweep
/// of the table (which the first warm admission starts), the values' own counts and the
/// collector's queue at the cache's drop make executions longer than that.
fn check(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 10_000;
    builder.check(model);
}

/// Counts, per cause, the values that left: `[capacity, removed, other]`.
#[derive(Default)]
struct Heard([AtomicUsize; 3]);

impl Heard {
    fn count(&self, cause: RemovalCause) {
        let i = match cause {
            RemovalCause::Capacity => 0,
            RemovalCause::Removed => 1,
            _ => 2,
        };
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }
}

fn evicting(capacity: u64, heard: Arc<Heard>) -> Cache<u32, Tracked, Fixed> {
    Cache::<u32, Tracked>::builder()
        .shards(1)
        .hasher(Fixed::default())
        .capacity(capacity)
        .on_evict(move |k, v, cause| {
            assert_eq!(*k, v.key, "the listener got another key's value");
            heard.count(cause);
        })
        .build()
        .expect("one shard is valid")
}

/// (f) An insert that must evict races a reader and a remover of the entries it may choose:
/// the reader sees the right value or none, each value leaves exactly once (by eviction or by
/// the remove, never both), the budget and the queues stay exact, and every value is dropped
/// exactly once.
#[test]
fn an_eviction_racing_a_get_and_a_remove_loses_nothing() {
    check(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let heard = Arc::new(Heard::default());
        let c = Arc::new(evicting(2, heard.clone()));
        let value = |key| Tracked {
            key,
            drops: drops.clone(),
        };
        assert!(c.insert(1, value(1)).is_ok());
        assert!(c.insert(2, value(2)).is_ok());
        let (c2, v3) = (c.clone(), value(3));
        let inserter = thread::spawn(move || {
            assert!(
                c2.insert(3, v3).is_ok(),
                "an entry that fits is never refused"
            );
            runcache::__loom_thread_exit();
        });
        if let Some(v) = c.get(&1) {
            assert_eq!(v.key, 1);
        }
        let removed = c.remove(&1);
        inserter.join().unwrap();
        let gone: usize = heard.0.iter().map(|h| h.load(Ordering::Relaxed)).sum();
        assert_eq!(
            gone + c.len(),
            3,
            "every value is cached or left exactly once"
        );
        assert_eq!(
            heard.0[1].load(Ordering::Relaxed),
            usize::from(removed.is_some())
        );
        assert!(
            c.get(&3).is_some(),
            "the new entry was not evicted by its own insert"
        );
        c.__validate().expect("exact accounting and queues");
        drop(removed);
        drop(c);
        assert_eq!(drops.load(Ordering::Relaxed), 3, "each value dropped once");
    });
}

/// (g) A shrink races an insert into an evicting cache: the size never passes the capacity in
/// force, the shrink reaches its target, and whatever left was reported as evicted.
#[test]
fn a_shrink_racing_an_evicting_insert_keeps_the_budget() {
    check(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let heard = Arc::new(Heard::default());
        let c = Arc::new(evicting(2, heard.clone()));
        let v2 = Tracked {
            key: 2,
            drops: drops.clone(),
        };
        assert!(c
            .insert(
                1,
                Tracked {
                    key: 1,
                    drops: drops.clone()
                }
            )
            .is_ok());
        let c2 = c.clone();
        let inserter = thread::spawn(move || {
            let _ = c2.insert(2, v2);
            let (size, cap) = c2.weighted_size_and_capacity();
            assert!(size <= cap, "size {size} above capacity {cap}");
            runcache::__loom_thread_exit();
        });
        c.set_capacity(1).unwrap();
        inserter.join().unwrap();
        let (size, cap) = c.weighted_size_and_capacity();
        assert!(size <= cap && cap == 1, "size {size}, capacity {cap}");
        let evicted = heard.0[0].load(Ordering::Relaxed);
        assert_eq!(evicted + c.len(), 2, "what is not cached was evicted");
        c.__validate().expect("exact accounting and queues");
        drop(c);
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    });
}

/// (h) The value's own count: a reader's handle is the last owner, and its drop races the
/// eviction that takes the value out of its node and the epoch retirement of the node's
/// count of it; a weak handle upgrades only while some owner is left. The value drops
/// exactly once, never while held, and nothing is left when the cache drops.
#[test]
fn a_last_handle_drop_races_an_eviction_and_its_retirement() {
    check(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let heard = Arc::new(Heard::default());
        let c = Arc::new(evicting(1, heard.clone()));
        let value = |key| Tracked {
            key,
            drops: drops.clone(),
        };
        assert!(c.insert(1, value(1)).is_ok());
        let held = c.get(&1).expect("cached");
        let weak = runcache::Handle::downgrade(&held);
        let (c2, d2) = (c.clone(), drops.clone());
        let reader = thread::spawn(move || {
            assert_eq!(held.key, 1);
            assert_eq!(d2.load(Ordering::Relaxed), 0, "dropped while held");
            drop(held);
            runcache::__loom_thread_exit();
            drop(c2);
        });
        assert!(c.insert(2, value(2)).is_ok(), "evicts key 1");
        c.reclaim();
        if let Some(again) = weak.upgrade() {
            assert_eq!(again.key, 1, "an upgrade finds the value it was made from");
            assert_eq!(drops.load(Ordering::Relaxed), 0, "upgraded a dropped value");
        }
        reader.join().unwrap();
        c.reclaim();
        assert!(
            weak.upgrade().is_none(),
            "no owner is left after the reclaim"
        );
        assert_eq!(drops.load(Ordering::Relaxed), 1, "key 1 drops exactly once");
        drop(weak);
        assert_eq!(heard.0[0].load(Ordering::Relaxed), 1);
        drop(c);
        assert_eq!(drops.load(Ordering::Relaxed), 2, "the cache drops key 2");
    });
}

/// (i) A cold cache queues nothing until it is first half full (P2): two inserts race, one
/// admitted cold or both warm, and the warm one's admission turns queueing on and sweeps the
/// table while the other's node may be linked, admitted or neither. Each entry is queued at
/// most once (P1, checked by `__validate`), and a shrink to zero finds both, the one the
/// sweep missed through the evictor's fallback sweep. (Keys 1 and 3 hash to slots 0 and 2
/// of the four-slot table, and a step sweeps two slots, so the first step misses key 3.)
#[test]
fn a_cold_admission_races_the_first_warm_one_and_its_sweep() {
    check(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let heard = Arc::new(Heard::default());
        let c = Arc::new(evicting(4, heard.clone()));
        let value = |key| Tracked {
            key,
            drops: drops.clone(),
        };
        let (c2, v1) = (c.clone(), value(1));
        let inserter = thread::spawn(move || {
            assert!(c2.insert(1, v1).is_ok());
            runcache::__loom_thread_exit();
        });
        assert!(c.insert(3, value(3)).is_ok());
        inserter.join().unwrap();
        c.__validate()
            .expect("no entry queued twice or lost by the queues");
        c.set_capacity(0).unwrap();
        assert_eq!(c.len(), 0);
        assert_eq!(
            heard.0[0].load(Ordering::Relaxed),
            2,
            "both entries were evicted, queued or not"
        );
        c.__validate().expect("exact accounting and queues");
        drop(c);
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    });
}

/// A cache of capacity 4 whose values weigh what they say, its policy past its first
/// eviction with entries 1 and 2 in the main queue and 3 and 4 in the small queue.
fn with_main_queue(heard: Arc<Heard>) -> Cache<u32, u64, Fixed> {
    let c = Cache::<u32, u64>::builder()
        .shards(1)
        .hasher(Fixed::default())
        .capacity(4)
        .weigher(|_, v| *v)
        .on_evict(move |_, _, cause| heard.count(cause))
        .build()
        .expect("one shard is valid");
    for k in 1..=4 {
        assert!(c.insert(k, 1).is_ok());
        assert!(c.get(&k).is_some());
    }
    // Room for 5 and 6 makes 1 and 2, hit in the small queue, leave for the main queue.
    for k in 5..=6 {
        let _ = c.insert(k, 1);
    }
    c
}

/// (j) A newcomer heavier than the small queue's room is judged at the door (P10) while
/// another thread removes one of the main queue's victims it may gather. Turned away four
/// times (each time counted in the sketch), the fifth time it outcounts the two victims if
/// it finds them both. Whichever thread gets there first, the size never passes the
/// capacity, every value is cached, removed or evicted exactly once (a victim removed
/// meanwhile only frees less), and the queues stay exact.
#[test]
fn a_heavy_newcomer_at_the_door_races_the_removal_of_its_victim() {
    check(|| {
        let heard = Arc::new(Heard::default());
        let c = Arc::new(with_main_queue(heard.clone()));
        for _ in 0..4 {
            assert!(c.insert(10, 2).unwrap_err().turned_away);
        }
        let gone = |h: &Heard| h.0.iter().map(|n| n.load(Ordering::Relaxed)).sum::<usize>();
        let before = gone(&heard) + c.len();
        let c2 = c.clone();
        let heavy = thread::spawn(move || {
            let cached = c2.insert(10, 2).is_ok();
            let (size, cap) = c2.weighted_size_and_capacity();
            assert!(size <= cap, "size {size} above capacity {cap}");
            runcache::__loom_thread_exit();
            cached
        });
        let removed = c.remove(&1).is_some();
        let cached = heavy.join().unwrap();
        let (size, cap) = c.weighted_size_and_capacity();
        assert!(size <= cap, "size {size} above capacity {cap}");
        assert_eq!(
            heard.0[1].load(Ordering::Relaxed),
            usize::from(removed),
            "a removal is heard once"
        );
        assert_eq!(
            gone(&heard) + c.len(),
            before + usize::from(cached),
            "every value is cached or left exactly once"
        );
        c.__validate().expect("exact accounting and queues");
    });
}
