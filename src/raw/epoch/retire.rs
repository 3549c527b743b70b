//! Retirements: what a cache hands to its collector, gathered per thread in batches, and the
//! ways a batch reaches the collector.
//!
//! A thread's retirements for a cache go into the batch of its [`Registration`]. A full batch
//! goes onto the cache's *ready stack*. The stack is deferred to the collector as one function,
//! and the deferring thread's bag flushed to the collector's queue at once (**E5**):
//!
//! - when it holds [`READY`] batches;
//! - at every hand-over of the weight rule (`RawCache::retired`), of a clear, a shrink, or a
//!   build that cached nothing (the caller's own batch goes first);
//! - on `reclaim`, which takes every registration's batch first;
//! - on the *maintenance*, which first takes the batches of the next [`VISITS`]
//!   registrations in turn (a thread that fills a batch takes theirs as well);
//! - when a registration is released (its thread exits or prunes it, or the cache drops).
//!
//! So a retirement waits in an idle thread's batch only until other threads' work reaches it,
//! and never where the cache's `Drop` cannot.
//!
//! The maintenance is a deferred function of the cache's own collector that defers itself
//! again each time it runs (a *token*): crossbeam's collection runs it, on whichever thread
//! collects, once the epoch has advanced twice past its deferral. Threads collect every 128
//! pins (and on every flush), so it runs every few hundred calls into the cache by any
//! thread, readers included, at no cost on their path: a check on every lookup instead cost
//! 15% of an `Arc` hit. A token that cannot re-arm (its thread is exiting, or has no
//! registration here) is re-armed by the next hand-over.

#![allow(unsafe_code)]

use super::batch::{Batch, Retired, BATCH};
use super::registry::{Registration, Registry};
use crate::sync::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use crossbeam_epoch::Guard;
use std::sync::Arc;

/// Full batches on the ready stack that make the pusher defer the stack (two under loom, so
/// that the models also see batches left on the stack). Each deferral seals a bag (a ~2 KB
/// allocation), so eight batches share one: one per 256 retirements.
const READY: usize = if cfg!(runcache_loom) { 2 } else { 8 };

/// Whether the maintenance runs (the token, and the visits of a thread that fills a batch):
/// not under loom, where the models hand over by `reclaim` or by ending their threads, and
/// the maintenance would multiply their paths.
const MAINTENANCE: bool = !cfg!(runcache_loom);

/// Registrations whose batch one maintenance takes.
pub(crate) const VISITS: usize = 4;

/// Everything this cache handed to its collector whose destructor has not run yet, the
/// cache's registrations, and its ready stack.
///
/// Shared with each deferred destructor (which may run after the cache is gone, on whichever
/// thread collects) and with each thread's entry for the cache, so [`Domain::reclaim`] can
/// tell when everything has been freed. Every deferred function of this cache's own
/// retirements holds counted items, so a round that frees one lowers the count; only bags of
/// crossbeam's own queue nodes (which collecting itself retires) do not, and those queue up
/// behind the bags they came from. A retirement counts from when it is deferred: until then it
/// waits in a batch or on the ready stack, where the cache reaches it.
///
/// [`Domain::reclaim`]: super::Domain::reclaim
pub(crate) struct Pending {
    count: AtomicU64,
    /// Every item ever handed to the collector (for tests: `Cache::__handed_over`).
    handed: AtomicU64,
    /// The id of the cache whose retirements these are.
    pub(super) id: u64,
    pub(super) registry: Registry,
    /// Full batches waiting to be deferred together: a stack linked through `Batch::next`.
    ready: AtomicPtr<Batch>,
    /// Whether the maintenance token is deferred (see the module docs).
    armed: AtomicBool,
    /// Set when the cache drops: a token that runs then does nothing.
    closed: AtomicBool,
}

