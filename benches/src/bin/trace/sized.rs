//! Weighted traces: `key size` files, sizes given to a unit trace's keys, and the
//! many-models inference stream.
//!
//! A weighted trace is a list of accesses, each a key and the size of its value in bytes (at
//! most `u32::MAX`, moka's weigher's range). A key keeps one size for the whole trace: a
//! `key size` file that gives one key two sizes is refused, since every cache here weighs
//! an entry once, when it is admitted.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

/// The accesses of a weighted trace: key and size in bytes.
pub type Sized = Vec<(u64, u32)>;

/// Reads a `key size` trace (`.zst` decompressed): one access per line, a decimal key and its
/// size in bytes (1 to 4,294,967,295), blank lines skipped. A bad line, a size of 0, a key
/// given two sizes and a file with no access are errors naming the file and the line.
pub fn load_sized(path: &Path) -> Result<Sized, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let reader: Box<dyn std::io::Read> = if path.to_string_lossy().ends_with(".zst") {
        Box::new(
            ruzstd::decoding::StreamingDecoder::new(file)
                .map_err(|e| format!("{}: not a zstd stream: {e}", path.display()))?,
        )
    } else {
        Box::new(file)
    };
    let trace = parse_sized(std::io::BufReader::new(reader))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if trace.is_empty() {
        return Err(format!("{}: the trace holds no access", path.display()));
    }
    Ok(trace)
}

/// Parses `key size` lines (see [`load_sized`]).
pub fn parse_sized(reader: impl BufRead) -> Result<Sized, String> {
    let mut trace = Vec::new();
    let mut sizes: HashMap<u64, (u32, usize)> = HashMap::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| format!("line {}: {e}", n + 1))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let shown = || line.chars().take(40).collect::<String>();
        let mut fields = line.split_ascii_whitespace();
        let (Some(key), Some(size), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(format!(
                "line {}: `{}` is not `key size` (two decimal numbers)",
                n + 1,
                shown()
            ));
        };
        let key: u64 = key.parse().map_err(|_| {
            format!(
                "line {}: key `{key}` is not a decimal number of at most 64 bits",
                n + 1
            )
        })?;
        let size: u32 = match size.parse::<u64>() {
            Ok(0) => {
                return Err(format!(
                    "line {}: key {key} has size 0; sizes are 1 to {} bytes",
                    n + 1,
                    u32::MAX
                ))
            }
            Ok(s) => u32::try_from(s).map_err(|_| {
                format!(
                    "line {}: key {key} has size {s}, over the largest size a weigher of \
                     every peer takes ({} bytes)",
                    n + 1,
                    u32::MAX
                )
            })?,
            Err(_) => {
                return Err(format!(
                    "line {}: size `{size}` of key {key} is not a decimal number",
                    n + 1
                ))
            }
        };
        let (first, at) = *sizes.entry(key).or_insert((size, n + 1));
        if first != size {
            return Err(format!(
                "line {}: key {key} has size {size}, but {first} on line {at}; a key keeps one \
                 size in a trace",
                n + 1
            ));
        }
        trace.push((key, size));
    }
    Ok(trace)
}

/// The bytes of the distinct keys of a weighted trace.
pub fn unique_bytes(trace: &[(u64, u32)]) -> u64 {
    let mut seen = std::collections::HashSet::with_capacity(trace.len() / 4);
    trace
        .iter()
        .filter(|(k, _)| seen.insert(*k))
        .map(|&(_, s)| u64::from(s))
        .sum()
}

