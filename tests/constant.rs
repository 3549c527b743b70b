//! The constant tensor caches: promise semantics, byte budgets, LRU shrinks, pinned bytes,
//! allocators, and the capacity configuration parser.

mod common;

use common::{IdleWorker, TestAllocator};
use proptest::prelude::*;
use runcache::constant::{
    parse_capacity_config, AddError, CapacityConfig, ConstantCache, ConstantKey, MAX_CAPACITY_MB,
};
use runcache::{AllocError, BufferAllocator, ConstantBuffer, DeviceKind, HostAllocator, Source};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn key(k: u64) -> ConstantKey {
    ConstantKey::new(1, k)
}

fn filled(size: usize, byte: u8) -> Result<ConstantBuffer, AllocError> {
    let mut b = ConstantBuffer::host(size)?;
    b.as_mut_slice().expect("host memory").fill(byte);
    Ok(b)
}

#[test]
fn the_default_capacity_is_zero_and_builds_are_returned_uncached() {
    let c = ConstantCache::new(DeviceKind::Cpu);
    assert_eq!(c.capacity(), 0);
    let a = c.get_or_add(key(1), 100, || filled(100, 1)).unwrap();
    assert_eq!(a.source, Source::Uncached);
    assert_eq!(a.buffer.as_slice().unwrap()[99], 1);
    assert_eq!(
        (c.size(), c.pinned_bytes(), c.rejected_bytes()),
        (0, 100, 100)
    );
    drop(a);
    assert_eq!(
        c.pinned_bytes(),
        0,
        "an uncached buffer stops counting when dropped"
    );
}

#[test]
fn hit_cached_and_uncached_are_reported() {
    let c = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1000);
    assert_eq!(
        c.get_or_add(key(1), 600, || filled(600, 1)).unwrap().source,
        Source::Cached
    );
    assert_eq!(
        c.get_or_add(key(1), 600, || filled(600, 9)).unwrap().source,
        Source::Hit
    );
    let big = c.get_or_add(key(2), 600, || filled(600, 2)).unwrap();
    assert_eq!(
        big.source,
        Source::Uncached,
        "600 + 600 > 1000: rejected, not evicted"
    );
    assert_eq!(c.size(), 600);
    assert!(c.get(key(1)).is_some() && c.get(key(2)).is_none());
}

#[test]
fn concurrent_callers_share_one_build() {
    let c = Arc::new(ConstantCache::with_capacity_bytes(DeviceKind::Cpu, MIB));
    let builds = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (c, builds, barrier) = (c.clone(), builds.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                c.get_or_add(key(7), 4096, || {
                    builds.fetch_add(1, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(30));
                    filled(4096, 7)
                })
                .unwrap()
                .buffer
            })
        })
        .collect();
    let buffers: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    assert!(buffers
        .iter()
        .all(|b| runcache::Handle::ptr_eq(b, &buffers[0])));
    assert_eq!(c.size(), 4096);
}

