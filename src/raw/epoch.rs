//! One epoch [`Collector`] per cache, and the thread-local handles that pin it.
//!
//! # Registration
//!
//! crossbeam-epoch's free `pin()` uses one global collector; runcache gives every cache its own
//! so that caches (and tests, and loom models) never share garbage, and so that the last
//! handle to a cache's collector runs every deferred destructor of that cache (invariant
//! **I7**). Registering a thread with a collector allocates, so each thread keeps a small
//! thread-local list of `(cache id, LocalHandle, stats block)`. Pinning checks the entry the
//! thread used last (one compare), else scans that list (usually one entry), then calls
//! crossbeam's own pin.
//!
//! # Teardown
//!
//! Dropping a cache removes the dropping thread's entry at once. Entries that other threads
//! hold for a dropped cache are pruned the next time that thread registers with any cache, or
//! when the thread exits; until then that collector's remaining garbage (nodes already removed
//! from the table) waits for them. Values still in the table are dropped by the cache's own
//! `Drop`, exactly once, at once.
//!
//! When the thread-local list cannot be used (during thread teardown, or re-entrantly from a
//! destructor running inside a pin), the caller registers a temporary handle and uses the
//! cache's shared statistics block: slower, never wrong.
//!
//! # Invariants
//!
//! - **E1 (deferral).** Everything handed to a collector (alone, or in a batch) was retired
//!   under a guard of that same collector, and may run on any thread once every thread
//!   pinned at its hand-over has unpinned: the contract of [`Guard::defer_unchecked`].
//! - **E2 (retirements run once).** A [`Retired`] holds one closure of at most two words,
//!   stored in place; it is run (moved out) by its `Drop` and nowhere else, and a [`Batch`]
//!   drops exactly its first `len` items. A batch is never dropped before it is handed to
//!   the collector, except by the collector's own deferred function.
//! - **E3 (the remembered registration).** [`Last`] is touched only by its own thread; while
//!   its id is not 0 its handle copy and batch pointer name an entry still in `locals`, and
//!   readers copy the handle out instead of borrowing it in place.

#![allow(unsafe_code)]

use super::counter::{StatsBlock, StatsRegistry};
use crate::sync::{AtomicU64, Ordering};
use crossbeam_epoch::{Collector, Guard, LocalHandle};
use std::cell::{Cell, RefCell, UnsafeCell};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::sync::{Arc, Weak};

/// Rounds in a row without progress after which [`Domain::reclaim`] gives up: an item retired
/// at epoch `e` is freed once the global epoch reaches `e + 2`, and each round advances it at
/// most once, so a few rounds with nothing freed mean a thread pinned elsewhere holds the rest.
const RECLAIM_STALL_ROUNDS: usize = 8;

/// Retirements a thread gathers into one [`Batch`] before handing them to the collector as
/// one deferred function (one under loom, so that every model hands each retirement over at
/// once and explores the same reclamation as before batching).
///
/// crossbeam-epoch wraps every deferred function in a bag entry and seals a full bag (64
/// entries) into a ~2 KB allocation. Deferring each retired item on its own took a bag entry
/// per retirement, plus four read-modify-writes of [`Pending`]'s line, which every thread
/// retiring from the cache shares. A batch of 32 takes one bag entry and two of those writes
/// for 32 retirements (`docs/DESIGN.md`, "Retirements in batches").
const BATCH: usize = if cfg!(runcache_loom) { 1 } else { 32 };

/// Everything this cache handed to its collector — value boxes, unlinked nodes (which may
/// hold a key, and an uncached value or an error for late waiters), retired tables — whose
/// destructor has not run yet, and the cache's id (which finds the calling thread's
/// [`Batch`] of them).
///
/// Shared with each deferred destructor (which may run after the cache is gone, on whichever
/// thread collects), so [`Domain::reclaim`] can tell when everything has been freed. Every bag
/// of this cache's own retirements holds counted items, so a round that frees one lowers the
/// count; only bags of crossbeam's own queue nodes (which collecting itself retires) do not,
/// and those queue up behind the bags they came from. A retirement counts from when its
/// batch is handed to the collector: until then it waits in its thread's batch, where no
/// other thread can reach it (as in crossbeam's own bag).
pub(crate) struct Pending {
    count: AtomicU64,
    /// The id of the cache whose retirements these are.
    id: u64,
}

