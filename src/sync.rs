//! The one place that switches between `std` and [loom](https://docs.rs/loom) primitives.
//!
//! Every atomic, every `Arc` and every park/wake in the crate is imported from here, so that
//! building with `RUSTFLAGS="--cfg runcache_loom"` turns the slot protocol and the weight
//! accounting into loom models without touching their code.
//!
//! * `wait`/`wake_all` are futex operations ([`atomic_wait`]) on a slot's state word. loom does
//!   not model futexes, so under `runcache_loom` a wait re-checks the word and yields (see the
//!   loom `wait` for why not a mutex and condvar).
//! * [`UnsafeCell`] holds data that loom must check every read of for a happens-before edge
//!   to its writer: a node's weight (read by whoever takes the node's value, so publishing a
//!   value with `Relaxed` instead of `Release` fails the models with a causality violation)
//!   and a pool's contents.
//! * Thread-locals (the per-thread epoch handles) are loom's under the cfg, so each modelled
//!   thread registers with the cache's collector as a real thread would.
//! * [`SetOnce`] publishes a value once (the eviction policy's sketch and ghost) through a
//!   flag loom sees; the value sits in a `std::sync::OnceLock` that only the one claimer
//!   sets, so nobody ever waits on it.
//! * [`Queue`] is crossbeam's lock-free `SegQueue`, whose atomics loom cannot see (crossbeam-queue
//!   has no loom build); under loom it is a loom mutex around a `VecDeque`, the same
//!   linearizable queue with the happens-before edges a push and its pop make, so the eviction
//!   policy's queues and the pool waiters' protocol are checked against a queue loom can see.
//!   This mutex exists only in the model; outside it the only locks in the crate are the
//!   Vulkan layer's, on its cold paths (driver objects that Vulkan requires to be externally
//!   synchronized; see `docs/DESIGN.md`).

#![forbid(unsafe_code)]

#[cfg(not(runcache_loom))]
mod imp {
    pub(crate) use std::sync::atomic::fence;
    pub(crate) use std::sync::atomic::{
        AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    };
    pub(crate) use std::thread::{self as thread, yield_now, LocalKey};

    /// Declares a thread-local (std's here, loom's in the model).
    macro_rules! local_key {
        ($($t:tt)*) => { std::thread_local!($($t)*); };
    }
    pub(crate) use local_key;

    /// `std::cell::UnsafeCell` with loom's `with_mut` API, so code that uses it is observed by
    /// loom under the model cfg.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) fn new(data: T) -> Self {
            Self(std::cell::UnsafeCell::new(data))
        }

        #[inline]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// Parks the calling thread while `atomic` holds `expected` (spurious wake-ups allowed).
    #[inline]
    pub(crate) fn wait(atomic: &AtomicU32, expected: u32) {
        atomic_wait::wait(atomic, expected);
    }

    /// Wakes every thread parked on `atomic`.
    #[inline]
    pub(crate) fn wake_all(atomic: &AtomicU32) {
        atomic_wait::wake_all(atomic);
    }

    /// Parks the calling thread until it is unparked or `timeout` passes (or spuriously).
    pub(crate) fn park_timeout(timeout: std::time::Duration) {
        std::thread::park_timeout(timeout);
    }

    /// Parks the calling thread until it is unparked (or spuriously).
    pub(crate) fn park() {
        std::thread::park();
    }

    /// A lock-free multi-producer multi-consumer FIFO queue.
    pub(crate) struct Queue<T>(crossbeam_queue::SegQueue<T>);

    impl<T> Queue<T> {
        pub(crate) fn new() -> Self {
            Self(crossbeam_queue::SegQueue::new())
        }

        pub(crate) fn push(&self, value: T) {
            self.0.push(value);
        }

        pub(crate) fn pop(&self) -> Option<T> {
            self.0.pop()
        }

        pub(crate) fn is_empty(&self) -> bool {
            self.0.is_empty()
        }

        pub(crate) fn len(&self) -> usize {
            self.0.len()
        }
    }
}

#[cfg(runcache_loom)]
mod imp {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::fence;
    pub(crate) use loom::sync::atomic::{
        AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    };
    use loom::sync::Mutex;
    pub(crate) use loom::thread::{self as thread, yield_now, LocalKey};

    /// Declares a thread-local that loom gives each modelled thread its own copy of.
    macro_rules! local_key {
        ($($t:tt)*) => { loom::thread_local!($($t)*); };
    }
    pub(crate) use local_key;

