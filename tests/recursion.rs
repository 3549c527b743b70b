//! A blocking build that asks for its own key would wait for itself. The fallible forms
//! return the recursion error with the key, as the async forms do; the forms with no error
//! to return panic, and the panic names the caller's line, not one inside the crate. The
//! panics are checked in one test: it installs a panic hook, which is process-wide.

use runcache::constant::{AddError, ConstantCache, ConstantKey};
use runcache::grouped::GroupedCache;
use runcache::multi::MultiCache;
use runcache::{BuildError, Cache, ConstantBuffer, DeviceKind};
use std::panic::{catch_unwind, Location, RefUnwindSafe};
use std::sync::Mutex;

static WHERE: Mutex<Option<(String, u32)>> = Mutex::new(None);

#[test]
fn the_recursion_panic_names_the_callers_line() {
    std::panic::set_hook(Box::new(|info| {
        *WHERE.lock().unwrap() = info.location().map(|l| (l.file().to_string(), l.line()));
    }));
    let cache = Cache::<u32, u32>::new(10);
    let multi = MultiCache::new(10);
    let grouped: GroupedCache<u32, u32, u32, u32> = GroupedCache::new(0);
    // Each outer call builds key 1 and its build asks for key 1 again, by the form named.
    let forms: [(&str, &(dyn Fn() -> u32 + RefUnwindSafe)); 5] = [
        ("Cache::get_or_insert_with", &|| {
            *cache.get_or_insert_with(1, || *cache.get_or_insert_with(1, || 0))
        }),
        ("Cache::get_or_create", &|| {
            *cache
                .get_or_create(&1, |_| *cache.get_or_create(&1, |_| 0).0)
                .0
        }),
        ("MultiCache::get_or_create", &|| {
            *multi
                .get_or_create(&1u32, |_| *multi.get_or_create(&1u32, |_| 0u32).0)
                .0
        }),
        ("MultiCache::get_or_create_opt", &|| {
            let inner = || {
                multi
                    .get_or_create_opt(&2u32, |_| Some(0u32))
                    .map(|(v, _)| *v)
            };
            multi
                .get_or_create_opt(&2u32, |_| inner())
                .map_or(0, |(v, _)| *v)
        }),
        ("GroupedCache::get_or_insert_with", &|| {
            *grouped
                .get_or_insert_with(&1, &1, &1, || *grouped.get_or_insert_with(&1, &1, &1, || 0))
        }),
    ];
    for (name, call) in forms {
        // Every inner call is written on the line below its outer call's closure start.
        let outer = catch_unwind(call);
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
        assert!(at < Location::caller().line(), "{name}: line {at}");
    }
    assert!(!cache.contains_key(&1), "the failed builds cached nothing");
    assert!(multi.remove::<u32, u32>(&1).is_none() && multi.remove::<u32, u32>(&2).is_none());
    assert!(grouped.get(&1, &1, &1).is_none());
    let _ = std::panic::take_hook();
}

#[test]
fn a_fallible_blocking_build_that_asks_for_its_own_key_gets_it_back() {
    let cache = Cache::<String, u32>::new(10);
    let key = || "self".to_string();
    let outer = cache.try_get_or_insert_with(key(), || {
        match cache.try_get_or_insert_with(key(), || Ok::<_, ()>(0)) {
            Err(BuildError::Recursion(r)) => Ok::<_, ()>(r.into_key().len() as u32),
            other => panic!("expected the recursion error, got {other:?}"),
        }
    });
    assert_eq!(
        *outer.unwrap(),
        4,
        "the outer build goes on with the key handed back"
    );

    let outer = cache.get_or_build(key() + "2", |k| {
        let inner = cache.get_or_build(k.clone(), |_| Ok::<_, ()>(0));
        Ok::<_, ()>(u32::from(
            matches!(inner, Err(BuildError::Recursion(ref r)) if r.key == *k),
        ))
    });
    assert_eq!(*outer.unwrap().value, 1);

    let multi = MultiCache::new(10);
    let outer = multi.try_get_or_create(&7u64, |k| {
        let inner = multi.try_get_or_create(k, |_| Ok::<u8, ()>(0));
        Ok::<u8, ()>(u8::from(
            matches!(inner, Err(BuildError::Recursion(ref r)) if r.key == 7),
        ))
    });
    assert_eq!(*outer.unwrap().0, 1);

    let constants = ConstantCache::with_capacity_bytes(DeviceKind::Cpu, 1 << 20);
    let k = ConstantKey::new(0, 1);
    let outer = constants.get_or_add(k, 64, || {
        let inner = constants.get_or_add(k, 64, || ConstantBuffer::host(64));
        match inner {
            Err(err) => assert!(
                matches!(*err, AddError::Recursion { key } if key == k),
                "{err}"
            ),
            Ok(_) => panic!("the inner call cannot wait for the outer build"),
        }
        ConstantBuffer::host(64)
    });
    assert!(outer.is_ok());
    assert_eq!(constants.len(), 1, "the outer build is cached");
}
