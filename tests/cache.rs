//! Behaviour of the core cache, one property per test, over several configurations: reads,
//! writes, configuration errors, table growth and statistics.

mod common;

use common::with_caches;
use runcache::{Cache, ConfigError, WhenFull};
use std::sync::Arc;
use std::thread;

#[test]
fn insert_get_replace_remove() {
    with_caches::<String, u64>(100, |c| {
        assert_eq!(c.insert("a".into(), 1).unwrap(), None);
        assert_eq!(c.get("a").as_deref(), Some(&1));
        assert_eq!(c.insert("a".into(), 2).unwrap().as_deref(), Some(&1));
        assert_eq!(c.get("a").as_deref(), Some(&2));
        assert_eq!((c.len(), c.weighted_size()), (1, 1));
        assert_eq!(c.remove("a").as_deref(), Some(&2));
        assert_eq!(c.remove("a"), None);
        assert!(c.get("a").is_none() && c.is_empty());
        assert_eq!(c.weighted_size(), 0);
        let s = c.stats();
        assert_eq!(s.removals, 1);
    });
}

#[test]
fn put_and_invalidate_do_what_insert_and_remove_do_and_hand_nothing_back() {
    with_caches::<String, u64>(100, |c| {
        c.put("a".into(), 1).unwrap();
        assert_eq!(c.get("a").as_deref(), Some(&1));
        c.put("a".into(), 2).unwrap();
        assert_eq!(c.get("a").as_deref(), Some(&2));
        assert_eq!((c.len(), c.weighted_size()), (1, 1));
        assert!(c.invalidate("a"));
        assert!(!c.invalidate("a"), "nothing left to invalidate");
        assert!(c.get("a").is_none() && c.is_empty());
        assert_eq!(c.weighted_size(), 0);
        assert_eq!(c.stats().removals, 1);
    });
    // A refused put hands the key and the value back, as a refused insert does.
    let c = Cache::<u32, u32>::builder()
        .capacity(4)
        .weigher(|_, v| u64::from(*v))
        .build()
        .unwrap();
    let refused = c.put(1, 5).unwrap_err();
    assert_eq!(
        (refused.key, refused.value, refused.weight, refused.capacity),
        (1, 5, 5, 4)
    );
    assert!(c.is_empty());
}

#[test]
fn pinned_reads_borrow_without_refcounts() {
    with_caches::<u64, String>(100, |c| {
        for i in 0..50 {
            c.insert(i, i.to_string()).unwrap();
        }
        let pinned = c.pin();
        for i in 0..50 {
            assert_eq!(
                pinned.get(&i).map(String::as_str),
                Some(i.to_string().as_str())
            );
        }
        assert!(pinned.get(&99).is_none());
        assert!(pinned.contains_key(&3));
        // A value removed while pinned stays readable through the pin's borrow.
        let v = pinned.get(&7).unwrap();
        assert_eq!(c.remove(&7).as_deref().map(String::as_str), Some("7"));
        assert_eq!(v, "7");
    });
}

#[test]
fn invalid_shard_counts_are_refused_with_the_value() {
    for bad in [0usize, 3, 6, runcache::MAX_SHARDS * 2] {
        let e = Cache::<u8, u8>::builder().shards(bad).build().unwrap_err();
        assert_eq!(e, ConfigError::Shards { requested: bad });
        assert!(e.to_string().contains(&bad.to_string()));
    }
}

#[test]
fn a_zero_expected_entry_weight_is_refused_with_the_value() {
    let e = Cache::<u8, Vec<u8>>::builder()
        .weigher(|_, v| v.len() as u64)
        .expected_entry_weight(0)
        .build()
        .unwrap_err();
    assert_eq!(e, ConfigError::EntryWeight { given: 0 });
    assert!(e.to_string().contains("entry weight 0"), "{e}");
}

