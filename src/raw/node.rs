//! An entry node: the key, its single-flight slot, its value cell and the policy's state.
//!
//! Nodes are allocated as `Arc<Node>`. Each table that points at a node holds one strong
//! count of it (**I1**); builders, parked waiters and the eviction queues hold their own.

use super::slot::{Slot, LOADING, READY};
use crate::policy::EntryMeta;
use crate::sync::{AtomicPtr, AtomicUsize, Ordering, UnsafeCell};
use crossbeam_epoch::Guard;
use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;

/// How a build attempt that cached nothing ended, for the callers that waited on it.
pub(crate) enum Outcome<V> {
    /// The value was built but did not fit: waiters share it, uncached.
    Uncached(Arc<V>),
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

/// Tag bit of a value cell that forwards to the node that replaced this one.
const FORWARD: usize = 1;

/// An entry node.
///
/// Nodes are allocated as `Arc<Node>`; every table slot that points at one holds a strong
/// count (**I1**).
pub(crate) struct Node<K, V> {
    /// The key's full hash: probing compares it before the key.
    pub(crate) hash: u64,
    key: K,
    /// The value cell (**I4**, **I6**), one of:
    /// - 0: no value (the node is loading, or its value was removed);
    /// - a pointer from `Arc::into_raw` (the cell owns that count): the cached value;
    /// - a node pointer tagged [`FORWARD`] (the cell owns a strong count of that node): the
    ///   value was replaced, and the replacement lives in that node.
    ///
    /// Both pointers point into `Arc` allocations, whose two counters make them at least
    /// 8-aligned, so bit 0 is free for the tag. A cell holds a value at most once: 0 → value
    /// → 0 or forward, never back.
    value: AtomicUsize,
    /// The weight reserved for the value (**I5**). Written once, before the value is
    /// published (the Release that publishes it orders the write), and read only by threads
    /// that acquired the value: in the shim's `UnsafeCell`, so that loom checks that order.
    weight: UnsafeCell<u64>,
    pub(crate) slot: Slot,
    /// Set once, before the slot turns `DEAD`, when an attempt ends without caching.
    outcome: AtomicPtr<Outcome<V>>,
    /// The eviction policy's state for this entry.
    pub(crate) meta: EntryMeta,
    _owns: PhantomData<Arc<V>>,
}

// SAFETY: a node owns a `K`, maybe an `Arc<V>` and a node it forwards to; it moves between
// threads with them. All shared state is atomic except `weight`, which is written only
// before the value is published and read only after acquiring it (see the field).
unsafe impl<K: Send + Sync, V: Send + Sync> Send for Node<K, V> {}
// SAFETY: as above; `&K` and `&V` are handed to other threads, hence `K: Sync`, `V: Sync`.
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for Node<K, V> {}

impl<K, V> Node<K, V> {
    /// A new entry node; with `value` it is created `READY`, without it `LOADING` for the
    /// thread `builder`.
    pub(crate) fn new(hash: u64, key: K, value: Option<(Arc<V>, u64)>, builder: u64) -> Self {
        let (slot, cell, weight) = match value {
            Some((v, w)) => (Slot::ready(), Arc::into_raw(v) as usize, w),
            None => (Slot::loading(builder), 0, 0),
        };
        Self {
            hash,
            key,
            value: AtomicUsize::new(cell),
            weight: UnsafeCell::new(weight),
            slot,
            outcome: AtomicPtr::new(std::ptr::null_mut()),
            meta: EntryMeta::new(),
            _owns: PhantomData,
        }
    }

    /// Publishes the value of a `LOADING` node (its builder calls this once, before
    /// finishing the slot).
    pub(crate) fn publish(&self, value: Arc<V>, weight: u64) {
        // SAFETY: only the builder writes, once, before the value is published; nobody reads
        // the weight before acquiring the value (see the field).
        self.weight.with_mut(|w| unsafe { *w = weight });
        // Release: pairs with the Acquire loads of the cell (`view`, `take`), publishing the
        // weight and the value.
        let prev = self
            .value
            .swap(Arc::into_raw(value) as usize, Ordering::Release);
        debug_assert_eq!(prev, 0, "a value cell is filled once");
    }

