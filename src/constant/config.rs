//! The capacity configuration string of `RUNCACHE_CONSTANT_CACHE_CAPACITY`.
//!
//! The form is `kind:mib` fields separated by `;`, for example `cpu:10240;gpu:2048`. Every
//! field is checked, and a bad field is reported with its token and byte position; the other
//! fields still apply. Nothing is reinterpreted: an unknown kind is not taken for a GPU, `-1`
//! is not "unlimited", and `10GB` is not 10.

#![forbid(unsafe_code)]

use super::alloc::DeviceKind;
use std::fmt;

/// The largest capacity in MiB whose byte count fits in a `u64`.
pub const MAX_CAPACITY_MB: u64 = u64::MAX >> 20;

/// Capacities (MiB) that a configuration string sets, per device kind.
///
/// ```
/// use runcache::constant::{parse_capacity_config, CapacityConfig, DeviceKind};
///
/// let mut config = CapacityConfig::default();
/// config.set(DeviceKind::Cpu, 10240);
/// config.set(DeviceKind::Gpu, 2048);
/// assert_eq!(config.to_string(), "cpu:10240;gpu:2048");
/// assert_eq!(parse_capacity_config(&config.to_string()).into_result(), Ok(config));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapacityConfig {
    mb: [Option<u64>; 2],
}

impl CapacityConfig {
    /// The capacity the configuration sets for `kind`, in MiB, if it sets one.
    ///
    /// ```
    /// use runcache::constant::{parse_capacity_config, DeviceKind};
    ///
    /// let config = parse_capacity_config("gpu:512").config;
    /// assert_eq!(config.get(DeviceKind::Gpu), Some(512));
    /// assert_eq!(config.get(DeviceKind::Cpu), None, "not set: the default applies");
    /// ```
    pub fn get(&self, kind: DeviceKind) -> Option<u64> {
        self.mb[kind.index()]
    }

    /// Sets the capacity of `kind`, in MiB.
    ///
    /// ```
    /// use runcache::constant::{CapacityConfig, DeviceKind};
    ///
    /// let mut config = CapacityConfig::default();
    /// config.set(DeviceKind::Cpu, 64);
    /// assert_eq!(config.get(DeviceKind::Cpu), Some(64));
    /// ```
    pub fn set(&mut self, kind: DeviceKind, mb: u64) {
        self.mb[kind.index()] = Some(mb);
    }
}

impl fmt::Display for CapacityConfig {
    /// The canonical string form, which [`parse_capacity_config`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for kind in DeviceKind::ALL {
            if let Some(mb) = self.get(kind) {
                if !first {
                    f.write_str(";")?;
                }
                write!(f, "{kind}:{mb}")?;
                first = false;
            }
        }
        Ok(())
    }
}

/// What is wrong with one part of a capacity configuration string.
///
/// ```
/// use runcache::constant::{parse_capacity_config, CapacityParseErrorKind as Kind};
///
/// let kinds: Vec<Kind> = ["", "cpu:1;", "cpu", "tpu:1", "cpu:-1", "cpu:10GB"]
///     .iter()
///     .map(|s| parse_capacity_config(s).errors[0].kind)
///     .collect();
/// assert_eq!(
///     kinds,
///     [Kind::Empty, Kind::TrailingSeparator, Kind::MissingColon, Kind::UnknownDevice, Kind::Negative, Kind::NotANumber]
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CapacityParseErrorKind {
    /// The whole string is empty.
    Empty,
    /// A field between two separators is empty (`cpu:1;;gpu:2`).
    EmptyField,
    /// The string ends with a separator (`cpu:1;`).
    TrailingSeparator,
    /// A field has no `:` between kind and size.
    MissingColon,
    /// The device kind is not `cpu` or `gpu`.
    UnknownDevice,
    /// The kind appears twice; neither value is used.
    DuplicateDevice,
    /// The size is empty.
    MissingValue,
    /// The size is negative.
    Negative,
    /// The size is not a plain decimal number of MiB.
    NotANumber,
    /// The size is above [`MAX_CAPACITY_MB`].
    TooLarge,
}