    /// Model of a futex wait: one re-check, then a yield (callers loop, as with a futex's
    /// spurious wake-ups).
    ///
    /// Not a loom `Mutex` + `Condvar`: loom runs its threads on one OS thread, so a builder
    /// that panics and wakes its waiters while unwinding poisons loom's own mutex. The models
    /// have two threads, where a yielding wait stays cheap; a waiter that is never woken
    /// spins until loom's branch limit fails the model, so a hang is still a failure.
    pub(crate) fn wait(atomic: &AtomicU32, expected: u32) {
        // Acquire: pairs with the Release swap that changed the word before `wake_all`.
        if atomic.load(core::sync::atomic::Ordering::Acquire) == expected {
            loom::thread::yield_now();
        }
    }

    /// Model of a futex wake: waiters re-check the word themselves (see `wait`).
    pub(crate) fn wake_all(_atomic: &AtomicU32) {}

    /// Model of a timed park: loom has no clock, so a timed park is a yield and the caller's
    /// loop re-checks (timeouts themselves are not modelled).
    pub(crate) fn park_timeout(_timeout: std::time::Duration) {
        loom::thread::yield_now();
    }

    /// loom's own park: a model in which every thread is parked fails as a deadlock, so a
    /// lost wake-up is found rather than waited out.
    pub(crate) fn park() {
        loom::thread::park();
    }

    /// Model of the lock-free queue: each operation is one critical section, the
    /// linearizable behaviour of `SegQueue`, with the edge from a push to its pop that loom
    /// cannot see inside crossbeam-queue.
    pub(crate) struct Queue<T>(Mutex<std::collections::VecDeque<T>>);

    impl<T> Queue<T> {
        pub(crate) fn new() -> Self {
            Self(Mutex::new(std::collections::VecDeque::new()))
        }

        pub(crate) fn push(&self, value: T) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back(value);
        }

        pub(crate) fn pop(&self) -> Option<T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
        }

        pub(crate) fn is_empty(&self) -> bool {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
        }

        pub(crate) fn len(&self) -> usize {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
        }
    }
}

pub(crate) use imp::*;
pub(crate) use std::sync::atomic::Ordering;

/// A value published once, by one thread, and read without waiting by every other: a
/// `std::sync::OnceLock` that only the caller holding the claim sets (so its `set` never
/// meets another initializer and never blocks), behind a flag loom can see, so the models
/// check the happens-before edge from the write of the value to its readers. Before the
/// value is published, readers see `None` and go on without it; nobody waits for the
/// claimer.
pub(crate) struct SetOnce<T> {
    claimed: AtomicBool,
    ready: AtomicBool,
    value: std::sync::OnceLock<T>,
}

impl<T> SetOnce<T> {
    pub(crate) fn new() -> Self {
        Self {
            claimed: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            value: std::sync::OnceLock::new(),
        }
    }

    /// Whether the calling thread is the one that publishes: `true` for exactly one call.
    pub(crate) fn claim(&self) -> bool {
        // Relaxed: the swap's atomicity alone elects the publisher; the value's visibility
        // is `ready`'s business.
        !self.claimed.swap(true, Ordering::Relaxed)
    }

    /// Publishes `value`. Only the caller whose [`claim`](Self::claim) said `true` may call
    /// it (a second call would keep the first value and drop `value`).
    pub(crate) fn publish(&self, value: T) {
        if self.value.set(value).is_ok() {
            // Release: pairs with the Acquire in `get`, so a reader that sees the flag sees
            // the value's contents.
            self.ready.store(true, Ordering::Release);
        }
    }

    /// The value, once published.
    #[inline]
    pub(crate) fn get(&self) -> Option<&T> {
        // Acquire: pairs with the Release in `publish`.
        if self.ready.load(Ordering::Acquire) {
            self.value.get()
        } else {
            None
        }
    }
}

/// A pause where a preemption opens a window of a few instructions that matters (today: a
/// migration's copy, between reading the frozen slot and landing the copy, H6), taken in the
/// stress build (`--cfg runcache_stress`) so that the stress tests and the history checker
/// meet those interleavings often: a yield, and once in eight calls per thread a 300 µs
/// sleep. Elsewhere it compiles to nothing.
#[inline(always)]
pub(crate) fn stall() {
    #[cfg(all(runcache_stress, not(runcache_loom)))]
    {
        std::thread_local! {
            static STATE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
        }
        let pause = STATE.with(|s| {
            // A per-thread linear congruential sequence (every thread starts it alike).
            let x = match s.get() {
                0 => 0x12345,
                x => x,
            };
            let x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            s.set(x);
            (x >> 33) % 8 == 0
        });
        if pause {
            std::thread::sleep(std::time::Duration::from_micros(300));
        } else {
            std::thread::yield_now();
        }
    }
}
