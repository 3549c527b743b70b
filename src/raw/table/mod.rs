//! One shard: an open-addressed table of node pointers (linear probing) that grows, or sheds
//! its dead entries, by a cooperative migration to a fresh table.
//!
//! # Slots
//!
//! A slot is a tagged pointer ([`Word`]: three state bits below the address, and where the
//! target allows, a hash tag above it that lets probes pass other keys' slots without
//! loading their nodes). Its states, and the only transitions between them:
//!
//! ```text
//!   EMPTY ──claim──▶ node(K) ──replace a dead node, or swing a replaced one──▶ node'(K)
//!     │                 │ └──unlink a dead node──▶ TOMB ──▶ TOMB|MOVED
//!     │                 └──freeze──▶ node|FROZEN ──copy, then──▶ node|MOVED
//!     └──seal (migration)──▶ SEALED (null|MOVED)
//! ```
//!
//! (A replaced node forwards to its replacement through its value cell until the slot is
//! swung to it; readers follow the forward, see `Node::view`.)
//!
//! - **H1 (binding).** Once a slot holds a node of key `K` it only ever holds nodes of `K`
//!   until it turns `TOMB`, and only a dead node is ever turned `TOMB`. A slot is claimed for
//!   `K` only at the first `EMPTY` slot of `K`'s probe sequence, found by a search that met no
//!   slot bound to `K` before it. So a key is bound to at most one slot per table, and a key
//!   whose probe meets `EMPTY` first is absent from that table.
//! - **H2 (migration).** Once a table migrates, no claim is reserved in it any more (a claim
//!   already in flight lands before its slot moves, or fails); each slot is moved exactly
//!   once: an `EMPTY` one is sealed, a node is frozen (after which nothing changes the slot),
//!   its replacement (if it was replaced) or itself copied into `next` if live, then the
//!   slot is marked `MOVED`. A writer writes into `next` only after the slot of its key in
//!   the old table is `MOVED` (or its probe ended at a `SEALED` slot), so the old table's
//!   node is authoritative until then: readers use a `FROZEN` node as it is and follow a
//!   `MOVED` or `SEALED` slot into `next`. The slot a writer leaves from must still bind its
//!   key, or end its probe, once moved: a slot claimed by another key, or the key's dead node
//!   unlinked (`TOMB`), before the move sends the probe on in the old table, to its real end
//!   (`leads_on`). Otherwise a lookup from the old root stops at an unsealed end and misses
//!   what the writer put in `next`.
//! - **H3 (counts).** A table holds one strong count of every node it points at, whatever the
//!   tag. The count leaves with the pointer: through the epoch collector when a CAS replaces
//!   or unlinks it, or when the table itself is destroyed. A copy takes a new count for the new
//!   table. So a node read from a slot under a guard lives until the guard drops, even if the
//!   node has since been removed from a newer table (the old table, reachable by that guard,
//!   still counts it).
//! - **H4 (room).** A node becomes live in a table only through a claim reserved on `used`
//!   (an `EMPTY` slot claimed, or a dead node replaced), reserved only while claims are
//!   below half the slots and the `MIGRATING` bit is clear (a replacement, which takes no
//!   new slot, is only counted in flight and only the bit refuses it). So once the bit is
//!   set, the nodes a migration will copy are the live ones (counted by a scan) plus the
//!   claims in flight at the bit (counted in `used`); the new table gets four slots per such
//!   node. Copies then fill at most a quarter of it and writers claim at most half, so every
//!   table keeps an `EMPTY` slot and every probe ends. Sizing by live nodes also makes a
//!   table full of dead ones migrate at its own size, or smaller.
//! - **H5 (table memory).** A table is one allocation, made by `Pointable::init` with its
//!   header first (`repr(C)`, `mask` its first field, written once) and `mask + 1` slot
//!   words after it, so its length is rebuilt from `mask` and every index masked by it is in
//!   bounds. It is reached under a guard only while the root or an older table leads to it,
//!   retired only after the root moved past it, and freed once, by its last owner.
//! - **H6 (late copies).** A helper may read a frozen slot, stall, and copy only after
//!   another helper moved that slot and writers used its copy, by which time the key may
//!   have been removed from `next` and its slot unlinked (`TOMB`). Such a copy must not land
//!   (it would bind the key twice, take a slot H4 did not count, and leave a replaced node's
//!   forward that no writer swings), so `copy` checks, at the empty slot it would claim,
//!   that the node is still live. A late copy has passed the key's tombstone, made by a
//!   Release CAS after the node died (only dead nodes are unlinked, H1) and read by the
//!   probe's Acquire load, so the check sees the death and nothing lands. A copy that is not
//!   late and whose node dies after the check lands a dead node, as it always could: the
//!   key's next write replaces it, the next migration sheds it, and a forward in it is swung
//!   by its replacer, which reaches `next` only once the slot moved, after this copy landed.
//!
//! A table is retired (through the epoch) by the thread whose CAS moves the shard's root past
//! it, after every slot is moved. A table's migration starts only when it is the root, so
//! there are at most two tables in flight.

