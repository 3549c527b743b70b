//! The caches runcache is compared with, each holding `Arc`s and honouring the same capacity
//! as runcache, weighted the same way: moka (its weigher), quick_cache (its weighter), and
//! what a runtime without a cache library writes, a map behind a mutex that evicts its least
//! recently used entries by weight.

use crate::failure::Failure;
use crate::flags::Choice;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// What an entry weighs: 1 for a kernel, its bytes for a weight buffer.
pub type Weigh<V> = fn(&V) -> u64;

/// quick_cache's weighter for a [`Weigh`].
pub struct Weighter<V>(Weigh<V>);

impl<V> Clone for Weighter<V> {
    fn clone(&self) -> Self {
        Weighter(self.0)
    }
}

impl<K, V> quick_cache::Weighter<K, Arc<V>> for Weighter<V> {
    fn weight(&self, _: &K, value: &Arc<V>) -> u64 {
        (self.0)(value)
    }
}

/// A map that keeps at most `capacity` of weight, evicting the least recently used entries
/// (a lookup or a keep is a use). Kept behind one mutex.
pub struct Lru<K, V> {
    /// Value, weight and last-use stamp by key.
    map: HashMap<K, (Arc<V>, u64, u64)>,
    /// Keys by last-use stamp, oldest first.
    order: BTreeMap<u64, K>,
    clock: u64,
    weight: u64,
    capacity: u64,
    weigh: Weigh<V>,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    fn new(capacity: u64, weigh: Weigh<V>) -> Self {
        Lru {
            map: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
            weight: 0,
            capacity,
            weigh,
        }
    }

    /// The value for `key`, marked as used now.
    fn get(&mut self, key: &K) -> Option<Arc<V>> {
        self.clock += 1;
        let (value, _, stamp) = self.map.get_mut(key)?;
        let old = std::mem::replace(stamp, self.clock);
        let value = Arc::clone(value);
        if let Some(k) = self.order.remove(&old) {
            self.order.insert(self.clock, k);
        }
        Some(value)
    }

    /// Keeps `built` for `key` unless another caller's value got there first (it was built
    /// outside the lock); returns the one kept, or `built` uncached when it weighs more than
    /// the capacity. Evicts the least recently used entries until the rest fits.
    fn keep(&mut self, key: K, built: Arc<V>) -> Arc<V> {
        if let Some(found) = self.get(&key) {
            return found;
        }
        let weight = (self.weigh)(&built);
        if weight > self.capacity {
            return built;
        }
        self.clock += 1;
        self.map
            .insert(key.clone(), (Arc::clone(&built), weight, self.clock));
        self.order.insert(self.clock, key);
        self.weight += weight;
        while self.weight > self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, w, _)) = self.map.remove(&oldest) {
                self.weight -= w;
            }
        }
        built
    }
}

/// A peer's cache of `V`s by `K`, holding `Arc`s: what a runtime would use instead of
/// runcache.
pub enum Peer<K, V> {
    Moka(moka::sync::Cache<K, Arc<V>>),
    /// moka's cache for async code (`--async`).
    MokaFuture(moka::future::Cache<K, Arc<V>>),
    QuickCache(quick_cache::sync::Cache<K, Arc<V>, Weighter<V>>),
    /// What a runtime without a cache library writes: a map behind a mutex, each value built
    /// outside the lock (two threads that miss together both build; the first keep wins).
    MutexLru(Mutex<Lru<K, V>>),
    /// Every lookup builds.
    None,
}

/// Locks a mutex-guarded map (a panic elsewhere leaves the map usable).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// moka's weight of an entry: its weigher returns a `u32`.
fn moka_weight(weight: u64) -> u32 {
    u32::try_from(weight).unwrap_or(u32::MAX)
}

