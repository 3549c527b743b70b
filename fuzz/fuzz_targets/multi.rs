//! The multi-cache against its model: two key types, failing and value-less builders, removal
//! and clearing (`runcache_check::multi`, shared with the property tests).
#![no_main]

use libfuzzer_sys::fuzz_target;
use runcache_check::multi::{run, Input};

fuzz_target!(|input: Input| {
    if let Err(e) = run(input) {
        panic!("{e}");
    }
});
