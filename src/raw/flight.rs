//! Single flight: every `get_or_*` call goes through here. A first look under a pin; on a
//! miss, one caller links a `LOADING` node and runs the builder while the others park on the
//! node's slot word (`slot.rs`) and receive what it published, its uncached value or its
//! error. A builder that unwinds ends its attempt `DEAD` with no outcome, and one waiter takes
//! the build over (I3, I4).

#![allow(unsafe_code)]

use super::counter::Counter;
use super::epoch;
use super::handle::Handle;
use super::node::{handle_of, hold, Node, Outcome, View};
use super::slot::{DEAD, READY};
use super::table::Shard;
use super::{into_parts, RawCache, Served};
use crate::sync::Ordering;
use std::any::Any;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

impl<K, V, S> RawCache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The single-flight path shared by every `get_or_*` method.
    #[inline]
    pub(crate) fn get_or_build<E, F>(&self, key: K, build: F) -> Served<V, E>
    where
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let hash = self.hash(&key);
        match self.hit(hash, |k| *k == key) {
            Some(value) => Served::Hit(value),
            None => self.build_or_wait(key, hash, build),
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
    ) -> Served<V, E>
    where
        Q: Hash + ?Sized,
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let hash = self.hash(probe);
        if let Some(value) = self.hit(hash, eq) {
            return Served::Hit(value);
        }
        let key = key();
        debug_assert_eq!(self.hash(&key), hash, "`key()` hashes as `probe`");
        self.build_or_wait(key, hash, build)
    }

    /// The first look of the single-flight path: the cached value, as [`lookup`]
    /// finds it, counted as a hit. A miss counts nothing here: [`build_or_wait`] counts it
    /// as a miss, a wait or, if the value appeared meanwhile, a hit, so each call counts
    /// once.
    ///
    /// [`lookup`]: Self::lookup
    /// [`build_or_wait`]: Self::build_or_wait
    #[inline(always)]
    pub(super) fn hit(&self, hash: u64, eq: impl Fn(&K) -> bool) -> Option<Handle<V>> {
        let shard = self.shard(hash);
        let pin = self.pin_for(shard, hash);
        match shard.find_bound(hash, eq, &pin.guard)?.view(&pin.guard) {
            View::Ready { node, value } => {
                self.touch(node);
                pin.looked_up(true);
                Some(handle_of::<K, V>(value))
            }
            _ => None,
        }
    }

    /// The single-flight path after a first look missed: finds the key's entry again, and
    /// builds it (with a `LOADING` node of ours linked) or waits for the build in flight.
    pub(super) fn build_or_wait<E, F>(&self, key: K, hash: u64, build: F) -> Served<V, E>
    where
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let shard = self.shard(hash);
        let token = epoch::thread_token();
        // Our loading node, made once and reused if a link attempt must be retried.
        let mut mine: Option<*const Node<K, V>> = None;
        let mut key = Some(key);
        let mut counted = false;
        loop {
            let pin = self.pin_for(shard, hash);
            let eq = |k: &K| match (&key, mine) {
                (Some(q), _) => k == q,
                // SAFETY: (I1) `mine` is ours (unlinked, or linked with our own count) and alive.
                (None, Some(n)) => k == unsafe { &*n }.key(),
                (None, None) => unreachable!("the key is either held or moved into our node"),
            };
            let existing = match shard.find(hash, eq, &pin.guard) {
                Some(n) => Some(n),
                None if self.budget.capacity() == 0 => None,
                None => {
                    let pos = shard.locate(hash, eq, &pin.guard);
                    match pos.found {
                        Some(n) => Some(n),
                        None => {
                            let node = *mine.get_or_insert_with(|| {
                                let k = key.take().expect("key present until moved into a node");
                                Arc::into_raw(Node::new(hash, k, None, token))
                            });
                            if !shard.link(&pos, node, &pin.guard) {
                                continue;
                            }
                            // SAFETY: (I1) we created `node` with one count, now the table's (I1),
                            // and our guard keeps it alive; take one for ourselves while
                            // building, before the guard goes.
                            unsafe { Arc::increment_strong_count(node) };
                            // SAFETY: (I1) the count just taken keeps it alive.
                            let held = unsafe { Arc::from_raw(node) };
                            drop(pin);
                            return self.build_into(held, shard, build);
                        }
                    }
                }
            };
            match existing {
                None => {
                    // Capacity 0: the cache is off; build and hand the value back uncached.
                    pin.stats.bump(Counter::Miss);
                    let k = match (key.take(), mine.take()) {
                        (Some(k), _) => k,
                        // SAFETY: (I1) an unlinked node of ours; we hold its only count.
                        (None, Some(n)) => unsafe { into_parts(n) }.0,
                        (None, None) => unreachable!(),
                    };
                    pin.stats.bump(Counter::Build);
                    return match build(&k) {
                        Ok(v) => {
                            pin.stats.bump(Counter::Rejection);
                            Served::Built {
                                value: Handle::new(v),
                                cached: false,
                            }
                        }
                        Err(e) => {
                            pin.stats.bump(Counter::BuildFailure);
                            Served::Failed(Arc::new(e))
                        }
                    };
                }
                Some(node) => match node.view(&pin.guard) {
                    View::Ready {
                        node: holder,
                        value,
                    } => {
                        let value = handle_of::<K, V>(value);
                        self.touch(holder);
                        pin.stats.bump(Counter::Hit);
                        // SAFETY: (I1) an unlinked node of ours, never shared.
                        drop(mine.map(|n| unsafe { Arc::from_raw(n) }));
                        return Served::Hit(value);
                    }
                    View::Dead => continue,
                    View::Loading => {
                        if node.builder() == token && token != 0 {
                            drop(pin);
                            // SAFETY: (I1) as above.
                            drop(mine.map(|n| unsafe { Arc::from_raw(n) }));
                            panic!(
                                "runcache: a builder asked the same cache for the same key it \
                                 is building, on the same thread; this would wait for itself \
                                 forever (see `Cache::get_or_insert_with`, \"Recursion\")"
                            );
                        }
                        if !counted {
                            pin.stats.bump(Counter::Wait);
                            counted = true;
                        }
                        let held = hold(node);
                        drop(pin);
                        let state = held.slot.wait();
                        let pin = self.pin();
                        if state == READY {
                            if let View::Ready { value, .. } = held.view(&pin.guard) {
                                // SAFETY: (I1) as above.
                                drop(mine.map(|n| unsafe { Arc::from_raw(n) }));
                                return Served::Shared(handle_of::<K, V>(value));
                            }
                        } else if state == DEAD {
                            match held.outcome() {
                                Some(Outcome::Uncached(v)) => {
                                    // SAFETY: (I1) as above.
                                    drop(mine.map(|n| unsafe { Arc::from_raw(n) }));
                                    return Served::Shared(v.clone());
                                }
                                Some(Outcome::Failed(e)) => {
                                    if let Ok(e) = Arc::clone(e).downcast::<E>() {
                                        // SAFETY: (I1) as above.
                                        drop(mine.map(|n| unsafe { Arc::from_raw(n) }));
                                        return Served::Failed(e);
                                    }
                                    // Another error type: this caller builds for itself.
                                }
                                // The builder panicked: take the build over.
                                None => {}
                            }
                        }
                    }
                },
            }
        }
    }

    /// Runs the builder for our linked `LOADING` node and publishes the result.
    pub(super) fn build_into<E, F>(
        &self,
        node: Arc<Node<K, V>>,
        shard: &Shard<K, V>,
        build: F,
    ) -> Served<V, E>
    where
        E: Send + Sync + 'static,
        F: FnOnce(&K) -> Result<V, E>,
    {
        let stats = self.pin().stats;
        stats.bump(Counter::Miss);
        stats.bump(Counter::Build);
        // Ends the attempt as DEAD if the builder or the weigher unwinds.
        let mut attempt = Attempt {
            cache: self,
            node: &node,
            shard,
            done: false,
        };
        let result = build(node.key());
        let served = match result {
            Ok(v) => {
                let weight = self.weigh(node.key(), &v);
                if self.reserve(weight, stats) {
                    // Relaxed: a size statistic (counted before a remover can uncount it).
                    shard.live.fetch_add(1, Ordering::Relaxed);
                    let value = node.publish(v, weight);
                    node.slot.finish(READY);
                    self.admit(Arc::clone(&node));
                    attempt.done = true;
                    return Served::Built {
                        value,
                        cached: true,
                    };
                }
                stats.bump(Counter::Rejection);
                let value = Handle::new(v);
                node.set_outcome(Outcome::Uncached(value.clone()));
                Served::Built {
                    value,
                    cached: false,
                }
            }
            Err(e) => {
                stats.bump(Counter::BuildFailure);
                let e = Arc::new(e);
                let any: Arc<dyn Any + Send + Sync> = e.clone();
                node.set_outcome(Outcome::Failed(any));
                Served::Failed(e)
            }
        };
        attempt.done = true;
        self.abandon(&node, shard);
        served
    }

    /// Ends a `LOADING` attempt without a cached value: wakes the waiters, unlinks the node.
    pub(super) fn abandon(&self, node: &Node<K, V>, shard: &Shard<K, V>) {
        node.slot.finish(DEAD);
        let pin = self.pin();
        shard.unlink(node, &pin.guard);
        // The node may hold an uncached value for its waiters: push it towards reclamation
        // now, as `take` explains.
        self.domain.pending().hand_over(&pin.guard);
    }
}

/// Drop guard of a build attempt: if the builder or weigher unwinds, the slot turns `DEAD`
/// with no outcome, the waiters wake and one of them takes the build over.
struct Attempt<'a, K, V, S>
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
            self.cache.abandon(self.node, self.shard);
        }
    }
}
