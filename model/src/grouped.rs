//! The grouped cache (session → group → name) against a model: groups per session are bounded
//! and the oldest group by creation goes whole; sessions, everything and one owner's entries
//! can be cleared (with the groups an owner's clear leaves empty); owner clears wait while a
//! hold lives.

use crate::{ensure_eq, Outcome};
use arbitrary::Arbitrary;
use runcache::grouped::{GroupedCache, OwnerId};
use std::collections::{HashMap, VecDeque};

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
}

/// A capacity (groups per session) and the operations to apply.
#[derive(Arbitrary, Clone, Debug)]
pub struct Input {
    pub groups_per_session: u8,
    pub ops: Vec<Op>,
}

type Key = (u8, u8, u8);

#[derive(Default)]
struct Model {
    cap: usize,
    /// Groups of each session in creation order.
    sessions: HashMap<u8, VecDeque<u8>>,
    values: HashMap<Key, u64>,
    /// What each owner stored: the key and the exact value.
    logs: HashMap<u8, Vec<(Key, u64)>>,
    holds: usize,
    deferred: VecDeque<u8>,
}

impl Model {
    fn ensure_group(&mut self, s: u8, g: u8) {
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
    /// empty.
    fn clear_owner_now(&mut self, owner: u8) {
        for (key, v) in self.logs.remove(&owner).unwrap_or_default() {
            if self.values.get(&key) == Some(&v) {
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
    let cache: GroupedCache<u8, u8, u8, u64> = GroupedCache::new(cap);
    let mut model = Model {
        cap,
        ..Model::default()
    };
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
                ensure_eq!(old.map(|x| *x), model.values.insert(k, v), "{at}: replaced");
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
                match model.values.get(&k) {
                    Some(cur) => ensure_eq!(*got, *cur, "{at}: hit"),
                    None => {
                        ensure_eq!(*got, v, "{at}: built");
                        model.ensure_group(k.0, k.1);
                        model.values.insert(k, v);
                        if let Some(o) = owner {
                            model.logs.entry(o).or_default().push((k, v));
                        }
                    }
                }
            }
            Op::Get(s, g, n) => {
                let k = key(s, g, n);
                let got = cache.get(&k.0, &k.1, &k.2).map(|x| *x);
                ensure_eq!(got, model.values.get(&k).copied(), "{at}");
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
        }
        ensure_eq!(cache.len(), model.values.len(), "{at}: len");
        for s in 0..3 {
            let groups = model.sessions.get(&s).map_or(0, VecDeque::len);
            ensure_eq!(cache.group_count(&s), groups, "{at}: groups of session {s}");
        }
        for (k, v) in &model.values {
            ensure_eq!(
                cache.get(&k.0, &k.1, &k.2).map(|x| *x),
                Some(*v),
                "{at}: {k:?}"
            );
        }
    }
    Ok(())
}
