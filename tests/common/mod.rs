//! Helpers shared by the integration tests.
#![allow(dead_code)]

use runcache::{AllocError, BufferAllocator, Cache, DeviceKind, HostAllocator};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once};

/// Shard counts every configuration-sensitive test runs with.
pub const SHARDS: [usize; 3] = [1, 4, 64];

/// Runs `test` on a fresh cache for each shard count.
pub fn with_caches<K, V>(capacity: u64, mut test: impl FnMut(Cache<K, V>))
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    for shards in SHARDS {
        let cache = Cache::<K, V>::builder()
            .capacity(capacity)
            .shards(shards)
            .build()
            .expect("valid shard count");
        test(cache);
    }
}

/// The payload of every panic a test raises on purpose (`std::panic::panic_any(PLANNED)`).
pub const PLANNED: &str = "planned panic: a test injects it on purpose";

/// Silences the panics whose payload is [`PLANNED`], and only those, for the whole test
/// binary. Installed once: tests run in parallel, and a hook that one of them put back would
/// unmute the others.
pub fn silence_planned_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&PLANNED) {
                previous(info);
            }
        }));
    });
}

/// A value that counts its drops.
#[derive(Debug)]
pub struct Tracked {
    pub id: u64,
    drops: Arc<AtomicUsize>,
}

impl Tracked {
    pub fn new(id: u64, drops: &Arc<AtomicUsize>) -> Self {
        Self {
            id,
            drops: Arc::clone(drops),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

pub fn drops() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// A host-memory allocator for tests that reports `device`, counts the bytes it has out,
/// refuses a request that would take it past `limit`, and fails about one request in
/// `fail_one_in` (0: never) at pseudo-random points.
#[derive(Debug)]
pub struct TestAllocator {
    pub device: DeviceKind,
    pub limit: usize,
    pub fail_one_in: u64,
    pub live: AtomicUsize,
    pub failed: AtomicU64,
    pub calls: AtomicU64,
}

impl TestAllocator {
    pub fn new(device: DeviceKind) -> Self {
        Self {
            device,
            limit: usize::MAX,
            fail_one_in: 0,
            live: AtomicUsize::new(0),
            failed: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        }
    }
}

// SAFETY: delegates to `HostAllocator` with the same arguments; a refusal allocates nothing.
unsafe impl BufferAllocator for TestAllocator {
    fn device(&self) -> DeviceKind {
        self.device
    }
    fn host_accessible(&self) -> bool {
        self.device == DeviceKind::Cpu
    }
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let unlucky =
            self.fail_one_in > 0 && n.wrapping_mul(0x9E37_79B9_7F4A_7C15) % self.fail_one_in == 0;
        if unlucky || self.live.load(Ordering::SeqCst).saturating_add(size) > self.limit {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(AllocError::OutOfMemory {
                device: self.device,
                size,
                align,
            });
        }
        let p = HostAllocator.allocate(size, align)?;
        self.live.fetch_add(size, Ordering::SeqCst);
        Ok(p)
    }
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        self.live.fetch_sub(size, Ordering::SeqCst);
        // SAFETY: forwarded from our own caller's contract.
        unsafe { HostAllocator.deallocate(ptr, size, align) };
    }
}

/// Runs `work(thread index)` on `n` threads and joins each one fully. Unlike
/// `thread::scope`, whose scope can end while a thread is still destroying its thread-locals,
/// `JoinHandle::join` returns only after that, and a thread's epoch handles are thread-locals:
/// values the thread retired reach their cache's collector when it exits. A worker's panic
/// fails the caller.
pub fn on_threads(n: usize, work: impl Fn(usize) + Send + Sync + 'static) {
    let work = Arc::new(work);
    let handles: Vec<_> = (0..n)
        .map(|t| {
            let work = Arc::clone(&work);
            std::thread::spawn(move || work(t))
        })
        .collect();
    for h in handles {
        h.join().expect("a worker thread panicked");
    }
}

/// A thread that has run its work and stays alive and idle, as a worker of a long-lived pool
/// does, until [`finish`](Self::finish) lets it end. Its thread-locals (epoch registrations
/// included) live as long as it does.
pub struct IdleWorker {
    go: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl IdleWorker {
    /// Runs `work` on a new thread and returns once it is done; the thread then waits.
    pub fn after(work: impl FnOnce() + Send + 'static) -> Self {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            work();
            done_tx.send(()).expect("the test waits for the work");
            let _ = go_rx.recv();
        });
        done_rx.recv().expect("the worker's work panicked");
        Self { go, thread }
    }

    /// Lets the thread end, and joins it.
    pub fn finish(self) {
        let _ = self.go.send(());
        self.thread.join().expect("the worker panicked");
    }
}

/// A deterministic xorshift sequence (never 0), for streams a test must replay exactly.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}
