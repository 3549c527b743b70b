//! Differential fuzzing of the core cache refusing when full: operation sequences on a `Cache`
//! and on a sequential model, comparing every return value and the cache's invariants after
//! every step (`runcache_model::cache`, shared with the property tests).
#![no_main]

use libfuzzer_sys::fuzz_target;
use runcache_model::cache::{run, Input};

fuzz_target!(|input: Input| {
    if let Err(e) = run(input) {
        panic!("{e}");
    }
});
