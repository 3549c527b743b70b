//! The async single flight on one thread: callers' `get_or_insert_with_async` futures are
//! started, polled, let finish and dropped in any order, between gets, inserts and
//! removals, against a model of who builds, who waits and what each gets. Every caller has
//! its own counting waker, and each attempt's end (its build finished or its future dropped)
//! must have woken every caller that was waiting on it: no lost wake-up.

use crate::{ensure, ensure_eq, Outcome};
use arbitrary::Arbitrary;
use runcache::{Cache, Handle, RecursionError, WhenFull};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Callers (slots for futures): operations name one modulo this.
const CALLERS: u8 = 6;
/// Keys: operations name one modulo this, so that callers meet.
const KEYS: u8 = 3;

/// One operation.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    /// Drops caller `slot`'s future, if any, makes a new one for `key` whose build resolves
    /// to `value` once let finish, and polls it once.
    Start {
        slot: u8,
        key: u8,
        value: u32,
    },
    /// Polls caller `slot`'s future.
    Poll(u8),
    /// Lets caller `slot`'s build finish (at its next poll).
    Finish(u8),
    /// Drops caller `slot`'s future.
    Drop(u8),
    Get(u8),
    Remove(u8),
    /// Inserts, unless a build of the key is in flight (a blocking insert would wait for it,
    /// on this very thread).
    Insert(u8, u32),
}

/// The operations to apply.
#[derive(Arbitrary, Clone, Debug)]
pub struct Input {
    pub ops: Vec<Op>,
}

type Call = Pin<Box<dyn Future<Output = Result<Handle<u32>, RecursionError<u8>>>>>;

/// A build that stays pending until its flag is set.
struct Gate(Arc<AtomicBool>);

impl Future for Gate {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Counts the wakes of one caller.
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// What the model says a caller is doing.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    /// Its future polls its own build for `key`, which resolves to `value`.
    Building { key: u8, value: u32 },
    /// Its future waits on another caller's build of `key`; it had `wakes` wakes then.
    Waiting { key: u8, wakes: usize },
}

struct Caller {
    call: Option<Call>,
    role: Option<Role>,
    /// The value its build resolves to.
    value: u32,
    finish: Arc<AtomicBool>,
    wakes: Arc<Wakes>,
    waker: Waker,
}

impl Caller {
    fn new() -> Self {
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        Self {
            call: None,
            role: None,
            value: 0,
            finish: Arc::new(AtomicBool::new(false)),
            waker: Waker::from(Arc::clone(&wakes)),
            wakes,
        }
    }

    fn wakes(&self) -> usize {
        self.wakes.0.load(Ordering::SeqCst)
    }
}

struct Model {
    cached: HashMap<u8, u32>,
    /// The caller building each key.
    builder: HashMap<u8, usize>,
}

/// Applies `input` to a cache and to the model; `Err` names the first difference.
pub fn run(input: Input) -> Outcome {
    let cache = Arc::new(
        Cache::<u8, u32>::builder()
            .capacity(64)
            .when_full(WhenFull::Reject)
            .build()
            .expect("a valid configuration"),
    );
    let mut callers: Vec<Caller> = (0..CALLERS).map(|_| Caller::new()).collect();
    let mut model = Model {
        cached: HashMap::new(),
        builder: HashMap::new(),
    };
    for (step, op) in input.ops.into_iter().enumerate() {
        let at = format!("step {step} ({op:?})");
        match op {
            Op::Start { slot, key, value } => {
                let (slot, key) = (usize::from(slot % CALLERS), key % KEYS);
                drop_call(&mut callers, &mut model, slot, &at)?;
                let c = &mut callers[slot];
                c.finish = Arc::new(AtomicBool::new(false));
                c.value = value;
                let gate = Gate(Arc::clone(&c.finish));
                let cache = Arc::clone(&cache);
                c.call = Some(Box::pin(async move {
                    cache
                        .get_or_insert_with_async(key, async move {
                            gate.await;
                            value
                        })
                        .await
                }));
                // Before its first poll, a caller's role is decided by the state it meets.
                c.role = Some(Role::Waiting { key, wakes: 0 });
                poll(&mut callers, &mut model, slot, &at)?;
            }
            Op::Poll(slot) => poll(&mut callers, &mut model, usize::from(slot % CALLERS), &at)?,
            Op::Finish(slot) => {
                let c = &callers[usize::from(slot % CALLERS)];
                c.finish.store(true, Ordering::SeqCst);
            }
            Op::Drop(slot) => {
                drop_call(&mut callers, &mut model, usize::from(slot % CALLERS), &at)?
            }
            Op::Get(key) => {
                let key = key % KEYS;
                ensure_eq!(
                    cache.get(&key).map(|v| *v),
                    model.cached.get(&key).copied(),
                    "{at}: get"
                );
            }
            Op::Remove(key) => {
                let key = key % KEYS;
                ensure_eq!(
                    cache.remove(&key).map(|v| *v),
                    model.cached.remove(&key),
                    "{at}: remove"
                );
            }
            Op::Insert(key, value) => {
                let key = key % KEYS;
                if !model.builder.contains_key(&key) {
                    let old = cache.insert(key, value).map_err(|e| format!("{at}: {e}"))?;
                    ensure_eq!(
                        old.map(|v| *v),
                        model.cached.insert(key, value),
                        "{at}: insert"
                    );
                }
            }
        }
        ensure_eq!(cache.len(), model.cached.len(), "{at}: len");
    }
    // Every future dropped, the cache holds exactly the model's entries.
    for slot in 0..usize::from(CALLERS) {
        drop_call(&mut callers, &mut model, slot, "the end")?;
    }
    for (k, v) in &model.cached {
        ensure_eq!(cache.get(k).map(|v| *v), Some(*v), "the end: key {k}");
    }
    cache.__validate().map_err(|e| format!("the end: {e}"))
}

