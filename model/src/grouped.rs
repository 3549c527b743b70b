//! The grouped cache (session → group → name) against a model: groups per session are bounded
//! and the oldest group by creation goes whole; sessions, everything and one owner's entries
//! can be cleared (with the groups an owner's clear leaves empty); owner clears wait while a
//! hold lives. With expiry (a time to live or to idle, on a manual clock), an expired value is
//! never returned, and a write that makes a group first takes out every expired value and
//! the groups that leaves empty, as a purge does; between those, the length and the group
//! counts lie between the model's live entries and all it holds.

use crate::{ensure, ensure_eq, Outcome};
use arbitrary::Arbitrary;
use runcache::grouped::{GroupedCache, OwnerId};
use runcache::Clock;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// The clock moves in steps of this many nanoseconds (4 ms), and every time to live or idle
/// is an odd multiple of half of it, so that a deadline is never within a tick (2^20 ns) of
/// the clock's reading: expired values are then surely taken out by the next purge.
const STEP: u64 = 4_000_000;
/// No deadline.
const NEVER: u64 = u64::MAX;

/// One operation; sessions, groups and names are small so that operations meet.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    Set(u8, u8, u8),
    SetAs(u8, u8, u8, u8),
    GetOrInsert(u8, u8, u8),
    GetOrInsertAs(u8, u8, u8, u8),
    Get(u8, u8, u8),
    ClearSession(u8),
    ClearOwner(u8),
    Clear,
    Hold,
    Release,
    /// Moves the clock by this many steps (modulo 4).
    Advance(u8),
    Purge,
}

/// A capacity (groups per session), the expiry rule (modulo 3: none, a time to live, a time
/// to idle; the rest picks its length), and the operations to apply.
#[derive(Arbitrary, Clone, Debug)]
pub struct Input {
    pub groups_per_session: u8,
    pub expiry: u8,
    pub ops: Vec<Op>,
}

/// The expiry rule of a run.
#[derive(Clone, Copy, PartialEq)]
enum Rule {
    None,
    Live(u64),
    Idle(u64),
}

type Key = (u8, u8, u8);

struct Model {
    cap: usize,
    rule: Rule,
    now: u64,
    /// Groups of each session in creation order.
    sessions: HashMap<u8, VecDeque<u8>>,
    /// Values and their deadlines, expired ones included until a purge takes them out.
    values: HashMap<Key, (u64, u64)>,
    /// What each owner stored: the key and the exact value.
    logs: HashMap<u8, Vec<(Key, u64)>>,
    holds: usize,
    deferred: VecDeque<u8>,
}

impl Model {
    fn new(cap: usize, rule: Rule) -> Self {
        Self {
            cap,
            rule,
            now: 0,
            sessions: HashMap::new(),
            values: HashMap::new(),
            logs: HashMap::new(),
            holds: 0,
            deferred: VecDeque::new(),
        }
    }

    /// The deadline of a value stored or read now.
    fn deadline(&self) -> u64 {
        match self.rule {
            Rule::None => NEVER,
            Rule::Live(d) | Rule::Idle(d) => self.now + d,
        }
    }

    fn live(&self, key: &Key) -> Option<u64> {
        self.values
            .get(key)
            .filter(|(_, deadline)| *deadline > self.now)
            .map(|(v, _)| *v)
    }

    /// A lookup that found `key` live: a time to idle starts anew.
    fn read(&mut self, key: &Key) {
        if let Rule::Idle(d) = self.rule {
            let now = self.now;
            if let Some(e) = self.values.get_mut(key).filter(|e| e.1 > now) {
                e.1 = now + d;
            }
        }
    }

    fn store(&mut self, key: Key, v: u64) -> Option<u64> {
        let deadline = self.deadline();
        self.values.insert(key, (v, deadline)).map(|(old, _)| old)
    }

    /// Takes out every expired value and the groups that leaves empty.
    fn purge(&mut self) {
        let now = self.now;
        self.values.retain(|_, (_, deadline)| *deadline > now);
        let values = &self.values;
        for (s, groups) in &mut self.sessions {
            groups.retain(|g| values.keys().any(|k| k.0 == *s && k.1 == *g));
        }
    }

    /// Live values, and groups of `s` holding one (the least the cache may count).
    fn live_len(&self) -> usize {
        self.values.values().filter(|(_, d)| *d > self.now).count()
    }

    fn live_groups(&self, s: u8) -> usize {
        self.sessions.get(&s).map_or(0, |groups| {
            groups
                .iter()
                .filter(|g| {
                    self.values
                        .iter()
                        .any(|(k, (_, d))| k.0 == s && k.1 == **g && *d > self.now)
                })
                .count()
        })
    }

    fn ensure_group(&mut self, s: u8, g: u8) {
        if self.rule != Rule::None {
            self.purge();
        }
        let groups = self.sessions.entry(s).or_default();
        if groups.contains(&g) {
            return;
        }
        groups.push_back(g);
        while self.cap > 0 && groups.len() > self.cap {
            let oldest = groups.pop_front().expect("more groups than a positive cap");
            self.values.retain(|k, _| !(k.0 == s && k.1 == oldest));
        }
    }

    fn clear_session(&mut self, s: u8) {
        self.sessions.remove(&s);
        self.values.retain(|k, _| k.0 != s);
    }

    /// Removes what `owner` stored that still holds its value, and every group that leaves
    /// empty. An expired value stays until a purge (the cache takes it out as expired, and
    /// its group counts it until then).
    fn clear_owner_now(&mut self, owner: u8) {
        for (key, v) in self.logs.remove(&owner).unwrap_or_default() {
            if self.live(&key) == Some(v) {
                self.values.remove(&key);
                let (s, g) = (key.0, key.1);
                if !self.values.keys().any(|k| k.0 == s && k.1 == g) {
                    if let Some(groups) = self.sessions.get_mut(&s) {
                        groups.retain(|x| *x != g);
                    }
                }
            }
        }
    }
}

