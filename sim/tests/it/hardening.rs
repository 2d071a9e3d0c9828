//! Issue 12's adversarial inputs, one test per item: false passes, exit codes, closed and full
//! outputs, leftovers, sloppy values, sweeps that mix shards. Each failed on the main before it.

use crate::scratch::Scratch;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cancelsim"));
    c.env("CI", "1");
    c
}

fn cancelsim(args: &[&str], cwd: &Path) -> Output {
    bin().args(args).current_dir(cwd).output().unwrap()
}

fn scratch(name: &str) -> Scratch {
    Scratch::new("hard", name, true)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const TINY: &str = r#"Scenario(
    name: "tiny",
    seed: 3,
    workload: (
        source: Poisson(rate_per_s: 50.0, requests: 40),
        output_tokens: Exponential(mean: 15.0),
    ),
    cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous(max_num_seqs: 8)),
    cancellation: (fraction: 0.3, stage: Random),
    policies: [PerRequest],
)
"#;

/// `check .` in `dir`: (exit code, stdout).
fn check(dir: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut args = vec!["check", "."];
    args.extend(extra);
    let out = cancelsim(&args, dir);
    (out.status.code(), text(&out.stdout))
}

#[test]
fn a_missing_corrupt_empty_or_stale_golden_file_fails() {
    let dir = scratch("golden");
    std::fs::write(dir.join("a.ron"), TINY).unwrap();
    let (code, out) = check(&dir, &[]);
    assert_eq!(code, Some(1), "missing golden.txt passed: {out}");
    assert!(out.contains("golden.txt: cannot read"), "{out}");
    for (golden, want) in [
        ("garbage\n", "golden.txt:1: expected"),
        ("", "no golden run hash"),
        ("# only a comment\n", "no golden run hash"),
        ("a.ron 3 abc\n", "golden.txt:1: expected"),
    ] {
        std::fs::write(dir.join("golden.txt"), golden).unwrap();
        let (code, out) = check(&dir, &[]);
        assert_eq!(code, Some(1), "{golden:?} passed: {out}");
        assert!(out.contains(want), "{golden:?}: {out}");
    }
    let (code, out) = check(&dir, &["--update-golden"]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = check(&dir, &[]);
    assert_eq!(code, Some(0), "{out}");
    let good = std::fs::read_to_string(dir.join("golden.txt")).unwrap();
    // Another seed on the golden line, or a line naming a file that is not there.
    std::fs::write(dir.join("golden.txt"), good.replace("a.ron 3 ", "a.ron 4 ")).unwrap();
    let (code, out) = check(&dir, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("records seed 4, but the scenario's seed is 3"),
        "{out}"
    );
    let stale = format!("{good}gone.ron 3 {}\n", "a".repeat(64));
    std::fs::write(dir.join("golden.txt"), stale).unwrap();
    let (code, out) = check(&dir, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("names gone.ron, which is not in"), "{out}");
    // A changed hash.
    let changed: String = good
        .lines()
        .map(|l| match l.starts_with("a.ron 3 ") {
            true => format!("a.ron 3 {}\n", "0".repeat(64)),
            false => format!("{l}\n"),
        })
        .collect();
    std::fs::write(dir.join("golden.txt"), changed).unwrap();
    let (code, out) = check(&dir, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("golden run hash"), "{out}");
    // Scenario files without hashes are checked with --no-golden, explicitly.
    std::fs::remove_file(dir.join("golden.txt")).unwrap();
    let (code, out) = check(&dir, &["--no-golden"]);
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn exit_codes_say_found_input_or_io() {
    let dir = scratch("codes");
    std::fs::write(dir.join("a.ron"), TINY).unwrap();
    // Usage: an unknown flag.
    let out = cancelsim(&["run", "--no-such-flag"], &dir);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // Input: a missing scenario.
    let out = cancelsim(&["run", "nope.ron"], &dir);
    assert_eq!(out.status.code(), Some(2));
    // Found: check fails a scenario (here, no golden hash).
    let out = cancelsim(&["check", "."], &dir);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("check found"),
        "{}",
        text(&out.stderr)
    );
    // I/O: the output root is a file.
    std::fs::write(dir.join("file"), "").unwrap();
    let out = cancelsim(&["run", "a.ron", "--out", "file"], &dir);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr).lines().count(),
        1,
        "{}",
        text(&out.stderr)
    );
}

