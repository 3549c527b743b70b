//! The pool manager's engine: an append-only array of pool slots and two lock-free free lists
//! of slot indices (free pools, and empty slots whose pool was freed by `clear`).
//!
//! # Invariants
//!
//! - **P1.** A slot's pool is accessed only by the thread that holds the slot: the one that
//!   popped its index from a free list, or that claimed it fresh from `len`. Holding is
//!   exclusive because an index is in at most one free list at a time and a pop removes it.
//! - **P2.** Slots are never freed while the manager lives, so reading a stale `next` of a slot
//!   that another thread popped meanwhile is harmless: the tag in the list head then differs,
//!   and the CAS that would use the stale value fails (no ABA).
//! - **P3.** A push publishes the slot's contents (Release) to the next popper (Acquire).

#![allow(unsafe_code)]

use crate::sync::{
    fence, thread, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering, Queue,
    UnsafeCell,
};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::task::Waker;

/// Segments of the slot array: segment `s` holds `FIRST << s` slots.
const SEGMENTS: usize = 26;
const FIRST: usize = 64;

struct Slot<P> {
    pool: UnsafeCell<Option<P>>,
    /// The next index + 1 in whichever free list holds this slot (0 = end).
    next: AtomicU32,
}

/// A lock-free stack of slot indices with an ABA tag in the head.
struct FreeList {
    /// `tag << 32 | (index + 1)`; index + 1 = 0 means empty.
    head: AtomicU64,
}

impl FreeList {
    fn new() -> Self {
        Self {
            head: AtomicU64::new(0),
        }
    }
}

/// The slots and free lists of one pool manager.
pub(crate) struct PoolSlots<P> {
    segments: [AtomicPtr<Slot<P>>; SEGMENTS],
    /// Slots claimed so far (indices `0..len` exist).
    len: AtomicUsize,
    free: FreeList,
    empty: FreeList,
}

// SAFETY: (P1, P3) pools move between threads through the free lists (P1, P3): `P: Send` suffices.
unsafe impl<P: Send> Send for PoolSlots<P> {}
// SAFETY: (P1) a pool is only ever accessed by the one thread that holds its slot (P1).
unsafe impl<P: Send> Sync for PoolSlots<P> {}

fn locate(index: usize) -> (usize, usize) {
    let n = index / FIRST + 1;
    let s = (usize::BITS - 1 - n.leading_zeros()) as usize;
    (s, index - FIRST * ((1 << s) - 1))
}

impl<P> PoolSlots<P> {
    pub(crate) fn new() -> Self {
        Self {
            segments: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            len: AtomicUsize::new(0),
            free: FreeList::new(),
            empty: FreeList::new(),
        }
    }

    /// The slot at `index`, which exists (`index < len`, its segment allocated).
    fn slot(&self, index: usize) -> &Slot<P> {
        let (s, i) = locate(index);
        // Acquire: pairs with the Release CAS in `segment`, so the slots are initialized.
        let seg = self.segments[s].load(Ordering::Acquire);
        debug_assert!(!seg.is_null());
        // SAFETY: (P2) `i < FIRST << s` by `locate`; segments live as long as `self` (P2).
        unsafe { &*seg.add(i) }
    }

