//! A lock-free concurrent cache for high-concurrency runtimes.
//!
//! runcache holds what is expensive to build and shared by many threads: compiled kernels keyed
//! by shapes and parameters, constant tensors, memory pools. Reads take no lock and write no
//! shared memory; a missing value is built by exactly one caller while the others wait for it;
//! and a weighted budget holds exactly at every instant.
//!
//! # Usage
//!
//! ```
//! use runcache::{Cache, Handle};
//!
//! // A kernel cache of at most 1,000 entries.
//! let kernels: Cache<(String, Vec<usize>), String> = Cache::new(1_000);
//!
//! let key = ("matmul".to_string(), vec![128, 768]);
//! let kernel: Handle<String> = kernels.get_or_insert_with(key.clone(), || {
//!     // Runs once, however many threads ask for this key at the same moment.
//!     format!("compiled {} for {:?}", key.0, key.1)
//! });
//! assert_eq!(kernels.get(&key).as_deref(), Some(&*kernel));
//! ```
//!
//! Values are handed out as [`Handle`]s, the cache's own counted handle (it works like an
//! `Arc`): what a caller holds stays alive after the entry is removed, replaced or evicted.
//!
//! # Guards and pinning
//!
//! [`Cache::get`] takes one more count of the value (one atomic increment);
//! [`Cache::get_cloned`] clones the value out instead. For hot loops, [`Cache::pin`] pins
//! the cache's epoch once and returns a [`Pinned`] handle whose `get` returns `&V` with no
//! reference-count write at all:
//!
//! ```
//! # use runcache::Cache;
//! let cache: Cache<u64, u64> = Cache::new(100);
//! cache.insert(7, 49).unwrap();
//! let pinned = cache.pin();
//! let sum: u64 = (0..10).filter_map(|k| pinned.get(&k)).sum();
//! assert_eq!(sum, 49);
//! ```
//!
//! The same handle iterates: [`Pinned::iter`] yields every entry cached throughout the
//! iteration exactly once, whatever other threads do to the cache meanwhile, and
//! [`Cache::retain`] removes the entries a predicate refuses (all the kernels of a session
//! that ended, say).
//!
//! Memory of removed entries is reclaimed with [crossbeam-epoch], with one collector per cache,
//! once no pin of the time of removal is left. Hold a `Pinned` for a batch of reads, not for
//! the life of a thread.
//!
//! # Single flight
//!
//! [`Cache::get_or_insert_with`], [`Cache::try_get_or_insert_with`], [`Cache::get_or_create`]
//! and [`Cache::get_or_build`] run the builder at most once per key at a time. The other
//! callers park on the entry's state word (a futex, through [atomic-wait]) and wake when it is
//! ready. A failed build is returned to its caller and to everyone who waited on that attempt,
//! and is not cached. A panicking build releases the entry and one waiter takes the build over.
//!
//! ```
//! # use runcache::Cache;
//! let cache: Cache<&str, u32> = Cache::new(10);
//! let err = cache.try_get_or_insert_with("bad", || "no such kernel".parse::<u32>());
//! assert!(err.is_err());
//! assert!(!cache.contains_key("bad")); // nothing cached; the next call builds again
//! ```
//!
//! # Size accounting
//!
//! Each entry has a weight (1 by default; see [`CacheBuilder::weigher`]). An entry's weight is
//! reserved before the entry is published, and the size and the capacity share one atomic
//! word, so [`Cache::weighted_size`] `<=` [`Cache::capacity`] at every instant, under any
//! concurrency. When an entry does not fit, an evicting cache (the default, [`WhenFull::Evict`])
//! evicts by policy until it does; a rejecting one ([`WhenFull::Reject`]) does not cache it:
//! `insert` hands it back in an [`InsertError`], and the `get_or_*` methods return the built
//! value uncached. An entry heavier than the whole capacity is always refused.
//!
//! # Eviction
//!
//! The evicting policy is S3-FIFO with TinyLFU's admission duel: new entries enter a small
//! FIFO; entries hit there (or remembered from a recent eviction) move to the main FIFO and
//! the others leave; once the main FIFO is full, such an entry takes the place of the main
//! FIFO's victim only if a frequency sketch says it is used more often. A
//! one-pass scan or a loop larger than the cache therefore does not flush frequently used
//! entries. A newcomer heavier than the small FIFO is judged before it takes any room: it is
//! cached only if the sketch counts it more often than the entries it would displace,
//! together, and otherwise handed back uncached. A hit writes the entry's frequency byte only
//! while it can still grow (nothing shared); entries being built are never evicted, nor
//! entries of weight 0; shrinking the capacity evicts in policy order. An
//! [`on_evict`](CacheBuilder::on_evict) listener hears every removal with its
//! [`RemovalCause`].
//!
//! ```
//! # use runcache::Cache;
//! let blobs = Cache::<u32, Vec<u8>>::builder()
//!     .capacity(1024) // bytes
//!     .when_full(runcache::WhenFull::Reject) // the default evicts instead
//!     .weigher(|_, v: &Vec<u8>| v.len() as u64)
//!     .build()
//!     .unwrap();
//! blobs.insert(1, vec![0; 1000]).unwrap();
//! let refused = blobs.insert(2, vec![0; 100]).unwrap_err();
//! assert_eq!(refused.weight, 100);
//! let (key, value) = refused.into_inner(); // nothing is lost
//! assert_eq!((key, value.len()), (2, 100));
//! assert!(blobs.weighted_size() <= blobs.capacity());
//! ```
//!
//! # Consistency
//!
//! Every operation on one key is linearizable. `len`, `weighted_size` and `stats` are sums of
//! atomics: exact once the cache is quiet, approximate while operations are in flight. A
//! [`Pinned`] handle adds its lookups to `stats` when it drops, so "quiet" includes having no
//! `Pinned` alive. `clear` and capacity shrinks do not touch entries whose build is in flight.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `vulkan` | no | the `vulkan` module: GPU constant buffers in Vulkan device memory (ash, loaded at run time, and gpu-allocator) |
//!
//! Everything else (the core cache, the constant, grouped and multi caches, the pool manager)
//! is always built.
//!
//! # Layers
//!
//! - [`constant`]: per-device constant tensor caches with byte budgets in MiB, environment
//!   configuration (`RUNCACHE_CONSTANT_CACHE_CAPACITY`), and reference-counted
//!   [`ConstantBuffer`]s made through a [`BufferAllocator`].
//! - [`grouped`]: session → input-shape group → name, evicting whole groups oldest-first
//!   (PaddlePaddle's MKL-DNN blob cache), with per-owner clearing.
//! - [`multi`]: one evicting cache per key type (OpenVINO's runtime parameters cache), for
//!   all threads at once.
//! - [`pool`]: a lock-free manager of reusable memory pools for cached objects' scratch
//!   memory.
//!
//! # Guide
//!
//! [`guide`] answers a user's questions: which read form to use, sizing and weighing,
//! evicting or rejecting, what a held value costs after eviction, threads and async, the
//! layers and the designs they come from, and how runcache compares with moka, quick_cache
//! and papaya. The repository's `examples/` are short programs that run in seconds.
//!
//! # Performance
//!
//! See `docs/BENCHMARKS.md` and the criterion benches in `benches/benches/`, which measure runcache
//! against papaya, quick_cache, moka and an unsynchronized `HashMap` in the same run.
//!
//! [crossbeam-epoch]: https://docs.rs/crossbeam-epoch
//! [atomic-wait]: https://docs.rs/atomic-wait

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(unsafe_op_in_unsafe_fn)]
// Unsafe code only where a module says so (`#![allow(unsafe_code)]`: the engine, and the
// layers' own unsafe parts); every other module forbids it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod cache;
pub mod constant;
mod error;
pub mod grouped;
pub mod multi;
mod policy;
pub mod pool;
mod raw;
mod sync;
#[cfg(feature = "vulkan")]
#[cfg_attr(docsrs, doc(cfg(feature = "vulkan")))]
pub mod vulkan;

