//! One shard: a split-ordered lock-free list (Shalev & Shavit) with a lazily grown bucket
//! directory.
//!
//! Every node of the shard sits in one sorted singly linked list, ordered by its *split-order
//! key*: the bit-reversed hash with the lowest bit set for entries, and the bit-reversed bucket
//! index (lowest bit clear) for bucket sentinels ("dummies"). With that order, the nodes of
//! bucket `b` of a table of size `2n` are a contiguous stretch that starts at the dummy of `b`,
//! and splitting bucket `b` into `b` and `b + n` only means inserting one new dummy. So the
//! table grows by doubling a counter: no node ever moves, nothing is migrated, and readers are
//! never blocked by growth. A bucket that was never touched is found by walking to its parent
//! (`b` with its top bit cleared), which a reader does without writing anything.
//!
//! Removal is Harris–Michael: a node is first marked (tag bit 1 on its own `next`), then
//! unlinked by a compare-and-swap on its predecessor; the thread whose CAS unlinks it hands
//! the list's reference to the epoch collector.

use super::slot::{Slot, LOADING, READY};
use crate::policy::EntryMeta;
use crate::sync::{AtomicPtr, AtomicUsize, Ordering, UnsafeCell};
use crossbeam_epoch::{Atomic, Guard, Shared};
use std::any::Any;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Segments of the bucket directory: segment `s > 0` holds buckets `2^(s-1) .. 2^s`.
const SEGMENTS: usize = 48;
/// Average nodes per bucket before the bucket count doubles.
const LOAD_FACTOR: usize = if cfg!(runcache_stress) { 1 } else { 2 };
/// Buckets per shard at creation. The stress build starts with one, so tests force every
/// bucket split and every segment allocation.
const INITIAL_BUCKETS: usize = if cfg!(runcache_stress) { 1 } else { 8 };

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

/// A list node: a bucket dummy (even `so_key`) or an entry (odd `so_key`).
///
/// Nodes are allocated as `Arc<Node>`; the list owns one strong count (**I1**).
pub(crate) struct Node<K, V> {
    pub(crate) so_key: u64,
    pub(crate) next: Atomic<Node<K, V>>,
    key: MaybeUninit<K>,
    pub(crate) slot: Slot,
    /// The cached value; null while loading and after removal (**I4**).
    pub(crate) value: Atomic<Published<V>>,
    /// Set once, before the slot turns `DEAD`, when an attempt ends without caching.
    outcome: AtomicPtr<Outcome<V>>,
    /// The eviction policy's state for this entry.
    pub(crate) meta: EntryMeta,
}

impl<K, V> Node<K, V> {
    fn dummy(so_key: u64) -> Self {
        Self {
            so_key,
            next: Atomic::null(),
            key: MaybeUninit::uninit(),
            slot: Slot::ready(),
            value: Atomic::null(),
            outcome: AtomicPtr::new(std::ptr::null_mut()),
            meta: EntryMeta::new(),
        }
    }

    /// A new entry node; with `value` it is created `READY`, without it `LOADING` for the
    /// thread `builder`.
    pub(crate) fn entry(
        so_key: u64,
        key: K,
        value: Option<Box<Published<V>>>,
        builder: u64,
    ) -> Self {
        debug_assert_eq!(so_key & 1, 1);
        let (slot, value) = match value {
            Some(v) => (Slot::ready(), Atomic::from(Box::into_raw(v) as *const _)),
            None => (Slot::loading(builder), Atomic::null()),
        };
        Self {
            so_key,
            next: Atomic::null(),
            key: MaybeUninit::new(key),
            slot,
            value,
            outcome: AtomicPtr::new(std::ptr::null_mut()),
            meta: EntryMeta::new(),
        }
    }

