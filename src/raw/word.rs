//! A table slot's word: a node pointer, three state bits in its alignment, and 16 bits of
//! the key's hash above the address.
//!
//! The hash tag lets a probe pass over the slots of other keys without loading their nodes:
//! a miss usually loads no node at all, and a hit loads only its own. Without it every
//! occupied slot on a probe costs a dependent load, usually a cache miss (see
//! `docs/DESIGN.md`, "Hash tags in the slot word").
//!
//! The tag lives in bits 48–63, so it is only used where user-space addresses fit in 48 bits:
//! 64-bit x86 and ARM, except Android, whose allocator tags the top byte of heap pointers.
//! Elsewhere [`HASH_TAGS`] is off, every word's tag is 0 and every probe loads the node, as
//! before. [`Word::node`] checks each node's address, so an allocator that breaks the
//! assumption stops the program with a message instead of corrupting a pointer.
//!
//! The word keeps the pointer's provenance (`AtomicPtr`, `map_addr`): the tag and state bits
//! are cleared before any dereference.

#![allow(unsafe_code)]

use crate::sync::{AtomicPtr, Ordering};
use crossbeam_epoch::Guard;
use std::marker::PhantomData;

/// Whether slot words carry a hash tag on this target.
pub(crate) const HASH_TAGS: bool = cfg!(all(
    target_pointer_width = "64",
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(target_os = "android")
));

/// The state bits, free in any node pointer (nodes are at least 8-byte aligned).
const STATE: usize = 0b111;
/// Where the hash tag starts.
const TAG_SHIFT: u32 = if HASH_TAGS { 48 } else { 0 };
/// The address bits.
const ADDRESS: usize = if HASH_TAGS {
    ((1usize << TAG_SHIFT) - 1) & !STATE
} else {
    !STATE
};
/// The hash tag's bits.
const TAG: usize = !(ADDRESS | STATE);

/// The tag bits a slot word holding a node of `hash` carries: bits 32–47 of the hash, which
/// neither the slot index (the low bits) nor the shard (the top bits) uses up in practice.
#[inline]
pub(crate) fn hash_tag(hash: u64) -> usize {
    if HASH_TAGS {
        ((hash >> 32) as usize & 0xffff) << TAG_SHIFT
    } else {
        0
    }
}

/// A slot word read under a guard: a possibly null node pointer with state bits and a tag.
pub(crate) struct Word<'g, N> {
    raw: *mut N,
    _guard: PhantomData<(&'g Guard, *const N)>,
}

impl<N> Clone for Word<'_, N> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<N> Copy for Word<'_, N> {}

impl<N> PartialEq for Word<'_, N> {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl<N> std::fmt::Debug for Word<'_, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Word({:p}, state {})", self.as_raw(), self.tag())
    }
}

impl<'g, N> Word<'g, N> {
    fn from_raw(raw: *mut N) -> Self {
        Self {
            raw,
            _guard: PhantomData,
        }
    }

    /// The null word with no state bits: `EMPTY`.
    pub(crate) fn null() -> Self {
        Self::from_raw(std::ptr::null_mut())
    }

    /// The word of node `p`, whose key hashes to `hash`, with no state bits.
    ///
    /// # Panics
    /// If `p`'s address uses the tag's bits: the platform broke the assumption [`HASH_TAGS`]
    /// rests on (see the module docs). Never on the targets it is on, in practice.
    pub(crate) fn node(p: *const N, hash: u64) -> Self {
        assert!(
            p.addr() & TAG == 0,
            "runcache: a node was allocated at {p:p}, an address above the 48 bits that \
             slot words leave to pointers on this target"
        );
        debug_assert!(p.addr() & STATE == 0, "nodes are 8-byte aligned");
        Self::from_raw(p.cast_mut().map_addr(|a| a | hash_tag(hash)))
    }

    /// The state bits.
    #[inline]
    pub(crate) fn tag(self) -> usize {
        self.raw.addr() & STATE
    }

    /// The same word with state bits `state` instead.
    #[inline]
    pub(crate) fn with_tag(self, state: usize) -> Self {
        debug_assert!(state & !STATE == 0);
        Self::from_raw(self.raw.map_addr(|a| (a & !STATE) | state))
    }

    /// Whether the word holds no node.
    #[inline]
    pub(crate) fn is_null(self) -> bool {
        self.raw.addr() & ADDRESS == 0
    }