#![allow(unsafe_code)]

mod array;
mod migrate;
mod walk;

use array::Table;

use crate::raw::epoch::Pending;
use crate::raw::node::{Node, NodeRef};
use crate::raw::word::{hash_tag, Word, HASH_TAGS};
use crate::sync::{AtomicUsize, Ordering};
use crossbeam_epoch::{Atomic, Guard, Owned, Shared};
use std::sync::Arc;

/// The node may not change any more; it is being copied to the next table.
const FROZEN: usize = 1;
/// The slot belongs to the next table now.
const MOVED: usize = 2;
/// A dead node was unlinked from here; the slot stays taken.
const TOMB: usize = 4;

/// Slots of a shard's first table (and the least a table has).
const MIN_SLOTS: usize = if cfg!(any(runcache_stress, runcache_loom)) {
    4
} else {
    16
};
/// Slots a migrating thread claims at a time.
const CHUNK: usize = if cfg!(any(runcache_stress, runcache_loom)) {
    2
} else {
    128
};
/// `Table::used`, bits 0–31: claims (slots claimed, dead nodes replaced, copies landed).
const CLAIMS: u64 = (1 << 32) - 1;
/// `Table::used`, bits 32–62: claims reserved whose CAS has not yet succeeded or failed.
const IN_FLIGHT: u64 = 1 << 32;
/// `Table::used`, bit 63: migration has begun; no claim may be reserved any more.
const MIGRATING: u64 = 1 << 63;

/// Where a key stands in the newest table: `slot` is its slot or the `EMPTY` slot to claim
/// for it, `current` what that slot held, `found` the key's node if it is live.
pub(crate) struct Position<'g, K, V> {
    table: &'g Table<K, V>,
    index: usize,
    /// The key's hash, for the slot word's tag.
    hash: u64,
    current: Word<'g, Node<K, V>>,
    pub(crate) found: Option<&'g Node<K, V>>,
}

/// One shard of the cache.
pub(crate) struct Shard<K, V> {
    root: Atomic<Table<K, V>>,
    /// The root's first slot and its mask, as plain numbers: a hint that `prefetch` reads
    /// without a pin, never dereferenced. Stored after the root changes, so it may lag.
    hint_slots: AtomicUsize,
    hint_mask: AtomicUsize,
    /// Migrations finished (for tests).
    migrations: AtomicUsize,
    /// The fewest slots a table of this shard has: the size it was presized to for the
    /// entries the cache expects (a power of two of at least `MIN_SLOTS`). A migration that
    /// sheds dead slots does not shrink the table below it, so a full cache does not grow
    /// again after each one.
    pub(crate) floor: usize,
    /// The cache's count of retired items not yet freed (see `Domain::reclaim`).
    pending: Arc<Pending>,
}

