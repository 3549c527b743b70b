//! The async single-flight path: the same steps as the blocking one, with a task's waits
//! registered on the node's list of waiting tasks (`waiters.rs`) instead of parking a thread.
//!
//! - A miss links a `LOADING` node marked as built by a task (token 0: a task may move
//!   between threads, so the blocking path's same-thread check cannot name it) and polls the
//!   build future inside an [`Attempt`](super::Attempt) guard: if the future is dropped
//!   before it finishes, the guard ends the attempt `DEAD` with no outcome, and the waiters
//!   (tasks and threads) wake and one of them takes the build over, as when a blocking
//!   builder unwinds.
//! - Recursion: while a build future is polled, its node is on this thread's chain of
//!   [`Frame`]s, so a lookup of the same key made from inside that poll (the future awaiting
//!   its own key) finds it, and gets [`Recursion`] instead of waiting for itself forever.
//!   A task waiting on a build that a blocking builder runs further up this thread's stack
//!   is caught by the builder's token.
//! - No guard is held across an await, and nothing of the thread's (its statistics block,
//!   its token) is kept from one poll to the next: the task may resume on another thread.

#![allow(unsafe_code)]

use super::super::epoch;
use super::super::node::{Node, NodeRef};
use super::super::slot::LOADING;
use super::super::table::Shard;
use super::super::{RawCache, Served};
use super::{Flight, Recursion, Step};
use crate::sync::yield_now;
use std::cell::Cell;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

impl<K, V, S> RawCache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The async single-flight path: the value for `key`, built by `build` if this task is
    /// the one to build it. `Err` carries the key back when waiting would wait for itself.
    pub(crate) async fn get_or_build_async<E, F>(
        &self,
        key: K,
        build: F,
    ) -> Result<Served<V, E>, Recursion<K>>
    where
        E: Send + Sync + 'static,
        F: Future<Output = Result<V, E>>,
    {
        let hash = self.hash(&key);
        if let Some(value) = self.hit(hash, |k| *k == key) {
            return Ok(Served::Hit(value));
        }
        let served = self.build_or_wait_async(key, hash, build).await;
        self.passing_on(served)
    }

    /// [`get_or_build_async`](Self::get_or_build_async) for the key that `eq` accepts, found
    /// by a `probe` that hashes as that key does; `key` makes the owned key only on a miss
    /// (as [`get_or_build_from`](Self::get_or_build_from)).
    pub(crate) async fn get_or_build_async_from<Q, E, F>(
        &self,
        probe: &Q,
        eq: impl Fn(&K) -> bool,
        key: impl FnOnce() -> K,
        build: F,
    ) -> Result<Served<V, E>, Recursion<K>>
    where
        Q: Hash + ?Sized,
        E: Send + Sync + 'static,
        F: Future<Output = Result<V, E>>,
    {
        let hash = self.hash(probe);
        if let Some(value) = self.hit(hash, eq) {
            return Ok(Served::Hit(value));
        }
        let key = key();
        debug_assert_eq!(self.hash(&key), hash, "`key()` hashes as `probe`");
        let served = self.build_or_wait_async(key, hash, build).await;
        self.passing_on(served)
    }

    /// The async single-flight path after a first look missed: builds the key's entry (with
    /// a `LOADING` node of ours linked) or waits for the build in flight, registered on it.
    async fn build_or_wait_async<E, F>(
        &self,
        key: K,
        hash: u64,
        build: F,
    ) -> Result<Served<V, E>, Recursion<K>>
    where
        E: Send + Sync + 'static,
        F: Future<Output = Result<V, E>>,
    {
        let shard = self.shard(hash);
        let mut flight = Flight::new(key);
        loop {
            // The thread's token is read afresh at each step: the task may have moved.
            match self.flight_step(shard, hash, &mut flight, epoch::thread_token(), 0) {
                Step::Hit(value) => return Ok(Served::Hit(value)),
                Step::Build(node) => return Ok(self.build_async(node, shard, build).await),
                Step::Wait(node) => {
                    let state = Listen {
                        cache: self,
                        node: &node,
                        registered: None,
                    }
                    .await;
                    if let Some(served) = self.after_wait(&node, state) {
                        return Ok(served);
                    }
                }
                Step::Recursion => return Err(Recursion(flight.take_key())),
            }
        }
    }

    /// Polls `build` for our linked `LOADING` node, with the node on this thread's chain of
    /// frames during each poll, and publishes the result. Dropped before it finishes, the
    /// attempt ends `DEAD` (its guard's drop) and a waiter takes the build over.
    async fn build_async<E, F>(
        &self,
        node: NodeRef<K, V>,
        shard: &Shard<K, V>,
        build: F,
    ) -> Served<V, E>
    where
        E: Send + Sync + 'static,
        F: Future<Output = Result<V, E>>,
    {
        let attempt = self.attempt(&node, shard);
        let build = std::pin::pin!(build);
        let result = Building {
            node: NodeRef::as_ptr(&node) as usize,
            build,
        }
        .await;
        self.conclude(attempt, result)
    }
}

