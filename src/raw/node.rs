//! An entry node: the key, its single-flight slot, its value cell, the policy's state and the
//! value itself, with the count of its owners ([`Counted`]).
//!
//! A node is one allocation that carries its own strong count ([`NodeRef`], S1 in
//! `strong.rs`). Each table that points at a node holds one strong
//! count of it (**I1**); builders, parked waiters, the eviction queues and the value (while
//! it has owners, C1) hold their own.
//!
//! # Invariants of the value cell
//!
//! - **N1 (cell ownership).** The cell word owns what it names: an untagged non-null word
//!   is the address of the node's own value and one count of it (C1), a `FORWARD` word one
//!   strong count of the node it forwards to, an `OUTCOME` word a `Box<Outcome<V>>` that
//!   nothing replaces. Whoever swaps a word out of the cell takes over what it owns. A node
//!   is never dropped with a value in its cell (the value's owners hold a count of the node,
//!   C1): the shard's `Drop` releases the cells of the nodes still cached; `Drop` releases
//!   a forward or an outcome, once.
//! - **N2 (loom witness).** The loom-only weight witness is written once, by the builder,
//!   before the Release that publishes the value, and read only after acquiring that value.

#![allow(unsafe_code)]

use super::handle::{Count, Counted, Handle};
use super::slot::{Slot, DEAD, LOADING, READY};
use super::strong::{Counts, Strong};
use super::waiters::Waiters;
use crate::policy::EntryMeta;
#[cfg(runcache_loom)]
use crate::sync::UnsafeCell;
use crate::sync::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use crossbeam_epoch::Guard;
use std::any::Any;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::Waker;

/// How a build attempt that cached nothing ended, for the callers that waited on it.
pub(crate) enum Outcome<V> {
    /// The value was built but did not fit: waiters share it, uncached (in an allocation of
    /// its own: the node's stays empty).
    Uncached(Handle<V>),
    /// The builder returned an error.
    Failed(Arc<dyn Any + Send + Sync>),
}

/// What a reader finds in a node.
pub(crate) enum View<'a, K, V> {
    /// The value, and the node that holds it: the node looked at, or the one it forwards to.
    Ready {
        node: &'a Node<K, V>,
        value: &'a V,
    },
    Loading,
    Dead,
}

/// A deadline that never comes (see `deadline`; the expiry that sets deadlines is in
/// `expire/`).
pub(crate) const NEVER: u64 = u64::MAX;

/// Tag of a value cell that forwards to the node that replaced this one.
const FORWARD: usize = 1;
/// Tag of a value cell that holds how a failed or rejected attempt ended (`Box<Outcome>`).
const OUTCOME: usize = 2;
/// Tag of a value cell that holds the token of the thread building the value (`token << 3`;
/// 0 for a task, whose thread may change between polls).
const BUILDER: usize = 4;
/// Tag of a value cell that holds the list of tasks waiting for the build (`Box<Waiters>`,
/// which keeps the builder's token).
const LISTED: usize = BUILDER | OUTCOME;
/// The tag bits.
const TAGS: usize = 7;

