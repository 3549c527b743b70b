//! Expiry of the grouped cache's values, and the groups it leaves empty: the builder, the
//! values' key (which carries its group's serial), and the drain of the values the values
//! table took out as expired.

#![forbid(unsafe_code)]

use super::{unbounded_builder, GroupedCache, Part};
use crate::cache::{CacheBuilder, Clock, RemovalCause};
use crate::error::ConfigError;
use crossbeam_queue::SegQueue;
use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

/// A value's key: its three parts, and the serial of the group whose count its store went
/// into, so that the value's expiry uncounts that group and no later one of the same key.
/// It hashes and compares as its parts alone (the owned tuple), so lookups by parts find it.
pub(super) struct Stored<S, G, N> {
    pub(super) parts: (S, G, N),
    pub(super) serial: u64,
}

impl<S: Hash, G: Hash, N: Hash> Hash for Stored<S, G, N> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts.hash(state);
    }
}

impl<S: Eq, G: Eq, N: Eq> PartialEq for Stored<S, G, N> {
    fn eq(&self, other: &Self) -> bool {
        self.parts == other.parts
    }
}

impl<S: Eq, G: Eq, N: Eq> Eq for Stored<S, G, N> {}

impl<S, G, N> Borrow<(S, G, N)> for Stored<S, G, N> {
    fn borrow(&self) -> &(S, G, N) {
        &self.parts
    }
}

/// Values the values table took out as expired, for the grouped cache to uncount from their
/// groups (the table's listener queues them; the grouped cache's writes drain the queue).
pub(super) type Expired<S, G, N> = Arc<SegQueue<((S, G, N), u64)>>;

