//! The single-flight storm: many callers of one missing key.

use super::*;

/// Mean storm time over the builder's time, and the most builds one storm ran; returns
/// runcache's two figures.
pub(crate) fn storm(scale: &Scale, rows: &mut Vec<Row>) -> (f64, u64) {
    const THREADS: usize = 8;
    const BUILD: Duration = Duration::from_millis(2);
    let build = |builds: &AtomicU64| {
        builds.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(BUILD);
        7u64
    };
    let mut figure = Vec::new();
    let mut most_builds = Vec::new();
    for name in CACHE_SUBJECTS {
        let mut total = Duration::ZERO;
        let mut most = 0;
        for _ in 0..scale.storms {
            let builds = AtomicU64::new(0);
            let run = |get: &(dyn Fn() -> u64 + Sync)| {
                on_threads(THREADS, 1, |_, _| {
                    black_box(get());
                })
            };
            let took = match name {
                "runcache" => {
                    let c = runcache::Cache::<u64, u64>::new(100);
                    run(&|| *c.get_or_insert_with(1, || build(&builds)))
                }
                "quick_cache" => {
                    let c = quick_cache::sync::Cache::<u64, u64>::new(100);
                    run(&|| {
                        c.get_or_insert_with(&1, || Ok::<_, ()>(build(&builds)))
                            .unwrap_or(0)
                    })
                }
                _ => {
                    let c = moka::sync::Cache::<u64, u64>::new(100);
                    run(&|| c.get_with(1, || build(&builds)))
                }
            };
            total += took;
            most = most.max(builds.load(Ordering::Relaxed));
        }
        figure.push(total.as_secs_f64() / scale.storms as f64 / BUILD.as_secs_f64());
        most_builds.push(most);
    }
    rows.push(Row {
        workload: format!(
            "single-flight storm, {THREADS} threads, 2 ms builder: time / builder time (builds: runcache {}, quick_cache {}, moka {})",
            most_builds[0], most_builds[1], most_builds[2]
        ),
        unit: "×",
        runcache: figure[0],
        peers: vec![("quick_cache", figure[1]), ("moka", figure[2])],
        higher_is_better: false,
    });
    (figure[0], most_builds[0])
}
