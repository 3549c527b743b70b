//! Differential property test: random operation sequences applied to the cache and to a
//! sequential model, comparing every return value, the length and the weighted size.

use proptest::prelude::*;
use runcache::{Cache, Source, WhenFull};
use std::collections::HashMap;

#[derive(Clone, Debug)]
enum Op {
    Insert(u8, u32),
    Get(u8),
    Pinned(u8),
    Remove(u8),
    GetOrBuild(u8, u32),
    FailingBuild(u8),
    Contains(u8),
    Clear,
    SetCapacity(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..32u8, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        3 => (0..32u8).prop_map(Op::Get),
        1 => (0..32u8).prop_map(Op::Pinned),
        2 => (0..32u8).prop_map(Op::Remove),
        3 => (0..32u8, any::<u32>()).prop_map(|(k, v)| Op::GetOrBuild(k, v)),
        1 => (0..32u8).prop_map(Op::FailingBuild),
        1 => (0..32u8).prop_map(Op::Contains),
        1 => Just(Op::Clear),
        1 => (0..40u64).prop_map(Op::SetCapacity),
    ]
}

/// Weights 0..=3 so zero-weight entries and multi-unit entries are both exercised.
fn weight(v: u32) -> u64 {
    u64::from(v % 4)
}

struct Model {
    map: HashMap<u8, u32>,
    capacity: u64,
}

impl Model {
    fn size(&self) -> u64 {
        self.map.values().map(|v| weight(*v)).sum()
    }

    fn fits(&self, extra: u64) -> bool {
        self.capacity > 0 && self.size() + extra <= self.capacity
    }
}

fn run(ops: Vec<Op>, capacity: u64, shards: usize) -> Result<(), TestCaseError> {
    let cache = Cache::<u8, u32>::builder()
        .capacity(capacity)
        .shards(shards)
        .when_full(WhenFull::Reject)
        .weigher(|_, v| weight(*v))
        .build()
        .unwrap();
    let mut model = Model {
        map: HashMap::new(),
        capacity,
    };
    for (step, op) in ops.into_iter().enumerate() {
        let what = format!("step {step}: {op:?}");
        match op {
            Op::Insert(k, v) => {
                let old = model.map.get(&k).copied();
                let extra = weight(v).saturating_sub(old.map_or(0, weight));
                let expect_ok = if old.is_some() {
                    model.capacity > 0 && model.size() + extra <= model.capacity
                } else {
                    model.fits(weight(v))
                };
                match cache.insert(k, v) {
                    Ok(prev) => {
                        prop_assert!(expect_ok, "insert({k}, {v}) should have been refused");
                        prop_assert_eq!(prev.as_deref().copied(), old);
                        model.map.insert(k, v);
                    }
                    Err(e) => {
                        prop_assert!(!expect_ok, "insert({k}, {v}) refused: {e}");
                        prop_assert_eq!(e.into_inner(), (k, v));
                    }
                }
            }
            Op::Get(k) => prop_assert_eq!(cache.get(&k).map(|v| *v), model.map.get(&k).copied()),
            Op::Pinned(k) => {
                let pinned = cache.pin();
                prop_assert_eq!(pinned.get(&k), model.map.get(&k))
            }
            Op::Contains(k) => prop_assert_eq!(cache.contains_key(&k), model.map.contains_key(&k)),
            Op::Remove(k) => {
                prop_assert_eq!(cache.remove(&k).as_deref().copied(), model.map.remove(&k))
            }
            Op::GetOrBuild(k, v) => {
                let f = cache.get_or_build(k, |_| Ok::<_, ()>(v)).unwrap();
                match model.map.get(&k) {
                    Some(cur) => {
                        prop_assert_eq!(f.source, Source::Hit);
                        prop_assert_eq!(*f.value, *cur);
                    }
                    None => {
                        prop_assert_eq!(*f.value, v);
                        if model.fits(weight(v)) {
                            prop_assert_eq!(f.source, Source::Cached);
                            model.map.insert(k, v);
                        } else {
                            prop_assert_eq!(f.source, Source::Uncached);
                        }
                    }
                }
            }
            Op::FailingBuild(k) => {
                let r = cache.try_get_or_insert_with(k, || Err::<u32, _>(k));
                match model.map.get(&k) {
                    Some(cur) => prop_assert_eq!(r.ok().map(|v| *v), Some(*cur)),
                    None => prop_assert_eq!(r.map_err(|e| *e), Err(k)),
                }
            }
            Op::Clear => {
                cache.clear();
                model.map.clear();
            }
            Op::SetCapacity(c) => {
                cache.set_capacity(c);
                model.capacity = c;
                if c == 0 {
                    model.map.clear();
                }
                // Which entries a shrink removes is the cache's choice: every survivor must be
                // unchanged, and the survivors must fit.
                let survivors: HashMap<u8, u32> = model
                    .map
                    .iter()
                    .filter(|(k, _)| cache.contains_key(*k))
                    .map(|(k, v)| (*k, *v))
                    .collect();
                for (k, v) in &survivors {
                    prop_assert_eq!(cache.get(k).map(|x| *x), Some(*v));
                }
                model.map = survivors;
                prop_assert!(model.size() <= c);
            }
        }
        prop_assert_eq!(cache.len(), model.map.len(), "{}", what);
        prop_assert_eq!(cache.weighted_size(), model.size(), "{}", what);
        prop_assert_eq!(cache.capacity(), model.capacity, "{}", what);
        prop_assert!(cache.weighted_size() <= cache.capacity());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn cache_matches_a_sequential_model(
        ops in prop::collection::vec(op(), 1..200),
        capacity in 0..48u64,
        shards in prop::sample::select(vec![1usize, 2, 8]),
    ) {
        run(ops, capacity, shards)?;
    }
}
