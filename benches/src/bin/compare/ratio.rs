//! Hit ratio against capacity on a Zipf trace.

use super::*;

/// Hit ratio against capacity on a Zipf trace (s = 0.9, 100k keys), one thread.
pub(crate) fn hit_ratio(scale: &Scale) -> (Vec<String>, Vec<Series>) {
    let trace = zipf_keys(100_000, 0.9, scale.trace, 11);
    let capacities = [250u64, 500, 1000, 2500, 5000, 10_000];
    let mut series = Vec::new();
    for name in CACHE_SUBJECTS {
        let values = capacities
            .iter()
            .map(|&c| {
                let s = subject(name, c);
                let hits = trace.iter().filter(|k| s.access(**k)).count();
                100.0 * hits as f64 / trace.len() as f64
            })
            .collect();
        series.push(Series {
            label: name.to_string(),
            values,
        });
    }
    let values = capacities
        .iter()
        .map(|&c| {
            let mut lru = lru::LruCache::<u64, ()>::new(
                std::num::NonZeroUsize::new(c as usize).expect("positive"),
            );
            let hits = trace
                .iter()
                .filter(|k| lru.get(*k).is_some() || lru.put(**k, ()).is_some())
                .count();
            100.0 * hits as f64 / trace.len() as f64
        })
        .collect();
    series.push(Series {
        label: "LRU".to_string(),
        values,
    });
    (capacities.iter().map(|c| c.to_string()).collect(), series)
}