// Not in the stress build, which starts every table at four slots (so that tables migrate all
// the time) and runs ignored tests too.
#[cfg(not(runcache_stress))]
#[test]
fn a_presized_cache_fills_to_its_capacity_without_growing() {
    // By count: the capacity is the number of entries.
    let c = Cache::<u64, u64>::builder()
        .capacity(50_000)
        .shards(4)
        .build()
        .unwrap();
    let slots = c.__slots();
    assert!(slots >= 2 * 50_000, "presized to {slots} slots");
    for i in 0..50_000 {
        c.insert(i, i).unwrap();
    }
    assert_eq!((c.__migrations(), c.__slots()), (0, slots), "no growth");
    // By weight, with the expected weight of an entry.
    let w = Cache::<u64, Vec<u8>>::builder()
        .capacity(64 * 1024)
        .weigher(|_, v| v.len() as u64)
        .expected_entry_weight(64)
        .shards(1)
        .build()
        .unwrap();
    let slots = w.__slots();
    for i in 0..1024 {
        w.insert(i, vec![0; 64]).unwrap();
    }
    assert_eq!((w.__migrations(), w.__slots()), (0, slots), "no growth");
    // Without it, a weighted cache starts small and grows.
    let g = Cache::<u64, Vec<u8>>::builder()
        .capacity(64 * 1024)
        .weigher(|_, v| v.len() as u64)
        .shards(1)
        .build()
        .unwrap();
    assert!(g.__slots() < slots);
    for i in 0..1024 {
        g.insert(i, vec![0; 64]).unwrap();
    }
    assert!(g.__migrations() > 0);
    for c in [&w, &g] {
        c.__validate().unwrap();
        assert_eq!(c.len(), 1024);
    }
}

#[test]
fn the_table_grows_while_staying_correct() {
    let c = Cache::<u64, u64>::builder().shards(2).build().unwrap();
    let before = c.__slots();
    for i in 0..50_000 {
        c.insert(i, i * 2).unwrap();
    }
    // Writers claim at most half of a table's slots.
    assert!(
        c.__slots() >= 2 * 50_000,
        "slots: {} -> {}",
        before,
        c.__slots()
    );
    assert!(c.__migrations() >= 2, "migrations: {}", c.__migrations());
    c.__validate().unwrap();
    let pinned = c.pin();
    for i in 0..50_000 {
        assert_eq!(pinned.get(&i), Some(&(i * 2)));
    }
    assert_eq!(c.len(), 50_000);
}

#[test]
fn a_stream_of_new_keys_does_not_grow_the_table() {
    // Every new key claims a slot and every evicted or removed key leaves a dead one; the
    // table sheds them by migrating at the same size (only live entries are copied), so a
    // small cache stays small however many distinct keys pass through it.
    for evict in [true, false] {
        let builder = Cache::<u64, u64>::builder().capacity(100).shards(1);
        let c = if evict {
            builder.build().unwrap()
        } else {
            builder.when_full(WhenFull::Reject).build().unwrap()
        };
        for k in 0..200_000u64 {
            if !evict && k >= 100 {
                assert!(c.remove(&(k - 100)).is_some());
            }
            assert!(c.insert(k, k).is_ok(), "evict: {evict}, key {k}");
        }
        assert_eq!(c.len(), 100, "evict: {evict}");
        assert!(
            c.__migrations() > 100,
            "migrations: {}, slots {}",
            c.__migrations(),
            c.__slots()
        );
        // 100 live entries need at most 512 slots (writers claim half a table, and a table
        // doubles only while live entries fill a quarter of it).
        assert!(c.__slots() <= 512, "evict: {evict}, slots: {}", c.__slots());
        c.__validate().unwrap();
    }
}

#[test]
fn clear_removes_everything_and_returns_weight() {
    with_caches::<u64, u64>(1000, |c| {
        for i in 0..500 {
            c.insert(i, i).unwrap();
        }
        c.clear();
        assert_eq!((c.len(), c.weighted_size()), (0, 0));
        assert!(c.get(&1).is_none());
    });
}

