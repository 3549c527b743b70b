//! The checker: is a history of one key's operations linearizable against the key's
//! sequential specification?
//!
//! Wing and Gong's search with memoization (Lowe's refinement, as porcupine does it): an
//! operation may be linearized next if it was called before every operation not yet
//! linearized returned; each choice applies the specification, and a `(linearized set,
//! state)` pair already explored is not explored again. A history is split by key first
//! (`project`), which is sound because every operation is specified per key: a global
//! operation (`retain`, `clear`) is weakly consistent in runcache, so each value it removes
//! is one sub-operation of its key, with its own linearization point inside the call. What a
//! walk must not leave behind (a value cached, and refused, throughout the call) is not a
//! property of one point; [`walks_missed`] checks it on the history directly.

use std::collections::HashSet;
use std::fmt;

/// A value written by an insert or built by a builder; unique within a history.
pub type Value = u64;

/// What one call did to one key, as the specification sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyOp {
    /// A lookup (`get` or a pinned `get`) returned this.
    Get(Option<Value>),
    /// `insert` of `value` returned the value it replaced.
    Insert {
        value: Value,
        replaced: Option<Value>,
    },
    /// `insert` was refused (the cache was full): nothing changed.
    Refused,
    /// `remove` returned this.
    Remove(Option<Value>),
    /// A single-flight call whose own builder would make `own`.
    Build { own: Value, result: Built },
    /// `retain` with predicate `modulus` saw this key: it removed this value, or nothing.
    Retain {
        modulus: u64,
        key: u64,
        removed: Option<Value>,
    },
    /// `clear` removed this value from the key, or found nothing.
    Clear(Option<Value>),
    /// The value left the cache by eviction during this call (the listener said so).
    Evicted(Value),
}

/// How a single-flight call ended.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Built {
    /// A value, and where it came from.
    Hit(Value),
    Shared(Value),
    Cached(Value),
    Uncached(Value),
    /// The error of the attempt this call built or waited on (its builder's value id).
    Failed(Value),
    /// This call's own builder panicked.
    Panicked,
}

/// `retain`'s predicate: keeps `(key, value)` unless `(key + value + modulus) % 3 == 0`.
pub fn keeps(key: u64, value: Value, modulus: u64) -> bool {
    !key.wrapping_add(value)
        .wrapping_add(modulus)
        .is_multiple_of(3)
}

/// The key's sequential specification: the next state, or `None` if `op` cannot happen in
/// `state` (`None` for the key absent, or the value it holds).
pub fn step(state: Option<Value>, op: &KeyOp) -> Option<Option<Value>> {
    use KeyOp::*;
    match op {
        Get(r) => (*r == state).then_some(state),
        Insert { value, replaced } => (*replaced == state).then_some(Some(*value)),
        Refused => Some(state),
        Remove(r) => (*r == state).then_some(None),
        Build { own, result } => match result {
            Built::Hit(v) => (state == Some(*v)).then_some(state),
            // A waiter shares the value its attempt's builder cached (then it is present),
            // or one that did not fit (then it is absent).
            Built::Shared(v) => (state == Some(*v) || state.is_none()).then_some(state),
            Built::Cached(v) => (v == own && state.is_none()).then_some(Some(*v)),
            Built::Uncached(v) => (v == own && state.is_none()).then_some(state),
            Built::Failed(_) | Built::Panicked => state.is_none().then_some(state),
        },
        Retain {
            modulus,
            key,
            removed,
        } => match (removed, state) {
            (Some(r), Some(v)) => (*r == v && !keeps(*key, v, *modulus)).then_some(None),
            (Some(_), None) => None,
            // Checked by `walks_missed`.
            (None, _) => Some(state),
        },
        Clear(Some(r)) => (state == Some(*r)).then_some(None),
        // Checked by `walks_missed`.
        Clear(None) => Some(state),
        Evicted(v) => (state == Some(*v)).then_some(None),
    }
}

/// One operation of a key's history: called at `call`, returned at `ret` (ticks of one
/// global clock), by `thread`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub call: u64,
    pub ret: u64,
    pub thread: usize,
    pub op: KeyOp,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:>6} .. {:>6}] thread {}: {:?}",
            self.call, self.ret, self.thread, self.op
        )
    }
}

