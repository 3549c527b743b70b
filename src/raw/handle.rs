//! The counted handle to a value the cache hands out: [`Handle`], and its [`WeakHandle`].
//!
//! A cached value lives inside its entry's node, in a [`Counted`]: the value and a count of
//! its owners. A handle points at that `Counted` and at the [`Ops`] of the allocation that
//! holds it (a node, or a [`Solo`] allocation of its own for a value that was never cached),
//! so `Handle<V>` names no key type, and a hit is one count written on the node it already
//! read, with no second allocation to chase.
//!
//! # Invariants of the count
//!
//! - **C1 (owners).** `refs` counts the owners of the value: every `Handle`, and the value
//!   cell of the node while it holds the value (N1). While `refs > 0` the value is
//!   initialized, and the allocation around the `Counted` is kept by one count of its own,
//!   taken for the value as a whole when the count left 0 (`Count::Hold`). The owner whose
//!   decrement takes `refs` to 0 drops the value in place and then releases that count.
//!   `refs` leaves 0 only when the value is written (`fill`), never again after it returned
//!   to 0.
//! - **C2 (ops).** The `Ops` paired with a `Counted` are those of the allocation that contains
//!   it, so `hold` and `release` find that allocation from the `Counted`'s address.
//! - **C3 (weak).** A `WeakHandle` holds one count of the allocation, not of the value, and
//!   takes a count of the value only while `refs` is above 0 (a compare-and-swap from a
//!   non-zero count), so it never revives a dropped value.

#![allow(unsafe_code)]

use crate::policy::EntryMeta;
use crate::sync::{fence, AtomicU32, AtomicU8, Ordering};
use std::borrow::Borrow;
use std::cell::UnsafeCell;
use std::cmp;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;

/// A value and the count of its owners (**C1**). `repr(C)`, so the value's offset in it
/// depends on `V` alone, whatever allocation holds it.
///
/// The count is 32 bits, and the eviction policy's state and the timer wheel's mark of the
/// entry whose node holds the value sit beside it, in the bytes a value aligned to 8 would
/// leave as padding: the head takes 8 bytes, not 16 (`docs/DESIGN.md`, "Memory per entry").
/// A value that was never cached (`Solo`) leaves them unused.
///
/// The head is aligned to 8 (and so is its size), so the value starts at a multiple of 8
/// whatever its own alignment: a node's value cell keeps tags in the low three bits of the
/// value's address (N1).
#[repr(C)]
pub(crate) struct Counted<V> {
    head: Head,
    value: UnsafeCell<MaybeUninit<V>>,
}

/// A `Counted`'s count and the policy's state beside it.
#[repr(C, align(8))]
struct Head {
    refs: AtomicU32,
    /// The eviction policy's state of the entry (unused outside a node).
    meta: EntryMeta,
    /// The timer wheel's mark of the entry (X4 in `expire/`; unused outside a node): in the
    /// byte the head's alignment leaves free.
    wheel: AtomicU8,
}

// The value's address is a multiple of 8 for any `V`.
#[cfg(not(runcache_loom))]
const _: () = assert!(
    std::mem::offset_of!(Counted<()>, value) == 8
        && std::mem::offset_of!(Counted<u8>, value) == 8
        && std::mem::offset_of!(Counted<u64>, value) == 8
);

/// The largest count: as `Arc`, a count this high means handles are being leaked in a loop,
/// and aborting is the only sound answer (the count must never wrap). Half the range, so
/// that threads racing past the check cannot wrap it either: 2^31 handles of one value
/// would take 32 GiB of handles.
const MAX_REFS: u32 = i32::MAX as u32;