/// Polls caller `slot`'s future (if any) and checks what it did against the model.
fn poll(callers: &mut [Caller], model: &mut Model, slot: usize, at: &str) -> Outcome {
    let Some(call) = callers[slot].call.as_mut() else {
        return Ok(());
    };
    let role = callers[slot]
        .role
        .expect("a caller with a future has a role");
    let key = match role {
        Role::Building { key, .. } | Role::Waiting { key, .. } => key,
    };
    // What the model expects of this poll: a waiter whose build is over takes the cached
    // value, or builds itself if there is none (and no one else does).
    if let Role::Waiting { .. } = role {
        if !model.builder.contains_key(&key) && !model.cached.contains_key(&key) {
            let value = callers[slot].value;
            model.builder.insert(key, slot);
            callers[slot].role = Some(Role::Building { key, value });
        }
    }
    let waker = callers[slot].waker.clone();
    let polled = call.as_mut().poll(&mut Context::from_waker(&waker));
    let role = callers[slot].role.expect("set above");
    match (role, polled) {
        (Role::Building { value, .. }, Poll::Ready(got)) => {
            ensure!(
                callers[slot].finish.load(Ordering::SeqCst),
                "{at}: caller {slot}'s build finished before it was let finish"
            );
            ensure_eq!(
                got.map(|v| *v).ok(),
                Some(value),
                "{at}: the builder's value"
            );
            model.builder.remove(&key);
            model.cached.insert(key, value);
            ended(callers, key, at)?;
            callers[slot].call = None;
            callers[slot].role = None;
        }
        (Role::Building { .. }, Poll::Pending) => ensure!(
            !callers[slot].finish.load(Ordering::SeqCst),
            "{at}: caller {slot}'s build was let finish but its future is pending"
        ),
        (Role::Waiting { .. }, Poll::Ready(got)) => {
            let expected = model.cached.get(&key).copied();
            ensure!(
                expected.is_some(),
                "{at}: caller {slot} got a value with none cached"
            );
            ensure_eq!(got.map(|v| *v).ok(), expected, "{at}: a waiter's value");
            callers[slot].call = None;
            callers[slot].role = None;
        }
        (Role::Waiting { .. }, Poll::Pending) => {
            ensure!(
                model.builder.contains_key(&key),
                "{at}: caller {slot} waits while nobody builds key {key}"
            );
            let wakes = callers[slot].wakes();
            callers[slot].role = Some(Role::Waiting { key, wakes });
        }
    }
    Ok(())
}

/// Drops caller `slot`'s future; a builder's drop ends its attempt.
fn drop_call(callers: &mut [Caller], model: &mut Model, slot: usize, at: &str) -> Outcome {
    let c = &mut callers[slot];
    let role = c.role.take();
    drop(c.call.take());
    if let Some(Role::Building { key, .. }) = role {
        model.builder.remove(&key);
        ended(callers, key, at)?;
    }
    Ok(())
}

/// An attempt on `key` ended: every caller that went pending waiting on it was woken since.
fn ended(callers: &[Caller], key: u8, at: &str) -> Outcome {
    for (i, c) in callers.iter().enumerate() {
        if let Some(Role::Waiting { key: k, wakes }) = c.role {
            if k == key && c.call.is_some() {
                ensure!(
                    c.wakes() > wakes,
                    "{at}: caller {i}, waiting on key {key}, was not woken when the attempt ended"
                );
            }
        }
    }
    Ok(())
}
