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
use std::cell::{Cell, RefCell};
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

/// The registration a thread used last: `(cache id, handle, stats block)`.
type Last = (u64, *const LocalHandle, *const StatsBlock);

struct ThreadState {
    token: Cell<u64>,
    locals: RefCell<Vec<Local>>,
    /// The entry of `locals` that the last pin used, so a thread that works with one cache
    /// at a time skips the borrow and the scan. It stays valid while that cache lives: an
    /// entry leaves `locals` only when its cache drops (ids are never reused, so a stale
    /// `last` never matches again), when dead caches' entries are pruned, or when the thread's
    /// locals are released (which resets it).
    last: Cell<Last>,
}

crate::sync::local_key! {
    static THREAD: ThreadState = ThreadState {
        token: Cell::new(0),
        locals: RefCell::new(Vec::new()),
        last: Cell::new((0, std::ptr::null(), std::ptr::null())),
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
        t.last.set((0, std::ptr::null(), std::ptr::null()));
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
    #[inline]
    pub(crate) fn pin(&self) -> (Guard, &StatsBlock) {
        let fast = THREAD.try_with(|t| {
            let (id, handle, stats) = t.last.get();
            if id == self.id {
                return Some((handle, stats));
            }
            let locals = t.locals.try_borrow().ok()?;
            let local = locals.iter().find(|l| l.id == self.id)?;
            let found = (&*local.handle as *const LocalHandle, local.stats);
            t.last.set((self.id, found.0, found.1));
            Some(found)
        });
        let (handle, stats) = match fast {
            Ok(Some(found)) => found,
            Ok(None) => match self.register() {
                Some(found) => found,
                None => return self.pin_unregistered(),
            },
            Err(_) => return self.pin_unregistered(),
        };
        // The handle is boxed in this thread's entry for this cache, removed only when the cache
        // drops (impossible while `&self` lives) or the thread's locals are destroyed or
        // released (which also resets `last`).
        // SAFETY: so the handle is alive; the stats block lives as long as `self.stats`.
        unsafe { ((*handle).pin(), &*stats) }
    }

    fn pin_unregistered(&self) -> (Guard, &StatsBlock) {
        // Dropping the handle while its guard lives is fine: crossbeam finalizes the
        // participant only when both its handle and guard counts reach zero.
        let handle = self.collector.register();
        (handle.pin(), self.stats.shared())
    }

    #[cold]
    fn register(&self) -> Option<(*const LocalHandle, *const StatsBlock)> {
        let (found, dead) = THREAD
            .try_with(|t| {
                let mut locals = t.locals.try_borrow_mut().ok()?;
                let (live, dead): (Vec<Local>, Vec<Local>) = std::mem::take(&mut *locals)
                    .into_iter()
                    .partition(|l| l.alive.strong_count() > 0);
                *locals = live;
                let handle = Box::new(self.collector.register());
                let stats = self.stats.register();
                let found = (&*handle as *const LocalHandle, stats);
                locals.push(Local {
                    id: self.id,
                    alive: Arc::downgrade(&self.alive),
                    handle,
                    stats,
                });
                Some((found, dead))
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
