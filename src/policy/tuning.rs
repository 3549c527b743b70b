//! The eviction policy's tuning values, in one place.
//!
//! Every value a rule of the policy is tuned by is a field of [`Tuning`], with a line on
//! what it trades; [`Tuning::DEFAULT`] holds the values every cache uses. The measurements
//! behind them are in `docs/EXPERIMENTS.md`, the rule each one tunes in `docs/DESIGN.md`.
//! With the `tuning` feature a cache can be built with other values
//! (`CacheBuilder::tuning`), so that the trace tool can replay a change of one value or
//! switch a rule off without a new build; no other caller should need to.

#[cfg(feature = "tuning")]
use std::{fmt, ops::RangeInclusive};

/// The unit of the small queue's shares: a share of `ONE` is the whole capacity.
pub(crate) const ONE: u32 = 1 << 16;

macro_rules! tuning {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $ty:ty = $default:expr, within $range:expr;
    )*) => {
        /// The eviction policy's tuning values (see the module's documentation).
        ///
        /// Each field says what it trades; the shares are in 1/65,536 of the capacity.
        /// Values are set by name with `set`, which checks each against its
        /// range, and `check`ed together when a cache is built (both with the `tuning` feature).
        #[derive(Clone, Copy, Debug, PartialEq)]
        #[non_exhaustive]
        pub struct Tuning {
            $($(#[doc = $doc])* pub $name: $ty,)*
        }

        impl Tuning {
            /// The values every cache is built with.
            pub const DEFAULT: Tuning = Tuning { $($name: $default,)* };

            /// The fields' names, in their order.
            #[cfg(feature = "tuning")]
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// Sets the field `name` to `value`, parsed as the field's type.
            ///
            /// # Errors
            /// [`TuningError`] when no field has that name, or the value does not parse or
            /// is outside the field's range; the field is left as it was.
            ///
            /// ```
            /// let mut t = runcache::Tuning::DEFAULT;
            /// t.set("promote_hits", "3")?;
            /// assert_eq!(t.promote_hits, 3);
            /// let err = t.set("promote_hits", "16").unwrap_err();
            /// assert!(err.to_string().contains("outside 1..=15"), "{err}");
            /// assert_eq!(t.promote_hits, 3);
            /// # Ok::<(), runcache::TuningError>(())
            /// ```
            #[cfg(feature = "tuning")]
            pub fn set(&mut self, name: &str, value: &str) -> Result<(), TuningError> {
                let bad = |reason: String| TuningError {
                    name: name.to_owned(),
                    value: value.to_owned(),
                    reason,
                };
                match name {
                    $(stringify!($name) => {
                        let v: $ty = value.parse().map_err(|e| bad(format!("{e}")))?;
                        let range: RangeInclusive<$ty> = $range;
                        if !range.contains(&v) {
                            return Err(bad(format!("outside {range:?}")));
                        }
                        self.$name = v;
                        Ok(())
                    })*
                    _ => Err(bad(format!("no such tuning value (they are {:?})", Self::NAMES))),
                }
            }

            /// The fields that differ from [`DEFAULT`](Self::DEFAULT), each as `name=value`,
            /// in the form [`set`](Self::set) (and the trace tool's `--tune`) reads.
            ///
            /// ```
            /// let mut t = runcache::Tuning::DEFAULT;
            /// assert!(t.changed().is_empty());
            /// t.set("promote_hits", "3")?;
            /// assert_eq!(t.changed(), ["promote_hits=3"]);
            /// # Ok::<(), runcache::TuningError>(())
            /// ```
            #[cfg(feature = "tuning")]
            pub fn changed(&self) -> Vec<String> {
                let mut out = Vec::new();
                $(if self.$name != Self::DEFAULT.$name {
                    out.push(format!("{}={}", stringify!($name), self.$name));
                })*
                out
            }

            /// Whether every field is within its range.
            #[cfg(feature = "tuning")]
            fn within_ranges(&self) -> Result<(), TuningError> {
                $({
                    let range: RangeInclusive<$ty> = $range;
                    if !range.contains(&self.$name) {
                        return Err(TuningError {
                            name: stringify!($name).to_owned(),
                            value: format!("{:?}", self.$name),
                            reason: format!("outside {range:?}"),
                        });
                    }
                })*
                Ok(())
            }
        }
    };
}

tuning! {
    /// Hits in the small queue that move an entry to the main queue without a duel: fewer
    /// let one-hit wonders in, more duel entries that proved themselves.
    promote_hits: u8 = 2, within 1..=15;
    /// The stages of a cold cache's filling that order its entries when the sweep enlists
    /// them (**P6**): more keep the order of admission more exactly, for a queue each.
    stages: u8 = 16, within 1..=64;
    /// The most main-queue victims a small-queue leaver duels at once (at most 8, the
    /// inline array's length): fewer keep a heavy leaver out of a main queue of light
    /// entries.
    duel_victims: u8 = 8, within 1..=8;
    /// The most main-queue victims a heavy newcomer faces at the door (**P10**): one that
    /// would displace more is judged as if it lost.
    door_victims: u8 = 64, within 1..=64;
    /// The least sketch estimate at which a leaver never hit and not remembered by the
    /// ghost may duel for the main queue: lower lets more scans duel, higher keeps out
    /// entries that recur slowly.
    known_estimate: u64 = 4, within 1..=16;
    /// What such a leaver must be estimated at beyond its victims' estimates to win: its
    /// estimate is its misses alone, the victims' include hits.
    known_margin: u64 = 2, within 0..=16;
    /// What a narrow winner's proof adds to the trust in narrow wins (**P8**).
    proved: i32 = 2, within 0..=64;
    /// What a displaced victim's return takes off that trust.
    returned: i32 = 1, within 0..=64;
    /// The trust's bound either way: lower turns the check around sooner when a workload
    /// changes, higher holds it steadier.
    trust_bound: i32 = 64, within 1..=1 << 20;
    /// One refused narrow win in this many (per thread) goes ahead, to keep measuring.
    explore: u32 = 16, within 1..=1 << 20;
    /// The near reach as a shift of the expected entries (**P9**): a return within
    /// `entries >> reach_shift` of its queue's departures is near; wider counts older
    /// returns, which say less about the share.
    reach_shift: u32 = 4, within 0..=16;
    /// The shortest near reach, in departures.
    reach_min: u64 = 2, within 1..=1 << 20;
    /// Near returns a batch counts before it may move the share: larger batches lag,
    /// smaller ones follow noise.
    near_batch: u64 = 32, within 1..=1 << 20;
    /// How far a batch's split must lean (the small queue's returns less the main's) to
    /// move the share: a gate of two standard deviations of a fair batch keeps a zigzag's
    /// even returns from walking the share at random.
    near_gate: i64 = 12, within 0..=1 << 20;
    /// A near return's move of the share, in entries' worth of the capacity (at least one
    /// unit): larger steps wander, smaller ones lag.
    nudge: f64 = 0.5, within 0.0..=1e6;
    /// The share the small queue starts from (S3-FIFO's 10%); traces shorter than a period
    /// keep it.
    initial_share: u32 = ONE / 10, within 1..=ONE;
    /// The least share of the small queue.
    min_share: u32 = ONE / 100, within 1..=ONE;
    /// The greatest share of the small queue, reached only where it keeps earning more per
    /// entry than the main queue.
    max_share: u32 = ONE / 5 * 4, within 1..=ONE;
    /// The share's move per period per unit of the log ratio of the queues' hit densities
    /// (Caffeine's 0.03): larger follows a change sooner and overshoots more.
    gain: f64 = 0.03, within 0.0..=1.0;
    /// The most the share moves in one period, as a fraction of the capacity (Caffeine's).
    max_move: f64 = 0.30, within 0.0..=1.0;
    /// The hits each density counts beyond its own, so a queue that earned nothing in a
    /// period has a density and one hit in a sparse period moves little.
    prior_hits: f64 = 1.0, within 0.0..=1e6;
    /// A fall of the hit rate between two periods that opens the watch for a moved hot set
    /// (**P5**): lower ages more often.
    moved_fall: f64 = 0.05, within 0.0..=1.0;
    /// The periods after such a fall in which an idle main queue turns aging on.
    moved_watch: u32 = 4, within 0..=1 << 20;
    /// The fewest visits of main-queue entries in a period for its idle share to count.
    min_visits: u64 = 64, within 1..=1 << 32;
    /// The least small queue, in entries (a quarter of a smaller cache): with several
    /// threads, entries on their way into a tiny small queue make it look over its share.
    floor_entries: u64 = 4, within 0..=1 << 20;
    /// The fewest accesses in a sampling period, so that small caches sample a rate, not
    /// noise: longer periods adapt later.
    min_sample: u64 = 65_536, within 1..=1 << 40;
    /// The sketch's additions per entry between two halvings (Caffeine's sample): longer
    /// remembers slower recurrences and forgets a moved hot set later.
    period_per_entry: u64 = 10, within 1..=1 << 10;
    /// A smaller cache halves as if it held the geometric mean of its entries and this
    /// many: its popular keys recur further apart than its capacity.
    sketch_reach: u64 = 1 << 14, within 1..=1 << 24;
    /// The most increments a counter takes in one period on average: the sketch widens
    /// until it does, trading memory for fewer collisions.
    counter_load: u64 = 5, within 1..=1 << 10;
    /// Duels lost to incumbents at the counters' ceiling (per thread) that halve the
    /// sketch early: fewer let the halvings' timing follow the hash seed more.
    ceiling_duels: u32 = 16, within 1..=1 << 20;
    /// Ghost slots per expected entry, about the capacities' worth of evictions it
    /// remembers: more recall slower returns, and collide less, for 4 bytes a slot.
    ghost_per_entry: u64 = 3, within 1..=64;
    /// The most entries the sketch and the ghost are sized for (**P4**), which bounds
    /// their memory.
    max_entries: u64 = 1 << 24, within 1..=1 << 28;
}

#[cfg(feature = "tuning")]
impl Tuning {
    /// Whether every field is within its range and the shares are in order
    /// (`min_share <= initial_share <= max_share`).
    ///
    /// # Errors
    /// [`TuningError`] naming the first field that is not.
    ///
    /// ```
    /// let mut t = runcache::Tuning::DEFAULT;
    /// assert!(t.check().is_ok());
    /// t.min_share = t.max_share + 1;
    /// assert_eq!(t.check().unwrap_err().name, "initial_share");
    /// ```
    pub fn check(&self) -> Result<(), TuningError> {
        self.within_ranges()?;
        if !(self.min_share <= self.initial_share && self.initial_share <= self.max_share) {
            return Err(TuningError {
                name: "initial_share".to_owned(),
                value: self.initial_share.to_string(),
                reason: format!(
                    "the shares must be in order: min_share {} <= initial_share <= max_share {}",
                    self.min_share, self.max_share
                ),
            });
        }
        Ok(())
    }
}

#[cfg(feature = "tuning")]
impl Default for Tuning {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A tuning value that could not be set: which, to what, and why.
#[cfg(feature = "tuning")]
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TuningError {
    /// The field's name, as given.
    pub name: String,
    /// The value, as given.
    pub value: String,
    /// What was wrong with it.
    pub reason: String,
}

#[cfg(feature = "tuning")]
impl fmt::Display for TuningError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tuning value {} = {:?}: {}",
            self.name, self.value, self.reason
        )
    }
}

