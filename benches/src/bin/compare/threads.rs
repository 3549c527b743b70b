//! Writes: the three operation mixes, the throughput curves against threads, and churn.

use super::*;

/// A throughput-against-threads plot: its file stem under `docs/bench/`, its title, and one
/// series per subject with a value per count of [`curve_threads`].
pub(crate) type Plot = (String, String, Vec<Series>);

/// The thread counts of the throughput curves: 1, 2 and 4, then 8 and 16 where the machine
/// has that many cores.
pub(crate) fn curve_threads() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    [1, 2, 4, 8, 16]
        .into_iter()
        .filter(|&t| t <= 4 || t <= cores)
        .collect()
}

/// Hits and churn against the thread count (each thread its own Zipf s=1 stream over the
/// same keys), for the curves; the rows at 1 and 2 threads come from `hits*` and `churn`.
pub(crate) fn scaling(scale: &Scale) -> Vec<Plot> {
    let threads = curve_threads();
    let most = *threads.last().expect("1 at least") as u64;
    let mut plots = Vec::new();
    // Hits on 10k keys: the handle get against quick_cache's and moka's `Arc` get, and the
    // pinned get against papaya's.
    let keys = 10_000u64;
    let names = [
        "runcache",
        "quick_cache",
        "moka",
        "runcache-pinned",
        "papaya",
    ];
    let streams: Vec<Vec<u64>> = (0..most)
        .map(|t| zipf_keys(keys, 1.0, 1 << 20, 5 + t))
        .collect();
    let subjects: Vec<_> = names.iter().map(|n| hit_subject(n, keys)).collect();
    let mut series = new_series(&names);
    for &n in &threads {
        let (streams, per_thread) = (&streams, scale.hits / 2);
        let runs: Vec<Run<'_>> = subjects
            .iter()
            .map(|subject| -> Run<'_> {
                let run = move || {
                    on_threads(n, 1, |t, _| {
                        look_up_in_batches(per_thread, &streams[t], |batch| {
                            black_box(subject.get_batch(batch));
                        })
                    })
                };
                (n * (per_thread / BATCH) * BATCH, Box::new(run))
            })
            .collect();
        push_figures(&mut series, interleaved(runs));
    }
    plots.push((
        "threads-hit".to_string(),
        "hits, Zipf s=1, 10k keys: throughput vs threads".to_string(),
        series,
    ));
    // Churn: get, and insert on a miss, at a capacity where 18–19% of the accesses miss.
    let streams: Vec<Vec<u64>> = (0..most)
        .map(|t| zipf_keys(100_000, 1.0, 1 << 20, 1 + t))
        .collect();
    let mut series = new_series(&CACHE_SUBJECTS);
    for &n in &threads {
        let (streams, per_thread) = (&streams, (scale.churn_ops / 2).min(1 << 20));
        let runs: Vec<Run<'_>> = CACHE_SUBJECTS
            .iter()
            .map(|&name| -> Run<'_> {
                let run = move || {
                    let subject = subject(name, 15_000);
                    on_threads(n, 1, |t, _| {
                        for &k in &streams[t][..per_thread] {
                            black_box(subject.access(k));
                        }
                    })
                };
                (n * per_thread, Box::new(run))
            })
            .collect();
        push_figures(&mut series, interleaved(runs));
    }
    plots.push((
        "threads-churn".to_string(),
        "churn, Zipf s=1, 100k keys, capacity 15k: throughput vs threads".to_string(),
        series,
    ));
    plots
}

/// One empty series per subject.
pub(crate) fn new_series(names: &[&str]) -> Vec<Series> {
    names
        .iter()
        .map(|n| Series {
            label: n.to_string(),
            values: Vec::new(),
        })
        .collect()
}

/// Adds one figure to each series, in order.
pub(crate) fn push_figures(series: &mut [Series], figures: Vec<f64>) {
    for (s, f) in series.iter_mut().zip(figures) {
        s.values.push(f);
    }
}