#[test]
fn stats_count_hits_and_misses_exactly_across_threads() {
    let c = Arc::new(Cache::<u64, u64>::new(100));
    c.insert(1, 1).unwrap();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let c = c.clone();
            thread::spawn(move || {
                for _ in 0..1000 {
                    c.get(&1).unwrap();
                    assert!(c.get(&2).is_none());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (4000, 4000));
    assert!((s.hit_ratio() - 0.5).abs() < 1e-9);
}

#[test]
fn pinned_lookups_reach_the_stats_when_the_handle_drops() {
    let c = Cache::<u64, u64>::new(100);
    c.insert(1, 1).unwrap();
    let pinned = c.pin();
    for _ in 0..10 {
        assert_eq!(pinned.get(&1), Some(&1));
        assert!(pinned.get(&2).is_none());
    }
    assert!(pinned.contains_key(&1));
    drop(pinned);
    // Ten hits and ten misses from `get` and the handle path's own hit; `contains_key` is a
    // peek and counts nothing.
    assert!(c.get(&1).is_some());
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (11, 10));
}

#[test]
fn many_caches_per_thread_stay_isolated() {
    let caches: Vec<Cache<u32, u32>> = (0..20).map(|_| Cache::new(10)).collect();
    for (i, c) in caches.iter().enumerate() {
        c.insert(1, i as u32).unwrap();
    }
    for (i, c) in caches.iter().enumerate() {
        assert_eq!(c.get(&1).as_deref(), Some(&(i as u32)));
        assert_eq!(c.stats().hits, 1);
    }
}

/// A hasher whose hashes share their slot-index bits and fall in a few tag classes, and
/// some of which collide completely: probes must tell keys apart by the key itself.
#[derive(Default, Clone)]
struct Crowded(u64);

impl std::hash::Hasher for Crowded {
    fn finish(&self) -> u64 {
        let k = self.0;
        // Low bits: 4 values (crowded probes). Bits 32–47: 3 classes. Keys 0..8 of each
        // class of 64 collide completely.
        (k % 4) | ((k % 3) << 32) | if k % 64 < 8 { 0 } else { k << 48 }
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[test]
fn keys_whose_hashes_crowd_or_collide_stay_distinct_through_growth() {
    // Unbounded, so the tables start small (not presized) and grow.
    let c: Cache<u64, u64, std::hash::BuildHasherDefault<Crowded>> = Cache::builder()
        .shards(2)
        .hasher(Default::default())
        .build()
        .unwrap();
    for k in 0..600 {
        assert_eq!(c.insert(k, k * 10).unwrap(), None, "key {k}");
    }
    assert!(c.__migrations() > 0, "the table grew through migrations");
    for k in 0..600 {
        assert_eq!(c.get(&k).as_deref(), Some(&(k * 10)), "key {k}");
    }
    assert!(c.get(&600).is_none() && c.get(&(1 << 40)).is_none());
    for k in (0..600).step_by(3) {
        assert_eq!(c.remove(&k).as_deref(), Some(&(k * 10)), "key {k}");
    }
    for k in 0..600 {
        let expect = (k % 3 != 0).then_some(k * 10);
        assert_eq!(c.pin().get(&k).copied(), expect, "key {k}");
    }
    assert_eq!(c.len(), 400);
    c.__validate().unwrap();
}

/// Values aligned to less than a word (and a zero-sized one) sit at a word-aligned address in
/// their node, whose value cell keeps tags in the address's low bits: each is cached, handed
/// out, replaced and removed whole.
#[test]
fn values_smaller_than_a_word_are_cached_and_handed_out_whole() {
    let units = Cache::<u64, ()>::builder().capacity(8).build().unwrap();
    for k in 0..32 {
        units.insert(k, ()).unwrap();
    }
    assert_eq!(units.len(), 8);
    assert!((0..32).any(|k| units.get(&k).is_some()));

    let bytes = Cache::<u64, u8>::builder().capacity(100).build().unwrap();
    let odd = Cache::<u64, [u8; 3]>::builder()
        .capacity(100)
        .build()
        .unwrap();
    for k in 0..50u64 {
        bytes.insert(k, k as u8).unwrap();
        odd.insert(k, [k as u8, 1, 2]).unwrap();
    }
    for k in 0..50u64 {
        assert_eq!(bytes.get(&k).as_deref(), Some(&(k as u8)));
        assert_eq!(odd.get(&k).as_deref(), Some(&[k as u8, 1, 2]));
    }
    let held = bytes.get(&7).unwrap();
    bytes.insert(7, 70).unwrap();
    assert_eq!((*held, *bytes.get(&7).unwrap()), (7, 70));
    assert_eq!(bytes.remove(&7).as_deref(), Some(&70));
    assert_eq!(*held, 7, "a handle keeps the replaced value");
    assert_eq!(bytes.__validate(), Ok(()));
    assert_eq!(odd.__validate(), Ok(()));
}

/// `contains_key` is a peek: it counts neither a hit nor a miss, and checking an entry does
/// not keep it cached the way reading it does.
#[test]
fn contains_key_is_a_peek_that_neither_counts_nor_keeps_an_entry() {
    let c = Cache::<u64, u64>::builder().capacity(100).build().unwrap();
    for k in 0..100 {
        c.insert(k, k).unwrap();
    }
    let before = c.stats();
    for _ in 0..3 {
        assert!(c.contains_key(&0));
        assert!(!c.contains_key(&1_000));
        assert!(c.pin().contains_key(&0));
    }
    let after = c.stats();
    assert_eq!((after.hits, after.misses), (before.hits, before.misses));
    for _ in 0..3 {
        assert!(c.get(&1).is_some());
    }
    // A scan of keys never seen before: the entry that was read stays, the one that was
    // only checked goes with the other unused ones.
    for k in 10_000..20_000 {
        c.get_or_insert_with(k, || k);
    }
    assert!(c.contains_key(&1), "the entry read three times was kept");
    assert!(!c.contains_key(&0), "the entry only checked was kept");
    c.__validate().unwrap();
}

/// A borrowed form of a tuple key: hashes as `(String, Vec<usize>)` does, compares equal.
struct Shape<'a>(&'a str, &'a [usize]);

impl std::hash::Hash for Shape<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        self.1.hash(state);
    }
}

impl runcache::Equivalent<(String, Vec<usize>)> for Shape<'_> {
    fn equivalent(&self, key: &(String, Vec<usize>)) -> bool {
        self.0 == key.0 && self.1 == key.1.as_slice()
    }
}

