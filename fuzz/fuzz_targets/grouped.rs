//! The grouped cache against its model: group eviction by age, session, owner and full clears,
//! and owner clears deferred by holds (`runcache_model::grouped`, shared with the property
//! tests).
#![no_main]

use libfuzzer_sys::fuzz_target;
use runcache_model::grouped::{run, Input};

fuzz_target!(|input: Input| {
    if let Err(e) = run(input) {
        panic!("{e}");
    }
});