/// Throughput of every mix at each count of [`curve_threads`]; also returns the series for
/// the plots.
pub(crate) fn mixes(scale: &Scale, rows: &mut Vec<Row>) -> Vec<Plot> {
    let mut plots = Vec::new();
    let names = ["runcache", "papaya", "quick_cache", "moka", "dashmap"];
    for mix in MIXES {
        // One stream per thread of the widest run (16 where the machine has the cores).
        let most = curve_threads().last().copied().unwrap_or(1) as u64;
        let streams: Vec<_> = (0..most)
            .map(|t| mix_ops(mix, scale.mix_ops, 17 + t))
            .collect();
        let mut series = new_series(&names);
        for threads in curve_threads() {
            let streams = &streams;
            let mut runs: Vec<Run<'_>> = names
                .iter()
                .map(|&name| -> Run<'_> {
                    let run = move || {
                        let subject = mix_subject(name);
                        on_threads(threads, 1, |t, _| {
                            black_box(run_ops(&*subject, &streams[t]));
                        })
                    };
                    (threads * scale.mix_ops, Box::new(run))
                })
                .collect();
            if threads == 1 {
                let run = || {
                    let mut map = mix_unsync();
                    let t0 = Instant::now();
                    black_box(run_ops_unsync(&mut map, &streams[0]));
                    t0.elapsed()
                };
                runs.push((scale.mix_ops, Box::new(run)));
            }
            let mut figure = interleaved(runs);
            let unsync = (threads == 1).then(|| figure.pop().expect("one figure per run"));
            for (s, f) in series.iter_mut().zip(&figure) {
                s.values.push(*f);
            }
            let mut peers: Vec<(&'static str, f64)> = names[1..]
                .iter()
                .copied()
                .zip(figure[1..].iter().copied())
                .collect();
            if let Some(unsync) = unsync {
                peers.push(("HashMap", unsync));
            }
            rows.push(Row {
                workload: format!("{} mix, {threads} thread(s)", mix.name),
                unit: "M/s",
                runcache: figure[0],
                peers,
                higher_is_better: true,
            });
        }
        plots.push((
            format!("mix-{}", mix.name),
            format!("{} mix: throughput vs threads", mix.name),
            series,
        ));
    }
    plots
}

pub(crate) fn churn(scale: &Scale, rows: &mut Vec<Row>) {
    const KEYS: u64 = 100_000;
    // 15k entries: 18–19% of the accesses miss, inside the 10–20% band (10k missed
    // 21%).
    const CAPACITY: u64 = 15_000;
    let streams = [
        zipf_keys(KEYS, 1.0, 1 << 20, 1),
        zipf_keys(KEYS, 1.0, 1 << 20, 2),
    ];
    // The churn runs on 1 and 2 threads; 16 and 64 threads show more threads than
    // most machines here have cores (a runtime's worker pools often outnumber them), with the
    // same total work split over more threads (a quarter of it at 64, where moka takes
    // microseconds per operation).
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    for (threads, per_thread) in [
        (1usize, scale.churn_ops),
        (2, scale.churn_ops),
        (16, scale.churn_ops / 8),
        (64, scale.churn_ops / 128),
    ] {
        // Each subject's hits in its latest run.
        let hits: Vec<AtomicU64> = CACHE_SUBJECTS.iter().map(|_| AtomicU64::new(0)).collect();
        let streams = &streams;
        let runs: Vec<Run<'_>> = CACHE_SUBJECTS
            .iter()
            .zip(&hits)
            .map(|(&name, hits)| -> Run<'_> {
                let run = move || {
                    let subject = subject(name, CAPACITY);
                    hits.store(0, Ordering::Relaxed);
                    on_threads(threads, 1, |t, _| {
                        // Threads beyond two share the two streams, each from its own start.
                        let (stream, start) = (&streams[t % 2], t / 2 * 7919);
                        let mut mine = 0;
                        for i in 0..per_thread {
                            let k = stream[(start + i) % stream.len()];
                            mine += u64::from(subject.access(k));
                        }
                        hits.fetch_add(mine, Ordering::Relaxed);
                    })
                };
                (threads * per_thread, Box::new(run))
            })
            .collect();
        let figure = interleaved(runs);
        // runcache's miss ratio, which labels the row.
        let total = (threads * per_thread) as f64;
        let misses = 100.0 * (1.0 - hits[0].load(Ordering::Relaxed) as f64 / total);
        // Rows beyond the 1 and 2 threads are named apart: its targets read only
        // the rows that start "churn, Zipf".
        let workload = if threads <= 2 {
            format!(
                "churn, Zipf s=1, 100k keys, capacity 15k ({misses:.0}% misses), {threads} thread(s)"
            )
        } else {
            let over = if threads > cores {
                ", oversubscribed"
            } else {
                ""
            };
            format!(
                "churn at {threads} threads on {cores} cores{over}, Zipf s=1, 100k keys, \
                 capacity 15k ({misses:.0}% misses)"
            )
        };
        rows.push(Row {
            workload,
            unit: "M/s",
            runcache: figure[0],
            peers: vec![("quick_cache", figure[1]), ("moka", figure[2])],
            higher_is_better: true,
        });
    }
}
