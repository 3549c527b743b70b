//! Expiry: the clock entries' deadlines are read against, the policy that sets them, and
//! the timer wheel that takes expired entries out.
//!
//! A deadline is a node's own word (nanoseconds on the cache's [`Clock`], [`NEVER`] for
//! none), written before its value is published. A lookup that finds a value past its
//! deadline treats it as absent, whatever has reclaimed it or not; so an expired entry is
//! never returned. A time-to-idle read moves the deadline forward, at most once per
//! [`TICK`] (a plain store to the entry, as the frequency mark is). The wheel takes expired
//! entries out of the table, their weight back to the budget and their values to the
//! listener as [`RemovalCause::Expired`], as the writes that run its steps or
//! [`purge`](super::RawCache::purge_expired) reach their time.
//!
//! # Invariants of the wheel
//!
//! - **X1 (one keeper).** The wheel's buckets are touched only by the thread that holds its
//!   `keeper` flag, which a thread takes by a swap and never waits for: one that finds it
//!   held goes on without a step (the holder is stepping). So the buckets are plain vectors
//!   behind an `UnsafeCell`, and nothing on a lookup or a write waits for the wheel.
//! - **X2 (schedules are hints).** A node is scheduled once per deadline it was published
//!   with (a record of it into its bucket, by a writer that takes the keeper flag for it, or
//!   else into the lock-free inbox, which the keeper drains into the buckets). A bucket
//!   holds a record at or before its node's deadline's time: a step hands out the records
//!   that came due, and a node that one of them finds with its deadline moved later (a
//!   time-to-idle read) is scheduled again. So a node is taken out as expired only by a
//!   thread that read its deadline passed, through the same compare-and-swap as every
//!   other removal, and at most once.
//! - **X3 (no schedule forgotten).** Writes skip the wheel while its step hint says nothing
//!   can be due: a tick, and a count of schedules, in one word. A schedule lowers the tick
//!   to its deadline's and counts itself; the keeper reads the word before it drains the
//!   inbox and raises the tick to the wheel's next one only if the word is still what it
//!   read. Both are read-modify-writes of that one word, so a node scheduled while the
//!   keeper steps (after its drain) keeps a tick at or before its deadline's, and the first
//!   step from then on places it. A hint that is low only costs a step that finds nothing.
//!   A writer that places its node itself holds the flag, so no keeper raises the tick
//!   meanwhile: it lowers the tick and leaves the count, which counts the inbox's nodes.
//! - **X4 (records own nothing).** A record is a node's hash, its address and the deadline
//!   it was scheduled with; it holds no count of the node. Its address is only compared
//!   with the nodes a table leads to under a guard (`Shard::leads_to`, `Shard::holding`),
//!   and a node is loaded only once the table has led to it (H3), so a record may outlive
//!   its node, and an evicted or removed entry's node leaves through the epoch as in a
//!   cache without expiry, while it is still warm. A record whose node the table no longer
//!   leads to is dropped when a step or a sweep looks for it. One that finds a newer node
//!   of the same key at the same address finds a live entry with a record of its own; so
//!   that such records cannot pile up, a thorough sweep keeps, per node, the first record
//!   it reaches and the one with the node's own deadline, by the node's wheel mark (the
//!   sweep's generation, written only by the keeper, X1), and a sweep is thorough once
//!   quick ones keep more than twice what the last thorough one kept.

#![allow(unsafe_code)]

use super::counter::Counter;
use super::node::Node;
use super::table::Shard;
use super::write::Take;
use super::{Pin, RawCache, RemovalCause};
use crate::sync::{AtomicBool, AtomicU64, Ordering, Queue, UnsafeCell};
use crossbeam_epoch::Guard;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

pub(crate) use super::node::NEVER;
pub use clock::{Clock, ManualClock};

mod clock;