impl Pending {
    pub(super) fn new(id: u64) -> Self {
        Self {
            count: AtomicU64::new(0),
            handed: AtomicU64::new(0),
            id,
            registry: Registry::new(),
            ready: AtomicPtr::new(std::ptr::null_mut()),
            armed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// The cache is dropping: the maintenance token must not run or re-arm any more.
    pub(super) fn close(&self) {
        // Relaxed: the token that reads it runs on the dropping thread (the collector's
        // drop) or on a thread the drop waits for.
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Defers the maintenance token under `guard` unless it is deferred already, and flushes
    /// it to the collector's queue.
    #[inline]
    pub(super) fn arm(self: &Arc<Self>, guard: &Guard) {
        // Relaxed: as in `arm_unflushed`; the common case, checked without a call.
        if self.armed.load(Ordering::Relaxed) {
            return;
        }
        if self.arm_unflushed(guard) {
            guard.flush();
        }
    }

    /// Defers the maintenance token under `guard` unless it is deferred already; `true` if it
    /// did, and then the caller flushes the thread's bag before its call into the cache
    /// returns (**E5**), with whatever else it defers: each flush seals a ~2 KB bag.
    fn arm_unflushed(self: &Arc<Self>, guard: &Guard) -> bool {
        // Relaxed: a flag that only keeps tokens from multiplying; a token armed twice by a
        // race would only run twice.
        if !MAINTENANCE
            || self.closed.load(Ordering::Relaxed)
            || self.armed.load(Ordering::Relaxed)
            || self.armed.swap(true, Ordering::Relaxed)
        {
            return false;
        }
        let token = Arc::clone(self);
        // SAFETY: (E1) the token frees nothing; it may run on any thread, at any time after,
        // as long as its `Pending` lives, which its own `Arc` sees to.
        unsafe { guard.defer_unchecked(move || token.maintenance_token()) };
        true
    }

    /// The token's run: the maintenance, then the token again.
    fn maintenance_token(self: Arc<Self>) {
        // Relaxed: as in `arm`.
        self.armed.store(false, Ordering::Relaxed);
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        // The collecting thread is pinned on this collector, so it holds a registration here
        // (or pins through a temporary handle: then the next hand-over re-arms).
        let Some(guard) = super::with_registration(self.id, |reg| {
            // SAFETY: (E4) `with_registration` gives the calling thread's own registration,
            // which it holds.
            unsafe { reg.handle() }.pin()
        }) else {
            return;
        };
        self.maintain(&guard);
        self.arm(&guard);
    }

    /// Items handed to the collector whose destructor has not run yet.
    pub(super) fn count(&self) -> u64 {
        // Relaxed: a progress count (see `Retiring`).
        self.count.load(Ordering::Relaxed)
    }

    /// Items ever handed to the collector (whether or not they have run since).
    pub(crate) fn handed(&self) -> u64 {
        // Relaxed: a statistic.
        self.handed.load(Ordering::Relaxed)
    }

    /// Hands `free` to `guard`'s collector, counted here until it has run: gathered into the
    /// calling thread's batch for this cache when it fits one (two words) and the thread has
    /// a registration here, else deferred on its own at once (with a flush, **E5**).
    ///
    /// # Safety
    /// As [`Guard::defer_unchecked`]: `free` may run on any thread once no thread pinned now
    /// is pinned any more, and must be sound then. `guard` pins this cache's collector.
    pub(crate) unsafe fn defer(self: &Arc<Self>, guard: &Guard, free: impl FnOnce()) {
        let item = match Retired::new(free) {
            Ok(item) => item,
            Err(free) => {
                // SAFETY: (E1) the caller's contract.
                unsafe { self.defer_counted(guard, 1, free) };
                guard.flush();
                return;
            }
        };
        let mut item = Some(item);
        // The full batch, if this one filled it, goes on outside the thread-local borrow:
        // handing it over may run destructors that use other caches on this thread.
        let full = super::with_registration(self.id, |reg| {
            gather(reg, item.take().expect("gathered once"))
        });
        if let Some(item) = item {
            // SAFETY: (E1) the caller's contract; dropping `item` runs `free`.
            unsafe { self.defer_counted(guard, 1, move || drop(item)) };
            guard.flush();
        } else if let Some(Some(batch)) = full {
            // SAFETY: (E1) the caller's contract, for every item of the batch.
            unsafe { self.push_ready(batch, guard) };
        }
        // Something now waits for the maintenance: make sure its token is on its way.
        self.arm(guard);
    }

    /// Hands the calling thread's batch for this cache (if any) and the ready stack to
    /// `guard`'s collector, and so to the collector's queue, where any thread's collection
    /// can free what expired.
    pub(crate) fn hand_over(self: &Arc<Self>, guard: &Guard) {
        super::with_registration(self.id, |reg| self.take_from(reg));
        self.defer_ready(guard);
    }

    /// The maintenance: takes the batches of the next [`VISITS`] registrations to the ready
    /// stack, and hands the stack over if it holds anything.
    fn maintain(self: &Arc<Self>, guard: &Guard) {
        self.visit();
        self.defer_ready(guard);
    }

    /// Takes the batches of the next [`VISITS`] registrations, in turn, to the ready stack.
    fn visit(&self) {
        for _ in 0..VISITS {
            if let Some(reg) = self.registry.next_visit() {
                self.take_from(reg);
            }
        }
    }

    /// Releases `reg` for the thread of `token` if it is still held (the thread at exit or
    /// prune, or the cache's `Drop`; one of them wins, E4): hands its batch and the ready
    /// stack to the collector, then finalizes its handle. `false` if it was not held.
    pub(super) fn release(self: &Arc<Self>, reg: &Registration, token: u64) -> bool {
        if !reg.claim_release(token) {
            return false;
        }
        // SAFETY: (E4) the claim made the caller the releaser, and the handle is not
        // finalized yet; no call into the cache uses it meanwhile (its thread is exiting or
        // pruning a dropped cache's entry, or the cache is dropping).
        let guard = unsafe { reg.handle() }.pin();
        self.take_from(reg);
        self.defer_ready(&guard);
        drop(guard);
        // SAFETY: (E4) as above; the guard is gone.
        unsafe { reg.finish_release() };
        true
    }

    /// Takes every registration's batch to the ready stack and hands the stack over; `true`
    /// if some registration was being released meanwhile (its releaser hands its batch over
    /// itself, a moment later).
    pub(super) fn hand_over_all(self: &Arc<Self>, guard: &Guard) -> bool {
        let mut releasing = false;
        for reg in self.registry.iter() {
            self.take_from(reg);
            releasing |= reg.releaser().is_some();
        }
        self.defer_ready(guard);
        releasing
    }

    /// Moves `reg`'s batch, if it has one, to the ready stack.
    pub(super) fn take_from(&self, reg: &Registration) {
        if let Some(batch) = take_batch(reg) {
            self.push(batch);
        }
    }

    /// Pushes a full batch; defers the stack once it holds [`READY`] batches.
    ///
    /// # Safety
    /// As [`defer`](Self::defer), for every item of `batch`.
    unsafe fn push_ready(self: &Arc<Self>, batch: Box<Batch>, guard: &Guard) {
        // A thread that fills batches visits in turn too (not under loom, where the visits'
        // shared cursor would multiply every model's paths; the models hand over by
        // `reclaim` or by ending their threads).
        if MAINTENANCE {
            self.visit();
        }
        if self.push(batch) >= READY {
            self.defer_ready(guard);
        }
    }

    /// Pushes `batch` onto the ready stack; returns how many batches the stack held then.
    fn push(&self, mut batch: Box<Batch>) -> usize {
        // Relaxed: the CAS below publishes the batch.
        let mut head = self.ready.load(Ordering::Relaxed);
        loop {
            // SAFETY: (E1) a batch on the stack is freed only by a deferred function, which
            // runs after this thread (pinned, as every caller is) unpins, or by the cache's
            // `Drop`, when no thread pushes; so `head` is alive.
            batch.depth = 1 + unsafe { head.as_ref() }.map_or(0, |h| h.depth);
            batch.next = head;
            let depth = batch.depth;
            let raw = Box::into_raw(batch);
            // Release: pairs with the Acquire swap in `defer_ready` and `drop_ready`, which
            // then own the batch and its items.
            match self
                .ready
                .compare_exchange_weak(head, raw, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return depth,
                Err(actual) => {
                    head = actual;
                    // SAFETY: (E1) not published: still ours.
                    batch = unsafe { Box::from_raw(raw) };
                }
            }
        }
    }

    /// Takes the whole ready stack and hands it to `guard`'s collector as one deferred
    /// function, arms the maintenance token if it is not on its way, and flushes the thread's
    /// bag to the collector's queue (**E5**) once for both; does nothing if the stack is
    /// empty and the token armed.
    ///
    /// One flush for the two: a maintenance run that handed something over flushed twice
    /// before, so the exchange mix sealed a ~2 KB bag every 45 retirements, and the seal's
    /// allocation (a large-bin request) made glibc consolidate the fast bins that the freed
    /// nodes had filled: 1,278 maintenance runs cost 8% of the mix's instructions.
    fn defer_ready(self: &Arc<Self>, guard: &Guard) {
        let armed = self.arm_unflushed(guard);
        // Acquire: pairs with the Release CAS in `push`.
        let head = self.ready.swap(std::ptr::null_mut(), Ordering::Acquire);
        if !head.is_null() {
            // SAFETY: (E1) the swap made the stack ours; every batch on it was pushed by a
            // thread that owned it, and its items were retired under guards of this
            // collector, before this hand-over.
            let chain = unsafe { Box::from_raw(head) };
            let n = chain.total();
            // SAFETY: (E1, E2) as above; dropping the chain runs its retirements.
            unsafe { self.defer_counted(guard, n, move || drop(chain)) };
        }
        if armed || !head.is_null() {
            guard.flush();
        }
    }

    /// Runs what is left on the ready stack at once. Only the cache's `Drop` calls it, when
    /// no thread can reach the cache's entries any more.
    pub(super) fn drop_ready(&self) {
        // Acquire: as in `defer_ready`.
        let head = self.ready.swap(std::ptr::null_mut(), Ordering::Acquire);
        if !head.is_null() {
            // SAFETY: (E1) ours by the swap; no reader of the dropped cache remains.
            drop(unsafe { Box::from_raw(head) });
        }
    }

    /// Defers `free`, which frees `n` retired items, counting them until it has run.
    ///
    /// # Safety
    /// As [`defer`](Self::defer).
    unsafe fn defer_counted(self: &Arc<Self>, guard: &Guard, n: u64, free: impl FnOnce()) {
        // Relaxed: a progress count (see `Retiring`'s `Drop`) and a statistic.
        self.count.fetch_add(n, Ordering::Relaxed);
        self.handed.fetch_add(n, Ordering::Relaxed);
        let counted = Retiring(Arc::clone(self), n);
        // SAFETY: (E1) the caller's contract; the count only drops after `free` has run.
        unsafe {
            guard.defer_unchecked(move || {
                free();
                drop(counted);
            })
        };
    }
}

/// Adds `item` to `reg`'s batch (the calling thread's); hands the batch back once it is
/// full.
#[inline]
fn gather(reg: &Registration, item: Retired) -> Option<Box<Batch>> {
    let mut batch = take_batch(reg).unwrap_or_else(Batch::new);
    batch.push(item);
    if batch.len == BATCH {
        return Some(batch);
    }
    // Release: pairs with the Acquire swap of whoever takes the batch next (this thread, a
    // maintenance, `reclaim` or a release), which then owns its items.
    reg.batch.store(Box::into_raw(batch), Ordering::Release);
    None
}

/// Takes `reg`'s batch, if it has one.
fn take_batch(reg: &Registration) -> Option<Box<Batch>> {
    // Relaxed first: a visit to an empty batch writes nothing to the holder's line.
    if reg.batch.load(Ordering::Relaxed).is_null() {
        return None;
    }
    // Acquire: pairs with the Release store in `gather`.
    let p = reg.batch.swap(std::ptr::null_mut(), Ordering::Acquire);
    // SAFETY: (E1) a non-null batch word is a `Box<Batch>`, and the swap made it ours.
    (!p.is_null()).then(|| unsafe { Box::from_raw(p) })
}

/// `n` retired items, counted in [`Pending`] until this drops.
struct Retiring(Arc<Pending>, u64);

impl Drop for Retiring {
    fn drop(&mut self) {
        // Relaxed: a progress count for `reclaim`; it orders nothing.
        self.0.count.fetch_sub(self.1, Ordering::Relaxed);
    }
}
