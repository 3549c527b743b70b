//! Hits: Zipf and uniform keys, one thread and two, pinned, cloned and counted reads.

use super::*;

pub(crate) fn hits(scale: &Scale, rows: &mut Vec<Row>) {
    for keys in [10_000u64, 1_000_000] {
        for s in [0.5, 1.0] {
            let stream = zipf_keys(keys, s, 1 << 20, 5);
            let stream = &stream;
            let names: Vec<&str> = MAP_SUBJECTS.into_iter().chain(["papaya-arc"]).collect();
            let subjects: Vec<_> = names.iter().map(|n| hit_subject(n, keys)).collect();
            let map: HashMap<u64, u64, Hasher> = (0..keys).map(|k| (k, k)).collect();
            let map_arc: HashMap<u64, Arc<u64>, Hasher> =
                (0..keys).map(|k| (k, Arc::new(k))).collect();
            let mut runs = hit_runs(&subjects, scale.hits, stream);
            runs.push(batches(scale.hits, stream, |batch| {
                black_box(get_batch_unsync(&map, batch));
            }));
            runs.push(batches(scale.hits, stream, |batch| {
                black_box(get_batch_unsync_arc(&map_arc, batch));
            }));
            runs.push(batches(scale.hits, stream, |batch| {
                black_box(get_batch_floor_arc(&map_arc, batch));
            }));
            let mut mops = interleaved(runs);
            let floor_arc = mops.pop().expect("one figure per run");
            let unsync_arc = mops.pop().expect("one figure per run");
            let unsync = mops.pop().expect("one figure per run");
            let figure: HashMap<&str, f64> = names.into_iter().zip(mops).collect();
            drop(subjects);
            let label = format!("hit, Zipf s={s}, {}k keys", keys / 1000);
            let unsync = [("HashMap", unsync), ("HashMap of Arc", unsync_arc)];
            push_hit_rows(rows, &label, &figure, &unsync, floor_arc);
        }
    }
}

/// Hits on a cache larger than the CPU caches: 100k and 1M keys looked up uniformly, so that
/// nearly every lookup misses the caches on the slot and the entry. Three ways to read: pinned
/// (`&V`) against papaya storing the value inline; a copy of the value out (runcache's
/// `get_cloned`) against quick_cache storing the value inline; and runcache's counted handle
/// against quick_cache storing `Arc<u64>`.
pub(crate) fn hits_uniform(scale: &Scale, rows: &mut Vec<Row>) {
    for keys in [100_000u64, 1_000_000] {
        let stream = uniform_keys(keys, 1 << 20, 11);
        let stream = &stream;
        let names = [
            "runcache-pinned",
            "papaya",
            "runcache-cloned",
            "quick_cache-inline",
            "runcache",
            "quick_cache",
        ];
        let subjects: Vec<_> = names.iter().map(|n| hit_subject(n, keys)).collect();
        let runs = hit_runs(&subjects, scale.hits, stream);
        let figure: HashMap<&str, f64> = names.into_iter().zip(interleaved(runs)).collect();
        drop(subjects);
        let label = format!("hit, uniform, {}k keys", keys / 1000);
        for (kind, subject, peers) in [
            ("pinned", "runcache-pinned", vec![("papaya", "papaya")]),
            (
                "cloned out",
                "runcache-cloned",
                vec![("quick_cache storing u64", "quick_cache-inline")],
            ),
            (
                "handle",
                "runcache",
                vec![
                    ("quick_cache", "quick_cache"),
                    ("quick_cache storing u64", "quick_cache-inline"),
                ],
            ),
        ] {
            rows.push(Row {
                workload: format!("{label}, {kind}"),
                unit: "M/s",
                runcache: figure[subject],
                peers: peers.into_iter().map(|(p, n)| (p, figure[n])).collect(),
                higher_is_better: true,
            });
        }
    }
}

/// A batch of lookups, shared by the threads of a run.
pub(crate) type Lookups<'a> = dyn Fn(&[u64]) + Sync + 'a;

