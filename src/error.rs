//! The facade's typed errors: a builder setting that cannot be built and an insert that does
//! not fit. Each layer keeps its own errors in its folder (`constant::AllocError`,
//! `pool::PoolError`, `vulkan::VulkanError`); the crate root re-exports them all. Every error
//! says what was wrong and with which value, and every method that fails hands the caller's
//! input back.

#![forbid(unsafe_code)]

use std::fmt;

/// A [`CacheBuilder`](crate::CacheBuilder) setting that cannot be built.
///
/// ```
/// use runcache::{Cache, ConfigError};
///
/// let err = Cache::<u32, u32>::builder().shards(6).build().unwrap_err();
/// assert_eq!(err, ConfigError::Shards { requested: 6 });
/// assert_eq!(
///     err.to_string(),
///     "invalid shard count 6: it must be a power of two from 1 to 65536"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The shard count must be a power of two between 1 and [`MAX_SHARDS`](crate::MAX_SHARDS).
    Shards {
        /// The shard count that was asked for.
        requested: usize,
    },
    /// The expected entry weight must be at least 1: it divides the capacity into the number
    /// of entries the table is presized for.
    EntryWeight {
        /// The weight that was given.
        given: u64,
    },
    /// A cache takes one expiry rule: `time_to_live`, `time_to_idle` or `expire_after`. An
    /// [`Expiry`](crate::Expiry) policy can combine a time to live with a time to idle
    /// (each entry's deadline is one word, and a read cannot tell how long the entry has
    /// lived).
    Expiry {
        /// The builder method given first.
        first: &'static str,
        /// The one given after it.
        second: &'static str,
    },
    /// The eviction policy's tuning values are out of range or out of order
    /// ([`CacheBuilder::tuning`](crate::CacheBuilder::tuning)).
    #[cfg(feature = "tuning")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tuning")))]
    Tuning(crate::policy::TuningError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Shards { requested } => write!(
                f,
                "invalid shard count {requested}: it must be a power of two from 1 to {}",
                crate::raw::MAX_SHARDS
            ),
            ConfigError::EntryWeight { given } => write!(
                f,
                "invalid expected entry weight {given}: it must be at least 1"
            ),
            ConfigError::Expiry { first, second } => write!(
                f,
                "two expiry rules, `{first}` and `{second}`: a cache takes one (an `Expiry` \
                 policy can combine a time to live with a time to idle)"
            ),
            #[cfg(feature = "tuning")]
            ConfigError::Tuning(e) => write!(f, "invalid {e}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// An [`insert`](crate::Cache::insert) that was refused because the entry does not fit, or
/// because the eviction policy turned it away ([`turned_away`](Self::turned_away)); the key
/// and the value are handed back.
///
/// ```
/// use runcache::{Cache, WhenFull};
///
/// let cache = Cache::<&str, Vec<u8>>::builder()
///     .capacity(8)
///     .weigher(|_, v| v.len() as u64)
///     .when_full(WhenFull::Reject)
///     .build()?;
/// let err = cache.insert("too big", vec![0; 9]).unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "entry of weight 9 not inserted: it does not fit in the free part of capacity 8"
/// );
/// let (key, value) = err.into_inner(); // nothing is lost
/// assert_eq!((key, value.len()), ("too big", 9));
/// # Ok::<(), runcache::ConfigError>(())
/// ```
#[non_exhaustive]
pub struct InsertError<K, V> {
    /// The key that was not inserted.
    pub key: K,
    /// The value that was not inserted.
    pub value: V,
    /// The entry's weight, as the weigher computed it.
    pub weight: u64,
    /// The cache's capacity when the insert was refused.
    pub capacity: u64,
    /// Whether the eviction policy turned the entry away though it would fit: a newcomer
    /// heavier than the room the policy keeps for new entries is admitted only if it is
    /// asked for more often than the entries it would displace, together (see
    /// [`WhenFull::Evict`](crate::WhenFull::Evict)). `false` when it does not fit at all.
    pub turned_away: bool,
    /// Whether it came with a time to live
    /// ([`Cache::insert_expiring`](crate::Cache::insert_expiring)) to a cache built without
    /// an expiry rule, which could not take it out at its deadline. Nothing else was judged.
    pub no_expiry: bool,
}

impl<K, V> InsertError<K, V> {
    /// The key and value that were not inserted.
    ///
    /// ```
    /// let cache = runcache::Cache::new(0); // disabled: refuses everything
    /// let err = cache.insert(1, "one").unwrap_err();
    /// assert_eq!(err.into_inner(), (1, "one"));
    /// ```
    pub fn into_inner(self) -> (K, V) {
        (self.key, self.value)
    }
}

impl<K, V> fmt::Debug for InsertError<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InsertError")
            .field("weight", &self.weight)
            .field("capacity", &self.capacity)
            .field("turned_away", &self.turned_away)
            .field("no_expiry", &self.no_expiry)
            .finish_non_exhaustive()
    }
}