/// An entry node.
///
/// A node carries its own strong count ([`NodeRef`]); every table slot that points at one holds a strong
/// count (**I1**). `repr(C)`, with what a hit reads first: the value cell, the key, the
/// value's `Counted` (its 32-bit count and the policy's state, then the value itself), so a
/// `u64 → u64` hit reads the node's first 32 bytes, one cache line for three of the four
/// 16-byte-aligned places a 64-byte block can start at. What writers and the evictor read
/// (the hash, the slot's state, the node's count, the weight) follows the value. A
/// `u64 → u64` node is 64 bytes with the deadline.
#[repr(C)]
pub(crate) struct Node<K, V> {
    /// The value cell (**I4**, **I6**), one of:
    /// - 0: no value (it was removed);
    /// - the address of this node's own value (the cell owns one count of it, C1): the
    ///   cached value;
    /// - a node pointer tagged [`FORWARD`] (the cell owns a strong count of that node): the
    ///   value was replaced, and the replacement lives in that node;
    /// - `token << 3` tagged [`BUILDER`]: the node is loading, built by that thread (used to
    ///   turn same-thread recursion into a clear panic instead of a deadlock);
    /// - a `Box<Waiters>` pointer tagged [`LISTED`] (the cell owns it, L2): the node is
    ///   loading and tasks wait for it; the list keeps the builder's token;
    /// - a `Box<Outcome>` pointer tagged [`OUTCOME`] (the cell owns it): the attempt ended
    ///   without caching, and this is what its waiters get.
    ///
    /// The pointers are 8-aligned (a node's value follows the 8-byte head of its `Counted`,
    /// which is aligned to 8; an `Outcome` is a box of pointers), so the low three bits are
    /// free for the tags. A cell holds a value at most once: builder → list → value, outcome
    /// or 0 (the builder unwound), value → 0 or forward, never back.
    value: AtomicUsize,
    key: K,
    /// The value and the count of its owners (C1): written once (at creation, or by the
    /// builder before publishing), dropped by its last owner.
    counted: Counted<V>,
    /// The key's full hash: where the slot word has no hash tag, probing compares it before
    /// the key.
    pub(crate) hash: u64,
    pub(crate) slot: Slot,
    /// The node's strong counts (S1): tables, builders, waiters, queues, forwards, and its
    /// value's owners together (C1).
    refs: AtomicU32,
    /// The weight reserved for the value (**I5**). Written once, before the value is
    /// published (the Release that publishes it orders the write), and read by threads that
    /// acquired the value or admitted the node.
    weight: AtomicU64,
    /// When the value expires, in nanoseconds of the cache's clock ([`NEVER`] for never): written
    /// before the value is published (like the weight), and moved by reads of a cache whose
    /// reads extend it (X2 in `expire/`). Read only by caches that expire entries.
    deadline: AtomicU64,
    /// Under loom, a copy of the weight in a tracked cell, read by whoever takes the value,
    /// so that the models check that publishing orders the weight before the value.
    #[cfg(runcache_loom)]
    witness: UnsafeCell<u64>,
    _owns: PhantomData<V>,
}

/// A strong count of a node (S1 in `strong.rs`): the engine's `Arc<Node>`.
pub(crate) type NodeRef<K, V> = Strong<Node<K, V>>;

impl<K, V> Counts for Node<K, V> {
    fn refs(&self) -> &AtomicU32 {
        &self.refs
    }
}

// A `u64 → u64` node is 64 bytes with its counts, the policy's state and the deadline: the
// only allocation of the entry, an 80-byte block where the allocator adds 8 bytes of its
// own (64 without the deadline; docs/EXPERIMENTS.md, "A deadline in every node").
#[cfg(not(runcache_loom))]
const _: () = assert!(std::mem::size_of::<Node<u64, u64>>() <= 64);

// SAFETY: (N1) a node owns a `K`, maybe a `V`, an outcome and a node it forwards to; it moves
// between threads with them. All shared state is atomic (the loom-only witness is written
// before the value is published and read after acquiring it).
unsafe impl<K: Send + Sync, V: Send + Sync> Send for Node<K, V> {}
// SAFETY: (N1) as above; `&K` and `&V` are handed to other threads, hence `K: Sync`, `V: Sync`.
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for Node<K, V> {}

impl<K, V> Node<K, V> {
    /// The eviction policy's state of the entry (kept in the value's `Counted`, beside its
    /// count).
    #[inline(always)]
    pub(crate) fn meta(&self) -> &EntryMeta {
        self.counted.meta()
    }

    /// The timer wheel's mark of the entry (X4 in `expire/`).
    #[inline]
    pub(crate) fn wheel_mark(&self) -> &AtomicU8 {
        self.counted.wheel_mark()
    }

