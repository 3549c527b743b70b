//! The once-cell state word of an entry: `LOADING → READY | DEAD`.
//!
//! A slot is created `LOADING` by the one caller that builds its value, or directly `READY` by
//! `insert`. Callers that find it `LOADING` set the `WAITERS` bit and park on the word with a
//! futex; the builder's final `swap` clears the bit and, if it was set, wakes them all.
//!
//! The state word only ever moves forward (invariant **I4** in `raw/mod.rs`):
//!
//! ```text
//!   LOADING ──publish──▶ READY
//!      │
//!      └──fail / reject / panic──▶ DEAD
//! ```
//!
//! `WAITERS` is an independent bit that is set only while the state is `LOADING`.

#![forbid(unsafe_code)]

use crate::sync::{wait, wake_all, AtomicU32, Ordering};

/// Bit set by a caller that is about to park on a `LOADING` slot.
pub(crate) const WAITERS: u32 = 1;
/// The value is being built (the node's value cell records by which thread).
pub(crate) const LOADING: u32 = 0;
/// The value is published in the node's value cell.
pub(crate) const READY: u32 = 2;
/// This build attempt ended without caching a value (failed, rejected or panicked).
pub(crate) const DEAD: u32 = 4;

pub(crate) struct Slot {
    state: AtomicU32,
}

impl Slot {
    pub(crate) fn loading() -> Self {
        Self {
            state: AtomicU32::new(LOADING),
        }
    }

    pub(crate) fn ready() -> Self {
        Self {
            state: AtomicU32::new(READY),
        }
    }

    /// The state without the `WAITERS` bit.
    #[inline]
    pub(crate) fn state(&self) -> u32 {
        // Acquire: pairs with the Release swap in `finish`, so a caller that sees `READY` or
        // `DEAD` also sees the value or outcome written before it.
        self.state.load(Ordering::Acquire) & !WAITERS
    }

    /// Ends the build: moves `LOADING` to `to` (`READY` or `DEAD`) and wakes any parked caller.
    ///
    /// Must be called exactly once per `LOADING` slot, by its builder.
    pub(crate) fn finish(&self, to: u32) {
        debug_assert!(to == READY || to == DEAD);
        // Release: pairs with the Acquire loads in `state` and `wait`; everything the builder
        // wrote (value, outcome) happens-before a waiter's read of them.
        let prev = self.state.swap(to, Ordering::Release);
        debug_assert_eq!(prev & !WAITERS, LOADING, "a slot was finished twice");
        if prev & WAITERS != 0 {
            wake_all(&self.state);
        }
    }

    /// Parks until the slot leaves `LOADING`; returns the final state (`READY` or `DEAD`).
    ///
    /// No spinning: the caller sleeps in the kernel on the state word. A spurious wake-up only
    /// costs one more check.
    pub(crate) fn wait(&self) -> u32 {
        loop {
            // Acquire: pairs with the Release swap in `finish`.
            let s = self.state.load(Ordering::Acquire);
            if s & !WAITERS != LOADING {
                return s & !WAITERS;
            }
            if s & WAITERS == 0 {
                // Relaxed on success: setting the bit publishes nothing; the builder's swap
                // reads it (a read-modify-write always sees the latest value of the word).
                if self
                    .state
                    .compare_exchange(s, s | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
                {
                    continue;
                }
            }
            wait(&self.state, LOADING | WAITERS);
        }
    }
}