#[test]
fn mixed_sizes_at_the_capacity_edge_never_exceed_it() {
    let cap = 64 * 1024;
    let c = Arc::new(ConstantCache::with_capacity_bytes(DeviceKind::Cpu, cap));
    // Every check reads size and capacity together; the capacity never changes here.
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let c = c.clone();
            thread::spawn(move || {
                for i in 0..300u64 {
                    let size = 1000 + ((t * 7919 + i * 104729) % 9000) as usize;
                    let k = key(t * 1000 + i % 50);
                    let _ = c.get_or_add(k, size, || filled(size, 0));
                    let (now, capacity) = c.size_and_capacity();
                    assert!(now <= capacity && capacity == cap, "{now} > {capacity}");
                    if i % 17 == 0 {
                        c.remove_if_exist(k);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(c.size() <= cap);
}

#[test]
fn shrinking_removes_least_recently_used_first_and_growing_keeps_all() {
    let c = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 10 * 1000);
    for k in 0..10 {
        c.get_or_add(key(k), 1000, || filled(1000, k as u8))
            .unwrap();
    }
    // Use 7, 8, 9 and then 0 again: the least recently used are now 1..=6.
    for k in [7, 8, 9, 0] {
        c.get(key(k)).unwrap();
    }
    c.set_capacity_bytes(20 * 1000).unwrap();
    assert_eq!(c.len(), 10, "growing keeps every entry");
    c.set_capacity_bytes(4 * 1000).unwrap();
    let mut kept: Vec<u64> = (0..10).filter(|k| c.get(key(*k)).is_some()).collect();
    kept.sort_unstable();
    assert_eq!(kept, vec![0, 7, 8, 9]);
    c.set_capacity_mb(0).unwrap();
    assert_eq!((c.len(), c.size()), (0, 0));
}

#[test]
fn held_buffers_survive_removal_and_count_as_pinned() {
    let c = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, MIB);
    let held = c.get_or_add(key(1), 512, || filled(512, 5)).unwrap().buffer;
    c.get_or_add(key(2), 256, || filled(256, 6)).unwrap();
    assert!(c.remove_if_exist(key(1)));
    assert!(!c.remove_if_exist(key(1)));
    c.clear();
    assert_eq!(c.size(), 0);
    assert_eq!(held.as_slice().unwrap()[0], 5, "the held buffer is intact");
    // Key 2 was dropped by the cache; only `held` is still alive. The unheld one may wait for
    // epoch reclamation, so allow it for a moment.
    assert!(c.pinned_bytes() >= 512);
    drop(held);
    for _ in 0..1000 {
        if c.pinned_bytes() == 0 {
            break;
        }
        c.get(key(99)); // pins and unpins, which advances reclamation
    }
    assert_eq!(c.pinned_bytes(), 0);
}

#[test]
fn pinned_bytes_return_to_zero_through_other_threads_calls_alone() {
    // A worker removes a buffer nobody holds while a reader on another thread is in the
    // middle of a lookup (it holds the epoch), so the removal's own `reclaim` cannot free it.
    // Then the worker idles, alive, and the reader lets go. The main thread's calls alone
    // (lookups of other keys) must bring `pinned_bytes` back to 0, within the bound of
    // `Cache::reclaim`'s docs (three threads registered: 384 x 2 calls).
    let c = Arc::new(ConstantCache::with_capacity_bytes(DeviceKind::Cpu, MIB));
    for k in 0..4 {
        c.get_or_add(key(k), 512, || filled(512, k as u8)).unwrap();
    }
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let reader = {
        let c = Arc::clone(&c);
        thread::spawn(move || {
            let hold = c.__hold_epoch();
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(hold);
        })
    };
    held_rx.recv().unwrap();
    let worker = {
        let c = Arc::clone(&c);
        IdleWorker::after(move || assert!(c.remove_if_exist(key(0))))
    };
    assert_eq!(
        c.pinned_bytes(),
        512,
        "the reader holds the epoch: nothing is freed yet"
    );
    release_tx.send(()).unwrap();
    reader.join().unwrap();
    const BOUND: usize = 384 * 2;
    let mut calls = 0;
    while c.pinned_bytes() > 0 && calls < 100 * BOUND {
        assert!(c.get(key(1 + calls as u64 % 3)).is_some());
        calls += 1;
    }
    assert_eq!(
        c.pinned_bytes(),
        0,
        "freed through the main thread's calls alone"
    );
    assert!(
        calls <= BOUND,
        "freed after {calls} calls, more than the bound {BOUND}"
    );
    worker.finish();
}

#[test]
fn a_failed_build_reaches_waiters_and_is_not_cached() {
    let c = Arc::new(ConstantCache::with_capacity_bytes(DeviceKind::Cpu, MIB));
    let barrier = Arc::new(Barrier::new(3));
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let (c, barrier) = (c.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                c.get_or_add(key(3), 64, || {
                    thread::sleep(Duration::from_millis(30));
                    Err::<ConstantBuffer, _>("reorder failed")
                })
            })
        })
        .collect();
    for h in handles {
        match &*h.join().unwrap().unwrap_err() {
            AddError::Build(e) => assert_eq!(*e, "reorder failed"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(c.get(key(3)).is_none());
    assert_eq!(c.size(), 0);
}

#[test]
fn a_buffer_of_the_wrong_size_is_refused_and_handed_back() {
    let c = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, MIB);
    let e = c.get_or_add(key(4), 100, || filled(128, 4)).unwrap_err();
    match &*e {
        AddError::SizeMismatch { declared, buffer } => {
            assert_eq!((*declared, buffer.size()), (100, 128));
            assert!(e.to_string().contains("128 bytes but 100"), "{e}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(c.size(), 0);
}

#[test]
fn plugged_allocators_free_through_themselves_and_report_oom() {
    let gpu = Arc::new(TestAllocator {
        limit: 10_000,
        ..TestAllocator::new(DeviceKind::Gpu)
    });
    let c = ConstantCache::with_capacity_bytes(DeviceKind::Gpu, MIB);
    let alloc: Arc<dyn BufferAllocator> = gpu.clone();
    let a = c
        .get_or_add(key(1), 4096, || {
            ConstantBuffer::new(alloc.clone(), 4096, 256)
        })
        .unwrap();
    assert_eq!(
        (a.buffer.device(), a.buffer.align()),
        (DeviceKind::Gpu, 256)
    );
    assert!(
        a.buffer.as_slice().is_none(),
        "device memory is not host-readable"
    );
    assert_eq!(a.buffer.as_ptr() as usize % 256, 0);
    let e = c
        .get_or_add(key(2), 8192, || {
            ConstantBuffer::new(alloc.clone(), 8192, 256)
        })
        .unwrap_err();
    assert!(matches!(
        &*e,
        AddError::Build(AllocError::OutOfMemory { size: 8192, .. })
    ));
    // A CPU buffer offered to the GPU cache is refused.
    let e = c.get_or_add(key(3), 64, || filled(64, 0)).unwrap_err();
    assert!(matches!(
        &*e,
        AddError::WrongDevice {
            expected: DeviceKind::Gpu,
            ..
        }
    ));
    drop(a);
    c.clear();
    drop(c);
    assert_eq!(gpu.live.load(Ordering::SeqCst), 0, "every buffer was freed");
}

#[test]
fn invalid_layouts_are_typed_errors() {
    assert_eq!(
        ConstantBuffer::new(Arc::new(HostAllocator), 10, 3).unwrap_err(),
        AllocError::InvalidLayout { size: 10, align: 3 }
    );
    assert!(ConstantBuffer::new(Arc::new(HostAllocator), usize::MAX, 64).is_err());
    let empty = ConstantBuffer::host(0).unwrap();
    assert_eq!(empty.as_slice().unwrap().len(), 0);
    assert_eq!(ConstantBuffer::host(1).unwrap().as_ptr() as usize % 64, 0);
}

#[test]
fn capacity_in_mib_saturates() {
    let c = ConstantCache::new(DeviceKind::Cpu);
    c.set_capacity_mb(u64::MAX).unwrap();
    assert_eq!(c.capacity(), u64::MAX);
    c.set_capacity_mb(3).unwrap();
    assert_eq!((c.capacity(), c.capacity_mb()), (3 * MIB, 3));
}

#[test]
fn keys_keep_every_bit_of_both_parts() {
    // oneDNN's `backend_key << 4 | backend_id` would make these two equal.
    let a = ConstantKey::new(1, 1 << 60);
    let b = ConstantKey::new(1, 1 << 61);
    let c = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, MIB);
    c.get_or_add(a, 8, || filled(8, 1)).unwrap();
    assert_eq!(
        c.get_or_add(b, 8, || filled(8, 2)).unwrap().source,
        Source::Cached
    );
    assert_eq!(c.len(), 2);
}

proptest! {
    #[test]
    fn valid_configurations_round_trip(cpu in proptest::option::of(0..=MAX_CAPACITY_MB),
                                       gpu in proptest::option::of(0..=MAX_CAPACITY_MB)) {
        prop_assume!(cpu.is_some() || gpu.is_some());
        let mut config = CapacityConfig::default();
        if let Some(mb) = cpu { config.set(DeviceKind::Cpu, mb); }
        if let Some(mb) = gpu { config.set(DeviceKind::Gpu, mb); }
        let text = config.to_string();
        prop_assert_eq!(parse_capacity_config(&text).into_result(), Ok(config));
    }

    #[test]
    fn arbitrary_strings_never_panic_and_errors_point_inside(s in ".{0,40}") {
        let parsed = parse_capacity_config(&s);
        for e in &parsed.errors {
            prop_assert!(e.position <= s.len());
            prop_assert!(s[e.position..].starts_with(e.token.as_str()));
        }
    }
}

#[test]
fn capacity_changes_while_other_threads_read_and_build() {
    let c = Arc::new(ConstantCache::with_capacity_bytes(
        DeviceKind::Cpu,
        64 * 1024,
    ));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ops = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..3u64)
        .map(|t| {
            let (c, stop, ops) = (c.clone(), stop.clone(), ops.clone());
            thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = key((t * 31 + i) % 40);
                    let a = c.get_or_add(k, 2048, || filled(2048, k.key as u8)).unwrap();
                    assert_eq!(a.buffer.as_slice().unwrap()[2047], k.key as u8);
                    let (size, capacity) = c.size_and_capacity();
                    assert!(size <= capacity, "size {size} above capacity {capacity}");
                    ops.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    // Shrink and grow while the readers work: start once they run, stop once they have done
    // plenty under the changing capacity.
    while ops.load(Ordering::Relaxed) < 100 {
        thread::yield_now();
    }
    let mut round = 0u64;
    while round < 2000 || ops.load(Ordering::Relaxed) < 5000 {
        let bytes = [64 * 1024, 8 * 1024, 0, 32 * 1024][(round % 4) as usize];
        c.set_capacity_bytes(bytes).unwrap();
        // The shrink has finished: what is cached fits the new capacity.
        let (size, capacity) = c.size_and_capacity();
        assert!(
            size <= capacity && capacity <= bytes.max(size),
            "{size} {capacity} {bytes}"
        );
        round += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    c.set_capacity_bytes(8 * 1024).unwrap();
    assert!(c.size() <= 8 * 1024);
    assert!(
        c.stats().evictions > 0,
        "the shrinks removed entries: {:?}",
        c.stats()
    );
}

/// Two models' weights under one budget with an idle time: the one the requests use keeps its
/// bytes, the idle one gives them back (a held buffer stays alive, counted as pinned).
#[test]
fn an_idle_models_weights_give_their_bytes_back() {
    use runcache::Clock;
    const MIN: Duration = Duration::from_secs(60);
    let (clock, hand) = Clock::manual();
    let c = ConstantCache::builder(DeviceKind::Cpu)
        .capacity_mb(1)
        .evicting()
        .time_to_idle(10 * MIN)
        .clock(clock)
        .build();
    let (busy, idle) = (|l| ConstantKey::new(1, l), |l| ConstantKey::new(2, l));
    for layer in 0..4 {
        c.get_or_add(busy(layer), 4096, || filled(4096, 1)).unwrap();
        c.get_or_add(idle(layer), 8192, || filled(8192, 2)).unwrap();
    }
    let held = c.get(idle(0)).expect("cached");
    for _ in 0..3 {
        hand.advance(4 * MIN);
        for layer in 0..4 {
            let hit = c.get_or_add(busy(layer), 4096, || filled(4096, 0)).unwrap();
            assert_eq!(hit.source, Source::Hit, "within its idle time");
        }
    }
    // 12 minutes: the idle model's weights read as gone before anything took them out.
    assert!(c.get(idle(1)).is_none());
    assert_eq!(c.size(), 4 * 4096 + 4 * 8192, "not yet taken out");
    assert_eq!(c.purge_expired(), 4);
    assert_eq!((c.len(), c.size()), (4, 4 * 4096));
    assert_eq!(c.pinned_bytes(), 8192, "the held buffer, outside the cache");
    assert_eq!(held.as_slice().unwrap()[0], 2);
    drop(held);
    assert_eq!(c.pinned_bytes(), 0);
    assert_eq!(c.stats().expirations, 4);
    // Asked for again, it is built again.
    let again = c.get_or_add(idle(0), 8192, || filled(8192, 3)).unwrap();
    assert_eq!(
        (again.source, again.buffer.as_slice().unwrap()[0]),
        (Source::Cached, 3)
    );
}

/// Builds take expired buffers out as they go, without a purge; an idle time of zero makes
/// every lookup a build, with the budget exact throughout.
#[test]
fn builds_take_idle_buffers_out_and_a_zero_idle_time_caches_nothing_for_long() {
    use runcache::Clock;
    let (clock, hand) = Clock::manual();
    let c = ConstantCache::builder(DeviceKind::Cpu)
        .capacity_bytes(64 << 10)
        .time_to_idle(Duration::from_secs(1))
        .clock(clock)
        .build();
    for k in 0..16 {
        c.get_or_add(key(k), 4096, || filled(4096, 1)).unwrap();
    }
    hand.advance(Duration::from_secs(1));
    // A rejecting cache that is full: the expired buffers must leave for this one to fit.
    let added = c.get_or_add(key(100), 4096, || filled(4096, 1)).unwrap();
    assert_eq!(
        added.source,
        Source::Cached,
        "the build's step made the room"
    );
    assert_eq!((c.len(), c.size()), (1, 4096));

    let builds = AtomicUsize::new(0);
    let zero = ConstantCache::builder(DeviceKind::Cpu)
        .capacity_bytes(8192)
        .time_to_idle(Duration::ZERO)
        .build();
    for _ in 0..10 {
        zero.get_or_add(key(1), 4096, || {
            builds.fetch_add(1, Ordering::Relaxed);
            filled(4096, 1)
        })
        .unwrap();
        assert!(zero.size() <= 8192);
    }
    assert_eq!(
        builds.load(Ordering::Relaxed),
        10,
        "each lookup builds anew"
    );
    zero.purge_expired();
    assert_eq!((zero.len(), zero.size(), zero.pinned_bytes()), (0, 0, 0));
}