/// Hits on two threads, each looking up its own Zipf stream over the same cache (s=1, the
/// skew where the hottest entries, and their reference counts, are shared most): the issue's
/// 2-thread hit, pinned and handle, which the criterion `hit` bench measures too.
pub(crate) fn hits_two_threads(scale: &Scale, rows: &mut Vec<Row>) {
    const THREADS: usize = 2;
    for keys in [10_000u64, 1_000_000] {
        let streams: Vec<Vec<u64>> = (0..THREADS as u64)
            .map(|t| zipf_keys(keys, 1.0, 1 << 20, 5 + t))
            .collect();
        let streams = &streams;
        let names = [
            "runcache-pinned",
            "papaya",
            "papaya-arc",
            "runcache",
            "quick_cache",
            "moka",
        ];
        let subjects: Vec<_> = names.iter().map(|n| hit_subject(n, keys)).collect();
        let map_arc: HashMap<u64, Arc<u64>, Hasher> = (0..keys).map(|k| (k, Arc::new(k))).collect();
        fn on_both<'a>(
            streams: &'a [Vec<u64>],
            per_thread: usize,
            lookups: &'a Lookups<'a>,
        ) -> Run<'a> {
            let run = move || {
                on_threads(THREADS, 1, |t, _| {
                    look_up_in_batches(per_thread, &streams[t], lookups)
                })
            };
            (THREADS * (per_thread / BATCH) * BATCH, Box::new(run))
        }
        let lookups: Vec<Box<Lookups<'_>>> = subjects
            .iter()
            .map(|subject| -> Box<Lookups<'_>> {
                Box::new(move |batch| {
                    black_box(subject.get_batch(batch));
                })
            })
            .chain(std::iter::once::<Box<Lookups<'_>>>(Box::new(|batch| {
                black_box(get_batch_floor_arc(&map_arc, batch));
            })))
            .collect();
        let mut mops = interleaved(
            lookups
                .iter()
                .map(|l| on_both(streams, scale.hits, &**l))
                .collect(),
        );
        let floor_arc = mops.pop().expect("one figure per run");
        let figure: HashMap<&str, f64> = names.into_iter().zip(mops).collect();
        let label = format!("hit on {THREADS} threads, Zipf s=1, {}k keys", keys / 1000);
        push_hit_rows(rows, &label, &figure, &[], floor_arc);
    }
}

/// The pinned and the handle row of one hit workload, from each subject's figure (by subject
/// name; the peers a run did not measure are left out), the unsynchronized maps' figures
/// (`unsync`, pinned row) and the floor's (handle row).
pub(crate) fn push_hit_rows(
    rows: &mut Vec<Row>,
    label: &str,
    figure: &HashMap<&str, f64>,
    unsync: &[(&'static str, f64)],
    floor_arc: f64,
) {
    let peers = |named: &[(&'static str, &str)]| -> Vec<(&'static str, f64)> {
        named
            .iter()
            .filter_map(|&(peer, subject)| Some((peer, *figure.get(subject)?)))
            .collect()
    };
    let mut pinned = peers(&[("papaya", "papaya"), ("papaya of Arc", "papaya-arc")]);
    pinned.extend_from_slice(unsync);
    let mut arc = peers(&[
        ("quick_cache", "quick_cache"),
        ("moka", "moka"),
        ("dashmap", "dashmap"),
    ]);
    arc.push((FLOOR_ARC, floor_arc));
    for (kind, subject, peers) in [
        ("pinned", "runcache-pinned", pinned),
        ("handle", "runcache", arc),
    ] {
        rows.push(Row {
            workload: format!("{label}, {kind}"),
            unit: "M/s",
            runcache: figure[subject],
            peers,
            higher_is_better: true,
        });
    }
}

/// The peer name of [`get_batch_floor_arc`]'s figure in the handle hit rows.
pub(crate) const FLOOR_ARC: &str = "epoch pin + HashMap of Arc";