impl<K, V> fmt::Display for InsertError<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.no_expiry {
            write!(
                f,
                "entry of weight {} not inserted: it has a time to live, and the cache was \
                 built without an expiry rule (time_to_live, time_to_idle or expire_after) \
                 to take it out by",
                self.weight
            )
        } else if self.capacity == 0 {
            write!(
                f,
                "entry of weight {} not inserted: the cache is disabled (capacity 0)",
                self.weight
            )
        } else if self.turned_away {
            write!(
                f,
                "entry of weight {} not inserted: the eviction policy turned it away, as the \
                 entries it would displace from capacity {} are asked for more often",
                self.weight, self.capacity
            )
        } else {
            write!(
                f,
                "entry of weight {} not inserted: it does not fit in the free part of capacity {}",
                self.weight, self.capacity
            )
        }
    }
}

impl<K, V> std::error::Error for InsertError<K, V> {}

/// A shrink ([`set_capacity`](crate::Cache::set_capacity) and the like) that could not
/// free enough weight to reach its capacity: what holds the rest could not be evicted (weight
/// reserved by entries still being published, which did not land while the shrink waited).
/// The capacity stays where the shrink got to, never below the weighted size; calling again
/// finishes the shrink once that weight can be evicted.
///
/// ```
/// let cache = runcache::Cache::<u32, u32>::new(8);
/// match cache.set_capacity(2) {
///     Ok(()) => assert_eq!(cache.capacity(), 2),
///     // Says, for instance, "capacity not lowered to 2: 1 of the weight could not be freed
///     // (entries still being published hold it), so the capacity stays at 3".
///     Err(e) => assert!(e.capacity > e.requested && cache.capacity() == e.capacity),
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CapacityError {
    /// The capacity the shrink was to reach (the latest asked for, if several calls raced).
    pub requested: u64,
    /// The capacity in force when the shrink gave up.
    pub capacity: u64,
}

impl CapacityError {
    /// From the engine's `(target, capacity)`.
    pub(crate) fn from_parts((requested, capacity): (u64, u64)) -> Self {
        Self {
            requested,
            capacity,
        }
    }
}

impl fmt::Display for CapacityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "capacity not lowered to {}: {} of the weight could not be freed (entries still \
             being published hold it), so the capacity stays at {}",
            self.requested,
            self.capacity.saturating_sub(self.requested),
            self.capacity
        )
    }
}

impl std::error::Error for CapacityError {}

/// An async single-flight call that would have waited for itself: a build future asked the
/// cache for the very key it is building, from inside its own poll (or a task asked for a key
/// that a blocking builder further up its thread's stack is building). The key is handed
/// back; nothing was built or cached by this call.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let cache = runcache::Cache::<u32, u32>::new(10);
/// let outer = cache
///     .get_or_insert_with_async(1, async {
///         // The build asks for its own key: waiting would wait for itself.
///         let inner = cache.get_or_insert_with_async(1, async { 0 }).await;
///         assert_eq!(inner.unwrap_err().into_key(), 1);
///         7
///     })
///     .await;
/// assert_eq!(*outer.unwrap(), 7);
/// # });
/// ```
#[non_exhaustive]
pub struct RecursionError<K> {
    /// The key that was asked for.
    pub key: K,
}

