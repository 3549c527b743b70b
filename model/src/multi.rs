//! The multi-cache (one cache per key type) against a model: two key types that share key
//! values but never entries, failing and value-less builders that cache nothing, removal and
//! clearing. Capacities are either large enough to never evict (so the model is exact) or 0
//! (every call builds and reports a miss). Each type's counters must count every call once.

use crate::{ensure_eq, Outcome};
use arbitrary::Arbitrary;
use runcache::multi::MultiCache;
use runcache::Lookup;
use std::collections::HashMap;

/// The second key type: same key values as `u8`, another cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape(u8);

/// One operation; keys are taken modulo 16.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    GetOrCreate(u8),
    GetOrCreateShape(u8),
    TryFailing(u8),
    Optional(u8, bool),
    Remove(u8),
    RemoveShape(u8),
    Clear,
}

/// Whether the per-type caches hold anything, and the operations to apply.
#[derive(Arbitrary, Clone, Debug)]
pub struct Input {
    pub disabled: bool,
    pub ops: Vec<Op>,
}

/// Runs `input` (at most 512 operations). Every value built is the step number.
pub fn run(input: Input) -> Outcome {
    let capacity = if input.disabled { 0 } else { 64 };
    let cache = MultiCache::new(capacity);
    let mut plain: HashMap<u8, u64> = HashMap::new();
    let mut shapes: HashMap<u8, String> = HashMap::new();
    // Hits, misses and builds of each type's cache: a call for a cached key is a hit, any
    // other a miss that builds.
    let mut plain_counts = [0u64; 3];
    let mut shape_counts = [0u64; 3];
    let count = |counts: &mut [u64; 3], hit: bool| {
        if hit {
            counts[0] += 1;
        } else {
            counts[1] += 1;
            counts[2] += 1;
        }
    };
    for (step, op) in input.ops.into_iter().take(512).enumerate() {
        let at = format!("step {step}: {op:?}");
        let v = step as u64;
        match op {
            Op::GetOrCreate(k) | Op::Optional(k, true) => {
                let k = k % 16;
                count(&mut plain_counts, plain.contains_key(&k));
                let (got, how) = match op {
                    Op::Optional(..) => match cache.get_or_create_opt(&k, |_| Some(v)) {
                        Some(found) => found,
                        None => return Err(format!("{at}: a value was built but none returned")),
                    },
                    _ => cache.get_or_create(&k, |_| v),
                };
                match plain.get(&k) {
                    Some(cur) => ensure_eq!((*got, how), (*cur, Lookup::Hit), "{at}"),
                    None => {
                        ensure_eq!((*got, how), (v, Lookup::Miss), "{at}");
                        if capacity > 0 {
                            plain.insert(k, v);
                        }
                    }
                }
            }
            Op::GetOrCreateShape(k) => {
                let k = k % 16;
                count(&mut shape_counts, shapes.contains_key(&k));
                let (got, how) = cache.get_or_create(&Shape(k), |_| format!("shape {v}"));
                match shapes.get(&k) {
                    Some(cur) => ensure_eq!((&*got, how), (cur, Lookup::Hit), "{at}"),
                    None => {
                        ensure_eq!((&*got, how), (&format!("shape {v}"), Lookup::Miss), "{at}");
                        if capacity > 0 {
                            shapes.insert(k, format!("shape {v}"));
                        }
                    }
                }
            }
            Op::TryFailing(k) => {
                let k = k % 16;
                count(&mut plain_counts, plain.contains_key(&k));
                let r = cache.try_get_or_create(&k, |_| Err::<u64, u8>(k));
                match plain.get(&k) {
                    Some(cur) => ensure_eq!(
                        r.ok().map(|(x, how)| (*x, how)),
                        Some((*cur, Lookup::Hit)),
                        "{at}"
                    ),
                    None => ensure_eq!(
                        r.err().and_then(|e| e.failed().copied()),
                        Some(k),
                        "{at}: the builder's error"
                    ),
                }
            }
            Op::Optional(k, false) => {
                let k = k % 16;
                count(&mut plain_counts, plain.contains_key(&k));
                let got = cache.get_or_create_opt(&k, |_| None::<u64>);
                ensure_eq!(
                    got.map(|(x, how)| (*x, how)),
                    plain.get(&k).map(|c| (*c, Lookup::Hit)),
                    "{at}"
                );
            }
            Op::Remove(k) => {
                let removed = cache.remove::<u8, u64>(&(k % 16)).map(|x| *x);
                ensure_eq!(removed, plain.remove(&(k % 16)), "{at}");
            }
            Op::RemoveShape(k) => {
                let removed = cache
                    .remove::<Shape, String>(&Shape(k % 16))
                    .map(|x| (*x).clone());
                ensure_eq!(removed, shapes.remove(&(k % 16)), "{at}");
            }
            Op::Clear => {
                cache.clear();
                plain.clear();
                shapes.clear();
            }
        }
        let st = cache.stats::<u8, u64>();
        ensure_eq!(st.evictions, 0, "{at}: evictions");
        ensure_eq!(
            [st.hits, st.misses, st.builds],
            plain_counts,
            "{at}: u8 stats"
        );
        let st = cache.stats::<Shape, String>();
        ensure_eq!(
            [st.hits, st.misses, st.builds],
            shape_counts,
            "{at}: Shape stats"
        );
    }
    for (k, v) in &plain {
        let (got, how) = cache.get_or_create(k, |_| u64::MAX);
        ensure_eq!((*got, how), (*v, Lookup::Hit), "at the end: {k}");
    }
    Ok(())
}