    /// [`Ops`](super::handle::Ops) of a node (how a handle keeps and lets go of it): one strong count of it
    /// (S1).
    ///
    /// # Safety
    /// - `c` is the `Counted` of a live node (I1, C2); for `Count::Unhold`, the caller owns
    ///   the count it releases.
    unsafe fn ops(c: NonNull<Counted<V>>, count: Count) {
        let offset = std::mem::offset_of!(Self, counted);
        // (C2) `counted` lies `offset` bytes into its `repr(C)` node.
        let node = c
            .as_ptr()
            .cast_const()
            .wrapping_byte_sub(offset)
            .cast::<Self>();
        // SAFETY: (I1, C2) the caller's contract.
        unsafe {
            match count {
                Count::Hold => NodeRef::increment_strong_count(node),
                Count::Unhold => NodeRef::decrement_strong_count(node),
            }
        }
    }

    /// A new entry node, with one strong count for the caller; with `value` it is created
    /// `READY`, its cell owning the value's one count (which holds one more strong count of
    /// the node, C1), without it `LOADING` for the thread `builder`.
    pub(crate) fn create(
        hash: u64,
        key: K,
        value: Option<(V, u64)>,
        builder: u64,
    ) -> NodeRef<K, V> {
        Self::create_counted(hash, key, value, builder, 0)
    }

    /// [`create`](Self::create), with `extra` more strong counts of the node made with it
    /// (S1), for the caller to hand out as raw counts (a forward, say) without a
    /// read-modify-write each; the `NodeRef` returned is the caller's own count, as in
    /// `create`.
    pub(crate) fn create_counted(
        hash: u64,
        key: K,
        value: Option<(V, u64)>,
        builder: u64,
        extra: u32,
    ) -> NodeRef<K, V> {
        // A node made with its value is made with two counts besides `extra` (S1): the
        // caller's, and the value's own (C1), so that no read-modify-write is needed to take
        // the second.
        let (slot, cell, weight, counted, refs) = match value {
            Some((v, w)) => (Slot::ready(), 0, w, Counted::with(v, 1), 2 + extra),
            None => (
                Slot::loading(),
                (builder << 3) as usize | BUILDER,
                0,
                Counted::empty(),
                1 + extra,
            ),
        };
        let node = NodeRef::new(Self {
            hash,
            value: AtomicUsize::new(cell),
            slot,
            refs: AtomicU32::new(refs),
            key,
            weight: AtomicU64::new(weight),
            deadline: AtomicU64::new(NEVER),
            #[cfg(runcache_loom)]
            witness: UnsafeCell::new(weight),
            counted,
            _owns: PhantomData,
        });
        if cell == 0 {
            let p = node.counted.value_ptr() as usize;
            debug_assert!(p != 0 && p & TAGS == 0, "a value's address is 8-aligned");
            // Relaxed: the node is not shared yet; linking it publishes the cell. The value's
            // own count of its node (C1), released by its last owner, was made with the node.
            node.value.store(p, Ordering::Relaxed);
        }
        node
    }

    /// Publishes the value of a `LOADING` node (its builder calls this once, before
    /// finishing the slot); returns a handle of it for the builder, and the list of waiting
    /// tasks that the cell held, for the builder to close once the slot is finished.
    pub(crate) fn publish(&self, value: V, weight: u64) -> (Handle<V>, Option<Listed>) {
        // SAFETY: (C1) a loading node's value is empty and only its builder (the caller)
        // writes it, before the Release swap below publishes it; two owners: the cell and
        // the handle returned.
        unsafe { self.counted.fill(value, 2) };
        // SAFETY: (I1, C1) the builder holds a count of the node; this is the value's own.
        unsafe { NodeRef::increment_strong_count(self as *const Self) };
        // Relaxed: published by the Release swap below.
        self.weight.store(weight, Ordering::Relaxed);
        // SAFETY: (N2) only the builder writes, once, before the value is published; the witness
        // is read only after acquiring the value.
        #[cfg(runcache_loom)]
        self.witness.with_mut(|w| unsafe { *w = weight });
        // Release: pairs with the Acquire loads of the cell (`view`, `take_if`), publishing
        // the weight and the value. Acquire: the fields of a list of waiting tasks, published
        // by the Release that hung it on the cell (`listen`).
        let prev = self
            .value
            .swap(self.counted.value_ptr() as usize, Ordering::AcqRel);
        // SAFETY: (C1, C2) the second of the two counts `fill` made; this node's ops.
        let handle = unsafe { Handle::adopt(NonNull::from(&self.counted), Self::ops) };
        (handle, Listed::taken(prev))
    }

