//! The constant caches' capacity configuration parser on arbitrary bytes: it never panics,
//! every error points at its token inside the input, and whatever it accepts prints back to an
//! equal configuration.

use crate::{ensure, ensure_eq, Outcome};
use runcache::constant::parse_capacity_config;

/// Parses `data` (ignored unless it is UTF-8) and checks the parser's promises.
pub fn run(data: &[u8]) -> Outcome {
    let Ok(text) = std::str::from_utf8(data) else {
        return Ok(());
    };
    let parsed = parse_capacity_config(text);
    for e in &parsed.errors {
        ensure!(
            e.position <= text.len(),
            "{text:?}: error {e} points past the end"
        );
        ensure!(
            text.is_char_boundary(e.position) && text[e.position..].starts_with(e.token.as_str()),
            "{text:?}: error {e} does not point at its token"
        );
    }
    if parsed.errors.is_empty() {
        let printed = parsed.config.to_string();
        let again = parse_capacity_config(&printed);
        ensure!(
            again.errors.is_empty(),
            "{printed:?} (printed from {text:?}) does not parse"
        );
        ensure_eq!(
            again.config,
            parsed.config,
            "{text:?} printed as {printed:?}"
        );
    }
    Ok(())
}
