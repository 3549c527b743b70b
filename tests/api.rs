//! The public API against the Rust API guidelines' checklist: every public type that should
//! be is `Send` and `Sync` and implements `Debug` (C-SEND-SYNC, C-DEBUG), builders that need
//! no argument have a `Default` (C-COMMON-TRAITS), and every public method of the facade
//! shows an example in its docs (C-EXAMPLE). rustdoc's coverage count does not see the
//! methods of types re-exported from private modules, so the last check reads the sources.

use runcache::constant::{
    AddError, Added, CapacityConfig, CapacityParseError, CapacityParseErrorKind, ConstantCache,
    ConstantCacheBuilder, ConstantKey, EnvReport, IdleParseError, ParsedCapacity,
};
use runcache::grouped::{ClearHold, GroupedCache, GroupedCacheBuilder, Owned, OwnerId};
use runcache::multi::MultiCache;
use runcache::pool::{
    PoolGuard, PoolManager, PoolManagerBuilder, PoolStats, Reserve, WhenExhausted,
};
use runcache::{
    AllocError, BuildError, Cache, CacheBuilder, Clock, ConfigError, ConstantBuffer, DeviceKind,
    Fetched, Handle, HostAllocator, InsertError, Lookup, ManualClock, Pinned, PoolError,
    RecursionError, RemovalCause, Source, Stats, WeakHandle, WhenFull,
};
use std::fmt::Debug;
use std::path::Path;

fn send_sync<T: Send + Sync>() {}
fn debug<T: Debug>() {}

type Grouped = GroupedCache<u32, u32, String, Vec<u8>>;
type GroupedBuilder = GroupedCacheBuilder<u32, u32, String, Vec<u8>>;

#[test]
fn the_public_types_are_send_and_sync_where_their_parameters_are() {
    send_sync::<Cache<String, Vec<u8>>>();
    send_sync::<CacheBuilder<String, Vec<u8>>>();
    send_sync::<Handle<Vec<u8>>>();
    send_sync::<WeakHandle<Vec<u8>>>();
    send_sync::<Fetched<Vec<u8>>>();
    send_sync::<Stats>();
    send_sync::<(WhenFull, Lookup, Source, RemovalCause)>();
    send_sync::<InsertError<String, Vec<u8>>>();
    send_sync::<RecursionError<String>>();
    send_sync::<BuildError<String, std::io::Error>>();
    send_sync::<ConfigError>();
    send_sync::<(Clock, ManualClock)>();
    send_sync::<ConstantCache>();
    send_sync::<(ConstantCacheBuilder, IdleParseError)>();
    send_sync::<GroupedBuilder>();
    send_sync::<ConstantBuffer>();
    send_sync::<(ConstantKey, DeviceKind, HostAllocator, AllocError)>();
    send_sync::<AddError<std::io::Error>>();
    send_sync::<Added>();
    send_sync::<(
        EnvReport,
        CapacityConfig,
        ParsedCapacity,
        CapacityParseError,
    )>();
    send_sync::<CapacityParseErrorKind>();
    send_sync::<Grouped>();
    send_sync::<OwnerId>();
    send_sync::<Owned<'static, u32, u32, String, Vec<u8>>>();
    send_sync::<ClearHold<'static, u32, u32, String, Vec<u8>>>();
    send_sync::<MultiCache>();
    send_sync::<PoolManager<Vec<u8>>>();
    send_sync::<PoolManagerBuilder<Vec<u8>>>();
    send_sync::<PoolGuard<'static, Vec<u8>>>();
    send_sync::<Reserve<'static, Vec<u8>>>();
    send_sync::<(PoolStats, PoolError, WhenExhausted)>();
    #[cfg(feature = "vulkan")]
    {
        use runcache::vulkan::*;
        send_sync::<VulkanContext>();
        send_sync::<VulkanAllocator>();
        send_sync::<VulkanAllocatorBuilder>();
        send_sync::<VulkanContextBuilder>();
        send_sync::<DeviceBuffer>();
        send_sync::<(MemoryReport, HeapBudget, ValidationLog, VulkanError)>();
    }
}

/// Compiles only for a type that is not `Send`: for a `Send` type both impls apply and the
/// call below is ambiguous (the trick `static_assertions::assert_not_impl_any!` uses).
trait AmbiguousIfSend<A> {
    fn not_send() {}
}
impl<T: ?Sized> AmbiguousIfSend<()> for T {}
impl<T: ?Sized + Send> AmbiguousIfSend<u8> for T {}

/// As `AmbiguousIfSend`, for `Sync`.
trait AmbiguousIfSync<A> {
    fn not_sync() {}
}
impl<T: ?Sized> AmbiguousIfSync<()> for T {}
impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}

#[test]
fn a_pinned_cache_and_a_pool_guard_of_a_thread_bound_pool_stay_on_their_thread() {
    // `Pinned` holds this thread's epoch pin: it may be neither sent nor shared.
    <Pinned<'static, u32, u32> as AmbiguousIfSend<_>>::not_send();
    <Pinned<'static, u32, u32> as AmbiguousIfSync<_>>::not_sync();
    // A guard hands out `&mut P`: it is not `Send` when the pool is not.
    <PoolGuard<'static, std::rc::Rc<u8>> as AmbiguousIfSend<_>>::not_send();
    debug::<Pinned<'static, u32, u32>>();
}

