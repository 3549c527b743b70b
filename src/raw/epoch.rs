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

use super::counter::{StatsBlock, StatsRegistry};
use crossbeam_epoch::{Collector, Guard, LocalHandle};
use std::cell::{Cell, RefCell, UnsafeCell};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Rounds in a row without progress after which [`Domain::reclaim`] gives up: an item retired
/// at epoch `e` is freed once the global epoch reaches `e + 2`, and each round advances it at
/// most once, so a few rounds with nothing freed mean a thread pinned elsewhere holds the rest.
const RECLAIM_STALL_ROUNDS: usize = 8;

/// Everything this cache handed to its collector — value boxes, unlinked nodes (which may
/// hold a key, and an uncached value or an error for late waiters), retired tables — whose
/// destructor has not run yet.
///
/// Shared with each deferred destructor (which may run after the cache is gone, on whichever
/// thread collects), so [`Domain::reclaim`] can tell when everything has been freed. Every bag
/// of this cache's own retirements holds counted items, so a round that frees one lowers the
/// count; only bags of crossbeam's own queue nodes (which collecting itself retires) do not,
/// and those queue up behind the bags they came from.
#[derive(Default)]
pub(crate) struct Pending(AtomicU64);

impl Pending {
    /// Hands `free` to `guard`'s collector, counted here until it has run.
    ///
    /// # Safety
    /// As [`Guard::defer_unchecked`]: `free` may run on any thread once no thread pinned now
    /// is pinned any more, and must be sound then.
    pub(crate) unsafe fn defer(self: &Arc<Self>, guard: &Guard, free: impl FnOnce()) {
        // Relaxed: a progress count (see `Retiring`'s `Drop`).
        self.0.fetch_add(1, Ordering::Relaxed);
        let counted = Retiring(Arc::clone(self));
        // SAFETY: the caller's contract; the count only drops after `free` has run.
        unsafe {
            guard.defer_unchecked(move || {
                free();
                drop(counted);
            })
        };
    }
}

/// One retired item, counted in [`Pending`] until this drops.
struct Retiring(Arc<Pending>);

impl Drop for Retiring {
    fn drop(&mut self) {
        // Relaxed: a progress count for `reclaim`; it orders nothing.
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Ids of caches and of threads; never reused.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    // Relaxed: only uniqueness matters.
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

struct Local {
    id: u64,
    alive: Weak<()>,
    handle: Box<LocalHandle>,
    stats: *const StatsBlock,
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
}

impl Last {
    /// Remembers `local`, which stays in this thread's `locals`.
    fn set(&self, local: &Local) {
        // SAFETY: `last` is only touched by its own thread, and no reference into `handle`
        // lives across calls (readers copy it out first). The old copy is overwritten
        // without a drop, as every copy must be (see `handle`).
        unsafe { (*self.handle.get()).write(std::ptr::read(&*local.handle)) };
        self.stats.set(local.stats);
        self.id.set(local.id);
    }

    /// A copy of the handle of cache `id` if this is its registration.
    #[inline(always)]
    fn get(&self, id: u64) -> Option<(ManuallyDrop<LocalHandle>, *const StatsBlock)> {
        if self.id.get() != id {
            return None;
        }
        // SAFETY: `id` is not 0 (no cache has it), so `handle` is initialized; the copy is
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
        },
    };
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
        Self {
            collector: Collector::new(),
            id: next_id(),
            alive: Arc::new(()),
            pending: Arc::default(),
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
            // participant is registered. SAFETY: the stats block lives as long as
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
        // As in `pin`. SAFETY: as in `pin`.
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
        let pending = || self.pending.0.load(Ordering::Relaxed);
        let mut stalled = 0;
        let mut last = pending();
        while last > 0 && stalled < RECLAIM_STALL_ROUNDS {
            let (guard, _) = self.pin();
            guard.flush();
            drop(guard);
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
