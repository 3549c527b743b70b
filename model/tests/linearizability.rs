//! Real concurrent histories, checked for linearizability against each key's sequential
//! specification (`runcache_model::lin`).
//!
//! - `real_histories_are_linearizable` runs generated programs for `RUNCACHE_LIN_SECS`
//!   seconds (20 by default), from the seed `RUNCACHE_LIN_SEED` (by default one taken from
//!   the clock, printed). CI runs it in the debug build and in the stress build
//!   (`--cfg runcache_stress`: tables of four slots, migrating all the time).
//! - `a_million_calls_are_linearizable` is the local soak: ignored by default.
//! - `the_saved_programs_stay_linearizable` reruns, many times each, the programs whose seeds
//!   are kept in `model/lin-regressions/seeds.txt` (programs that caught a bug).
//!
//! A failure prints each failing key's shortest failing sub-history and the program's seed,
//! and saves the report with the program under `target/tmp/lin-failures/seed-N.txt`; keep
//! the seed in `model/lin-regressions/seeds.txt` once the bug is fixed.

use runcache_model::lin;
use std::path::PathBuf;

fn secs(default: f64) -> f64 {
    std::env::var("RUNCACHE_LIN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn first_seed() -> u64 {
    std::env::var("RUNCACHE_LIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

fn failures() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lin-failures")
}

fn soak(secs: f64, max_calls: u64) -> lin::Tally {
    let seed = first_seed();
    println!("first seed {seed}");
    match lin::soak(seed, secs, max_calls, Some(&failures())) {
        Ok(tally) => {
            println!(
                "{} histories, {} calls, all linearizable",
                tally.histories, tally.calls
            );
            tally
        }
        Err(report) => panic!("{report}"),
    }
}

#[test]
fn real_histories_are_linearizable() {
    let tally = soak(secs(20.0), u64::MAX);
    assert!(tally.histories > 0, "at least one history was checked");
}

#[test]
#[ignore = "a long local soak: RUNCACHE_LIN_SECS (default an hour) or a million calls"]
fn a_million_calls_are_linearizable() {
    let tally = soak(secs(3600.0), 1_000_000);
    assert!(
        tally.calls >= 1_000_000,
        "only {} calls in time",
        tally.calls
    );
}

/// The seeds a file of `model/lin-regressions/` lists, one a line (`#` starts a comment).
fn seeds(file: &str) -> Vec<u64> {
    let path = format!("{}/lin-regressions/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("the seeds file is kept in the repository");
    let seeds: Vec<u64> = text
        .lines()
        .filter_map(|l| l.split('#').next())
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert!(!seeds.is_empty(), "{path} lists no seed");
    seeds
}

#[test]
fn the_saved_programs_stay_linearizable() {
    for seed in seeds("seeds.txt") {
        let program = lin::Program::generate(seed);
        for _ in 0..50 {
            let history = lin::run(&program);
            if let Some(report) = lin::verify(&program, &history) {
                panic!("{report}");
            }
        }
    }
}

#[test]
#[ignore = "a debugging aid: reruns the program of RUNCACHE_LIN_SEED for RUNCACHE_LIN_SECS"]
fn rerun_one_seed() {
    let seed = first_seed();
    let program = lin::Program::generate(seed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs(30.0));
    let mut runs = 0;
    while std::time::Instant::now() < deadline {
        let history = lin::run(&program);
        runs += 1;
        if let Some(report) = lin::verify(&program, &history) {
            panic!("run {runs}: {report}");
        }
    }
    println!("{runs} runs of seed {seed}, all linearizable");
}
