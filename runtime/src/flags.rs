//! The command line: the flags, their defaults, and the checks that turn a bad value into a
//! message naming the flag (the runtime then exits with status 2 before serving).

/// The widest hidden layer `--hidden` takes.
pub const MAX_HIDDEN: usize = 4096;
/// With `--models N` above 1, model widths are drawn from `MODEL_WIDTH_STEP` to
/// `MODEL_WIDTH_STEP * MODEL_WIDTH_STEPS` (64 to 1,024).
pub const MODEL_WIDTH_STEP: usize = 64;
pub const MODEL_WIDTH_STEPS: u64 = 16;
/// Concurrent requests per serving thread with `--async`.
pub const TASKS_PER_THREAD: usize = 4;
/// The most models `--models` takes (the memory check refuses far fewer on most machines).
pub const MAX_MODELS: usize = 1 << 20;

/// A cache the runtime can serve with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Runcache,
    Moka,
    QuickCache,
    MutexHashMap,
    None,
}

impl Choice {
    pub const ALL: [Choice; 5] = [
        Choice::Runcache,
        Choice::Moka,
        Choice::QuickCache,
        Choice::MutexHashMap,
        Choice::None,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Choice::Runcache => "runcache",
            Choice::Moka => "moka",
            Choice::QuickCache => "quick_cache",
            Choice::MutexHashMap => "mutex-hashmap",
            Choice::None => "none",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
    Markdown,
}

/// Failures injected on purpose: each `Some(p)` fails one time in `p`.
#[derive(Clone, Copy, Default)]
pub struct Inject {
    pub compile: Option<usize>,
    pub oversize: Option<usize>,
}

#[derive(Clone)]
pub struct Options {
    pub caches: Vec<Choice>,
    pub threads: Vec<usize>,
    pub requests: usize,
    pub kernels: usize,
    /// The one model's hidden width (`--models 1`).
    pub hidden: usize,
    pub models: usize,
    /// The Zipf exponent of the models' popularity.
    pub popularity: f64,
    /// Whether the popularity moves halfway through the requests.
    pub shift: bool,
    /// The weight budget in MiB from `--budget-mib`, which wins over the environment.
    pub budget_mib: Option<u64>,
    pub seed: u64,
    pub inject: Inject,
    pub gpu: bool,
    pub asynchronous: bool,
    pub output: Output,
}

/// The usage text: the block of the binary's own docs between the code fences.
pub fn usage() -> String {
    let usage: Vec<&str> = include_str!("main.rs")
        .lines()
        .map(|l| l.trim_start_matches("//! ").trim_start_matches("//!"))
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    usage.join("\n")
}

fn number(flag: &str, v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .map_err(|_| format!("{flag}: `{v}` is not a whole number"))
}

/// A Zipf exponent: a finite number, 0 or more.
fn exponent(flag: &str, v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
        Ok(s) => Err(format!(
            "{flag}: {s} is not an exponent of 0 or more (0 is uniform, 1 is Zipf's law)"
        )),
        Err(_) => Err(format!("{flag}: `{v}` is not a number")),
    }
}

fn parse_inject(v: &str) -> Result<Inject, String> {
    let mut inject = Inject::default();
    for item in v.split(',') {
        let (what, every) = item.split_once(':').ok_or_else(|| {
            format!("--inject: `{item}` is not FAILURE:P (compile:P or oversize:P)")
        })?;
        let every = number(&format!("--inject {what}"), every)?;
        if every == 0 {
            return Err(format!(
                "--inject {what}: P must be at least 1 (1 in P fails)"
            ));
        }
        match what {
            "compile" => inject.compile = Some(every),
            "oversize" => inject.oversize = Some(every),
            other => {
                return Err(format!(
                    "--inject: unknown failure `{other}` (compile or oversize)"
                ))
            }
        }
    }
    Ok(inject)
}

/// The options, `None` after `--help` (printed), or the message of the first bad flag.
pub fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let mut o = Options {
        caches: Choice::ALL.to_vec(),
        threads: vec![2],
        requests: 1500,
        kernels: 1024,
        hidden: 64,
        models: 1,
        popularity: 1.0,
        shift: false,
        budget_mib: None,
        seed: 42,
        inject: Inject::default(),
        gpu: false,
        asynchronous: false,
        output: Output::Table,
    };
    let mut hidden_given = false;
    let mut args = args;
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{}", usage());
                return Ok(None);
            }
            "--cache" => {
                let v = value("--cache")?;
                o.caches = v
                    .split(',')
                    .map(|name| {
                        Choice::ALL
                            .into_iter()
                            .find(|c| c.name() == name)
                            .ok_or_else(|| {
                                format!(
                                    "--cache: unknown cache `{name}` (runcache, moka, \
                                     quick_cache, mutex-hashmap or none)"
                                )
                            })
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--threads" => {
                o.threads = value("--threads")?
                    .split(',')
                    .map(|t| number("--threads", t))
                    .collect::<Result<_, _>>()?;
            }
            "--requests" => o.requests = number("--requests", &value("--requests")?)?,
            "--kernels" => o.kernels = number("--kernels", &value("--kernels")?)?,
            "--hidden" => {
                o.hidden = number("--hidden", &value("--hidden")?)?;
                hidden_given = true;
            }
            "--models" => o.models = number("--models", &value("--models")?)?,
            "--popularity" => o.popularity = exponent("--popularity", &value("--popularity")?)?,
            "--shift" => o.shift = true,
            "--budget-mib" => {
                o.budget_mib = Some(number("--budget-mib", &value("--budget-mib")?)? as u64)
            }
            "--seed" => o.seed = number("--seed", &value("--seed")?)? as u64,
            "--inject" => o.inject = parse_inject(&value("--inject")?)?,
            "--gpu" => o.gpu = true,
            "--async" => o.asynchronous = true,
            "--json" => o.output = Output::Json,
            "--markdown" => o.output = Output::Markdown,
            other => return Err(format!("unknown flag `{other}` (see --help)")),
        }
    }
    let fewest = o.threads.iter().copied().min().unwrap_or(0);
    for (flag, v) in [
        ("--threads", fewest),
        ("--requests", o.requests),
        ("--kernels", o.kernels),
        ("--models", o.models),
    ] {
        if v == 0 {
            return Err(format!("{flag}: must be at least 1"));
        }
    }
    if o.models > MAX_MODELS {
        return Err(format!(
            "--models: {} is over the limit of {MAX_MODELS}",
            o.models
        ));
    }
    if o.hidden == 0 || !o.hidden.is_multiple_of(8) || o.hidden > MAX_HIDDEN {
        return Err(format!(
            "--hidden: {} is not a multiple of 8 from 8 to {MAX_HIDDEN}",
            o.hidden
        ));
    }
    if hidden_given && o.models > 1 {
        return Err(format!(
            "--hidden sets the one model's width; with --models {} the widths are drawn from \
             {MODEL_WIDTH_STEP} to {} (by --seed)",
            o.models,
            MODEL_WIDTH_STEP * MODEL_WIDTH_STEPS as usize
        ));
    }
    if o.budget_mib
        .is_some_and(|mb| mb > runcache::constant::MAX_CAPACITY_MB)
    {
        return Err(format!(
            "--budget-mib: over the largest budget, {} MiB",
            runcache::constant::MAX_CAPACITY_MB
        ));
    }
    Ok(Some(o))
}