#[test]
fn tuple_keys_are_found_removed_and_invalidated_by_a_borrowed_form() {
    let c: Cache<(String, Vec<usize>), u32> = Cache::new(100);
    for (i, name) in ["conv", "gemm", "pool"].into_iter().enumerate() {
        c.put((name.to_string(), vec![1, i]), i as u32).unwrap();
    }
    assert_eq!(c.get(&Shape("gemm", &[1, 1])).as_deref(), Some(&1));
    assert_eq!(c.get_cloned(&Shape("pool", &[1, 2])), Some(2));
    assert_eq!(c.pin().get(&Shape("conv", &[1, 0])), Some(&0));
    assert!(c.get(&Shape("gemm", &[1, 2])).is_none(), "another shape");
    assert_eq!(c.remove_if(&Shape("conv", &[1, 0]), |v| *v == 9), None);
    assert_eq!(c.remove(&Shape("conv", &[1, 0])).as_deref(), Some(&0));
    assert!(c.invalidate(&Shape("gemm", &[1, 1])));
    assert!(!c.pin().contains_key(&Shape("gemm", &[1, 1])));
    // The owned key still works, and so does what it borrows as.
    assert!(c.contains_key(&("pool".to_string(), vec![1, 2])));
    let names: Cache<String, u32> = Cache::new(10);
    names.put("a".to_string(), 1).unwrap();
    assert_eq!(names.get("a").as_deref(), Some(&1));
}
