//! One epoch [`Collector`] per cache, the thread-local handles that pin it, and the way
//! retired entries reach it.
//!
//! # Registration
//!
//! crossbeam-epoch's free `pin()` uses one global collector; runcache gives every cache its own
//! so that caches (and tests, and loom models) never share garbage, and so that the last
//! handle to a cache's collector runs every deferred destructor of that cache (invariant
//! **I7**). Registering a thread with a collector allocates, so each thread keeps a
//! thread-local map of its [`Registration`]s (`registry.rs`) by cache id, one per cache it
//! used: its handle, its statistics block and its batch of retirements. Pinning checks the
//! entry the thread used last (one compare), else looks the id up in that map (one hash, so a
//! thread that has used ten thousand caches pays what one that used ten does), then calls
//! crossbeam's own pin. The cache keeps every registration in its own list too, so that it
//! can reach them all: see `retire.rs` for how retirements travel, and the teardown below.
//!
//! # Teardown
//!
//! Dropping a cache releases every registration still held, whichever thread holds it and
//! whether that thread is alive or idle: each one's batch goes to the collector and its
//! handle is finalized (its epoch bag to the collector's queue, its reference to the
//! collector dropped). A thread that is releasing its own registration at that moment (it is
//! exiting) finishes first. Then the cache's own reference is the collector's last, so every
//! deferred destructor of the cache runs before `drop` returns. A thread's entry for a dropped
//! cache keeps only the few words of its released registration, until the thread registers
//! with enough caches to prune its map (`Locals::prune`) or exits. Values still in the table are dropped by the
//! cache's own `Drop`, exactly once, at once.
//!
//! When the thread-local list cannot be used (during thread teardown, or re-entrantly from a
//! destructor running inside a pin), the caller registers a temporary handle and uses the
//! cache's shared statistics block: slower, never wrong.
//!
//! # Invariants
//!
//! - **E1 (deferral).** Everything handed to a collector (alone, or in a batch) was retired
//!   under a guard of that same collector, and may run on any thread once every thread
//!   pinned at its hand-over has unpinned: the contract of [`Guard::defer_unchecked`]. A
//!   batch may be handed over by a thread other than the one that gathered it: its items
//!   were unlinked before they were gathered, and the swap that takes the batch (Acquire)
//!   follows the store that left it (Release), so the hand-over comes after the unlinking.
//! - **E2 (retirements run once).** A `Retired` holds one closure of at most two words,
//!   stored in place; it is run (moved out) by its `Drop` and nowhere else, and a `Batch`
//!   drops exactly its first `len` items, then the batches below it. A batch is owned by one
//!   place at a time (a registration's batch word, the ready stack, a deferred function, or
//!   whoever swapped it out of one of these) and dropped only by a deferred function, or by
//!   the cache's `Drop` when no reader remains.
//! - **E3 (the remembered registration).** [`Last`] is touched only by its own thread; while
//!   its id is not 0 its handle copy and registration pointer name an entry still in
//!   `locals`, and readers copy the handle out instead of borrowing it in place.
//! - **E4 (registrations).** A registration's handle is used only by the thread that holds
//!   it, or by the one caller whose compare and swap moved it out of `HELD` (the thread
//!   itself, or the cache's `Drop`, which no call into the cache can overlap). That caller
//!   hands the batch over, finalizes the handle once, and stores `FREE` (Release); a thread
//!   takes a free registration back with an Acquire compare and swap. Registrations are
//!   freed only when the last of the cache's list and the threads' entries lets go.
//! - **E5 (nothing out of reach).** Between calls into the cache, each of its retirements is
//!   in a registration's batch, on its ready stack, or in its collector's queue, never in a
//!   thread's epoch bag: every deferral is followed by a flush within the same call. So the
//!   cache's `Drop`, which reaches the first two and owns the third once the handles are
//!   released, frees them all.

#![allow(unsafe_code)]

mod batch;
mod registry;
mod retire;

use super::counter::{StatsBlock, StatsRegistry};
use crate::sync::{yield_now, Ordering};
use crossbeam_epoch::{Collector, Guard, LocalHandle};
use foldhash::fast::FixedState;
use registry::Registration;
pub(crate) use retire::Pending;
use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::HashMap;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::sync::{Arc, Weak};

