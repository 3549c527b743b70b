//! Every thread's registration with one cache, in a list the cache owns.
//!
//! A [`Registration`] is a thread's epoch handle for the cache's collector, its statistics
//! block and its batch of retirements not yet handed over. The thread reaches it through its
//! thread-local list; the cache reaches every registration through its [`Registry`], so that
//! other threads can take an idle thread's batch (a bounded delay while the cache lives) and
//! the cache's `Drop` can release the handles of threads that are still alive (so nothing
//! keeps the collector alive after the cache, **E4**, **E5**).
//!
//! A registration moves `HELD → RELEASING → FREE`. Exactly one caller wins the compare and
//! swap out of `HELD`: the thread itself (it exits, or prunes the entry of a dropped cache)
//! or the cache's `Drop`. The winner hands the batch over, finalizes the handle, and stores
//! `FREE`. A thread that registers later with the same live cache takes a `FREE`
//! registration back (`FREE → HELD`) before it makes a new one, so the list is as long as the
//! most threads registered at once, not as the threads that ever were.

#![allow(unsafe_code)]

use super::batch::Batch;
use crate::raw::counter::StatsBlock;
use crate::sync::{AtomicPtr, AtomicU64, Ordering};
use crossbeam_epoch::LocalHandle;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// A thread holds the registration; its handle is initialized.
const HELD: u64 = 0;
/// One caller is releasing it (handing its batch over, finalizing its handle); the state's
/// bits above these two name the releasing thread (its token, 0 during its teardown).
const RELEASING: u64 = 1;
/// Released: no handle, no batch; a thread may take it back while the cache lives.
const FREE: u64 = 2;
/// The state's bits that are not the releaser's token.
const STATE: u64 = 3;

/// One thread's registration with one cache; see the module docs.
pub(crate) struct Registration {
    /// `HELD`, `FREE`, or `RELEASING` with the releaser's token above it.
    state: AtomicU64,
    /// Initialized while `HELD` (and while `RELEASING`, until the releaser finalizes it).
    handle: UnsafeCell<MaybeUninit<LocalHandle>>,
    /// The statistics block, kept across holders (its counts stay in the sums).
    pub(super) stats: *const StatsBlock,
    /// The retirements gathered and not yet handed over: null, or a `Box<Batch>` that the
    /// holder or any thread that takes it with a swap owns (**E1**).
    pub(super) batch: AtomicPtr<Batch>,
    /// The next registration in the registry; written before this one is published.
    next: *const Registration,
}

// SAFETY: (E4) the handle is used only by the thread that holds the registration, or by the
// one releaser that won the compare and swap out of `HELD`; the batch is exchanged by atomic
// swaps; the stats block is written only by the holder, and handed from holder to holder
// through the `FREE` store (Release) and the claim (Acquire).
unsafe impl Send for Registration {}
// SAFETY: (E4) as above.
unsafe impl Sync for Registration {}

impl Registration {
    /// The epoch handle.
    ///
    /// # Safety
    /// The caller holds the registration (it is `HELD` by the calling thread), or is its
    /// releaser and has not finalized the handle yet.
    pub(super) unsafe fn handle(&self) -> &LocalHandle {
        // SAFETY: (E4) the caller's contract: the handle is initialized and nobody else uses it.
        unsafe { (*self.handle.get()).assume_init_ref() }
    }

