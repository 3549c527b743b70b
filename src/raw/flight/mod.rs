//! Single flight: every `get_or_*` call goes through here, blocking or async. A first look
//! under a pin; on a miss, one caller links a `LOADING` node and runs the builder while the
//! others wait on the node and receive what it published, its uncached value or its error. A
//! thread waits parked on the node's slot word (`slot.rs`); a task registers its waker on the
//! node's list of waiting tasks (`waiters.rs`), and the two can wait on one build. A builder
//! that unwinds, or whose future is dropped, ends its attempt `DEAD` with no outcome, and the
//! waiters wake and one of them takes the build over (I3, I4).
//!
//! The steps between waits are shared ([`RawCache::flight_step`], [`RawCache::after_wait`]);
//! the blocking path is below, the async one in `future.rs`.

#![allow(unsafe_code)]

mod future;

use super::counter::Counter;
use super::epoch;
use super::handle::Handle;
use super::node::{handle_of, hold, Listed, Node, NodeRef, Outcome, View};
use super::slot::{DEAD, READY};
use super::table::Shard;
use super::{RawCache, Served};
use std::any::Any;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// The build in flight is the caller's own: a builder asked for its own key on the thread
/// that runs it, or a build future from inside its poll (or a task, for a key that a
/// blocking builder further up its thread's stack is building). Waiting would wait for
/// itself; the key comes back with it.
#[derive(Debug)]
pub(crate) struct Recursion<K>(pub(crate) K);

impl<K> Recursion<K> {
    /// The panic of a call that has no error to return it by (the infallible blocking
    /// `get_or_*` forms). `#[track_caller]`, so that it names the line of the caller of
    /// the public method that calls it directly.
    #[track_caller]
    pub(crate) fn panic(self) -> ! {
        panic!(
            "runcache: a builder asked the same cache for the same key it is building, on \
             the same thread; this would wait for itself forever (see \
             `Cache::get_or_insert_with`, \"Recursion\")"
        )
    }
}

/// What a single-flight caller does next, as [`RawCache::flight_step`] found the key.
pub(super) enum Step<K, V> {
    /// The value was cached (counted as a hit).
    Hit(Handle<V>),
    /// Our `LOADING` node is linked: build it (a count of it for the builder).
    Build(NodeRef<K, V>),
    /// Someone else builds: wait for the node's attempt to end, then [`RawCache::after_wait`].
    Wait(NodeRef<K, V>),
    /// The build in flight is this caller's own (same thread, or the builder future being
    /// polled on this thread): waiting would wait for itself.
    Recursion,
}

