//! The core cache with a time to live (and entries given their own by `insert_expiring`), on
//! a manual clock, against a model with deadlines: an entry at or past its deadline is never
//! returned; it leaves only as expired (heard by the listener, never before its deadline); once
//! a purge has run, nothing more than a tick past its deadline is left; and the length, the
//! weighted size and the counters match the model's live entries plus the expired ones not
//! yet taken out.

use crate::{ensure, ensure_eq, weight, Outcome};
use arbitrary::Arbitrary;
use runcache::{Cache, Clock, RemovalCause, Source, WhenFull};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The wheel's tick (2^20 ns, `src/raw/expire/`): a purge leaves nothing expired for longer.
const TICK: u64 = 1 << 20;

/// One operation; keys are taken modulo 16 so that operations meet.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    Put(u8, u32),
    Insert(u8, u32),
    Get(u8),
    Contains(u8),
    Remove(u8),
    GetOrBuild(u8, u32),
    /// Moves the clock by this many quarter-milliseconds.
    Advance(u8),
    Purge,
    Iter,
    SetCapacity(u8),
    /// `insert_expiring` with a time to live of this many quarter-milliseconds.
    InsertExpiring(u8, u32, u8),
}

/// A time to live (in quarter-milliseconds, 0 included), a capacity, and the operations.
#[derive(Arbitrary, Clone, Debug)]
pub struct Input {
    pub live: u8,
    pub capacity: u8,
    pub ops: Vec<Op>,
}

/// An entry of the model: its value and deadline (nanoseconds on the manual clock).
#[derive(Clone, Copy, Debug)]
struct Entry {
    value: u32,
    deadline: u64,
}

struct Model {
    map: HashMap<u8, Entry>,
    now: u64,
    live: u64,
    capacity: u64,
    hits: u64,
    misses: u64,
    expired: u64,
    /// Expired entries an operation of this step takes out by key, until their removal is
    /// heard.
    expiring: Vec<(u8, Entry)>,
}

impl Model {
    fn is_live(&self, key: u8) -> bool {
        self.map.get(&key).is_some_and(|e| e.deadline > self.now)
    }

    fn live_value(&self, key: u8) -> Option<u32> {
        self.map
            .get(&key)
            .filter(|e| e.deadline > self.now)
            .map(|e| e.value)
    }

    fn size(&self) -> u64 {
        self.map.values().map(|e| weight(e.value)).sum()
    }

    /// Whether `value` fits once `key`'s own entry (replaced, or expired and taken out
    /// first) and the other entries `gone` accepts no longer count.
    fn fits_without(&self, key: u8, value: u32, gone: impl Fn(&Entry) -> bool) -> bool {
        let kept: u64 = self
            .map
            .iter()
            .filter(|(k, e)| **k != key && !gone(e))
            .map(|(_, e)| weight(e.value))
            .sum();
        self.capacity > 0 && kept + weight(value) <= self.capacity
    }

    /// Whether `value` can fit: a write that finds no room first takes out expired entries,
    /// so at best every expired entry is gone.
    fn may_fit(&self, key: u8, value: u32) -> bool {
        self.fits_without(key, value, |e| e.deadline <= self.now)
    }

    /// Whether `value` must fit: the entries a tick past their deadline are surely due to
    /// the wheel's step, the others may stay until their tick passes.
    fn must_fit(&self, key: u8, value: u32) -> bool {
        self.fits_without(key, value, |e| e.deadline + TICK <= self.now)
    }

    fn deadline(&self) -> u64 {
        self.now + self.live
    }
}