/// One error in a capacity configuration string: what, which token, and where.
///
/// ```
/// use runcache::constant::{parse_capacity_config, CapacityParseErrorKind};
///
/// let parsed = parse_capacity_config("cpu:1024;gpu:lots");
/// let err = &parsed.errors[0];
/// assert_eq!((err.kind, err.token.as_str(), err.position), (CapacityParseErrorKind::NotANumber, "lots", 13));
/// assert_eq!(
///     err.to_string(),
///     "capacity configuration: size is not a whole number of MiB `lots` at byte 13 (digits only, e.g. `2048`)"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CapacityParseError {
    /// What is wrong.
    pub kind: CapacityParseErrorKind,
    /// The offending token, as written.
    pub token: String,
    /// Byte offset of the token in the string.
    pub position: usize,
}

impl CapacityParseError {
    /// What the error leaves undone, for a report of it: a bad separator or an empty string
    /// sets nothing wrong (the other fields apply), a bad field leaves its kind at the default
    /// capacity (0, off).
    ///
    /// ```
    /// use runcache::constant::parse_capacity_config;
    ///
    /// let parsed = parse_capacity_config("cpu:2;gpu:x;");
    /// assert_eq!(parsed.errors[0].consequence(), "that device kind keeps its default capacity (0)");
    /// assert_eq!(parsed.errors[1].consequence(), "ignored: the other fields apply");
    /// ```
    pub fn consequence(&self) -> &'static str {
        use CapacityParseErrorKind as K;
        match self.kind {
            K::Empty => "every device kind keeps its default capacity (0)",
            K::EmptyField | K::TrailingSeparator => "ignored: the other fields apply",
            K::DuplicateDevice => {
                "neither value applies: that device kind keeps its default capacity (0)"
            }
            _ => "that device kind keeps its default capacity (0)",
        }
    }
}

impl fmt::Display for CapacityParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use CapacityParseErrorKind as K;
        let (what, hint) = match self.kind {
            K::Empty => ("empty configuration", "write e.g. `cpu:1024;gpu:512`"),
            K::EmptyField => ("empty field", "remove the extra `;`"),
            K::TrailingSeparator => ("trailing separator", "remove the final `;`"),
            K::MissingColon => ("field without `:`", "write `kind:mib`"),
            K::UnknownDevice => ("unknown device kind", "expected `cpu` or `gpu`"),
            K::DuplicateDevice => ("device kind given twice", "neither value is used"),
            K::MissingValue => ("missing size", "write the size in MiB after `:`"),
            K::Negative => ("negative size", "use 0 to disable the cache"),
            K::NotANumber => (
                "size is not a whole number of MiB",
                "digits only, e.g. `2048`",
            ),
            K::TooLarge => ("size too large", "the maximum is 17592186044415 MiB"),
        };
        write!(
            f,
            "capacity configuration: {what} `{}` at byte {} ({hint})",
            self.token, self.position
        )
    }
}

impl std::error::Error for CapacityParseError {}

/// The result of parsing: the capacities of the well-formed fields, and an error for each bad
/// one (whose kind then keeps its default).
///
/// ```
/// use runcache::constant::{parse_capacity_config, DeviceKind};
///
/// // The good field applies; the bad one is reported and leaves its kind at the default.
/// let parsed = parse_capacity_config("cpu:256;gpu:-5");
/// assert_eq!(parsed.config.get(DeviceKind::Cpu), Some(256));
/// assert_eq!(parsed.config.get(DeviceKind::Gpu), None);
/// assert_eq!(parsed.errors.len(), 1);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedCapacity {
    /// The capacities that well-formed fields set.
    pub config: CapacityConfig,
    /// One error per bad field, in order.
    pub errors: Vec<CapacityParseError>,
}

impl ParsedCapacity {
    /// The configuration if every field was well formed, else every error.
    ///
    /// # Errors
    /// The errors found, when there is at least one.
    ///
    /// ```
    /// use runcache::constant::parse_capacity_config;
    ///
    /// assert!(parse_capacity_config("cpu:1;gpu:2").into_result().is_ok());
    /// let errors = parse_capacity_config("cpu:1;;gpu:x").into_result().unwrap_err();
    /// assert_eq!(errors.len(), 2);
    /// ```
    pub fn into_result(self) -> Result<CapacityConfig, Vec<CapacityParseError>> {
        if self.errors.is_empty() {
            Ok(self.config)
        } else {
            Err(self.errors)
        }
    }
}