    /// Ends a `LOADING` attempt that recorded no outcome (its builder unwound or was
    /// dropped): empties the cell, after the slot was finished `DEAD`. Returns the list of
    /// waiting tasks the cell held, for the caller to close.
    pub(crate) fn clear_builder(&self) -> Option<Listed> {
        // Release: pairs with the Acquire of a task reading the cell (`listen`), which then
        // sees the `DEAD` state stored before; Acquire: the list's fields, published by the
        // Release that hung it on the cell.
        Listed::taken(self.value.swap(0, Ordering::AcqRel))
    }

    /// Registers `waker` to be woken when this loading node's attempt ends; `false` if the
    /// attempt is over or about to be (the cell no longer holds a builder's word).
    ///
    /// The caller is pinned (L2): a list read from the cell is retired through the epoch.
    pub(crate) fn listen(&self, waker: &Waker, _guard: &Guard) -> bool {
        let mut c = self.cell();
        loop {
            match c & TAGS {
                BUILDER => {
                    let list = Box::into_raw(Waiters::with((c >> 3) as u64, waker));
                    debug_assert_eq!(list as usize & TAGS, 0);
                    // Release: pairs with the Acquire of the builder's terminal swap and of
                    // other tasks' reads (`listen`, `builder`), publishing the list.
                    match self.value.compare_exchange(
                        c,
                        list as usize | LISTED,
                        Ordering::Release,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return true,
                        Err(now) => {
                            // SAFETY: (L1) never published: ours alone.
                            drop(unsafe { Box::from_raw(list) });
                            c = now;
                        }
                    }
                }
                LISTED => {
                    // SAFETY: (L2) the cell held the list when read under the caller's guard.
                    let list = unsafe { &*((c & !TAGS) as *const Waiters) };
                    if list.push(waker) {
                        return true;
                    }
                    // Closed: the builder swapped it out before closing it (L2), and the
                    // failed push acquired that close, so this load sees the new word.
                    c = self.cell();
                }
                _ => return false,
            }
        }
    }

    /// The value's deadline (see `deadline`).
    #[inline(always)]
    pub(crate) fn deadline(&self) -> u64 {
        // Relaxed: written before the value's Release publication, which the caller followed
        // to the node, or moved by a read, which orders nothing.
        self.deadline.load(Ordering::Relaxed)
    }

    /// Sets the value's deadline: before its publication, or after a read (X2).
    #[inline]
    pub(crate) fn set_deadline(&self, deadline: u64) {
        // Relaxed: see `deadline`.
        self.deadline.store(deadline, Ordering::Relaxed);
    }

    /// The weight reserved for the value, for the policy (which got the node from the thread
    /// that published it).
    pub(crate) fn weight(&self) -> u64 {
        // Relaxed: written before the value's Release publication, which the caller follows.
        self.weight.load(Ordering::Relaxed)
    }

    /// The weight reserved for the value, for a thread that acquired the value (under loom,
    /// the read is checked for that order).
    pub(crate) fn acquired_weight(&self) -> u64 {
        #[cfg(runcache_loom)]
        self.witness.with(|w| {
            // SAFETY: (N2) written once before the value was published; the caller acquired it.
            let witnessed = unsafe { *w };
            debug_assert_eq!(witnessed, self.weight());
        });
        self.weight()
    }