/// Runs `input` (at most 512 operations) against a rejecting cache with a time to live.
pub fn run(input: Input) -> Outcome {
    let (clock, hand) = Clock::manual();
    let heard: Arc<Mutex<Vec<(u8, u32, RemovalCause)>>> = Arc::default();
    let sink = Arc::clone(&heard);
    let live = Duration::from_micros(250 * u64::from(input.live % 64));
    let mut model = Model {
        map: HashMap::new(),
        now: 0,
        live: live.as_nanos() as u64,
        capacity: u64::from(input.capacity % 48),
        hits: 0,
        misses: 0,
        expired: 0,
        expiring: Vec::new(),
    };
    let cache = Cache::<u8, u32>::builder()
        .capacity(model.capacity)
        .shards(2)
        .when_full(WhenFull::Reject)
        .weigher(|_, v| weight(*v))
        .time_to_live(live)
        .clock(clock)
        .on_evict(move |k, v, cause| sink.lock().unwrap().push((*k, **v, cause)))
        .build()
        .map_err(|e| format!("a valid configuration was refused: {e}"))?;
    for (step, op) in input.ops.into_iter().take(512).enumerate() {
        let at = format!("step {step} at {} ns: {op:?}", model.now);
        let k = |key: u8| key % 16;
        // The entries whose removal by key this step reports (removed or replaced).
        let mut by_key: Vec<(u8, u32)> = Vec::new();
        // A write or a removal of a key whose entry expired takes that entry out first.
        if let Op::Put(key, _)
        | Op::Insert(key, _)
        | Op::InsertExpiring(key, _, _)
        | Op::Remove(key)
        | Op::GetOrBuild(key, _) = op
        {
            let key = k(key);
            if model.map.get(&key).is_some_and(|e| e.deadline <= model.now) {
                let e = model.map.remove(&key).expect("just seen");
                model.expiring.push((key, e));
            }
        }
        match op {
            Op::Put(key, v) | Op::Insert(key, v) | Op::InsertExpiring(key, v, _) => {
                let key = k(key);
                let old = model.live_value(key);
                let (may, must) = (model.may_fit(key, v), model.must_fit(key, v));
                let mut deadline = model.deadline();
                let result = match op {
                    Op::Put(..) => cache.put(key, v).map(|()| None),
                    Op::InsertExpiring(_, _, q) => {
                        let ttl = Duration::from_micros(250 * u64::from(q % 64));
                        deadline = model.now + ttl.as_nanos() as u64;
                        cache.insert_expiring(key, v, ttl).map(|o| o.map(|h| *h))
                    }
                    _ => cache.insert(key, v).map(|o| o.map(|h| *h)),
                };
                match result {
                    Ok(prev) => {
                        ensure!(may, "{at}: should have been refused");
                        if !matches!(op, Op::Put(..)) {
                            ensure_eq!(prev, old, "{at}: replaced value");
                        }
                        if let Some(o) = old {
                            by_key.push((key, o));
                        }
                        // A replaced live value leaves; an expired one leaves as expired.
                        model.map.insert(key, Entry { value: v, deadline });
                    }
                    Err(e) => {
                        ensure!(!must, "{at}: refused: {e}");
                    }
                }
            }
            Op::Get(key) => {
                let key = k(key);
                let expected = model.live_value(key);
                if expected.is_some() {
                    model.hits += 1;
                } else {
                    model.misses += 1;
                }
                ensure_eq!(cache.get(&key).map(|v| *v), expected, "{at}");
            }
            Op::Contains(key) => {
                let key = k(key);
                ensure_eq!(cache.contains_key(&key), model.is_live(key), "{at}");
            }
            Op::Remove(key) => {
                let key = k(key);
                let expected = model.live_value(key);
                ensure_eq!(cache.remove(&key).map(|v| *v), expected, "{at}");
                if let Some(v) = expected {
                    model.map.remove(&key);
                    by_key.push((key, v));
                }
            }
            Op::GetOrBuild(key, v) => {
                let key = k(key);
                let got = cache
                    .get_or_build(key, |_| Ok::<_, Infallible>(v))
                    .map_err(|e| format!("{at}: an infallible build failed: {e:?}"))?;
                match model.live_value(key) {
                    Some(cur) => {
                        model.hits += 1;
                        ensure_eq!((*got.value, got.source), (cur, Source::Hit), "{at}: hit");
                    }
                    None => {
                        model.misses += 1;
                        ensure_eq!(*got.value, v, "{at}: built");
                        if got.source == Source::Cached {
                            ensure!(model.may_fit(key, v), "{at}: should not have been cached");
                            let deadline = model.deadline();
                            model.map.insert(key, Entry { value: v, deadline });
                        } else {
                            ensure_eq!(got.source, Source::Uncached, "{at}: a miss's source");
                            ensure!(!model.must_fit(key, v), "{at}: not cached, but fits");
                        }
                    }
                }
            }
            Op::Advance(q) => {
                let by = Duration::from_micros(250 * u64::from(q % 32));
                hand.advance(by);
                model.now += by.as_nanos() as u64;
            }
            Op::Purge => {
                cache.purge_expired();
            }
            Op::Iter => {
                let pinned = cache.pin();
                let mut seen: Vec<_> = pinned.iter().map(|(k, v)| (*k, *v)).collect();
                let mut expected: Vec<_> = model
                    .map
                    .iter()
                    .filter(|(_, e)| e.deadline > model.now)
                    .map(|(k, e)| (*k, e.value))
                    .collect();
                seen.sort_unstable();
                expected.sort_unstable();
                ensure_eq!(seen, expected, "{at}: iterated entries");
            }
            Op::SetCapacity(c) => {
                let c = u64::from(c % 48);
                cache.set_capacity(c).unwrap();
                model.capacity = c;
            }
        }
        // What left: removals and replacements this step made, expiries (never early), and
        // a shrink's evictions.
        for (key, v, cause) in heard.lock().unwrap().drain(..) {
            match cause {
                RemovalCause::Removed | RemovalCause::Replaced => {
                    let i = by_key.iter().position(|e| *e == (key, v));
                    ensure!(i.is_some(), "{at}: {key}={v} heard as {cause:?}");
                    by_key.swap_remove(i.unwrap_or_default());
                }
                RemovalCause::Expired => {
                    let pending = model.expiring.iter().position(|(pk, _)| *pk == key);
                    let e = match pending {
                        Some(i) => Some(model.expiring.swap_remove(i).1),
                        None => model.map.remove(&key),
                    };
                    ensure!(
                        e.is_some_and(|e| e.value == v && e.deadline <= model.now),
                        "{at}: {key}={v} expired early or unknown (model: {e:?})"
                    );
                    model.expired += 1;
                }
                RemovalCause::Capacity => {
                    ensure!(matches!(op, Op::SetCapacity(_)), "{at}: evicted {key}={v}");
                    ensure!(
                        model.map.get(&key).is_some_and(|e| e.value == v),
                        "{at}: evicted {key}={v}, which the model does not hold"
                    );
                    model.map.remove(&key);
                }
                other => return Err(format!("{at}: {key}={v} left as {other:?}")),
            }
        }
        ensure!(by_key.is_empty(), "{at}: not heard: {by_key:?}");
        ensure!(
            model.expiring.is_empty(),
            "{at}: expired entries the write did not take out: {:?}",
            model.expiring
        );
        if matches!(op, Op::Purge) {
            let stale: Vec<_> = model
                .map
                .iter()
                .filter(|(_, e)| e.deadline + TICK <= model.now)
                .collect();
            ensure!(stale.is_empty(), "{at}: left after a purge: {stale:?}");
        }
        ensure_eq!(cache.len(), model.map.len(), "{at}: len");
        ensure_eq!(cache.weighted_size(), model.size(), "{at}: weighted size");
        let st = cache.stats();
        ensure_eq!(
            [st.hits, st.misses, st.expirations],
            [model.hits, model.misses, model.expired],
            "{at}: stats (hits, misses, expirations)"
        );
        cache.__validate().map_err(|e| format!("{at}: {e}"))?;
    }
    Ok(())
}