/// Parses a capacity configuration such as `cpu:10240;gpu:2048` (MiB). Pure: reads no
/// environment and changes nothing, so a program can validate its configuration up front.
///
/// ```
/// use runcache::constant::{parse_capacity_config, DeviceKind};
///
/// // Validate a configuration up front, before any cache reads the environment.
/// match parse_capacity_config("cpu:10240;gpu:2048").into_result() {
///     Ok(config) => assert_eq!(config.get(DeviceKind::Cpu), Some(10240)),
///     Err(errors) => panic!("bad configuration: {errors:?}"),
/// }
/// ```
#[must_use = "parsing changes nothing: the result is the only outcome"]
pub fn parse_capacity_config(s: &str) -> ParsedCapacity {
    use CapacityParseErrorKind as K;
    let mut out = ParsedCapacity::default();
    let err = |kind, token: &str, position| CapacityParseError {
        kind,
        token: token.to_string(),
        position,
    };
    if s.trim_ascii().is_empty() {
        out.errors.push(err(K::Empty, "", 0));
        return out;
    }
    let mut seen = [0usize; 2];
    let mut values: [Option<u64>; 2] = [None, None];
    let fields: Vec<(usize, &str)> = split_with_offsets(s);
    let last = fields.len() - 1;
    for (i, (at, field)) in fields.into_iter().enumerate() {
        // Spaces around a field, its kind and its size are not part of them (`cpu:2; gpu:4`).
        let (raw_at, (at, field)) = (at, trimmed(at, field));
        if field.is_empty() {
            if i == last {
                // Not the first field (the string is not blank): a `;` precedes it.
                out.errors.push(err(K::TrailingSeparator, ";", raw_at - 1));
            } else {
                out.errors.push(err(K::EmptyField, "", at));
            }
            continue;
        }
        let Some((kind_token, value_token)) = field.split_once(':') else {
            out.errors.push(err(K::MissingColon, field, at));
            continue;
        };
        let (value_at, value_token) = trimmed(at + kind_token.len() + 1, value_token);
        let (_, kind_token) = trimmed(at, kind_token);
        let kind = match kind_token {
            "cpu" => DeviceKind::Cpu,
            "gpu" => DeviceKind::Gpu,
            other => {
                out.errors.push(err(K::UnknownDevice, other, at));
                continue;
            }
        };
        seen[kind.index()] += 1;
        if seen[kind.index()] == 2 {
            out.errors.push(err(K::DuplicateDevice, kind_token, at));
        }
        match parse_mb(value_token) {
            Ok(mb) => values[kind.index()] = Some(mb),
            Err(kind) => out.errors.push(err(kind, value_token, value_at)),
        }
    }
    for kind in DeviceKind::ALL {
        if seen[kind.index()] == 1 {
            if let Some(mb) = values[kind.index()] {
                out.config.set(kind, mb);
            }
        }
    }
    out
}

fn parse_mb(token: &str) -> Result<u64, CapacityParseErrorKind> {
    use CapacityParseErrorKind as K;
    if token.is_empty() {
        return Err(K::MissingValue);
    }
    let (negative, digits) = match token.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, token),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(K::NotANumber);
    }
    if negative {
        return Err(K::Negative);
    }
    match digits.parse::<u64>() {
        Ok(mb) if mb <= MAX_CAPACITY_MB => Ok(mb),
        _ => Err(K::TooLarge),
    }
}

/// `token` (found at byte `at`) without the ASCII whitespace around it, and where it starts.
fn trimmed(at: usize, token: &str) -> (usize, &str) {
    let start = token.len() - token.trim_ascii_start().len();
    (at + start, token.trim_ascii())
}