/// A 64-bit mix of a key (splitmix64's finalizer), salted so that sizes do not follow any
/// cache's own hash of the key.
fn mix(key: u64, salt: u64) -> u64 {
    let mut z = key ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform in (0, 1) from a hash.
fn unit(h: u64) -> f64 {
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// A standard normal from two hashes (Box–Muller).
fn normal(a: u64, b: u64) -> f64 {
    (-2.0 * unit(a).ln()).sqrt() * (std::f64::consts::TAU * unit(b)).cos()
}

/// The log-normal sizes: a median of 32 KiB and σ = 1.75 (a heavy tail: one key in a
/// hundred over 1.8 MiB), within 512 B and 64 MiB.
fn lognormal(key: u64) -> f64 {
    (32_768f64.ln() + 1.75 * normal(mix(key, 1), mix(key, 2))).clamp(512f64.ln(), 64e6f64.ln())
}

/// How the sizes of a unit trace's keys are drawn: each from the key's hash, the same in
/// every run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeModel {
    /// Log-normal ([`lognormal`]).
    LogNormal,
    /// Many small and a few huge: 95% of the keys 1–8 KiB, 5% 1–16 MiB (log-uniform each).
    Bimodal,
    /// Log-normal sizes given in the order of the keys' popularity: the most requested keys
    /// draw the largest sizes (a rank correlation of about 0.9).
    PopularHeavy,
    /// The same in reverse: the most requested keys draw the smallest sizes.
    PopularLight,
}

impl SizeModel {
    pub const ALL: [SizeModel; 4] = [
        SizeModel::LogNormal,
        SizeModel::Bimodal,
        SizeModel::PopularHeavy,
        SizeModel::PopularLight,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SizeModel::LogNormal => "lognormal",
            SizeModel::Bimodal => "bimodal",
            SizeModel::PopularHeavy => "popular-heavy",
            SizeModel::PopularLight => "popular-light",
        }
    }

    /// Gives every key of `trace` its size.
    pub fn apply(self, trace: &[u64]) -> Sized {
        let sizes: HashMap<u64, u32> = match self {
            SizeModel::LogNormal => keys(trace).map(|k| (k, bytes(lognormal(k)))).collect(),
            SizeModel::Bimodal => keys(trace)
                .map(|k| {
                    let u = unit(mix(k, 3));
                    let (lo, hi) = if unit(mix(k, 4)) < 0.95 {
                        (1024f64, 8192f64)
                    } else {
                        (1_048_576f64, 16_777_216f64)
                    };
                    (k, bytes(lo.ln() + u * (hi.ln() - lo.ln())))
                })
                .collect(),
            SizeModel::PopularHeavy | SizeModel::PopularLight => {
                // Keys by popularity, most requested first (ties by hash); the log-sizes
                // they drew, largest first; each key's size mixes the size of its rank
                // with its own draw, so the order is strong but not exact.
                let mut counts: HashMap<u64, u64> = HashMap::new();
                for &k in trace {
                    *counts.entry(k).or_default() += 1;
                }
                let mut ranked: Vec<(u64, u64)> = counts.into_iter().collect();
                ranked.sort_by_key(|&(k, c)| (std::cmp::Reverse(c), mix(k, 5)));
                let mut drawn: Vec<f64> = ranked.iter().map(|&(k, _)| lognormal(k)).collect();
                drawn.sort_by(|a, b| b.total_cmp(a));
                if self == SizeModel::PopularLight {
                    drawn.reverse();
                }
                ranked
                    .iter()
                    .zip(drawn)
                    .map(|(&(k, _), at_rank)| (k, bytes(0.8 * at_rank + 0.2 * lognormal(k))))
                    .collect()
            }
        };
        trace.iter().map(|k| (*k, sizes[k])).collect()
    }
}

/// The distinct keys of a trace, in first-access order.
fn keys(trace: &[u64]) -> impl Iterator<Item = u64> + '_ {
    let mut seen = std::collections::HashSet::new();
    trace.iter().copied().filter(move |k| seen.insert(*k))
}

/// A size from its natural log, rounded, within 1 and `u32::MAX`.
fn bytes(ln: f64) -> u32 {
    ln.exp().round().clamp(1.0, f64::from(u32::MAX)) as u32
}

/// The many-models inference stream: what a runtime serving several models asks its
/// constant tensor cache for. The runtime (`runcache-runtime --models N`) serves requests
/// whose model a skewed popularity picks, and each request reads every layer's reordered
/// weights once; this generator writes that stream down with more models and wider layers
/// than the demo runs, as a trace every cache can replay.
#[derive(Clone, Copy, Debug)]
pub struct Models {
    /// Models served.
    pub models: usize,
    /// The Zipf exponent of their popularity.
    pub popularity: f64,
    /// Whether the popularity moves halfway (rank k becomes model k + models / 2).
    pub shift: bool,
    /// The share of requests that run a batch model once (a model never seen again).
    pub batch: f64,
    /// Requests.
    pub requests: usize,
    pub seed: u64,
}

/// The hidden widths of the models' layers, as powers of two: 64 to 2,048, so that a square
/// layer of f32 weights takes 16 KiB to 16 MiB.
const WIDTH_BITS: (u32, u32) = (6, 11);
/// Layers a model has: 2 to 8.
const LAYERS: (u64, u64) = (2, 8);

impl Models {
    /// The trace: each request's layers, one access each, keyed by (model, layer).
    pub fn generate(&self) -> Sized {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed);
        let model = |rng: &mut rand::rngs::StdRng, id: u64| -> Vec<(u64, u32)> {
            let layers = rng.random_range(LAYERS.0..=LAYERS.1);
            let width = |rng: &mut rand::rngs::StdRng| {
                1u64 << rng.random_range(WIDTH_BITS.0..=WIDTH_BITS.1)
            };
            let mut k = width(rng);
            (0..layers)
                .map(|l| {
                    let n = width(rng);
                    let size = (4 * k * n).min(u64::from(u32::MAX)) as u32;
                    k = n;
                    (id << 8 | l, size)
                })
                .collect()
        };
        let served: Vec<Vec<(u64, u32)>> = (0..self.models)
            .map(|m| model(&mut rng, m as u64))
            .collect();
        let zipf = rand_distr::Zipf::new(self.models as f64, self.popularity)
            .expect("a positive exponent over at least one model");
        let mut trace = Vec::new();
        let mut next_batch = self.models as u64;
        for r in 0..self.requests {
            if rng.random::<f64>() < self.batch {
                trace.extend(model(&mut rng, next_batch));
                next_batch += 1;
                continue;
            }
            let rank = rng.sample(zipf) as usize - 1;
            let moved = if self.shift && r >= self.requests / 2 {
                self.models / 2
            } else {
                0
            };
            trace.extend_from_slice(&served[(rank + moved) % self.models]);
        }
        trace
    }
}