/// Runs `input` (at most 512 operations) against a grouped cache and the model. Every value
/// stored is the step number, so values are unique and an owner's clear can be checked.
pub fn run(input: Input) -> Outcome {
    let cap = usize::from(input.groups_per_session % 5);
    // 2, 6, ..., 30 ms.
    let length = (u64::from(input.expiry / 3 % 8) * 2 + 1) * STEP / 2;
    let (clock, hand) = Clock::manual();
    let builder = GroupedCache::builder(cap).clock(clock);
    let (cache, rule): (GroupedCache<u8, u8, u8, u64>, _) = match input.expiry % 3 {
        0 => (GroupedCache::new(cap), Rule::None),
        1 => (
            builder
                .time_to_live(Duration::from_nanos(length))
                .build()
                .map_err(|e| e.to_string())?,
            Rule::Live(length),
        ),
        _ => (
            builder
                .time_to_idle(Duration::from_nanos(length))
                .build()
                .map_err(|e| e.to_string())?,
            Rule::Idle(length),
        ),
    };
    let mut model = Model::new(cap, rule);
    let mut holds = Vec::new();
    for (step, op) in input.ops.into_iter().take(512).enumerate() {
        let at = format!("step {step}: {op:?}");
        let v = step as u64;
        let key = |s: u8, g: u8, n: u8| (s % 3, g % 4, n % 4);
        match op {
            Op::Set(s, g, n) | Op::SetAs(s, g, n, _) => {
                let k = key(s, g, n);
                let owner = match op {
                    Op::SetAs(.., o) => Some(o % 3),
                    _ => None,
                };
                let old = match owner {
                    Some(o) => cache.owner(OwnerId(o.into())).set(&k.0, &k.1, &k.2, v),
                    None => cache.set(&k.0, &k.1, &k.2, v),
                };
                model.ensure_group(k.0, k.1);
                ensure_eq!(old.map(|x| *x), model.store(k, v), "{at}: replaced");
                if let Some(o) = owner {
                    model.logs.entry(o).or_default().push((k, v));
                }
            }
            Op::GetOrInsert(s, g, n) | Op::GetOrInsertAs(s, g, n, _) => {
                let k = key(s, g, n);
                let owner = match op {
                    Op::GetOrInsertAs(.., o) => Some(o % 3),
                    _ => None,
                };
                let got = match owner {
                    Some(o) => {
                        cache
                            .owner(OwnerId(o.into()))
                            .get_or_insert_with(&k.0, &k.1, &k.2, || v)
                    }
                    None => cache.get_or_insert_with(&k.0, &k.1, &k.2, || v),
                };
                match model.live(&k) {
                    Some(cur) => {
                        ensure_eq!(*got, cur, "{at}: hit");
                        model.read(&k);
                    }
                    None => {
                        ensure_eq!(*got, v, "{at}: built");
                        model.ensure_group(k.0, k.1);
                        model.store(k, v);
                        if let Some(o) = owner {
                            model.logs.entry(o).or_default().push((k, v));
                        }
                    }
                }
            }
            Op::Get(s, g, n) => {
                let k = key(s, g, n);
                let got = cache.get(&k.0, &k.1, &k.2).map(|x| *x);
                ensure_eq!(got, model.live(&k), "{at}");
                model.read(&k);
            }
            Op::ClearSession(s) => {
                cache.clear_session(&(s % 3));
                model.clear_session(s % 3);
            }
            Op::ClearOwner(o) => {
                cache.clear_owner(OwnerId((o % 3).into()));
                if model.holds > 0 {
                    model.deferred.push_back(o % 3);
                } else {
                    model.clear_owner_now(o % 3);
                }
            }
            Op::Clear => {
                cache.clear();
                model.sessions.clear();
                model.values.clear();
            }
            Op::Hold => {
                holds.push(cache.hold_clears());
                model.holds += 1;
            }
            Op::Release => {
                if holds.pop().is_some() {
                    model.holds -= 1;
                    if model.holds == 0 {
                        while let Some(o) = model.deferred.pop_front() {
                            model.clear_owner_now(o);
                        }
                    }
                }
            }
            Op::Advance(n) => {
                let by = u64::from(n % 4) * STEP;
                if model.rule != Rule::None {
                    hand.advance(Duration::from_nanos(by));
                    model.now += by;
                }
            }
            Op::Purge => {
                let out = cache.purge_expired();
                let before = model.values.len();
                model.purge();
                // Some were taken out by writes' steps already.
                ensure!(out <= before - model.values.len(), "{at}: purged {out}");
            }
        }
        // Between purges the cache may still hold (and count) what expired.
        let (len, live) = (cache.len(), model.live_len());
        ensure!(
            (live..=model.values.len()).contains(&len),
            "{at}: len {len}, live {live}, held {}",
            model.values.len()
        );
        for s in 0..3 {
            let groups = model.sessions.get(&s).map_or(0, VecDeque::len);
            let (count, live) = (cache.group_count(&s), model.live_groups(s));
            ensure!(
                (live..=groups).contains(&count),
                "{at}: {count} groups of session {s}, live {live}, held {groups}"
            );
        }
        let keys: Vec<Key> = model.values.keys().copied().collect();
        for k in keys {
            ensure_eq!(
                cache.get(&k.0, &k.1, &k.2).map(|x| *x),
                model.live(&k),
                "{at}: {k:?}"
            );
            model.read(&k);
        }
    }
    Ok(())
}