impl Pending {
    fn new(id: u64) -> Self {
        Self {
            count: AtomicU64::new(0),
            id,
        }
    }

    /// Hands `free` to `guard`'s collector, counted here until it has run: gathered into the
    /// calling thread's batch for this cache when `free` fits one (two words) and the thread
    /// has a batch, else on its own.
    ///
    /// # Safety
    /// As [`Guard::defer_unchecked`]: `free` may run on any thread once no thread pinned now
    /// is pinned any more, and must be sound then. `guard` pins this cache's collector.
    pub(crate) unsafe fn defer(self: &Arc<Self>, guard: &Guard, free: impl FnOnce()) {
        match Retired::new(free) {
            Ok(item) => {
                if let Err(item) = self.gather(item, guard) {
                    // SAFETY: (E1) the caller's contract; dropping `item` runs `free`.
                    unsafe { self.defer_counted(guard, 1, move || drop(item)) };
                }
            }
            // SAFETY: (E1) the caller's contract.
            Err(free) => unsafe { self.defer_counted(guard, 1, free) },
        }
    }

    /// Hands the calling thread's batch for this cache (if any) to `guard`'s collector, then
    /// the thread's epoch bag to the global queue, where any thread's collection can free
    /// what expired.
    pub(crate) fn hand_over(self: &Arc<Self>, guard: &Guard) {
        let batch = THREAD
            .try_with(|t| t.with_batch(self.id, |slot| slot.take()))
            .ok()
            .flatten()
            .flatten();
        if let Some(batch) = batch {
            // SAFETY: (E1, E2) every retirement in the batch was gathered under a guard of this
            // collector whose pin began no later than `guard`'s, as `defer` requires.
            unsafe { self.defer_batch(guard, batch) };
        }
        guard.flush();
    }

    /// Adds `item` to the calling thread's batch for this cache, handing the batch to the
    /// collector once it is full; hands `item` back if the thread has no batch here (it did
    /// not register with this cache, or its thread-local state is being torn down).
    fn gather(self: &Arc<Self>, item: Retired, guard: &Guard) -> Result<(), Retired> {
        let mut item = Some(item);
        let full = THREAD.try_with(|t| {
            t.with_batch(self.id, |slot| {
                // Taken out while it is written to: nothing here runs foreign code, but a
                // batch must never be dropped unrun, so a reentrant call would only start
                // a batch of its own.
                let mut batch = slot.take().unwrap_or_else(Batch::new);
                batch.push(item.take().expect("pushed once"));
                if batch.len == BATCH {
                    return Some(batch);
                }
                slot.replace(Some(batch))
            })
        });
        if let Some(item) = item {
            return Err(item);
        }
        if let Ok(Some(Some(batch))) = full {
            // SAFETY: (E1, E2) as in `hand_over`: the batch's retirements were gathered under
            // guards of this collector, the last of them `guard`.
            unsafe { self.defer_batch(guard, batch) };
        }
        Ok(())
    }

    /// Defers a whole batch as one function.
    ///
    /// # Safety
    /// As [`defer`](Self::defer), for every retirement in `batch`.
    unsafe fn defer_batch(self: &Arc<Self>, guard: &Guard, batch: Box<Batch>) {
        let n = batch.len as u64;
        // SAFETY: (E1, E2) the caller's contract; dropping the batch runs its retirements.
        unsafe { self.defer_counted(guard, n, move || drop(batch)) };
    }

