//! The process-wide constant caches read `RUNCACHE_CONSTANT_CACHE_CAPACITY` and
//! `RUNCACHE_CONSTANT_CACHE_IDLE_SECS` once, on first use. This file is its own test binary (its own process), so the variable can be set before
//! that first use; it holds one test so that nothing else touches the caches first.

use runcache::constant::{self, CapacityParseErrorKind, ENV_VAR, IDLE_ENV_VAR};
use runcache::DeviceKind;
use std::sync::Mutex;
use std::time::Duration;

/// A `log` backend that keeps every warning.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push(record.args().to_string());
    }
    fn flush(&self) {}
}

static LOG: Capture = Capture(Mutex::new(Vec::new()));

#[test]
fn the_environment_is_read_once_bad_fields_are_reported_and_the_api_overrides_it() {
    log::set_logger(&LOG).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    std::env::set_var(ENV_VAR, "gpu:64;npu:3;cpu:-1");
    std::env::set_var(IDLE_ENV_VAR, " 600 ");

    // The good field applies; each bad one leaves its kind at the default (0).
    assert_eq!(constant::capacity_mb(DeviceKind::Gpu), 64);
    assert_eq!(constant::capacity_mb(DeviceKind::Cpu), 0);
    let report = constant::env_report();
    assert_eq!(report.value.as_deref(), Some("gpu:64;npu:3;cpu:-1"));
    let kinds: Vec<_> = report
        .parsed
        .errors
        .iter()
        .map(|e| (e.kind, e.position))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (CapacityParseErrorKind::UnknownDevice, 7),
            (CapacityParseErrorKind::Negative, 17)
        ]
    );

    // The idle time applies to every kind.
    assert_eq!(report.idle_value.as_deref(), Some(" 600 "));
    assert_eq!(report.idle, Ok(Some(Duration::from_secs(600))));
    for kind in DeviceKind::ALL {
        assert_eq!(
            constant::cache(kind).time_to_idle(),
            Some(Duration::from_secs(600))
        );
    }

    // Reported once through `log`, however often the caches are used.
    for _ in 0..3 {
        constant::cache(DeviceKind::Cpu).size();
    }
    let logged = LOG.0.lock().unwrap().clone();
    assert_eq!(logged.len(), 2, "{logged:?}");
    assert!(
        logged[0].contains("`npu`") && logged[0].contains(ENV_VAR),
        "{logged:?}"
    );

    // Read once: a later change of the variable has no effect; the functional API overrides.
    std::env::set_var(ENV_VAR, "cpu:1");
    assert_eq!(constant::capacity_mb(DeviceKind::Cpu), 0);
    constant::set_capacity_mb(DeviceKind::Cpu, 16).unwrap();
    assert_eq!(constant::capacity_mb(DeviceKind::Cpu), 16);

    // The legacy switch.
    constant::set_enabled(false).unwrap();
    assert!(!constant::is_enabled());
    assert_eq!(constant::capacity_mb(DeviceKind::Gpu), 0);
    constant::set_enabled(true).unwrap();
    assert!(constant::is_enabled());
    assert_eq!(constant::cache(DeviceKind::Cpu).capacity(), u64::MAX);
}
