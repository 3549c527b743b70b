//! A table's memory: its header and its slots in one allocation, which crossbeam-epoch makes
//! and frees through [`Pointable`] (**H5**), and the header's claim accounting (**H4**).

#![allow(unsafe_code)]

use super::{CLAIMS, IN_FLIGHT, MIGRATING, MIN_SLOTS};
use crate::raw::node::{Node, NodeRef};
use crate::raw::word::SlotWord;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};
use crossbeam_epoch::{Atomic, Guard, Pointable};
use std::alloc::{self, Layout};

/// A table: its header and, in the same allocation, its slots, so a probe reaches a slot
/// from the table's address without loading a pointer to a separate array. `S` is the slot
/// array: `[SlotWord; 0]` for [`TableHead`], the header alone (which gives the layout), and
/// a slice for [`Table`], which crossbeam-epoch allocates through [`Pointable`].
#[repr(C)]
pub(super) struct TableOf<K, V, S: ?Sized> {
    /// The slot count less one (the slot count is a power of two). First: [`Pointable::deref`]
    /// reads it to rebuild the slice's length.
    pub(super) mask: usize,
    /// Claims, claims in flight and the `MIGRATING` bit, in one word (**H4**).
    pub(super) used: AtomicU64,
    /// The table this one migrates into; null until migration starts.
    pub(super) next: Atomic<Table<K, V>>,
    /// Slots handed out to migrating threads (may run past the slot count).
    pub(super) claimed: AtomicUsize,
    /// Slots moved so far.
    pub(super) moved: AtomicUsize,
    pub(super) slots: S,
}

/// A table with its slots.
pub(super) type Table<K, V> = TableOf<K, V, [SlotWord<Node<K, V>>]>;

/// A table's header, sized: the layout of what precedes the slots.
type TableHead<K, V> = TableOf<K, V, [SlotWord<Node<K, V>>; 0]>;

impl<K, V> Table<K, V> {
    /// The table at `ptr` (from [`Pointable::init`]) as a pointer with its slice length,
    /// rebuilt from the header's `mask`.
    ///
    /// # Safety
    /// - `ptr` came from `init` and is not freed.
    unsafe fn fat(ptr: usize) -> *mut Self {
        // SAFETY: (H5) `mask` is the header's first field (`repr(C)`), written once by `init`.
        let mask = unsafe { *(ptr as *const usize) };
        std::ptr::slice_from_raw_parts_mut(ptr as *mut SlotWord<Node<K, V>>, mask + 1) as *mut Self
    }

    /// The layout of a table of `slots` slots: the header, then the slots.
    fn layout(slots: usize) -> Layout {
        Layout::new::<TableHead<K, V>>()
            .extend(Layout::array::<SlotWord<Node<K, V>>>(slots).expect("a table's size fits"))
            .expect("a table's size fits")
            .0
            .pad_to_align()
    }
}

/// `init` returns an allocation of `layout(slots)` holding an initialized header and `slots`
/// initialized slot words, aligned to `ALIGN`; `deref` rebuilds the slice's length from the
/// header, which never changes; `drop` frees with the layout of that same value.
impl<K, V> Pointable for Table<K, V> {
    const ALIGN: usize = std::mem::align_of::<TableHead<K, V>>();

    /// The slot count, a power of two of at least `MIN_SLOTS`.
    type Init = usize;

    unsafe fn init(slots: usize) -> usize {
        debug_assert!(slots.is_power_of_two() && slots >= MIN_SLOTS);
        let layout = Self::layout(slots);
        // SAFETY: (H5) the layout has a non-zero size (the header's).
        let head = unsafe { alloc::alloc(layout) }.cast::<TableHead<K, V>>();
        if head.is_null() {
            alloc::handle_alloc_error(layout);
        }
        // SAFETY: (H5) `head` is a fresh allocation of `layout`, which starts with the header and
        // continues with room for `slots` slot words, right after it (`repr(C)`).
        unsafe {
            head.write(TableOf {
                mask: slots - 1,
                used: AtomicU64::new(0),
                next: Atomic::null(),
                claimed: AtomicUsize::new(0),
                moved: AtomicUsize::new(0),
                slots: [],
            });
            let first = std::ptr::addr_of_mut!((*head).slots).cast::<SlotWord<Node<K, V>>>();
            for i in 0..slots {
                first.add(i).write(SlotWord::null());
            }
        }
        debug_assert_eq!(
            // SAFETY: (H5) initialized above.
            Layout::for_value(unsafe { Self::deref(head as usize) }),
            layout
        );
        head as usize
    }

