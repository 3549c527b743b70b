//! A retirement (a deferred closure of at most two words, stored in place) and a batch of
//! them: what a thread gathers for a cache before the batch goes to the cache's ready stack
//! and on to the collector (`retire.rs`).

#![allow(unsafe_code)]

use std::mem::MaybeUninit;

/// Retirements a thread gathers into one [`Batch`] (one under loom, so that every model hands
/// each retirement to the ready stack at once).
///
/// crossbeam-epoch wraps every deferred function in a bag entry and seals a full bag (64
/// entries) into a ~2 KB allocation. Deferring each retired item on its own took a bag entry
/// per retirement, plus four read-modify-writes of `Pending`'s line, which every thread
/// retiring from the cache shares; a batch takes two of those writes for 32 retirements.
pub(super) const BATCH: usize = if cfg!(runcache_loom) { 1 } else { 32 };

/// A retirement: a deferred closure of at most two words, stored in place. Dropping it runs
/// the closure, so it is only ever dropped once its items may be freed: by a batch run by
/// the collector or by the cache's `Drop`, or inside a deferred function of its own.
pub(super) struct Retired {
    data: MaybeUninit<[usize; 2]>,
    /// Runs the closure stored in `data`, moving it out.
    call: unsafe fn(*mut MaybeUninit<[usize; 2]>),
}

impl Retired {
    /// Stores `free` in place, or hands it back if it does not fit two words.
    pub(super) fn new<F: FnOnce()>(free: F) -> Result<Self, F> {
        if std::mem::size_of::<F>() > std::mem::size_of::<[usize; 2]>()
            || std::mem::align_of::<F>() > std::mem::align_of::<[usize; 2]>()
        {
            return Err(free);
        }
        /// # Safety
        /// `data` holds an `F`, which is read out (moved) exactly once.
        unsafe fn call<F: FnOnce()>(data: *mut MaybeUninit<[usize; 2]>) {
            // SAFETY: (E2) the caller's contract.
            let free = unsafe { data.cast::<F>().read() };
            free();
        }
        let mut data = MaybeUninit::<[usize; 2]>::uninit();
        // SAFETY: (E2) `F` fits `data` in size and alignment (checked above).
        unsafe { data.as_mut_ptr().cast::<F>().write(free) };
        Ok(Self {
            data,
            call: call::<F>,
        })
    }
}

impl Drop for Retired {
    fn drop(&mut self) {
        // SAFETY: (E2) `data` holds the closure `call` was made for (`new`), and this is the one
        // place that runs it, once.
        unsafe { (self.call)(&mut self.data) };
    }
}

/// Up to [`BATCH`] retirements of one thread for one cache, and on the ready stack the
/// batches below it. Dropping a batch runs its retirements in order (a destructor that
/// panics does not stop the rest: slice drop glue goes on, as it does for a `Vec`), then
/// drops the batches below it.
pub(super) struct Batch {
    pub(super) len: usize,
    items: [MaybeUninit<Retired>; BATCH],
    /// The batch below this one on the ready stack (null elsewhere); owned by this one.
    pub(super) next: *mut Batch,
    /// Batches on the stack from this one down, itself included.
    pub(super) depth: usize,
}

impl Batch {
    pub(super) fn new() -> Box<Self> {
        Box::new(Self {
            len: 0,
            items: [const { MaybeUninit::uninit() }; BATCH],
            next: std::ptr::null_mut(),
            depth: 0,
        })
    }

    pub(super) fn push(&mut self, item: Retired) {
        debug_assert!(
            self.len < BATCH,
            "a full batch goes to the ready stack at once"
        );
        self.items[self.len].write(item);
        self.len += 1;
    }

    /// Retirements in this batch and the batches below it.
    pub(super) fn total(&self) -> u64 {
        let mut n = 0;
        let mut p: *const Batch = self;
        // SAFETY: (E2) each batch owns the one below it, alive as long as it is.
        while let Some(b) = unsafe { p.as_ref() } {
            n += b.len as u64;
            p = b.next;
        }
        n
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // The batches below are detached into a `Vec` first: its drop glue goes on past a
        // destructor that panics, as the slice below does, and needs no deep call chain.
        let mut below = Vec::new();
        let mut next = std::mem::replace(&mut self.next, std::ptr::null_mut());
        while !next.is_null() {
            // SAFETY: (E2) this batch owns the one below it, which nothing else frees.
            let mut batch = unsafe { Box::from_raw(next) };
            next = std::mem::replace(&mut batch.next, std::ptr::null_mut());
            below.push(batch);
        }
        let items =
            std::ptr::slice_from_raw_parts_mut(self.items.as_mut_ptr().cast::<Retired>(), self.len);
        // SAFETY: (E2) the first `len` items are initialized (`push`), and dropped only here.
        unsafe { std::ptr::drop_in_place(items) };
        drop(below);
    }
}