    /// How the attempt of a node whose cell no longer holds a builder's word ended, as far
    /// as its cell tells, for a task that could not register on it (`listen` said `false`):
    /// `READY` for a value (or a forward to its replacement), `DEAD` for an outcome, else
    /// the slot's state, which is `LOADING` only while the builder is between its terminal
    /// swap and the end of the state, with the value already taken out of the cell.
    pub(crate) fn settled(&self) -> u32 {
        // Acquire: pairs with the Release of the terminal swap (`publish`, `set_outcome`).
        let c = self.cell();
        if is_value(c) || c & TAGS == FORWARD {
            READY
        } else if c & TAGS == OUTCOME {
            DEAD
        } else {
            self.slot.state()
        }
    }

    /// The token of the thread building a `LOADING` node (0 once it is not loading, or when
    /// a task builds it). The caller is pinned (L2).
    pub(crate) fn builder(&self, _guard: &Guard) -> u64 {
        // Acquire: pairs with the Release that hung a list on the cell (`listen`); a builder's
        // word was written before the node was linked (the linking CAS is Release).
        let c = self.value.load(Ordering::Acquire);
        match c & TAGS {
            BUILDER => (c >> 3) as u64,
            // SAFETY: (L2) the cell held the list when read under the caller's guard.
            LISTED => unsafe { &*((c & !TAGS) as *const Waiters) }.token(),
            _ => 0,
        }
    }

    /// The value cell's raw word (Acquire: pairs with the Release that stored it).
    #[inline]
    pub(crate) fn cell(&self) -> usize {
        self.value.load(Ordering::Acquire)
    }

    /// Replaces cell word `current` by `new`. AcqRel: Release publishes what `new` points at
    /// (a forwarding node's fields); Acquire makes what `current` pointed at ours.
    pub(crate) fn swap_cell(&self, current: usize, new: usize) -> Result<(), usize> {
        self.value
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
    }

    /// Whether the node holds a cached value right now (a snapshot: a forwarded node does not).
    pub(crate) fn is_cached(&self) -> bool {
        // Relaxed: a snapshot for the eviction policy, which re-checks with a CAS.
        let c = self.value.load(Ordering::Relaxed);
        is_value(c)
    }

    /// The node this one forwards to, if its value was replaced.
    #[inline]
    pub(crate) fn forwarded(&self) -> Option<&Node<K, V>> {
        forward_of(self.cell())
    }

    /// The node this one forwards to according to `cell`, a word read from its cell.
    #[inline]
    pub(crate) fn forwarded_by(&self, cell: usize) -> Option<&Node<K, V>> {
        forward_of(cell)
    }

    /// The node that holds this key's value now: this one, or the end of its forwards.
    #[inline]
    pub(crate) fn resolve(&self) -> &Node<K, V> {
        let mut n = self;
        while let Some(next) = n.forwarded() {
            n = next;
        }
        n
    }

    /// The entry's key.
    #[inline]
    pub(crate) fn key(&self) -> &K {
        &self.key
    }

    /// The node's current state as a reader sees it, following forwards.
    ///
    /// A hit costs one load. A null cell is only conclusive once the state has been read: a
    /// builder may publish between the two loads, so after reading `READY` the cell is loaded
    /// again (the Acquire on the state makes the published value visible to that second
    /// load). Found by the loom model `racing_builders_build_once_and_share_the_value`.
    ///
    /// The caller keeps `self` alive for `'a` (a guard or an `Arc` count); a value read from
    /// a cell under `guard` is released only through the epoch (I6), and a node forwarded to
    /// lives as long as the node whose cell counts it.
    #[inline(always)]
    pub(crate) fn view<'a>(&'a self, _guard: &'a Guard) -> View<'a, K, V> {
        let mut n = self;
        loop {
            let mut c = n.cell();
            if is_value(c) {
                // The common case first: an untagged, non-null cell is the value. (Folding
                // this into the general path below measured slower on 1M-key hits.)
                // SAFETY: (I6) the address of the node's value, alive while the guard is (I6).
                let value = unsafe { &*(c as *const V) };
                return View::Ready { node: n, value };
            }
            if c == 0 || c & (OUTCOME | BUILDER) != 0 {
                match n.slot.state() {
                    LOADING => return View::Loading,
                    READY => c = n.cell(),
                    _ => return View::Dead,
                }
                if c == 0 || c & (OUTCOME | BUILDER) != 0 {
                    return View::Dead;
                }
            }
            if let Some(next) = forward_of(c) {
                n = next;
                continue;
            }
            // SAFETY: (I6) the address of the node's value, alive while the guard is (I6).
            let value = unsafe { &*(c as *const V) };
            return View::Ready { node: n, value };
        }
    }