    unsafe fn deref<'a>(ptr: usize) -> &'a Self {
        // SAFETY: (H5) the caller's contract (`ptr` came from `init` and is not freed).
        unsafe { &*Self::fat(ptr) }
    }

    unsafe fn deref_mut<'a>(ptr: usize) -> &'a mut Self {
        // SAFETY: (H5) as in `deref`; the caller holds the only reference.
        unsafe { &mut *Self::fat(ptr) }
    }

    unsafe fn drop(ptr: usize) {
        // SAFETY: (H5) the caller owns the table: no thread reaches it any more (it was retired
        // through the epoch, never shared, or the shard is dropping).
        let table = unsafe { Self::deref_mut(ptr) };
        for slot in table.slots.iter() {
            // SAFETY: (H5) as above, nothing else reads the slot.
            let p = slot.load(Ordering::Relaxed, unsafe { crossbeam_epoch::unprotected() });
            if !p.is_null() {
                // SAFETY: (H3) the table's strong count of every node it points at (H3).
                drop(unsafe { NodeRef::from_raw(p.as_raw()) });
            }
        }
        let layout = Layout::for_value(table);
        // SAFETY: (H5) the table was initialized by `init` in an allocation of this layout, and is
        // not used again.
        unsafe {
            std::ptr::drop_in_place(table as *mut Self);
            alloc::dealloc(ptr as *mut u8, layout);
        }
    }
}

impl<K, V> Table<K, V> {
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.mask + 1
    }

    /// Slot `i & mask` (the hit path's access, without a bounds check).
    #[inline(always)]
    pub(super) fn slot(&self, i: usize) -> &SlotWord<Node<K, V>> {
        let i = i & self.mask;
        debug_assert!(i < self.slots.len());
        // SAFETY: (H5) `slots` has `mask + 1` elements, and `i & mask <= mask`.
        unsafe { self.slots.get_unchecked(i) }
    }

    /// Reserves a claim (**H4**): `false` once claims reach half the slots, or once the
    /// table migrates. The caller settles it with [`settle`](Self::settle).
    ///
    /// A `replacement` (a dead node's slot, taken by a new node of its key) takes no new
    /// slot: it is only counted in flight, so the migration's sizing sees it, and it is
    /// refused only once the table migrates.
    pub(super) fn reserve(&self, replacement: bool) -> bool {
        let (limit, claim) = if replacement {
            (u64::MAX, 0)
        } else {
            ((self.len() / 2) as u64, 1)
        };
        // Relaxed: the word publishes nothing; it only bounds claims, and read-modify-writes
        // see its latest value whatever the ordering.
        let mut u = self.used.load(Ordering::Relaxed);
        loop {
            if u & MIGRATING != 0 || u & CLAIMS >= limit {
                return false;
            }
            match self.used.compare_exchange_weak(
                u,
                u + claim + IN_FLIGHT,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => u = now,
            }
        }
    }

    /// Settles a reserved claim: it is no longer in flight, and a claim counts only if it
    /// landed.
    pub(super) fn settle(&self, landed: bool, replacement: bool) {
        // Relaxed: as in `reserve`.
        self.used.fetch_sub(
            IN_FLIGHT + u64::from(!landed && !replacement),
            Ordering::Relaxed,
        );
    }

    pub(super) fn next<'g>(&self, guard: &'g Guard) -> Option<&'g Table<K, V>> {
        // Acquire: pairs with the Release CAS in `Shard::start_migration`.
        let n = self.next.load(Ordering::Acquire, guard);
        // SAFETY: (H5) a table reached under `guard` is retired only after the root moved past it,
        // and its successor only after that, so both outlive the guard (see the module docs).
        unsafe { n.as_ref() }
    }
}
