//! The one place that switches between `std` and [loom] primitives.
//!
//! Every atomic, every `Arc` and every park/wake in the crate is imported from here, so that
//! building with `RUSTFLAGS="--cfg runcache_loom"` turns the slot protocol and the weight
//! accounting into loom models without touching their code.
//!
//! * `wait`/`wake_all` are futex operations ([`atomic_wait`]) on a slot's state word. loom does
//!   not model futexes, so under `runcache_loom` they become a loom `Mutex` + `Condvar` that
//!   re-checks the word under the lock: the only lock in the crate, and it exists only in the
//!   model.
//! * Thread-locals (the per-thread epoch handles) are loom's under the cfg, so each modelled
//!   thread registers with the cache's collector as a real thread would.
//! * [`AtomicPair`] packs the weighted size and the capacity into one 128-bit word so that the
//!   check `size + weight <= capacity` and the update happen in one compare-and-swap. On x86_64
//!   this is `cmpxchg16b` (detected at run time by `portable-atomic`); under loom it is a loom
//!   mutex around the pair, which models exactly the same linearizable operations.

#[cfg(not(runcache_loom))]
mod imp {
    pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
    pub(crate) use std::thread::yield_now;

    /// Declares a thread-local (std's here, loom's in the model).
    macro_rules! local_key {
        ($($t:tt)*) => { std::thread_local!($($t)*); };
    }
    pub(crate) use local_key;

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

    /// Two `u64` halves (`lo`, `hi`) updated together by one atomic operation.
    pub(crate) struct AtomicPair(portable_atomic::AtomicU128);

    impl AtomicPair {
        pub(crate) fn new(lo: u64, hi: u64) -> Self {
            Self(portable_atomic::AtomicU128::new(pack(lo, hi)))
        }

        #[inline]
        pub(crate) fn load(&self) -> (u64, u64) {
            // Relaxed: the pair protects no other memory; its invariant lives in the word.
            unpack(self.0.load(core::sync::atomic::Ordering::Relaxed))
        }

        /// Replaces `current` with `new` if the pair still equals `current`.
        #[inline]
        pub(crate) fn compare_exchange(
            &self,
            current: (u64, u64),
            new: (u64, u64),
        ) -> Result<(), (u64, u64)> {
            // Relaxed: see `load`.
            self.0
                .compare_exchange_weak(
                    pack(current.0, current.1),
                    pack(new.0, new.1),
                    core::sync::atomic::Ordering::Relaxed,
                    core::sync::atomic::Ordering::Relaxed,
                )
                .map(|_| ())
                .map_err(unpack)
        }

        /// Whether the pair is updated without any lock on this machine.
        #[cfg(test)]
        pub(crate) fn is_lock_free() -> bool {
            portable_atomic::AtomicU128::is_lock_free()
        }
    }

    fn pack(lo: u64, hi: u64) -> u128 {
        u128::from(lo) | (u128::from(hi) << 64)
    }

    fn unpack(v: u128) -> (u64, u64) {
        (v as u64, (v >> 64) as u64)
    }
}

#[cfg(runcache_loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
    use loom::sync::{Condvar, Mutex};
    pub(crate) use loom::thread::yield_now;

    /// Declares a thread-local that loom gives each modelled thread its own copy of.
    macro_rules! local_key {
        ($($t:tt)*) => { loom::thread_local!($($t)*); };
    }
    pub(crate) use local_key;

    loom::lazy_static! {
        static ref PARKING: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }

    /// Model of a futex wait: re-checks the word under the lock, then sleeps on the condvar.
    pub(crate) fn wait(atomic: &AtomicU32, expected: u32) {
        let (lock, cvar) = &*PARKING;
        let mut held = lock.lock().unwrap();
        // Acquire: pairs with the Release swap that changed the word before `wake_all`.
        while atomic.load(core::sync::atomic::Ordering::Acquire) == expected {
            held = cvar.wait(held).unwrap();
        }
    }

    /// Model of a futex wake: taking the lock orders it after any waiter's re-check.
    pub(crate) fn wake_all(_atomic: &AtomicU32) {
        let (lock, cvar) = &*PARKING;
        let _held = lock.lock().unwrap();
        cvar.notify_all();
    }

    /// Model of the 128-bit pair: each operation is one critical section, which is exactly
    /// the linearizable behaviour of the `cmpxchg16b` version.
    pub(crate) struct AtomicPair(Mutex<(u64, u64)>);

    impl AtomicPair {
        pub(crate) fn new(lo: u64, hi: u64) -> Self {
            Self(Mutex::new((lo, hi)))
        }

        pub(crate) fn load(&self) -> (u64, u64) {
            *self.0.lock().unwrap()
        }

        pub(crate) fn compare_exchange(
            &self,
            current: (u64, u64),
            new: (u64, u64),
        ) -> Result<(), (u64, u64)> {
            let mut held = self.0.lock().unwrap();
            if *held == current {
                *held = new;
                Ok(())
            } else {
                Err(*held)
            }
        }
    }
}

pub(crate) use imp::*;
pub(crate) use std::sync::atomic::Ordering;
