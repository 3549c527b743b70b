//! Why a request failed: a kind the report counts, and whether only a failure injected on
//! purpose leads to it.

use runcache_runtime::{KernelError, Shape};

/// Why a request failed: counted per kind in the report.
#[derive(Clone, Debug)]
pub enum Failure {
    /// The request has more rows than the model's limit.
    Rows { rows: usize, limit: usize },
    /// A kernel failed to compile or run.
    Kernel(KernelError),
    /// A compile failed on purpose (`--inject compile:P`).
    InjectedCompile(Shape),
    /// The weights could not be made, stored or read back.
    Weights(String),
    /// No scratch pool could be had.
    Scratch(String),
    /// A cache's own error (an async build that would wait for itself, say).
    Cache(String),
}

impl Failure {
    /// Whether only a failure injected on purpose leads here.
    pub fn injected(&self) -> bool {
        matches!(self, Failure::Rows { .. } | Failure::InjectedCompile(_))
    }

    /// The report's count for this kind: rows, compile, weights or other.
    pub fn slot(&self) -> usize {
        match self {
            Failure::Rows { .. } => 0,
            Failure::Kernel(_) | Failure::InjectedCompile(_) => 1,
            Failure::Weights(_) => 2,
            Failure::Scratch(_) | Failure::Cache(_) => 3,
        }
    }
}

impl From<KernelError> for Failure {
    fn from(e: KernelError) -> Self {
        Failure::Kernel(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Rows { rows, limit } => {
                write!(f, "{rows} rows are over the model's limit of {limit}")
            }
            Failure::Kernel(e) => write!(f, "{e}"),
            Failure::InjectedCompile(shape) => {
                write!(f, "compiling {shape} failed (injected by --inject compile)")
            }
            Failure::Weights(e) => write!(f, "weights: {e}"),
            Failure::Scratch(e) => write!(f, "no scratch: {e}"),
            Failure::Cache(e) => write!(f, "cache: {e}"),
        }
    }
}

impl std::error::Error for Failure {}