impl<K, V> Peer<K, V>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    /// A cache of `choice` that holds at most `capacity` of weight, each entry weighing
    /// `weigh`; `items` is how many entries it is expected to hold.
    pub fn new(
        choice: Choice,
        capacity: u64,
        items: usize,
        weigh: Weigh<V>,
        asynchronous: bool,
    ) -> Self {
        match choice {
            Choice::Moka if asynchronous => Peer::MokaFuture(
                moka::future::Cache::builder()
                    .max_capacity(capacity)
                    .weigher(move |_, v: &Arc<V>| moka_weight(weigh(v)))
                    .build(),
            ),
            Choice::Moka => Peer::Moka(
                moka::sync::Cache::builder()
                    .max_capacity(capacity)
                    .weigher(move |_, v: &Arc<V>| moka_weight(weigh(v)))
                    .build(),
            ),
            Choice::QuickCache => Peer::QuickCache(quick_cache::sync::Cache::with_weighter(
                items.max(1),
                capacity,
                Weighter(weigh),
            )),
            Choice::MutexHashMap => Peer::MutexLru(Mutex::new(Lru::new(capacity, weigh))),
            Choice::Runcache | Choice::None => Peer::None,
        }
    }

    /// The value for `key`, built by `build` on a miss.
    pub fn get_or_build(
        &self,
        key: K,
        build: impl FnOnce() -> Result<V, Failure>,
    ) -> Result<Arc<V>, Failure> {
        let build = || build().map(Arc::new);
        match self {
            Peer::Moka(c) => c.try_get_with(key, build).map_err(|e| (*e).clone()),
            Peer::MokaFuture(_) => Err(Failure::Cache(
                "moka's future cache has no blocking lookup".into(),
            )),
            Peer::QuickCache(c) => c.get_or_insert_with(&key, build),
            Peer::MutexLru(m) => {
                // The lock is held for the look and for the keep only, never across a build.
                let found = lock(m).get(&key);
                match found {
                    Some(found) => Ok(found),
                    None => {
                        let built = build()?;
                        Ok(lock(m).keep(key, built))
                    }
                }
            }
            Peer::None => build(),
        }
    }

    /// The async form of [`get_or_build`](Self::get_or_build): moka's future cache and
    /// quick_cache's async lookup wait for another caller's build without blocking.
    pub async fn get_or_build_async(
        &self,
        key: K,
        build: impl std::future::Future<Output = Result<V, Failure>>,
    ) -> Result<Arc<V>, Failure> {
        let build = async { build.await.map(Arc::new) };
        match self {
            Peer::MokaFuture(c) => c.try_get_with(key, build).await.map_err(|e| (*e).clone()),
            Peer::QuickCache(c) => c.get_or_insert_async(&key, build).await,
            Peer::MutexLru(m) => {
                let found = lock(m).get(&key);
                match found {
                    Some(found) => Ok(found),
                    None => {
                        let built = build.await?;
                        Ok(lock(m).keep(key, built))
                    }
                }
            }
            Peer::None => build.await,
            Peer::Moka(_) => Err(Failure::Cache("moka's blocking cache in async code".into())),
        }
    }

    /// The weight the cache holds now, as its own accounting says (moka's is updated by its
    /// pending maintenance, so it may lag).
    pub fn weight(&self) -> u64 {
        match self {
            Peer::Moka(c) => c.weighted_size(),
            Peer::MokaFuture(c) => c.weighted_size(),
            Peer::QuickCache(c) => c.weight(),
            Peer::MutexLru(m) => lock(m).weight,
            Peer::None => 0,
        }
    }

    /// The sum of `measure` over the values held.
    pub fn sum(&self, measure: impl Fn(&V) -> u64) -> u64 {
        match self {
            Peer::Moka(c) => c.iter().map(|(_, v)| measure(&v)).sum(),
            Peer::MokaFuture(c) => c.iter().map(|(_, v)| measure(&v)).sum(),
            Peer::QuickCache(c) => c.iter().map(|(_, v)| measure(&v)).sum(),
            Peer::MutexLru(m) => lock(m).map.values().map(|(v, _, _)| measure(v)).sum(),
            Peer::None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Lru;
    use std::sync::Arc;

    #[test]
    fn the_mutex_map_evicts_its_least_recently_used_entries_by_weight() {
        let mut lru: Lru<u32, Vec<u8>> = Lru::new(10, |v| v.len() as u64);
        lru.keep(1, Arc::new(vec![0; 4]));
        lru.keep(2, Arc::new(vec![0; 4]));
        assert!(lru.get(&1).is_some(), "1 is now the most recently used");
        lru.keep(3, Arc::new(vec![0; 4]));
        assert!(lru.get(&2).is_none(), "2 was the least recently used");
        assert!(lru.get(&1).is_some() && lru.get(&3).is_some());
        assert_eq!(lru.weight, 8);
        let huge = lru.keep(4, Arc::new(vec![0; 11]));
        assert_eq!(huge.len(), 11, "handed back");
        assert!(lru.get(&4).is_none(), "heavier than the capacity: not kept");
        assert_eq!(lru.weight, 8);
    }

    #[test]
    fn the_first_value_kept_for_a_key_wins() {
        let mut lru: Lru<u32, u32> = Lru::new(10, |_| 1);
        let first = lru.keep(1, Arc::new(1));
        let second = lru.keep(1, Arc::new(2));
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(lru.weight, 1);
    }
}
