//! The process-wide constant caches, one per device kind, sized on first use from
//! `RUNCACHE_CONSTANT_CACHE_CAPACITY` (and given an idle time by
//! `RUNCACHE_CONSTANT_CACHE_IDLE_SECS`), and the functions that read and set them.

#![forbid(unsafe_code)]

use super::{
    parse_capacity_config, ConstantCache, DeviceKind, ParsedCapacity, ENV_VAR, IDLE_ENV_VAR, MIB,
};
use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

/// What the process-wide caches found in the environment on first use.
///
/// ```
/// use runcache::constant::{self, DeviceKind};
///
/// // Read once, on first use of a process-wide cache.
/// let report = constant::env_report();
/// match &report.value {
///     None => assert!(report.parsed.errors.is_empty()),
///     Some(value) => {
///         for e in &report.parsed.errors {
///             eprintln!("{}={value}: {e}", constant::ENV_VAR);
///         }
///     }
/// }
/// assert_eq!(report.parsed.config.get(DeviceKind::Cpu), constant::env_capacity_mb(DeviceKind::Cpu));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnvReport {
    /// The variable's value, if it was set (lossily decoded if it was not UTF-8).
    pub value: Option<String>,
    /// What was applied and what was wrong (empty when the variable was unset).
    pub parsed: ParsedCapacity,
    /// [`IDLE_ENV_VAR`]'s value, if it was set.
    pub idle_value: Option<String>,
    /// The idle time it gave every process-wide cache (`None`: none, buffers stay until
    /// evicted or removed), or what was wrong with it (then none either).
    pub idle: Result<Option<Duration>, IdleParseError>,
}

impl Default for EnvReport {
    fn default() -> Self {
        Self {
            value: None,
            parsed: ParsedCapacity::default(),
            idle_value: None,
            idle: Ok(None),
        }
    }
}

/// What was wrong with [`IDLE_ENV_VAR`]: the process-wide caches then keep buffers with no
/// idle time, as if it were unset.
///
/// ```
/// use runcache::constant::{parse_idle_secs, IdleParseError};
/// use std::time::Duration;
///
/// assert_eq!(parse_idle_secs(" 600 "), Ok(Duration::from_secs(600)));
/// assert_eq!(parse_idle_secs("ten"), Err(IdleParseError::NotANumber("ten".into())));
/// assert_eq!(parse_idle_secs("0"), Err(IdleParseError::Zero));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdleParseError {
    /// Not a whole number of seconds (the value, trimmed).
    NotANumber(String),
    /// Zero, which would take every buffer out as soon as it was cached; unset the variable
    /// for no idle time.
    Zero,
}

impl fmt::Display for IdleParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotANumber(v) => write!(f, "`{v}` is not a whole number of seconds"),
            Self::Zero => f.write_str(
                "0 seconds would take every buffer out as soon as it is cached (unset it for none)",
            ),
        }
    }
}

impl std::error::Error for IdleParseError {}

/// The idle time [`IDLE_ENV_VAR`] gives, from its value: whole seconds, spaces around
/// allowed, above 0.
///
/// # Errors
/// [`IdleParseError`] for anything else.
///
/// ```
/// use runcache::constant::parse_idle_secs;
/// use std::time::Duration;
///
/// assert_eq!(parse_idle_secs("3600"), Ok(Duration::from_secs(3600)));
/// assert!(parse_idle_secs("-1").is_err());
/// ```
pub fn parse_idle_secs(value: &str) -> Result<Duration, IdleParseError> {
    let v = value.trim();
    match v.parse::<u64>() {
        Ok(0) => Err(IdleParseError::Zero),
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => Err(IdleParseError::NotANumber(v.to_string())),
    }
}

struct Global {
    caches: [ConstantCache; 2],
    env: EnvReport,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();

fn global() -> &'static Global {
    GLOBAL.get_or_init(|| {
        let value = std::env::var_os(ENV_VAR).map(|v| v.to_string_lossy().into_owned());
        let parsed = value
            .as_deref()
            .map(parse_capacity_config)
            .unwrap_or_default();
        for e in &parsed.errors {
            log::warn!("{ENV_VAR}: {e}; {}", e.consequence());
        }
        let idle_value = std::env::var_os(IDLE_ENV_VAR).map(|v| v.to_string_lossy().into_owned());
        let idle = idle_value.as_deref().map(parse_idle_secs).transpose();
        if let Err(e) = &idle {
            log::warn!("{IDLE_ENV_VAR}: {e}; the process-wide caches keep no idle time");
        }
        let make = |kind: DeviceKind| {
            let mb = parsed.config.get(kind).unwrap_or(0);
            let builder = ConstantCache::builder(kind).capacity_bytes(mb.saturating_mul(MIB));
            match idle {
                Ok(Some(idle)) => builder.time_to_idle(idle),
                _ => builder,
            }
            .build()
        };
        Global {
            caches: [make(DeviceKind::Cpu), make(DeviceKind::Gpu)],
            env: EnvReport {
                value,
                parsed,
                idle_value,
                idle,
            },
        }
    })
}