/// Builds a [`GroupedCache`] whose values expire; see [`GroupedCache::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct GroupedCacheBuilder<S: Part, G: Part, N: Part, V: Send + Sync + 'static> {
    groups_per_session: usize,
    values: CacheBuilder<Stored<S, G, N>, V>,
    expires: bool,
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> GroupedCacheBuilder<S, G, N, V> {
    /// Each value expires this long after it was stored (a store over it starts anew); as
    /// [`CacheBuilder::time_to_live`](crate::CacheBuilder::time_to_live). A group whose
    /// values have all expired leaves its session.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    /// use runcache::Clock;
    /// use std::time::Duration;
    ///
    /// let (clock, hand) = Clock::manual();
    /// let blobs = GroupedCache::<u32, u32, &str, u32>::builder(4)
    ///     .time_to_live(Duration::from_secs(60))
    ///     .clock(clock)
    ///     .build()?;
    /// blobs.set(&0, &224, &"conv1", 1);
    /// hand.advance(Duration::from_secs(60));
    /// assert!(blobs.get(&0, &224, "conv1").is_none());
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn time_to_live(mut self, live: Duration) -> Self {
        self.values = self.values.time_to_live(live);
        self.expires = true;
        self
    }

    /// Each value expires once this long has passed since it was last stored or found (by
    /// [`get`](GroupedCache::get) or a hit of
    /// [`get_or_insert_with`](GroupedCache::get_or_insert_with)); as
    /// [`CacheBuilder::time_to_idle`](crate::CacheBuilder::time_to_idle). A group whose
    /// values have all expired leaves its session: an input shape nobody ran for that long
    /// gives its objects and its place under the capacity back.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    /// use runcache::Clock;
    /// use std::time::Duration;
    ///
    /// let (clock, hand) = Clock::manual();
    /// let blobs = GroupedCache::<u32, u32, &str, u32>::builder(4)
    ///     .time_to_idle(Duration::from_secs(600))
    ///     .clock(clock)
    ///     .build()?;
    /// blobs.set(&0, &224, &"conv1", 1);
    /// blobs.set(&0, &384, &"conv1", 2);
    /// hand.advance(Duration::from_secs(300));
    /// assert!(blobs.get(&0, &224, "conv1").is_some()); // shape 224 is in use
    /// hand.advance(Duration::from_secs(300));
    /// blobs.purge_expired();
    /// assert_eq!(blobs.group_count(&0), 1, "shape 384 sat idle for ten minutes");
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn time_to_idle(mut self, idle: Duration) -> Self {
        self.values = self.values.time_to_idle(idle);
        self.expires = true;
        self
    }

    /// The clock deadlines are read against (default [`Clock::coarse`]); a
    /// [`Clock::manual`] one lets tests move time.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    /// use runcache::Clock;
    /// use std::time::Duration;
    ///
    /// let blobs = GroupedCache::<u32, u32, &str, u32>::builder(0)
    ///     .time_to_idle(Duration::from_secs(600))
    ///     .clock(Clock::ticking()?)
    ///     .build()?;
    /// blobs.set(&0, &1, &"a", 1);
    /// assert!(blobs.get(&0, &1, "a").is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock(mut self, clock: Clock) -> Self {
        self.values = self.values.clock(clock);
        self
    }

    /// The grouped cache.
    ///
    /// # Errors
    /// [`ConfigError::Expiry`] if both a time to live and a time to idle were given: a value
    /// takes one rule.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    /// use std::time::Duration;
    ///
    /// let both = GroupedCache::<u32, u32, &str, u32>::builder(0)
    ///     .time_to_live(Duration::from_secs(60))
    ///     .time_to_idle(Duration::from_secs(10))
    ///     .build();
    /// assert!(both.is_err());
    /// ```
    pub fn build(self) -> Result<GroupedCache<S, G, N, V>, ConfigError> {
        let expired: Option<Expired<S, G, N>> = self.expires.then(Arc::default);
        let mut values = self.values;
        if let Some(queue) = &expired {
            let queue = Arc::clone(queue);
            values = values.on_evict(move |k: &Stored<S, G, N>, _, cause| {
                if cause == RemovalCause::Expired {
                    queue.push((k.parts.clone(), k.serial));
                }
            });
        }
        Ok(GroupedCache::with_values(
            self.groups_per_session,
            values.build()?,
            expired,
        ))
    }
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> fmt::Debug
    for GroupedCacheBuilder<S, G, N, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupedCacheBuilder")
            .field("groups_per_session", &self.groups_per_session)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl<S: Part, G: Part, N: Part, V: Send + Sync + 'static> GroupedCache<S, G, N, V> {
    /// A builder for a grouped cache keeping at most `groups_per_session` groups per session
    /// (0: no limit) whose values expire: see
    /// [`time_to_live`](GroupedCacheBuilder::time_to_live) and
    /// [`time_to_idle`](GroupedCacheBuilder::time_to_idle).
    ///
    /// Each value expires on its own; an expired one is never returned (lookups miss it,
    /// `get_or_insert_with` builds it again). A group whose values have all expired leaves
    /// its session and its count. Its values are taken out as the grouped cache's writes or
    /// [`purge_expired`](Self::purge_expired) reach them, and a write that makes a group
    /// takes out every expired value first: an expired group never pushes out a live one,
    /// and a store never lands in a group that has expired.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    /// use runcache::Clock;
    /// use std::time::Duration;
    ///
    /// let (clock, hand) = Clock::manual();
    /// let blobs = GroupedCache::<u32, u32, &str, u32>::builder(2)
    ///     .time_to_idle(Duration::from_secs(600))
    ///     .clock(clock)
    ///     .build()?;
    /// blobs.set(&0, &224, &"conv1", 1);
    /// blobs.set(&0, &384, &"conv1", 2);
    /// hand.advance(Duration::from_secs(300));
    /// assert!(blobs.get(&0, &224, "conv1").is_some());
    /// hand.advance(Duration::from_secs(300));
    /// // Shape 384 sat idle for ten minutes: the new shape takes its place, and the oldest
    /// // shape, 224, which was in use, stays.
    /// blobs.set(&0, &512, &"conv1", 3);
    /// assert!(blobs.get(&0, &224, "conv1").is_some());
    /// assert!(blobs.get(&0, &384, "conv1").is_none());
    /// assert_eq!(blobs.group_count(&0), 2);
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn builder(groups_per_session: usize) -> GroupedCacheBuilder<S, G, N, V> {
        GroupedCacheBuilder {
            groups_per_session,
            values: unbounded_builder(),
            expires: false,
        }
    }

    /// Uncounts the values the values table took out as expired from their groups, and
    /// removes the groups that leaves empty (as `clear_owner` does).
    pub(super) fn uncount_expired(&self) {
        if let Some(queue) = &self.expired {
            while let Some((key, serial)) = queue.pop() {
                self.uncount(key, serial);
            }
        }
    }

    /// Takes out every value whose time has passed, and the groups that leaves empty (from
    /// their sessions and their counts); returns how many values it took out. Writes that
    /// make a group do this themselves; a cache that goes quiet can call it now and then.
    /// Without expiry it does nothing and returns 0.
    ///
    /// ```
    /// use runcache::grouped::GroupedCache;
    /// use runcache::Clock;
    /// use std::time::Duration;
    ///
    /// let (clock, hand) = Clock::manual();
    /// let blobs = GroupedCache::<u32, u32, &str, u32>::builder(0)
    ///     .time_to_live(Duration::from_secs(1))
    ///     .clock(clock)
    ///     .build()?;
    /// blobs.set(&0, &1, &"a", 1);
    /// blobs.set(&0, &1, &"b", 2);
    /// hand.advance(Duration::from_secs(2));
    /// assert_eq!(blobs.purge_expired(), 2);
    /// assert_eq!((blobs.len(), blobs.group_count(&0)), (0, 0));
    /// # Ok::<(), runcache::ConfigError>(())
    /// ```
    pub fn purge_expired(&self) -> usize {
        let out = self.values.purge_expired();
        self.uncount_expired();
        out
    }
}