    fn segment(&self, s: usize) {
        // Acquire: pairs with the Release CAS below.
        if !self.segments[s].load(Ordering::Acquire).is_null() {
            return;
        }
        let fresh: Box<[Slot<P>]> = (0..FIRST << s)
            .map(|_| Slot {
                pool: UnsafeCell::new(None),
                next: AtomicU32::new(0),
            })
            .collect();
        let fresh = Box::into_raw(fresh).cast::<Slot<P>>();
        // Release: publishes the initialized slots; Acquire on failure: pairs with the winner.
        if self.segments[s]
            .compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::Release,
                Ordering::Acquire,
            )
            .is_err()
        {
            // SAFETY: (P2) `fresh` was never shared; rebuild the box it came from.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, FIRST << s)) });
        }
    }

    /// Claims a slot never used before; `None` when the index space is exhausted.
    pub(crate) fn claim_fresh(&self) -> Option<usize> {
        // Relaxed: the index is unique by the RMW; the segment CAS publishes the slot.
        let index = self.len.fetch_add(1, Ordering::Relaxed);
        if index >= u32::MAX as usize - 1 || locate(index).0 >= SEGMENTS {
            return None;
        }
        self.segment(locate(index).0);
        Some(index)
    }

    fn push(&self, list: &FreeList, index: usize) {
        let slot = self.slot(index);
        // Relaxed: the head CAS below publishes it.
        let mut head = list.head.load(Ordering::Relaxed);
        loop {
            slot.next.store(head as u32, Ordering::Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | (index as u64 + 1);
            // Release: pairs with the Acquire in `pop` (P3): the pool's contents written by
            // the holder happen-before the next holder's reads.
            match list
                .head
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }

    fn pop(&self, list: &FreeList) -> Option<usize> {
        // Acquire: pairs with the Release CAS in `push` (P3).
        let mut head = list.head.load(Ordering::Acquire);
        loop {
            let top = (head & u64::from(u32::MAX)) as usize;
            if top == 0 {
                return None;
            }
            // Relaxed: a stale value only makes the CAS below fail (P2).
            let next = u64::from(self.slot(top - 1).next.load(Ordering::Relaxed));
            let new = ((head >> 32).wrapping_add(1) << 32) | next;
            // Acquire: pairs with the Release CAS in `push` (P3).
            match list
                .head
                .compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(top - 1),
                Err(actual) => head = actual,
            }
        }
    }

    /// Takes a free pool's slot.
    pub(crate) fn pop_free(&self) -> Option<usize> {
        self.pop(&self.free)
    }

    /// Returns a held slot (with its pool) to the free list.
    pub(crate) fn push_free(&self, index: usize) {
        self.push(&self.free, index);
    }

    /// Takes a slot whose pool was freed, for reuse.
    pub(crate) fn pop_empty(&self) -> Option<usize> {
        self.pop(&self.empty)
    }

    /// Returns a held slot without a pool to the empty list.
    pub(crate) fn push_empty(&self, index: usize) {
        self.push(&self.empty, index);
    }

    /// Puts a pool into a slot the caller just took from `claim_fresh` or `pop_empty`.
    pub(crate) fn fill(&self, index: usize, pool: P) {
        // SAFETY: (P1) the caller holds `index` (P1): it came from `claim_fresh` or `pop_empty`
        // and has not been pushed anywhere yet.
        unsafe { self.with(index, |p| *p = Some(pool)) };
    }

    /// Takes the pool out of a slot the caller just popped from the free list.
    pub(crate) fn take(&self, index: usize) -> Option<P> {
        // SAFETY: (P1) the caller holds `index` (P1): it came from `pop_free` and has not been
        // pushed back yet.
        unsafe { self.with(index, |p| p.take()) }
    }

    /// Runs `f` on the pool of a slot the caller holds.
    ///
    /// # Safety
    /// - The caller holds `index` (P1): it popped it or claimed it, and has not pushed it back.
    pub(crate) unsafe fn with<R>(&self, index: usize, f: impl FnOnce(&mut Option<P>) -> R) -> R {
        // SAFETY: (P1) exclusive by the caller's contract (P1).
        self.slot(index).pool.with_mut(|p| f(unsafe { &mut *p }))
    }
}

/// Threads parked (and tasks pending) until a pool comes back, in the order they came; each
/// returned pool wakes the first of them that still waits.
///
/// # Protocol
///
/// - **W1 (no lost wake-up).** A waiter queues its registration, then (after a `SeqCst`
///   fence) looks for a free pool before it parks; a returner pushes the pool, then (after a
///   `SeqCst` fence) looks for registrations. One of the two sees the other.
/// - **W2 (one wake per pool).** A returner pops registrations until one moves from
///   `WAITING` to `WOKEN` under its compare-and-swap, and unparks that one's thread. A
///   registration's state moves once: to `WOKEN` by the returner that popped it, or to
///   `GONE` by its waiter, leaving; the compare-and-swap decides which. Popped `GONE` ones
///   are dropped.
/// - **W3 (a wake is never dropped).** A waiter that stops waiting on its own (it found a
///   pool in its own look, or its timeout passed) after a returner woke it passes the wake
///   on: the pool it took need not be the one that wake announced, which may still be free
///   while others sleep.
///
/// A registration abandoned (`GONE`) stays queued until popped. So that waiters who keep
/// timing out while no pool comes back cannot pile them up, the leave that brings the
/// abandoned count to [`SWEEP_AT`] sweeps the queue: it drops the abandoned registrations
/// and wakes the waiting ones, which look for a pool again and register anew (a wake that
/// finds nothing is spurious, never lost).
///
/// Before, every return woke every waiter, and all but one registered again: 256 threads
/// sharing 3 pools spent about 0.5 ms per reservation on it (`docs/DESIGN.md`).
pub(crate) struct Waiters {
    /// Registrations, oldest first (crossbeam's lock-free `SegQueue`; see `crate::sync`).
    queue: Queue<Arc<Waiter>>,
    /// Queued registrations whose waiters left (`GONE`), not yet popped.
    abandoned: AtomicUsize,
}