/// The wheel's finest bucket, in bits of nanoseconds (2^20 ns, about 1 ms): an expired entry
/// is taken out within about this long after its deadline once steps run, and a
/// time-to-idle read writes its entry's deadline at most once per tick.
const TICK_BITS: u32 = 20;
/// [`TICK_BITS`] as a duration in nanoseconds.
pub(crate) const TICK: u64 = 1 << TICK_BITS;
/// Buckets per level, in bits: each level's bucket spans the whole of the level below.
const SPAN_BITS: u32 = 6;
const SPAN: usize = 1 << SPAN_BITS;
/// Levels: 64 ticks (67 ms), 4.3 s, 4.6 min and 4.9 h a turn; later deadlines wait in the
/// overflow and are placed again once they come within the last level's turn.
const LEVELS: usize = 4;
/// A step that finds the wheel this many ticks behind places everything again rather than
/// turning bucket by bucket: the work is then bound by the entries, not by the time idle.
const JUMP: u64 = (SPAN as u64) * (SPAN as u64);
/// The most expired entries one write's step takes out, so that no write pays for a burst
/// of deadlines alone; [`purge`](super::RawCache::purge_expired) takes them all.
pub(crate) const STEP: usize = if cfg!(runcache_loom) { 2 } else { 256 };
/// Schedules after which a write steps the wheel though nothing is due, to drain the inbox
/// into the buckets, where the sweep of dead records reaches them: so what the wheel holds
/// stays bound by the live entries (see [`SWEEP_AT`], plus this many) instead of growing
/// with every write until the first deadline. Lower drains in smaller batches, more often.
const DRAIN: u64 = if cfg!(runcache_loom) { 2 } else { 1024 };

/// How many records the wheel holds, per record its last sweep kept, before it sweeps
/// again (X4). Each sweep asks the table about every record, so a schedule costs
/// `SWEEP_AT / (SWEEP_AT - 1)` such probes, amortized; and up to `SWEEP_AT` records of 24
/// bytes wait per live entry. Higher probes less and holds more (`docs/EXPERIMENTS.md`,
/// "Expiry", has what 2 and 4 cost a churning cache).
const SWEEP_AT: usize = 4;

/// Bits of the step hint (X3) that count schedules; the others hold a tick.
const COUNT_BITS: u32 = 20;
/// The hint's tick for "nothing scheduled": past every deadline's tick.
const NO_TICK: u64 = u64::MAX >> COUNT_BITS;

/// The step hint's bits that count schedules.
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// The step hint (X3): the tick `at` (capped at [`NO_TICK`]) and the low bits of `count`.
fn hint(at: u64, count: u64) -> u64 {
    (at.min(NO_TICK) << COUNT_BITS) | (count & COUNT_MASK)
}

/// The first tick at whose start a deadline has surely passed: the wheel hands a node out
/// when it turns to that tick, within a tick of its deadline.
fn due_tick(deadline: u64) -> u64 {
    (deadline >> TICK_BITS) + 1
}

/// A duration in nanoseconds, saturating.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The deadline `d` after `now`; [`NEVER`] if it lies past the clock's end.
pub(crate) fn after(now: u64, d: Duration) -> u64 {
    after_nanos(now, nanos(d))
}

/// The deadline `d` nanoseconds after `now`; [`NEVER`] if it lies past the clock's end.
fn after_nanos(now: u64, d: u64) -> u64 {
    now.checked_add(d).unwrap_or(NEVER)
}

/// The time left from `now` to `deadline`, `None` for a deadline that never comes.
pub(crate) fn left(now: u64, deadline: u64) -> Option<Duration> {
    (deadline != NEVER).then(|| Duration::from_nanos(deadline.saturating_sub(now)))
}

