//! Differential fuzzing of the core cache: arbitrary operation sequences on a rejecting
//! `Cache` and on a sequential `HashMap` model, comparing every return value, the length, the
//! weighted size and the capacity after every step. (The same operations as the proptest in
//! `tests/model.rs`, from arbitrary bytes.)
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use runcache::{Cache, Source, WhenFull};
use std::collections::HashMap;

#[derive(Arbitrary, Debug)]
enum Op {
    Insert(u8, u32),
    Get(u8),
    Pinned(u8),
    Remove(u8),
    GetOrBuild(u8, u32),
    FailingBuild(u8),
    Contains(u8),
    Clear,
    SetCapacity(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    capacity: u8,
    shards: u8,
    ops: Vec<Op>,
}

fn weight(v: u32) -> u64 {
    u64::from(v % 4)
}

fuzz_target!(|input: Input| {
    let shards = 1usize << (input.shards % 4);
    let mut capacity = u64::from(input.capacity % 48);
    let cache = Cache::<u8, u32>::builder()
        .capacity(capacity)
        .shards(shards)
        .when_full(WhenFull::Reject)
        .weigher(|_, v| weight(*v))
        .build()
        .expect("a power-of-two shard count");
    let mut model: HashMap<u8, u32> = HashMap::new();
    let size = |m: &HashMap<u8, u32>| m.values().map(|v| weight(*v)).sum::<u64>();
    for op in input.ops.into_iter().take(512) {
        let k = |k: u8| k % 32;
        match op {
            Op::Insert(key, v) => {
                let key = k(key);
                let old = model.get(&key).copied();
                let extra = weight(v).saturating_sub(old.map_or(0, weight));
                let fits = capacity > 0
                    && size(&model) + if old.is_some() { extra } else { weight(v) } <= capacity;
                match cache.insert(key, v) {
                    Ok(prev) => {
                        assert!(fits, "insert({key}, {v}) should have been refused");
                        assert_eq!(prev.as_deref().copied(), old);
                        model.insert(key, v);
                    }
                    Err(e) => {
                        assert!(!fits, "insert({key}, {v}) refused: {e}");
                        assert_eq!(e.into_inner(), (key, v));
                    }
                }
            }
            Op::Get(key) => assert_eq!(cache.get(&k(key)).map(|v| *v), model.get(&k(key)).copied()),
            Op::Pinned(key) => {
                let pinned = cache.pin();
                assert_eq!(pinned.get(&k(key)), model.get(&k(key)));
            }
            Op::Contains(key) => assert_eq!(cache.contains_key(&k(key)), model.contains_key(&k(key))),
            Op::Remove(key) => {
                assert_eq!(cache.remove(&k(key)).map(|v| *v), model.remove(&k(key)))
            }
            Op::GetOrBuild(key, v) => {
                let key = k(key);
                let f = cache.get_or_build(key, |_| Ok::<_, ()>(v)).expect("never fails");
                match model.get(&key) {
                    Some(cur) => assert_eq!((f.source, *f.value), (Source::Hit, *cur)),
                    None => {
                        assert_eq!(*f.value, v);
                        if capacity > 0 && size(&model) + weight(v) <= capacity {
                            assert_eq!(f.source, Source::Cached);
                            model.insert(key, v);
                        } else {
                            assert_eq!(f.source, Source::Uncached);
                        }
                    }
                }
            }
            Op::FailingBuild(key) => {
                let key = k(key);
                let r = cache.try_get_or_insert_with(key, || Err::<u32, u8>(key));
                match model.get(&key) {
                    Some(cur) => assert_eq!(r.ok().map(|v| *v), Some(*cur)),
                    None => assert_eq!(r.map_err(|e| *e), Err(key)),
                }
            }
            Op::Clear => {
                cache.clear();
                model.clear();
            }
            Op::SetCapacity(c) => {
                capacity = u64::from(c % 48);
                cache.set_capacity(capacity);
                if capacity == 0 {
                    model.clear();
                }
                // Which entries a shrink removes is the cache's choice: survivors must be
                // unchanged and must fit.
                model.retain(|key, _| cache.contains_key(key));
                for (key, v) in &model {
                    assert_eq!(cache.get(key).map(|x| *x), Some(*v));
                }
                assert!(size(&model) <= capacity);
            }
        }
        assert_eq!(cache.len(), model.len());
        assert_eq!(cache.weighted_size(), size(&model));
        assert_eq!(cache.capacity(), capacity);
    }
});
