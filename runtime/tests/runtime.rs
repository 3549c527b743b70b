//! The runtime binary end to end: every cache serves a few hundred requests, every response
//! matches the reference, runcache compiles each shape exactly once, and bad flags or a bad
//! environment are clear errors.

use std::process::Command;

fn runtime() -> Command {
    Command::new(env!("CARGO_BIN_EXE_runcache-runtime"))
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
    let out = runtime()
        .args(["--requests", "300", "--threads", "4", "--json"])
        .env_remove("RUNCACHE_CONSTANT_CACHE_CAPACITY")
        .output()
        .expect("the runtime runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let names = ["runcache", "moka", "quick_cache", "mutex-hashmap", "none"];
    assert_eq!(lines.len(), names.len(), "{stdout}");
    for (line, name) in lines.iter().zip(names) {
        assert!(line.contains(&format!("\"cache\":\"{name}\"")), "{line}");
        assert_eq!(field(line, "requests"), 300.0);
        assert_eq!(field(line, "mismatches"), 0.0, "{line}");
        assert_eq!(field(line, "failed"), 0.0, "{line}");
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
    ] {
        let out = runtime().args(&args).output().expect("the runtime runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let out = runtime()
        .args(["--requests", "5"])
        .env("RUNCACHE_CONSTANT_CACHE_CAPACITY", "cpu:lots")
        .output()
        .expect("the runtime runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
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
        "--json",
    ] {
        assert!(text.contains(flag), "--help lists {flag}: {text}");
    }
    assert!(text.contains("default"), "{text}");
}

#[test]
fn ctrl_c_prints_the_figures_so_far() {
    let child = runtime()
        .args(["--requests", "100000000", "--cache", "runcache,none"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the runtime runs");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let out = child.wait_with_output().expect("the runtime ends");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
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

#[test]
fn a_weight_budget_of_zero_reorders_every_time_and_serves_every_request() {
    let out = runtime()
        .args(["--requests", "40", "--cache", "runcache", "--json"])
        .env("RUNCACHE_CONSTANT_CACHE_CAPACITY", "cpu:0")
        .output()
        .expect("the runtime runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let line = stdout.lines().next().expect("one line");
    assert_eq!(field(line, "failed"), 0.0, "{line}");
    assert_eq!(field(line, "mismatches"), 0.0, "{line}");
    assert_eq!(
        field(line, "weight_reorders"),
        120.0,
        "nothing fits: three reorders a request"
    );
}