/// When an entry expires, decided per entry (see
/// [`CacheBuilder::expire_after`](crate::CacheBuilder::expire_after)).
///
/// Each method returns the time the entry has left from now; `None` from
/// [`after_read`](Self::after_read) and [`after_update`](Self::after_update) keeps the
/// deadline it has. A duration past the clock's end (`Duration::MAX`) means never; a zero
/// duration expires the entry at once. The methods run on the caller's thread, inside the
/// operation that asked: a panic there unwinds that operation as a panicking builder or
/// weigher does (the entry is not cached and its weight is not taken; a read keeps the
/// entry as it was).
///
/// ```
/// use runcache::{Cache, Clock, Expiry};
/// use std::time::Duration;
///
/// /// Plans live as long as their statistics stay fresh: the value says how long.
/// struct Fresh;
/// impl Expiry<&'static str, u64> for Fresh {
///     fn after_create(&self, _: &&'static str, secs: &u64) -> Option<Duration> {
///         Some(Duration::from_secs(*secs))
///     }
/// }
///
/// let (clock, hand) = Clock::manual();
/// let cache = Cache::builder().capacity(10).expire_after(Fresh).clock(clock).build()?;
/// cache.put("short", 1).unwrap();
/// cache.put("long", 100).unwrap();
/// hand.advance(Duration::from_secs(2));
/// assert!(cache.get("short").is_none());
/// assert!(cache.get("long").is_some());
/// # Ok::<(), runcache::ConfigError>(())
/// ```
pub trait Expiry<K, V>: Send + Sync {
    /// The time a new entry lives; `None`: it never expires.
    fn after_create(&self, key: &K, value: &V) -> Option<Duration>;

    /// The time an entry has left after a lookup found it, given what it had left
    /// (`None`: it never expires); `None` keeps its deadline. The default keeps it.
    fn after_read(&self, key: &K, value: &V, left: Option<Duration>) -> Option<Duration> {
        let _ = (key, value, left);
        None
    }

    /// The time an entry has left after an insert replaced its value, given what the old
    /// value had left; `None` keeps the old deadline. The default keeps it.
    fn after_update(&self, key: &K, value: &V, left: Option<Duration>) -> Option<Duration> {
        let _ = (key, value, left);
        None
    }
}

/// What the wheel holds: a record of a scheduled node.
pub(crate) trait Scheduled {
    /// The deadline it was scheduled with.
    fn deadline(&self) -> u64;
}

/// The mark's bits that hold a sweep's generation (X4); a new node's mark, 0, is none.
const GENERATION: u8 = 0x7f;
/// The mark's bit set once a sweep kept the record with the node's own deadline (X4).
const EXACT: u8 = 0x80;

/// How a cache sets its entries' deadlines: one rule per cache (a policy can combine the
/// others, as the builder's error says).
pub(crate) enum Rule<K, V> {
    /// A fixed time from each write, in nanoseconds.
    Live(u64),
    /// A fixed time from each write or read, in nanoseconds.
    Idle(u64),
    /// The user's policy.
    Policy(Box<dyn Expiry<K, V>>),
}

/// A record of a node for the wheel (X4): it owns nothing, and its address is never
/// loaded before a table has led to it.
pub(crate) struct Record<K, V> {
    hash: u64,
    node: *const Node<K, V>,
    deadline: u64,
}

// SAFETY: (X4) a record owns nothing and only compares its address; the node it names is
// loaded only through a table, under a guard.
unsafe impl<K, V> Send for Record<K, V> {}

impl<K, V> Record<K, V> {
    /// A record of `node` at its deadline now.
    fn of(node: &Node<K, V>) -> Self {
        Self {
            hash: node.hash,
            node,
            deadline: node.deadline(),
        }
    }
}

impl<K, V> Scheduled for Record<K, V> {
    fn deadline(&self) -> u64 {
        self.deadline
    }
}

/// A cache's expiry rule and its wheel.
pub(crate) struct Expiring<K, V, T> {
    clock: Clock,
    rule: Rule<K, V>,
    /// Nodes published with a deadline, for the keeper to place (X2).
    inbox: Queue<T>,
    /// Held by the thread stepping the wheel (X1).
    keeper: AtomicBool,
    wheel: UnsafeCell<Wheel<T>>,
    /// The step hint (X3): the tick before which no step can find work, and a count of
    /// schedules (so that a keeper raises the tick only if nothing was scheduled while it
    /// stepped).
    due: AtomicU64,
    /// The hint's count of schedules when a keeper last drained the inbox; written only by
    /// the keeper (X1).
    drained: AtomicU64,
}