    /// The weight reserved for the value. Only for a thread that acquired the value.
    pub(crate) fn weight(&self) -> u64 {
        // SAFETY: written once before the value was published; the caller acquired it.
        self.weight.with(|w| unsafe { *w })
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
        c != 0 && c & FORWARD == 0
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
    #[inline]
    pub(crate) fn view<'a>(&'a self, _guard: &'a Guard) -> View<'a, K, V> {
        let mut n = self;
        loop {
            let mut c = n.cell();
            if c == 0 {
                match n.slot.state() {
                    LOADING => return View::Loading,
                    READY => c = n.cell(),
                    _ => return View::Dead,
                }
                if c == 0 {
                    return View::Dead;
                }
            }
            if let Some(next) = forward_of(c) {
                n = next;
                continue;
            }
            // SAFETY: a value pointer from `Arc::into_raw`, alive while the guard is (I6).
            let value = unsafe { &*(c as *const V) };
            return View::Ready { node: n, value };
        }
    }

    #[inline]
    pub(crate) fn is_live(&self, guard: &Guard) -> bool {
        !matches!(self.view(guard), View::Dead)
    }

    /// Records how a failed or rejected attempt ended. Called once, before `Slot::finish`.
    pub(crate) fn set_outcome(&self, outcome: Outcome<V>) {
        let p = Box::into_raw(Box::new(outcome));
        // Relaxed: published by the Release swap in `Slot::finish` that follows.
        let prev = self.outcome.swap(p, Ordering::Relaxed);
        debug_assert!(prev.is_null(), "an attempt's outcome was set twice");
    }

    /// Takes the key and value back out of a node that was never shared.
    pub(crate) fn into_parts(self) -> (K, Option<Arc<V>>) {
        let this = std::mem::ManuallyDrop::new(self);
        // Relaxed: the node was never shared.
        debug_assert!(this.outcome.load(Ordering::Relaxed).is_null());
        // SAFETY: `this` is never dropped, so the key is read out exactly once.
        let key = unsafe { std::ptr::read(&this.key) };
        // Relaxed: never shared.
        let c = this.value.load(Ordering::Relaxed);
        debug_assert_eq!(c & FORWARD, 0, "a node never shared forwards nowhere");
        // SAFETY: the cell's count of the value, taken out exactly once.
        let value = (c != 0).then(|| unsafe { Arc::from_raw(c as *const V) });
        // The slot, the policy state and the (null) outcome own nothing that needs dropping.
        (key, value)
    }

    /// The outcome of a `DEAD` attempt, if it recorded one.
    pub(crate) fn outcome(&self) -> Option<&Outcome<V>> {
        // Relaxed: the caller read `DEAD` with Acquire, which pairs with `finish`'s Release.
        let p = self.outcome.load(Ordering::Relaxed);
        // SAFETY: the outcome box lives until the node drops, and the caller keeps the node
        // alive (a guard or an `Arc` count).
        unsafe { p.as_ref() }
    }
}

impl<K, V> Drop for Node<K, V> {
    fn drop(&mut self) {
        // Relaxed: `&mut self`: nobody else can reach the node.
        let c = self.value.load(Ordering::Relaxed);
        if c & FORWARD != 0 {
            // SAFETY: the cell's strong count of the node it forwards to.
            drop(unsafe { Arc::from_raw((c & !FORWARD) as *const Node<K, V>) });
        } else if c != 0 {
            // SAFETY: the cell's count of its value.
            drop(unsafe { Arc::from_raw(c as *const V) });
        }
        // Relaxed: `&mut self`.
        let o = self.outcome.load(Ordering::Relaxed);
        if !o.is_null() {
            // SAFETY: created by `Box::into_raw` in `set_outcome`, dropped once here.
            drop(unsafe { Box::from_raw(o) });
        }
    }
}

/// The node a cell word forwards to, if it is a forward.
#[inline]
fn forward_of<'a, K, V>(cell: usize) -> Option<&'a Node<K, V>> {
    // SAFETY: a forwarding cell holds a strong count of its target, so the target lives as
    // long as the node whose cell was read, which the caller keeps alive for `'a`.
    (cell & FORWARD != 0).then(|| unsafe { &*((cell & !FORWARD) as *const Node<K, V>) })
}

/// The word a cell holds to forward to `node` (taking a strong count of it for the cell).
pub(crate) fn forward_to<K, V>(node: Arc<Node<K, V>>) -> usize {
    Arc::into_raw(node) as usize | FORWARD
}

/// The node pointer inside a forwarding word made by [`forward_to`].
pub(crate) fn unforward<K, V>(word: usize) -> *const Node<K, V> {
    debug_assert_eq!(word & FORWARD, FORWARD);
    (word & !FORWARD) as *const Node<K, V>
}

/// The value a cell word holds, if it holds one.
#[inline]
pub(crate) fn value_of<'a, V>(cell: usize) -> Option<&'a V> {
    // SAFETY: a value pointer from `Arc::into_raw`; the caller keeps it alive for `'a` (a
    // guard under which the cell was read, I6).
    (cell != 0 && cell & FORWARD == 0).then(|| unsafe { &*(cell as *const V) })
}

/// A new `Arc` of a value borrowed from a cell.
#[inline]
pub(crate) fn arc_of<V>(value: &V) -> Arc<V> {
    let p: *const V = value;
    // SAFETY: every value in a cell came from `Arc::into_raw` and is alive (the caller holds
    // it under a guard), so taking one more strong count is valid.
    unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    }
}

/// Takes a count of a node found under a guard, so it outlives the guard.
pub(crate) fn hold<K, V>(node: &Node<K, V>) -> Arc<Node<K, V>> {
    let p: *const Node<K, V> = node;
    // SAFETY: `node` is alive (the caller is pinned) and was allocated as `Arc<Node>` (I1),
    // so taking one more strong count is valid.
    unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    }
}

impl<K, V> crate::policy::Queued for Arc<Node<K, V>> {
    fn meta(&self) -> &EntryMeta {
        &self.meta
    }

    fn hash(&self) -> u64 {
        self.hash
    }

    fn is_cached(&self) -> bool {
        Node::is_cached(self)
    }

    fn id(&self) -> usize {
        Arc::as_ptr(self) as usize
    }
}