    /// Whether the word may hold a node of a key whose [`hash_tag`] is `tag`: it holds no
    /// node of any other key that this check can exclude.
    #[inline]
    pub(crate) fn may_hold(self, tag: usize) -> bool {
        self.raw.addr() & TAG == tag
    }

    /// The node pointer, without state bits or tag.
    #[inline]
    pub(crate) fn as_raw(self) -> *const N {
        self.raw.map_addr(|a| a & ADDRESS)
    }

    /// The node, if the word holds one.
    ///
    /// # Safety
    /// A non-null word must point at a node that outlives `'g`: one a table held while the
    /// guard was pinned (**H3**).
    #[inline]
    pub(crate) unsafe fn as_ref(self) -> Option<&'g N> {
        // SAFETY: (H3) the caller's contract; a null address gives `None`.
        unsafe { self.as_raw().as_ref() }
    }

    /// The node the word holds.
    ///
    /// # Safety
    /// As for [`as_ref`](Self::as_ref), and the word is not null.
    #[inline]
    pub(crate) unsafe fn deref(self) -> &'g N {
        // SAFETY: (H3) the caller's contract.
        unsafe { &*self.as_raw() }
    }
}

/// A table slot: an atomic [`Word`].
pub(crate) struct SlotWord<N>(AtomicPtr<N>);

impl<N> SlotWord<N> {
    /// An `EMPTY` slot.
    pub(crate) fn null() -> Self {
        Self(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// Loads the word; `guard` bounds how long a node read from it may be used.
    #[inline]
    pub(crate) fn load<'g>(&self, order: Ordering, _guard: &'g Guard) -> Word<'g, N> {
        Word::from_raw(self.0.load(order))
    }

    /// Replaces `current` with `new`; on failure, returns what the slot held.
    #[inline]
    pub(crate) fn compare_exchange<'g>(
        &self,
        current: Word<'_, N>,
        new: Word<'_, N>,
        success: Ordering,
        failure: Ordering,
        _guard: &'g Guard,
    ) -> Result<Word<'g, N>, Word<'g, N>> {
        self.0
            .compare_exchange(current.raw, new.raw, success, failure)
            .map(Word::from_raw)
            .map_err(Word::from_raw)
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_word_keeps_pointer_state_and_tag_apart() {
        let node = Box::into_raw(Box::new(7u64));
        let hash = 0x1234_5678_9abc_def0;
        let w: Word<'_, u64> = Word::node(node, hash);
        assert_eq!(w.as_raw(), node.cast_const());
        assert_eq!(w.tag(), 0);
        assert!(!w.is_null());
        assert!(w.may_hold(hash_tag(hash)));
        if HASH_TAGS {
            assert!(!w.may_hold(hash_tag(hash ^ (1 << 40))));
        }
        let frozen = w.with_tag(1);
        assert_eq!(frozen.tag(), 1);
        assert_eq!(frozen.as_raw(), node.cast_const());
        assert!(frozen.may_hold(hash_tag(hash)));
        assert_eq!(frozen.with_tag(0), w);
        // SAFETY: (H3) `node` is a live box owned by this test, so no guard is needed for it.
        assert_eq!(unsafe { *frozen.deref() }, 7);
        let tomb: Word<'_, u64> = Word::null().with_tag(4);
        assert!(tomb.is_null());
        assert_eq!(tomb.tag(), 4);
        // SAFETY: (H3) from `Box::into_raw` above, released once.
        drop(unsafe { Box::from_raw(node) });
    }

    #[test]
    fn a_slot_swaps_whole_words() {
        let node = Box::into_raw(Box::new(1u64));
        let guard = crossbeam_epoch::pin();
        let slot = SlotWord::null();
        let w = Word::node(node, 42);
        assert!(slot
            .compare_exchange(Word::null(), w, Ordering::AcqRel, Ordering::Acquire, &guard)
            .is_ok());
        // The same pointer with another tag is another word.
        let other = Word::node(node, 42 | 1 << 33);
        if HASH_TAGS {
            assert_eq!(
                slot.compare_exchange(
                    other,
                    Word::null(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                    &guard
                ),
                Err(w)
            );
        }
        assert_eq!(slot.load(Ordering::Acquire, &guard), w);
        // SAFETY: (H3) from `Box::into_raw` above, released once.
        drop(unsafe { Box::from_raw(node) });
    }
}
