//! The pool manager's errors.

#![forbid(unsafe_code)]

use std::fmt;

/// A pool reservation or a pool manager setting that failed.
///
/// ```
/// use runcache::pool::{PoolManager, WhenExhausted};
/// use runcache::PoolError;
///
/// let pools = PoolManager::builder(|| 0u8).max_pools(1).when_exhausted(WhenExhausted::Fail).build()?;
/// let _held = pools.reserve()?;
/// let err = pools.reserve().unwrap_err();
/// assert_eq!(err.to_string(), "all 1 pools are reserved and the manager does not wait");
/// # Ok::<(), PoolError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// A builder setting is out of range; says which and why.
    InvalidConfig {
        /// What is wrong, with the value.
        reason: &'static str,
    },
    /// Every pool is reserved, the maximum is reached, and the manager does not wait.
    Exhausted {
        /// The maximum number of pools.
        max_pools: usize,
    },
    /// Every pool stayed reserved for the whole wait.
    TimedOut {
        /// How long the reservation waited.
        after: std::time::Duration,
        /// The maximum number of pools.
        max_pools: usize,
    },
    /// More than about four billion pools were created over the manager's life.
    TooManyPools,
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::InvalidConfig { reason } => write!(f, "invalid pool manager setting: {reason}"),
            PoolError::Exhausted { max_pools } => {
                write!(f, "all {max_pools} pools are reserved and the manager does not wait")
            }
            PoolError::TimedOut { after, max_pools } => write!(
                f,
                "all {max_pools} pools stayed reserved for {after:?}, the longest the reservation waits"
            ),
            PoolError::TooManyPools => f.write_str("the pool manager ran out of slot indices"),
        }
    }
}

impl std::error::Error for PoolError {}