pub use cache::{
    Cache, CacheBuilder, Clock, DefaultHashBuilder, Expiry, Fetched, Handle, Lookup, ManualClock,
    Pinned, RemovalCause, Source, Stats, WeakHandle, WhenFull, MAX_SHARDS,
};
pub use constant::{
    AddError, AllocError, BufferAllocator, CapacityParseError, ConstantBuffer, DeviceKind,
    DeviceMemory, HostAllocator,
};
/// Lookups by a borrowed form of the key: any type that hashes as the key does and compares
/// equal to it (the `equivalent` crate's trait, as hashbrown and indexmap take it). Every
/// type the key borrows as (`K: Borrow<Q>`) is one already.
///
/// ```
/// use runcache::{Cache, Equivalent};
/// use std::hash::{Hash, Hasher};
///
/// // A kernel keyed by its name and input shape, looked up without building an owned key.
/// let kernels: Cache<(String, Vec<usize>), &str> = Cache::new(100);
/// kernels.put(("conv".to_string(), vec![1, 3, 224, 224]), "compiled").unwrap();
///
/// struct Probe<'a>(&'a str, &'a [usize]);
/// impl Hash for Probe<'_> {
///     fn hash<H: Hasher>(&self, state: &mut H) {
///         // As the tuple hashes: its fields in order (`String` as `str`, `Vec` as a slice).
///         self.0.hash(state);
///         self.1.hash(state);
///     }
/// }
/// impl Equivalent<(String, Vec<usize>)> for Probe<'_> {
///     fn equivalent(&self, key: &(String, Vec<usize>)) -> bool {
///         self.0 == key.0 && self.1 == key.1.as_slice()
///     }
/// }
/// assert_eq!(kernels.get(&Probe("conv", &[1, 3, 224, 224])).as_deref(), Some(&"compiled"));
/// assert!(!kernels.contains_key(&Probe("conv", &[1, 3, 112, 112])));
/// ```
pub use equivalent::Equivalent;
pub use error::{BuildError, CapacityError, ConfigError, InsertError, RecursionError};
#[cfg(feature = "tuning")]
#[cfg_attr(docsrs, doc(cfg(feature = "tuning")))]
pub use policy::{Tuning, TuningError};
pub use pool::PoolError;
#[cfg(feature = "vulkan")]
#[cfg_attr(docsrs, doc(cfg(feature = "vulkan")))]
pub use vulkan::VulkanError;

/// Ends the calling modelled thread's registrations with every cache, exactly as thread-local
/// destruction does when a real thread exits.
///
/// Only for the loom models: loom runs thread-local destructors at a point where
/// crossbeam-epoch's participant finalization does not release its collector (shown with
/// crossbeam-epoch alone), so each modelled thread calls this as its last action.
#[cfg(runcache_loom)]
#[doc(hidden)]
pub fn __loom_thread_exit() {
    raw::epoch::release_thread();
}

/// The user's guide (`docs/GUIDE.md` in the repository), here so that it travels with the
/// API docs.
#[doc = include_str!("../docs/GUIDE.md")]
pub mod guide {}

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