/// The many-models traces of the weighted suite: a base stream and one variant for each way
/// it may differ (more models, steeper or flatter popularity, a shift, one-off batch models,
/// and all of the last two at once).
pub fn models_workloads() -> Vec<(String, Sized)> {
    let base = Models {
        models: 64,
        popularity: 1.0,
        shift: false,
        batch: 0.0,
        requests: 40_000,
        seed: 7,
    };
    [
        ("models", base),
        (
            "models-many",
            Models {
                models: 256,
                ..base
            },
        ),
        (
            "models-steep",
            Models {
                popularity: 1.4,
                ..base
            },
        ),
        (
            "models-flat",
            Models {
                popularity: 0.7,
                ..base
            },
        ),
        (
            "models-shift",
            Models {
                shift: true,
                ..base
            },
        ),
        ("models-batch", Models { batch: 0.1, ..base }),
        (
            "models-shift-batch",
            Models {
                shift: true,
                batch: 0.05,
                ..base
            },
        ),
    ]
    .into_iter()
    .map(|(n, m)| (n.to_string(), m.generate()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_size_trace_parses_and_bad_lines_name_their_line() {
        let ok = parse_sized("1 10\n\n2 20\n1 10\n".as_bytes()).unwrap();
        assert_eq!(ok, vec![(1, 10), (2, 20), (1, 10)]);
        let err = |text: &str| parse_sized(text.as_bytes()).unwrap_err();
        assert!(err("1 10\n2 0\n").starts_with("line 2: key 2 has size 0"));
        assert!(err("1 ten\n").contains("size `ten` of key 1"));
        assert!(err("x 1\n").contains("key `x`"));
        assert!(err("1\n").contains("is not `key size`"));
        assert!(err("1 2 3\n").contains("is not `key size`"));
        assert!(err("1 4294967296\n").contains("over the largest size"));
        assert!(err("1 10\n1 11\n").contains("line 2: key 1 has size 11, but 10 on line 1"));
        assert_eq!(parse_sized("".as_bytes()).unwrap(), vec![]);
    }

    #[test]
    fn an_empty_file_is_refused_with_its_name() {
        let path = std::env::temp_dir().join(format!("sized-{}.trace", std::process::id()));
        std::fs::write(&path, "\n\n").unwrap();
        let e = load_sized(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(e.contains("holds no access") && e.contains("sized-"), "{e}");
    }

    #[test]
    fn sizes_are_deterministic_and_follow_their_model() {
        let trace: Vec<u64> = (0..20_000u64)
            .flat_map(|k| vec![k; (k % 7 + 1) as usize])
            .collect();
        for m in SizeModel::ALL {
            let a = m.apply(&trace);
            assert_eq!(a, m.apply(&trace), "{m:?} is deterministic");
            assert!(a.iter().all(|&(_, s)| s >= 1));
        }
        let bi = SizeModel::Bimodal.apply(&trace);
        let huge = bi.iter().filter(|&&(_, s)| s >= 1 << 20).count() as f64 / bi.len() as f64;
        assert!((0.03..0.07).contains(&huge), "{huge} of the accesses huge");
        // Popular keys (k % 7 == 6 is accessed 7 times) are heavier under PopularHeavy than
        // the least popular (k % 7 == 0), lighter under PopularLight.
        let mean = |t: &Sized, r: u64| {
            let s: Vec<f64> = t
                .iter()
                .filter(|(k, _)| k % 7 == r)
                .map(|&(_, s)| f64::from(s).ln())
                .collect();
            s.iter().sum::<f64>() / s.len() as f64
        };
        let heavy = SizeModel::PopularHeavy.apply(&trace);
        let light = SizeModel::PopularLight.apply(&trace);
        assert!(mean(&heavy, 6) > mean(&heavy, 0) + 2.0);
        assert!(mean(&light, 6) + 2.0 < mean(&light, 0));
    }

    #[test]
    fn the_models_stream_reads_each_model_whole_and_keeps_its_sizes() {
        let m = Models {
            models: 8,
            popularity: 1.0,
            shift: true,
            batch: 0.1,
            requests: 2_000,
            seed: 1,
        };
        let t = m.generate();
        assert_eq!(t, m.generate());
        let mut sizes = HashMap::new();
        for &(k, s) in &t {
            assert_eq!(*sizes.entry(k).or_insert(s), s, "key {k} keeps its size");
            assert!((16 * 1024..=16 * 1024 * 1024).contains(&s), "{s}");
        }
        let batch_models: std::collections::HashSet<u64> =
            t.iter().map(|(k, _)| k >> 8).filter(|&m| m >= 8).collect();
        assert!(
            (100..300).contains(&batch_models.len()),
            "{}",
            batch_models.len()
        );
    }
}
