//! The async single-flight methods: one build per key under a storm of tasks (on tokio's
//! multi-thread and current-thread runtimes), threads and tasks waiting on one build,
//! cancellation of the building future at every await point, panics, failures, recursion,
//! and a key whose `Hash` panics.

use runcache::{BuildError, Cache, Handle, Source};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// A future that returns `Pending` `n` times (waking itself each time) before it resolves:
/// `n` await points a test can stop at.
struct Yields(usize);

impl Future for Yields {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 == 0 {
            return Poll::Ready(());
        }
        self.0 -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A waker that counts its wakes.
struct Counting(AtomicUsize);

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<Counting>, Waker) {
    let c = Arc::new(Counting(AtomicUsize::new(0)));
    let w = Waker::from(Arc::clone(&c));
    (c, w)
}

fn poll_once<F: Future>(f: std::pin::Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(waker))
}

#[test]
fn a_storm_of_tasks_on_one_key_builds_once_on_the_multi_thread_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap();
    let cache = Arc::new(Cache::<u64, String>::new(100));
    let builds = Arc::new(AtomicUsize::new(0));
    let values: Vec<Handle<String>> = rt.block_on(async {
        let tasks: Vec<_> = (0..10_000)
            .map(|_| {
                let (cache, builds) = (Arc::clone(&cache), Arc::clone(&builds));
                tokio::spawn(async move {
                    cache
                        .get_or_insert_with_async(7, async {
                            builds.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            "kernel".to_string()
                        })
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    assert_eq!(values.len(), 10_000);
    assert!(values.iter().all(|v| Handle::ptr_eq(v, &values[0])));
    let s = cache.stats();
    assert_eq!(s.builds, 1);
    assert_eq!(
        s.hits + s.waits + s.misses,
        10_000,
        "each call counts once: {s:?}"
    );
}

#[test]
fn a_storm_of_tasks_on_one_key_builds_once_on_the_current_thread_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let cache = Arc::new(Cache::<u64, u64>::new(100));
    let builds = Arc::new(AtomicUsize::new(0));
    let sum = rt.block_on(async {
        let tasks: Vec<_> = (0..10_000)
            .map(|_| {
                let (cache, builds) = (Arc::clone(&cache), Arc::clone(&builds));
                tokio::spawn(async move {
                    let v = cache
                        .get_or_insert_with_async(1, async {
                            builds.fetch_add(1, Ordering::SeqCst);
                            // Yield to the other tasks many times while building: a blocked
                            // thread here would deadlock the runtime.
                            for _ in 0..50 {
                                tokio::task::yield_now().await;
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            41
                        })
                        .await
                        .unwrap();
                    *v + 1
                })
            })
            .collect();
        let mut sum = 0;
        for t in tasks {
            sum += t.await.unwrap();
        }
        sum
    });
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    assert_eq!(sum, 42 * 10_000);
}

#[test]
fn a_hit_drops_the_build_future_unpolled_and_reports_its_source() {
    let cache = Cache::<u64, u64>::new(10);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let f = cache
            .get_or_build_async::<(), _>(1, async { Ok(10) })
            .await
            .unwrap();
        assert_eq!((*f.value, f.source), (10, Source::Cached));
        let f = cache
            .get_or_build_async::<(), _>(1, async { unreachable!("a hit polls no build") })
            .await
            .unwrap();
        assert_eq!((*f.value, f.source), (10, Source::Hit));
    });
}

/// The building future, dropped after each possible number of polls, hands the build over
/// to a task already waiting on it; the waiter's own build runs once, and the cache holds its
/// value.
#[test]
fn a_builder_dropped_at_every_await_point_hands_the_build_to_a_waiter() {
    const POINTS: usize = 4;
    for stop in 0..=POINTS {
        let cache = Cache::<u64, usize>::new(10);
        let (_, waker) = counting();
        let mut builder = Box::pin(cache.get_or_insert_with_async(5, async {
            Yields(POINTS).await;
            1000
        }));
        // Poll `stop + 1` times: the first poll links the node and starts the build.
        for _ in 0..=stop.min(POINTS - 1) {
            assert!(poll_once(builder.as_mut(), &waker).is_pending());
        }
        let (wakes, waiter_waker) = counting();
        let mut waiter = Box::pin(cache.get_or_insert_with_async(5, async { stop }));
        assert!(
            poll_once(waiter.as_mut(), &waiter_waker).is_pending(),
            "the waiter waits for the build in flight"
        );
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        drop(builder);
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "the builder's drop wakes the waiter once"
        );
        let Poll::Ready(v) = poll_once(waiter.as_mut(), &waiter_waker) else {
            panic!("the waiter takes the build over and finishes it")
        };
        assert_eq!(*v.unwrap(), stop);
        assert_eq!(cache.get(&5).as_deref(), Some(&stop));
        assert_eq!(cache.stats().builds, 2);
        cache.__validate().unwrap();
    }
}

/// A waiting task's dropped future leaves nothing behind: its registration is freed (its
/// waker released, never woken) when the build ends.
#[test]
fn a_dropped_waiter_leaves_nothing_behind() {
    let cache = Cache::<u64, u64>::new(10);
    let (_, waker) = counting();
    let mut builder = Box::pin(cache.get_or_insert_with_async(1, async {
        Yields(1).await;
        7
    }));
    assert!(poll_once(builder.as_mut(), &waker).is_pending());
    let (wakes, waiter_waker) = counting();
    let mut waiter = Box::pin(cache.get_or_insert_with_async(1, async { 8 }));
    assert!(poll_once(waiter.as_mut(), &waiter_waker).is_pending());
    // The test's two (`wakes`, `waiter_waker`), the list's and the future's.
    assert_eq!(Arc::strong_count(&wakes), 4);
    drop(waiter);
    assert_eq!(
        Arc::strong_count(&wakes),
        3,
        "the list keeps one until the build ends"
    );
    let Poll::Ready(v) = poll_once(builder.as_mut(), &waker) else {
        panic!("the build finishes")
    };
    assert_eq!(*v.unwrap(), 7);
    assert_eq!(
        Arc::strong_count(&wakes),
        2,
        "the end of the build freed the registration"
    );
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "woken once, harmlessly");
}

#[test]
fn a_build_future_that_panics_reaches_its_caller_and_a_waiter_takes_over() {
    let cache = Cache::<u64, u64>::new(10);
    let (_, waker) = counting();
    let mut builder = Box::pin(cache.get_or_insert_with_async(3, async {
        Yields(1).await;
        panic!("the build future panics");
    }));
    assert!(poll_once(builder.as_mut(), &waker).is_pending());
    let (wakes, waiter_waker) = counting();
    let mut waiter = Box::pin(cache.get_or_insert_with_async(3, async { 33 }));
    assert!(poll_once(waiter.as_mut(), &waiter_waker).is_pending());
    let panicked = catch_unwind(AssertUnwindSafe(|| poll_once(builder.as_mut(), &waker)));
    assert!(panicked.is_err(), "the panic reaches the builder's caller");
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    let Poll::Ready(v) = poll_once(waiter.as_mut(), &waiter_waker) else {
        panic!("the waiter takes the build over")
    };
    assert_eq!(*v.unwrap(), 33);
    assert_eq!(cache.get(&3).as_deref(), Some(&33));
}

#[test]
fn a_failure_reaches_every_waiter_of_the_attempt_and_is_not_cached() {
    let cache = Cache::<u64, u64>::new(10);
    let (_, waker) = counting();
    let mut builder = Box::pin(cache.try_get_or_insert_with_async(9, async {
        Yields(1).await;
        Err::<u64, _>("no kernel for this shape")
    }));
    assert!(poll_once(builder.as_mut(), &waker).is_pending());
    let mut waiter = Box::pin(
        // Never polled: the waiter shares the builder's outcome.
        cache.try_get_or_insert_with_async(9, async { Ok::<u64, &str>(0) }),
    );
    assert!(poll_once(waiter.as_mut(), &waker).is_pending());
    let Poll::Ready(Err(BuildError::Failed(mine))) = poll_once(builder.as_mut(), &waker) else {
        panic!("the builder's own error")
    };
    let Poll::Ready(Err(BuildError::Failed(shared))) = poll_once(waiter.as_mut(), &waker) else {
        panic!("the waiter shares the attempt's error")
    };
    assert!(Arc::ptr_eq(&mine, &shared));
    assert_eq!(*shared, "no kernel for this shape");
    assert!(cache.get(&9).is_none(), "a failure is not cached");
}

#[test]
fn a_build_future_awaiting_its_own_key_gets_a_recursion_error_with_the_key() {
    let cache = Arc::new(Cache::<String, u64>::new(10));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let inner = rt.block_on({
        let cache = Arc::clone(&cache);
        async move {
            let c = Arc::clone(&cache);
            let mut inner = None;
            let v = cache
                .get_or_insert_with_async("shape".to_string(), async {
                    tokio::task::yield_now().await;
                    let r = c
                        .get_or_insert_with_async("shape".to_string(), async { 1 })
                        .await;
                    inner = Some(r.map(|h| *h));
                    2
                })
                .await
                .unwrap();
            assert_eq!(*v, 2, "the outer build goes on and is cached");
            inner.unwrap()
        }
    });
    let err = inner.unwrap_err();
    assert_eq!(err.key, "shape");
    assert!(err.to_string().contains("building"), "{err}");
    assert_eq!(cache.get("shape").as_deref(), Some(&2));
    // A different key from inside a build is no recursion.
    let v = rt.block_on(cache.get_or_insert_with_async("a".into(), async {
        *cache
            .get_or_insert_with_async("b".into(), async { 5 })
            .await
            .unwrap()
            + 1
    }));
    assert_eq!(*v.unwrap(), 6);
}

#[test]
fn a_task_asking_for_the_key_its_blocking_builder_builds_gets_a_recursion_error() {
    let cache = Cache::<u64, u64>::new(10);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let v = cache.get_or_insert_with(4, || {
        let r = rt.block_on(cache.get_or_insert_with_async(4, async { 1 }));
        assert_eq!(r.unwrap_err().into_key(), 4);
        40
    });
    assert_eq!(*v, 40);
}

/// A key whose `Hash` panics: the panic reaches the caller, and the cache is unharmed.
#[test]
fn a_key_whose_hash_panics_leaves_the_cache_unharmed() {
    #[derive(PartialEq, Eq)]
    struct Bad(u64);
    impl Hash for Bad {
        fn hash<H: Hasher>(&self, h: &mut H) {
            if self.0 == 13 {
                panic!("unlucky key");
            }
            self.0.hash(h);
        }
    }
    let cache = Cache::<Bad, u64>::new(10);
    let (_, waker) = counting();
    let mut f = pin!(cache.get_or_insert_with_async(Bad(13), async { 1 }));
    let r = catch_unwind(AssertUnwindSafe(|| poll_once(f.as_mut(), &waker)));
    assert!(r.is_err());
    let mut g = pin!(cache.get_or_insert_with_async(Bad(12), async { 12 }));
    let Poll::Ready(v) = poll_once(g.as_mut(), &waker) else {
        panic!("a build with no await finishes in one poll")
    };
    assert_eq!(*v.unwrap(), 12);
    assert_eq!(cache.len(), 1);
    cache.__validate().unwrap();
}

/// A thread waits on a build a task runs, and a task waits on a build a thread runs.
#[test]
fn threads_and_tasks_wait_on_each_others_builds() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let cache = Arc::new(Cache::<u64, u64>::new(100));
    let builds = Arc::new(AtomicUsize::new(0));
    for key in 0..20u64 {
        let start = Arc::new(Barrier::new(3));
        let task = {
            let (cache, builds, start) = (cache.clone(), builds.clone(), start.clone());
            rt.spawn(async move {
                start.wait();
                let v = cache
                    .get_or_insert_with_async(key, async {
                        builds.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        key * 10
                    })
                    .await
                    .unwrap();
                *v
            })
        };
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (cache, builds, start) = (cache.clone(), builds.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    *cache.get_or_insert_with(key, || {
                        builds.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(2));
                        key * 10
                    })
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), key * 10);
        }
        assert_eq!(rt.block_on(task).unwrap(), key * 10);
    }
    assert_eq!(builds.load(Ordering::SeqCst), 20, "one build per key");
}