#[test]
fn every_public_type_implements_debug() {
    debug::<Cache<String, Vec<u8>>>();
    debug::<CacheBuilder<String, Vec<u8>>>();
    debug::<Handle<Vec<u8>>>();
    debug::<WeakHandle<Vec<u8>>>();
    debug::<Fetched<Vec<u8>>>();
    debug::<(Stats, WhenFull, Lookup, Source, RemovalCause, ConfigError)>();
    debug::<InsertError<String, Vec<u8>>>();
    debug::<RecursionError<String>>();
    debug::<BuildError<String, std::io::Error>>();
    debug::<(Clock, ManualClock, ConstantCacheBuilder, IdleParseError)>();
    debug::<GroupedBuilder>();
    debug::<(
        ConstantCache,
        ConstantBuffer,
        ConstantKey,
        DeviceKind,
        HostAllocator,
    )>();
    debug::<(
        AllocError,
        AddError<std::io::Error>,
        Added,
        EnvReport,
        CapacityConfig,
    )>();
    debug::<(ParsedCapacity, CapacityParseError, CapacityParseErrorKind)>();
    debug::<(Grouped, OwnerId, MultiCache)>();
    debug::<Owned<'static, u32, u32, String, Vec<u8>>>();
    debug::<ClearHold<'static, u32, u32, String, Vec<u8>>>();
    debug::<(PoolManager<Vec<u8>>, PoolManagerBuilder<Vec<u8>>, PoolStats)>();
    debug::<(PoolGuard<'static, Vec<u8>>, Reserve<'static, Vec<u8>>)>();
    debug::<(PoolError, WhenExhausted)>();
}

#[test]
fn builders_that_need_no_argument_have_a_default() {
    let built = CacheBuilder::<u32, u32>::default()
        .capacity(3)
        .build()
        .unwrap();
    assert_eq!(built.capacity(), 3);
    let (a, b): (Stats, PoolStats) = Default::default();
    assert_eq!((a.hits, b.created), (0, 0));
    assert_eq!(WhenFull::default(), WhenFull::Evict);
    assert_eq!(WhenExhausted::default(), WhenExhausted::Wait);
    assert_eq!(
        MultiCache::default().capacity(),
        runcache::multi::DEFAULT_CAPACITY
    );
}

/// The public methods (`pub fn`, `pub async fn`, `pub const fn`) of one source file whose
/// doc comment has no code block, by name. Items marked `#[doc(hidden)]` are not public API.
fn methods_without_examples(source: &str) -> Vec<String> {
    let lines: Vec<&str> = source.lines().collect();
    let mut missing = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let item = line.trim_start();
        let Some(rest) = [
            "pub fn ",
            "pub async fn ",
            "pub const fn ",
            "pub unsafe fn ",
        ]
        .iter()
        .find_map(|p| item.strip_prefix(p)) else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let mut docs = Vec::new();
        let mut hidden = false;
        for above in lines[..i].iter().rev().map(|l| l.trim_start()) {
            if above.starts_with("///") {
                docs.push(above);
            } else if above.starts_with("#[") {
                hidden |= above.starts_with("#[doc(hidden)]");
            } else {
                break;
            }
        }
        if !hidden
            && !docs
                .iter()
                .any(|d| d.trim_start_matches('/').trim_start().starts_with("```"))
        {
            missing.push(name);
        }
    }
    missing
}

#[test]
fn the_example_check_tells_a_method_with_an_example_from_one_without() {
    let source = "impl X {\n    /// Shown.\n    ///\n    /// ```\n    /// x.shown();\n    /// ```\n    #[inline]\n    pub fn shown(&self) {}\n\n    /// Not shown.\n    pub fn bare(&self) {}\n\n    /// For tests.\n    #[doc(hidden)]\n    pub fn __hidden(&self) {}\n\n    pub(crate) fn private(&self) {}\n}\n";
    assert_eq!(methods_without_examples(source), ["bare"]);
}

#[test]
fn every_public_method_of_the_facade_shows_an_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = [
        "src/cache/mod.rs",
        "src/cache/builder.rs",
        "src/cache/outcome.rs",
        "src/cache/future.rs",
        "src/cache/pinned.rs",
        "src/cache/size.rs",
        "src/raw/handle.rs",
        "src/raw/expire/mod.rs",
        "src/raw/expire/clock.rs",
        "src/error.rs",
        "src/policy/tuning.rs",
        "src/constant/mod.rs",
        "src/constant/builder.rs",
        "src/constant/global.rs",
        "src/constant/key.rs",
    ];
    let mut missing = Vec::new();
    for file in files {
        let source =
            std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        missing.extend(
            methods_without_examples(&source)
                .into_iter()
                .map(|m| format!("{file}: {m}")),
        );
    }
    assert!(
        missing.is_empty(),
        "public methods without a doc example: {missing:#?}"
    );
}
