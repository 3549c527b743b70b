//! Migration: a table that fills (or fills with dead nodes) moves, slot by slot, into a fresh
//! table sized from what it holds; every thread that meets a migration helps it along by
//! chunks, and the thread whose CAS moves the shard's root past the old table retires it
//! (H2, H4).

#![allow(unsafe_code)]

use super::*;
use crate::raw::node::NodeRef;

impl<K: Eq, V> Shard<K, V> {
    /// Starts migrating `table` (the shard's root, or it waits for that), sizing the next
    /// table from what this one holds.
    pub(super) fn start_migration(&self, table: &Table<K, V>, guard: &Guard) {
        // Only the root migrates (at most two tables in flight): finish the one before.
        loop {
            let root = self.root(guard);
            if std::ptr::eq(root, table) {
                break;
            }
            match root.next(guard) {
                Some(next) => self.finish(root, next, guard),
                // `table` is no longer in the chain: nothing to start.
                None => return,
            }
        }
        if table.next(guard).is_some() {
            return;
        }
        // Relaxed: the bit only stops new reservations (H4). Claims in flight at the bit may
        // still land, and the scan below may or may not see them, so they count on top.
        let used = table.used.fetch_or(MIGRATING, Ordering::Relaxed);
        let in_flight = ((used & !MIGRATING) >> 32) as usize;
        // Every node that will be copied is live now or lands from a claim in flight: no node
        // becomes live in a migrating table otherwise (H4). Count them; the new table gets
        // four slots per node, so the copies fill at most a quarter of it.
        let copies = table
            .slots
            .iter()
            .filter(|slot| {
                let s = slot.load(Ordering::Acquire, guard);
                // SAFETY: (H3) as in `find`.
                unsafe { s.as_ref() }.is_some_and(|n| n.resolve().is_live(guard))
            })
            .count();
        let slots = (copies + in_flight)
            .saturating_mul(4)
            .next_power_of_two()
            .max(self.floor);
        let new = Owned::<Table<K, V>>::init(slots);
        // Release: pairs with the Acquire load in `Table::next`, publishing the new table.
        let _ = table.next.compare_exchange(
            Shared::null(),
            new,
            Ordering::Release,
            Ordering::Relaxed,
            guard,
        );
        // The loser's table drops here, never shared.
    }

    /// Copies one chunk of `table` into `next`; `false` when every chunk was handed out.
    pub(super) fn help(&self, table: &Table<K, V>, next: &Table<K, V>, guard: &Guard) -> bool {
        // Relaxed: the claim counter only divides the work.
        let start = table.claimed.fetch_add(CHUNK, Ordering::Relaxed);
        if start >= table.len() {
            return false;
        }
        let end = (start + CHUNK).min(table.len());
        let moved = (start..end)
            .filter(|&i| self.move_slot(table, next, i, guard))
            .count();
        self.count_moved(table, next, moved, guard);
        true
    }

    /// Moves the whole of `table` (the root) into `next` and makes `next` the root.
    pub(super) fn finish(&self, table: &Table<K, V>, next: &Table<K, V>, guard: &Guard) {
        while self.help(table, next, guard) {}
        // Every chunk is handed out; one may belong to a stalled thread. Move whatever is
        // left ourselves (moving is idempotent) and retire the table.
        let mut moved = 0;
        for i in 0..table.len() {
            moved += usize::from(self.move_slot(table, next, i, guard));
        }
        self.count_moved(table, next, moved, guard);
        self.advance(table, next, guard);
    }

    /// Adds to the moved count; the thread that completes it advances the root.
    pub(super) fn count_moved(
        &self,
        table: &Table<K, V>,
        next: &Table<K, V>,
        n: usize,
        guard: &Guard,
    ) {
        if n == 0 {
            return;
        }
        // AcqRel: the thread that completes the count acquires every mover's copies (each
        // released its own), and passes them on through the root's Release CAS.
        if table.moved.fetch_add(n, Ordering::AcqRel) + n == table.len() {
            self.advance(table, next, guard);
        }
    }

    /// Makes `next` the root in place of `table`, whose slots are all moved, and retires it.
    pub(super) fn advance(&self, table: &Table<K, V>, next: &Table<K, V>, guard: &Guard) {
        // Acquire: as in `root`. A root that is not `table` any more was advanced by another
        // thread.
        let old = self.root.load(Ordering::Acquire, guard);
        // SAFETY: (H5) as in `root`.
        if !std::ptr::addr_eq(unsafe { old.deref() }, table) {
            return;
        }
        // Relaxed: the caller reached `next` through this pointer with Acquire already.
        let new = table.next.load(Ordering::Relaxed, guard);
        // SAFETY: (H5) a table's successor outlives the guard (see `Table::next`).
        debug_assert!(unsafe { new.as_ref() }.is_some_and(|n| std::ptr::addr_eq(n, next)));
        // Release: pairs with the Acquire load in `root`, publishing the copies. Relaxed on
        // failure: another thread advanced it first.
        if self
            .root
            .compare_exchange(old, new, Ordering::Release, Ordering::Relaxed, guard)
            .is_ok()
        {
            self.set_hint(next, guard);
            // Relaxed: a statistic.
            self.migrations.fetch_add(1, Ordering::Relaxed);
            // SAFETY: (H3, H5) the root no longer points at `table` and nothing else leads to it,
            // so only threads pinned now can reach it; it is destroyed after they unpin (H3).
            unsafe { self.pending.defer(guard, move || drop(old.into_owned())) };
        }
    }