    #[inline]
    pub(crate) fn is_live(&self, guard: &Guard) -> bool {
        !matches!(self.view(guard), View::Dead)
    }

    /// Records how a failed or rejected attempt ended. Called once, before `Slot::finish`;
    /// returns the list of waiting tasks the cell held, for the builder to close after it.
    pub(crate) fn set_outcome(&self, outcome: Outcome<V>) -> Option<Listed> {
        let p = Box::into_raw(Box::new(outcome)) as usize;
        debug_assert_eq!(p & TAGS, 0);
        // Release: pairs with the Acquire of a task reading the cell (`settled`), publishing
        // the outcome (threads look at it after acquiring `DEAD` from `Slot::finish`).
        // Acquire: the list's fields, published by the Release that hung it on the cell.
        Listed::taken(self.value.swap(p | OUTCOME, Ordering::AcqRel))
    }

    /// Takes the key and value back out of a node that was never shared: `node` is its one
    /// strong count besides its value's.
    pub(crate) fn into_parts(node: NodeRef<K, V>) -> (K, Option<V>) {
        // Relaxed: never shared.
        let c = node.value.swap(0, Ordering::Relaxed);
        debug_assert!(
            c & TAGS == 0 || c & TAGS == BUILDER,
            "a node never shared holds no outcome, no list and forwards nowhere"
        );
        let value = is_value(c).then(|| {
            // SAFETY: (N1, C1) the cell's count was the value's only one, and nobody else
            // reaches the node; the value is read out once, and its count of the node goes.
            unsafe {
                let v = node.counted.take();
                NodeRef::decrement_strong_count(NodeRef::as_ptr(&node));
                v
            }
        });
        let node = NodeRef::into_inner(node)
            .unwrap_or_else(|| unreachable!("a node that was never shared has one count"));
        let this = std::mem::ManuallyDrop::new(node);
        // SAFETY: (N1) `this` is never dropped, so the key is read out exactly once. The
        // slot, the policy state and the emptied cell and value own nothing to drop.
        let key = unsafe { std::ptr::read(&this.key) };
        (key, value)
    }

    /// Releases the count of a cached value that the cell still owns, for a shard that is
    /// dropping with the node still in its table (a node in two tables is met twice: the
    /// cell is emptied the first time, so the count goes once).
    ///
    /// # Safety
    /// - No reader can reach the node any more (the cache is dropping).
    pub(crate) unsafe fn release_cached(&self) {
        // Relaxed: the cache is dropping; nothing is concurrent. (Only a value is taken out:
        // a forward or an outcome stays for `Drop`.)
        let c = self.value.load(Ordering::Relaxed);
        if is_value(c) {
            self.value.store(0, Ordering::Relaxed);
            // SAFETY: (N1, C1) the cell's count, taken out of it here, once.
            unsafe { release_value::<K, V>(c as *const V) };
        }
    }

    /// The outcome of a `DEAD` attempt, if it recorded one.
    pub(crate) fn outcome(&self) -> Option<&Outcome<V>> {
        // Relaxed: the caller read `DEAD` with Acquire, which pairs with `finish`'s Release.
        let c = self.value.load(Ordering::Relaxed);
        // SAFETY: (N1) the outcome box lives until the node drops (nothing replaces an outcome),
        // and the caller keeps the node alive (a guard or an `Arc` count).
        (c & TAGS == OUTCOME).then(|| unsafe { &*((c & !TAGS) as *const Outcome<V>) })
    }
}