// SAFETY: (X1) the wheel is touched only by the keeper; everything else is Sync.
unsafe impl<K, V, T: Send> Sync for Expiring<K, V, T> {}

impl<K, V, T: Scheduled> Expiring<K, V, T> {
    pub(crate) fn new(clock: Clock, rule: Rule<K, V>) -> Self {
        let now = clock.now();
        Self {
            clock,
            rule,
            inbox: Queue::new(),
            keeper: AtomicBool::new(false),
            wheel: UnsafeCell::new(Wheel::new(now >> TICK_BITS)),
            due: AtomicU64::new(hint(NO_TICK, 0)),
            drained: AtomicU64::new(0),
        }
    }

    /// Now, on the cache's clock.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Whether a value due at `deadline` has expired at `now`.
    #[inline(always)]
    pub(crate) fn is_past(&self, deadline: u64, now: u64) -> bool {
        deadline != NEVER && deadline <= now
    }

    /// The deadline of a new entry created `now`.
    pub(crate) fn on_create(&self, key: &K, value: &V, now: u64) -> u64 {
        match &self.rule {
            Rule::Live(d) | Rule::Idle(d) => after_nanos(now, *d),
            Rule::Policy(p) => p.after_create(key, value).map_or(NEVER, |d| after(now, d)),
        }
    }

    /// The deadline of a value that replaced one due at `old`.
    pub(crate) fn on_update(&self, key: &K, value: &V, old: u64, now: u64) -> u64 {
        match &self.rule {
            Rule::Live(d) | Rule::Idle(d) => after_nanos(now, *d),
            Rule::Policy(p) => p
                .after_update(key, value, left(now, old))
                .map_or(old, |d| after(now, d)),
        }
    }

    /// The new deadline after a read `now` of an entry due at `old`, if it moves. A moved
    /// deadline is written only if it moves by a tick or more, or the old one is within a
    /// tick: a time-to-idle entry read all the time writes its deadline once per tick.
    #[inline]
    pub(crate) fn on_read(&self, key: &K, value: &V, old: u64, now: u64) -> Option<u64> {
        let new = match &self.rule {
            Rule::Live(_) => return None,
            Rule::Idle(d) => after_nanos(now, *d),
            Rule::Policy(p) => after(now, p.after_read(key, value, left(now, old))?),
        };
        (new != old && (new.abs_diff(old) >= TICK || old.saturating_sub(now) < TICK)).then_some(new)
    }