fn oplog() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/oplogs/reference.jsonl")
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_closed_or_full_standard_output_is_an_io_error() {
    let dir = scratch("stdout");
    let sh = |cmd: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("exec {} {cmd}", env!("CARGO_BIN_EXE_cancelsim")))
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    if cfg!(target_os = "linux") {
        let out = sh(&format!("replay {} >&-", oplog()));
        assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("standard output"),
            "{}",
            text(&out.stderr)
        );
    }
    if Path::new("/dev/full").exists() {
        let out = sh(&format!("replay {} > /dev/full", oplog()));
        assert_eq!(out.status.code(), Some(3));
        let err = text(&out.stderr);
        assert!(
            err.contains("standard output") && !err.contains("reference.jsonl"),
            "{err}"
        );
    }
    // Redirected to /dev/null on purpose: success.
    let out = sh(&format!("replay {} > /dev/null", oplog()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn a_reader_that_stops_early_ends_the_command_quietly() {
    let dir = scratch("pipe");
    std::fs::write(dir.join("a.ron"), TINY).unwrap();
    cancelsim(&["check", ".", "--update-golden"], &dir);
    // 3 MB of results: more than a pipe holds, so replay is still writing when the pipe closes.
    let long = "{\"op\":\"barrier_advance\"}\n".repeat(200_000);
    std::fs::write(dir.join("long.jsonl"), long).unwrap();
    for args in [
        vec![
            "check".to_string(),
            ".".into(),
            "--swarm".into(),
            "20".into(),
        ],
        vec!["replay".into(), "long.jsonl".into()],
    ] {
        let mut child = bin()
            .args(&args)
            .current_dir(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read one byte, then close the pipe (`| head -c 1`).
        let mut stdout = child.stdout.take().unwrap();
        let mut one = [0u8; 1];
        stdout.read_exact(&mut one).unwrap();
        drop(stdout);
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(status.code(), Some(0), "{args:?}: {err}");
    }
}

#[test]
fn no_leftovers_after_a_kill_or_a_failed_run() {
    let dir = scratch("leftovers");
    std::fs::write(dir.join("a.ron"), TINY).unwrap();
    // What `kill -9` leaves: a temporary directory of a process that is gone.
    let stale = dir.join("out/tiny/.tmp-run-4000000000");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("requests.csv"), "x").unwrap();
    let out = cancelsim(&["run", "a.ron", "--out", "out"], &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !stale.exists(),
        "a stale temporary directory survived a later run"
    );
    // A run that fails mid-way leaves no empty scenario directory.
    let limited = TINY.replace("seed: 3,", "seed: 3,\n    limits: (max_events: 50),");
    std::fs::write(
        dir.join("b.ron"),
        limited.replace("\"tiny\"", "\"limited\""),
    )
    .unwrap();
    let out = cancelsim(&["run", "b.ron", "--out", "out"], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        !dir.join("out/limited").exists(),
        "an empty directory was left"
    );
}

#[test]
fn concurrent_forced_runs_into_one_directory_all_succeed() {
    let dir = scratch("force");
    std::fs::write(dir.join("a.ron"), TINY).unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            bin()
                .args(["run", "a.ron", "--out", "out", "--force"])
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let entries: Vec<_> = std::fs::read_dir(dir.join("out/tiny"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "one run directory, nothing else: {entries:?}"
    );
    let run = dir.join("out/tiny").join(&entries[0]);
    assert!(run.join("summary.json").is_file() && run.join("trace.json").is_file());
}

#[test]
fn sloppy_option_values_are_refused() {
    let dir = scratch("sloppy");
    std::fs::write(dir.join("a.ron"), TINY).unwrap();
    for v in ["0", "NaN", "-5", "inf", "x"] {
        let arg = format!("--sample-ms={v}");
        let out = cancelsim(&["run", "a.ron", &arg], &dir);
        assert_eq!(out.status.code(), Some(2), "--sample-ms {v}");
        assert!(
            text(&out.stderr).contains("--sample-ms"),
            "{}",
            text(&out.stderr)
        );
    }
    assert!(!dir.join("output").exists());
}

#[test]
fn a_cut_trace_warns_on_stderr() {
    let dir = scratch("cut");
    std::fs::write(dir.join("a.ron"), TINY).unwrap();
    let out = cancelsim(&["run", "a.ron", "--trace-events", "50"], &dir);
    assert!(out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("warning: trace.json: run per_request kept its first"),
        "{err}"
    );
    let out = cancelsim(
        &["run", "a.ron", "--trace-events", "0", "--out", "o2"],
        &dir,
    );
    assert!(out.status.success() && out.stderr.is_empty());
    let runs: Vec<_> = std::fs::read_dir(dir.join("o2/tiny")).unwrap().collect();
    let run = runs[0].as_ref().unwrap().path();
    assert!(
        !run.join("trace.json").exists(),
        "--trace-events 0 writes no trace"
    );
}

#[test]
fn a_trace_replay_and_a_tiny_library_scenario_get_their_trace_json() {
    let dir = scratch("traced");
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    let lib = lib.canonicalize().unwrap();
    for file in ["library/baseline.ron", "library/s01-queued-cancel.ron"] {
        let path = lib.join(file);
        let out = cancelsim(
            &[
                "run",
                path.to_str().unwrap(),
                "--out",
                "out",
                "--data-root",
                lib.to_str().unwrap(),
            ],
            &dir,
        );
        assert!(out.status.success(), "{file}: {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        let wrote = stdout
            .lines()
            .find_map(|l| l.strip_prefix("wrote "))
            .unwrap_or_else(|| panic!("{file}: {stdout}"));
        assert!(
            dir.join(wrote).join("trace.json").is_file(),
            "{file}: no trace.json in {wrote}"
        );
    }
}

#[test]
fn trace_paths_stay_under_the_data_root() {
    let dir = scratch("root");
    let inner = dir.join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::write(
        dir.join("t.csv"),
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,10,5\n",
    )
    .unwrap();
    let s = r#"Scenario(name: "r", workload: (source: Trace(path: "../t.csv", format: AzureCsv)),
        cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous()))"#;
    std::fs::write(inner.join("s.ron"), s).unwrap();
    // Run from inner/: the trace is outside the working directory, the default root.
    let out = cancelsim(&["run", "s.ron", "--no-write"], &inner);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("s.ron:1:") && err.contains("outside the data root"),
        "{err}"
    );
    let out = cancelsim(&["run", "s.ron", "--no-write", "--data-root", ".."], &inner);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // An empty trace window is refused like `requests: 0`.
    let past = s.replace("AzureCsv)", "AzureCsv, first_row: 5)");
    std::fs::write(dir.join("p.ron"), past.replace("../t.csv", "t.csv")).unwrap();
    let out = cancelsim(&["run", "p.ron", "--no-write"], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no data row from first_row 5"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn oversized_inputs_are_refused_without_reading_them_whole() {
    let dir = scratch("size");
    if Path::new("/dev/zero").exists() {
        let out = cancelsim(&["run", "/dev/zero"], &dir);
        assert_eq!(out.status.code(), Some(2));
        assert!(
            text(&out.stderr).contains("larger than"),
            "{}",
            text(&out.stderr)
        );
    }
    let mut long =
        String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,10,5\n");
    long.push_str(&"9".repeat(200_000));
    std::fs::write(dir.join("t.csv"), long).unwrap();
    let s = r#"Scenario(name: "r", workload: (source: Trace(path: "t.csv", format: AzureCsv)),
        cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous()))"#;
    std::fs::write(dir.join("s.ron"), s).unwrap();
    let out = cancelsim(&["run", "s.ron", "--no-write"], &dir);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("t.csv:3") && err.contains("line longer than"),
        "{err}"
    );
}