impl<K, V> Drop for Node<K, V> {
    fn drop(&mut self) {
        // Relaxed: `&mut self`: nobody else can reach the node.
        let c = self.value.load(Ordering::Relaxed);
        let p = c & !TAGS;
        debug_assert!(!is_value(c), "a node drops with a value in its cell (N1)");
        match c & TAGS {
            // SAFETY: (N1) the cell's strong count of the node it forwards to.
            FORWARD => drop(unsafe { NodeRef::from_raw(p as *const Node<K, V>) }),
            // SAFETY: (N1) created by `Box::into_raw` in `set_outcome`, owned by the cell.
            OUTCOME => drop(unsafe { Box::from_raw(p as *mut Outcome<V>) }),
            // SAFETY: (L2) a list still in the cell is the cell's (every attempt's end takes
            // it out; this is a loading node the cache dropped with).
            LISTED => drop(unsafe { Box::from_raw(p as *mut Waiters) }),
            _ => {}
        }
    }
}

/// The list of waiting tasks that an attempt's terminal swap took out of the cell: closed
/// and retired by the builder (L2).
pub(crate) struct Listed(NonNull<Waiters>);

impl Listed {
    /// The list in `prev`, a word the builder's terminal swap took out of the cell.
    fn taken(prev: usize) -> Option<Self> {
        debug_assert!(
            prev & TAGS == BUILDER || prev & TAGS == LISTED,
            "an attempt ends once, by its builder"
        );
        (prev & TAGS == LISTED)
            .then(|| Self(NonNull::new((prev & !TAGS) as *mut Waiters).expect("a list")))
    }

    /// The list.
    pub(crate) fn waiters(&self) -> &Waiters {
        // SAFETY: (L2) the builder owns the list it took out of the cell until it retires it.
        unsafe { self.0.as_ref() }
    }