impl<K, V, S> RawCache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The single-flight path shared by every blocking `get_or_*` method; [`Recursion`],
    /// with the key, if the key's build in flight is this thread's own.
    #[inline]
    pub(crate) fn get_or_build<E, F>(&self, key: K, build: F) -> Result<Served<V, E>, Recursion<K>>
    where
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let hash = self.hash(&key);
        match self.hit(hash, |k| *k == key) {
            Some(value) => Ok(Served::Hit(value)),
            None => {
                let served = self.build_or_wait(key, hash, build);
                self.passing_on(served)
            }
        }
    }

    /// The single-flight path for a key found by `probe` and `eq` (as in
    /// [`get_eq`](Self::get_eq)), made by `key` only on a miss: a hit clones no key. `key()`
    /// must hash as `probe` does and be the key `eq` accepts.
    #[inline]
    pub(crate) fn get_or_build_from<Q, E, F>(
        &self,
        probe: &Q,
        eq: impl Fn(&K) -> bool,
        key: impl FnOnce() -> K,
        build: F,
    ) -> Result<Served<V, E>, Recursion<K>>
    where
        Q: Hash + ?Sized,
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let hash = self.hash(probe);
        if let Some(value) = self.hit(hash, eq) {
            return Ok(Served::Hit(value));
        }
        let key = key();
        debug_assert_eq!(self.hash(&key), hash, "`key()` hashes as `probe`");
        let served = self.build_or_wait(key, hash, build);
        self.passing_on(served)
    }

    /// The first look of the single-flight path: the cached value, as [`lookup`]
    /// finds it, counted as a hit. A miss counts nothing here: [`flight_step`] counts it
    /// as a miss, a wait or, if the value appeared meanwhile, a hit, so each call counts
    /// once.
    ///
    /// [`lookup`]: Self::lookup
    /// [`flight_step`]: Self::flight_step
    #[inline(always)]
    pub(super) fn hit(&self, hash: u64, eq: impl Fn(&K) -> bool) -> Option<Handle<V>> {
        let shard = self.shard(hash);
        let pin = self.pin_for(shard, hash);
        match shard.find_bound(hash, eq, &pin.guard)?.view(&pin.guard) {
            View::Ready { node, value } if self.readable(node, value) => {
                self.touch(node);
                pin.looked_up(true);
                Some(handle_of::<K, V>(value))
            }
            _ => None,
        }
    }

    /// The blocking single-flight path after a first look missed: builds the key's entry
    /// (with a `LOADING` node of ours linked) or parks until the build in flight ends.
    pub(super) fn build_or_wait<E, F>(
        &self,
        key: K,
        hash: u64,
        build: F,
    ) -> Result<Served<V, E>, Recursion<K>>
    where
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let shard = self.shard(hash);
        let token = epoch::thread_token();
        let mut flight = Flight::new(key);
        loop {
            match self.flight_step(shard, hash, &mut flight, token, token) {
                Step::Hit(value) => return Ok(Served::Hit(value)),
                Step::Build(node) => return Ok(self.build_into(node, shard, build)),
                Step::Wait(node) => {
                    let state = node.slot.wait();
                    if let Some(served) = self.after_wait(&node, state) {
                        return Ok(served);
                    }
                }
                Step::Recursion => return Err(Recursion(flight.take_key())),
            }
        }
    }

    /// One look at the key's entry for a single-flight caller whose first look missed:
    /// returns the value if it is there now, links `flight`'s `LOADING` node if the key is
    /// missing (made once, marked as built by `owner`, and kept for retries), or the node to
    /// wait on. A node being built by `token` (this thread) or by a builder future being
    /// polled on this thread is [`Step::Recursion`].
    pub(super) fn flight_step(
        &self,
        shard: &Shard<K, V>,
        hash: u64,
        flight: &mut Flight<K, V>,
        token: u64,
        owner: u64,
    ) -> Step<K, V> {
        loop {
            let pin = self.pin_for(shard, hash);
            let Flight { key, mine, counted } = flight;
            let eq = |k: &K| match (&*key, &*mine) {
                (Some(q), _) => k == q,
                (None, Some(n)) => k == n.key(),
                (None, None) => unreachable!("the key is either held or moved into our node"),
            };
            // A disabled cache (capacity 0) links its builds too: they are refused at
            // publication and handed to their waiters uncached, so concurrent callers of a
            // key still share one build.
            let node = match shard.find(hash, eq, &pin.guard) {
                Some(n) => n,
                None => {
                    let pos = shard.locate(hash, eq, &pin.guard);
                    match pos.found {
                        Some(n) => n,
                        None => {
                            let node = mine.get_or_insert_with(|| {
                                let k = key.take().expect("key present until moved into a node");
                                Node::create(hash, k, None, owner)
                            });
                            if !shard.link(&pos, NodeRef::as_ptr(node), &pin.guard) {
                                continue;
                            }
                            // The table took the count we made the node with (I1).
                            let node = NodeRef::into_raw(mine.take().expect("linked just now"));
                            // SAFETY: (I1) the table's count keeps the node alive while we
                            // take one for the builder.
                            return Step::Build(hold(unsafe { &*node }));
                        }
                    }
                }
            };
            match node.view(&pin.guard) {
                View::Ready {
                    node: holder,
                    value,
                } if self.readable(holder, value) => {
                    self.touch(holder);
                    let value = handle_of::<K, V>(value);
                    pin.stats.bump(Counter::Hit);
                    return Step::Hit(value);
                }
                View::Ready { node: holder, .. } => {
                    // Past its deadline: taken out, and the key built anew.
                    self.take_expired(holder, shard, &pin);
                    continue;
                }
                View::Dead => continue,
                View::Loading => {
                    let builder = node.builder(&pin.guard);
                    if (builder == token && token != 0) || future::building(node) {
                        return Step::Recursion;
                    }
                    if !*counted {
                        pin.stats.bump(Counter::Wait);
                        *counted = true;
                    }
                    return Step::Wait(hold(node));
                }
            }
        }
    }

    /// What a caller that waited on `held` gets, now that its attempt ended in `state`: the
    /// value it published, its uncached value or its error; `None` when the caller must look
    /// again (the builder unwound, or failed with an error of another type, or the attempt
    /// is only about to end).
    pub(super) fn after_wait<E>(&self, held: &Node<K, V>, state: u32) -> Option<Served<V, E>>
    where
        E: Send + Sync + 'static,
    {
        let pin = self.pin();
        if state == READY {
            if let View::Ready { value, .. } = held.view(&pin.guard) {
                return Some(Served::Shared(handle_of::<K, V>(value)));
            }
        } else if state == DEAD {
            match held.outcome() {
                Some(Outcome::Uncached(v)) => return Some(Served::Shared(v.clone())),
                Some(Outcome::Failed(e)) => {
                    // Another error type: this caller builds for itself.
                    return Arc::clone(e).downcast::<E>().ok().map(Served::Failed);
                }
                // The builder unwound or was dropped: take the build over.
                None => {}
            }
        }
        None
    }

    /// Runs the builder for our linked `LOADING` node and publishes the result.
    pub(super) fn build_into<E, F>(
        &self,
        node: NodeRef<K, V>,
        shard: &Shard<K, V>,
        build: F,
    ) -> Served<V, E>
    where
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        // Ends the attempt as DEAD if the builder, the weigher or the expiry policy unwinds.
        let attempt = self.attempt(&node, shard);
        let result = build(node.key());
        self.conclude(attempt, result)
    }

    /// Counts a build starting on `node`, and guards it: the attempt ends `DEAD`, with no
    /// outcome, if the guard drops before [`conclude`](Self::conclude) takes it.
    pub(super) fn attempt<'a>(
        &'a self,
        node: &'a Node<K, V>,
        shard: &'a Shard<K, V>,
    ) -> Attempt<'a, K, V, S> {
        let stats = self.pin().stats;
        stats.bump(Counter::Miss);
        stats.bump(Counter::Build);
        Attempt {
            cache: self,
            node,
            shard,
            done: false,
        }
    }

    /// Ends a build attempt with the builder's result: publishes the value if its weight
    /// fits, else hands it back uncached to this caller and the waiters; shares an error.
    pub(super) fn conclude<E>(
        &self,
        mut attempt: Attempt<'_, K, V, S>,
        result: Result<V, E>,
    ) -> Served<V, E>
    where
        E: Send + Sync + 'static,
    {
        let (node, shard) = (attempt.node, attempt.shard);
        let stats = self.pin().stats;
        let (served, listed) = match result {
            Ok(v) => {
                let weight = self.weigh(node.key(), &v);
                let deadline = self.deadline_of_new(node.key(), &v);
                let room = self.reserve(weight, Some(node.hash), stats);
                if room.made() {
                    // Counted before a remover can uncount it, in this thread's own block.
                    stats.bump(Counter::Live);
                    // Before the publication, which orders it as it does the weight.
                    node.set_deadline(deadline);
                    let (value, listed) = node.publish(v, weight);
                    node.slot.finish(READY);
                    self.close(listed);
                    self.admit(node, room);
                    if self.expires() {
                        // Pinned only now: a reservation that waits for room must not
                        // hold back the epoch that gives evicted weight back.
                        self.scheduled(node, &self.pin().guard);
                    }
                    attempt.done = true;
                    return Served::Built {
                        value,
                        cached: true,
                    };
                }
                stats.bump(Counter::Rejection);
                let value = Handle::new(v);
                let listed = node.set_outcome(Outcome::Uncached(value.clone()));
                let served = Served::Built {
                    value,
                    cached: false,
                };
                (served, listed)
            }
            Err(e) => {
                stats.bump(Counter::BuildFailure);
                let e = Arc::new(e);
                let any: Arc<dyn Any + Send + Sync> = e.clone();
                let listed = node.set_outcome(Outcome::Failed(any));
                (Served::Failed(e), listed)
            }
        };
        attempt.done = true;
        self.abandon(node, shard, Some(listed));
        served
    }

    /// Ends a `LOADING` attempt without a cached value: wakes the waiters, unlinks the node.
    /// `listed` is what the attempt's terminal swap took from the cell, if it made one (an
    /// outcome was recorded); else the builder's word is cleared here, after the slot ends.
    pub(super) fn abandon(
        &self,
        node: &Node<K, V>,
        shard: &Shard<K, V>,
        listed: Option<Option<Listed>>,
    ) {
        node.slot.finish(DEAD);
        let listed = listed.unwrap_or_else(|| node.clear_builder());
        self.close(listed);
        let pin = self.pin();
        shard.unlink(node, &pin.guard);
        // The node may hold an uncached value for its waiters: push it towards reclamation
        // now, as `take` explains.
        self.domain.pending().hand_over(&pin.guard);
    }

    /// Wakes the tasks on a list an attempt's terminal swap took from its cell (after the
    /// slot's state was ended), and retires the list (L2).
    fn close(&self, listed: Option<Listed>) {
        let Some(listed) = listed else { return };
        listed.waiters().close();
        let pin = self.pin();
        // SAFETY: (L2) the list left the cell before it closed; tasks that read it under a
        // guard are pinned now, and the collector frees it after they unpin (E1).
        unsafe {
            self.domain
                .pending()
                .defer(&pin.guard, move || listed.free())
        };
    }
}