#[test]
fn the_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let cache = Cache::<String, Vec<u8>>::new(10);
    let f = cache.get_or_insert_with_async("k".into(), async { vec![1] });
    send(&f);
    let g = cache.try_get_or_insert_with_async("k".into(), async { Ok::<_, String>(vec![]) });
    send(&g);
}

#[test]
fn a_cache_of_capacity_zero_builds_and_hands_the_value_back_uncached() {
    let cache = Cache::<u64, u64>::new(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let f = rt
        .block_on(cache.get_or_build_async::<(), _>(1, async { Ok(5) }))
        .unwrap();
    assert_eq!((*f.value, f.source), (5, Source::Uncached));
    assert!(cache.is_empty());
}

/// The layers' async forms: the multi-cache, the grouped cache, the constant caches and the
/// pool manager's reservation.
mod layers {
    use super::*;
    use runcache::constant::{AddError, ConstantCache, ConstantKey};
    use runcache::grouped::{GroupedCache, OwnerId};
    use runcache::multi::MultiCache;
    use runcache::pool::{PoolManager, WhenExhausted};
    use runcache::{ConstantBuffer, DeviceKind, Lookup, PoolError};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn the_multi_cache_builds_once_per_key_for_a_storm_of_tasks() {
        let cache = Arc::new(MultiCache::new(100));
        let builds = Arc::new(AtomicUsize::new(0));
        let looks = runtime().block_on(async {
            let tasks: Vec<_> = (0..200)
                .map(|_| {
                    let (cache, builds) = (cache.clone(), builds.clone());
                    tokio::spawn(async move {
                        let (v, how) = cache
                            .get_or_create_async(&"conv".to_string(), async {
                                builds.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                3u32
                            })
                            .await
                            .unwrap();
                        assert_eq!(*v, 3);
                        how
                    })
                })
                .collect();
            let mut misses = 0;
            for t in tasks {
                misses += usize::from(t.await.unwrap() == Lookup::Miss);
            }
            misses
        });
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert_eq!(looks, 1, "one caller built, the others found or shared it");
        let r = runtime()
            .block_on(cache.try_get_or_create_async::<u8, u8, &str, _>(&1, async { Err("no") }));
        assert!(matches!(r, Err(BuildError::Failed(e)) if *e == "no"));
    }

    #[test]
    fn the_grouped_cache_records_an_async_build_in_its_group_and_owner() {
        let cache = GroupedCache::<u32, u32, String, u64>::new(2);
        let rt = runtime();
        let v = rt
            .block_on(cache.owner(OwnerId(9)).get_or_insert_with_async(
                &1,
                &10,
                &"w".to_string(),
                async { 5 },
            ))
            .unwrap();
        assert_eq!(*v, 5);
        assert_eq!(cache.group_count(&1), 1);
        let again = rt
            .block_on(
                cache.get_or_insert_with_async(&1, &10, &"w".to_string(), async {
                    unreachable!("a hit polls no build")
                }),
            )
            .unwrap();
        assert!(Handle::ptr_eq(&v, &again));
        cache.clear_owner(OwnerId(9));
        assert!(
            cache.get(&1, &10, "w").is_none(),
            "the owner's entry went with it"
        );
    }

    #[test]
    fn a_constant_cache_adds_asynchronously_and_reports_recursion_by_key() {
        let cache = Arc::new(ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20));
        let rt = runtime();
        let key = ConstantKey::new(1, 2);
        let added = rt
            .block_on(cache.get_or_add_async(key, 256, async { ConstantBuffer::host(256) }))
            .unwrap();
        assert_eq!(added.source, Source::Cached);
        assert_eq!(cache.size(), 256);
        let bad = rt.block_on(cache.get_or_add_async(ConstantKey::new(1, 3), 128, async {
            ConstantBuffer::host(64)
        }));
        let bad = bad.map(|a| a.source).unwrap_err();
        assert!(matches!(
            &*bad,
            AddError::SizeMismatch { declared: 128, .. }
        ));
        let key = ConstantKey::new(1, 4);
        let inner = rt.block_on({
            let cache = cache.clone();
            async move {
                let c = cache.clone();
                let mut inner = None;
                cache
                    .get_or_add_async(key, 64, async {
                        inner = Some(
                            c.get_or_add_async(key, 64, async { ConstantBuffer::host(64) })
                                .await
                                .map(|a| a.source),
                        );
                        ConstantBuffer::host(64)
                    })
                    .await
                    .unwrap();
                inner.unwrap()
            }
        });
        let err = inner.unwrap_err();
        assert!(matches!(&*err, AddError::Recursion { key: k } if *k == key));
        assert!(err.to_string().contains("itself"), "{err}");
    }

    #[test]
    fn a_task_waits_for_a_pool_in_the_same_queue_as_threads() {
        let pools = PoolManager::builder(|| vec![0u8; 16])
            .max_pools(1)
            .build()
            .unwrap();
        let held = pools.reserve().unwrap();
        let (wakes, waker) = counting();
        let mut first = Box::pin(pools.reserve_async());
        assert!(poll_once(first.as_mut(), &waker).is_pending());
        let mut second = Box::pin(pools.reserve_async());
        assert!(poll_once(second.as_mut(), &waker).is_pending());
        assert_eq!(pools.stats().waits, 2);
        drop(held);
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "one pool wakes one waiter"
        );
        // The first waiter goes away without taking the pool it was woken for: the wake
        // passes to the second.
        drop(first);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
        let Poll::Ready(Ok(guard)) = poll_once(second.as_mut(), &waker) else {
            panic!("the second waiter gets the pool")
        };
        assert_eq!(guard.len(), 16);
        drop(guard);
        let failing = PoolManager::builder(|| 0u8)
            .max_pools(1)
            .when_exhausted(WhenExhausted::Fail)
            .build()
            .unwrap();
        let _only = failing.reserve().unwrap();
        let r = runtime().block_on(failing.reserve_async());
        assert!(matches!(r, Err(PoolError::Exhausted { max_pools: 1 })));
    }

    #[test]
    fn tasks_and_threads_share_one_pool_without_losing_a_wake() {
        let pools = Arc::new(PoolManager::builder(|| 0u64).max_pools(1).build().unwrap());
        let rt = runtime();
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let pools = pools.clone();
                rt.spawn(async move {
                    for _ in 0..100 {
                        let mut p = pools.reserve_async().await.unwrap();
                        *p += 1;
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let pools = pools.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        *pools.reserve().unwrap() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        rt.block_on(async {
            for t in tasks {
                t.await.unwrap();
            }
        });
        assert_eq!(
            *pools.reserve().unwrap(),
            1000,
            "every reservation used the one pool"
        );
    }
}
