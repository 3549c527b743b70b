//! The core cache evicting when full (the policy target): which entries the policy evicts is
//! its choice, but every value that leaves is reported to the `on_evict` listener with its
//! cause, so the model follows the cache exactly. After every step: the cache holds exactly the
//! model's entries, never weighs more than its capacity, and passes its own invariant check
//! (the policy's queues and totals included).

use crate::{ensure, ensure_eq, iterates_as, weight, Outcome};
use arbitrary::Arbitrary;
use runcache::{Cache, RemovalCause, Source};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One operation; keys are taken modulo 64 so that the cache must evict.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    Insert(u8, u32),
    /// `Cache::put`: an insert that hands nothing back.
    Put(u8, u32),
    Get(u8),
    Pinned(u8),
    GetOrBuild(u8, u32),
    Remove(u8),
    /// `Cache::invalidate`: a removal that hands nothing back.
    Invalidate(u8),
    /// Looks up `len` consecutive keys from a start: a scan, or a hot set hit again.
    Scan(u8, u8),
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

type Events = Arc<Mutex<Vec<(u8, u32, RemovalCause)>>>;

fn size(model: &HashMap<u8, u32>) -> u64 {
    model.values().map(|v| weight(*v)).sum()
}

/// Applies what the listener reported to the model, checking each reported value.
fn follow(events: &Events, model: &mut HashMap<u8, u32>, at: &str) -> Outcome {
    let drained: Vec<_> = std::mem::take(&mut *events.lock().map_err(|e| e.to_string())?);
    for (key, value, cause) in drained {
        let held = model.get(&key).copied();
        ensure_eq!(
            held,
            Some(value),
            "{at}: the listener reported {key} ({cause:?})"
        );
        if cause != RemovalCause::Replaced {
            model.remove(&key);
        }
    }
    Ok(())
}

/// A refused insert: it does not fit at all, or the policy's door turned it away.
fn turned_or_refused<V>(
    e: &runcache::InsertError<u8, V>,
    w: u64,
    capacity: u64,
    before: &HashMap<u8, u32>,
    model: &HashMap<u8, u32>,
    at: &str,
) -> Result<(), String> {
    if e.turned_away {
        return turned_away(e.key, w, capacity, before, model, at);
    }
    ensure!(capacity == 0 || w > capacity, "{at}: refused: {e}");
    Ok(())
}

/// A newcomer `key` that fits the capacity but was turned away at the policy's door (P10):
/// only one that needed room is judged there, and it displaced nothing. (A replacement's
/// room is made in the queues' order, which may evict other entries and then the one it
/// replaces; the new value then comes to the door as a newcomer, and what its first try
/// evicted stays evicted.)
fn turned_away(
    key: u8,
    w: u64,
    capacity: u64,
    before: &HashMap<u8, u32>,
    model: &HashMap<u8, u32>,
    at: &str,
) -> Result<(), String> {
    if before.contains_key(&key) {
        ensure!(
            !model.contains_key(&key) && model.keys().all(|k| before.contains_key(k)),
            "{at}: a replacement turned away: {model:?}, before {before:?}"
        );
        return Ok(());
    }
    ensure!(
        size(before) + w > capacity,
        "{at}: turned away though it fit in the free room"
    );
    ensure_eq!(
        model,
        before,
        "{at}: a newcomer turned away displaced something"
    );
    Ok(())
}