// SAFETY: (H3) a shard owns its tables and, through them, counts of its nodes, which hold `K` and
// `V`; they are dropped on whichever thread runs the deferred destructor or drops the
// cache, so `K: Send` and `V: Send + Sync` are required for the shard to move between threads.
unsafe impl<K: Send + Sync, V: Send + Sync> Send for Shard<K, V> {}
// SAFETY: (H3) every shared access goes through atomics; `&K` and `&V` are handed to other
// threads, hence `K: Sync` and `V: Sync`.
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for Shard<K, V> {}

impl<K: Eq, V> Shard<K, V> {
    /// A shard whose tables have room for `entries` entries without growing: twice as many
    /// slots, since writers claim at most half a table (H4). Under the stress and loom cfgs
    /// tables start at `MIN_SLOTS` whatever is expected, so that they migrate all the time.
    pub(crate) fn new(pending: Arc<Pending>, entries: usize) -> Self {
        let floor = if cfg!(any(runcache_stress, runcache_loom)) {
            MIN_SLOTS
        } else {
            entries
                .saturating_mul(2)
                .checked_next_power_of_two()
                .unwrap_or(MIN_SLOTS)
                .max(MIN_SLOTS)
        };
        let shard = Self {
            root: Atomic::init(floor),
            hint_slots: AtomicUsize::new(0),
            hint_mask: AtomicUsize::new(0),
            migrations: AtomicUsize::new(0),
            floor,
            pending,
        };
        // SAFETY: (H5) the shard is not shared yet.
        let guard = unsafe { crossbeam_epoch::unprotected() };
        shard.set_hint(shard.root(guard), guard);
        shard
    }

    /// Records where `table`, which just became the root, keeps its slots (see `prefetch`).
    /// A thread that advanced the root once may store its hint after another thread
    /// advanced it again, so the hint is re-read against the root until they agree: a hint
    /// left stale would only waste prefetches, but for as long as the table lasts.
    fn set_hint(&self, table: &Table<K, V>, guard: &Guard) {
        let mut table = table;
        loop {
            // Relaxed: a hint; nothing is read through it.
            self.hint_slots
                .store(table.slots.as_ptr() as usize, Ordering::Relaxed);
            self.hint_mask.store(table.mask, Ordering::Relaxed);
            let root = self.root(guard);
            if std::ptr::addr_eq(root, table) {
                return;
            }
            table = root;
        }
    }