    /// Hands the wheel a record of a node just published (X2): straight into its bucket if
    /// no thread is stepping the wheel (X1), else through the inbox. `keep` judges records
    /// for a sweep of dead ones, if one falls due: whether a record, in the sweep of that
    /// generation, is one to keep (X4).
    pub(crate) fn schedule(&self, node: T, keep: impl FnMut(&T, u8) -> bool) {
        let deadline = node.deadline();
        if deadline == NEVER {
            return;
        }
        let at = deadline >> TICK_BITS;
        // Acquire: pairs with the Release that let the wheel go (X1), as a step's does.
        if !self.keeper.swap(true, Ordering::Acquire) {
            self.wheel.with_mut(|w| {
                // SAFETY: (X1) the flag is ours: no other thread touches the wheel.
                let w = unsafe { &mut *w };
                w.place(node);
                w.sweep_dead(keep);
            });
            // The node is in the wheel, not the inbox, so the hint's count is left alone;
            // only its tick is lowered, while no keeper can raise it (X3). Relaxed: a hint.
            if self.due.load(Ordering::Relaxed) >> COUNT_BITS > at {
                let _ = self
                    .due
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                        Some(hint(at.min(h >> COUNT_BITS), h))
                    });
            }
            self.let_go();
            return;
        }
        self.inbox.push(node);
        // Relaxed: a hint (X3); read-modify-writes, so no lowering is lost to a keeper's
        // update, which reads the same word.
        let _ = self
            .due
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                Some(hint(at.min(h >> COUNT_BITS), h + 1))
            });
    }

    /// Lets the wheel go (X1).
    #[inline]
    fn let_go(&self) {
        // Release: pairs with the next keeper's Acquire swap (X1). A store: a swap that
        // takes the flag is a read-modify-write, which reads the last value of the flag,
        // so it finds this one once it is stored. A swap here cost a churning write a
        // wait for its stores to drain (`docs/EXPERIMENTS.md`, "Expiry"). loom 0.7 lets a
        // store land between the read and the write of another thread's swap (its issue
        // 254: the flag then stays taken for good), so the models let go by a swap.
        #[cfg(not(runcache_loom))]
        self.keeper.store(false, Ordering::Release);
        #[cfg(runcache_loom)]
        let _ = self.keeper.swap(false, Ordering::Release);
    }

    /// Whether a step may find work: something scheduled since the last step may be due,
    /// or a deadline in the wheel reached (X3); or the inbox has [`DRAIN`] schedules to
    /// drain.
    #[inline]
    pub(crate) fn step_due(&self, now: u64) -> bool {
        // Relaxed: hints (X3); a stale `drained` only moves a drain by a step.
        let h = self.due.load(Ordering::Relaxed);
        h >> COUNT_BITS <= now >> TICK_BITS
            || h.wrapping_sub(self.drained.load(Ordering::Relaxed)) & COUNT_MASK >= DRAIN
    }

    /// Steps the wheel to `now` if no other thread is stepping it (X1): places what the
    /// inbox holds, and hands `expire` each record whose deadline passed, up to `most` of
    /// them (the rest stay due for the next step); `keep` as in [`schedule`](Self::schedule).
    /// `expire` runs after the wheel is let go, so a listener it calls may use the cache
    /// and it may schedule again. Returns how many it was handed.
    pub(crate) fn step(
        &self,
        now: u64,
        most: usize,
        keep: impl FnMut(&T, u8) -> bool,
        mut expire: impl FnMut(T),
    ) -> usize {
        // Acquire: pairs with the Release that let the wheel go, so this keeper sees the
        // buckets as the last one left them (X1).
        if self.keeper.swap(true, Ordering::Acquire) {
            return 0;
        }
        // Read before the inbox is drained (X3). Relaxed: a hint.
        let seen = self.due.load(Ordering::Relaxed);
        // Relaxed: a hint, the keeper's own (X1).
        self.drained.store(seen & COUNT_MASK, Ordering::Relaxed);
        let (taken, next) = self.wheel.with_mut(|w| {
            // SAFETY: (X1) the flag is ours: no other thread touches the wheel.
            let w = unsafe { &mut *w };
            w.now = w.now.max(now);
            while let Some(n) = self.inbox.pop() {
                w.place(n);
            }
            let taken = w.advance(now, most, keep);
            (taken, w.next_due())
        });
        // Raised to the wheel's next tick only if nothing was scheduled since `seen` (X3).
        // Relaxed: a hint.
        let _ = self
            .due
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                let at = if h == seen {
                    next
                } else {
                    next.min(h >> COUNT_BITS)
                };
                Some(hint(at, h))
            });
        self.let_go();
        let n = taken.len();
        taken.into_iter().for_each(&mut expire);
        n
    }

    /// Records the wheel holds, including those whose values left the cache since (tests).
    #[cfg(test)]
    pub(crate) fn scheduled(&self) -> usize {
        // SAFETY: (X1) the tests step the wheel from one thread, so none is stepping it now.
        self.inbox.len() + self.wheel.with_mut(|w| unsafe { &*w }.len)
    }
}