/// `s` split on `;`, each piece with its byte offset.
fn split_with_offsets(s: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        if b == b';' {
            out.push((start, &s[start..i]));
            start = i + 1;
        }
    }
    out.push((start, &s[start..]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use CapacityParseErrorKind as K;

    fn errors(s: &str) -> Vec<(K, String, usize)> {
        parse_capacity_config(s)
            .errors
            .into_iter()
            .map(|e| (e.kind, e.token, e.position))
            .collect()
    }

    #[test]
    fn valid_configurations() {
        let p = parse_capacity_config("cpu:10240;gpu:2048");
        assert!(p.errors.is_empty());
        assert_eq!(p.config.get(DeviceKind::Cpu), Some(10240));
        assert_eq!(p.config.get(DeviceKind::Gpu), Some(2048));
        let p = parse_capacity_config("gpu:0");
        assert_eq!(
            (p.config.get(DeviceKind::Cpu), p.config.get(DeviceKind::Gpu)),
            (None, Some(0))
        );
        assert_eq!(p.config.to_string(), "gpu:0");
    }

    #[test]
    fn every_bad_input_is_named_with_its_position() {
        assert_eq!(errors(""), vec![(K::Empty, "".into(), 0)]);
        assert_eq!(errors("npu:1"), vec![(K::UnknownDevice, "npu".into(), 0)]);
        assert_eq!(errors("cpu:ten"), vec![(K::NotANumber, "ten".into(), 4)]);
        assert_eq!(errors("cpu:10GB"), vec![(K::NotANumber, "10GB".into(), 4)]);
        assert_eq!(errors("cpu:1 0"), vec![(K::NotANumber, "1 0".into(), 4)]);
        assert_eq!(errors("cpu:-1"), vec![(K::Negative, "-1".into(), 4)]);
        assert_eq!(errors("cpu:"), vec![(K::MissingValue, "".into(), 4)]);
        assert_eq!(errors("cpu"), vec![(K::MissingColon, "cpu".into(), 0)]);
        assert_eq!(
            errors("cpu:99999999999999999999"),
            vec![(K::TooLarge, "99999999999999999999".into(), 4)]
        );
        assert_eq!(
            errors("gpu:17592186044416"),
            vec![(K::TooLarge, "17592186044416".into(), 4)]
        );
        assert_eq!(errors("cpu:1;;gpu:2"), vec![(K::EmptyField, "".into(), 6)]);
        assert_eq!(
            errors("cpu:1;"),
            vec![(K::TrailingSeparator, ";".into(), 5)]
        );
        assert_eq!(
            errors("cpu:1;cpu:2"),
            vec![(K::DuplicateDevice, "cpu".into(), 6)]
        );
        assert_eq!(errors("CPU:1"), vec![(K::UnknownDevice, "CPU".into(), 0)]);
    }

    #[test]
    fn spaces_around_fields_kinds_and_sizes_are_not_part_of_them() {
        for s in ["cpu:2; gpu:4", " cpu : 2 ;gpu:4 ", "cpu:2;\tgpu: 4"] {
            let p = parse_capacity_config(s);
            assert!(p.errors.is_empty(), "{s:?}: {:?}", p.errors);
            assert_eq!(p.config.get(DeviceKind::Cpu), Some(2), "{s:?}");
            assert_eq!(p.config.get(DeviceKind::Gpu), Some(4), "{s:?}");
        }
        // Positions point at the token itself, past the spaces.
        assert_eq!(
            errors("cpu:2; tpu:4"),
            vec![(K::UnknownDevice, "tpu".into(), 7)]
        );
        assert_eq!(errors("cpu:  x"), vec![(K::NotANumber, "x".into(), 6)]);
        assert_eq!(
            errors("cpu:1; "),
            vec![(K::TrailingSeparator, ";".into(), 5)]
        );
        assert_eq!(errors(" "), vec![(K::Empty, "".into(), 0)]);
    }

    #[test]
    fn a_bad_field_leaves_its_kind_at_default_and_keeps_the_others() {
        let p = parse_capacity_config("cpu:-1;gpu:512");
        assert_eq!(p.config.get(DeviceKind::Cpu), None);
        assert_eq!(p.config.get(DeviceKind::Gpu), Some(512));
        let p = parse_capacity_config("cpu:1;cpu:2;gpu:3");
        assert_eq!(
            p.config.get(DeviceKind::Cpu),
            None,
            "a duplicated kind is not used"
        );
        assert_eq!(p.config.get(DeviceKind::Gpu), Some(3));
        assert!(p.into_result().is_err());
    }

    #[test]
    fn messages_name_the_token_and_position() {
        let e = &parse_capacity_config("cpu:1;tpu:4").errors[0];
        let msg = e.to_string();
        assert!(msg.contains("`tpu`") && msg.contains("byte 6"), "{msg}");
    }
}