    /// Claims the release for the thread of `token`: `true` for exactly one caller while the
    /// registration is held.
    pub(super) fn claim_release(&self, token: u64) -> bool {
        // AcqRel: the holder's last use of the handle happened before the cache could be
        // dropped (or is this very release), so the claim orders nothing new; it keeps the
        // releaser's work after the claim all the same.
        self.state
            .compare_exchange(
                HELD,
                token << 2 | RELEASING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Finalizes the handle and marks the registration free. Only the caller whose
    /// [`claim_release`](Self::claim_release) returned `true` calls it, after handing the
    /// batch over.
    ///
    /// # Safety
    /// As above; no guard of the handle is alive.
    pub(super) unsafe fn finish_release(&self) {
        // SAFETY: (E4) the releaser owns the handle, initialized (`HELD` until the claim),
        // and drops it once, here, with no guard alive: the participant is finalized (its
        // bag goes to the collector's queue, its collector reference is released).
        unsafe { (*self.handle.get()).assume_init_drop() };
        // Release: pairs with the Acquire in `hold` and `releaser`, publishing the
        // finalization and the batch's hand-over.
        self.state.store(FREE, Ordering::Release);
    }

    /// The token of the thread releasing it, while one is at work on it.
    pub(super) fn releaser(&self) -> Option<u64> {
        // Acquire: pairs with the `FREE` store in `finish_release`.
        let state = self.state.load(Ordering::Acquire);
        (state & STATE == RELEASING).then_some(state >> 2)
    }
}

/// The append-only list of a cache's registrations. Each node holds one strong count of its
/// registration, released when the registry drops.
pub(crate) struct Registry {
    head: AtomicPtr<Registration>,
    /// Where [`next_visit`](Self::next_visit) goes next (a hint: races only repeat or skip a
    /// visit).
    cursor: AtomicPtr<Registration>,
}

impl Registry {
    pub(super) fn new() -> Self {
        Self {
            head: AtomicPtr::new(std::ptr::null_mut()),
            cursor: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// A registration held by the calling thread, whose handle is `handle`: a free one taken
    /// back (its statistics block kept), or a new one with the block `stats()` makes.
    pub(super) fn hold(
        &self,
        handle: LocalHandle,
        stats: impl FnOnce() -> *const StatsBlock,
    ) -> Arc<Registration> {
        for reg in self.iter() {
            // Acquire: pairs with the `FREE` store in `finish_release`: the last holder's
            // writes to the stats block and the handle's finalization come before ours.
            if reg.state.load(Ordering::Relaxed) == FREE
                && reg
                    .state
                    .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // SAFETY: (E4) we hold it now; a free registration's handle is uninitialized
                // (finalized by its releaser), and no one else touches it while it is held.
                unsafe { (*reg.handle.get()).write(handle) };
                // SAFETY: (E4) the registry holds a strong count of each node, and lives as
                // long as `&self`; this takes one more for the caller.
                return unsafe {
                    Arc::increment_strong_count(reg);
                    Arc::from_raw(reg)
                };
            }
        }
        let mut node = Arc::new(Registration {
            state: AtomicU64::new(HELD),
            handle: UnsafeCell::new(MaybeUninit::new(handle)),
            stats: stats(),
            batch: AtomicPtr::new(std::ptr::null_mut()),
            next: std::ptr::null(),
        });
        // Relaxed: the CAS below publishes the node.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            Arc::get_mut(&mut node).expect("not shared yet").next = head;
            let raw = Arc::into_raw(Arc::clone(&node)).cast_mut();
            // Release: pairs with the Acquire load in `iter`, which then sees the node's fields.
            match self
                .head
                .compare_exchange_weak(head, raw, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return node,
                Err(actual) => {
                    // SAFETY: (E4) the count just taken for the list, never published.
                    drop(unsafe { Arc::from_raw(raw) });
                    head = actual;
                }
            }
        }
    }

    /// Every registration, newest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Registration> {
        // Acquire: pairs with the Release CAS in `hold`.
        let mut p = self.head.load(Ordering::Acquire).cast_const();
        std::iter::from_fn(move || {
            // SAFETY: (E4) nodes are freed only when the registry drops, after `&self` ends;
            // `next` was written before the node was published and never changes.
            let reg = unsafe { p.as_ref()? };
            p = reg.next;
            Some(reg)
        })
    }

    /// The registration after the one visited last (round robin over the list), if any.
    pub(super) fn next_visit(&self) -> Option<&Registration> {
        // Relaxed: a hint; the node it names is published (it came from `iter`).
        let at = self.cursor.load(Ordering::Relaxed).cast_const();
        // SAFETY: (E4) as in `iter`: a non-null cursor names a node of this list.
        let next = match unsafe { at.as_ref() } {
            Some(reg) if !reg.next.is_null() => reg.next,
            // Acquire: as in `iter`.
            _ => self.head.load(Ordering::Acquire).cast_const(),
        };
        // Relaxed: a hint.
        self.cursor.store(next.cast_mut(), Ordering::Relaxed);
        // SAFETY: (E4) as in `iter`.
        unsafe { next.as_ref() }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Relaxed: `&mut self`: no other thread reaches the list.
        let mut p = self.head.load(Ordering::Relaxed).cast_const();
        while !p.is_null() {
            // SAFETY: (E4) the list's own count of each node, released once, here; threads
            // that still hold an entry for the dropped cache keep their own count.
            let reg = unsafe { Arc::from_raw(p) };
            p = reg.next;
        }
    }
}
