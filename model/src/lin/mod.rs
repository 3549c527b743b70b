//! Linearizability checking of real concurrent histories.
//!
//! The fuzz targets and property tests compare single-threaded operation sequences with a
//! model; loom explores small models exhaustively. This module checks what real threads on
//! real hardware observe: a [`Program`] (a few threads, each with a short random list of
//! calls) runs on one shared cache, every call's invocation and response is stamped with one
//! global clock, and the [`History`] is checked, key by key, against the sequential
//! specification in [`check`]. The specification is exact about everything but the policy's
//! freedom: which entry an eviction removes is the cache's choice, but every eviction must be
//! reported to the removal listener (inside the call that caused it) and remove exactly the
//! value reported.
//!
//! Besides linearizability, each history is checked for single flight (no two builder runs
//! for one key overlap in time), for the budget (`weighted size <= capacity` read after
//! every call), and with the cache's own `__validate` once the threads are done.
//!
//! ```text
//! RUNCACHE_LIN_SECS=600 cargo test --release -p runcache-model --test linearizability -- --ignored
//! ```

pub mod check;

use check::{Built, Entry, KeyOp, Value};
use runcache::{Cache, RemovalCause, Source, WhenFull};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};

/// How a single-flight call's builder behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    Succeed,
    Fail,
    Panic,
}

/// One call of a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Get(u64),
    Pinned(u64),
    Insert(u64, Value),
    Remove(u64),
    /// `get_or_build` of a key with a builder that would make the value, fail or panic.
    Build(u64, Value, Plan),
    /// `retain` keeping what [`check::keeps`] keeps for this modulus.
    Retain(u64),
    Clear,
    SetCapacity(u64),
}

/// A cache configuration and each thread's calls.
#[derive(Clone, Debug)]
pub struct Program {
    pub seed: u64,
    pub keys: u64,
    pub capacity: u64,
    pub evict: bool,
    pub shards: usize,
    pub threads: Vec<Vec<Call>>,
}

/// A small deterministic generator (SplitMix64), so a program is rebuilt from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

impl Program {
    /// The program of `seed`: 2–4 threads of 10–40 calls over 2–6 keys, on a rejecting cache
    /// that never fills or an evicting cache that holds about half the keys.
    pub fn generate(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let keys = 2 + rng.below(5);
        let evict = rng.below(2) == 0;
        let capacity = if evict { 1 + keys / 2 } else { keys * 2 };
        let shards = [1, 2, 8][rng.below(3) as usize];
        let threads = 2 + rng.below(3) as usize;
        let mut value = 0;
        let threads = (0..threads)
            .map(|_| {
                let n = 10 + rng.below(31);
                (0..n)
                    .map(|_| {
                        let key = rng.below(keys);
                        value += 1;
                        match rng.below(100) {
                            0..=24 => Call::Get(key),
                            25..=34 => Call::Pinned(key),
                            35..=54 => Call::Insert(key, value),
                            55..=66 => Call::Remove(key),
                            67..=88 => Call::Build(
                                key,
                                value,
                                match rng.below(10) {
                                    0 => Plan::Fail,
                                    1 => Plan::Panic,
                                    _ => Plan::Succeed,
                                },
                            ),
                            89..=92 => Call::Retain(rng.below(3)),
                            93..=95 => Call::Clear,
                            // Never 0: a disabled cache is specified elsewhere.
                            _ => Call::SetCapacity(1 + rng.below(keys * 2)),
                        }
                    })
                    .collect()
            })
            .collect();
        Self {
            seed,
            keys,
            capacity,
            evict,
            shards,
            threads,
        }
    }