    /// Asks the CPU to start loading the slot where a probe for `hash` begins, before the
    /// caller pins: the pin's full fence stops later loads, but not a prefetch already
    /// issued, so the slot's line arrives while the fence drains. A prefetch neither faults
    /// nor reads anything into the program, so a stale hint (the table was replaced, even
    /// freed) costs only a useless prefetch.
    #[inline(always)]
    pub(crate) fn prefetch(&self, hash: u64) {
        #[cfg(all(target_arch = "x86_64", not(runcache_loom)))]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // Relaxed: a hint.
            let base = self.hint_slots.load(Ordering::Relaxed);
            let mask = self.hint_mask.load(Ordering::Relaxed);
            let addr = base.wrapping_add((hash as usize & mask) * std::mem::size_of::<usize>());
            // SAFETY: (none needed) `prefetch` is a hint to the cache: it never faults and reads
            // nothing into the program, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(addr as *const i8) };
        }
        #[cfg(not(all(target_arch = "x86_64", not(runcache_loom))))]
        let _ = hash;
    }

    #[inline(always)]
    fn root<'g>(&self, guard: &'g Guard) -> &'g Table<K, V> {
        // Acquire: pairs with the Release CAS in `finish`, so the new root's slots (and the
        // copies in them) are visible.
        let t = self.root.load(Ordering::Acquire, guard);
        // SAFETY: (H5) the root is never null, and a table reached under `guard` outlives it.
        unsafe { t.deref() }
    }

    /// Finds the live node of the key that `eq` accepts; reads only.
    #[inline]
    pub(crate) fn find<'g>(
        &'g self,
        hash: u64,
        eq: impl Fn(&K) -> bool,
        guard: &'g Guard,
    ) -> Option<&'g Node<K, V>> {
        self.find_bound(hash, eq, guard)
            .map(Node::resolve)
            .filter(|n| n.is_live(guard))
    }

    /// Finds the node the key that `eq` accepts is bound to, live, dead or forwarding (its
    /// [`Node::view`] follows the forward); reads only. A hit reads the node's cell once,
    /// in the caller's view: the fewer instructions a lookup takes, the more independent
    /// lookups the CPU overlaps (13% on pinned hits over checking liveness here as well).
    #[inline(always)]
    pub(crate) fn find_bound<'g>(
        &'g self,
        hash: u64,
        eq: impl Fn(&K) -> bool,
        guard: &'g Guard,
    ) -> Option<&'g Node<K, V>> {
        let tag = hash_tag(hash);
        self.probe(hash, guard, |s, n| match holds_key(s, n, tag, hash, &eq) {
            true => Pick::Found(n),
            false => Pick::Pass,
        })
    }

    /// Walks the probe of `hash` through the table and those it migrates to, and returns
    /// the node `pick` finds at a slot (a slot whose node moved on sends the probe to the
    /// newer table); reads only. A slot `pick` marks `Later` sends the probe on to the newer
    /// table once this one's ends, if it does not find the node first.
    #[inline(always)]
    fn probe<'g>(
        &'g self,
        hash: u64,
        guard: &'g Guard,
        pick: impl Fn(Word<'g, Node<K, V>>, &'g Node<K, V>) -> Pick<'g, K, V>,
    ) -> Option<&'g Node<K, V>> {
        let mut table = self.root(guard);
        'tables: loop {
            let mut i = hash as usize & table.mask;
            let mut later = false;
            // No probe bound: every table keeps an `EMPTY` or `SEALED` slot (H4), and the
            // probe ends at the first one. Counting probes cost about 6% on pinned hits, so
            // only builds with debug assertions count them, to turn a broken H4 into a panic
            // instead of a thread spinning for ever.
            #[cfg(debug_assertions)]
            let mut probes = 0;
            loop {
                #[cfg(debug_assertions)]
                {
                    assert!(
                        probes <= table.mask,
                        "a lookup went round a whole table without meeting its end (H4)"
                    );
                    probes += 1;
                }
                // Acquire: pairs with the Release CAS that stored the node (claim, replace or
                // copy), so its fields are visible.
                let s = table.slot(i).load(Ordering::Acquire, guard);
                // SAFETY: (H3) a node read from a slot under `guard` outlives the guard (H3).
                match unsafe { s.as_ref() } {
                    None if s.tag() == MOVED => {
                        table = table.next(guard)?;
                        continue 'tables;
                    }
                    None if s.tag() == 0 && later => {
                        table = table.next(guard)?;
                        continue 'tables;
                    }
                    None if s.tag() == 0 => return None,
                    None => {}
                    Some(n) => match pick(s, n) {
                        Pick::Found(found) => {
                            if s.tag() & MOVED != 0 {
                                table = table.next(guard)?;
                                continue 'tables;
                            }
                            return Some(found);
                        }
                        Pick::Later => later = true,
                        Pick::Pass => {}
                    },
                }
                i = (i + 1) & table.mask;
            }
        }
    }

    /// Whether a slot of the key of hash `hash` holds `node`, in the table or one it
    /// migrates to: reads slots, and loads only a moved node of the same hash tag (a
    /// dangling `node` is compared, never loaded; X4 in `expire/`). Unlike
    /// [`holding`](Self::holding) it does not follow forwards, and a node it finds may have
    /// died since it was linked.
    pub(crate) fn leads_to(&self, hash: u64, node: *const Node<K, V>, guard: &Guard) -> bool {
        let tag = hash_tag(hash);
        self.probe(hash, guard, |s, n| {
            if std::ptr::eq(n, node) {
                Pick::Found(n)
            } else if s.tag() & MOVED != 0 && s.may_hold(tag) && n.hash == hash {
                // Maybe the key's slot, moved on with another node of it: the key's node
                // may be in the newer table now (H2).
                Pick::Later
            } else {
                Pick::Pass
            }
        })
        .is_some()
    }

    /// Finds `node` (hash `hash`) where the table binds it, or where it binds a node that
    /// forwards to it; reads only, and loads no node whose slot's tag rules it out. A node
    /// the table no longer leads to is not found; `node` may be a dangling address, which is
    /// compared, never loaded (X4 in `expire/`).
    pub(crate) fn holding<'g>(
        &'g self,
        hash: u64,
        node: *const Node<K, V>,
        guard: &'g Guard,
    ) -> Option<&'g Node<K, V>> {
        let tag = hash_tag(hash);
        // The slot's own node is compared before it is loaded; a node of the same key is
        // loaded to follow its forward (a replacement the slot has not been swung to yet).
        self.probe(hash, guard, |s, n| {
            if !s.may_hold(tag) {
                Pick::Pass
            } else if std::ptr::eq(n, node) {
                Pick::Found(n)
            } else if n.hash != hash {
                Pick::Pass
            } else if let Some(f) = Some(n.resolve()).filter(|f| std::ptr::eq(*f, node)) {
                Pick::Found(f)
            } else if s.tag() & MOVED != 0 {
                // Maybe the key's slot, moved on with another node of it (H2).
                Pick::Later
            } else {
                Pick::Pass
            }
        })
    }

    /// Finds where the key belongs in the newest table, helping a migration on the way: the
    /// key's slot in an older table is moved first, and its probe's end sealed (**H2**).
    pub(crate) fn locate<'g>(
        &'g self,
        hash: u64,
        eq: impl Fn(&K) -> bool,
        guard: &'g Guard,
    ) -> Position<'g, K, V> {
        let tag = hash_tag(hash);
        let mut table = self.root(guard);
        if let Some(next) = table.next(guard) {
            self.help(table, next, guard);
        }
        'tables: loop {
            let next = table.next(guard);
            let mut i = hash as usize & table.mask;
            let mut probes = 0;
            loop {
                if probes > table.mask {
                    // Full (see H4): move on.
                    table = self.successor(table, guard);
                    continue 'tables;
                }
                let s = table.slots[i].load(Ordering::Acquire, guard);
                // SAFETY: (H3) as in `find`.
                match unsafe { s.as_ref() } {
                    None if s.tag() == MOVED => {
                        table = self.successor(table, guard);
                        continue 'tables;
                    }
                    None if s.tag() == 0 => {
                        // The key is absent from this table. If the table migrates, seal
                        // the slot so no one can claim it, and go on to the next (unless the
                        // slot was claimed for another key before it moved: then the probe
                        // goes on here, to its real end).
                        let Some(next) = next else {
                            return Position {
                                table,
                                index: i,
                                hash,
                                current: s,
                                found: None,
                            };
                        };
                        if self.move_slot(table, next, i, guard) {
                            self.count_moved(table, next, 1, guard);
                        }
                        if self.leads_on(table, i, tag, hash, &eq, guard) {
                            table = next;
                            continue 'tables;
                        }
                    }
                    None => {}
                    Some(n) if holds_key(s, n, tag, hash, &eq) => {
                        // Frozen or moved after we read `next`: it is set now. Either way the
                        // key's slot is moved before we look at `next` (H2): its copy may not
                        // have landed yet.
                        let next = match next {
                            Some(next) => Some(next),
                            None if s.tag() != 0 => Some(self.successor(table, guard)),
                            None => None,
                        };
                        if let Some(next) = next {
                            if self.move_slot(table, next, i, guard) {
                                self.count_moved(table, next, 1, guard);
                            }
                            // The key's dead node may have been unlinked (`TOMB`) before the
                            // slot moved: then the key is bound here no more, and its probe
                            // goes on in this table, whose end is sealed before any write
                            // into `next` (H2).
                            if self.leads_on(table, i, tag, hash, &eq, guard) {
                                table = next;
                                continue 'tables;
                            }
                        } else {
                            if let Some(to) = n.forwarded() {
                                // Replaced: swing the slot to the replacement, then look again.
                                let to = NodeRef::into_raw(super::node::hold(to.resolve()));
                                // SAFETY: (H3, I1) the count just taken goes to the slot, or
                                // goes if the swing fails; no value comes along.
                                let _ =
                                    unsafe { swing(table, i, s, to, None, &self.pending, guard) };
                                continue;
                            }
                            return Position {
                                table,
                                index: i,
                                hash,
                                current: s,
                                found: n.is_live(guard).then_some(n),
                            };
                        }
                    }
                    Some(_) => {}
                }
                i = (i + 1) & table.mask;
                probes += 1;
            }
        }
    }

    /// The table after `table`, starting the migration if none has started.
    /// Whether slot `i` of `table`, just moved, sends the key's probe on to the next table:
    /// it is `SEALED` (the probe's end), or it still holds a node of the key (moved with it,
    /// H1). A moved tombstone or another key's moved node does not: the probe goes on in
    /// `table`.
    fn leads_on(
        &self,
        table: &Table<K, V>,
        i: usize,
        tag: usize,
        hash: u64,
        eq: &impl Fn(&K) -> bool,
        guard: &Guard,
    ) -> bool {
        let s = table.slots[i].load(Ordering::Acquire, guard);
        // SAFETY: (H3) as in `find`.
        match unsafe { s.as_ref() } {
            None => s.tag() == MOVED,
            Some(n) => holds_key(s, n, tag, hash, eq),
        }
    }

    fn successor<'g>(&'g self, table: &'g Table<K, V>, guard: &'g Guard) -> &'g Table<K, V> {
        loop {
            if let Some(next) = table.next(guard) {
                return next;
            }
            self.start_migration(table, guard);
        }
    }

    /// Swings the slot at `pos`, whose node `pos.found` (never `None` here) has since been
    /// replaced, straight to `to`, its replacement (or a later one): the replacer already
    /// holds the key's slot, so it needs no second probe. The replaced node is retired with
    /// `value` (the replacer's count of the value it took out of the node's cell), one
    /// deferred destructor for the two, as [`unlink_with`](Self::unlink_with) does.
    /// `Err(value)` if the slot changed meanwhile (another thread swung it, or a migration
    /// froze or moved it): the caller retires `value` itself and locates again, which swings
    /// whatever forward it meets or moves the slot.
    ///
    /// # Safety
    /// - `value`, if any, is as [`unlink_with`](Self::unlink_with) requires.
    pub(crate) unsafe fn swing_at_with(
        &self,
        pos: &Position<'_, K, V>,
        to: NodeRef<K, V>,
        value: Option<*const V>,
        guard: &Guard,
    ) -> Result<(), Option<*const V>> {
        debug_assert!(
            pos.found.is_some(),
            "only a slot that held the key's live node is swung (an empty one is claimed)"
        );
        // SAFETY: (I1, I6) `to`'s count becomes the slot's (or goes, if the swing fails); the
        // caller's contract covers `value`.
        unsafe {
            swing(
                pos.table,
                pos.index,
                pos.current,
                NodeRef::into_raw(to),
                value,
                &self.pending,
                guard,
            )
        }
    }

    /// Links `node` at `pos`: claims the `EMPTY` slot, or replaces the dead node there.
    /// `false`: the slot changed, or the table is full; locate again.
    pub(crate) fn link(
        &self,
        pos: &Position<'_, K, V>,
        node: *const Node<K, V>,
        guard: &Guard,
    ) -> bool {
        let table = pos.table;
        let claim = pos.current.is_null();
        // Replacing a dead node is reserved too, in flight only: once a table migrates, no
        // node can become live in it, so the scan in `start_migration` counts every node it
        // will copy.
        if !table.reserve(!claim) {
            self.start_migration(table, guard);
            return false;
        }
        // Release: pairs with the Acquire slot loads in `find` and `locate`; publishes the
        // node's fields. Relaxed on failure: nothing is read.
        let landed = table.slots[pos.index]
            .compare_exchange(
                pos.current,
                Word::node(node, pos.hash),
                Ordering::Release,
                Ordering::Relaxed,
                guard,
            )
            .is_ok();
        table.settle(landed, !claim);
        if landed && !claim {
            // SAFETY: (H3, I1) our CAS took the dead node out of the slot, with the table's count
            // of it (H3).
            unsafe { retire(pos.current, None, &self.pending, guard) };
        }
        landed
    }

    /// Unlinks a dead node, if it is still where it was linked (its slot turns `TOMB`). A
    /// node that a migration has frozen is left to it: the copy skips dead nodes.
    pub(crate) fn unlink(&self, node: &Node<K, V>, guard: &Guard) {
        // SAFETY: (H3) no value comes along.
        let _ = unsafe { self.unlink_with(node, None, guard) };
    }

    /// [`unlink`](Self::unlink), retiring `value` (a count of a value just taken out of the
    /// node's cell) together with the node if this call unlinks it: one deferred destructor
    /// instead of two. Returns `value` when it was not retired (the node was not unlinked
    /// here), for the caller to retire.
    ///
    /// # Safety
    /// - `value`, if any, is the node's value, whose count (C1) the caller owns and that no
    ///   new reader can reach (it left the cell), to be released once readers pinned now
    ///   have unpinned.
    pub(crate) unsafe fn unlink_with(
        &self,
        node: &Node<K, V>,
        value: Option<*const V>,
        guard: &Guard,
    ) -> Option<*const V> {
        debug_assert!(!node.is_live(guard), "only dead nodes are unlinked (H1)");
        let mut table = self.root(guard);
        'tables: loop {
            let mut i = node.hash as usize & table.mask;
            for _ in 0..=table.mask {
                let s = table.slots[i].load(Ordering::Acquire, guard);
                if s.is_null() && s.tag() & TOMB == 0 {
                    if s.tag() & MOVED != 0 {
                        match table.next(guard) {
                            Some(next) => {
                                table = next;
                                continue 'tables;
                            }
                            None => return value,
                        }
                    }
                    return value;
                }
                if std::ptr::eq(s.as_raw(), node) {
                    match s.tag() {
                        0 => {
                            // Release: pairs with the Acquire slot load of a migration's
                            // copy (`copy`), which must see the node's death once it has
                            // passed the tombstone (H6). Relaxed on failure: nothing is read.
                            if table.slots[i]
                                .compare_exchange(
                                    s,
                                    Word::null().with_tag(TOMB),
                                    Ordering::Release,
                                    Ordering::Relaxed,
                                    guard,
                                )
                                .is_ok()
                            {
                                // SAFETY: (H3, I6) our CAS took the node out of the slot (H3); the
                                // caller's contract covers `value`.
                                unsafe { retire(s, value, &self.pending, guard) };
                                return None;
                            }
                            return value;
                        }
                        MOVED => match table.next(guard) {
                            Some(next) => {
                                table = next;
                                continue 'tables;
                            }
                            None => return value,
                        },
                        _ => return value,
                    }
                }
                i = (i + 1) & table.mask;
            }
            return value;
        }
    }
}