#[cfg(feature = "tuning")]
impl std::error::Error for TuningError {}

#[cfg(all(test, feature = "tuning"))]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_within_their_ranges() {
        assert_eq!(Tuning::DEFAULT.check(), Ok(()));
    }

    #[test]
    fn set_parses_checks_the_range_and_names_what_was_wrong() {
        let mut t = Tuning::DEFAULT;
        t.set("gain", "0.05").unwrap();
        assert_eq!(t.gain, 0.05);
        let e = t.set("promote_hits", "16").unwrap_err();
        assert_eq!((e.name.as_str(), e.value.as_str()), ("promote_hits", "16"));
        assert!(e.to_string().contains("outside 1..=15"), "{e}");
        assert_eq!(t.promote_hits, 2, "left as it was");
        assert!(t.set("promote_hits", "two").is_err());
        let e = t.set("no_such", "1").unwrap_err();
        assert!(e.to_string().contains("no such tuning value"), "{e}");
        for name in Tuning::NAMES {
            assert!(t.set(name, "x").is_err(), "{name} parses nonsense");
        }
    }

    #[test]
    fn check_wants_the_shares_in_order() {
        let mut t = Tuning::DEFAULT;
        t.set("min_share", "30000").unwrap();
        let e = t.check().unwrap_err();
        assert_eq!(e.name, "initial_share");
        t.min_share = 0;
        assert!(t.check().unwrap_err().reason.contains("outside"));
    }
}
