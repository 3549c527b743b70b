//! Iteration over every entry.

use super::*;

/// The targets, each with the worst ratio over the rows it covers.
/// Iterating every entry once (summing the values), pinned where the map has guards: runcache
/// `pin().iter()`, papaya `pin().iter()`; quick_cache's `iter` clones each `Arc`, dashmap's
/// read-locks each shard in turn.
pub(crate) fn iteration(rows: &mut Vec<Row>) {
    for entries in [100_000u64, 1_000_000] {
        let rc: runcache::Cache<u64, u64> = runcache::Cache::builder()
            .capacity(2 * entries)
            .build()
            .expect("the default shard count is valid");
        let pa = papaya::HashMap::<u64, u64, Hasher>::with_hasher(Hasher::default());
        let pa_arc = papaya::HashMap::<u64, Arc<u64>, Hasher>::with_hasher(Hasher::default());
        let qc = quick_cache::sync::Cache::<u64, Arc<u64>>::new(2 * entries as usize);
        let dash = dashmap::DashMap::<u64, Arc<u64>, Hasher>::with_hasher(Hasher::default());
        let map: HashMap<u64, Arc<u64>, Hasher> = (0..entries).map(|k| (k, Arc::new(k))).collect();
        for k in 0..entries {
            let _ = rc.insert(k, k);
            pa.pin().insert(k, k);
            pa_arc.pin().insert(k, Arc::new(k));
            qc.insert(k, Arc::new(k));
            dash.insert(k, Arc::new(k));
        }
        /// A run that sums one pass over `n` entries.
        fn timed<'a>(n: u64, sum: impl Fn() -> u64 + 'a) -> Run<'a> {
            let run = move || {
                let t0 = Instant::now();
                black_box(sum());
                t0.elapsed()
            };
            (n as usize, Box::new(run))
        }
        let n = entries;
        let runs = vec![
            timed(n, || rc.pin().iter().map(|(_, v)| *v).sum()),
            timed(n, || pa.pin().iter().map(|(_, v)| *v).sum()),
            timed(n, || pa_arc.pin().iter().map(|(_, v)| **v).sum()),
            timed(n, || qc.iter().map(|(_, v)| *v).sum()),
            timed(n, || dash.iter().map(|e| **e.value()).sum()),
            timed(n, || map.values().map(|v| **v).sum()),
        ];
        let m = interleaved(runs);
        rows.push(Row {
            workload: format!("iteration over {}k entries, entries/s", entries / 1000),
            unit: "M/s",
            runcache: m[0],
            peers: vec![
                ("papaya", m[1]),
                ("papaya of Arc", m[2]),
                ("quick_cache", m[3]),
                ("dashmap", m[4]),
                ("HashMap of Arc", m[5]),
            ],
            higher_is_better: true,
        });
    }
}