/// What a probe's `pick` makes of a slot's node.
enum Pick<'g, K, V> {
    /// The node looked for (the slot's, or one it leads to).
    Found(&'g Node<K, V>),
    /// Not it, but a slot that moved on and may have been its key's: if this table's probe
    /// ends without it, the newer table is searched too.
    Later,
    Pass,
}

/// Whether slot word `s`, which holds node `n`, holds a node of the key that `eq` accepts
/// (hash `hash`, slot tag `tag`). The tag first: a slot of another key is passed without
/// loading its node. Where the tag is on, it stands in for the node's hash, and a match goes
/// straight to the key.
#[inline(always)]
fn holds_key<K, V>(
    s: Word<'_, Node<K, V>>,
    n: &Node<K, V>,
    tag: usize,
    hash: u64,
    eq: &impl Fn(&K) -> bool,
) -> bool {
    s.may_hold(tag) && (HASH_TAGS || n.hash == hash) && eq(n.key())
}

/// Swings slot `i`, which held `current` (a replaced node), to `p`, the node that replaced
/// it, retiring the replaced node with `value`; a failed CAS (`Err(value)`, nothing retired)
/// means another thread swung it, or a migration froze it (and copies `p`'s node).
///
/// # Safety
/// - The caller owns one strong count of `p` (S1): the slot takes it, or it is released
///   here if the swing fails.
/// - `value`, if any, is as [`Shard::unlink_with`] requires.
unsafe fn swing<K, V>(
    table: &Table<K, V>,
    i: usize,
    current: Word<'_, Node<K, V>>,
    p: *const Node<K, V>,
    value: Option<*const V>,
    pending: &Arc<Pending>,
    guard: &Guard,
) -> Result<(), Option<*const V>> {
    // SAFETY: (S1) the caller's count keeps the node alive.
    let to = unsafe { &*p };
    // Release: pairs with the Acquire slot loads (the replacement's fields were published by
    // the forward, which we acquired; this passes them on).
    match table.slots[i].compare_exchange(
        current,
        Word::node(p, to.hash),
        Ordering::Release,
        Ordering::Relaxed,
        guard,
    ) {
        Ok(_) => {
            // SAFETY: (H3, I1, I6) our CAS took the replaced node out of the slot, with the
            // table's count; the caller's contract covers `value`.
            unsafe { retire(current, value, pending, guard) };
            Ok(())
        }
        Err(_) => {
            // SAFETY: (I1, S1) the caller's count, meant for the slot, which did not take it.
            drop(unsafe { NodeRef::from_raw(p) });
            Err(value)
        }
    }
}