/// The buckets (X1): `levels[l * SPAN + i]` holds nodes due within the `i`th span of level
/// `l`'s turn, `due` those found due and not yet handed out.
struct Wheel<T> {
    /// The tick the wheel has been turned to.
    tick: u64,
    /// The time of the last step: a node placed with its deadline passed is due at once.
    now: u64,
    /// `LEVELS * SPAN` buckets, level by level (on the heap: a whole wheel is 6 KiB of
    /// vectors).
    levels: Box<[Vec<T>]>,
    overflow: Vec<T>,
    due: Vec<T>,
    /// Nodes in the buckets, `due` included.
    len: usize,
    /// Records kept when the wheel last dropped its dead ones (for the next drop's due).
    live_at_sweep: usize,
    /// The generation of the last thorough sweep of dead records (X4): 1 to
    /// [`GENERATION`].
    generation: u8,
    /// Records kept by the last thorough sweep.
    kept_thorough: usize,
}

impl<T: Scheduled> Wheel<T> {
    fn new(tick: u64) -> Self {
        Self {
            tick,
            now: 0,
            levels: (0..LEVELS * SPAN).map(|_| Vec::new()).collect(),
            overflow: Vec::new(),
            due: Vec::new(),
            len: 0,
            live_at_sweep: 0,
            generation: 0,
            kept_thorough: 0,
        }
    }

    /// Puts a record in the bucket of its deadline, relative to the wheel's tick.
    fn place(&mut self, n: T) {
        let deadline = n.deadline();
        let at = due_tick(deadline);
        self.len += 1;
        if at <= self.tick || deadline <= self.now {
            self.due.push(n);
            return;
        }
        // The finest level whose turn reaches `at`: level `l` spans deltas below
        // `SPAN^(l + 1)` ticks, so it is the delta's highest bit over `SPAN_BITS`.
        let delta = at - self.tick;
        let level = (u64::BITS - 1 - delta.leading_zeros()) / SPAN_BITS;
        if (level as usize) < LEVELS {
            let i = (at >> (SPAN_BITS * level)) as usize & (SPAN - 1);
            self.levels[level as usize * SPAN + i].push(n);
        } else {
            self.overflow.push(n);
        }
    }

    /// Turns the wheel to `now`, and takes up to `most` records whose deadlines passed.
    fn advance(&mut self, now: u64, most: usize, keep: impl FnMut(&T, u8) -> bool) -> Vec<T> {
        let target = now >> TICK_BITS;
        let mut taken = Vec::new();
        if target > self.tick.saturating_add(JUMP) {
            // Long idle: place everything again, relative to now.
            let all = self.drain_all();
            self.tick = target;
            all.into_iter().for_each(|n| self.place(n));
        }
        loop {
            while taken.len() < most {
                let Some(n) = self.due.pop() else { break };
                self.len -= 1;
                if n.deadline() > now {
                    // Due by its tick, not yet by its time: it waits again (X2).
                    self.place(n);
                    continue;
                }
                taken.push(n);
            }
            if taken.len() >= most || self.tick >= target {
                break;
            }
            self.turn();
        }
        self.sweep_dead(keep);
        taken
    }

    /// Moves the wheel one tick on: the buckets that turn over are placed again, and the
    /// finest bucket of the new tick becomes due.
    fn turn(&mut self) {
        self.tick += 1;
        let t = self.tick;
        // The coarser levels whose span begins at this tick, coarsest first.
        for level in (1..LEVELS).rev() {
            if t & ((1 << (SPAN_BITS * level as u32)) - 1) == 0 {
                let i = (t >> (SPAN_BITS * level as u32)) as usize & (SPAN - 1);
                let nodes = std::mem::take(&mut self.levels[level * SPAN + i]);
                self.len -= nodes.len();
                nodes.into_iter().for_each(|n| self.place(n));
                if level == LEVELS - 1 && i == 0 {
                    let far = std::mem::take(&mut self.overflow);
                    self.len -= far.len();
                    far.into_iter().for_each(|n| self.place(n));
                }
            }
        }
        let i = t as usize & (SPAN - 1);
        let nodes = std::mem::take(&mut self.levels[i]);
        self.due.extend(nodes);
    }

