//! The evicting cache: the model follows every eviction the listener reports, and the policy's
//! invariants (capacity never exceeded, no entry queued twice, queue totals exact, cached
//! entries exactly the queued live ones) are checked after every step
//! (`runcache_model::evicting`, shared with the property tests).
#![no_main]

use libfuzzer_sys::fuzz_target;
use runcache_model::evicting::{run, Input};

fuzz_target!(|input: Input| {
    if let Err(e) = run(input) {
        panic!("{e}");
    }
});
