//! The capacity configuration parser on arbitrary bytes (`runcache_model::config`): it never
//! panics, every error points at its token inside the input, and whatever it accepts prints
//! back to an equal configuration.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = runcache_model::config::run(data) {
        panic!("{e}");
    }
});