impl<V> Counted<V> {
    /// No value yet (`refs == 0`).
    pub(crate) fn empty() -> Self {
        Self {
            head: Head {
                refs: AtomicU32::new(0),
                meta: EntryMeta::new(),
                wheel: AtomicU8::new(0),
            },
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// `value`, with `refs` owners. The caller takes the allocation's count for the value
    /// (C1) once the `Counted` is in place.
    pub(crate) fn with(value: V, refs: u32) -> Self {
        debug_assert!(refs > 0);
        Self {
            head: Head {
                refs: AtomicU32::new(refs),
                meta: EntryMeta::new(),
                wheel: AtomicU8::new(0),
            },
            value: UnsafeCell::new(MaybeUninit::new(value)),
        }
    }

    /// Writes the value of an empty `Counted`, with `refs` owners.
    ///
    /// # Safety
    /// - The `Counted` is empty and nothing else writes or reads it until the caller
    ///   publishes it (a Release store that the readers' loads acquire).
    pub(crate) unsafe fn fill(&self, value: V, refs: u32) {
        debug_assert!(refs > 0);
        // SAFETY: (C1) the caller's contract: nobody reads the value before it is published.
        unsafe { (*self.value.get()).write(value) };
        // Relaxed: published with the value by the caller's Release store.
        self.head.refs.store(refs, Ordering::Relaxed);
    }

    /// Takes the value back out of a `Counted` that was never shared, leaving it empty.
    ///
    /// # Safety
    /// - The `Counted` holds a value and only the caller can reach it.
    pub(crate) unsafe fn take(&self) -> V {
        // Relaxed: never shared.
        self.head.refs.store(0, Ordering::Relaxed);
        // SAFETY: (C1) it holds a value, which is read out once and never dropped in place.
        unsafe { (*self.value.get()).assume_init_read() }
    }

    /// The eviction policy's state of the entry whose node holds this `Counted`.
    #[inline(always)]
    pub(crate) fn meta(&self) -> &EntryMeta {
        &self.head.meta
    }

    /// The timer wheel's mark of the entry (X4 in `expire/`).
    #[inline]
    pub(crate) fn wheel_mark(&self) -> &AtomicU8 {
        &self.head.wheel
    }

    /// Where the value is (or will be).
    #[inline(always)]
    pub(crate) fn value_ptr(&self) -> *const V {
        self.value.get().cast::<V>()
    }

    /// The `Counted` whose value is at `value`.
    ///
    /// # Safety
    /// - `value` is the [`value_ptr`](Self::value_ptr) of a `Counted<V>` that is alive for
    ///   `'a`.
    #[inline(always)]
    pub(crate) unsafe fn of_value<'a>(value: *const V) -> &'a Counted<V> {
        let offset = std::mem::offset_of!(Counted<V>, value);
        // SAFETY: (C2) `value` lies `offset` bytes into its `Counted` (`repr(C)`).
        unsafe { &*value.byte_sub(offset).cast::<Counted<V>>() }
    }

    /// One more owner, for a caller that holds one already, or that read the value where an
    /// owner keeps it (a cell, under the guard that keeps the cell's count, I6).
    #[inline(always)]
    fn acquire(&self) {
        // Relaxed: the new owner is made from an existing one, which keeps the value alive;
        // nothing is published (as `Arc::clone`).
        let old = self.head.refs.fetch_add(1, Ordering::Relaxed);
        if old > MAX_REFS {
            std::process::abort();
        }
    }

    /// One owner less; true if it was the last, and the caller must then drop the value in
    /// place and release the allocation's count (C1).
    #[inline(always)]
    fn release(&self) -> bool {
        // Release: pairs with the Acquire fence below, run by the owner that ends the count,
        // so every owner's use of the value happens before its drop (as `Arc`'s drop).
        if self.head.refs.fetch_sub(1, Ordering::Release) != 1 {
            return false;
        }
        // Acquire: pairs with the Release decrements of the other owners.
        fence(Ordering::Acquire);
        true
    }
}

impl<V> Counted<V> {
    /// Gives up one owner's count: true if it was the last, and then the value has been
    /// dropped in place and the caller must release the allocation's count taken for it
    /// (C1), with a count of its own in the same write if it likes ([`Handle`]'s drop
    /// releases it alone).
    ///
    /// # Safety
    /// - The caller owns one count of the value (C1), which it does not use again.
    #[inline(always)]
    pub(crate) unsafe fn release_in_place(&self) -> bool {
        if !self.release() {
            return false;
        }
        // SAFETY: (C1) ours was the last count: nobody reads the value any more, and it is
        // dropped once, here.
        unsafe { std::ptr::drop_in_place(self.value.get().cast::<V>()) };
        true
    }
}

/// What [`Ops`] does to the allocation around a [`Counted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Count {
    /// Takes one count of the allocation.
    Hold,
    /// Releases one count of the allocation (freeing it if that was the last).
    Unhold,
}

/// How to keep and let go of the allocation around a [`Counted`] (**C2**): one function
/// pointer, so that a handle is two words and names no lifetime of `V`.
///
/// # Safety
/// Callers pass the `Counted` of an allocation of the kind the function was made for, alive,
/// and own the count that `Count::Unhold` releases.
pub(crate) type Ops<V> = unsafe fn(NonNull<Counted<V>>, Count);

/// The allocation of a value that is in no node: one handed out uncached, or made by
/// [`Handle::new`].
#[repr(C)]
struct Solo<V> {
    counted: Counted<V>,
}

impl<V> Solo<V> {
    /// [`Ops`] of a `Solo`: one strong count of its `Arc`.
    ///
    /// # Safety
    /// - `c` is the `Counted` of a live `Solo` allocated as an `Arc` (C2); for
    ///   `Count::Unhold`, the caller owns the count it releases.
    unsafe fn ops(c: NonNull<Counted<V>>, count: Count) {
        // (C2) `counted` is the first field of the `repr(C)` `Solo`.
        let solo = c.as_ptr().cast_const().cast::<Solo<V>>();
        // SAFETY: (C2) the caller's contract.
        unsafe {
            match count {
                Count::Hold => Arc::increment_strong_count(solo),
                Count::Unhold => Arc::decrement_strong_count(solo),
            }
        }
    }
}

impl<V> Drop for Solo<V> {
    fn drop(&mut self) {
        // C1: the allocation is freed only after the value's count went, and the value with it.
        // Relaxed: `&mut self`.
        debug_assert_eq!(self.counted.head.refs.load(Ordering::Relaxed), 0);
    }
}

/// A counted, shared handle to a value from a cache: what `get`, `insert`, `remove` and the
/// `get_or_*` methods hand out.
///
/// It works like [`Arc<V>`](std::sync::Arc): it dereferences to the value, a clone is one
/// more count of the same value, and the value stays alive while any handle to it does, also
/// after the entry left the cache (removed, replaced, evicted or cleared); the last handle
/// (or the cache, if no handle outlives the entry) drops it. Comparisons, hashing and
/// formatting go to the value. It is `Send` and `Sync` when `V` is.
///
/// The value lives inside the cache's entry (one allocation per entry), and the count is
/// the entry's own, so taking a handle on a hit writes one count on memory the lookup has
/// just read. A handle is two words.
///
/// To hand a value out as a [`std::sync::Arc`], store the `Arc` as the cache's value
/// (`Cache<K, Arc<T>>`) and take it with [`Cache::get_cloned`](crate::Cache::get_cloned),
/// which writes no count of the entry at all.
///
/// ```
/// let cache = runcache::Cache::new(10);
/// cache.put("weights", vec![1u8, 2, 3]).unwrap();
/// let handle = cache.get("weights").unwrap();
/// let copy = handle.clone(); // one more count of the same value
/// cache.clear();
/// assert_eq!(*copy, [1, 2, 3], "held values outlive their entry");
/// assert!(runcache::Handle::ptr_eq(&handle, &copy));
/// ```
pub struct Handle<V> {
    counted: NonNull<Counted<V>>,
    ops: Ops<V>,
    _owns: PhantomData<V>,
}

// As `Arc`'s: a handle hands out `&V` only, and its count is atomic.
impl<V: RefUnwindSafe> RefUnwindSafe for Handle<V> {}
impl<V: RefUnwindSafe> UnwindSafe for Handle<V> {}

// SAFETY: (C1) as `Arc<V>`: a handle shares `&V` across threads (`Sync`) and may be the owner
// that drops the value on another thread (`Send`); the count is atomic.
unsafe impl<V: Send + Sync> Send for Handle<V> {}
// SAFETY: (C1) as above.
unsafe impl<V: Send + Sync> Sync for Handle<V> {}

impl<V> Handle<V> {
    /// A handle to a value of its own, not in any cache (for an uncached result, or a test).
    ///
    /// ```
    /// use runcache::Handle;
    ///
    /// let handle = Handle::new(String::from("uncached"));
    /// assert_eq!(handle.len(), 8);
    /// assert_eq!(handle, Handle::new(String::from("uncached")), "comparisons go to the value");
    /// ```
    pub fn new(value: V) -> Self {
        // The `Arc`'s one count is the value's (C1).
        let solo = Arc::into_raw(Arc::new(Solo {
            counted: Counted::with(value, 1),
        }));
        Self {
            // SAFETY: (C2) from `Arc::into_raw`, so not null; `counted` is at offset 0.
            counted: unsafe { NonNull::new_unchecked(solo.cast_mut().cast::<Counted<V>>()) },
            ops: Solo::<V>::ops,
            _owns: PhantomData,
        }
    }