    fn drain_all(&mut self) -> Vec<T> {
        let mut all = std::mem::take(&mut self.due);
        for b in self.levels.iter_mut() {
            all.append(b);
        }
        all.append(&mut self.overflow);
        self.len = 0;
        all
    }

    /// Drops the records `keep` does not keep once the wheel holds [`SWEEP_AT`] times as
    /// many as the last sweep kept (a removed or evicted node's record waits in its bucket
    /// until its deadline's tick otherwise): the work is amortized over the removals that
    /// made them.
    ///
    /// A sweep is quick (generation 0: the table is asked only whether it leads to each
    /// record's address) while it keeps at most twice what the last thorough one kept (plus
    /// its slack), and thorough (a generation of its own: one record per node, X4) after
    /// one that kept more, so duplicates that quick sweeps keep cannot pile up.
    fn sweep_dead(&mut self, mut keep: impl FnMut(&T, u8) -> bool) {
        if self.len < SWEEP_AT * self.live_at_sweep + 1024 {
            return;
        }
        let g = if self.live_at_sweep > 2 * self.kept_thorough + 1024 {
            self.generation = self.generation % GENERATION + 1;
            self.generation
        } else {
            0
        };
        let mut sweep = |b: &mut Vec<T>| b.retain(|n| keep(n, g));
        sweep(&mut self.due);
        self.levels.iter_mut().for_each(&mut sweep);
        sweep(&mut self.overflow);
        self.len =
            self.due.len() + self.overflow.len() + self.levels.iter().map(Vec::len).sum::<usize>();
        if g != 0 {
            self.kept_thorough = self.len;
        }
        self.live_at_sweep = self.len;
    }

    /// The earliest tick a step may find a node due in: the wheel's tick while nodes are
    /// due, else its next one; [`NO_TICK`] when it holds none.
    fn next_due(&self) -> u64 {
        if !self.due.is_empty() {
            self.now >> TICK_BITS
        } else if self.len == 0 {
            NO_TICK
        } else {
            self.tick + 1
        }
    }
}

impl<K, V> Expiring<K, V, Record<K, V>> {
    /// A lookup's read of `node`'s `value`: whether it is before its deadline, and if so
    /// the deadline's move, where reads move it (X2).
    #[inline]
    pub(crate) fn read(&self, node: &Node<K, V>, value: &V) -> bool {
        let now = self.now();
        let deadline = node.deadline();
        if self.is_past(deadline, now) {
            return false;
        }
        if let Some(new) = self.on_read(node.key(), value, deadline, now) {
            node.set_deadline(new);
        }
        true
    }
}

