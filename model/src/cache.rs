//! The core cache refusing when full: every return value, the length, the weighted size, the
//! capacity and the activity counters against a `HashMap` model after every step.

use crate::{ensure, ensure_eq, iterates_as, weight, Outcome};
use arbitrary::Arbitrary;
use runcache::{Cache, Lookup, Source, WhenFull};
use std::collections::HashMap;

/// One operation; keys are taken modulo 32 so that operations meet.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    Insert(u8, u32),
    /// `Cache::put`: an insert that hands nothing back.
    Put(u8, u32),
    Get(u8),
    Pinned(u8),
    Remove(u8),
    /// `Cache::invalidate`: a removal that hands nothing back.
    Invalidate(u8),
    RemoveIf(u8, bool),
    GetOrBuild(u8, u32),
    GetOrCreate(u8, u32),
    FailingBuild(u8),
    Contains(u8),
    Clear,
    SetCapacity(u8),
    /// Keeps the keys whose remainder modulo 3 is not `n % 3`.
    Retain(u8),
    /// Every entry through `Pinned::iter`.
    Iter,
}

/// A cache configuration and the operations to apply.
#[derive(Arbitrary, Clone, Debug)]
pub struct Input {
    pub capacity: u8,
    pub shards: u8,
    pub ops: Vec<Op>,
}

struct Model {
    map: HashMap<u8, u32>,
    capacity: u64,
    /// What `Cache::stats` must say: each call counts once (hits, misses, builds, build
    /// failures, rejections, removals by key; evictions by a shrink are the cache's choice).
    counts: [u64; 6],
}

const HITS: usize = 0;
const MISSES: usize = 1;
const BUILDS: usize = 2;
const FAILURES: usize = 3;
const REJECTIONS: usize = 4;
const REMOVALS: usize = 5;

impl Model {
    fn size(&self) -> u64 {
        self.map.values().map(|v| weight(*v)).sum()
    }

    fn fits(&self, extra: u64) -> bool {
        self.capacity > 0 && self.size() + extra <= self.capacity
    }

    /// Counts a lookup: a hit if `key` is cached, else a miss.
    fn look(&mut self, key: u8) {
        let hit = self.map.contains_key(&key);
        self.counts[if hit { HITS } else { MISSES }] += 1;
    }

    /// Counts a single-flight call for `key` whose builder, on a miss, yields a value that
    /// is cached if it `fits`, or fails (`fits` is `None`).
    fn single_flight(&mut self, key: u8, fits: Option<bool>) {
        self.look(key);
        if !self.map.contains_key(&key) {
            self.counts[BUILDS] += 1;
            match fits {
                Some(true) => {}
                Some(false) => self.counts[REJECTIONS] += 1,
                None => self.counts[FAILURES] += 1,
            }
        }
    }
}