#[test]
fn a_bad_grid_value_is_refused_at_its_line_before_any_part_is_written() {
    let dir = scratch("grid");
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/sweeps/tiny-storm.ron");
    std::fs::copy(base, dir.join("tiny-storm.ron")).unwrap();
    let sweep = "Sweep(\n  name: \"g\",\n  scenario: \"tiny-storm.ron\",\n  seeds: 2,\n  grid: [\n    Fraction([0.1, 0.3]),\n    Loss([0.0, 1.5]),\n  ],\n)\n";
    std::fs::write(dir.join("g.ron"), sweep).unwrap();
    let out = cancelsim(&["sweep", "g.ron", "--out", "o"], &dir);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("g.ron:7:16: grid axis loss, value 1.5"),
        "{err}"
    );
    assert!(!dir.join("o").exists(), "parts were written");
}

/// An axis that cannot change the base scenario (a cancel fraction without a `cancellation`
/// section, a rate on a trace, a repeated value) used to run points that differed only in
/// name, which read as "no effect". It is refused at the value, naming why.
#[test]
fn a_grid_axis_that_changes_nothing_is_refused_naming_why() {
    let dir = scratch("inert");
    let calm = r#"Scenario(name: "calm", workload: (source: Poisson(rate_per_s: 5.0, requests: 20)),
        cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous()))"#;
    std::fs::write(dir.join("calm.ron"), calm).unwrap();
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/sweeps/tiny-storm.ron");
    std::fs::copy(base, dir.join("tiny-storm.ron")).unwrap();
    for (scenario, axis, want) in [
        (
            "calm.ron",
            "Fraction([0.0, 0.2])",
            "no `cancellation` section",
        ),
        (
            "tiny-storm.ron",
            "Loss([0.1, 0.2, 0.1])",
            "a value is repeated",
        ),
    ] {
        let sweep =
            format!("Sweep(name: \"g\", scenario: \"{scenario}\", seeds: 1,\n  grid: [{axis}])\n");
        std::fs::write(dir.join("g.ron"), sweep).unwrap();
        let out = cancelsim(&["sweep", "g.ron", "--out", "o"], &dir);
        assert_eq!(out.status.code(), Some(2), "{axis}");
        let err = text(&out.stderr);
        assert!(
            err.contains("g.ron:2:") && err.contains("would change nothing") && err.contains(want),
            "{err}"
        );
        assert!(!dir.join("o").exists(), "parts were written");
    }
}

#[test]
fn extreme_values_are_errors_in_every_build_not_overflows() {
    // In a debug build the first panicked (an infinite draw) and the second overflowed; a
    // release build went on with a saturated or wrapped value. Both are input errors now, in
    // both builds (this test runs the debug binary).
    let dir = scratch("extreme");
    let huge = TINY.replace(
        "output_tokens: Exponential(mean: 15.0)",
        "output_tokens: LogNormal(median: 1e300, sigma: 10.0)",
    );
    std::fs::write(dir.join("a.ron"), huge).unwrap();
    let out = cancelsim(&["run", "a.ron", "--no-write"], &dir);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("a.ron:") && err.contains("must be at most 1e15"),
        "{err}"
    );
    std::fs::write(dir.join("tiny-storm.ron"), TINY).unwrap();
    let sweep = "Sweep(name: \"s\", scenario: \"tiny-storm.ron\", first_seed: 18446744073709551615, seeds: 2, grid: [])";
    std::fs::write(dir.join("s.ron"), sweep).unwrap();
    let out = cancelsim(&["sweep", "s.ron", "--out", "o"], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("past the last seed"),
        "{}",
        text(&out.stderr)
    );
    assert!(!text(&out.stderr).contains("panicked"));
}
