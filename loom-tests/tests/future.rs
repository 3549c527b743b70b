//! Loom models of the async single-flight path: tasks wait on a build by registering their
//! waker on the node's list of waiting tasks, threads by parking on the slot word, and either
//! may build. A lost wake-up is a deadlock loom reports.
//!
//! ```text
//! RUSTFLAGS="--cfg runcache_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     CARGO_TARGET_DIR=target/loom cargo test --release -p runcache-loom-tests --test future
//! ```
#![cfg(runcache_loom)]

use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use runcache::{Cache, WhenFull};
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// loom replays each interleaving many times, so hashing must not be randomly seeded.
type Fixed = BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

fn cache() -> Arc<Cache<u32, u64, Fixed>> {
    Arc::new(
        Cache::<u32, u64>::builder()
            .capacity(10)
            .shards(1)
            .hasher(Fixed::default())
            .when_full(WhenFull::Reject)
            .build()
            .expect("one shard is valid"),
    )
}

/// Pending once (waking itself), then ready: one await point inside a build.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A thread's blocking call and a task's async call race on one missing key, the task's
/// build with an await point inside it if `task_yields`: one build, one shared value, and
/// whichever waits is woken (a lost wake-up is a deadlock loom reports).
fn a_thread_and_a_task_share_one_build(task_yields: bool) {
    loom::model(move || {
        let c = cache();
        let builds = Arc::new(AtomicUsize::new(0));
        let t = {
            let (c, builds) = (c.clone(), builds.clone());
            thread::spawn(move || {
                let v = c.get_or_insert_with(1, || {
                    builds.fetch_add(1, Ordering::Relaxed);
                    7
                });
                runcache::__loom_thread_exit();
                v
            })
        };
        let mine = block_on(c.get_or_insert_with_async(1, async {
            builds.fetch_add(1, Ordering::Relaxed);
            if task_yields {
                YieldOnce(false).await;
            }
            7
        }))
        .expect("no recursion");
        let theirs = t.join().unwrap();
        assert_eq!(builds.load(Ordering::Relaxed), 1, "one build");
        assert!(runcache::Handle::ptr_eq(&mine, &theirs));
    });
}

/// (a) A task waits on a build that a thread runs: its waker is registered while the build
/// completes, and the task gets the thread's value (or builds first, and the thread waits).
#[test]
fn a_task_registering_while_a_thread_builds_is_woken_with_its_value() {
    a_thread_and_a_task_share_one_build(false);
}

/// (b) The building future is dropped after its first poll, racing a task that comes to
/// wait on it: the waiter is woken and builds, or finds the key free and builds; never
/// stranded.
#[test]
fn a_dropped_builder_racing_a_new_waiter_hands_the_build_over() {
    loom::model(|| {
        let c = cache();
        let t = {
            let c = c.clone();
            thread::spawn(move || {
                let mut f = Box::pin(c.get_or_insert_with_async(1, async {
                    YieldOnce(false).await;
                    1
                }));
                let first = f.as_mut().poll(&mut Context::from_waker(Waker::noop()));
                drop(f);
                runcache::__loom_thread_exit();
                first.is_ready()
            })
        };
        let mine = block_on(c.get_or_insert_with_async(1, async { 2 })).expect("no recursion");
        // The dropped future finished only if its first poll found the value cached.
        let _finished = t.join().unwrap();
        assert_eq!(*mine, 2, "the dropped build never publishes");
        assert_eq!(c.get(&1).as_deref(), Some(&2));
    });
}

/// (c) A thread parks on a build that a task runs (with an await point inside it), while
/// the task's build completes.
#[test]
fn a_thread_parked_on_a_task_build_is_woken() {
    a_thread_and_a_task_share_one_build(true);
}
