//! Reading trace files and making synthetic traces.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// The keys of a trace, one per access.
pub type Trace = Vec<u64>;

/// Reads a trace file: `.zst` is decompressed; ARC `.lis` lines become page accesses; any
/// other file is one decimal key per line. A line that is not a key, and a file with no
/// access at all, are errors naming the file (and the line).
pub fn load(path: &Path) -> Result<Trace, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let name = path.to_string_lossy();
    let reader: Box<dyn Read> = if name.ends_with(".zst") {
        Box::new(
            ruzstd::decoding::StreamingDecoder::new(file)
                .map_err(|e| format!("{}: not a zstd stream: {e}", path.display()))?,
        )
    } else {
        Box::new(file)
    };
    let lis = name.ends_with(".lis") || name.ends_with(".lis.zst");
    let trace =
        parse(BufReader::new(reader), lis).map_err(|e| format!("{}: {e}", path.display()))?;
    if trace.is_empty() {
        return Err(format!("{}: the trace holds no access", path.display()));
    }
    Ok(trace)
}

/// Parses trace lines (see [`load`]); blank lines are skipped.
pub fn parse(reader: impl BufRead, lis: bool) -> Result<Trace, String> {
    let mut trace = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| format!("line {}: {e}", n + 1))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if lis {
            let mut fields = line.split_ascii_whitespace();
            let mut number = |what: &str| -> Result<u64, String> {
                fields
                    .next()
                    .ok_or_else(|| format!("line {}: missing {what}", n + 1))?
                    .parse()
                    .map_err(|_| format!("line {}: {what} is not a number", n + 1))
            };
            let start = number("start block")?;
            let blocks = number("block count")?;
            trace.extend(start..start.saturating_add(blocks));
        } else {
            trace.push(line.parse().map_err(|_| {
                format!(
                    "line {}: `{}` is not a key (a decimal number of at most 64 bits)",
                    n + 1,
                    line.chars().take(40).collect::<String>()
                )
            })?);
        }
    }
    Ok(trace)
}

/// `len` accesses over `keys` keys, Zipf-distributed with exponent `s`.
pub fn zipf(keys: u64, s: f64, len: usize, seed: u64) -> Result<Trace, String> {
    use rand::{Rng, SeedableRng};
    let dist =
        rand_distr::Zipf::new(keys as f64, s).map_err(|e| format!("zipf {keys}:{s}: {e}"))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    Ok((0..len).map(|_| rng.sample(dist) as u64).collect())
}

/// Zipf accesses with a one-pass scan of `keys / 2` never-seen keys every `len / 10` accesses.
pub fn scan_mix(keys: u64, s: f64, len: usize, seed: u64) -> Result<Trace, String> {
    let base = zipf(keys, s, len, seed)?;
    let mut trace = Vec::with_capacity(len * 3 / 2);
    let mut fresh = keys + 1_000_000;
    for (i, k) in base.into_iter().enumerate() {
        if i > 0 && i % (len / 10).max(1) == 0 {
            for _ in 0..keys / 2 {
                trace.push(fresh);
                fresh += 1;
            }
        }
        trace.push(k);
    }
    Ok(trace)
}

/// `len` accesses cycling through `keys` keys in order: LRU's worst case once the cache is
/// smaller than the loop (every access misses), where keeping any fixed part of the loop hits.
pub fn loop_trace(keys: u64, len: usize) -> Trace {
    (0..keys).cycle().take(len).collect()
}

/// Zipf accesses whose hot set moves halfway: the second half draws from `keys` other keys,
/// so what was frequent stops being used and recency must win.
pub fn shifting(keys: u64, s: f64, len: usize, seed: u64) -> Result<Trace, String> {
    let mut trace = zipf(keys, s, len / 2, seed)?;
    trace.extend(
        zipf(keys, s, len - len / 2, seed + 1)?
            .into_iter()
            .map(|k| k + keys),
    );
    Ok(trace)
}

/// The synthetic rows of the workload matrix (`--matrix`) and of the suite: each favours
/// another policy.
pub fn matrix_workloads() -> Result<Vec<(String, Trace)>, String> {
    const KEYS: u64 = 100_000;
    const LEN: usize = 1_000_000;
    Ok(vec![
        ("zipf-0.6".into(), zipf(KEYS, 0.6, LEN, 1)?),
        ("zipf-0.9".into(), zipf(KEYS, 0.9, LEN, 2)?),
        ("zipf-1.2".into(), zipf(KEYS, 1.2, LEN, 3)?),
        ("loop".into(), loop_trace(KEYS / 2, LEN)),
        ("scan-mix".into(), scan_mix(KEYS, 0.9, LEN, 4)?),
        ("shift".into(), shifting(KEYS, 0.9, LEN, 5)?),
    ])
}

/// The number of distinct keys in `trace`.
pub fn unique(trace: &[u64]) -> usize {
    let mut seen = std::collections::HashSet::with_capacity(trace.len() / 4);
    trace.iter().filter(|k| seen.insert(**k)).count()
}