impl<K, V, S> RawCache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The deadline of a new entry, made now; [`NEVER`] in a cache that expires nothing.
    pub(super) fn deadline_of_new(&self, key: &K, value: &V) -> u64 {
        match &self.expiry {
            None => NEVER,
            Some(x) => x.on_create(key, value, x.now()),
        }
    }

    /// The deadline `ttl` from now, whatever the cache's rule; [`NEVER`] in a cache that
    /// expires nothing.
    pub(super) fn deadline_in(&self, ttl: Duration) -> u64 {
        match &self.expiry {
            None => NEVER,
            Some(x) => after(x.now(), ttl),
        }
    }

    /// Whether this cache has an expiry rule (and so a wheel to reclaim by).
    pub(crate) fn expires(&self) -> bool {
        self.expiry.is_some()
    }

    /// The deadline of a value replacing one due at `old`.
    pub(super) fn deadline_of_update(&self, key: &K, value: &V, old: u64) -> u64 {
        match &self.expiry {
            None => NEVER,
            Some(x) => x.on_update(key, value, old, x.now()),
        }
    }

    /// Hands the wheel a record of a node just published (X2), and takes a step of it: up
    /// to [`STEP`] expired entries out, if any can be due. `guard` pins this cache.
    pub(super) fn scheduled(&self, node: &Node<K, V>, guard: &Guard) {
        let Some(x) = &self.expiry else { return };
        x.schedule(Record::of(node), |r, g| self.keeps(r, g, guard));
        self.expire_step(x, STEP);
    }

    /// Whether a sweep of generation `g` keeps record `r` (X4). A quick one (0): whether
    /// the table leads to its address. A thorough one: whether its node is still cached
    /// where the table leads, and the record is the first of it the sweep reached, or the
    /// first with the node's own deadline.
    fn keeps(&self, r: &Record<K, V>, g: u8, guard: &Guard) -> bool {
        let shard = self.shard(r.hash);
        if g == 0 {
            return shard.leads_to(r.hash, r.node, guard);
        }
        let Some(node) = shard.holding(r.hash, r.node, guard) else {
            return false;
        };
        if !node.is_cached() {
            return false;
        }
        let exact = if r.deadline == node.deadline() {
            EXACT
        } else {
            0
        };
        let mark = node.wheel_mark();
        // Relaxed: the mark is the keeper's alone (X1, X4).
        let m = mark.load(Ordering::Relaxed);
        let keep = m & GENERATION != g || exact & !m != 0;
        if keep {
            let m = if m & GENERATION == g { m } else { g };
            mark.store(m | exact, Ordering::Relaxed);
        }
        keep
    }

    /// Takes out up to [`STEP`] expired entries for a reservation that found no room;
    /// whether it took any out.
    pub(super) fn expire_for_room(&self) -> bool {
        self.expiry
            .as_ref()
            .is_some_and(|x| self.expire_step(x, STEP) > 0)
    }

    /// Takes out up to `most` expired entries, if the wheel can hold any due and no other
    /// thread is stepping it (X1); returns how many it took out.
    #[inline]
    fn expire_step(&self, x: &Expiring<K, V, Record<K, V>>, most: usize) -> usize {
        let now = x.now();
        if !x.step_due(now) {
            return 0;
        }
        self.expire_step_at(x, now, most)
    }

    /// [`expire_step`](Self::expire_step) once the hint says a step may find work: apart,
    /// so that the check every write makes stays a few instructions.
    #[inline(never)]
    fn expire_step_at(&self, x: &Expiring<K, V, Record<K, V>>, now: u64, most: usize) -> usize {
        let pin = self.pin();
        let guard = &pin.guard;
        let mut out = 0;
        let keep = |r: &Record<K, V>, g| self.keeps(r, g, guard);
        x.step(now, most, keep, |r| {
            let shard = self.shard(r.hash);
            let Some(node) = shard.holding(r.hash, r.node, guard) else {
                return;
            };
            if self.take_expired(node, shard, &pin) {
                out += 1;
            } else if node.is_cached() {
                // Its deadline moved later (a time-to-idle read): scheduled again (X2).
                x.schedule(Record::of(node), keep);
            }
        });
        out
    }

    /// Takes the value of a node past its deadline out (the listener hears
    /// [`RemovalCause::Expired`]); whether this call took it.
    pub(super) fn take_expired(
        &self,
        node: &Node<K, V>,
        shard: &Shard<K, V>,
        pin: &Pin<'_>,
    ) -> bool {
        let how = Take::node(RemovalCause::Expired);
        match self.take_if(node, shard, pin, how, |_| self.expired(node)) {
            Some((weight, _)) => {
                pin.stats.bump(Counter::Expiration);
                self.retired(pin, weight, self.budget.capacity());
                true
            }
            None => false,
        }
    }

    /// Takes out every entry whose deadline has passed, unless another thread is doing so
    /// (X1); returns how many this call took out.
    pub(crate) fn purge_expired(&self) -> usize {
        let Some(x) = &self.expiry else { return 0 };
        let mut out = 0;
        loop {
            let n = self.expire_step(x, usize::MAX);
            out += n;
            if n == 0 {
                break;
            }
        }
        self.passing_on(out)
    }
}

#[cfg(all(test, not(runcache_loom)))]
mod tests;