/// Runs `input` (at most 512 operations) against an evicting cache and the model.
pub fn run(input: Input) -> Outcome {
    let mut capacity = u64::from(input.capacity % 48);
    let events: Events = Arc::default();
    let sink = events.clone();
    let cache = Cache::<u8, u32>::builder()
        .capacity(capacity)
        .shards(1 << (input.shards % 3))
        .weigher(|_, v| weight(*v))
        .on_evict(move |k, v, cause| {
            if let Ok(mut e) = sink.lock() {
                e.push((*k, **v, cause));
            }
        })
        .build()
        .map_err(|e| format!("a power-of-two shard count was refused: {e}"))?;
    let mut model: HashMap<u8, u32> = HashMap::new();
    for (step, op) in input.ops.into_iter().take(512).enumerate() {
        let at = format!("step {step}: {op:?}");
        let k = |key: u8| key % 64;
        let before = model.clone();
        match op {
            Op::Insert(key, v) => {
                let key = k(key);
                let result = cache.insert(key, v);
                follow(&events, &mut model, &at)?;
                let w = weight(v);
                match result {
                    Ok(prev) => {
                        ensure!(capacity > 0 && w <= capacity, "{at}: should be refused");
                        // The old value may itself have been evicted to make room.
                        ensure_eq!(prev.as_deref().copied(), model.get(&key).copied(), "{at}");
                        model.insert(key, v);
                    }
                    Err(e) => {
                        turned_or_refused(&e, w, capacity, &before, &model, &at)?;
                        ensure_eq!(e.into_inner(), (key, v), "{at}: handed back");
                    }
                }
            }
            Op::Put(key, v) => {
                let key = k(key);
                let result = cache.put(key, v);
                follow(&events, &mut model, &at)?;
                let w = weight(v);
                match result {
                    Ok(()) => {
                        ensure!(capacity > 0 && w <= capacity, "{at}: should be refused");
                        model.insert(key, v);
                    }
                    Err(e) => {
                        turned_or_refused(&e, w, capacity, &before, &model, &at)?;
                        ensure_eq!(e.into_inner(), (key, v), "{at}: handed back");
                    }
                }
            }
            Op::Get(key) => {
                let got = cache.get(&k(key)).map(|v| *v);
                ensure_eq!(got, model.get(&k(key)).copied(), "{at}");
            }
            Op::Pinned(key) => {
                let pinned = cache.pin();
                ensure_eq!(pinned.get(&k(key)), model.get(&k(key)), "{at}");
            }
            Op::Scan(start, len) => {
                for i in 0..len % 80 {
                    let key = k(start.wrapping_add(i));
                    ensure_eq!(
                        cache.get(&key).map(|v| *v),
                        model.get(&key).copied(),
                        "{at}"
                    );
                }
            }
            Op::GetOrBuild(key, v) => {
                let key = k(key);
                let f = cache
                    .get_or_build(key, |_| Ok::<_, ()>(v))
                    .map_err(|_| format!("{at}: an infallible build failed"))?;
                follow(&events, &mut model, &at)?;
                match before.get(&key) {
                    Some(cur) => ensure_eq!((f.source, *f.value), (Source::Hit, *cur), "{at}"),
                    None => {
                        ensure_eq!(*f.value, v, "{at}: built value");
                        let w = weight(v);
                        let fits = capacity > 0 && w <= capacity;
                        if fits && f.source == Source::Uncached {
                            // The policy's door turned it away (P10).
                            turned_away(key, w, capacity, &before, &model, &at)?;
                        } else {
                            let expected = if fits {
                                Source::Cached
                            } else {
                                Source::Uncached
                            };
                            ensure_eq!(f.source, expected, "{at}");
                        }
                        if f.source == Source::Cached {
                            model.insert(key, v);
                        }
                    }
                }
            }
            Op::Remove(key) => {
                let removed = cache.remove(&k(key)).map(|v| *v);
                ensure_eq!(removed, before.get(&k(key)).copied(), "{at}");
                follow(&events, &mut model, &at)?;
            }
            Op::Invalidate(key) => {
                let removed = cache.invalidate(&k(key));
                ensure_eq!(removed, before.contains_key(&k(key)), "{at}");
                follow(&events, &mut model, &at)?;
            }
            Op::Clear => {
                cache.clear();
                follow(&events, &mut model, &at)?;
            }
            Op::SetCapacity(c) => {
                capacity = u64::from(c % 48);
                cache.set_capacity(capacity).unwrap();
                follow(&events, &mut model, &at)?;
            }
            Op::Retain(n) => {
                let drop = n % 3;
                let removed = cache.retain(|key, _| key % 3 != drop);
                let gone = before.keys().filter(|key| *key % 3 == drop).count();
                ensure_eq!(removed, gone, "{at}: removed count");
                follow(&events, &mut model, &at)?;
                ensure!(
                    model.keys().all(|key| key % 3 != drop),
                    "{at}: a refused entry left without a report"
                );
            }
            Op::Iter => iterates_as(&cache, &model, &at)?,
        }
        follow(&events, &mut model, &at)?;
        ensure_eq!(cache.len(), model.len(), "{at}: len");
        for key in model.keys() {
            ensure!(cache.contains_key(key), "{at}: {key} left without a report");
        }
        ensure_eq!(cache.weighted_size(), size(&model), "{at}: weighted size");
        ensure_eq!(cache.capacity(), capacity, "{at}: capacity");
        cache.__validate().map_err(|e| format!("{at}: {e}"))?;
    }
    Ok(())
}
