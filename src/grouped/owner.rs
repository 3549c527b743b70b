//! Owners: what one executor stored, cleared by [`GroupedCache::clear_owner`] (with the groups
//! that leaves empty), and the holds that defer those clears while executors nest.

#![forbid(unsafe_code)]

use super::{GroupedCache, Part};
use crate::cache::{Handle, WeakHandle};
use crate::error::RecursionError;
use crate::sync::Ordering;
use crossbeam_queue::SegQueue;
use std::fmt;
use std::future::Future;

/// An owner of entries (an executor, say), for [`GroupedCache::clear_owner`].
///
/// ```
/// use runcache::grouped::{GroupedCache, OwnerId};
///
/// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
/// let executor = OwnerId(1);
/// cache.owner(executor).set(&0, &8, &"a", 1);
/// cache.clear_owner(executor);
/// assert!(cache.is_empty());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(pub u64);

/// One store of an owner's: the key, the value stored, and the serial of the group it was
/// stored in.
pub(super) type Logged<S, G, N, V> = ((S, G, N), WeakHandle<V>, u64);

/// What one owner inserted: keys and the exact values, so `clear_owner` never removes a
/// value another owner put there later.
pub(super) struct OwnerLog<S, G, N, V> {
    pub(super) entries: SegQueue<Logged<S, G, N, V>>,
}

/// Defers [`GroupedCache::clear_owner`] calls while it lives; see the module docs.
///
/// ```
/// use runcache::grouped::{GroupedCache, OwnerId};
///
/// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
/// cache.owner(OwnerId(3)).set(&0, &1, &"a", 1);
/// {
///     let _outer = cache.hold_clears();
///     let _inner = cache.hold_clears();
///     cache.clear_owner(OwnerId(3));
///     assert_eq!(cache.len(), 1, "deferred while any hold lives");
/// }
/// assert!(cache.is_empty());
/// ```
#[must_use = "the hold ends (and deferred clears run) when this is dropped"]
pub struct ClearHold<'a, S: Part, G: Part, N: Part, V: Send + Sync + 'static> {
    cache: &'a GroupedCache<S, G, N, V>,
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> Drop for ClearHold<'_, S, G, N, V> {
    fn drop(&mut self) {
        // AcqRel: the last hold to go sees every clear deferred under the others.
        if self.cache.holds.fetch_sub(1, Ordering::AcqRel) == 1 {
            while let Some(owner) = self.cache.deferred.pop() {
                self.cache.clear_owner_now(owner);
            }
        }
    }
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> GroupedCache<S, G, N, V> {
    /// A handle whose inserts are recorded as `owner`'s, for [`clear_owner`](Self::clear_owner).
    ///
    /// ```
    /// use runcache::grouped::{GroupedCache, OwnerId};
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// cache.owner(OwnerId(1)).set(&0, &1, &"a", 1);
    /// cache.owner(OwnerId(2)).set(&0, &1, &"b", 2);
    /// cache.clear_owner(OwnerId(1));
    /// assert!(cache.get(&0, &1, "a").is_none());
    /// assert!(cache.get(&0, &1, "b").is_some(), "another owner's entries stay");
    /// ```
    pub fn owner(&self, owner: OwnerId) -> Owned<'_, S, G, N, V> {
        Owned { cache: self, owner }
    }

    /// Removes every entry `owner` stored that still holds the value it stored (an entry
    /// another owner replaced since is left alone), and every group that leaves empty (a
    /// store into such a group at that very moment may be undone with it, as when a group is
    /// evicted). Deferred while a [`ClearHold`] lives.
    ///
    /// ```
    /// use runcache::grouped::{GroupedCache, OwnerId};
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// cache.owner(OwnerId(1)).set(&0, &1, &"a", 1);
    /// cache.owner(OwnerId(2)).set(&0, &1, &"a", 2); // owner 2 replaced it
    /// cache.clear_owner(OwnerId(1));
    /// assert_eq!(cache.get(&0, &1, "a").as_deref(), Some(&2), "owner 2's value is not owner 1's");
    /// ```
    pub fn clear_owner(&self, owner: OwnerId) {
        // Acquire: pairs with the AcqRel in `ClearHold::drop`.
        if self.holds.load(Ordering::Acquire) > 0 {
            self.deferred.push(owner);
            // A hold that ended meanwhile would have missed this owner: run it if so.
            if self.holds.load(Ordering::Acquire) == 0 {
                while let Some(o) = self.deferred.pop() {
                    self.clear_owner_now(o);
                }
            }
            return;
        }
        self.clear_owner_now(owner);
    }

    fn clear_owner_now(&self, owner: OwnerId) {
        let Some(log) = self.owners.remove(&owner) else {
            return;
        };
        while let Some((key, mine, serial)) = log.entries.pop() {
            let Some(mine) = mine.upgrade() else {
                continue;
            };
            if self
                .values
                .remove_if(&key, |v| std::ptr::eq(v, &*mine))
                .is_some()
            {
                self.uncount(key, serial);
            }
        }
    }