    /// Defers `free`, which frees `n` retired items, counting them until it has run.
    ///
    /// # Safety
    /// As [`defer`](Self::defer).
    unsafe fn defer_counted(self: &Arc<Self>, guard: &Guard, n: u64, free: impl FnOnce()) {
        // Relaxed: a progress count (see `Retiring`'s `Drop`).
        self.count.fetch_add(n, Ordering::Relaxed);
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

/// `n` retired items, counted in [`Pending`] until this drops.
struct Retiring(Arc<Pending>, u64);

impl Drop for Retiring {
    fn drop(&mut self) {
        // Relaxed: a progress count for `reclaim`; it orders nothing.
        self.0.count.fetch_sub(self.1, Ordering::Relaxed);
    }
}

/// A retirement: a deferred closure of at most two words, stored in place. Dropping it runs
/// the closure, so it is only ever dropped once its items may be freed: by a batch run by
/// the collector, or inside a deferred function of its own.
struct Retired {
    data: MaybeUninit<[usize; 2]>,
    /// Runs the closure stored in `data`, moving it out.
    call: unsafe fn(*mut MaybeUninit<[usize; 2]>),
}

impl Retired {
    /// Stores `free` in place, or hands it back if it does not fit two words.
    fn new<F: FnOnce()>(free: F) -> Result<Self, F> {
        if std::mem::size_of::<F>() > std::mem::size_of::<[usize; 2]>()
            || std::mem::align_of::<F>() > std::mem::align_of::<[usize; 2]>()
        {
            return Err(free);
        }
        /// # Safety
        /// `data` holds an `F`, which is read out (moved) exactly once.
        unsafe fn call<F: FnOnce()>(data: *mut MaybeUninit<[usize; 2]>) {
            // SAFETY: (E2) the caller's contract.
            let free = unsafe { data.cast::<F>().read() };
            free();
        }
        let mut data = MaybeUninit::<[usize; 2]>::uninit();
        // SAFETY: (E2) `F` fits `data` in size and alignment (checked above).
        unsafe { data.as_mut_ptr().cast::<F>().write(free) };
        Ok(Self {
            data,
            call: call::<F>,
        })
    }
}

impl Drop for Retired {
    fn drop(&mut self) {
        // SAFETY: (E2) `data` holds the closure `call` was made for (`new`), and this is the one
        // place that runs it, once.
        unsafe { (self.call)(&mut self.data) };
    }
}

/// Up to [`BATCH`] retirements of one thread for one cache, deferred together. Dropping the
/// batch runs them in order (a destructor that panics does not stop the rest: slice drop
/// glue goes on, as it does for a `Vec`).
struct Batch {
    len: usize,
    items: [MaybeUninit<Retired>; BATCH],
}

impl Batch {
    fn new() -> Box<Self> {
        Box::new(Self {
            len: 0,
            items: [const { MaybeUninit::uninit() }; BATCH],
        })
    }

    fn push(&mut self, item: Retired) {
        debug_assert!(self.len < BATCH, "a full batch is handed over at once");
        self.items[self.len].write(item);
        self.len += 1;
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        let items =
            std::ptr::slice_from_raw_parts_mut(self.items.as_mut_ptr().cast::<Retired>(), self.len);
        // SAFETY: (E2) the first `len` items are initialized (`push`), and dropped only here.
        unsafe { std::ptr::drop_in_place(items) };
    }
}

/// The calling thread's batch for one cache: empty between batches.
type BatchSlot = Cell<Option<Box<Batch>>>;

/// Ids of caches and of threads; never reused. A std atomic on purpose: a `static` needs a
/// `const` constructor, which loom's atomics lack, and an id orders nothing.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_id() -> u64 {
    // Relaxed: only uniqueness matters.
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

struct Local {
    id: u64,
    alive: Weak<()>,
    handle: Box<LocalHandle>,
    stats: *const StatsBlock,
    /// The thread's retirements for this cache not yet handed to the collector. Boxed, so
    /// [`Last`] can point at it while `locals` moves its entries.
    batch: Box<BatchSlot>,
    pending: Arc<Pending>,
}

impl Drop for Local {
    /// Hands the thread's batch to the collector before the handle goes (the handle's own
    /// finalization then pushes the thread's bag to the global queue).
    fn drop(&mut self) {
        if let Some(batch) = self.batch.take() {
            let guard = self.handle.pin();
            // SAFETY: (E1, E2) the batch's retirements were gathered under guards of this
            // collector, all dropped by now (they do not outlive a call into the cache).
            unsafe { self.pending.defer_batch(&guard, batch) };
        }
    }
}

/// The registration a thread used last.
struct Last {
    /// Its cache's id; 0 (no cache's id) when there is none.
    id: Cell<u64>,
    /// A bitwise copy of its handle, initialized whenever `id` is not 0. Pinning through the
    /// copy saves a dependent load (the boxed handle's address) on every pin, and a pin's
    /// locked instruction waits for that chain of loads. A `LocalHandle` names its
    /// participant through a pointer and `pin` takes `&self`, so a copy is a second name for
    /// the same participant. It is valid exactly as long as the original (see
    /// [`ThreadState::last`]) and is never dropped (only the original counts as a handle).
    handle: UnsafeCell<MaybeUninit<LocalHandle>>,
    stats: Cell<*const StatsBlock>,
    /// Its entry's batch slot, valid while `id` is not 0 (as `handle`).
    batch: Cell<*const BatchSlot>,
}

impl Last {
    /// Remembers `local`, which stays in this thread's `locals`.
    fn set(&self, local: &Local) {
        // SAFETY: (E3) `last` is only touched by its own thread, and no reference into `handle`
        // lives across calls (readers copy it out first). The old copy is overwritten
        // without a drop, as every copy must be (see `handle`).
        unsafe { (*self.handle.get()).write(std::ptr::read(&*local.handle)) };
        self.stats.set(local.stats);
        self.batch.set(&*local.batch);
        self.id.set(local.id);
    }

    /// A copy of the handle of cache `id` if this is its registration.
    #[inline(always)]
    fn get(&self, id: u64) -> Option<(ManuallyDrop<LocalHandle>, *const StatsBlock)> {
        if self.id.get() != id {
            return None;
        }
        // SAFETY: (E3) `id` is not 0 (no cache has it), so `handle` is initialized; the copy is
        // read out, never referenced in place, so a reentrant `set` (a destructor run by
        // the pin's collection using another cache) cannot change it under a borrow.
        let handle = unsafe { (*self.handle.get()).assume_init_read() };
        Some((ManuallyDrop::new(handle), self.stats.get()))
    }
}

struct ThreadState {
    token: Cell<u64>,
    locals: RefCell<Vec<Local>>,
    /// The entry of `locals` that the last pin used, so a thread that works with one cache
    /// at a time skips the borrow and the scan. It stays valid while that cache lives: an
    /// entry leaves `locals` only when its cache drops (ids are never reused, so a stale
    /// `last` never matches again), when dead caches' entries are pruned, or when the thread's
    /// locals are released (which resets it).
    last: Last,
}

crate::sync::local_key! {
    static THREAD: ThreadState = ThreadState {
        token: Cell::new(0),
        locals: RefCell::new(Vec::new()),
        last: Last {
            id: Cell::new(0),
            handle: UnsafeCell::new(MaybeUninit::uninit()),
            stats: Cell::new(std::ptr::null()),
            batch: Cell::new(std::ptr::null()),
        },
    };
}

impl ThreadState {
    /// Runs `f` on this thread's batch slot for cache `id`; `None` if the thread has no
    /// entry for that cache, or its list is borrowed (a destructor run from inside
    /// `register`, say).
    fn with_batch<R>(&self, id: u64, f: impl FnOnce(&BatchSlot) -> R) -> Option<R> {
        if self.last.id.get() == id {
            // Callers pass the id of a live cache (one they are working in), and `last`
            // holds a live cache's id only while the entry it names is in `locals`: an
            // entry leaves when its cache drops or after (pruned), or with all of them
            // (which resets `last`).
            // SAFETY: (E3) so the entry is live, and its boxed slot lives as long as it does.
            let slot = unsafe { &*self.last.batch.get() };
            return Some(f(slot));
        }
        let locals = self.locals.try_borrow().ok()?;
        let local = locals.iter().find(|l| l.id == id)?;
        Some(f(&local.batch))
    }
}

/// A token that identifies the calling thread (0 when it cannot be read during teardown).
pub(crate) fn thread_token() -> u64 {
    THREAD
        .try_with(|t| {
            let mut token = t.token.get();
            if token == 0 {
                token = next_id();
                t.token.set(token);
            }
            token
        })
        .unwrap_or(0)
}

/// Drops every registration of the calling thread, as thread-local destruction does when a
/// thread exits. Only the loom models call it (see `crate::__loom_thread_exit`).
#[cfg(runcache_loom)]
pub(crate) fn release_thread() {
    let locals = THREAD.try_with(|t| {
        t.last.id.set(0);
        t.locals
            .try_borrow_mut()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    });
    drop(locals);
}

/// A cache's reclamation domain: its collector, its identity and its statistics.
pub(crate) struct Domain {
    collector: Collector,
    id: u64,
    alive: Arc<()>,
    pending: Arc<Pending>,
    pub(crate) stats: StatsRegistry,
}

impl Domain {
    pub(crate) fn new() -> Self {
        let id = next_id();
        Self {
            collector: Collector::new(),
            id,
            alive: Arc::new(()),
            pending: Arc::new(Pending::new(id)),
            stats: StatsRegistry::new(),
        }
    }

    /// Pins this cache's epoch on the calling thread and returns the thread's stats block.
    ///
    /// Inlined, with everything but the remembered registration's check outlined into
    /// [`pin_slow`](Self::pin_slow): the calls and returns around a pin's locked instruction
    /// cost 1.3 ns of the 4.8 a pin and unpin took (`docs/DESIGN.md`, "The pin inlined").
    #[inline(always)]
    pub(crate) fn pin(&self) -> (Guard, &StatsBlock) {
        match THREAD.try_with(|t| t.last.get(self.id)) {
            // `handle` is a copy of the handle boxed in this thread's entry for this cache,
            // removed only when the cache drops (impossible while `&self` lives) or the
            // thread's locals are destroyed or released (which also resets `last`); so the
            // participant is registered. SAFETY: (R2) the stats block lives as long as
            // `self.stats`.
            Ok(Some((handle, stats))) => (handle.pin(), unsafe { &*stats }),
            _ => self.pin_slow(),
        }
    }

    /// [`pin`](Self::pin) when the thread used another cache last, has not registered with
    /// this one yet, or cannot use its thread-local state.
    #[cold]
    #[inline(never)]
    fn pin_slow(&self) -> (Guard, &StatsBlock) {
        let found = THREAD.try_with(|t| {
            let locals = t.locals.try_borrow().ok()?;
            let local = locals.iter().find(|l| l.id == self.id)?;
            t.last.set(local);
            t.last.get(self.id)
        });
        let (handle, stats) = match found {
            Ok(Some(found)) => found,
            Ok(None) => match self.register() {
                Some(found) => found,
                None => return self.pin_unregistered(),
            },
            Err(_) => return self.pin_unregistered(),
        };
        // As in `pin`. SAFETY: (R2) as in `pin`.
        (handle.pin(), unsafe { &*stats })
    }

    fn pin_unregistered(&self) -> (Guard, &StatsBlock) {
        // Dropping the handle while its guard lives is fine: crossbeam finalizes the
        // participant only when both its handle and guard counts reach zero.
        let handle = self.collector.register();
        (handle.pin(), self.stats.shared())
    }

    #[cold]
    fn register(&self) -> Option<(ManuallyDrop<LocalHandle>, *const StatsBlock)> {
        let (found, dead) = THREAD
            .try_with(|t| {
                let mut locals = t.locals.try_borrow_mut().ok()?;
                let (live, dead): (Vec<Local>, Vec<Local>) = std::mem::take(&mut *locals)
                    .into_iter()
                    .partition(|l| l.alive.strong_count() > 0);
                *locals = live;
                let local = Local {
                    id: self.id,
                    alive: Arc::downgrade(&self.alive),
                    handle: Box::new(self.collector.register()),
                    stats: self.stats.register(),
                    batch: Box::default(),
                    pending: Arc::clone(&self.pending),
                };
                t.last.set(&local);
                locals.push(local);
                Some((t.last.get(self.id)?, dead))
            })
            .ok()??;
        // Dropped after the borrow ends: finalizing a handle may run destructors that use
        // other caches on this thread.
        drop(dead);
        Some(found)
    }

    /// The count of this cache's retired items not yet freed, for whoever retires one.
    pub(crate) fn pending(&self) -> &Arc<Pending> {
        &self.pending
    }

    /// Runs deferred destructors that no pinned thread can still need: each round pins, moves
    /// this thread's deferred work to the collector and lets it advance the epoch and free
    /// what expired (a bounded number of bags per round). Rounds go on until everything
    /// retired is freed, or until a few rounds in a row free nothing. When no other thread is
    /// pinned, that frees everything retired so far, however many threads retired it; a
    /// thread pinned elsewhere holds back only what it could still see.
    pub(crate) fn reclaim(&self) {
        // Relaxed: a progress count (see `Retiring`).
        let pending = || self.pending.count.load(Ordering::Relaxed);
        let round = || {
            let (guard, _) = self.pin();
            self.pending.hand_over(&guard);
        };
        // The first round hands this thread's batch over, so the count includes it.
        round();
        let mut stalled = 0;
        let mut last = pending();
        while last > 0 && stalled < RECLAIM_STALL_ROUNDS {
            round();
            let now = pending();
            stalled = if now < last { 0 } else { stalled + 1 };
            last = now;
        }
    }

    /// Whether `guard` pins this cache's collector.
    pub(crate) fn owns(&self, guard: &Guard) -> bool {
        guard.collector() == Some(&self.collector)
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let mine = THREAD.try_with(|t| {
            let mut locals = t.locals.try_borrow_mut().ok()?;
            let i = locals.iter().position(|l| l.id == self.id)?;
            Some(locals.swap_remove(i))
        });
        // Dropped outside the borrow (see `register`). If this was the last handle, the
        // collector's deferred destructors run when `self.collector` drops right after.
        drop(mine);
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[test]
    fn a_retirement_runs_once_when_dropped_and_a_large_one_is_handed_back() {
        let runs = Cell::new(0);
        let item = Retired::new(|| runs.set(runs.get() + 1)).unwrap_or_else(|_| panic!("fits"));
        assert_eq!(runs.get(), 0, "stored, not run");
        drop(item);
        assert_eq!(runs.get(), 1);

        let big = [String::new(), String::new()];
        let back = Retired::new(move || drop(big));
        assert!(back.is_err(), "six words do not fit in place");
    }

    #[test]
    fn a_batch_runs_its_retirements_in_order_and_past_a_panicking_one() {
        let order = RefCell::new(Vec::new());
        let mut batch = Batch::new();
        for i in 0..BATCH {
            let order = &order;
            let item = Retired::new(move || {
                order.borrow_mut().push(i);
                assert_ne!(i, 3, "the fourth destructor panics");
            })
            .unwrap_or_else(|_| panic!("fits"));
            batch.push(item);
        }
        assert!(
            order.borrow().is_empty(),
            "nothing runs before the batch drops"
        );
        let unwound = catch_unwind(AssertUnwindSafe(|| drop(batch)));
        assert!(
            unwound.is_err(),
            "the panic reaches whoever dropped the batch"
        );
        assert_eq!(*order.borrow(), (0..BATCH).collect::<Vec<_>>());
    }

    #[test]
    fn retirements_are_counted_from_their_hand_over_until_they_run() {
        let domain = Domain::new();
        let runs = Arc::new(AtomicU64::new(0));
        let (guard, _) = domain.pin();
        for _ in 0..3 {
            let runs = Arc::clone(&runs);
            // SAFETY: (E1) the closure frees nothing, so it may run anywhere, any time.
            unsafe {
                domain.pending().defer(&guard, move || {
                    runs.fetch_add(1, Ordering::Relaxed);
                })
            };
        }
        let count = || domain.pending().count.load(Ordering::Relaxed);
        assert_eq!(
            count(),
            0,
            "gathered in this thread's batch, not counted yet"
        );
        domain.pending().hand_over(&guard);
        assert_eq!(count(), 3, "handed over, counted until they run");
        drop(guard);
        domain.reclaim();
        assert_eq!(runs.load(Ordering::Relaxed), 3);
        assert_eq!(count(), 0);
    }
}
