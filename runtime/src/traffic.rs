//! What is served: the models (one, or `--models N` of different widths) and the stream of
//! requests, each a model chosen by a skewed popularity that may move halfway (`--shift`)
//! and a number of rows drawn from a serving-traffic mix.

use crate::flags::{Options, MODEL_WIDTH_STEP, MODEL_WIDTH_STEPS};
use runcache_runtime::model::{self, Mlp};

/// The model's input and output widths; `--hidden` (or the drawn width) sets the two layers
/// between.
pub const INPUT: usize = 32;
pub const OUTPUT: usize = 32;
/// The most rows one request may have: the model's limit. Traffic stays under it (at most
/// 8 × 32 × 8 = 2048 rows) unless `--inject oversize:P` sends requests over it.
pub const MAX_ROWS: usize = 4096;
/// Batch sizes and how often each comes (serving traffic: mostly small batches).
const BATCHES: [(usize, u64); 4] = [(1, 50), (2, 25), (4, 15), (8, 10)];
/// Sequence lengths are 1 to `SEQ_STEPS` steps; a step is 8 rows with one model and 1 row
/// with many, whose wider layers would otherwise make the reference check (which every
/// response goes through) dominate the run.
const SEQ_STEPS: usize = 32;
/// Sequence steps with weight 1/(s+1)^1.2: a few short lengths hot, a long tail cold.
/// Computed once, not per request.
static SEQ_WEIGHTS: std::sync::LazyLock<[f64; SEQ_STEPS]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|s| 1.0 / ((s + 1) as f64).powf(1.2)));

/// The models and the request stream of a run (the same for every cache).
pub struct Traffic {
    pub models: Vec<Mlp>,
    /// Cumulative popularity by rank, ending at 1.
    ranks: Vec<f64>,
    seq_step: usize,
    requests: usize,
    shift: bool,
    seed: u64,
    oversize: Option<usize>,
}

/// One request: which model, how many rows.
#[derive(Clone, Copy, Debug)]
pub struct Ask {
    pub model: usize,
    pub rows: usize,
}

/// The hidden widths of the models: `--hidden` for one model, else drawn from the seed,
/// multiples of 64 from 64 to 1,024.
pub fn widths(o: &Options) -> Vec<usize> {
    if o.models == 1 {
        return vec![o.hidden];
    }
    let mut next = model::xorshift(o.seed ^ 0x6D6F_6465_6C73);
    (0..o.models)
        .map(|_| MODEL_WIDTH_STEP * (1 + (next() % MODEL_WIDTH_STEPS) as usize))
        .collect()
}

/// Bytes of f32 weights in a model of hidden width `h` (three layers).
pub fn weight_bytes(h: usize) -> u64 {
    4 * (INPUT * h + h * h + h * OUTPUT) as u64
}

/// Memory the process may still take (`MemAvailable` of `/proc/meminfo`), where known.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuses, before anything is generated, models whose weights would not fit in memory:
/// the raw weights (kept for the reference) and what a weight cache may hold beside them.
pub fn check_memory(widths: &[usize], budget: u64) -> Result<(), String> {
    let raw: u64 = widths.iter().map(|&h| weight_bytes(h)).sum();
    let need = raw.saturating_add(budget.min(raw));
    match available_memory() {
        Some(have) if need > have => Err(format!(
            "--models {}: the models' weights take {} MiB and the weight caches up to {} MiB \
             more, over the {} MiB of memory available",
            widths.len(),
            raw >> 20,
            budget.min(raw) >> 20,
            have >> 20
        )),
        _ => Ok(()),
    }
}

impl Traffic {
    pub fn new(o: &Options, widths: &[usize]) -> Traffic {
        let models = widths
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                Mlp::generate(&[INPUT, h, h, OUTPUT], o.seed.wrapping_add(i as u64))
                    .expect("widths are multiples of 8")
            })
            .collect();
        let weights: Vec<f64> = (0..widths.len())
            .map(|rank| 1.0 / ((rank + 1) as f64).powf(o.popularity))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        let mut ranks: Vec<f64> = weights
            .iter()
            .map(|w| {
                sum += w / total;
                sum
            })
            .collect();
        if let Some(last) = ranks.last_mut() {
            *last = 1.0;
        }
        Traffic {
            models,
            ranks,
            seq_step: if widths.len() == 1 { 8 } else { 1 },
            requests: o.requests,
            shift: o.shift,
            seed: o.seed,
            oversize: o.inject.oversize,
        }
    }

    /// Request `r`: its model (by popularity rank; from halfway on with `--shift`, rank `k`
    /// is model `k + N/2`, so the hot models become cold ones and cold ones hot) and its
    /// rows (over the model's limit for a request `--inject oversize:P` picks).
    pub fn ask(&self, r: usize) -> Ask {
        let mut next = model::xorshift(self.seed ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let n = self.models.len();
        // One model draws nothing here, so its request stream is the one it always was.
        let rank = if n > 1 {
            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
            self.ranks.partition_point(|&c| c <= u).min(n - 1)
        } else {
            0
        };
        let shifted = self.shift && r >= self.requests / 2;
        let model = if shifted { (rank + n / 2) % n } else { rank };
        if self
            .oversize
            .is_some_and(|every| (r + 1).is_multiple_of(every))
        {
            return Ask {
                model,
                rows: MAX_ROWS + 8,
            };
        }
        let total: u64 = BATCHES.iter().map(|b| b.1).sum();
        let mut pick = next() % total;
        let batch = BATCHES
            .iter()
            .find(|(_, w)| {
                let hit = pick < *w;
                pick = pick.saturating_sub(*w);
                hit
            })
            .map_or(1, |b| b.0);
        let weights = &*SEQ_WEIGHTS;
        let sum: f64 = weights.iter().sum();
        let mut u = (next() >> 11) as f64 / (1u64 << 53) as f64 * sum;
        let step = weights
            .iter()
            .position(|w| {
                u -= w;
                u < 0.0
            })
            .unwrap_or(SEQ_STEPS - 1);
        Ask {
            model,
            rows: batch * (step + 1) * self.seq_step,
        }
    }

    /// Bytes of all the models' weights.
    pub fn weight_bytes(&self) -> u64 {
        self.models
            .iter()
            .flat_map(|m| &m.layers)
            .map(|l| 4 * l.weights.len() as u64)
            .sum()
    }

    /// Bytes of the smallest model's weights.
    pub fn smallest_model_bytes(&self) -> u64 {
        self.models
            .iter()
            .map(|m| m.layers.iter().map(|l| 4 * l.weights.len() as u64).sum())
            .min()
            .unwrap_or(0)
    }
}