/// Hands a node's table count to the epoch collector, counted in `pending` until it is freed.
///
/// Retires a node taken out of a slot, and `value` with it.
///
/// # Safety
/// - The caller's own CAS just took `node` out of a slot, so the table's count of it (H3) is
///   released exactly once.
/// - `value`, if any, is as [`Shard::unlink_with`] requires.
unsafe fn retire<K, V>(
    node: Word<'_, Node<K, V>>,
    value: Option<*const V>,
    pending: &Arc<Pending>,
    guard: &Guard,
) {
    let raw = node.as_raw();
    // Null for none: two words, so that with `Pending`'s count the closure still fits
    // crossbeam's inline storage (three words) instead of a boxed allocation.
    let value = value.unwrap_or(std::ptr::null());
    // SAFETY: (I1, I6, C1) readers that can still reach `raw` or `value` are pinned; the closure
    // runs after they unpin. The node's count came from `NodeRef::into_raw` (I1); the value's
    // count is the caller's (C1). The value goes first: its count may hold the node.
    unsafe {
        pending.defer(guard, move || {
            if value.is_null() {
                drop(NodeRef::from_raw(raw));
            } else {
                super::node::release_value_and_node::<K, V>(value, raw);
            }
        })
    };
}

impl<K, V> Drop for Shard<K, V> {
    fn drop(&mut self) {
        // SAFETY: (H5) `&mut self`: no guard of this cache exists, so the tables are ours: the
        // root and, if a migration was under way, the table it was copying into.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            // The cells of the nodes still cached own a count of their values, which holds
            // the node (C1, N1): release them first, so that the tables' counts are the
            // nodes' last.
            let mut t = self.root.load(Ordering::Relaxed, guard);
            while !t.is_null() {
                for slot in t.deref().slots.iter() {
                    let p = slot.load(Ordering::Relaxed, guard);
                    if !p.is_null() {
                        // A slot not yet swung to its node's replacement reaches the cached
                        // value through the forward.
                        (*p.as_raw()).resolve().release_cached();
                    }
                }
                t = t.deref().next.load(Ordering::Relaxed, guard);
            }
            let mut t = self.root.load(Ordering::Relaxed, guard);
            while !t.is_null() {
                let next = t.deref().next.load(Ordering::Relaxed, guard);
                drop(t.into_owned());
                t = next;
            }
        }
    }
}