/// Rounds in a row without progress after which [`Domain::reclaim`] gives up: an item retired
/// at epoch `e` is freed once the global epoch reaches `e + 2`, and each round advances it at
/// most once, so a few rounds with nothing freed mean a thread pinned elsewhere holds the rest.
const RECLAIM_STALL_ROUNDS: usize = 8;

/// Ids of caches and of threads; never reused. A std atomic on purpose: a `static` needs a
/// `const` constructor, which loom's atomics lack, and an id orders nothing.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_id() -> u64 {
    // Relaxed: only uniqueness matters.
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A thread's entry for one cache.
struct Local {
    id: u64,
    alive: Weak<()>,
    reg: Arc<Registration>,
    pending: Arc<Pending>,
}

impl Drop for Local {
    /// Releases the registration unless the cache's `Drop` did (E4): hands its batch and the
    /// ready stack to the collector, then finalizes the handle.
    fn drop(&mut self) {
        self.pending.release(&self.reg, thread_token());
    }
}

/// The registration a thread used last.
struct Last {
    /// Its cache's id; 0 (no cache's id) when there is none.
    id: Cell<u64>,
    /// A bitwise copy of its handle, initialized whenever `id` is not 0. Pinning through the
    /// copy saves a dependent load (the handle's address) on every pin, and a pin's locked
    /// instruction waits for that chain of loads. A `LocalHandle` names its participant
    /// through a pointer and `pin` takes `&self`, so a copy is a second name for the same
    /// participant. It is valid exactly as long as the original (see [`ThreadState::last`])
    /// and is never dropped (only the original counts as a handle).
    handle: UnsafeCell<MaybeUninit<LocalHandle>>,
    stats: Cell<*const StatsBlock>,
    /// Its registration, valid while `id` is not 0 (as `handle`).
    reg: Cell<*const Registration>,
}

impl Last {
    /// Remembers `local`, which stays in this thread's `locals`.
    fn set(&self, local: &Local) {
        // SAFETY: (E3, E4) only its own thread, holding `local`'s registration, touches
        // `last`, and no reference into `handle` lives across calls (readers copy it out);
        // the old copy is overwritten without a drop, as every copy must be (see `handle`).
        unsafe { (*self.handle.get()).write(std::ptr::read(local.reg.handle())) };
        self.stats.set(local.reg.stats);
        self.reg.set(Arc::as_ptr(&local.reg));
        self.id.set(local.id);
    }

    /// A copy of the handle of cache `id` if this is its registration, and its stats block.
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

/// A thread's entries, one per cache it used, by cache id: a lookup costs the same with ten
/// caches or ten thousand (a thread that round-robins over many caches looks one up on
/// every pin).
struct Locals {
    by_id: HashMap<u64, Local, FixedState>,
    /// The entry count at which the next registration first prunes the entries of dropped
    /// caches: twice the live count after the last prune (at least [`PRUNE_FLOOR`]), so a
    /// prune's walk is paid for by as many registrations as it walks.
    prune_at: usize,
}

/// The fewest entries a thread keeps before it prunes those of dropped caches: fewer prunes
/// more often (each a walk of the entries), more keeps more released registrations (a few
/// words each) around.
const PRUNE_FLOOR: usize = 16;

impl Locals {
    fn new() -> Self {
        Self {
            by_id: HashMap::with_hasher(FixedState::default()),
            prune_at: PRUNE_FLOOR,
        }
    }

    /// Takes out the entries of dropped caches, if a prune is due; the caller drops them
    /// once it no longer borrows the list.
    fn prune(&mut self) -> Vec<Local> {
        if self.by_id.len() < self.prune_at {
            return Vec::new();
        }
        let dead: Vec<u64> = self
            .by_id
            .values()
            .filter(|l| l.alive.strong_count() == 0)
            .map(|l| l.id)
            .collect();
        let dead = dead
            .into_iter()
            .filter_map(|id| self.by_id.remove(&id))
            .collect();
        self.prune_at = (2 * self.by_id.len()).max(PRUNE_FLOOR);
        dead
    }
}

impl Drop for Locals {
    /// Releases the entries oldest first, in the order they were made, as the list this map
    /// replaced did: releasing one may run destructors that use caches registered after it.
    fn drop(&mut self) {
        let mut all: Vec<Local> = self.by_id.drain().map(|(_, local)| local).collect();
        all.sort_unstable_by_key(|local| local.id);
        for local in all {
            drop(local);
        }
    }
}

struct ThreadState {
    token: Cell<u64>,
    locals: RefCell<Locals>,
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
        locals: RefCell::new(Locals::new()),
        last: Last {
            id: Cell::new(0),
            handle: UnsafeCell::new(MaybeUninit::uninit()),
            stats: Cell::new(std::ptr::null()),
            reg: Cell::new(std::ptr::null()),
        },
    };
}