    /// The entry's hash as far as the table keeps it: every bit but bit 63 (enough for the
    /// shard, the bucket and the policy's ghost).
    #[inline]
    pub(crate) fn hash(&self) -> u64 {
        self.so_key.reverse_bits()
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

    #[inline]
    fn is_entry(&self) -> bool {
        self.so_key & 1 == 1
    }

    /// The entry's key.
    #[inline]
    pub(crate) fn key(&self) -> &K {
        debug_assert!(self.is_entry());
        // SAFETY: entry nodes (odd `so_key`) are always created with a key (`Node::entry`),
        // and dummies are never handed out by the lookup functions, which compare keys only
        // on entries.
        unsafe { self.key.assume_init_ref() }
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
    fn is_live(&self, guard: &Guard) -> bool {
        !matches!(self.view(guard), View::Dead)
    }

    /// Records how a failed or rejected attempt ended. Called once, before `Slot::finish`.
    pub(crate) fn set_outcome(&self, outcome: Outcome<V>) {
        let p = Box::into_raw(Box::new(outcome));
        // Relaxed: published by the Release swap in `Slot::finish` that follows.
        let prev = self.outcome.swap(p, Ordering::Relaxed);
        debug_assert!(prev.is_null(), "an attempt's outcome was set twice");
    }

    /// Takes the key and value box back out of an entry node that was never linked.
    pub(crate) fn into_parts(self) -> (K, Option<Box<Published<V>>>) {
        debug_assert!(self.is_entry());
        let this = std::mem::ManuallyDrop::new(self);
        // Relaxed: the node was never shared.
        debug_assert!(this.outcome.load(Ordering::Relaxed).is_null());
        // SAFETY: an entry node always holds an initialized key; `this` is never dropped, so
        // the key is read out exactly once.
        let key = unsafe { this.key.assume_init_read() };
        // SAFETY: never shared, so the cell's box is ours; it is taken out exactly once.
        let value = unsafe {
            let v = this
                .value
                .load(Ordering::Relaxed, crossbeam_epoch::unprotected());
            (!v.is_null()).then(|| v.into_owned().into_box())
        };
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
        if !self.is_entry() {
            return;
        }
        // SAFETY: entry nodes always hold an initialized key, dropped only here.
        unsafe { self.key.assume_init_drop() };
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

/// The split-order key of an entry.
#[inline]
pub(crate) fn so_entry(hash: u64) -> u64 {
    (hash | (1 << 63)).reverse_bits()
}

#[inline]
fn so_dummy(bucket: usize) -> u64 {
    (bucket as u64).reverse_bits()
}

#[inline]
fn parent(bucket: usize) -> usize {
    debug_assert!(bucket > 0);
    bucket & !(1 << (usize::BITS - 1 - bucket.leading_zeros()))
}

#[inline]
fn segment_of(bucket: usize) -> (usize, usize) {
    if bucket == 0 {
        (0, 0)
    } else {
        let s = (usize::BITS - bucket.leading_zeros()) as usize;
        (s, bucket - (1 << (s - 1)))
    }
}

#[inline]
fn segment_len(segment: usize) -> usize {
    if segment == 0 {
        1
    } else {
        1 << (segment - 1)
    }
}

/// Where a key belongs: `pred` is the last live node ordered before the key's run and `curr`
/// the first node of the run (or after it); `found` is the run's live node for the key.
pub(crate) struct Position<'g, K, V> {
    pred: &'g Node<K, V>,
    curr: Shared<'g, Node<K, V>>,
    pub(crate) found: Option<&'g Node<K, V>>,
}

/// One shard of the table.
pub(crate) struct Shard<K, V> {
    /// Bucket directory: pointers to dummy nodes, null until the bucket is first written.
    segments: [AtomicPtr<AtomicPtr<Node<K, V>>>; SEGMENTS],
    /// Bucket count in use (a power of two).
    size: AtomicUsize,
    /// Entry nodes linked in the list (live or not yet unlinked).
    count: AtomicUsize,
    /// Entries with a cached value (`len`).
    pub(crate) live: AtomicUsize,
}

// SAFETY: a shard owns its nodes, which hold `K` and `Arc<V>`; nodes are dropped (and their
// keys and values with them) on whichever thread runs the deferred destructor or drops the
// cache, so `K: Send` and `V: Send + Sync` are required for the shard to move between threads.
unsafe impl<K: Send + Sync, V: Send + Sync> Send for Shard<K, V> {}
// SAFETY: every shared access goes through atomics; `&K` and `&V` are handed to other
// threads, hence `K: Sync` and `V: Sync`.
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for Shard<K, V> {}

impl<K, V> Shard<K, V> {
    pub(crate) fn new() -> Self {
        let segments: [AtomicPtr<AtomicPtr<Node<K, V>>>; SEGMENTS] =
            std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut()));
        let seg0 = alloc_segment::<K, V>(0);
        let head = Arc::into_raw(Arc::new(Node::<K, V>::dummy(so_dummy(0))));
        // SAFETY: `seg0` has one element, freshly allocated and not yet shared.
        unsafe { (*seg0).store(head as *mut _, Ordering::Relaxed) };
        segments[0].store(seg0, Ordering::Relaxed);
        Self {
            segments,
            size: AtomicUsize::new(INITIAL_BUCKETS),
            count: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
        }
    }

    /// The bucket count in use now.
    pub(crate) fn buckets(&self) -> usize {
        // Relaxed: the size only chooses where a search starts (any value is correct).
        self.size.load(Ordering::Relaxed)
    }

    #[inline]
    fn bucket(&self, bucket: usize) -> *const Node<K, V> {
        let (s, i) = segment_of(bucket);
        // Acquire: pairs with the Release CAS in `segment`, so the slots are initialized.
        let seg = self.segments[s].load(Ordering::Acquire);
        if seg.is_null() {
            return std::ptr::null();
        }
        // SAFETY: `i < segment_len(s)` by `segment_of`; segments live until the shard drops.
        // Acquire: pairs with the Release CAS in `init_bucket`, so the dummy is initialized.
        unsafe { (*seg.add(i)).load(Ordering::Acquire) }
    }

    /// The dummy to start a read at: the key's bucket, or its nearest initialized ancestor.
    /// Writes nothing.
    #[inline]
    fn start_for_read(&self, hash: u64) -> &Node<K, V> {
        let mut b = (hash as usize) & (self.buckets() - 1);
        loop {
            let p = self.bucket(b);
            if !p.is_null() {
                // SAFETY: dummies are never unlinked and live until the shard drops (I1).
                return unsafe { &*p };
            }
            b = parent(b);
        }
    }

    /// The key's bucket dummy, creating it (and its ancestors) if needed.
    fn start_for_write<'g>(&'g self, hash: u64, guard: &'g Guard) -> &'g Node<K, V> {
        self.init_bucket((hash as usize) & (self.buckets() - 1), guard)
    }

    fn init_bucket<'g>(&'g self, bucket: usize, guard: &'g Guard) -> &'g Node<K, V> {
        let p = self.bucket(bucket);
        if !p.is_null() {
            // SAFETY: as in `start_for_read`.
            return unsafe { &*p };
        }
        let parent = self.init_bucket(parent(bucket), guard);
        let so = so_dummy(bucket);
        let mine = Arc::into_raw(Arc::new(Node::<K, V>::dummy(so)));
        let dummy = loop {
            let pos = self.search(parent, so, |_| true, guard);
            if let Some(existing) = pos.found {
                // SAFETY: `mine` was never shared.
                drop(unsafe { Arc::from_raw(mine) });
                break existing as *const Node<K, V>;
            }
            if self.link(&pos, mine, guard) {
                break mine;
            }
        };
        let (s, i) = segment_of(bucket);
        let seg = self.segment(s);
        // Release: pairs with the Acquire load in `bucket`. A failed CAS means another thread
        // stored the same dummy (dummies are unique in the list).
        // SAFETY: `i < segment_len(s)`; segments live until the shard drops.
        let _ = unsafe { &*seg.add(i) }.compare_exchange(
            std::ptr::null_mut(),
            dummy as *mut _,
            Ordering::Release,
            Ordering::Relaxed,
        );
        // SAFETY: the dummy is linked and never unlinked (I1).
        unsafe { &*dummy }
    }

    fn segment(&self, s: usize) -> *mut AtomicPtr<Node<K, V>> {
        // Acquire: pairs with the Release CAS below.
        let seg = self.segments[s].load(Ordering::Acquire);
        if !seg.is_null() {
            return seg;
        }
        let mine = alloc_segment::<K, V>(s);
        // Release: publishes the nulled slots; Acquire on failure: pairs with the winner's.
        match self.segments[s].compare_exchange(
            std::ptr::null_mut(),
            mine,
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => mine,
            Err(winner) => {
                // SAFETY: `mine` was never shared.
                unsafe { free_segment(mine, s) };
                winner
            }
        }
    }

    /// Finds the live entry for `so`/`eq`, reading only (the lookup path of **I3**).
    #[inline]
    pub(crate) fn find<'g>(
        &'g self,
        hash: u64,
        so: u64,
        eq: impl Fn(&K) -> bool,
        guard: &'g Guard,
    ) -> Option<&'g Node<K, V>> {
        // Acquire (every `next` load): pairs with the Release CAS that linked the node read.
        let mut curr = self
            .start_for_read(hash)
            .next
            .load(Ordering::Acquire, guard);
        // SAFETY: nodes reached under `guard` stay allocated until it drops (I1); a marked
        // node's `next` still leads forward through the sorted list (I3).
        while let Some(c) = unsafe { curr.as_ref() } {
            if c.so_key >= so {
                if c.so_key > so {
                    return None;
                }
                if eq(c.key()) && c.is_live(guard) {
                    return Some(c);
                }
            }
            curr = c.next.load(Ordering::Acquire, guard);
        }
        None
    }

    /// Locates where an entry with `so` belongs, unlinking marked nodes on the way.
    pub(crate) fn locate<'g>(
        &'g self,
        hash: u64,
        so: u64,
        eq: impl Fn(&K) -> bool,
        guard: &'g Guard,
    ) -> Position<'g, K, V> {
        let start = self.start_for_write(hash, guard);
        self.search(start, so, |n| eq(n.key()) && n.is_live(guard), guard)
    }

    fn search<'g>(
        &'g self,
        start: &'g Node<K, V>,
        so: u64,
        matches: impl Fn(&Node<K, V>) -> bool,
        guard: &'g Guard,
    ) -> Position<'g, K, V> {
        'retry: loop {
            let mut pred = start;
            // Acquire (every `next` load): pairs with the Release CAS that linked the node.
            let mut curr = pred.next.load(Ordering::Acquire, guard);
            let mut run = None;
            let mut found = None;
            // SAFETY: nodes reached under `guard` stay allocated until it drops (I1).
            while let Some(c) = unsafe { curr.as_ref() } {
                let succ = c.next.load(Ordering::Acquire, guard);
                if succ.tag() != 0 {
                    // `c` is marked (I3): unlink it. Release: pairs with the Acquire loads
                    // of `next`, passing on the publication of `succ` that we acquired.
                    match pred.next.compare_exchange(
                        curr,
                        succ.with_tag(0),
                        Ordering::Release,
                        Ordering::Relaxed,
                        guard,
                    ) {
                        Ok(_) => {
                            // SAFETY: our CAS unlinked `c`, so we own the list's count (I1).
                            unsafe { self.retire(curr, guard) };
                            curr = succ.with_tag(0);
                            continue;
                        }
                        Err(_) => continue 'retry,
                    }
                }
                if c.so_key > so {
                    break;
                }
                if c.so_key == so {
                    if run.is_none() {
                        run = Some((pred, curr));
                    }
                    if found.is_none() && matches(c) {
                        found = Some(c);
                    }
                }
                pred = c;
                curr = succ;
            }
            let (pred, curr) = run.unwrap_or((pred, curr));
            return Position { pred, curr, found };
        }
    }

    /// Links `node` at `pos` (before the key's run). `false`: the list changed, locate again.
    pub(crate) fn link(
        &self,
        pos: &Position<'_, K, V>,
        node: *const Node<K, V>,
        guard: &Guard,
    ) -> bool {
        // SAFETY: `node` is not shared yet; we own it.
        let n = unsafe { &*node };
        // Relaxed: published by the Release CAS below.
        n.next.store(pos.curr, Ordering::Relaxed);
        // Counted before the link, so the count of a node that is removed (and uncounted in
        // `retire`) as soon as it is linked never dips below zero.
        // Relaxed: the counts only steer growth and report sizes; the Release CAS below
        // orders this before any removal of the node.
        let count = if n.is_entry() {
            self.count.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            0
        };
        // Release: pairs with the Acquire loads of `next`; publishes the node's fields.
        let linked = pos
            .pred
            .next
            .compare_exchange(
                pos.curr,
                Shared::from(node),
                Ordering::Release,
                Ordering::Relaxed,
                guard,
            )
            .is_ok();
        if n.is_entry() && !linked {
            // Relaxed: as above.
            self.count.fetch_sub(1, Ordering::Relaxed);
        } else if n.is_entry() {
            let size = self.buckets();
            if count > size * LOAD_FACTOR && size < (1 << (SEGMENTS - 1)) {
                let _ = self.size.compare_exchange(
                    size,
                    size * 2,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
        linked
    }

    /// Marks a dead entry node and unlinks it (or leaves that to the next search past it).
    pub(crate) fn delete(&self, node: &Node<K, V>, guard: &Guard) {
        // The low bits of the hash, which pick the bucket, are the split-order key reversed.
        let hash = node.so_key.reverse_bits();
        debug_assert!(!node.is_live(guard), "only dead nodes are deleted (I3)");
        // Relaxed: the mark publishes nothing; the pointer bits were published by the Release
        // CAS that stored them, and this read-modify-write continues that release sequence.
        let prev = node.next.fetch_or(1, Ordering::Relaxed, guard);
        if prev.tag() == 0 {
            let start = self.start_for_write(hash, guard);
            let _ = self.search(start, node.so_key, |_| false, guard);
        }
    }

    /// Hands the list's reference of an unlinked node to the epoch collector.
    ///
    /// # Safety
    /// - `node` was just unlinked by the caller's own successful CAS (so exactly one thread
    ///   retires it) and is an entry node (dummies are never unlinked).
    unsafe fn retire(&self, node: Shared<'_, Node<K, V>>, guard: &Guard) {
        // Relaxed: a statistic for growth.
        self.count.fetch_sub(1, Ordering::Relaxed);
        let raw = node.as_raw();
        // SAFETY: readers that can still reach `raw` are pinned; the closure runs after they
        // unpin. `raw` came from `Arc::into_raw` (I1) and the list's count is released once.
        unsafe { guard.defer_unchecked(move || drop(Arc::from_raw(raw))) };
    }

    /// How many linked entry nodes are dead but not marked: zero whenever no operation is in
    /// flight, since every node that dies is marked by the thread that killed it (I3, I4).
    pub(crate) fn dead_unmarked(&self, guard: &Guard) -> usize {
        let mut count = 0;
        self.for_each(guard, |n| {
            // Acquire: pairs with the Release CAS that linked the node.
            if n.next.load(Ordering::Acquire, guard).tag() == 0 && !n.is_live(guard) {
                count += 1;
            }
            true
        });
        count
    }

    /// Calls `f` on every entry node until it returns `false`.
    pub(crate) fn for_each<'g>(
        &'g self,
        guard: &'g Guard,
        mut f: impl FnMut(&'g Node<K, V>) -> bool,
    ) {
        // SAFETY: bucket 0's dummy exists from creation and is never unlinked.
        let head = unsafe { &*self.bucket(0) };
        let mut curr = head.next.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`.
        while let Some(c) = unsafe { curr.as_ref() } {
            if c.is_entry() && !f(c) {
                return;
            }
            // Acquire: pairs with the Release CAS that linked the node.
            curr = c.next.load(Ordering::Acquire, guard);
        }
    }
}

impl<K, V> Drop for Shard<K, V> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no guard of this cache exists, so the list is ours. Every
        // node still linked holds the list's count (I1); unlinked ones belong to the
        // collector. Segments came from `alloc_segment`.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            let mut p = self.bucket(0);
            while !p.is_null() {
                let next = (*p).next.load(Ordering::Relaxed, guard).as_raw();
                drop(Arc::from_raw(p));
                p = next;
            }
            for (s, seg) in self.segments.iter().enumerate() {
                let seg = seg.load(Ordering::Relaxed);
                if !seg.is_null() {
                    free_segment(seg, s);
                }
            }
        }
    }
}

fn alloc_segment<K, V>(s: usize) -> *mut AtomicPtr<Node<K, V>> {
    let slots: Box<[AtomicPtr<Node<K, V>>]> = (0..segment_len(s))
        .map(|_| AtomicPtr::new(std::ptr::null_mut()))
        .collect();
    Box::into_raw(slots).cast()
}

/// # Safety
/// - `seg` came from `alloc_segment(s)` and is freed once.
unsafe fn free_segment<K, V>(seg: *mut AtomicPtr<Node<K, V>>, s: usize) {
    // SAFETY: rebuilds the boxed slice `alloc_segment` leaked, with the same length.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(seg, segment_len(s))) });
}

impl<K, V> crate::policy::Queued for Arc<Node<K, V>> {
    fn meta(&self) -> &EntryMeta {
        &self.meta
    }

    fn hash(&self) -> u64 {
        Node::hash(self)
    }

    fn is_cached(&self) -> bool {
        Node::is_cached(self)
    }

    fn id(&self) -> usize {
        Arc::as_ptr(self) as usize
    }
}
