//! Expiry: hits and churn with a time to live or to idle, against runcache without expiry
//! and moka with the same setting.

use super::*;

/// Expiry: hits and churn with a time to live or to idle of an hour (nothing expires in a
/// run), on runcache's default clock and on `Clock::ticking`, against runcache without
/// expiry and moka with the same setting, all in one interleaved run per workload.
pub(crate) fn expiry(scale: &Scale, rows: &mut Vec<Row>) {
    const KEYS: u64 = 10_000;
    let stream = zipf_keys(KEYS, 1.0, 1 << 20, 5);
    let stream = &stream;
    let names = [
        "runcache",
        "moka",
        "runcache-ttl",
        "runcache-ttl-ticking",
        "moka-ttl",
        "runcache-tti",
        "runcache-tti-ticking",
        "moka-tti",
    ];
    let subjects: Vec<_> = names.iter().map(|n| hit_subject(n, KEYS)).collect();
    let runs = hit_runs(&subjects, scale.hits, stream);
    let f = interleaved(runs);
    drop(subjects);
    for (setting, clock, runcache, moka) in [
        ("live", "", 2, 4),
        ("live", ", ticking clock", 3, 4),
        ("idle", "", 5, 7),
        ("idle", ", ticking clock", 6, 7),
    ] {
        rows.push(Row {
            workload: format!(
                "hit with a time to {setting} of an hour{clock}, Zipf s=1, 10k keys, handle"
            ),
            unit: "M/s",
            runcache: f[runcache],
            peers: vec![
                (NO_EXPIRY, f[0]),
                ("moka with the same", f[moka]),
                ("moka without expiry", f[1]),
            ],
            higher_is_better: true,
        });
    }
    // Churn as in `churn`, one thread.
    const CAPACITY: u64 = 15_000;
    let stream = zipf_keys(100_000, 1.0, 1 << 20, 1);
    let stream = &stream;
    let names = [
        "runcache",
        "runcache-ttl",
        "runcache-ttl-ticking",
        "moka-ttl",
    ];
    let runs: Vec<Run<'_>> = names
        .iter()
        .map(|&name| -> Run<'_> {
            let run = move || {
                let subject = subject(name, CAPACITY);
                let t0 = Instant::now();
                for &k in stream.iter().cycle().take(scale.churn_ops) {
                    black_box(subject.access(k));
                }
                t0.elapsed()
            };
            (scale.churn_ops, Box::new(run))
        })
        .collect();
    let f = interleaved(runs);
    for (clock, runcache) in [("", 1), (", ticking clock", 2)] {
        rows.push(Row {
            workload: format!(
                "churn with a time to live of an hour{clock}, Zipf s=1, 100k keys, capacity 15k, 1 thread"
            ),
            unit: "M/s",
            runcache: f[runcache],
            peers: vec![(NO_EXPIRY, f[0]), ("moka with the same", f[3])],
            higher_is_better: true,
        });
    }
}

/// The peer name of runcache's own figure without expiry in the expiry rows.
pub(crate) const NO_EXPIRY: &str = "runcache without expiry";
