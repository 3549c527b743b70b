//! The async single-flight methods of [`Cache`]: the `get_or_*` family for tasks, which wait
//! for a build in flight by registering their waker instead of parking their thread.

#![forbid(unsafe_code)]

use super::{fetched, Cache, Fetched};
use crate::error::{BuildError, RecursionError};
use crate::raw::Handle;
use std::convert::Infallible;
use std::future::Future;
use std::hash::{BuildHasher, Hash};

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The cached value for `key`, or the one `build` resolves to, inserted: the async form
    /// of [`get_or_insert_with`](Self::get_or_insert_with), for tasks on any executor.
    ///
    /// # Single flight
    /// `build` is polled by at most one caller per key at a time, and only on a miss (a hit
    /// drops it unpolled). Tasks that ask for a key being built register their waker on the
    /// entry (no thread is blocked, no lock is taken) and receive the same value when it is
    /// ready; blocking and async callers may wait on one build, whichever of them builds it.
    /// A value that cannot be cached (see [`insert`](Self::insert) for when) is still
    /// returned, to this caller and to those waiting, but not cached.
    ///
    /// # Cancellation
    /// Dropping the future of the caller that is building ends its attempt: the entry is
    /// released, the waiters wake, and one of them polls its own `build` instead. Dropping a
    /// waiting caller's future leaves nothing behind but a registration that the build's end
    /// frees. A `build` that panics is handled the same way, the panic reaching its caller.
    ///
    /// The returned future is `Send` when `K`, `V`, `S` and `build` are.
    ///
    /// # Errors
    /// [`RecursionError`], with the key, if `build` asks this cache for the same key from
    /// inside its own poll (or a task asks for a key that a blocking builder further up its
    /// thread's stack is building): waiting would wait for itself. Nothing is built or cached
    /// by that call. (A build that hands the same request to another task and waits for it is
    /// not detected.)
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let cache = runcache::Cache::new(100);
    /// let kernel = cache
    ///     .get_or_insert_with_async("gemm", async { "compiled gemm".to_string() })
    ///     .await
    ///     .expect("the build does not ask for its own key");
    /// assert_eq!(*kernel, "compiled gemm");
    /// // A hit drops the build future unpolled.
    /// let again = cache.get_or_insert_with_async("gemm", async { unreachable!() }).await.unwrap();
    /// assert!(runcache::Handle::ptr_eq(&kernel, &again));
    /// # });
    /// ```
    pub async fn get_or_insert_with_async<F>(
        &self,
        key: K,
        build: F,
    ) -> Result<Handle<V>, RecursionError<K>>
    where
        F: Future<Output = V>,
    {
        self.get_or_build_async::<Infallible, _>(key, async { Ok(build.await) })
            .await
            .map(|f| f.value)
            .map_err(BuildError::into_recursion)
    }

    /// Like [`get_or_insert_with_async`](Self::get_or_insert_with_async), for a build that
    /// can fail.
    ///
    /// # Errors
    /// [`BuildError::Failed`]: the build's error, shared by this caller and every caller
    /// that waited on that attempt; nothing is cached, and the next call builds again. (A
    /// waiter whose own error type differs from the failed builder's polls its own build
    /// instead.) [`BuildError::Recursion`]: as for
    /// [`get_or_insert_with_async`](Self::get_or_insert_with_async).
    ///
    /// ```
    /// use runcache::BuildError;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let cache = runcache::Cache::<&str, u32>::new(100);
    /// let failed = cache.try_get_or_insert_with_async("plan", async { Err("timeout") }).await;
    /// match failed {
    ///     Err(BuildError::Failed(e)) => assert_eq!(*e, "timeout"),
    ///     _ => panic!("the build's error comes back"),
    /// }
    /// assert!(!cache.contains_key("plan"), "nothing was cached");
    /// let built = cache.try_get_or_insert_with_async("plan", async { Ok::<_, &str>(3) }).await;
    /// assert_eq!(*built.unwrap(), 3);
    /// # });
    /// ```
    pub async fn try_get_or_insert_with_async<E, F>(
        &self,
        key: K,
        build: F,
    ) -> Result<Handle<V>, BuildError<K, E>>
    where
        E: Send + Sync + 'static,
        F: Future<Output = Result<V, E>>,
    {
        self.get_or_build_async(key, build).await.map(|f| f.value)
    }

    /// The async single-flight lookup with every detail: the result says whether the value
    /// was a hit, shared, cached or built uncached (as [`get_or_build`](Self::get_or_build)).
    ///
    /// # Errors
    /// As [`try_get_or_insert_with_async`](Self::try_get_or_insert_with_async).
    ///
    /// ```
    /// use runcache::Source;
    /// use std::convert::Infallible;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let cache = runcache::Cache::new(100);
    /// let first = cache.get_or_build_async(1, async { Ok::<_, Infallible>("one") }).await.unwrap();
    /// assert_eq!(first.source, Source::Cached);
    /// let second = cache.get_or_build_async(1, async { Ok::<_, Infallible>("uno") }).await.unwrap();
    /// assert_eq!((*second.value, second.source), ("one", Source::Hit));
    /// # });
    /// ```
    pub async fn get_or_build_async<E, F>(
        &self,
        key: K,
        build: F,
    ) -> Result<Fetched<V>, BuildError<K, E>>
    where
        E: Send + Sync + 'static,
        F: Future<Output = Result<V, E>>,
    {
        fetched(self.raw.get_or_build_async(key, build).await)
    }

    /// [`get_or_build_async`](Self::get_or_build_async) for the key that `eq` accepts, found
    /// by a `probe` that hashes as that key does (see
    /// [`get_or_build_from`](Self::get_or_build_from)); `key` makes the owned key only on a
    /// miss, so a hit clones nothing.
    pub(crate) async fn get_or_build_async_from<Q, E, F>(
        &self,
        probe: &Q,
        eq: impl Fn(&K) -> bool,
        key: impl FnOnce() -> K,
        build: F,
    ) -> Result<Fetched<V>, BuildError<K, E>>
    where
        Q: Hash + ?Sized,
        E: Send + Sync + 'static,
        F: Future<Output = Result<V, E>>,
    {
        fetched(
            self.raw
                .get_or_build_async_from(probe, eq, key, build)
                .await,
        )
    }
}
