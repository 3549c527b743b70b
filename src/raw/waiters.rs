//! The tasks waiting for a build: a lock-free list of wakers that hangs on the node's value
//! cell while the node loads.
//!
//! A thread that waits for a build parks on the slot's state word (a futex, `slot.rs`). A
//! task cannot: it registers its waker and returns `Pending`. The first task to wait on a
//! build allocates a [`Waiters`] list and swings the node's cell from the builder's word to
//! the list (tagged `LISTED`, see `node.rs`), which keeps the builder's token; later tasks
//! push onto it. Whatever ends the attempt (a value published, an outcome recorded, the
//! builder unwinding or being dropped) swaps the cell, and so takes the list, then ends the
//! slot's state and only then *closes* the list: one swap takes every registration and
//! leaves [`CLOSED`], and each registration's waker is woken once. A task that pushes after
//! the close fails, and finds the attempt over when it reads the cell again.
//!
//! Nodes that no task waits on never allocate a list: the blocking path is unchanged.
//!
//! # Invariants
//!
//! - **L1 (registrations).** A registration is written whole by its task before the Release
//!   compare-and-swap that pushes it, and never touched by that task again; the list owns it
//!   until the Acquire swap of [`close`](Waiters::close) takes it, whose caller wakes and
//!   frees it once. Dropping a list that was never closed frees its registrations unwoken.
//! - **L2 (the list's lifetime).** The list is reachable only through its node's cell while
//!   the cell is tagged `LISTED`; the builder's terminal swap takes it out, and the builder
//!   closes it and then retires it through the cache's epoch collector, so a task that read
//!   the cell under a guard may still push (and find it closed) until it unpins.

#![allow(unsafe_code)]

use crate::sync::{AtomicPtr, Ordering};
use std::ptr;
use std::task::Waker;

/// One task's registration.
struct Registration {
    waker: Waker,
    next: *mut Registration,
}

/// The head word of a closed list (never a registration's address: those are aligned).
const CLOSED: *mut Registration = ptr::dangling_mut::<u8>() as *mut Registration;

/// The wakers of the tasks waiting for one build attempt, and that attempt's builder token.
pub(crate) struct Waiters {
    /// The token of the builder thread (0 for a task), as the cell held it before the list.
    token: u64,
    /// A stack of registrations, or [`CLOSED`].
    head: AtomicPtr<Registration>,
}

// The list's address is stored in a cell word with three tag bits.
const _: () = assert!(std::mem::align_of::<Waiters>() >= 8);

impl Waiters {
    /// A list holding one registration, of `waker`, for the build of thread `token`.
    pub(crate) fn with(token: u64, waker: &Waker) -> Box<Self> {
        let first = Box::into_raw(Box::new(Registration {
            waker: waker.clone(),
            next: ptr::null_mut(),
        }));
        Box::new(Self {
            token,
            head: AtomicPtr::new(first),
        })
    }

    /// The builder token the cell held before the list.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// Registers `waker`; `false` if the list is closed (the attempt is over).
    pub(crate) fn push(&self, waker: &Waker) -> bool {
        // Relaxed: the head is only compared; the registration is published by the CAS.
        let mut head = self.head.load(Ordering::Relaxed);
        if head == CLOSED {
            return false;
        }
        let reg = Box::into_raw(Box::new(Registration {
            waker: waker.clone(),
            next: head,
        }));
        loop {
            // Release: pairs with the Acquire swap in `close` (L1), which then reads the
            // registration; Acquire on failure: a `CLOSED` read pairs with that swap's
            // Release, so the caller's next read of the cell sees the terminal swap before it.
            match self
                .head
                .compare_exchange(head, reg, Ordering::Release, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(CLOSED) => {
                    // SAFETY: (L1) never pushed: ours alone.
                    drop(unsafe { Box::from_raw(reg) });
                    return false;
                }
                Err(now) => {
                    head = now;
                    // SAFETY: (L1) not pushed yet: only this task writes it.
                    unsafe { (*reg).next = now };
                }
            }
        }
    }

    /// Closes the list and wakes every task registered on it, once. Called once, by the
    /// builder, after the attempt's terminal swap of the cell and the end of the slot's state.
    pub(crate) fn close(&self) {
        // AcqRel: Acquire pairs with each push's Release (L1); Release pairs with the
        // failure Acquire of a push that finds the list closed.
        let mut reg = self.head.swap(CLOSED, Ordering::AcqRel);
        debug_assert!(reg != CLOSED, "a list is closed once");
        while !reg.is_null() {
            // SAFETY: (L1) the swap took every registration pushed, each written whole before
            // its push; each is freed here, once.
            let r = unsafe { Box::from_raw(reg) };
            reg = r.next;
            r.waker.wake();
        }
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        // Relaxed: `&mut self`; a closed list holds nothing, an open one (dropped without
        // closing only when the cache drops a loading node) its registrations, unwoken.
        let mut reg = self.head.load(Ordering::Relaxed);
        while !reg.is_null() && reg != CLOSED {
            // SAFETY: (L1) the list owns its registrations until it is closed.
            let r = unsafe { Box::from_raw(reg) };
            reg = r.next;
        }
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering as O};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, O::Relaxed);
        }
    }

    #[test]
    fn close_wakes_each_registration_once_and_refuses_later_pushes() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let list = Waiters::with(7, &waker);
        assert_eq!(list.token(), 7);
        assert!(list.push(&waker));
        assert!(list.push(&waker));
        assert_eq!(
            count.0.load(O::Relaxed),
            0,
            "nothing is woken before the close"
        );
        list.close();
        assert_eq!(count.0.load(O::Relaxed), 3);
        assert!(!list.push(&waker), "a closed list takes no registration");
        drop(list);
        assert_eq!(count.0.load(O::Relaxed), 3);
        assert_eq!(
            Arc::strong_count(&count),
            2,
            "every registration's waker was released"
        );
    }

    #[test]
    fn a_list_dropped_open_releases_its_wakers_without_waking() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let list = Waiters::with(0, &waker);
        assert!(list.push(&waker));
        drop(list);
        assert_eq!(count.0.load(O::Relaxed), 0);
        assert_eq!(Arc::strong_count(&count), 2);
    }
}