/// The process-wide constant cache of `kind`.
///
/// ```
/// use runcache::constant::{self, ConstantKey, DeviceKind};
/// use runcache::ConstantBuffer;
///
/// constant::set_capacity_mb(DeviceKind::Cpu, 64); // or RUNCACHE_CONSTANT_CACHE_CAPACITY=cpu:64
/// let weights = constant::cache(DeviceKind::Cpu);
/// let added = weights.get_or_add(ConstantKey::new(0, 1), 128, || ConstantBuffer::host(128)).unwrap();
/// assert!(runcache::Handle::ptr_eq(&added.buffer, &constant::cache(DeviceKind::Cpu).get(ConstantKey::new(0, 1)).unwrap()));
/// ```
pub fn cache(kind: DeviceKind) -> &'static ConstantCache {
    &global().caches[kind.index()]
}

/// What the process-wide caches read from `RUNCACHE_CONSTANT_CACHE_CAPACITY`, errors included.
///
/// ```
/// use runcache::constant;
///
/// let report = constant::env_report();
/// if report.value.is_none() {
///     assert_eq!(report.parsed, Default::default(), "unset: nothing applied, nothing wrong");
/// }
/// ```
pub fn env_report() -> &'static EnvReport {
    &global().env
}

/// The capacity the environment variable set for `kind`, in MiB, if it set one.
///
/// ```
/// use runcache::constant::{self, DeviceKind};
///
/// // Whatever the environment said, an explicit setting wins.
/// let from_env = constant::env_capacity_mb(DeviceKind::Gpu);
/// constant::set_capacity_mb(DeviceKind::Gpu, 512);
/// assert_eq!(constant::capacity_mb(DeviceKind::Gpu), 512);
/// assert_eq!(constant::env_capacity_mb(DeviceKind::Gpu), from_env, "the report does not change");
/// ```
pub fn env_capacity_mb(kind: DeviceKind) -> Option<u64> {
    global().env.parsed.config.get(kind)
}

/// Sets the capacity of the process-wide cache of `kind`, in MiB (overrides the environment);
/// `Err` as [`ConstantCache::set_capacity_bytes`](super::ConstantCache::set_capacity_bytes).
///
/// ```
/// use runcache::constant::{self, DeviceKind};
///
/// constant::set_capacity_mb(DeviceKind::Cpu, 1024)?;
/// assert_eq!(constant::cache(DeviceKind::Cpu).capacity(), 1 << 30);
/// # Ok::<(), runcache::CapacityError>(())
/// ```
pub fn set_capacity_mb(kind: DeviceKind, mb: u64) -> Result<(), crate::error::CapacityError> {
    cache(kind).set_capacity_mb(mb)
}

/// The capacity of the process-wide cache of `kind`, in MiB.
///
/// ```
/// use runcache::constant::{self, DeviceKind};
///
/// constant::set_capacity_mb(DeviceKind::Cpu, 10);
/// assert_eq!(constant::capacity_mb(DeviceKind::Cpu), 10);
/// ```
pub fn capacity_mb(kind: DeviceKind) -> u64 {
    cache(kind).capacity_mb()
}

/// The legacy switch: `true` sets every process-wide cache to unlimited capacity, `false`
/// to 0 (clear and off). Every kind is set; the first kind whose shrink stopped short is
/// reported (see [`ConstantCache::set_capacity_bytes`](super::ConstantCache::set_capacity_bytes)).
///
/// ```
/// use runcache::constant::{self, DeviceKind};
///
/// constant::set_enabled(false)?;
/// assert!(!constant::is_enabled());
/// assert_eq!(constant::capacity_mb(DeviceKind::Gpu), 0);
/// constant::set_enabled(true)?;
/// assert_eq!(constant::cache(DeviceKind::Cpu).capacity(), u64::MAX);
/// # Ok::<(), runcache::CapacityError>(())
/// ```
pub fn set_enabled(enabled: bool) -> Result<(), crate::error::CapacityError> {
    let bytes = if enabled { u64::MAX } else { 0 };
    DeviceKind::ALL
        .iter()
        .map(|kind| cache(*kind).set_capacity_bytes(bytes))
        .fold(Ok(()), Result::and)
}

/// Whether any process-wide cache has a capacity above 0.
///
/// ```
/// use runcache::constant::{self, DeviceKind};
///
/// constant::set_enabled(false);
/// constant::set_capacity_mb(DeviceKind::Cpu, 1);
/// assert!(constant::is_enabled(), "one kind with a capacity is enough");
/// ```
pub fn is_enabled() -> bool {
    DeviceKind::ALL.iter().any(|k| cache(*k).capacity() > 0)
}