/// A single-flight caller's key, and the `LOADING` node it made for it (once, kept for
/// retries), and whether its wait was counted.
pub(super) struct Flight<K, V> {
    key: Option<K>,
    /// Our node, never shared until it is linked.
    mine: Option<NodeRef<K, V>>,
    counted: bool,
}

impl<K, V> Flight<K, V> {
    pub(super) fn new(key: K) -> Self {
        Self {
            key: Some(key),
            mine: None,
            counted: false,
        }
    }

    /// The key back, from the caller's hand or from its node (never linked: a caller that
    /// links its node builds).
    pub(super) fn take_key(&mut self) -> K {
        match (self.key.take(), self.mine.take()) {
            (Some(k), _) => k,
            (None, Some(n)) => Node::into_parts(n).0,
            (None, None) => unreachable!("the key is either held or moved into our node"),
        }
    }
}

/// Drop guard of a build attempt: if the builder or weigher unwinds, or the builder future
/// is dropped, the slot turns `DEAD` with no outcome, the waiters wake and one of them takes
/// the build over.
pub(super) struct Attempt<'a, K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    cache: &'a RawCache<K, V, S>,
    node: &'a Node<K, V>,
    shard: &'a Shard<K, V>,
    done: bool,
}

impl<K, V, S> Drop for Attempt<'_, K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    fn drop(&mut self) {
        if !self.done {
            self.cache.abandon(self.node, self.shard, None);
        }
    }
}