/// A walk that left a key's value behind although the value was cached throughout the walk
/// (written before the walk was called, and not removed or replaced by any call made before
/// the walk returned) and the walk had to remove it (every value for `clear`, a refused one
/// for `retain`); `None` if there is none.
pub fn walks_missed(history: &[Entry]) -> Option<String> {
    for walk in history {
        let must_remove = |v: Value| match &walk.op {
            KeyOp::Clear(None) => true,
            KeyOp::Retain {
                modulus,
                key,
                removed: None,
            } => !keeps(*key, v, *modulus),
            _ => false,
        };
        for writer in history.iter().filter(|w| w.ret < walk.call) {
            let Some(v) = values(&writer.op).1 else {
                continue;
            };
            // Every call that reads `v` and is not a lookup takes it out of the cache: a
            // removal, a replacing insert, an eviction, a walk's removal.
            let removed_before = history.iter().any(|r| {
                r.call < walk.ret
                    && values(&r.op).0 == Some(v)
                    && !matches!(
                        r.op,
                        KeyOp::Get(_)
                            | KeyOp::Build {
                                result: Built::Hit(_) | Built::Shared(_),
                                ..
                            }
                    )
            });
            if !removed_before && must_remove(v) {
                return Some(format!(
                    "{walk} left value {v}, cached throughout it (written by {writer})"
                ));
            }
        }
    }
    None
}

/// The result of a search that gave up: too many states for the budget.
#[derive(Debug, PartialEq, Eq)]
pub struct GaveUp;

/// States a search may visit before it gives up (a key's history of a few dozen operations
/// from four threads needs a few hundred).
pub const BUDGET: usize = 1 << 20;

/// Whether `history` (one key's, starting absent) is linearizable; `Err(GaveUp)` past
/// [`BUDGET`] states.
pub fn linearizable(history: &[Entry]) -> Result<bool, GaveUp> {
    let n = history.len();
    let words = n.div_ceil(64).max(1);
    let mut seen: HashSet<(Vec<u64>, Option<Value>)> = HashSet::new();
    // Depth-first, with an explicit stack of (linearized set, state, operations done).
    let mut stack = vec![(vec![0u64; words], None::<Value>, 0usize)];
    while let Some((done, state, count)) = stack.pop() {
        if count == n {
            return Ok(true);
        }
        if !seen.insert((done.clone(), state)) {
            continue;
        }
        if seen.len() > BUDGET {
            return Err(GaveUp);
        }
        let is_done = |i: usize| done[i / 64] >> (i % 64) & 1 == 1;
        // An operation can go next only if it was called before every pending one returned.
        let horizon = (0..n)
            .filter(|&i| !is_done(i))
            .map(|i| history[i].ret)
            .min()
            .expect("some operation is pending");
        for i in (0..n).filter(|&i| !is_done(i) && history[i].call < horizon) {
            if let Some(next) = step(state, &history[i].op) {
                let mut done = done.clone();
                done[i / 64] |= 1 << (i % 64);
                stack.push((done, next, count + 1));
            }
        }
    }
    Ok(false)
}

/// The values `op` reads (finds in the cache), and the one it writes.
fn values(op: &KeyOp) -> (Option<Value>, Option<Value>) {
    use KeyOp::*;
    match op {
        Get(r) | Remove(r) | Clear(r) => (*r, None),
        Insert { value, replaced } => (*replaced, Some(*value)),
        Refused => (None, None),
        Build { own, result } => match result {
            Built::Hit(v) | Built::Shared(v) => (Some(*v), None),
            Built::Cached(_) => (None, Some(*own)),
            _ => (None, None),
        },
        Retain { removed, .. } => (*removed, None),
        Evicted(v) => (Some(*v), None),
    }
}