    /// Calls in all.
    pub fn len(&self) -> usize {
        self.threads.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a call returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ret {
    Value(Option<Value>),
    Inserted(Option<Option<Value>>),
    Built(Built),
    Done,
}

/// One call as it happened: when it was called and returned, what it returned, and which
/// values left the cache inside it (the listener's reports on this thread).
#[derive(Clone, Debug)]
pub struct Event {
    pub thread: usize,
    pub call: Call,
    pub start: u64,
    pub end: u64,
    pub ret: Ret,
    pub left: Vec<(u64, Value, RemovalCause)>,
}

/// A builder's run: its key and when it started and ended.
#[derive(Clone, Debug)]
pub struct BuildRun {
    pub key: u64,
    pub start: u64,
    pub end: u64,
}

/// What a program's run recorded.
#[derive(Clone, Debug)]
pub struct History {
    pub events: Vec<Event>,
    pub builds: Vec<BuildRun>,
    /// Calls after which `weighted size > capacity` was read.
    pub over_budget: Vec<String>,
    /// The cache's own check once the threads were done.
    pub validated: Result<(), String>,
}

thread_local! {
    /// The listener's reports on this thread since the current call began.
    static LEFT: RefCell<Vec<(u64, Value, RemovalCause)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `program` on real threads and records its history.
pub fn run(program: &Program) -> History {
    let cache: Cache<u64, Value> = Cache::builder()
        .capacity(program.capacity)
        .shards(program.shards)
        .when_full(if program.evict {
            WhenFull::Evict
        } else {
            WhenFull::Reject
        })
        .on_evict(|k, v, cause| LEFT.with(|l| l.borrow_mut().push((*k, **v, cause))))
        .build()
        .expect("a valid configuration");
    let clock = AtomicU64::new(0);
    // SeqCst: the stamps must follow real time across threads, so that a call that returned
    // before another was called has the smaller stamps.
    let tick = || clock.fetch_add(1, Ordering::SeqCst);
    let builds = Mutex::new(Vec::new());
    let over_budget = Mutex::new(Vec::new());
    let barrier = Barrier::new(program.threads.len());
    let events: Vec<Vec<Event>> = std::thread::scope(|s| {
        let handles: Vec<_> = program
            .threads
            .iter()
            .enumerate()
            .map(|(thread, calls)| {
                let (cache, builds, over_budget, barrier) =
                    (&cache, &builds, &over_budget, &barrier);
                let tick = &tick;
                s.spawn(move || {
                    barrier.wait();
                    calls
                        .iter()
                        .map(|call| {
                            LEFT.with(|l| l.borrow_mut().clear());
                            let start = tick();
                            let ret = perform(cache, call, tick, builds);
                            let end = tick();
                            let (size, capacity) = cache.weighted_size_and_capacity();
                            if size > capacity {
                                over_budget
                                    .lock()
                                    .expect("not poisoned")
                                    .push(format!("after {call:?}: {size} > {capacity}"));
                            }
                            Event {
                                thread,
                                call: call.clone(),
                                start,
                                end,
                                ret,
                                left: LEFT.with(|l| std::mem::take(&mut *l.borrow_mut())),
                            }
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a recording thread panicked"))
            .collect()
    });
    History {
        events: events.into_iter().flatten().collect(),
        builds: builds.into_inner().expect("not poisoned"),
        over_budget: over_budget.into_inner().expect("not poisoned"),
        validated: cache.__validate(),
    }
}

fn perform(
    cache: &Cache<u64, Value>,
    call: &Call,
    tick: &(impl Fn() -> u64 + Sync),
    builds: &Mutex<Vec<BuildRun>>,
) -> Ret {
    match *call {
        Call::Get(k) => Ret::Value(cache.get(&k).map(|v| *v)),
        Call::Pinned(k) => Ret::Value(cache.pin().get(&k).copied()),
        Call::Insert(k, v) => Ret::Inserted(cache.insert(k, v).ok().map(|r| r.map(|v| *v))),
        Call::Remove(k) => Ret::Value(cache.remove(&k).map(|v| *v)),
        Call::Build(k, own, plan) => {
            let build = |_: &u64| {
                let start = tick();
                let result = match plan {
                    Plan::Succeed => Ok(own),
                    Plan::Fail => Err(own),
                    Plan::Panic => {
                        builds.lock().expect("not poisoned").push(BuildRun {
                            key: k,
                            start,
                            end: tick(),
                        });
                        // `resume_unwind` unwinds without running the panic hook, so a planned
                        // panic prints nothing.
                        std::panic::resume_unwind(Box::new("planned builder panic"))
                    }
                };
                builds.lock().expect("not poisoned").push(BuildRun {
                    key: k,
                    start,
                    end: tick(),
                });
                result
            };
            let result = catch_unwind(AssertUnwindSafe(|| cache.get_or_build(k, build)));
            Ret::Built(match result {
                Err(_) => Built::Panicked,
                Ok(Err(e)) => {
                    Built::Failed(*e.failed().expect("a build that never asks for its own key"))
                }
                Ok(Ok(f)) => match f.source {
                    Source::Hit => Built::Hit(*f.value),
                    Source::Shared => Built::Shared(*f.value),
                    Source::Cached => Built::Cached(*f.value),
                    _ => Built::Uncached(*f.value),
                },
            })
        }
        Call::Retain(m) => {
            cache.retain(|k, v| check::keeps(*k, *v, m));
            Ret::Done
        }
        Call::Clear => {
            cache.clear();
            Ret::Done
        }
        Call::SetCapacity(c) => {
            cache.set_capacity(c).unwrap();
            Ret::Done
        }
    }
}

/// Each key's history, as the specification sees it.
pub fn project(program: &Program, history: &History) -> BTreeMap<u64, Vec<Entry>> {
    let mut keys: BTreeMap<u64, Vec<Entry>> = (0..program.keys).map(|k| (k, vec![])).collect();
    for e in &history.events {
        let mut add = |key: u64, op: KeyOp| {
            keys.entry(key).or_default().push(Entry {
                call: e.start,
                ret: e.end,
                thread: e.thread,
                op,
            });
        };
        // Every value that left `key` for `cause` inside this call: a walk (`clear`,
        // `retain`) meets a key once per insertion, so it may remove several of its values.
        let left = |key: u64, cause: RemovalCause| -> Vec<Value> {
            e.left
                .iter()
                .filter(|(k, _, c)| *k == key && *c == cause)
                .map(|(_, v, _)| *v)
                .collect()
        };
        match (&e.call, &e.ret) {
            (Call::Get(k) | Call::Pinned(k), Ret::Value(r)) => add(*k, KeyOp::Get(*r)),
            (Call::Insert(k, v), Ret::Inserted(Some(replaced))) => add(
                *k,
                KeyOp::Insert {
                    value: *v,
                    replaced: *replaced,
                },
            ),
            (Call::Insert(k, _), Ret::Inserted(None)) => add(*k, KeyOp::Refused),
            (Call::Remove(k), Ret::Value(r)) => add(*k, KeyOp::Remove(*r)),
            (Call::Build(k, own, _), Ret::Built(result)) => add(
                *k,
                KeyOp::Build {
                    own: *own,
                    result: result.clone(),
                },
            ),
            (Call::Retain(m), _) => {
                for key in 0..program.keys {
                    let removed = left(key, RemovalCause::Removed);
                    let retain = |removed| KeyOp::Retain {
                        modulus: *m,
                        key,
                        removed,
                    };
                    if removed.is_empty() {
                        add(key, retain(None));
                    }
                    for v in removed {
                        add(key, retain(Some(v)));
                    }
                }
            }
            (Call::Clear, _) => {
                for key in 0..program.keys {
                    let removed = left(key, RemovalCause::Cleared);
                    if removed.is_empty() {
                        add(key, KeyOp::Clear(None));
                    }
                    for v in removed {
                        add(key, KeyOp::Clear(Some(v)));
                    }
                }
            }
            _ => {}
        }
        for (key, value, cause) in &e.left {
            if *cause == RemovalCause::Capacity {
                add(*key, KeyOp::Evicted(*value));
            }
        }
    }
    keys
}

/// Everything wrong with one run, or `None`.
pub fn verify(program: &Program, history: &History) -> Option<String> {
    let mut report = String::new();
    if let Err(e) = &history.validated {
        let _ = writeln!(report, "the cache's own check failed: {e}");
    }
    for o in &history.over_budget {
        let _ = writeln!(report, "over budget {o}");
    }
    for (i, a) in history.builds.iter().enumerate() {
        for b in &history.builds[i + 1..] {
            if a.key == b.key && a.start < b.end && b.start < a.end {
                let _ = writeln!(
                    report,
                    "two builders of key {} overlapped: {a:?} {b:?}",
                    a.key
                );
            }
        }
    }
    for (key, entries) in project(program, history) {
        if let Some(missed) = check::walks_missed(&entries) {
            let _ = writeln!(report, "key {key}: {missed}");
        }
        match check::linearizable(&entries) {
            Ok(true) => {}
            Ok(false) => {
                let _ = writeln!(
                    report,
                    "key {key} is not linearizable; a shortest failing sub-history:"
                );
                for e in check::minimize(&entries) {
                    let _ = writeln!(report, "  {e}");
                }
                // A sub-history may fail for another reason than the whole one did, so the
                // whole one follows.
                let _ = writeln!(report, "the key's whole history:");
                let mut all = entries.clone();
                all.sort_by_key(|e| e.call);
                for e in all {
                    let _ = writeln!(report, "  {e}");
                }
            }
            Err(check::GaveUp) => {
                let _ = writeln!(report, "key {key}: the search gave up (too many states)");
            }
        }
    }
    (!report.is_empty()).then(|| {
        format!(
            "program seed {} ({} keys, capacity {}, {}, {} shards, {} threads):\n{report}",
            program.seed,
            program.keys,
            program.capacity,
            if program.evict {
                "evicting"
            } else {
                "rejecting"
            },
            program.shards,
            program.threads.len()
        )
    })
}

/// A summary of many runs.
#[derive(Debug, Default)]
pub struct Tally {
    pub histories: u64,
    pub calls: u64,
}

/// Runs generated programs from `first_seed` on for `secs` seconds or until `max_calls`
/// calls; the first failure's report, saved to `save_dir` as `seed-N.txt` when given.
pub fn soak(
    first_seed: u64,
    secs: f64,
    max_calls: u64,
    save_dir: Option<&std::path::Path>,
) -> Result<Tally, String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    let mut tally = Tally::default();
    let mut seed = first_seed;
    while std::time::Instant::now() < deadline && tally.calls < max_calls {
        let program = Program::generate(seed);
        let history = run(&program);
        if let Some(report) = verify(&program, &history) {
            let report = format!(
                "after {} linearizable histories ({} calls, {:.1} s):\n{report}",
                tally.histories,
                tally.calls,
                secs - deadline
                    .saturating_duration_since(std::time::Instant::now())
                    .as_secs_f64()
            );
            if let Some(dir) = save_dir {
                let _ = std::fs::create_dir_all(dir);
                let text = format!("{report}\nthe program:\n{:#?}\n", program.threads);
                let _ = std::fs::write(dir.join(format!("seed-{seed}.txt")), text);
            }
            return Err(report);
        }
        tally.histories += 1;
        tally.calls += program.len() as u64;
        seed = seed.wrapping_add(1);
    }
    Ok(tally)
}