    /// Uncounts an entry `clear_owner` removed (or the values table took out as expired)
    /// from its group, and removes the group (from the table and its session's count) if
    /// that left it empty, so that finished owners and idle shapes leave no empty groups
    /// behind. A store into that group at the same moment may be
    /// undone with it, as when a group is evicted (`record`).
    pub(super) fn uncount(&self, (s, g, _): (S, G, N), serial: u64) {
        let key = (s, g);
        // Not the group it was stored in (that one was evicted): nothing to uncount.
        let Some(group) = self.groups.get(&key).filter(|now| now.serial == serial) else {
            return;
        };
        // Relaxed: a count; the group's removal is ordered by `evict_group`'s fence.
        if group.entries.fetch_sub(1, Ordering::Relaxed) != 1 {
            return;
        }
        let gone = self.groups.remove_if(&key, |now| {
            std::ptr::eq(now, &*group) && now.entries.load(Ordering::Relaxed) == 0
        });
        if gone.is_some() {
            self.evict_group(&key.0, &key.1, &group);
            // Relaxed: as in `evict_excess`; its order entry is passed over there.
            group.session.count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Defers `clear_owner` calls until every hold has dropped (for nested executors).
    ///
    /// ```
    /// use runcache::grouped::{GroupedCache, OwnerId};
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// cache.owner(OwnerId(1)).set(&0, &1, &"a", 1);
    /// let hold = cache.hold_clears(); // an outer executor runs an inner one
    /// cache.clear_owner(OwnerId(1)); // deferred
    /// assert_eq!(cache.len(), 1);
    /// drop(hold); // the deferred clear runs now
    /// assert!(cache.is_empty());
    /// ```
    pub fn hold_clears(&self) -> ClearHold<'_, S, G, N, V> {
        // AcqRel: pairs with the AcqRel in `ClearHold::drop`.
        self.holds.fetch_add(1, Ordering::AcqRel);
        ClearHold { cache: self }
    }
}

/// Inserts recorded as one owner's; see [`GroupedCache::owner`].
///
/// ```
/// use runcache::grouped::{GroupedCache, OwnerId};
///
/// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
/// let mine = cache.owner(OwnerId(9));
/// mine.set(&0, &1, &"x", 1);
/// mine.get_or_insert_with(&0, &1, &"y", || 2);
/// cache.clear_owner(OwnerId(9));
/// assert!(cache.is_empty());
/// ```
pub struct Owned<'a, S: Part, G: Part, N: Part, V: Send + Sync + 'static> {
    cache: &'a GroupedCache<S, G, N, V>,
    owner: OwnerId,
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> Owned<'_, S, G, N, V> {
    /// [`GroupedCache::set`], recorded as this owner's.
    ///
    /// ```
    /// use runcache::grouped::{GroupedCache, OwnerId};
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// assert!(cache.owner(OwnerId(1)).set(&0, &1, &"a", 1).is_none());
    /// assert_eq!(cache.len(), 1);
    /// ```
    pub fn set(&self, session: &S, group: &G, name: &N, value: V) -> Option<Handle<V>> {
        self.cache
            .set_as(Some(self.owner), session, group, name, value)
    }

    /// [`GroupedCache::get_or_insert_with`], recorded as this owner's when it builds.
    ///
    /// ```
    /// use runcache::grouped::{GroupedCache, OwnerId};
    ///
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// let built = cache.owner(OwnerId(1)).get_or_insert_with(&0, &1, &"a", || 1);
    /// // Found, not built: the entry stays owner 1's.
    /// cache.owner(OwnerId(2)).get_or_insert_with(&0, &1, &"a", || 2);
    /// cache.clear_owner(OwnerId(2));
    /// assert_eq!(cache.get(&0, &1, "a").as_deref(), Some(&*built));
    /// cache.clear_owner(OwnerId(1));
    /// assert!(cache.is_empty());
    /// ```
    #[track_caller]
    pub fn get_or_insert_with(
        &self,
        session: &S,
        group: &G,
        name: &N,
        build: impl FnOnce() -> V,
    ) -> Handle<V> {
        self.cache
            .get_or_insert_as(Some(self.owner), session, group, name, build)
    }

    /// [`GroupedCache::get_or_insert_with_async`], recorded as this owner's when it builds.
    ///
    /// # Errors
    /// As [`GroupedCache::get_or_insert_with_async`].
    ///
    /// ```
    /// use runcache::grouped::{GroupedCache, OwnerId};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let cache: GroupedCache<u32, u32, &str, u32> = GroupedCache::new(0);
    /// let executor = cache.owner(OwnerId(4));
    /// executor.get_or_insert_with_async(&0, &1, &"a", async { 1 }).await.unwrap();
    /// cache.clear_owner(OwnerId(4));
    /// assert!(cache.is_empty());
    /// # });
    /// ```
    pub async fn get_or_insert_with_async<F: Future<Output = V>>(
        &self,
        session: &S,
        group: &G,
        name: &N,
        build: F,
    ) -> Result<Handle<V>, RecursionError<(S, G, N)>> {
        self.cache
            .get_or_insert_as_async(Some(self.owner), session, group, name, build)
            .await
    }
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> fmt::Debug for Owned<'_, S, G, N, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owned")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> fmt::Debug for ClearHold<'_, S, G, N, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClearHold")
            // Relaxed: a diagnostic.
            .field("holds", &self.cache.holds.load(Ordering::Relaxed))
            .finish()
    }
}
