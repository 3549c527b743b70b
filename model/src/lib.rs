//! Operation sequences and sequential models shared by runcache's fuzz targets (`fuzz/`) and
//! property tests (`model/tests/`).
//!
//! Each module has an `Arbitrary` input (a configuration and a list of operations) and a
//! `run` function that applies it to one runcache layer and to a sequential model, compares
//! every return value and the state after every step (including the cache's own invariant
//! check, `Cache::__validate`), and says what differed. The fuzz targets decode the input from
//! libFuzzer's bytes; the property tests decode it from proptest's bytes, so both explore the
//! same operations and shrink or minimize in the same terms.
//!
//! No operation here panics on purpose: libFuzzer aborts on any panic, caught or not. Panicking
//! builders and weighers are covered by `tests/faults.rs`, and by [`lin`], which the fuzz
//! targets do not use: it runs real threads and checks their histories for linearizability.

pub mod cache;
pub mod config;
pub mod evicting;
pub mod expiring;
pub mod flight;
pub mod grouped;
pub mod lin;
pub mod multi;

/// What a run found: `Err` names the step, the operation and what differed.
pub type Outcome = Result<(), String>;

/// Decodes an input from raw bytes, the way the fuzz targets do.
pub fn decode<'a, T: arbitrary::Arbitrary<'a>>(bytes: &'a [u8]) -> Option<T> {
    T::arbitrary_take_rest(arbitrary::Unstructured::new(bytes)).ok()
}

/// Decodes one operation from each chunk of bytes (a short chunk is padded with zeros, so every
/// chunk yields one). The property tests build their operation lists this way: a byte string
/// decoded whole ends its list at the first "stop" byte, which random bytes hit within a few
/// operations, while libFuzzer learns to avoid it.
pub fn ops<'a, O: arbitrary::Arbitrary<'a>>(chunks: &'a [Vec<u8>]) -> Vec<O> {
    chunks
        .iter()
        .filter_map(|c| O::arbitrary(&mut arbitrary::Unstructured::new(c)).ok())
        .collect()
}

/// Fails the run with a message unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// Fails the run unless both sides are equal, printing both.
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($msg:tt)+) => {{
        let (left, right) = (&$left, &$right);
        if left != right {
            return Err(format!("{}: {:?} != {:?}", format!($($msg)+), left, right));
        }
    }};
}

pub(crate) use {ensure, ensure_eq};

/// Weights 0..=3, so zero-weight entries and multi-unit entries are both exercised.
pub fn weight(v: u32) -> u64 {
    u64::from(v % 4)
}

/// Checks that `cache.pin().iter()` yields exactly the model's entries, each once.
pub(crate) fn iterates_as(
    cache: &runcache::Cache<u8, u32>,
    model: &std::collections::HashMap<u8, u32>,
    at: &str,
) -> Outcome {
    let pinned = cache.pin();
    let mut seen: Vec<_> = pinned.iter().map(|(k, v)| (*k, *v)).collect();
    let mut expected: Vec<_> = model.iter().map(|(k, v)| (*k, *v)).collect();
    seen.sort_unstable();
    expected.sort_unstable();
    ensure_eq!(seen, expected, "{at}: iterated entries");
    Ok(())
}