    /// Frees the list.
    ///
    /// # Safety
    /// - No task can still reach it: readers that loaded the cell before the terminal swap
    ///   have unpinned (L2).
    pub(crate) unsafe fn free(self) {
        // SAFETY: (L2) the caller's contract; made by `Box::into_raw` in `listen`.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

// SAFETY: (L1, L2) a list is shared state made of atomics and wakers (`Send + Sync`); the
// builder hands its pointer to the collector's thread to free.
unsafe impl Send for Listed {}

/// Whether a cell word is a value: untagged and not null. In one compare: rotating the three
/// tag bits to the top leaves a value's word in `1..2^61` and moves a tagged word above it,
/// while null (rotated, less one) wraps to the top.
#[inline(always)]
fn is_value(cell: usize) -> bool {
    cell.rotate_right(3).wrapping_sub(1) < (usize::MAX >> 3)
}

/// The node a cell word forwards to, if it is a forward.
#[inline]
fn forward_of<'a, K, V>(cell: usize) -> Option<&'a Node<K, V>> {
    // SAFETY: (N1) a forwarding cell holds a strong count of its target, so the target lives as
    // long as the node whose cell was read, which the caller keeps alive for `'a`.
    (cell & TAGS == FORWARD).then(|| unsafe { &*((cell & !TAGS) as *const Node<K, V>) })
}

/// The word a cell holds to forward to the node at `node`, taking over a strong count of it
/// that the caller owns (one that [`Node::create_counted`] made, say) for the cell.
///
/// # Safety
/// - The caller owns one strong count of `node` (S1), which it gives to the cell.
pub(crate) unsafe fn forward_counted<K, V>(node: *const Node<K, V>) -> usize {
    node as usize | FORWARD
}

/// The value a cell word holds, if it holds one.
#[inline]
pub(crate) fn value_of<'a, V>(cell: usize) -> Option<&'a V> {
    // SAFETY: (I6) the address of a node's value; the caller keeps it alive for `'a` (a guard
    // under which the cell was read, I6).
    is_value(cell).then(|| unsafe { &*(cell as *const V) })
}

/// A new handle of a node's value borrowed from a cell.
#[inline(always)]
pub(crate) fn handle_of<K, V>(value: &V) -> Handle<V> {
    // SAFETY: (I6, C1) a value in a cell is a node's own, and the cell's count keeps it alive
    // while the caller's guard is (I6): its count is above 0 while this takes one more.
    unsafe { Handle::acquire(Counted::of_value(value), Node::<K, V>::ops) }
}

/// Releases one count of a node's value, as its owner (C1).
///
/// # Safety
/// - `value` is the address of a node's value, and the caller owns one count of it (one a
///   cell held, say), which it does not use again.
pub(crate) unsafe fn release_value<K, V>(value: *const V) {
    // SAFETY: (C1, C2) the caller's contract.
    drop(unsafe { Handle::adopt(NonNull::from(Counted::of_value(value)), Node::<K, V>::ops) });
}

/// Releases one count of a node's value and one count of a node, as [`release_value`] and
/// a `NodeRef`'s drop would, in that order. When the value is the node's own and this was
/// its last owner, the node loses the value's count (C1) and the caller's in one
/// read-modify-write instead of two: the retirement of a removed or replaced entry.
///
/// # Safety
/// - `value` is as [`release_value`] requires; the caller owns one strong count of `node`
///   (S1), which it does not use again.
pub(crate) unsafe fn release_value_and_node<K, V>(value: *const V, node: *const Node<K, V>) {
    // SAFETY: (S1) the caller's count keeps the node alive; only an address is computed.
    let own = std::ptr::eq(value, unsafe { (*node).counted.value_ptr() });
    if !own {
        // SAFETY: (C1, S1) the caller's contract.
        unsafe {
            release_value::<K, V>(value);
            NodeRef::decrement_strong_count(node);
        }
        return;
    }
    // SAFETY: (C1, S1) the caller owns one count of the value and one of the node; when the
    // value's count ends, the count of the node taken for the value (C1) is the caller's to
    // release, with its own.
    unsafe {
        let last = Counted::of_value(value).release_in_place();
        NodeRef::decrement_strong_count_by(node, 1 + u32::from(last));
    }
}

/// Takes a count of a node found under a guard, so it outlives the guard.
pub(crate) fn hold<K, V>(node: &Node<K, V>) -> NodeRef<K, V> {
    let p: *const Node<K, V> = node;
    // SAFETY: (I1, S1) `node` is alive (the caller is pinned, or holds a count) and counted (S1),
    // so taking one more strong count is valid.
    unsafe {
        NodeRef::increment_strong_count(p);
        NodeRef::from_raw(p)
    }
}

impl<K, V> crate::policy::Queued for NodeRef<K, V> {
    fn meta(&self) -> &EntryMeta {
        Node::meta(self)
    }

    fn weight(&self) -> u64 {
        Node::weight(self)
    }

    fn hash(&self) -> u64 {
        self.hash
    }

    fn is_cached(&self) -> bool {
        Node::is_cached(self)
    }

    fn id(&self) -> usize {
        NodeRef::as_ptr(self) as usize
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;

    #[test]
    fn is_value_agrees_with_untagged_and_not_null() {
        let plain = |c: usize| c != 0 && c & TAGS == 0;
        let mut words = vec![
            0,
            usize::MAX,
            usize::MAX & !TAGS,
            1 << 63,
            (1 << 63) | FORWARD,
        ];
        for base in [0usize, 8, 16, 4096, 0x7fff_ffff_fff8, usize::MAX & !TAGS] {
            for tag in 0..=TAGS {
                words.push(base | tag);
            }
        }
        let v = Arc::new(7u64);
        words.push(Arc::as_ptr(&v) as usize);
        for c in words {
            assert_eq!(is_value(c), plain(c), "cell word {c:#x}");
        }
    }

    proptest::proptest! {
        #[test]
        fn is_value_agrees_on_any_word(c in proptest::prelude::any::<usize>()) {
            proptest::prop_assert_eq!(is_value(c), c != 0 && c & TAGS == 0);
        }
    }
}
