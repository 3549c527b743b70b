//! Helpers shared by the integration tests.
#![allow(dead_code)]

use runcache::Cache;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Shard counts every configuration-sensitive test runs with.
pub const SHARDS: [usize; 3] = [1, 4, 64];

/// Runs `test` on a fresh cache for each shard count.
pub fn with_caches<K, V>(capacity: u64, mut test: impl FnMut(Cache<K, V>))
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    for shards in SHARDS {
        let cache = Cache::<K, V>::builder()
            .capacity(capacity)
            .shards(shards)
            .build()
            .expect("valid shard count");
        test(cache);
    }
}

/// A value that counts its drops.
#[derive(Debug)]
pub struct Tracked {
    pub id: u64,
    drops: Arc<AtomicUsize>,
}

impl Tracked {
    pub fn new(id: u64, drops: &Arc<AtomicUsize>) -> Self {
        Self {
            id,
            drops: Arc::clone(drops),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

pub fn drops() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}
