//! Replays every input kept in `fuzz/regressions/<target>/`: crashes that cargo-fuzz found
//! (copied there from `fuzz/artifacts/` when fixed) and a few corpus seeds per target, so each
//! one stays fixed in the ordinary test run, without cargo-fuzz.

use runcache_model::{cache, config, decode, evicting, expiring, flight, grouped, multi, Outcome};
use std::path::Path;

fn replay(target: &str, run: impl Fn(&[u8]) -> Outcome) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions")
        .join(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut replayed = 0;
    for entry in entries {
        let path = entry.expect("a readable directory entry").path();
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Err(e) = run(&bytes) {
            panic!("{}: {e}", path.display());
        }
        replayed += 1;
    }
    assert!(replayed > 0, "{} holds no input", dir.display());
}

fn typed<'a, T: arbitrary::Arbitrary<'a>>(bytes: &'a [u8], run: fn(T) -> Outcome) -> Outcome {
    decode::<T>(bytes).map_or(Ok(()), run)
}

#[test]
fn cache_ops_regressions_pass() {
    replay("cache_ops", |b| typed(b, cache::run));
}

#[test]
fn expiry_regressions_pass() {
    replay("expiry", |b| typed(b, expiring::run));
}

#[test]
fn policy_regressions_pass() {
    replay("policy", |b| typed(b, evicting::run));
}

#[test]
fn grouped_regressions_pass() {
    replay("grouped", |b| typed(b, grouped::run));
}

#[test]
fn async_flight_regressions_pass() {
    replay("async_flight", |b| typed(b, flight::run));
}

#[test]
fn multi_regressions_pass() {
    replay("multi", |b| typed(b, multi::run));
}

#[test]
fn capacity_config_regressions_pass() {
    replay("capacity_config", config::run);
}
