//! Loom models of expiry: the timer wheel's keeper flag (X1) and its hints (X2), raced by
//! writers that schedule entries and step the wheel, readers, and a removal.
//!
//! ```text
//! RUSTFLAGS="--cfg runcache_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     CARGO_TARGET_DIR=target/loom cargo test --release -p runcache-loom-tests --test expiry
//! ```
#![cfg(runcache_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use runcache::{Cache, Clock, ManualClock, RemovalCause};
use std::hash::BuildHasherDefault;
use std::time::Duration;

/// loom replays each interleaving many times, so hashing must not be randomly seeded.
type Fixed = BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

fn check(model: impl Fn() + Sync + Send + 'static) {
    check_with(None, model);
}

/// [`check`] with at most `preemptions` preemptions when given (fewer than the run's
/// `LOOM_MAX_PREEMPTIONS`, for a model whose race needs only that many).
fn check_with(preemptions: Option<usize>, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 10_000;
    if let Some(p) = preemptions {
        builder.preemption_bound = Some(p);
    }
    builder.check(model);
}

/// A cache whose entries live `live`, on a manual clock; the listener counts what leaves as
/// expired and as removed.
fn expiring(live: Duration, heard: Arc<[AtomicUsize; 2]>) -> (Cache<u32, u32, Fixed>, ManualClock) {
    let (clock, hand) = Clock::manual();
    let cache = Cache::<u32, u32>::builder()
        .shards(1)
        .hasher(Fixed::default())
        .capacity(4)
        .time_to_live(live)
        .clock(clock)
        .on_evict(move |_, _, cause| {
            let i = match cause {
                RemovalCause::Expired => 0,
                RemovalCause::Removed => 1,
                other => panic!("nothing else takes values out here: {other:?}"),
            };
            heard[i].fetch_add(1, Ordering::Relaxed);
        })
        .build()
        .expect("one shard is valid");
    (cache, hand)
}

/// (k) Two writers schedule entries that expire at once and step the wheel together: one
/// takes the keeper's flag, the other goes on without waiting (X1), and its schedule is not
/// forgotten (X3). A reader never sees an expired value. Once a purge has run, every entry
/// left exactly once, as expired, and the budget is back to zero. One preemption reaches the
/// race X3 closes (a schedule between the keeper's drain and its update of the hint: the
/// model failed on a keeper that stored the hint, and on one that let its flag go with a
/// plain store).
#[test]
#[ignore = "about eight minutes on 2 cores; run with `--ignored` after a change to the wheel"]
fn two_keepers_race_and_every_expired_entry_leaves_once() {
    check_with(Some(1), || {
        let heard: Arc<[AtomicUsize; 2]> = Arc::new(Default::default());
        let (c, _hand) = expiring(Duration::ZERO, heard.clone());
        let c = Arc::new(c);
        let c2 = c.clone();
        let writer = thread::spawn(move || {
            c2.put(2, 2).unwrap();
            runcache::__loom_thread_exit();
        });
        c.put(1, 1).unwrap();
        assert!(c.get(&2).is_none(), "an expired value is never returned");
        writer.join().unwrap();
        c.purge_expired();
        assert_eq!(
            heard[0].load(Ordering::Relaxed),
            2,
            "each entry expired once"
        );
        assert_eq!((c.len(), c.weighted_size()), (0, 0));
        c.__validate().expect("exact accounting");
    });
}

/// A cache of one entry (1 → 1) that lives a second, the clock two seconds on: `race` runs
/// while another thread purges, and the purger is joined before this returns.
fn racing_a_purge(
    race: impl FnOnce(&Cache<u32, u32, Fixed>),
) -> (
    Arc<Cache<u32, u32, Fixed>>,
    ManualClock,
    Arc<[AtomicUsize; 2]>,
) {
    let heard: Arc<[AtomicUsize; 2]> = Arc::new(Default::default());
    let (c, hand) = expiring(Duration::from_secs(1), heard.clone());
    let c = Arc::new(c);
    c.put(1, 1).unwrap();
    hand.advance(Duration::from_secs(2));
    let c2 = c.clone();
    let purger = thread::spawn(move || {
        c2.purge_expired();
        runcache::__loom_thread_exit();
    });
    race(&c);
    purger.join().unwrap();
    (c, hand, heard)
}

/// (l) The wheel takes an entry out at its deadline while another thread removes it: the
/// value leaves once, by whichever got there first, and the wheel's bucket entry is only a
/// hint (X2).
#[test]
fn an_expiry_racing_a_remove_takes_the_value_once() {
    check(|| {
        let (c, _hand, heard) = racing_a_purge(|c| {
            let removed = c.remove(&1);
            assert!(removed.is_none(), "an expired value is not handed back");
        });
        assert_eq!(
            heard[0].load(Ordering::Relaxed),
            1,
            "taken out once, as expired"
        );
        assert_eq!(heard[1].load(Ordering::Relaxed), 0);
        assert_eq!((c.len(), c.weighted_size()), (0, 0));
        c.__validate().expect("exact accounting");
    });
}

/// (m) A write puts a key again after its value expired, while another thread's purge hands
/// out the expired value's record (X4): the record is matched by address against what the
/// table leads to, so it takes out the expired value at most once and never the new one,
/// whose own record is not lost (the later purge takes it out at its deadline).
#[test]
fn a_record_racing_the_put_that_takes_its_key_again_takes_only_its_own_value() {
    check(|| {
        let (c, hand, heard) = racing_a_purge(|c| c.put(1, 2).unwrap());
        assert_eq!(
            heard[0].load(Ordering::Relaxed),
            1,
            "the old value expired once"
        );
        assert_eq!(c.get_cloned(&1), Some(2), "the new value lives");
        hand.advance(Duration::from_secs(2));
        c.purge_expired();
        assert_eq!(
            heard[0].load(Ordering::Relaxed),
            2,
            "the new value expired in turn"
        );
        assert_eq!(heard[1].load(Ordering::Relaxed), 0);
        assert_eq!((c.len(), c.weighted_size()), (0, 0));
        c.__validate().expect("exact accounting");
    });
}