impl ThreadState {
    /// Runs `f` on this thread's registration for cache `id`; `None` if the thread has no
    /// entry for that cache, or its list is borrowed (a destructor run from inside
    /// `register`, say).
    #[inline]
    fn with_registration<R>(&self, id: u64, f: impl FnOnce(&Registration) -> R) -> Option<R> {
        if self.last.id.get() == id {
            // Callers pass the id of a live cache (one they are working in), and `last`
            // holds a live cache's id only while the entry it names is in `locals`: an
            // entry leaves when its cache drops or after (pruned), or with all of them
            // (which resets `last`).
            // SAFETY: (E3) so the entry is live, and its registration with it.
            let reg = unsafe { &*self.last.reg.get() };
            return Some(f(reg));
        }
        let locals = self.locals.try_borrow().ok()?;
        let local = locals.by_id.get(&id)?;
        Some(f(&local.reg))
    }
}

/// Runs `f` on the calling thread's registration for cache `id`, if it has one it can reach.
#[inline]
fn with_registration<R>(id: u64, f: impl FnOnce(&Registration) -> R) -> Option<R> {
    THREAD
        .try_with(|t| t.with_registration(id, f))
        .ok()
        .flatten()
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
            .map(|mut l| std::mem::replace(&mut *l, Locals::new()))
            .ok()
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
    /// would cost a third of a pin and unpin (`docs/EXPERIMENTS.md`, "Where the time goes, by
    /// profile").
    #[inline(always)]
    pub(crate) fn pin(&self) -> (Guard, &StatsBlock) {
        match THREAD.try_with(|t| t.last.get(self.id)) {
            // `handle` is a copy of the handle of this thread's registration for this cache,
            // released only when the cache drops (impossible while `&self` lives) or the
            // thread's locals are destroyed or released (which also resets `last`); so the
            // participant is registered.
            // SAFETY: (R2) the stats block lives as long as `self.stats`.
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
            let local = locals.by_id.get(&self.id)?;
            t.last.set(local);
            t.last.get(self.id)
        });
        let ((handle, stats), registered) = match found {
            Ok(Some(found)) => (found, false),
            Ok(None) => match self.register() {
                Some(found) => (found, true),
                None => return self.pin_unregistered(),
            },
            Err(_) => return self.pin_unregistered(),
        };
        let guard = handle.pin();
        if registered {
            // A new thread: the maintenance token must be on its way (it is, unless it could
            // not re-arm itself last time).
            self.pending.arm(&guard);
        }
        // As in `pin`. SAFETY: (R2) as in `pin`.
        (guard, unsafe { &*stats })
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
                let dead = locals.prune();
                let reg = self
                    .pending
                    .registry
                    .hold(self.collector.register(), || self.stats.register());
                let local = Local {
                    id: self.id,
                    alive: Arc::downgrade(&self.alive),
                    reg,
                    pending: Arc::clone(&self.pending),
                };
                t.last.set(&local);
                locals.by_id.insert(self.id, local);
                Some((t.last.get(self.id)?, dead))
            })
            .ok()??;
        // Dropped after the borrow ends: releasing a registration may run destructors that
        // use other caches on this thread.
        drop(dead);
        Some(found)
    }

    /// The count of this cache's retired items not yet freed, for whoever retires one.
    pub(crate) fn pending(&self) -> &Arc<Pending> {
        &self.pending
    }

    /// Runs deferred destructors that no pinned thread can still need. The first round takes
    /// every thread's batch of retirements to the collector (so what idle or exited threads
    /// retired is included); each round pins, flushes and lets the collector advance the
    /// epoch and free what expired (a bounded number of bags per round). Rounds go on until
    /// everything retired is freed, or until a few rounds in a row free nothing. When no
    /// other thread is pinned, that frees everything retired so far, whichever threads
    /// retired it; a thread pinned elsewhere holds back only what it could still see.
    pub(crate) fn reclaim(&self) {
        let round = || {
            let (guard, _) = self.pin();
            let releasing = self.pending.hand_over_all(&guard);
            // Collects: advances the epoch if it can and frees what expired.
            guard.flush();
            releasing
        };
        let mut stalled = 0;
        let mut releasing = round();
        let mut last = self.pending.count();
        while (last > 0 || releasing) && stalled < RECLAIM_STALL_ROUNDS {
            if releasing {
                // A thread is releasing its registration (it is exiting): its batch reaches
                // the collector in a moment.
                yield_now();
            }
            releasing = round();
            let now = self.pending.count();
            stalled = if now < last || releasing {
                0
            } else {
                stalled + 1
            };
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
        self.pending.close();
        let mine = THREAD.try_with(|t| {
            if t.last.id.get() == self.id {
                t.last.id.set(0);
            }
            let mut locals = t.locals.try_borrow_mut().ok()?;
            locals.by_id.remove(&self.id)
        });
        // Dropped outside the borrow (see `register`): this releases this thread's own
        // registration.
        drop(mine);
        // Every other registration: released here if its thread still holds it (idle or
        // alive elsewhere), or waited for if its thread is releasing it right now (E4).
        let me = thread_token();
        for reg in self.pending.registry.iter() {
            if !self.pending.release(reg, me) {
                // Not held: released already, or another thread is releasing it; then wait
                // for it to finish, unless the releaser
                // is this very thread, further up its stack (a destructor its release ran
                // dropped this cache): then the release finishes after this `drop`, and the
                // collector's last reference goes with it.
                while reg.releaser().is_some_and(|r| r != me) {
                    yield_now();
                }
            }
        }
        // Nothing is left on the ready stack (each release handed it over); whatever a
        // concurrent release left there runs now.
        self.pending.drop_ready();
        // `self.collector` drops right after this: every handle is finalized, so it is the
        // collector's last reference, and every deferred destructor of the cache runs then
        // (E5).
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::batch::{Batch, Retired, BATCH};
    use super::*;
    use crate::sync::AtomicU64;
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

    /// This thread's entry count, for the tests.
    fn entries() -> usize {
        THREAD.with(|t| t.locals.borrow().by_id.len())
    }

    #[test]
    fn a_thread_keeps_one_entry_per_live_cache_and_prunes_the_dropped_ones() {
        std::thread::spawn(|| {
            let live: Vec<Domain> = (0..100).map(|_| Domain::new()).collect();
            for d in &live {
                drop(d.pin());
            }
            // Pinning each again, in any order, finds its entry: no new one is made.
            for d in live.iter().rev() {
                drop(d.pin());
            }
            assert_eq!(entries(), 100);
            // Caches made, used and dropped: a dropped cache takes its entry on this thread
            // with it.
            for _ in 0..1_000 {
                let d = Domain::new();
                drop(d.pin());
            }
            assert_eq!(entries(), 100);
            // Caches that another thread drops leave this thread's entries behind (released,
            // a few words each); this thread prunes them once its map has doubled, so it
            // never holds much more than twice its live entries.
            let elsewhere: Vec<Domain> = (0..1_000).map(|_| Domain::new()).collect();
            for d in &elsewhere {
                drop(d.pin());
            }
            assert_eq!(entries(), 1_100);
            std::thread::spawn(move || drop(elsewhere)).join().unwrap();
            let most = THREAD.with(|t| t.locals.borrow().prune_at);
            assert!(most <= 2 * 1_100);
            let more: Vec<Domain> = (0..1_000).map(|_| Domain::new()).collect();
            for d in &more {
                drop(d.pin());
                assert!(entries() <= most);
            }
            assert_eq!(entries(), 1_100, "the dropped caches' entries were pruned");
            let mine = |d: &Domain| THREAD.with(|t| t.locals.borrow().by_id.contains_key(&d.id));
            assert!(live.iter().chain(&more).all(mine));
        })
        .join()
        .unwrap();
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
        let count = || domain.pending().count();
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