    /// A new owner of the value in `counted`.
    ///
    /// # Safety
    /// - `counted` is alive and holds its value, kept by an owner for the whole call (C1);
    ///   `ops` are its allocation's (C2).
    #[inline(always)]
    pub(crate) unsafe fn acquire(counted: &Counted<V>, ops: Ops<V>) -> Self {
        counted.acquire();
        Self {
            counted: NonNull::from(counted),
            ops,
            _owns: PhantomData,
        }
    }

    /// Takes over one owner's count of the value in `counted` (the one a cell held, say).
    ///
    /// # Safety
    /// - The caller owns one count of `counted`'s value (C1), which the handle now owns;
    ///   `ops` are its allocation's (C2).
    pub(crate) unsafe fn adopt(counted: NonNull<Counted<V>>, ops: Ops<V>) -> Self {
        Self {
            counted,
            ops,
            _owns: PhantomData,
        }
    }

    /// Whether two handles point at the same value (not merely equal ones).
    ///
    /// ```
    /// use runcache::Handle;
    ///
    /// let a = Handle::new(1);
    /// let b = a.clone();
    /// let c = Handle::new(1);
    /// assert!(Handle::ptr_eq(&a, &b));
    /// assert!(!Handle::ptr_eq(&a, &c), "equal values, not the same one");
    /// ```
    pub fn ptr_eq(this: &Self, other: &Self) -> bool {
        this.counted == other.counted
    }

