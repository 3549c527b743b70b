//! The runtime binary end to end: every cache serves a few hundred requests, every response
//! matches the reference, runcache compiles each shape exactly once, and bad flags or a bad
//! environment are clear errors.

use std::process::Command;

fn runtime() -> Command {
    Command::new(env!("CARGO_BIN_EXE_runcache-runtime"))
}

/// Runs the runtime with `args` and no weight budget in the environment; returns its exit
/// code, standard output and standard error.
fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = runtime()
        .args(args)
        .env_remove("RUNCACHE_CONSTANT_CACHE_CAPACITY")
        .output()
        .expect("the runtime runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The runtime's message for `args` with the weight budget `budget`, after checking that it
/// refused them (exit status 2).
fn refused(args: &[&str], budget: &str) -> String {
    let out = runtime()
        .args(args)
        .env("RUNCACHE_CONSTANT_CACHE_CAPACITY", budget)
        .output()
        .expect("the runtime runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    stderr
}

/// The number after `"field":` in a JSON line.
fn field(line: &str, name: &str) -> f64 {
    let key = format!("\"{name}\":");
    let at = line
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        + key.len();
    line[at..]
        .split([',', '}'])
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} is not a number in {line}"))
}

#[test]
fn every_cache_serves_correct_responses_and_runcache_compiles_each_shape_once() {
    let (code, stdout, stderr) = run(&["--requests", "300", "--threads", "4", "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    let names = ["runcache", "moka", "quick_cache", "mutex-hashmap", "none"];
    assert_eq!(lines.len(), names.len(), "{stdout}");
    for (line, name) in lines.iter().zip(names) {
        assert!(line.contains(&format!("\"cache\":\"{name}\"")), "{line}");
        assert_eq!(field(line, "requests"), 300.0);
        assert_every_response_right(line);
        assert!(field(line, "requests_per_second") > 0.0);
    }
    let runcache = lines[0];
    let shapes = field(runcache, "shapes");
    assert!(shapes > 10.0, "{runcache}");
    assert_eq!(
        field(runcache, "compiles"),
        shapes,
        "single flight: one compile per shape, four threads or not"
    );
    assert_eq!(field(runcache, "weight_reorders"), 3.0, "one per layer");
    let none = lines[4];
    assert_eq!(
        field(none, "compiles"),
        900.0,
        "three kernels a request, no cache"
    );
}

#[test]
fn async_tasks_serve_correct_responses_and_runcache_compiles_each_shape_once() {
    let (code, stdout, stderr) = run(&["--async", "--requests", "300", "--threads", "2", "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    for line in &lines {
        assert!(line.contains("\"async\":true"), "{line}");
        assert_eq!(field(line, "requests"), 300.0, "{line}");
        assert_every_response_right(line);
    }
    let runcache = lines[0];
    assert_eq!(
        field(runcache, "compiles"),
        field(runcache, "shapes"),
        "async single flight: one compile per shape, eight tasks on two threads: {runcache}"
    );
    assert_eq!(field(runcache, "weight_reorders"), 3.0, "{runcache}");
}

#[test]
fn bad_flags_and_a_bad_environment_are_clear_errors() {
    for (args, says) in [
        (vec!["--cache", "redis"], "unknown cache `redis`"),
        (vec!["--threads", "0"], "--threads: must be at least 1"),
        (
            vec!["--requests", "many"],
            "--requests: `many` is not a whole number",
        ),
        (vec!["--frobnicate"], "unknown flag `--frobnicate`"),
        (vec!["--seed"], "--seed needs a value"),
        (vec!["--threads", "1,0"], "--threads: must be at least 1"),
        (
            vec!["--hidden", "12"],
            "--hidden: 12 is not a multiple of 8 from 8 to 4096",
        ),
        (
            vec!["--inject", "compile:0"],
            "--inject compile: P must be at least 1",
        ),
        (
            vec!["--inject", "disk:3"],
            "--inject: unknown failure `disk`",
        ),
        (
            vec!["--inject", "compile"],
            "--inject: `compile` is not FAILURE:P",
        ),
        (vec!["--models", "0"], "--models: must be at least 1"),
        (
            vec!["--popularity", "-1"],
            "--popularity: -1 is not an exponent of 0 or more",
        ),
        (
            vec!["--popularity", "NaN"],
            "--popularity: NaN is not an exponent of 0 or more",
        ),
        (
            vec!["--popularity", "steep"],
            "--popularity: `steep` is not a number",
        ),
        (
            vec!["--models", "4", "--hidden", "128"],
            "--hidden sets the one model's width",
        ),
        (
            vec!["--budget-mib", "lots"],
            "--budget-mib: `lots` is not a whole number",
        ),
    ] {
        let stderr = refused(&args, "cpu:64");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let stderr = refused(&["--requests", "5"], "cpu:lots");
    assert!(
        stderr.contains("RUNCACHE_CONSTANT_CACHE_CAPACITY"),
        "{stderr}"
    );
    let help = runtime().arg("--help").output().expect("the runtime runs");
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--cache",
        "--threads",
        "--requests",
        "--kernels",
        "--seed",
        "--hidden",
        "--inject",
        "--models",
        "--popularity",
        "--shift",
        "--budget-mib",
        "--gpu",
        "--async",
        "--json",
        "--markdown",
    ] {
        assert!(text.contains(flag), "--help lists {flag}: {text}");
    }
    assert!(text.contains("default"), "{text}");
}

#[test]
fn ctrl_c_prints_the_figures_so_far() {
    use std::io::BufRead;
    let mut child = runtime()
        .args(["--requests", "100000000", "--cache", "runcache,none"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the runtime runs");
    // Its standard error says when the warm-up is over and the measured runs begin.
    let stderr = child.stderr.take().expect("piped");
    let (started, warmed) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.starts_with("warm-up:") {
                let _ = started.send(());
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    if warmed
        .recv_timeout(std::time::Duration::from_secs(300))
        .is_err()
    {
        // Never leave the child serving its hundred million requests.
        let _ = child.kill();
        let _ = child.wait();
        panic!("the warm-up did not end within 300 s");
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let out = child.wait_with_output().expect("the runtime ends");
    let stderr = reader.join().expect("the reader ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("interrupted; the figures so far"),
        "{stderr}"
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with("runcache "))
        .unwrap_or_else(|| panic!("a runcache row: {stdout}"));
    let served: u64 = row.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(served > 0 && served < 100_000_000, "{row}");
    assert!(
        !stdout.contains("\nnone "),
        "the run stopped before the next cache: {stdout}"
    );
}

/// Fails unless the run of JSON line `line` served every request with the reference's
/// answer.
fn assert_every_response_right(line: &str) {
    assert_eq!(field(line, "failed"), 0.0, "{line}");
    assert_eq!(field(line, "mismatches"), 0.0, "{line}");
}

/// The one JSON line of a runcache-only run with `args` and the weight budget `budget`,
/// after checking that it succeeded.
fn runcache_line(args: &[&str], budget: &str) -> String {
    let out = runtime()
        .args(["--cache", "runcache", "--json"])
        .args(args)
        .env("RUNCACHE_CONSTANT_CACHE_CAPACITY", budget)
        .output()
        .expect("the runtime runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    stdout.lines().next().expect("one line").to_string()
}

#[test]
fn a_weight_budget_of_zero_reorders_every_time_and_serves_every_request() {
    // One thread: on several, requests that need a weight at the same moment share its
    // reorder (a disabled cache still deduplicates concurrent builds), so fewer than three.
    let line = runcache_line(&["--requests", "40", "--threads", "1"], "cpu:0");
    assert_every_response_right(&line);
    assert_eq!(
        field(&line, "weight_reorders"),
        120.0,
        "nothing fits: three reorders a request"
    );
    assert_eq!(field(&line, "weight_hit_ratio"), 0.0, "{line}");
    assert_eq!(field(&line, "peak_weight_bytes"), 0.0, "{line}");
    let shared = runcache_line(&["--requests", "40", "--threads", "4"], "cpu:0");
    assert_every_response_right(&shared);
    assert!(field(&shared, "weight_reorders") <= 120.0, "{shared}");
    assert_eq!(field(&shared, "peak_weight_bytes"), 0.0, "{shared}");
}

#[test]
fn a_budget_smaller_than_one_weight_tensor_reorders_that_tensor_each_time() {
    // Hidden width 520: the middle weight is 520 × 520 × 4 = 1,081,600 bytes, over a budget
    // of 1 MiB; the other two (66,560 bytes each) fit beside each other.
    // One thread: two callers waiting on one build would share its uncached buffer.
    let line = runcache_line(
        &["--requests", "20", "--hidden", "520", "--threads", "1"],
        "cpu:1",
    );
    assert_eq!(field(&line, "hidden"), 520.0, "{line}");
    assert_every_response_right(&line);
    assert_eq!(
        field(&line, "weight_reorders"),
        22.0,
        "the two small weights once, the big one on every request"
    );
    assert_eq!(
        field(&line, "weight_reordered_bytes"),
        2.0 * 66_560.0 + 20.0 * 1_081_600.0,
        "the bytes those reorders wrote"
    );
    assert!(
        field(&line, "peak_cache_bytes") < 1_081_600.0,
        "the big weight was never cached: {line}"
    );
}

#[test]
fn injected_failures_are_counted_per_request_and_the_others_are_served() {
    let (code, stdout, stderr) = run(&[
        "--requests",
        "200",
        "--threads",
        "4",
        "--inject",
        "compile:5,oversize:10",
        "--json",
    ]);
    assert_eq!(
        code,
        Some(0),
        "injected failures alone exit 0: {stdout}\n{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(field(line, "requests"), 200.0, "{line}");
        assert_eq!(
            field(line, "failed_rows"),
            20.0,
            "requests 10, 20, .., 200: {line}"
        );
        let compile = field(line, "failed_compile");
        assert!(compile > 0.0, "one compile in five fails: {line}");
        assert_eq!(
            field(line, "failed"),
            20.0 + compile,
            "nothing else fails: {line}"
        );
        assert_eq!(field(line, "unexpected_failures"), 0.0, "{line}");
        assert_eq!(field(line, "mismatches"), 0.0, "{line}");
        // Without a cache every request compiles three kernels, so most fail.
        if i < 4 {
            assert!(
                field(line, "failed") < 100.0,
                "most requests are served: {line}"
            );
        }
    }
    // A failed compile is not cached: the shape compiles again on a later request, so
    // runcache still compiles no shape twice and misses none for good.
    let runcache = lines[0];
    assert!(
        field(runcache, "compiles") <= field(runcache, "shapes"),
        "{runcache}"
    );
}

#[cfg(not(feature = "vulkan"))]
#[test]
fn gpu_without_the_vulkan_feature_is_a_clear_error() {
    let stderr = refused(&["--gpu", "--requests", "5"], "cpu:64");
    assert!(
        stderr.contains("--gpu needs the `vulkan` feature"),
        "{stderr}"
    );
}

/// With `--features vulkan`: the weights in device buffers, read back for every use, give
/// the reference's answers with every cache. Skipped with a notice where no Vulkan device
/// exists, unless `RUNCACHE_REQUIRE_VULKAN` is set (CI's lavapipe step sets it).
#[cfg(feature = "vulkan")]
#[test]
fn gpu_weights_serve_correct_responses_with_every_cache() {
    let (code, stdout, stderr) = run(&["--gpu", "--requests", "150", "--threads", "3", "--json"]);
    if code == Some(2) && std::env::var_os("RUNCACHE_REQUIRE_VULKAN").is_none() {
        eprintln!("skipped: no Vulkan device ({stderr})");
        return;
    }
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    for line in &lines {
        assert_every_response_right(line);
    }
    assert_eq!(
        field(lines[0], "weight_reorders"),
        3.0,
        "uploaded once each"
    );
    assert_eq!(
        field(lines[4], "weight_reorders"),
        450.0,
        "no cache: every use"
    );
    assert_eq!(
        field(lines[0], "compiles"),
        field(lines[0], "shapes"),
        "{}",
        lines[0]
    );
}

#[test]
fn models_that_would_not_fit_in_memory_are_refused_before_serving() {
    if !std::path::Path::new("/proc/meminfo").exists() {
        eprintln!("skipped: no /proc/meminfo to know the memory available");
        return;
    }
    // A million models of 64 to 1,024 wide: about 1.4 TB of weights.
    let stderr = refused(&["--models", "1000000", "--requests", "5"], "cpu:64");
    assert!(
        stderr.contains("--models 1000000: the models' weights take")
            && stderr.contains("of memory available"),
        "{stderr}"
    );
}

#[test]
fn many_models_under_one_budget_serve_correct_responses_and_runcache_never_exceeds_it() {
    let (code, stdout, stderr) = run(&[
        "--models",
        "8",
        "--shift",
        "--budget-mib",
        "1",
        "--requests",
        "160",
        "--threads",
        "2",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    for line in &lines {
        assert!(
            line.contains("\"models\":8") && line.contains("\"shift\":true"),
            "{line}"
        );
        assert_eq!(field(line, "requests"), 160.0, "{line}");
        assert_every_response_right(line);
        assert_eq!(field(line, "weight_budget_bytes"), 1048576.0, "{line}");
        assert!(
            field(line, "weight_samples") >= 40.0,
            "one sample in four requests: {line}"
        );
        assert!(field(line, "p999_ms") >= field(line, "p99_ms"), "{line}");
    }
    let runcache = lines[0];
    assert_eq!(
        field(runcache, "weight_samples_over_budget"),
        0.0,
        "{runcache}"
    );
    assert!(
        field(runcache, "peak_weight_bytes") <= 1048576.0,
        "{runcache}"
    );
    assert!(
        field(runcache, "weight_reorders") > 24.0,
        "eight models' 24 weights do not fit in 1 MiB: some are reordered again: {runcache}"
    );
    let none = lines[4];
    assert_eq!(field(none, "weight_reorders"), 480.0, "no cache: every use");
}

#[test]
fn a_budget_below_the_smallest_model_reorders_every_weight_and_stays_correct() {
    let (code, stdout, stderr) = run(&[
        "--models",
        "4",
        "--budget-mib",
        "0",
        "--requests",
        "60",
        "--threads",
        "1",
        "--cache",
        "runcache,quick_cache,mutex-hashmap",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    for line in stdout.lines() {
        assert_every_response_right(line);
        assert_eq!(
            field(line, "weight_reorders"),
            180.0,
            "every use reorders: {line}"
        );
        assert_eq!(field(line, "peak_weight_bytes"), 0.0, "{line}");
    }
}
