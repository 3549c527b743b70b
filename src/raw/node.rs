//! An entry node: the key, its single-flight slot, its value cell and the policy's state.
//!
//! Nodes are allocated as `Arc<Node>`. Each table that points at a node holds one strong
//! count of it (**I1**); builders, parked waiters and the eviction queues hold their own.

use super::slot::{Slot, LOADING, READY};
use crate::policy::EntryMeta;
use crate::sync::{AtomicPtr, Ordering, UnsafeCell};
use crossbeam_epoch::{Atomic, Guard};
use std::any::Any;
use std::sync::Arc;

/// A cached value and the weight reserved for it (**I5**), immutable once made.
///
/// The contents sit in the sync shim's `UnsafeCell` only so that loom sees every read of a
/// published box and can flag one that is not ordered after the box's creation.
pub(crate) struct Published<V> {
    data: UnsafeCell<(Arc<V>, u64)>,
}

// SAFETY: the contents are written once, in `new`, before the box is shared, and only read
// afterwards; reading `Arc<V>` from several threads needs `V: Send + Sync`, like `Arc` itself.
unsafe impl<V: Send + Sync> Sync for Published<V> {}

impl<V> Published<V> {
    pub(crate) fn new(value: Arc<V>, weight: u64) -> Self {
        Self {
            data: UnsafeCell::new((value, weight)),
        }
    }

    /// The value.
    #[inline]
    pub(crate) fn value(&self) -> &Arc<V> {
        // SAFETY: the contents are never written after `new` (see the `Sync` impl).
        self.data.with(|p| unsafe { &(*p).0 })
    }

    /// The weight reserved for it.
    pub(crate) fn weight(&self) -> u64 {
        // SAFETY: as in `value`.
        self.data.with(|p| unsafe { (*p).1 })
    }

    /// The value and the weight, taken back by an insert that was refused.
    pub(crate) fn into_parts(self) -> (Arc<V>, u64) {
        self.data.into_inner()
    }
}

/// How a build attempt that cached nothing ended, for the callers that waited on it.
pub(crate) enum Outcome<V> {
    /// The value was built but did not fit: waiters share it, uncached.
    Uncached(Arc<V>),
    /// The builder returned an error.
    Failed(Arc<dyn Any + Send + Sync>),
}

/// What a reader finds in a node.
pub(crate) enum View<'g, V> {
    Ready(&'g Published<V>),
    Loading,
    Dead,
}

/// An entry node.
///
/// Nodes are allocated as `Arc<Node>`; every table slot that points at one holds a strong
/// count (**I1**).
pub(crate) struct Node<K, V> {
    /// The key's full hash: probing compares it before the key.
    pub(crate) hash: u64,
    key: K,
    pub(crate) slot: Slot,
    /// The cached value; null while loading and after removal (**I4**).
    pub(crate) value: Atomic<Published<V>>,
    /// Set once, before the slot turns `DEAD`, when an attempt ends without caching.
    outcome: AtomicPtr<Outcome<V>>,
    /// The eviction policy's state for this entry.
    pub(crate) meta: EntryMeta,
}

impl<K, V> Node<K, V> {
    /// A new entry node; with `value` it is created `READY`, without it `LOADING` for the
    /// thread `builder`.
    pub(crate) fn new(hash: u64, key: K, value: Option<Box<Published<V>>>, builder: u64) -> Self {
        let (slot, value) = match value {
            Some(v) => (Slot::ready(), Atomic::from(Box::into_raw(v) as *const _)),
            None => (Slot::loading(builder), Atomic::null()),
        };
        Self {
            hash,
            key,
            slot,
            value,
            outcome: AtomicPtr::new(std::ptr::null_mut()),
            meta: EntryMeta::new(),
        }
    }

    /// Whether the node holds a cached value right now (a snapshot; nothing is read through
    /// the pointer).
    pub(crate) fn is_cached(&self) -> bool {
        // SAFETY: the pointer is only compared with null, never dereferenced, so no guard is
        // needed to keep what it points to alive.
        let guard = unsafe { crossbeam_epoch::unprotected() };
        // Relaxed: a snapshot for the eviction policy, which re-checks with a swap.
        !self.value.load(Ordering::Relaxed, guard).is_null()
    }

    /// The entry's key.
    #[inline]
    pub(crate) fn key(&self) -> &K {
        &self.key
    }

    /// The node's current state as a reader sees it.
    ///
    /// A hit costs one load. A null cell is only conclusive once the state has been read: a
    /// builder may publish between the two loads, so after reading `READY` the cell is loaded
    /// again (the Acquire on the state makes the published box visible to that second load).
    /// Found by the loom model `racing_builders_build_once_and_share_the_value`.
    #[inline]
    pub(crate) fn view<'g>(&self, guard: &'g Guard) -> View<'g, V> {
        if let Some(p) = self.ready(guard) {
            return View::Ready(p);
        }
        match self.slot.state() {
            LOADING => View::Loading,
            READY => self.ready(guard).map_or(View::Dead, View::Ready),
            _ => View::Dead,
        }
    }

    #[inline]
    fn ready<'g>(&self, guard: &'g Guard) -> Option<&'g Published<V>> {
        // Acquire: pairs with the Release store/CAS that published the box (`build_into`,
        // `RawCache::insert`).
        let v = self.value.load(Ordering::Acquire, guard);
        // SAFETY: a box read from the value cell under `guard` is destroyed only through the
        // epoch after being swapped out (I6), so it lives as long as the guard.
        unsafe { v.as_ref() }
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

    /// Takes the key and value box back out of a node that was never shared.
    pub(crate) fn into_parts(self) -> (K, Option<Box<Published<V>>>) {
        let this = std::mem::ManuallyDrop::new(self);
        // Relaxed: the node was never shared.
        debug_assert!(this.outcome.load(Ordering::Relaxed).is_null());
        // SAFETY: `this` is never dropped, so the key is read out exactly once.
        let key = unsafe { std::ptr::read(&this.key) };
        // SAFETY: never shared, so the cell's box is ours; it is taken out exactly once.
        let value = unsafe {
            let v = this
                .value
                .load(Ordering::Relaxed, crossbeam_epoch::unprotected());
            (!v.is_null()).then(|| v.into_owned().into_box())
        };
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
        // SAFETY: `&mut self`: nobody else can reach the node; the box is owned by the cell.
        unsafe {
            let v = self
                .value
                .load(Ordering::Relaxed, crossbeam_epoch::unprotected());
            if !v.is_null() {
                drop(v.into_owned());
            }
        }
        // Relaxed: `&mut self`.
        let o = self.outcome.load(Ordering::Relaxed);
        if !o.is_null() {
            // SAFETY: created by `Box::into_raw` in `set_outcome`, dropped once here.
            drop(unsafe { Box::from_raw(o) });
        }
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
