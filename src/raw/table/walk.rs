//! Walking a shard's slots: [`Shard::walk`] for iteration and removals by walk, `for_each`
//! and `validate` for the consistency check of a quiet cache, and the counters the growth
//! tests read.

#![allow(unsafe_code)]

use super::*;

impl<K: Eq, V> Shard<K, V> {
    /// How many slots the newest table has (for growth tests). A quiet shard may be in the
    /// middle of a migration: writers move it on a chunk at a time.
    pub(crate) fn slots(&self, guard: &Guard) -> usize {
        let mut t = self.root(guard);
        while let Some(next) = t.next(guard) {
            t = next;
        }
        t.len()
    }

    /// Migrations finished so far (for growth tests).
    pub(crate) fn migrations(&self) -> usize {
        // Relaxed: a statistic.
        self.migrations.load(Ordering::Relaxed)
    }

    /// Calls `f` on every node the shard's tables hold that has not moved on (a node may be
    /// seen twice while a migration copies it) until `f` returns `false`. For `validate`,
    /// which must see both tables of a quiet shard as they are; every other walk is
    /// [`walk`](Self::walk).
    pub(crate) fn for_each<'g>(
        &'g self,
        guard: &'g Guard,
        mut f: impl FnMut(&'g Node<K, V>) -> bool,
    ) {
        let mut table = Some(self.root(guard));
        while let Some(t) = table {
            for slot in t.slots.iter() {
                let s = slot.load(Ordering::Acquire, guard);
                if s.tag() & MOVED != 0 {
                    continue;
                }
                // SAFETY: (H3) as in `find`.
                if let Some(n) = unsafe { s.as_ref() } {
                    if !f(n) {
                        return;
                    }
                }
            }
            table = t.next(guard);
        }
    }

    /// Calls `f` on the node of every slot of the root table in `start..start + len` (fewer
    /// at the table's end), whatever the slot's tag; a table that migrates meanwhile may hand
    /// some nodes over twice and others not at all. For the policy's sweep (`raw/evict.rs`),
    /// which needs each entry at least once in the end, not exactly once now, and must not
    /// finish a migration on an admission's path. `false` once `start` is past the root's
    /// end.
    pub(crate) fn visit<'g>(
        &'g self,
        start: usize,
        len: usize,
        guard: &'g Guard,
        mut f: impl FnMut(&'g Node<K, V>),
    ) -> bool {
        let table = self.root(guard);
        if start >= table.len() {
            return false;
        }
        for slot in &table.slots[start..(start + len).min(table.len())] {
            let s = slot.load(Ordering::Acquire, guard);
            // SAFETY: (H3) as in `find`.
            if let Some(n) = unsafe { s.as_ref() } {
                f(n);
            }
        }
        true
    }

    /// The shard's nodes for a walk that sees each entry once (`Pinned::iter`,
    /// `Cache::retain`, `clear`, ranked shrinks): every node pointer in the slots of the
    /// root, whatever their tags.
    ///
    /// A migration in flight is finished first (this thread moves what is left, as a writer
    /// that needs the table would), so every key cached now is bound in the table walked:
    /// none lives only in a successor. A later migration leaves each node it moves in the
    /// old slot, tagged `MOVED` (H2), and a node replaced since forwards to its replacement,
    /// so a key bound all along is met exactly once, at its one slot (H1). A key removed and
    /// inserted again meanwhile may be met at two slots, once per insertion.
    pub(crate) fn walk<'g>(&'g self, guard: &'g Guard) -> Walk<'g, K, V> {
        let table = loop {
            let root = self.root(guard);
            match root.next(guard) {
                None => break root,
                // `finish` advances the root past `root`, whoever does it.
                Some(next) => self.finish(root, next, guard),
            }
        };
        Walk {
            table,
            index: 0,
            guard,
        }
    }

    /// Checks the probe structure of a quiet shard: every live node is found from its hash,
    /// nothing is frozen, a table that is not migrating counts exactly its taken slots, and
    /// the prefetch hint names the root's slots.
    pub(crate) fn validate(&self, guard: &Guard) -> Result<(), String> {
        let root = self.root(guard);
        // Relaxed: the cache is quiet.
        if self.hint_slots.load(Ordering::Relaxed) != root.slots.as_ptr() as usize
            || self.hint_mask.load(Ordering::Relaxed) != root.mask
        {
            return Err("the prefetch hint does not name the root's slots".to_string());
        }
        let mut table = Some(root);
        while let Some(t) = table {
            let mut taken = 0;
            for (i, slot) in t.slots.iter().enumerate() {
                let s = slot.load(Ordering::Acquire, guard);
                if s.tag() & FROZEN != 0 {
                    return Err(format!("slot {i} is frozen in a quiet cache"));
                }
                taken += usize::from(!s.is_null() || s.tag() & TOMB != 0);
                // SAFETY: (H3) as in `find`.
                let Some(n) = (unsafe { s.as_ref() }) else {
                    continue;
                };
                if s.tag() & MOVED == 0 && n.forwarded().is_some() {
                    return Err(format!("slot {i}: a replaced node was never swung out"));
                }
                if s.tag() & MOVED == 0 && n.is_live(guard) {
                    match self.find(n.hash, |k| k == n.key(), guard) {
                        Some(f) if std::ptr::eq(f, n) => {}
                        Some(_) => return Err(format!("slot {i}: its key is live twice")),
                        None => return Err(format!("slot {i}: a live entry cannot be found")),
                    }
                }
            }
            // Relaxed: the cache is quiet. Replacements take no claim (see `reserve`).
            let used = t.used.load(Ordering::Relaxed);
            if used & !MIGRATING & !CLAIMS != 0 {
                return Err("a claim is still in flight in a quiet cache".to_string());
            }
            if used & MIGRATING == 0 && ((used & CLAIMS) as usize) != taken {
                return Err(format!(
                    "{taken} slots are taken but {used} claims were counted"
                ));
            }
            table = t.next(guard);
        }
        Ok(())
    }
}

/// The nodes of one table, slot by slot (see [`Shard::walk`]): live, dead, frozen or moved.
pub(crate) struct Walk<'g, K, V> {
    table: &'g Table<K, V>,
    index: usize,
    guard: &'g Guard,
}

impl<'g, K, V> Iterator for Walk<'g, K, V> {
    type Item = &'g Node<K, V>;

    fn next(&mut self) -> Option<Self::Item> {
        while let Some(slot) = self.table.slots.get(self.index) {
            self.index += 1;
            // Acquire: as in `find`.
            let s = slot.load(Ordering::Acquire, self.guard);
            // SAFETY: (H3) a node read from a slot under `guard` outlives the guard (H3), whatever
            // the slot's tag.
            if let Some(n) = unsafe { s.as_ref() } {
                return Some(n);
            }
        }
        None
    }
}