/// Abandoned registrations at which a leave sweeps the queue (about 50 bytes each); under
/// loom, the first, so the models explore the sweep.
const SWEEP_AT: usize = if cfg!(runcache_loom) { 1 } else { 1024 };

/// The registration is waiting to be woken.
const WAITING: u8 = 0;
/// A returner chose it and unparked its thread.
const WOKEN: u8 = 1;
/// Its waiter left without being woken.
const GONE: u8 = 2;

/// One wait of one thread or task.
pub(crate) struct Waiter {
    sleeper: Sleeper,
    state: AtomicU8,
}

/// Who a registration wakes: a parked thread, or a task's waker.
enum Sleeper {
    Thread(thread::Thread),
    Task(Waker),
}

impl Waiter {
    /// Whether this registration would wake the task that `waker` wakes (a task re-polled
    /// with another waker registers anew).
    pub(crate) fn wakes(&self, waker: &Waker) -> bool {
        matches!(&self.sleeper, Sleeper::Task(w) if w.will_wake(waker))
    }

    /// Whether a returner chose this registration (W2).
    pub(crate) fn woken(&self) -> bool {
        // Acquire: pairs with the AcqRel CAS in `wake`, which follows the pool's push.
        self.state.load(Ordering::Acquire) == WOKEN
    }
}

impl Waiters {
    pub(crate) fn new() -> Self {
        Self {
            queue: Queue::new(),
            abandoned: AtomicUsize::new(0),
        }
    }

    /// Registers the calling thread; it must then look for a free pool before it parks, and
    /// call [`leave`](Self::leave) if it stops waiting before it is woken.
    pub(crate) fn register(&self) -> Arc<Waiter> {
        self.enqueue(Sleeper::Thread(thread::current()))
    }

    /// Registers a task, to be woken through `waker`; as [`register`](Self::register), the
    /// task must then look for a free pool before it returns `Pending`.
    pub(crate) fn register_task(&self, waker: &Waker) -> Arc<Waiter> {
        self.enqueue(Sleeper::Task(waker.clone()))
    }

    fn enqueue(&self, sleeper: Sleeper) -> Arc<Waiter> {
        let me = Arc::new(Waiter {
            sleeper,
            state: AtomicU8::new(WAITING),
        });
        self.queue.push(Arc::clone(&me));
        // SeqCst: orders this registration before the caller's look for a free pool, against
        // `after_return`'s fence between a push and its look for registrations (W1).
        fence(Ordering::SeqCst);
        me
    }

