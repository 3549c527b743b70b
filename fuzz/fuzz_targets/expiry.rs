//! Differential fuzzing of the core cache with a time to live on a manual clock: operation
//! sequences with time steps on a `Cache` and on a sequential model with deadlines, comparing
//! every return value, what the listener hears and the cache's invariants after every step
//! (`runcache_model::expiring`, shared with the property tests).
#![no_main]

use libfuzzer_sys::fuzz_target;
use runcache_model::expiring::{run, Input};

fuzz_target!(|input: Input| {
    if let Err(e) = run(input) {
        panic!("{e}");
    }
});
