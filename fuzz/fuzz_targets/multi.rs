//! The multi-cache against its model: two key types, failing and value-less builders, removal
//! and clearing (`runcache_model::multi`, shared with the property tests).
#![no_main]

use libfuzzer_sys::fuzz_target;
use runcache_model::multi::{run, Input};

fuzz_target!(|input: Input| {
    if let Err(e) = run(input) {
        panic!("{e}");
    }
});