    /// Withdraws a registration whose waiter stops waiting on its own (it found a pool, or
    /// gave up); if a returner had woken it already, the wake goes to the next waiter (W3).
    pub(crate) fn leave(&self, me: &Waiter) {
        // Counted before the CAS publishes GONE, so the popper that finds it GONE (having
        // acquired that CAS) uncounts it after: the count never goes below zero. Relaxed: a
        // count that only paces the sweep; the CASes order it.
        let before = self.abandoned.fetch_add(1, Ordering::Relaxed);
        // AcqRel: the CAS that decides the registration's fate against `wake`'s.
        match me
            .state
            .compare_exchange(WAITING, GONE, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) if before + 1 >= SWEEP_AT => self.sweep(),
            Ok(_) => {}
            Err(_) => {
                // Relaxed: as above.
                self.abandoned.fetch_sub(1, Ordering::Relaxed);
                self.wake_one();
            }
        }
    }

    /// Pops every registration queued now: drops the abandoned ones and wakes the waiting
    /// ones, which look again and, finding no pool, register anew.
    fn sweep(&self) {
        for _ in 0..self.queue.len() {
            let Some(w) = self.queue.pop() else { return };
            self.wake(&w);
        }
    }

    /// Wakes `w`, popped from the queue, if it still waits; `false` if its waiter left.
    fn wake(&self, w: &Waiter) -> bool {
        // AcqRel: the Release half publishes the pool pushed before this wake to the
        // waiter's Acquire in `woken`; the Acquire half pairs with `leave`.
        if w.state
            .compare_exchange(WAITING, WOKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            match &w.sleeper {
                Sleeper::Thread(t) => t.unpark(),
                Sleeper::Task(waker) => waker.wake_by_ref(),
            }
            true
        } else {
            // Only a popper sets WOKEN, and each registration is popped once: it is GONE.
            // Relaxed: see `leave`.
            self.abandoned.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }

    /// Registrations queued now, abandoned ones included (for tests).
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Called after a pool was pushed: wakes one registered waiter, if any.
    pub(crate) fn after_return(&self) {
        // SeqCst: pairs with the fence in `register` (W1).
        fence(Ordering::SeqCst);
        if !self.queue.is_empty() {
            self.wake_one();
        }
    }

    /// Wakes the oldest registration still waiting (W2).
    fn wake_one(&self) {
        while let Some(w) = self.queue.pop() {
            if self.wake(&w) {
                return;
            }
        }
    }
}

/// Exclusive access to one reserved pool; dropping it hands the pool back.
///
/// It borrows the manager: a pool never outlives the manager that owns it.
///
/// ```
/// let pools = runcache::pool::PoolManager::new(1, || vec![0u8; 4])?;
/// let mut guard = pools.reserve()?;
/// guard.copy_from_slice(&[1, 2, 3, 4]); // DerefMut to the pool
/// assert_eq!(&guard[..], [1, 2, 3, 4]);
/// drop(guard); // hands the pool back
/// assert_eq!(pools.reserved(), 0);
/// # Ok::<(), runcache::PoolError>(())
/// ```
#[must_use = "dropping the guard returns the pool at once"]
pub struct PoolGuard<'a, P> {
    pub(crate) slots: &'a PoolSlots<P>,
    pub(crate) index: usize,
    pub(crate) owner: &'a (dyn ReturnPool + Sync),
}

/// What takes a pool back when its guard drops.
pub(crate) trait ReturnPool {
    fn return_pool(&self, index: usize);
}

impl<P> Deref for PoolGuard<'_, P> {
    type Target = P;

    fn deref(&self) -> &P {
        // SAFETY: (P1) the guard holds its slot (P1) until it drops, and a held slot always has a
        // pool (the manager fills it before making the guard).
        unsafe {
            self.slots
                .with(self.index, |p| p.as_ref().map(|p| p as *const P))
                .map(|p| &*p)
                .expect("a reserved slot holds a pool")
        }
    }
}

impl<P> DerefMut for PoolGuard<'_, P> {
    fn deref_mut(&mut self) -> &mut P {
        // SAFETY: (P1) as in `deref`; `&mut self` makes the borrow unique.
        unsafe {
            self.slots
                .with(self.index, |p| p.as_mut().map(|p| p as *mut P))
                .map(|p| &mut *p)
                .expect("a reserved slot holds a pool")
        }
    }
}

impl<P> Drop for PoolGuard<'_, P> {
    fn drop(&mut self) {
        self.owner.return_pool(self.index);
    }
}

impl<P: std::fmt::Debug> std::fmt::Debug for PoolGuard<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PoolGuard").field(&**self).finish()
    }
}

impl<P> Drop for PoolSlots<P> {
    fn drop(&mut self) {
        for (s, seg) in self.segments.iter().enumerate() {
            // Relaxed: `&mut self`.
            let seg = seg.load(Ordering::Relaxed);
            if !seg.is_null() {
                // SAFETY: (P2) allocated in `segment` with this length; freed once, here. Dropping
                // the slots drops every pool still in them.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(seg, FIRST << s)) });
            }
        }
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;

    #[test]
    fn locate_covers_every_index_once() {
        let mut expected = (0, 0);
        for index in 0..100_000 {
            let (s, i) = locate(index);
            if (s, i) != expected {
                assert_eq!((s, i), (expected.0 + 1, 0), "index {index}");
            }
            assert!(i < FIRST << s);
            expected = (s, i + 1);
        }
    }
}