/// Runs `input` (at most 512 operations) against a rejecting cache and the model.
pub fn run(input: Input) -> Outcome {
    let shards = 1usize << (input.shards % 4);
    let mut model = Model {
        map: HashMap::new(),
        capacity: u64::from(input.capacity % 48),
        counts: [0; 6],
    };
    let cache = Cache::<u8, u32>::builder()
        .capacity(model.capacity)
        .shards(shards)
        .when_full(WhenFull::Reject)
        .weigher(|_, v| weight(*v))
        .build()
        .map_err(|e| format!("a power-of-two shard count was refused: {e}"))?;
    for (step, op) in input.ops.into_iter().take(512).enumerate() {
        let at = format!("step {step}: {op:?}");
        let k = |key: u8| key % 32;
        match op {
            Op::Insert(key, v) => {
                let key = k(key);
                let old = model.map.get(&key).copied();
                let extra = match old {
                    Some(o) => weight(v).saturating_sub(weight(o)),
                    None => weight(v),
                };
                let fits = model.fits(extra);
                if !fits {
                    model.counts[REJECTIONS] += 1;
                }
                match cache.insert(key, v) {
                    Ok(prev) => {
                        ensure!(fits, "{at}: should have been refused");
                        ensure_eq!(prev.as_deref().copied(), old, "{at}: replaced value");
                        model.map.insert(key, v);
                    }
                    Err(e) => {
                        ensure!(!fits, "{at}: refused: {e}");
                        ensure_eq!(e.into_inner(), (key, v), "{at}: handed back");
                    }
                }
            }
            Op::Put(key, v) => {
                let key = k(key);
                let extra = match model.map.get(&key) {
                    Some(&o) => weight(v).saturating_sub(weight(o)),
                    None => weight(v),
                };
                let fits = model.fits(extra);
                if !fits {
                    model.counts[REJECTIONS] += 1;
                }
                match cache.put(key, v) {
                    Ok(()) => {
                        ensure!(fits, "{at}: should have been refused");
                        model.map.insert(key, v);
                    }
                    Err(e) => {
                        ensure!(!fits, "{at}: refused: {e}");
                        ensure_eq!(e.into_inner(), (key, v), "{at}: handed back");
                    }
                }
            }
            Op::Get(key) => {
                model.look(k(key));
                ensure_eq!(
                    cache.get(&k(key)).map(|v| *v),
                    model.map.get(&k(key)).copied(),
                    "{at}"
                );
            }
            Op::Pinned(key) => {
                model.look(k(key));
                let pinned = cache.pin();
                ensure_eq!(pinned.get(&k(key)), model.map.get(&k(key)), "{at}");
            }
            Op::Contains(key) => {
                // A peek: no hit or miss counted.
                ensure_eq!(
                    cache.contains_key(&k(key)),
                    model.map.contains_key(&k(key)),
                    "{at}"
                );
            }
            Op::Remove(key) => {
                let expected = model.map.remove(&k(key));
                model.counts[REMOVALS] += u64::from(expected.is_some());
                ensure_eq!(cache.remove(&k(key)).map(|v| *v), expected, "{at}");
            }
            Op::Invalidate(key) => {
                let expected = model.map.remove(&k(key)).is_some();
                model.counts[REMOVALS] += u64::from(expected);
                ensure_eq!(cache.invalidate(&k(key)), expected, "{at}");
            }
            Op::RemoveIf(key, yes) => {
                let key = k(key);
                let removed = cache.remove_if(&key, |_| yes).map(|v| *v);
                let expected = if yes { model.map.remove(&key) } else { None };
                model.counts[REMOVALS] += u64::from(expected.is_some());
                ensure_eq!(removed, expected, "{at}");
            }
            Op::GetOrBuild(key, v) => {
                let key = k(key);
                model.single_flight(key, Some(model.fits(weight(v))));
                let f = cache
                    .get_or_build(key, |_| Ok::<_, ()>(v))
                    .map_err(|_| format!("{at}: an infallible build failed"))?;
                match model.map.get(&key) {
                    Some(cur) => ensure_eq!((f.source, *f.value), (Source::Hit, *cur), "{at}"),
                    None => {
                        ensure_eq!(*f.value, v, "{at}: built value");
                        if model.fits(weight(v)) {
                            ensure_eq!(f.source, Source::Cached, "{at}");
                            model.map.insert(key, v);
                        } else {
                            ensure_eq!(f.source, Source::Uncached, "{at}");
                        }
                    }
                }
            }
            Op::GetOrCreate(key, v) => {
                let key = k(key);
                model.single_flight(key, Some(model.fits(weight(v))));
                let (got, how) = cache.get_or_create(&key, |_| v);
                match model.map.get(&key) {
                    Some(cur) => ensure_eq!((*got, how), (*cur, Lookup::Hit), "{at}"),
                    None => {
                        ensure_eq!((*got, how), (v, Lookup::Miss), "{at}");
                        if model.fits(weight(v)) {
                            model.map.insert(key, v);
                        }
                    }
                }
            }
            Op::FailingBuild(key) => {
                let key = k(key);
                model.single_flight(key, None);
                let r = cache.try_get_or_insert_with(key, || Err::<u32, u8>(key));
                match model.map.get(&key) {
                    Some(cur) => ensure_eq!(r.ok().map(|v| *v), Some(*cur), "{at}"),
                    None => ensure_eq!(r.map_err(|e| e.failed().copied()), Err(Some(key)), "{at}"),
                }
            }
            Op::Clear => {
                cache.clear();
                model.map.clear();
            }
            Op::Retain(n) => {
                let drop = n % 3;
                let mut shown = Vec::new();
                let removed = cache.retain(|key, v| {
                    shown.push((*key, *v));
                    key % 3 != drop
                });
                let before = model.map.len();
                let mut expected: Vec<_> = model.map.iter().map(|(k, v)| (*k, *v)).collect();
                model.map.retain(|key, _| key % 3 != drop);
                let gone = before - model.map.len();
                model.counts[REMOVALS] += gone as u64;
                shown.sort_unstable();
                expected.sort_unstable();
                ensure_eq!(shown, expected, "{at}: entries shown to the predicate");
                ensure_eq!(removed, gone, "{at}: removed count");
            }
            Op::Iter => iterates_as(&cache, &model.map, &at)?,
            Op::SetCapacity(c) => {
                let c = u64::from(c % 48);
                cache.set_capacity(c).unwrap();
                model.capacity = c;
                if c == 0 {
                    model.map.clear();
                }
                // Which entries a shrink removes is the cache's choice: every survivor must be
                // unchanged, and the survivors must fit.
                // (`contains_key` is a peek; the `get`s below count as hits.)
                model.map.retain(|key, _| cache.contains_key(key));
                model.counts[HITS] += model.map.len() as u64;
                for (key, v) in &model.map {
                    ensure_eq!(cache.get(key).map(|x| *x), Some(*v), "{at}: survivor");
                }
                ensure!(model.size() <= c, "{at}: survivors weigh {}", model.size());
            }
        }
        ensure_eq!(cache.len(), model.map.len(), "{at}: len");
        ensure_eq!(cache.weighted_size(), model.size(), "{at}: weighted size");
        ensure_eq!(cache.capacity(), model.capacity, "{at}: capacity");
        let st = cache.stats();
        ensure_eq!(
            [
                st.hits,
                st.misses,
                st.builds,
                st.build_failures,
                st.rejections,
                st.removals
            ],
            model.counts,
            "{at}: stats (hits, misses, builds, build failures, rejections, removals)"
        );
        cache.__validate().map_err(|e| format!("{at}: {e}"))?;
    }
    Ok(())
}