    /// A weak handle to the same value: it does not keep the value alive, and
    /// [`WeakHandle::upgrade`] gives the value back while some handle still holds it.
    ///
    /// ```
    /// let cache = runcache::Cache::new(10);
    /// cache.put(1, "cached").unwrap();
    /// let weak = runcache::Handle::downgrade(&cache.get(&1).unwrap());
    /// assert_eq!(weak.upgrade().as_deref(), Some(&"cached"), "the cache still holds it");
    /// cache.invalidate(&1);
    /// cache.reclaim();
    /// assert!(weak.upgrade().is_none(), "nobody holds it any more");
    /// ```
    pub fn downgrade(this: &Self) -> WeakHandle<V> {
        // SAFETY: (C1, C2) our count keeps the allocation; this takes one more of it.
        unsafe { (this.ops)(this.counted, Count::Hold) };
        WeakHandle {
            counted: this.counted,
            ops: this.ops,
            _owns: PhantomData,
        }
    }

    fn counted(&self) -> &Counted<V> {
        // SAFETY: (C1) our count keeps the allocation and the value alive.
        unsafe { self.counted.as_ref() }
    }
}

impl<V> Clone for Handle<V> {
    #[inline]
    fn clone(&self) -> Self {
        // SAFETY: (C1) our own count keeps the value while the new one is taken.
        unsafe { Self::acquire(self.counted(), self.ops) }
    }
}

impl<V> Drop for Handle<V> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: (C1, C2) this handle's count, given up once, here; when it was the last,
        // the value is dropped and the allocation's count taken for it goes.
        unsafe {
            if self.counted().release_in_place() {
                (self.ops)(self.counted, Count::Unhold);
            }
        }
    }
}