/// A task's wait for the end of a build attempt: resolves to the slot's final state.
struct Listen<'a, K, V, S> {
    cache: &'a RawCache<K, V, S>,
    node: &'a Node<K, V>,
    /// The waker registered on the node's list, if any: a poll with a waker that would wake
    /// the same task registers nothing new.
    registered: Option<Waker>,
}

impl<K, V, S> Future for Listen<'_, K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    type Output = u32;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
        let state = self.node.slot.state();
        if state != LOADING {
            return Poll::Ready(state);
        }
        if let Some(w) = &self.registered {
            if w.will_wake(cx.waker()) {
                // Still registered: the list is closed only after the state has left
                // `LOADING`, so this is a poll of the executor's, not the wake.
                return Poll::Pending;
            }
        }
        let pin = self.cache.pin();
        if self.node.listen(cx.waker(), &pin.guard) {
            self.registered = Some(cx.waker().clone());
            return Poll::Pending;
        }
        drop(pin);
        // The cell no longer holds a builder's word: the attempt is over, though its builder
        // may not have ended the state yet. The cell says how it ended, unless the value was
        // published and already removed before the builder ended the state (a few
        // instructions' window, which a removal must hit): then yield, and look again.
        let state = self.node.settled();
        if state != LOADING {
            return Poll::Ready(state);
        }
        yield_now();
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// One link of the chain of build futures being polled on this thread, innermost first: the
/// address of the node being built, and the next frame out (0 at the end).
struct Frame {
    node: usize,
    out: usize,
}

crate::sync::local_key! {
    /// The innermost [`Frame`] of this thread (its address, 0 if none).
    static POLLING: Cell<usize> = Cell::new(0);
}

/// Whether a build future polled on this thread, further up its stack, is building `node`.
pub(super) fn building<K, V>(node: &Node<K, V>) -> bool {
    let node = node as *const Node<K, V> as usize;
    POLLING
        .try_with(|top| {
            let mut f = top.get();
            while f != 0 {
                // SAFETY: a frame is on the stack of `Building::poll`, which unlinks it before
                // returning (or unwinding), so every frame on the chain is alive.
                let frame = unsafe { &*(f as *const Frame) };
                if frame.node == node {
                    return true;
                }
                f = frame.out;
            }
            false
        })
        .unwrap_or(false)
}

/// The build future of `node`, which puts the node on this thread's chain of frames while it
/// polls the future.
struct Building<'f, F> {
    node: usize,
    build: Pin<&'f mut F>,
}

impl<F: Future> Future for Building<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        /// Unlinks the frame, also when the build future's poll unwinds.
        struct Unlink(usize);
        impl Drop for Unlink {
            fn drop(&mut self) {
                let _ = POLLING.try_with(|top| top.set(self.0));
            }
        }
        let out = POLLING.try_with(Cell::get).unwrap_or(0);
        let frame = Frame {
            node: self.node,
            out,
        };
        let linked = POLLING
            .try_with(|top| top.set(&frame as *const Frame as usize))
            .is_ok();
        let _unlink = linked.then_some(Unlink(out));
        self.build.as_mut().poll(cx)
    }
}
