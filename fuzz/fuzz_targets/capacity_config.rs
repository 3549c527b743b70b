//! The capacity configuration parser on arbitrary bytes: it never panics, every error points
//! at its token inside the input, and whatever it accepts prints back to an equal config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runcache::constant::parse_capacity_config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = parse_capacity_config(text);
    for e in &parsed.errors {
        assert!(e.position <= text.len());
        assert!(text[e.position..].starts_with(e.token.as_str()));
    }
    if parsed.errors.is_empty() {
        let again = parse_capacity_config(&parsed.config.to_string());
        assert!(again.errors.is_empty());
        assert_eq!(again.config, parsed.config);
    }
});
