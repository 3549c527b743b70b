//! A blocking build that asks for its own key panics (waiting would wait for itself), and
//! the panic names the caller's line, not one inside the crate. One test in its own binary:
//! it installs a panic hook, which is process-wide.

use runcache::Cache;
use std::panic::{catch_unwind, Location};
use std::sync::Mutex;

static WHERE: Mutex<Option<(String, u32)>> = Mutex::new(None);

#[test]
fn the_recursion_panic_names_the_callers_line() {
    std::panic::set_hook(Box::new(|info| {
        *WHERE.lock().unwrap() = info.location().map(|l| (l.file().to_string(), l.line()));
    }));
    let cache = Cache::<u32, u32>::new(10);
    let blocking: [(&str, &(dyn Fn() -> u32 + std::panic::RefUnwindSafe)); 3] = [
        ("get_or_insert_with", &|| *cache.get_or_insert_with(1, || 0)),
        ("try_get_or_insert_with", &|| {
            *cache.try_get_or_insert_with(1, || Ok::<_, ()>(0)).unwrap()
        }),
        ("get_or_create", &|| *cache.get_or_create(&1, |_| 0).0),
    ];
    for (name, inner) in blocking {
        let line = Location::caller().line() + 1;
        let outer = catch_unwind(|| cache.get_or_insert_with(1, inner));
        let err = outer.expect_err(name);
        let message = err.downcast_ref::<&str>().copied().unwrap_or_default();
        assert!(
            message.contains("same key it is building"),
            "{name}: {message}"
        );
        let (file, at) = WHERE
            .lock()
            .unwrap()
            .take()
            .expect("the hook saw the panic");
        assert!(
            file.ends_with("recursion.rs"),
            "{name}: panicked at {file}:{at}"
        );
        // The inner call is on the line of the closure that made it, above the outer one.
        assert!(at < line, "{name}: line {at}");
        assert!(!cache.contains_key(&1), "the failed build cached nothing");
    }
    let _ = std::panic::take_hook();
}
