//! Property tests over the operation enums that the fuzz targets use: each operation is
//! decoded from its own chunk of random bytes (see `runcache_model::ops`), and the sequence is
//! run against a layer and its sequential model. Proptest shrinks the chunks, and so the
//! operations, when a run fails.

use proptest::prelude::*;
use runcache_model::{cache, evicting, expiring, flight, grouped, multi, ops};

/// Up to 300 operations' worth of bytes.
fn chunks() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 12), 1..300)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn rejecting_cache_matches_its_model(capacity: u8, shards: u8, c in chunks()) {
        let input = cache::Input { capacity, shards, ops: ops(&c) };
        cache::run(input).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn evicting_cache_matches_its_model_and_keeps_its_policy_consistent(
        capacity: u8,
        shards: u8,
        c in chunks(),
    ) {
        let input = evicting::Input { capacity, shards, ops: ops(&c) };
        evicting::run(input).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn expiring_cache_matches_its_model_with_deadlines(live: u8, capacity: u8, c in chunks()) {
        let input = expiring::Input { live, capacity, ops: ops(&c) };
        expiring::run(input).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn grouped_cache_matches_its_model(groups_per_session: u8, expiry: u8, c in chunks()) {
        let input = grouped::Input { groups_per_session, expiry, ops: ops(&c) };
        grouped::run(input).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn async_single_flight_matches_its_model_and_loses_no_wake_up(c in chunks()) {
        let input = flight::Input { ops: ops(&c) };
        flight::run(input).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn multi_cache_matches_its_model(disabled in prop::bool::weighted(0.2), c in chunks()) {
        let input = multi::Input { disabled, ops: ops(&c) };
        multi::run(input).map_err(TestCaseError::fail)?;
    }
}
