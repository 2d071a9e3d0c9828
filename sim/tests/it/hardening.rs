//! Issue 12's adversarial inputs, one test per item: false passes, exit codes, closed and full
//! outputs, leftovers, sloppy values, sweeps that mix shards. Each failed on the main before it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cancelsim"));
    c.env("CI", "1");
    c
}

fn cancelsim(args: &[&str], cwd: &Path) -> Output {
    bin().args(args).current_dir(cwd).output().unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cancelsim-hard-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
    for args in [
        vec![
            "check".to_string(),
            ".".into(),
            "--swarm".into(),
            "20".into(),
        ],
        vec!["replay".into(), oplog()],
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
