//! How each figure is measured: the scale of a run, interleaved rounds, batches of lookups,
//! and a row of results.

use super::*;

/// How much work each measurement does.
pub(crate) struct Scale {
    pub(crate) hits: usize,
    pub(crate) mix_ops: usize,
    pub(crate) churn_ops: usize,
    pub(crate) storms: usize,
    pub(crate) trace: usize,
}

/// Runs of each measurement; each figure is the best of them.
pub(crate) const ROUNDS: usize = 5;

/// One measurement: how many operations a run performs, and the run (which returns its time).
pub(crate) type Run<'a> = (usize, Box<dyn FnMut() -> Duration + 'a>);

/// Each measurement's best throughput in millions of operations per second, over `ROUNDS`
/// runs taken in turn (every measurement once, then every one again, ...), so that a burst of
/// load from the machine's other tenants costs every subject of a comparison alike rather
/// than whichever was running during it.
pub(crate) fn interleaved(mut runs: Vec<Run<'_>>) -> Vec<f64> {
    let mut best = vec![0.0f64; runs.len()];
    for _ in 0..ROUNDS {
        for ((ops, run), best) in runs.iter_mut().zip(&mut best) {
            *best = best.max(*ops as f64 / run().as_secs_f64() / 1e6);
        }
    }
    best
}

/// A row of results: a workload, runcache's figure, and each peer's.
pub(crate) struct Row {
    pub(crate) workload: String,
    pub(crate) unit: &'static str,
    pub(crate) runcache: f64,
    pub(crate) peers: Vec<(&'static str, f64)>,
    /// Whether a larger figure is better (throughput) or a smaller one (bytes, time).
    pub(crate) higher_is_better: bool,
}

impl Row {
    pub(crate) fn ratio(&self, peer: f64) -> f64 {
        if self.higher_is_better {
            self.runcache / peer
        } else {
            peer / self.runcache
        }
    }
}

/// Keys per pinned batch in the hit measurements.
pub(crate) const BATCH: usize = 1024;

/// A run per subject, each of `ops` lookups over `stream` in batches ([`batches`]).
pub(crate) fn hit_runs<'a>(
    subjects: &'a [Box<dyn Subject>],
    ops: usize,
    stream: &'a [u64],
) -> Vec<Run<'a>> {
    subjects
        .iter()
        .map(|subject| {
            batches(ops, stream, move |batch| {
                black_box(subject.get_batch(batch));
            })
        })
        .collect()
}

/// A run of `ops` lookups over `stream`, handed to `lookups` a batch of `BATCH` keys at a time.
pub(crate) fn batches<'a>(
    ops: usize,
    stream: &'a [u64],
    mut lookups: impl FnMut(&[u64]) + 'a,
) -> Run<'a> {
    let run = move || {
        let t0 = Instant::now();
        look_up_in_batches(ops, stream, &mut lookups);
        t0.elapsed()
    };
    (ops, Box::new(run))
}

/// Hands `stream` to `lookups` `BATCH` keys at a time, wrapping around, until `ops` keys
/// (rounded down to whole batches) have been looked up.
pub(crate) fn look_up_in_batches(ops: usize, stream: &[u64], mut lookups: impl FnMut(&[u64])) {
    let mut at = 0;
    for _ in 0..ops / BATCH {
        lookups(&stream[at..at + BATCH]);
        at = (at + BATCH) % (stream.len() - BATCH);
    }
}
