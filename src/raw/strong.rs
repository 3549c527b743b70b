//! [`Strong`]: a strong count of an entry node (`NodeRef` in `node.rs`), kept in the node
//! itself.
//!
//! An `Arc<Node>` would put two count words (strong and weak) before the node, and nothing in
//! the engine uses a weak count. A node carries its own strong count instead (`Node::refs`),
//! so an entry is one allocation of the node alone, 8 bytes smaller than in an `Arc`, and
//! the count is the crate's to manage (under loom it is a loom atomic, so the models explore
//! it).
//! The interface mirrors the `Arc` functions the engine used (`into_raw`, `from_raw`,
//! `increment_strong_count`, `decrement_strong_count`), so every ownership rule that cites
//! I1 reads the same.
//!
//! # Invariants
//!
//! - **S1 (the count).** A node's `refs` is the number of strong counts of it that exist:
//!   each `NodeRef` ([`Strong`]), and each raw pointer made by [`Strong::into_raw`] or
//!   counted by [`Strong::increment_strong_count`] and not yet given back. It is created with
//!   the node's box at the number of counts its maker takes at once: the `Strong` that
//!   [`Strong::new`] returns, and owners the node's constructor counted in advance (a node
//!   made with its value counts the value's own, C1 in `handle.rs`). The release that takes
//!   it to 0 drops the box, once; one release may give up several counts
//!   ([`Strong::decrement_strong_count_by`]) that its caller owns.

#![allow(unsafe_code)]

use crate::sync::{fence, AtomicU32, Ordering};
use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::NonNull;

/// The most counts a node may have: beyond, as `Arc` does, the process aborts rather than
/// risk the count wrapping (which would free a node still in use). A node's counts are its
/// tables, builders, waiters, queue entries, forwards and one for its value's owners
/// together, so 32 bits hold them with half the range to spare (threads racing past the
/// check cannot wrap it).
const MAX_REFS: u32 = i32::MAX as u32;

/// What carries its own strong count: a node (`Node::refs`).
pub(crate) trait Counts {
    /// The strong count (S1).
    fn refs(&self) -> &AtomicU32;
}

/// One strong count of a `T` that carries its own (S1); dereferences to it. Nodes use it
/// as `NodeRef<K, V>` (`node.rs`).
pub(crate) struct Strong<T: Counts> {
    ptr: NonNull<T>,
    _owns: PhantomData<T>,
}

// SAFETY: (S1) a `Strong` shares its `T` between threads as an `Arc<T>` does (a node is
// `Send + Sync` exactly when its key and value are).
unsafe impl<T: Counts + Send + Sync> Send for Strong<T> {}
// SAFETY: (S1) as above.
unsafe impl<T: Counts + Send + Sync> Sync for Strong<T> {}

impl<T: Counts> Strong<T> {
    /// Moves `node` into its own allocation. Its count (at least 1) is this `Strong` and
    /// the owners its constructor counted in advance (S1), whose counts the caller hands out.
    pub(crate) fn new(node: T) -> Self {
        debug_assert!(node.refs().load(Ordering::Relaxed) >= 1);
        Self {
            ptr: NonNull::from(Box::leak(Box::new(node))),
            _owns: PhantomData,
        }
    }

    /// The node's address.
    pub(crate) fn as_ptr(this: &Self) -> *const T {
        this.ptr.as_ptr()
    }

    /// Gives the count up as a raw pointer, to be taken back by [`from_raw`](Self::from_raw)
    /// or released by [`decrement_strong_count`](Self::decrement_strong_count).
    pub(crate) fn into_raw(this: Self) -> *const T {
        let p = this.ptr.as_ptr();
        std::mem::forget(this);
        p
    }

    /// Takes a count back from a raw pointer.
    ///
    /// # Safety
    /// - `p` came from [`into_raw`](Self::into_raw) or carries a count taken by
    ///   [`increment_strong_count`](Self::increment_strong_count) (S1), which the caller
    ///   gives up.
    pub(crate) unsafe fn from_raw(p: *const T) -> Self {
        Self {
            // SAFETY: (S1) a counted node's address is never null.
            ptr: unsafe { NonNull::new_unchecked(p.cast_mut()) },
            _owns: PhantomData,
        }
    }

    /// Takes one more count of the node at `p`.
    ///
    /// # Safety
    /// - The node at `p` is alive: the caller holds a count of it, or is pinned where a
    ///   table that counts it can be read (I1, H3).
    pub(crate) unsafe fn increment_strong_count(p: *const T) {
        // SAFETY: (S1) the caller's contract.
        let refs = unsafe { &*p }.refs();
        // Relaxed: as `Arc::clone`: the caller's own access to the node orders what it reads,
        // and a new count publishes nothing.
        if refs.fetch_add(1, Ordering::Relaxed) > MAX_REFS {
            std::process::abort();
        }
    }

    /// Releases one count of the node at `p`, dropping the node if it was the last.
    ///
    /// # Safety
    /// - The caller owns the count it releases (S1), and does not use `p` after.
    pub(crate) unsafe fn decrement_strong_count(p: *const T) {
        // SAFETY: (S1) the caller's contract.
        drop(unsafe { Self::from_raw(p) });
    }

    /// Releases `n` counts of the node at `p` with one read-modify-write, dropping the node
    /// if they were the last: what `n` calls of
    /// [`decrement_strong_count`](Self::decrement_strong_count) do, for one write of the
    /// node's count line instead of `n`.
    ///
    /// # Safety
    /// - The caller owns the `n` counts it releases (S1), and does not use `p` after.
    pub(crate) unsafe fn decrement_strong_count_by(p: *const T, n: u32) {
        // SAFETY: (S1) the caller owns counts of the node, so it is alive.
        let refs = unsafe { &*p }.refs();
        // Release: as in `drop`, for each of the `n` counts at once.
        let old = refs.fetch_sub(n, Ordering::Release);
        debug_assert!(old >= n, "released {n} counts of a node that had {old}");
        if old != n {
            return;
        }
        // Acquire: as in `drop`.
        fence(Ordering::Acquire);
        // SAFETY: (S1) the last counts: the box is ours to drop, once.
        drop(unsafe { Box::from_raw(p.cast_mut()) });
    }

    /// The node, if this is its only count: the allocation is freed, the node handed back.
    pub(crate) fn into_inner(this: Self) -> Option<T> {
        // Acquire: as `Arc::into_inner`, pairs with the Release of the other counts' releases,
        // so their accesses to the node happen before the caller's.
        if this
            .refs()
            .compare_exchange(1, 0, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        let p = Self::into_raw(this).cast_mut();
        // SAFETY: (S1) the count was the last one: nobody else can reach the box.
        Some(*unsafe { Box::from_raw(p) })
    }
}

impl<T: Counts> Clone for Strong<T> {
    fn clone(&self) -> Self {
        // SAFETY: (S1) `self` is a count of the node, which keeps it alive.
        unsafe { Self::increment_strong_count(self.ptr.as_ptr()) };
        Self {
            ptr: self.ptr,
            _owns: PhantomData,
        }
    }
}

impl<T: Counts> Deref for Strong<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: (S1) a count keeps the node alive.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: Counts> Drop for Strong<T> {
    fn drop(&mut self) {
        // Release: as `Arc`'s drop, so this count's accesses to the node happen before the
        // last release's drop of it, which acquires them (the fence below).
        if self.refs().fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        fence(Ordering::Acquire);
        // SAFETY: (S1) the last count: the box is ours to drop, once.
        drop(unsafe { Box::from_raw(self.ptr.as_ptr()) });
    }
}
