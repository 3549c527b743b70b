//! Loom model: a new group evicts the oldest one while another thread looks an entry of the
//! oldest group up. The lookup sees the entry or nothing (never a torn state), and afterwards
//! exactly the new group remains, with no orphan entry.
#![cfg(runcache_loom)]

use loom::sync::Arc;
use loom::thread;
use runcache::grouped::GroupedCache;

/// Runs a model with a higher branch limit: one grouped operation touches several caches
/// (values, sessions, groups) and queues, so an execution has more branch points than loom's
/// default limit of 1,000.
fn check(model: impl Fn() + Sync + Send + 'static) {
    check_with(None, model);
}

/// [`check`] with `preemptions` preemptions when given, whatever the run's
/// `LOOM_MAX_PREEMPTIONS` (for a model whose race needs that many).
fn check_with(preemptions: Option<usize>, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    if preemptions.is_some() {
        builder.preemption_bound = preemptions;
    }
    builder.check(model);
}

/// Spawns `f` on a model thread with a stack of 1 MiB: a write of a grouped cache whose
/// values expire purges the values table inside the sessions' and groups' misses, deeper
/// than loom's default stack (whose main thread's cannot be changed).
fn spawn_deep(f: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
    thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || {
            f();
            runcache::__loom_thread_exit();
        })
        .expect("a model thread")
}

#[test]
fn group_eviction_racing_a_lookup() {
    check(|| {
        let c: Arc<GroupedCache<u8, u8, u8, u32>> = Arc::new(GroupedCache::new(1));
        c.set(&0, &1, &7, 10);
        let evictor = {
            let c = c.clone();
            thread::spawn(move || {
                c.set(&0, &2, &7, 20);
                runcache::__loom_thread_exit();
            })
        };
        if let Some(v) = c.get(&0, &1, &7) {
            assert_eq!(*v, 10);
        }
        evictor.join().unwrap();
        assert!(c.get(&0, &1, &7).is_none(), "the oldest group is gone");
        assert_eq!(c.get(&0, &2, &7).as_deref(), Some(&20));
        assert_eq!((c.group_count(&0), c.len()), (1, 1));
    });
}

/// A set into the oldest group races the creation of a new group that evicts it: exactly one
/// group survives, whole, and no entry of the evicted one is left behind (the `evicted` flag
/// and the fences in `record` / `evict_group`).
#[test]
fn a_set_into_an_evicted_group_leaves_no_orphan() {
    check(|| {
        let c: Arc<GroupedCache<u8, u8, u8, u32>> = Arc::new(GroupedCache::new(1));
        c.set(&0, &1, &7, 10);
        let evictor = {
            let c = c.clone();
            thread::spawn(move || {
                c.set(&0, &2, &7, 20);
                runcache::__loom_thread_exit();
            })
        };
        c.set(&0, &1, &8, 11);
        evictor.join().unwrap();
        let one = [7u8, 8]
            .iter()
            .filter(|n| c.get(&0, &1, *n).is_some())
            .count();
        let two = usize::from(c.get(&0, &2, &7).is_some());
        assert_eq!(c.group_count(&0), 1);
        assert!(
            (one == 0) != (two == 0),
            "exactly one group survives: {one} {two}"
        );
        assert_eq!(c.len(), one + two, "no orphan entries");
    });
}

/// A purge takes the last value of a group out as expired, and so the group, while another
/// thread stores into that group (its own write purges and drains first too): whatever the
/// order, the group is counted exactly when it holds a value, and no value outlives it
/// (the serial each expired value carries, and the `evicted` flag as above). The store that
/// finds the group just before it leaves needs three preemptions (about 20 s); with two, the
/// model passes without the `evicted` check.
#[test]
fn an_expired_group_leaving_races_a_store_into_it() {
    check_with(Some(3), || spawn_deep(expired_group_race).join().unwrap());
}

fn expired_group_race() {
    {
        let (clock, hand) = runcache::Clock::manual();
        let c: Arc<GroupedCache<u8, u8, u8, u32>> = Arc::new(
            GroupedCache::builder(0)
                .time_to_live(std::time::Duration::from_millis(10))
                .clock(clock)
                .build()
                .unwrap(),
        );
        c.set(&0, &1, &7, 10);
        hand.advance(std::time::Duration::from_millis(20));
        let purger = {
            let c = c.clone();
            spawn_deep(move || {
                c.purge_expired();
            })
        };
        c.set(&0, &1, &8, 11);
        purger.join().unwrap();
        c.purge_expired();
        assert!(c.get(&0, &1, &7).is_none(), "the expired value is gone");
        let kept = usize::from(c.get(&0, &1, &8).is_some());
        assert_eq!(c.len(), kept, "no orphan entries");
        assert_eq!(
            c.group_count(&0),
            kept,
            "counted exactly when it holds a value"
        );
    }
}