impl<K> RecursionError<K> {
    /// The key that was asked for.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let cache = runcache::Cache::<String, u32>::new(10);
    /// let key = String::from("self");
    /// let inner = cache
    ///     .get_or_insert_with_async(key.clone(), async {
    ///         let err = cache.get_or_insert_with_async(key.clone(), async { 0 }).await.unwrap_err();
    ///         err.into_key().len() as u32
    ///     })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(*inner, 4);
    /// # });
    /// ```
    pub fn into_key(self) -> K {
        self.key
    }
}

impl<K> fmt::Debug for RecursionError<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecursionError")
            .field("key", &std::any::type_name::<K>())
            .finish_non_exhaustive()
    }
}

impl<K> fmt::Display for RecursionError<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a build asked the cache for the key ({}) it is building, from inside its own \
             poll or call: waiting would wait for itself forever",
            std::any::type_name::<K>()
        )
    }
}

impl<K> std::error::Error for RecursionError<K> {}

/// Why a single-flight call with a fallible build has no value: the blocking
/// [`try_get_or_insert_with`](crate::Cache::try_get_or_insert_with) and
/// [`get_or_build`](crate::Cache::get_or_build), and their async forms.
///
/// ```
/// use runcache::BuildError;
///
/// let cache = runcache::Cache::<u32, u32>::new(10);
/// let err = cache.try_get_or_insert_with(1, || Err("offline")).unwrap_err();
/// assert!(matches!(err, BuildError::Failed(ref e) if **e == "offline"));
/// assert_eq!(err.to_string(), "the build failed: offline");
///
/// // A build that asks for its own key gets the key back instead of waiting for itself.
/// let outer = cache.try_get_or_insert_with(2, || {
///     let inner = cache.try_get_or_insert_with(2, || Ok::<_, &str>(0));
///     Err(inner.unwrap_err())
/// });
/// let inner = outer.unwrap_err().failed().map(|e| matches!(e, BuildError::Recursion(_)));
/// assert_eq!(inner, Some(true));
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let err = cache.try_get_or_insert_with_async(1, async { Err("offline") }).await.unwrap_err();
/// assert_eq!(err.failed(), Some(&"offline"));
/// # });
/// ```
#[non_exhaustive]
pub enum BuildError<K, E> {
    /// The build returned this error: this caller's, or the one of the attempt it waited on
    /// (shared by every caller of that attempt). Nothing was cached.
    Failed(std::sync::Arc<E>),
    /// The call would have waited for itself (see [`RecursionError`]).
    Recursion(RecursionError<K>),
}

impl<K, E> BuildError<K, E> {
    /// The build's error, if the build failed; `None` for a recursion.
    ///
    /// ```
    /// let cache = runcache::Cache::<u32, u32>::new(10);
    /// let err = cache.try_get_or_insert_with(1, || Err("no compiler")).unwrap_err();
    /// assert_eq!(err.failed(), Some(&"no compiler"));
    /// ```
    pub fn failed(&self) -> Option<&E> {
        match self {
            BuildError::Failed(e) => Some(e),
            BuildError::Recursion(_) => None,
        }
    }
}

impl<K> BuildError<K, std::convert::Infallible> {
    /// The recursion error of a build that cannot fail (the only error it can have).
    pub(crate) fn into_recursion(self) -> RecursionError<K> {
        match self {
            BuildError::Recursion(r) => r,
            BuildError::Failed(e) => match *e {},
        }
    }
}

impl<K, E: fmt::Debug> fmt::Debug for BuildError<K, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Failed(e) => f.debug_tuple("Failed").field(e).finish(),
            BuildError::Recursion(r) => f.debug_tuple("Recursion").field(r).finish(),
        }
    }
}

impl<K, E: fmt::Display> fmt::Display for BuildError<K, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Failed(e) => write!(f, "the build failed: {e}"),
            BuildError::Recursion(r) => r.fmt(f),
        }
    }
}

impl<K, E: std::error::Error + 'static> std::error::Error for BuildError<K, E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Failed(e) => Some(&**e),
            BuildError::Recursion(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CapacityError;

    #[test]
    fn a_shrink_that_stopped_short_says_where_and_by_how_much() {
        let err = CapacityError::from_parts((10, 16));
        assert_eq!((err.requested, err.capacity), (10, 16));
        assert_eq!(
            err.to_string(),
            "capacity not lowered to 10: 6 of the weight could not be freed (entries still \
             being published hold it), so the capacity stays at 16"
        );
    }
}
