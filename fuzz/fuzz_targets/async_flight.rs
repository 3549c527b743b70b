//! Differential fuzzing of the async single flight on one thread: callers' futures started,
//! polled, let finish and dropped in any order between gets, inserts and removals, against
//! a model of who builds, who waits and what each gets, with every wake-up a build's end owes
//! checked (`runcache_model::flight`, shared with the property tests).
#![no_main]

use libfuzzer_sys::fuzz_target;
use runcache_model::flight::{run, Input};

fuzz_target!(|input: Input| {
    if let Err(e) = run(input) {
        panic!("{e}");
    }
});