impl<V> Deref for Handle<V> {
    type Target = V;

    #[inline(always)]
    fn deref(&self) -> &V {
        // SAFETY: (C1) our count keeps the value initialized and alive.
        unsafe { &*self.counted().value_ptr() }
    }
}

impl<V> AsRef<V> for Handle<V> {
    fn as_ref(&self) -> &V {
        self
    }
}

impl<V> Borrow<V> for Handle<V> {
    fn borrow(&self) -> &V {
        self
    }
}

impl<V: fmt::Debug> fmt::Debug for Handle<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<V: fmt::Display> fmt::Display for Handle<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

impl<V: PartialEq> PartialEq for Handle<V> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<V: Eq> Eq for Handle<V> {}

impl<V: PartialOrd> PartialOrd for Handle<V> {
    fn partial_cmp(&self, other: &Self) -> Option<cmp::Ordering> {
        (**self).partial_cmp(&**other)
    }
}

impl<V: Ord> Ord for Handle<V> {
    fn cmp(&self, other: &Self) -> cmp::Ordering {
        (**self).cmp(&**other)
    }
}

impl<V: Hash> Hash for Handle<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

/// A handle that does not keep its value alive; see [`Handle::downgrade`].
///
/// ```
/// use runcache::Handle;
///
/// let strong = Handle::new(5);
/// let weak = Handle::downgrade(&strong);
/// assert_eq!(weak.upgrade().map(|h| *h), Some(5));
/// drop(strong);
/// assert!(weak.upgrade().is_none());
/// ```
pub struct WeakHandle<V> {
    counted: NonNull<Counted<V>>,
    ops: Ops<V>,
    _owns: PhantomData<V>,
}

// As `std::sync::Weak`'s.
impl<V: RefUnwindSafe> RefUnwindSafe for WeakHandle<V> {}
impl<V: RefUnwindSafe> UnwindSafe for WeakHandle<V> {}

// SAFETY: (C3) it only upgrades to a `Handle`, which is `Send + Sync` under the same bounds.
unsafe impl<V: Send + Sync> Send for WeakHandle<V> {}
// SAFETY: (C3) as above.
unsafe impl<V: Send + Sync> Sync for WeakHandle<V> {}

impl<V> WeakHandle<V> {
    /// The value, if some [`Handle`] (the cache's own included) still holds it.
    ///
    /// ```
    /// use runcache::Handle;
    ///
    /// let strong = Handle::new(vec![0u8; 16]);
    /// let weak = Handle::downgrade(&strong);
    /// assert!(weak.upgrade().is_some());
    /// drop(strong);
    /// assert!(weak.upgrade().is_none());
    /// ```
    pub fn upgrade(&self) -> Option<Handle<V>> {
        // SAFETY: (C3) our count keeps the allocation, so the count word is alive.
        let counted = unsafe { self.counted.as_ref() };
        let mut n = counted.head.refs.load(Ordering::Relaxed);
        loop {
            if n == 0 {
                return None;
            }
            if n > MAX_REFS {
                std::process::abort();
            }
            // Acquire: pairs with the Release decrements, as a count taken from a handle
            // would be ordered after the owners' writes (as `Weak::upgrade`).
            match counted.head.refs.compare_exchange_weak(
                n,
                n + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                // SAFETY: (C1, C3) we took one count of a live value.
                Ok(_) => return Some(unsafe { Handle::adopt(self.counted, self.ops) }),
                Err(now) => n = now,
            }
        }
    }
}

impl<V> Clone for WeakHandle<V> {
    fn clone(&self) -> Self {
        // SAFETY: (C3) our count keeps the allocation; this takes one more.
        unsafe { (self.ops)(self.counted, Count::Hold) };
        Self {
            counted: self.counted,
            ops: self.ops,
            _owns: PhantomData,
        }
    }
}

impl<V> Drop for WeakHandle<V> {
    fn drop(&mut self) {
        // SAFETY: (C3) the allocation's count this weak handle owns.
        unsafe { (self.ops)(self.counted, Count::Unhold) };
    }
}

impl<V> fmt::Debug for WeakHandle<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(WeakHandle)")
    }
}