    /// Moves slot `i` of `table` into `next` (**H2**); `true` if this call marked it moved.
    pub(super) fn move_slot(
        &self,
        table: &Table<K, V>,
        next: &Table<K, V>,
        i: usize,
        guard: &Guard,
    ) -> bool {
        let slot = &table.slots[i];
        let mut s = slot.load(Ordering::Acquire, guard);
        loop {
            if s.tag() & MOVED != 0 {
                return false;
            }
            let target = if s.is_null() {
                // EMPTY → SEALED, TOMB → TOMB|MOVED.
                s.with_tag(s.tag() | MOVED)
            } else if s.tag() & FROZEN == 0 {
                // SAFETY: (H3) as below.
                if unsafe { s.deref() }.resolve().is_live(guard) {
                    s.with_tag(FROZEN)
                } else {
                    // A dead node never lives again (I4) and is not copied: nothing to
                    // freeze. A replacement racing this CAS either lands first (and we look
                    // again) or fails and finds the slot moved.
                    s.with_tag(MOVED)
                }
            } else {
                // SAFETY: (H3) a node read under `guard` outlives it (H3). A replaced node is
                // copied as its replacement, if it is still live when it would land.
                let node = unsafe { s.deref() }.resolve();
                crate::sync::stall();
                copy(next, node, guard);
                s.with_tag(MOVED)
            };
            // AcqRel: Release passes the node's publication on to readers of the new tag;
            // Acquire on failure reads what replaced it.
            match slot.compare_exchange(s, target, Ordering::AcqRel, Ordering::Acquire, guard) {
                Ok(_) if target.tag() & MOVED != 0 => return true,
                Ok(_) => s = target,
                Err(current) => s = current,
            }
        }
    }
}

/// Copies a frozen node into `next` unless its key is bound there already (a helper copied
/// it first, or it was copied and a writer changed that slot since) or the node is dead when
/// it would land (a dead node is never copied; for a late copy, H6).
fn copy<K: Eq, V>(next: &Table<K, V>, node: &Node<K, V>, guard: &Guard) {
    let tag = hash_tag(node.hash);
    let mut i = node.hash as usize & next.mask;
    for _ in 0..=next.mask {
        let slot = &next.slots[i];
        // Acquire: pairs with the Release CAS that stored a node here (its fields are read
        // below) and with the Release CAS of an unlink, so that past a tombstone the death
        // of the node unlinked there is visible (H6).
        let mut s = slot.load(Ordering::Acquire, guard);
        loop {
            // SAFETY: (H3) as above.
            match unsafe { s.as_ref() } {
                // Another key's node: not loaded.
                Some(_) if !s.may_hold(tag) => break,
                Some(n) => {
                    if std::ptr::eq(n, node) || (n.hash == node.hash && n.key() == node.key()) {
                        return;
                    }
                    break;
                }
                // Sealed: `next` migrates already, so this copy is late and the key's node
                // died meanwhile (a live node keeps its binding, H1); nothing to copy.
                None if s.tag() == MOVED => return,
                // A tombstone: keep probing.
                None if s.tag() != 0 => break,
                None => {
                    // A late copy (H6): another helper moved the slot first, and the key's
                    // node has since died in `next` and been unlinked (the tombstone we
                    // passed). Its death happened before that unlink, which we acquired, so
                    // it shows here: a late copy never lands. (Landing would bind the key a
                    // second time, take a slot that H4 did not count, and, for a replaced
                    // node, leave a forward that no writer swings.)
                    if !node.is_live(guard) {
                        return;
                    }
                    let p = NodeRef::into_raw(crate::raw::node::hold(node));
                    // Release: pairs with the Acquire slot loads; publishes the node's
                    // fields to readers of the new table.
                    match slot.compare_exchange(
                        Word::null(),
                        Word::node(p, node.hash),
                        Ordering::Release,
                        Ordering::Acquire,
                        guard,
                    ) {
                        Ok(_) => {
                            // Relaxed: as in `Table::reserve`.
                            next.used.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        Err(current) => {
                            // SAFETY: (I1) the count we took for the slot, never shared.
                            drop(unsafe { NodeRef::from_raw(p) });
                            s = current;
                        }
                    }
                }
            }
        }
        i = (i + 1) & next.mask;
    }
    debug_assert!(false, "a migration found its new table full (H4)");
}