/// Whether every value an operation of `history` reads is written by one of its operations,
/// so that a sub-history fails for what happened, not for a writer left out.
fn self_contained(history: &[Entry]) -> bool {
    let written: HashSet<Value> = history.iter().filter_map(|e| values(&e.op).1).collect();
    history
        .iter()
        .filter_map(|e| values(&e.op).0)
        .all(|v| written.contains(&v))
}

/// A shortest sub-history found by removing operations one at a time while the rest stays
/// non-linearizable and self-contained (every value read has its writer); the caller passes
/// a non-linearizable history.
pub fn minimize(history: &[Entry]) -> Vec<Entry> {
    let mut h = history.to_vec();
    loop {
        let before = h.len();
        let mut i = 0;
        while i < h.len() {
            let mut without = h.clone();
            without.remove(i);
            if self_contained(&without) && linearizable(&without) == Ok(false) {
                h = without;
            } else {
                i += 1;
            }
        }
        if h.len() == before {
            return h;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(call: u64, ret: u64, thread: usize, op: KeyOp) -> Entry {
        Entry {
            call,
            ret,
            thread,
            op,
        }
    }

    fn ins(value: Value, replaced: Option<Value>) -> KeyOp {
        KeyOp::Insert { value, replaced }
    }

    #[test]
    fn a_sequential_history_follows_the_specification() {
        let h = [
            e(0, 1, 0, KeyOp::Get(None)),
            e(2, 3, 0, ins(7, None)),
            e(4, 5, 1, KeyOp::Get(Some(7))),
            e(6, 7, 1, ins(8, Some(7))),
            e(8, 9, 0, KeyOp::Remove(Some(8))),
            e(10, 11, 0, KeyOp::Get(None)),
        ];
        assert_eq!(linearizable(&h), Ok(true));
        let mut wrong = h.to_vec();
        wrong[2].op = KeyOp::Get(Some(8));
        assert_eq!(linearizable(&wrong), Ok(false), "8 was not written yet");
    }

    #[test]
    fn overlapping_calls_may_take_either_order() {
        // The get overlaps the insert: it may see the value or not.
        for seen in [None, Some(7)] {
            let h = [e(0, 5, 0, ins(7, None)), e(1, 3, 1, KeyOp::Get(seen))];
            assert_eq!(linearizable(&h), Ok(true), "{seen:?}");
        }
        // Once the insert returned, a later get must see it.
        let h = [e(0, 1, 0, ins(7, None)), e(2, 3, 1, KeyOp::Get(None))];
        assert_eq!(linearizable(&h), Ok(false));
    }

    #[test]
    fn a_stale_read_after_a_newer_one_is_not_linearizable() {
        // Two writes in sequence; one reader sees the new value, then (later) the old one.
        let h = [
            e(0, 1, 1, KeyOp::Get(None)),
            e(2, 3, 0, ins(1, None)),
            e(4, 11, 0, ins(2, Some(1))),
            e(5, 6, 1, KeyOp::Get(Some(2))),
            e(7, 8, 1, KeyOp::Get(Some(1))),
        ];
        assert_eq!(linearizable(&h), Ok(false));
        let m = minimize(&h);
        assert_eq!(linearizable(&m), Ok(false), "still a counterexample");
        assert_eq!(m, h[1..].to_vec(), "only the first get is not needed");
    }

    #[test]
    fn two_removals_cannot_both_take_one_value() {
        let h = [
            e(0, 1, 0, ins(5, None)),
            e(2, 6, 0, KeyOp::Remove(Some(5))),
            e(3, 7, 1, KeyOp::Remove(Some(5))),
        ];
        assert_eq!(linearizable(&h), Ok(false));
        let h = [
            e(0, 1, 0, ins(5, None)),
            e(2, 6, 0, KeyOp::Remove(Some(5))),
            e(3, 7, 1, KeyOp::Remove(None)),
        ];
        assert_eq!(linearizable(&h), Ok(true));
    }

    #[test]
    fn single_flight_builds_once_and_waiters_share() {
        let build = |own, result| KeyOp::Build { own, result };
        // One builder caches 3; an overlapping caller waited and shares it.
        let h = [
            e(0, 5, 0, build(3, Built::Cached(3))),
            e(1, 6, 1, build(4, Built::Shared(3))),
            e(7, 8, 1, build(9, Built::Hit(3))),
        ];
        assert_eq!(linearizable(&h), Ok(true));
        // Two overlapping callers both caching their own value: one must have seen the other.
        let h = [
            e(0, 5, 0, build(3, Built::Cached(3))),
            e(1, 6, 1, build(4, Built::Cached(4))),
        ];
        assert_eq!(linearizable(&h), Ok(false));
        // A hit on a value never cached.
        let h = [e(0, 1, 0, build(3, Built::Hit(4)))];
        assert_eq!(linearizable(&h), Ok(false));
        // A failed attempt leaves the key absent for a later lookup.
        let h = [
            e(0, 3, 0, build(3, Built::Failed(3))),
            e(1, 4, 1, build(4, Built::Failed(3))),
            e(5, 6, 0, KeyOp::Get(None)),
        ];
        assert_eq!(linearizable(&h), Ok(true));
    }

    #[test]
    fn retain_and_clear_are_weakly_consistent_per_key() {
        // Key 1 with value 1 and modulus 1: 1 + 1 + 1 = 3, refused by the predicate.
        assert!(!keeps(1, 1, 1));
        let retain = |removed| KeyOp::Retain {
            modulus: 1,
            key: 1,
            removed,
        };
        // Cached throughout the retain and refused: it must be removed.
        let h = [e(0, 1, 0, ins(1, None)), e(2, 3, 1, retain(None))];
        assert!(walks_missed(&h).is_some());
        // Inserted during the retain, or replaced during it: it may be missed.
        let h = [e(2, 4, 0, ins(1, None)), e(1, 5, 1, retain(None))];
        assert_eq!(walks_missed(&h), None);
        let h = [
            e(0, 1, 0, ins(1, None)),
            e(2, 6, 1, retain(None)),
            e(3, 4, 0, ins(4, Some(1))),
        ];
        assert_eq!(walks_missed(&h), None);
        assert_eq!(linearizable(&h), Ok(true));
        // A removal the retain reports must be of a value it refuses.
        let h = [e(0, 1, 0, ins(2, None)), e(2, 3, 1, retain(Some(2)))];
        assert_eq!(linearizable(&h), Ok(false), "1 + 2 + 1 is kept");
        // A clear must remove what was cached throughout it.
        let h = [e(0, 1, 0, ins(1, None)), e(2, 3, 1, KeyOp::Clear(None))];
        assert!(walks_missed(&h).is_some());
        let h = [
            e(0, 1, 0, ins(1, None)),
            e(2, 3, 1, KeyOp::Clear(Some(1))),
            e(4, 5, 0, KeyOp::Get(None)),
        ];
        assert_eq!(walks_missed(&h), None);
        assert_eq!(linearizable(&h), Ok(true));
        // A clear may meet a key once per insertion: two values of one key, both removed.
        let h = [
            e(0, 1, 0, ins(1, None)),
            e(2, 9, 1, KeyOp::Clear(Some(1))),
            e(3, 4, 0, ins(2, None)),
            e(5, 9, 1, KeyOp::Clear(Some(2))),
            e(10, 11, 0, KeyOp::Get(None)),
        ];
        assert_eq!(linearizable(&h), Ok(true));
    }

    #[test]
    fn an_eviction_removes_exactly_the_value_it_reports() {
        let h = [
            e(0, 1, 0, ins(1, None)),
            e(2, 5, 1, KeyOp::Evicted(1)),
            e(6, 7, 0, KeyOp::Get(None)),
        ];
        assert_eq!(linearizable(&h), Ok(true));
        let h = [
            e(0, 1, 0, ins(1, None)),
            e(2, 5, 1, KeyOp::Evicted(1)),
            e(6, 7, 0, KeyOp::Get(Some(1))),
        ];
        assert_eq!(linearizable(&h), Ok(false), "evicted, yet seen after");
        // Without a reported eviction the value may not vanish.
        let h = [e(0, 1, 0, ins(1, None)), e(2, 3, 1, KeyOp::Get(None))];
        assert_eq!(linearizable(&h), Ok(false));
    }
}
