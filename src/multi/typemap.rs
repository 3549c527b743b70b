//! An append-only lock-free map from `TypeId` to a boxed value, for the multi-cache's table of
//! per-type caches.
//!
//! Entries are only ever added, never removed until the map drops, so a lookup needs no epoch
//! pin and no reference count: it walks one bucket's list and compares `TypeId`s.
//!
//! # Invariants
//!
//! - **T1.** A node, once linked, is never unlinked or freed before the map drops, so a
//!   reference into it lives as long as `&self`.
//! - **T2.** Each `TypeId` is linked at most once: an insert links only after finding the key
//!   absent, with a CAS on the bucket head that fails if the bucket changed since.
//! - **T3.** A node is owned by the inserting thread alone until its CAS links it: it may be
//!   changed or freed only before that CAS succeeds.

#![allow(unsafe_code)]

use crate::sync::{AtomicPtr, Ordering};
use std::any::TypeId;

const BUCKETS: usize = 64;

struct Node<V> {
    key: TypeId,
    value: V,
    next: *mut Node<V>,
}

/// See the module docs.
pub(crate) struct TypeMap<V> {
    buckets: [AtomicPtr<Node<V>>; BUCKETS],
}

// SAFETY: (T1) the map owns its values and hands out shared references to them (`V: Sync`); values
// are dropped on whichever thread drops the map (`V: Send`).
unsafe impl<V: Send + Sync> Send for TypeMap<V> {}
// SAFETY: (T1) as above; nodes are immutable once linked (T1).
unsafe impl<V: Send + Sync> Sync for TypeMap<V> {}

#[inline]
fn bucket(key: &TypeId) -> usize {
    use std::hash::BuildHasher;
    // foldhash, fixed seed: a few instructions per lookup (SipHash would dominate a hit).
    let h = foldhash::fast::FixedState::with_seed(0x5EED).hash_one(key);
    (h as usize) % BUCKETS
}

impl<V> TypeMap<V> {
    pub(crate) fn new() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
        }
    }

    fn find(&self, head: *mut Node<V>, key: &TypeId) -> Option<&V> {
        let mut p = head;
        while !p.is_null() {
            // SAFETY: (T1) linked nodes live as long as `&self` (T1), and were fully written before
            // the Release CAS that linked them, which the caller's Acquire load paired with.
            let node = unsafe { &*p };
            if node.key == *key {
                return Some(&node.value);
            }
            p = node.next;
        }
        None
    }

    /// The value for `key`, if any. No lock, no pin, no allocation.
    #[inline]
    pub(crate) fn get(&self, key: &TypeId) -> Option<&V> {
        // Acquire: pairs with the Release CAS in `get_or_insert`.
        self.find(self.buckets[bucket(key)].load(Ordering::Acquire), key)
    }

    /// The value for `key`, inserting `make()` if it is absent. `make` may run on several
    /// threads at once for one key; only one result is kept (T2), the others are dropped.
    pub(crate) fn get_or_insert(&self, key: TypeId, make: impl FnOnce() -> V) -> &V {
        let slot = &self.buckets[bucket(&key)];
        // Acquire: pairs with the Release CAS below.
        let mut head = slot.load(Ordering::Acquire);
        if let Some(v) = self.find(head, &key) {
            return v;
        }
        let node = Box::into_raw(Box::new(Node {
            key,
            value: make(),
            next: head,
        }));
        loop {
            // Release: publishes the node's fields to `get`'s Acquire load.
            match slot.compare_exchange(head, node, Ordering::Release, Ordering::Acquire) {
                // SAFETY: (T1) just linked; lives as long as `&self` (T1).
                Ok(_) => return unsafe { &(*node).value },
                Err(actual) => {
                    head = actual;
                    if let Some(v) = self.find(head, &key) {
                        // SAFETY: (T3) `node` was never linked; we still own it.
                        drop(unsafe { Box::from_raw(node) });
                        return v;
                    }
                    // SAFETY: (T3) not linked yet, so still ours to change.
                    unsafe { (*node).next = head };
                }
            }
        }
    }

    /// The value stored under `TypeId::of::<T>()`, as a `T`, inserting `make()` if absent.
    pub(crate) fn typed<T: Send + Sync + 'static>(&self, make: impl FnOnce() -> V) -> &T
    where
        V: AsAny,
    {
        let key = TypeId::of::<T>();
        let v = match self.get(&key) {
            Some(v) => v,
            None => self.get_or_insert(key, make),
        };
        debug_assert!(v.as_any().is::<T>());
        // SAFETY: (T1, T2) callers store under `TypeId::of::<T>()` only a value whose `as_any` is a
        // `T` (checked above in debug builds), and each key is linked once (T2), so the erased
        // pointer points to a `T` that lives as long as `&self` (T1).
        unsafe { &*(v.as_any() as *const (dyn std::any::Any + Send + Sync) as *const T) }
    }

    /// Calls `f` on every value.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&V)) {
        for slot in &self.buckets {
            // Acquire: as in `get`.
            let mut p = slot.load(Ordering::Acquire);
            while !p.is_null() {
                // SAFETY: (T1) as in `find`.
                let node = unsafe { &*p };
                f(&node.value);
                p = node.next;
            }
        }
    }
}

impl<V> Drop for TypeMap<V> {
    fn drop(&mut self) {
        for slot in &self.buckets {
            // Relaxed: `&mut self`.
            let mut p = slot.load(Ordering::Relaxed);
            while !p.is_null() {
                // SAFETY: (T1) every linked node came from `Box::into_raw` and is freed once, here.
                let node = unsafe { Box::from_raw(p) };
                p = node.next;
            }
        }
    }
}

/// A value that erases to `dyn Any`: what [`TypeMap::typed`] casts back.
pub(crate) trait AsAny {
    fn as_any(&self) -> &(dyn std::any::Any + Send + Sync);
}
