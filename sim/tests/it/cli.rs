//! The binary as a user runs it: bad input gets one line naming the place, a non-zero exit and
//! no panic; good input prints a summary ending in `run_hash=`.

use crate::scratch::Scratch;
use std::path::Path;
use std::process::{Command, Output};

fn cancelsim(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("cancelsim runs")
}

fn scratch(name: &str) -> Scratch {
    Scratch::new("cli", name, true)
}

/// A small valid scenario, which other tests vary.
pub(crate) const GOOD: &str = r#"Scenario(
    name: "tiny",
    seed: 3,
    workload: (
        source: Poisson(rate_per_s: 50.0, requests: 200),
        output_tokens: Exponential(mean: 15.0),
    ),
    cluster: (
        profile: Named("llama-3.1-8b-h100"),
        scheduler: Continuous(max_num_seqs: 8),
    ),
)
"#;

/// Write `text` as a scenario, run it, and return (exit code, stderr).
fn run_text(name: &str, text: &str) -> (Option<i32>, String, Scratch) {
    let dir = scratch(name);
    let path = dir.join("s.ron");
    std::fs::write(&path, text).unwrap();
    let out = cancelsim(&["run", "s.ron", "--out", "out"], &dir);
    (
        out.status.code(),
        String::from_utf8(out.stderr).unwrap(),
        dir,
    )
}

fn assert_one_line_error(name: &str, text: &str, expect: &[&str]) {
    let (code, stderr, dir) = run_text(name, text);
    assert_eq!(code, Some(2), "{name}: exit code; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{name}: panicked: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "{name}: not one line: {stderr}"
    );
    for e in expect {
        assert!(stderr.contains(e), "{name}: {stderr:?} lacks {e:?}");
    }
    assert!(
        !dir.join("out").exists(),
        "{name}: wrote output for a bad scenario"
    );
}

#[test]
fn misspelt_field() {
    let text = GOOD.replace("seed: 3", "sed: 3");
    assert_one_line_error(
        "misspelt",
        &text,
        &["s.ron:3:5", "Unexpected field named `sed`", "`seed`"],
    );
}

#[test]
fn misspelt_nested_field_names_its_path() {
    let text = GOOD.replace("max_num_seqs: 8", "max_num_seq: 8");
    assert_one_line_error(
        "nested",
        &text,
        &[
            "s.ron:10:31",
            "`max_num_seqs`",
            "cluster.scheduler.Continuous.max_num_seq",
        ],
    );
}

/// A roofline share is a whole percentage from 1 to 100 of a named profile's roofline: zero, over
/// 100, a fraction, a misspelt share and a share on the linear form are each one line.
#[test]
fn bad_roofline_shares() {
    let with = |shares: &str| {
        GOOD.replace(
            "scheduler: Continuous",
            &format!("{shares} scheduler: Continuous"),
        )
    };
    let roofline_line = "s.ron:10:";
    for (name, shares, expect) in [
        (
            "share0",
            "roofline: (mfu_attn_pct: 0),",
            vec![
                roofline_line,
                "cluster.roofline.mfu_attn_pct",
                "1 to 100",
                "got 0",
            ],
        ),
        (
            "share101",
            "roofline: (mbu_kv_pct: 101),",
            vec!["cluster.roofline.mbu_kv_pct", "got 101"],
        ),
        (
            "sharefrac",
            "roofline: (mfu_pct: 0.5),",
            vec![
                roofline_line,
                "cluster.roofline.mfu_pct",
                "whole number",
                "got 0.5",
            ],
        ),
        (
            "sharetypo",
            "roofline: (mfu_attention_pct: 50),",
            vec![roofline_line, "mfu_attention_pct", "`mfu_attn_pct`"],
        ),
        (
            "sharelinear",
            "step_model: Linear, roofline: (mfu_pct: 50),",
            vec!["cluster.roofline", "Roofline step model"],
        ),
    ] {
        assert_one_line_error(name, &with(shares), &expect);
    }
    let custom = with("roofline: (mfu_pct: 50),").replace(
        "Named(\"llama-3.1-8b-h100\")",
        "Custom(c0_ms: 10.0, kv_blocks_16: 1000)",
    );
    assert_one_line_error(
        "sharecustom",
        &custom,
        &["cluster.roofline", "named profile"],
    );
}

/// RON reads `8.5` as `8` and a stray `.5`: the error names the field and the number, not a
/// missing comma. (An exponent, `2e2`, RON already refuses at the field.)
#[test]
fn a_fraction_where_a_whole_number_belongs() {
    for (name, from, to, expect) in [
        (
            "fracseed",
            "seed: 3",
            "seed: 3.5",
            ["s.ron:3:12", "`seed`", "got 3.5"],
        ),
        (
            "fracseqs",
            "max_num_seqs: 8",
            "max_num_seqs: 8.",
            [
                "s.ron:10:",
                "`cluster.scheduler.Continuous.max_num_seqs`",
                "got 8.",
            ],
        ),
        (
            "fracreqs",
            "requests: 200",
            "requests: 2e2",
            [
                "s.ron:5:",
                "workload.source.Poisson.requests",
                "Invalid digit",
            ],
        ),
    ] {
        let mut expect = expect.to_vec();
        if name != "fracreqs" {
            expect.push("must be a whole number");
        }
        assert_one_line_error(name, &GOOD.replace(from, to), &expect);
    }
}

#[test]
fn wrong_type() {
    let text = GOOD.replace("requests: 200", "requests: \"many\"");
    assert_one_line_error(
        "wrongtype",
        &text,
        &[
            "s.ron:5:",
            "Expected integer",
            "workload.source.Poisson.requests",
        ],
    );
}

#[test]
fn negative_rate() {
    let text = GOOD.replace("rate_per_s: 50.0", "rate_per_s: -5.0");
    assert_one_line_error(
        "negative",
        &text,
        &[
            "s.ron:5:25",
            "workload.source.Poisson.rate_per_s",
            "> 0",
            "-5",
        ],
    );
}

#[test]
fn nan_parameter() {
    let text = GOOD.replace("mean: 15.0", "mean: NaN");
    assert_one_line_error(
        "nan",
        &text,
        &[
            "s.ron:6:36",
            "workload.output_tokens.Exponential.mean",
            "finite",
        ],
    );
}

#[test]
fn empty_file() {
    assert_one_line_error("empty", "", &["s.ron:1:1", "empty scenario file"]);
    assert_one_line_error("blank", "  \n\n", &["s.ron:1:1", "empty scenario file"]);
}

#[test]
fn unknown_variant() {
    let text = GOOD.replace("Exponential(mean", "Exponentail(mean");
    assert_one_line_error(
        "variant",
        &text,
        &["s.ron:6:24", "Exponentail", "workload.output_tokens"],
    );
}

#[test]
fn unknown_profile_lists_the_known_ones() {
    let text = GOOD.replace("Named(\"llama-3.1-8b-h100\")", "Named(\"gpt-9\")");
    assert_one_line_error(
        "profile",
        &text,
        &["s.ron:9:18", "cluster.profile.Named", "llama-2-7b-a100"],
    );
}

#[test]
fn missing_trace_names_the_field() {
    let text = GOOD.replace(
        "source: Poisson(rate_per_s: 50.0, requests: 200)",
        "source: Trace(path: \"nope.csv\", format: AzureCsv)",
    );
    assert_one_line_error(
        "trace",
        &text,
        &[
            "s.ron:5:23",
            "workload.source.Trace.path",
            "nope.csv: no such file",
        ],
    );
}

#[test]
fn probability_out_of_range() {
    let text = GOOD.replace(
        "source: Poisson(rate_per_s: 50.0, requests: 200)",
        "source: Conversations(conversations: 3, start_rate_per_s: 1.0, turns: Constant(2.0), \
         think_ms: Constant(10.0), barge_in: (probability: 1.5, after_ms: Constant(1.0)))",
    );
    assert_one_line_error(
        "prob",
        &text,
        &[
            "workload.source.Conversations.barge_in.probability",
            "[0, 1]",
            "1.5",
        ],
    );
}

#[test]
fn missing_file() {
    let dir = scratch("missing");
    let out = cancelsim(&["run", "nope.ron"], &dir);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("nope.ron: cannot read scenario: no such file"),
        "{stderr}"
    );
}

fn hash_line(out: &Output) -> String {
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let last = stdout
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert!(last.starts_with("run_hash="), "last line is {last:?}");
    assert_eq!(last.len(), "run_hash=".len() + 64);
    last
}

#[test]
fn default_run_is_reproducible_and_seed_sensitive() {
    let dir = scratch("default");
    let a = cancelsim(&[], &dir);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let b = cancelsim(&[], &dir);
    assert!(b.status.success(), "second run of the same command fails");
    assert_eq!(hash_line(&a), hash_line(&b));
    let c = cancelsim(&["run", "--seed", "7", "--no-write"], &dir);
    assert!(c.status.success());
    assert_ne!(hash_line(&a), hash_line(&c));
    // The first run wrote summary.json holding the same hash; the second kept it.
    let stdout = String::from_utf8(b.stdout).unwrap();
    assert!(stdout.contains("kept output/default/seed42-"), "{stdout}");
    let summaries: Vec<_> = std::fs::read_dir(dir.join("output/default"))
        .unwrap()
        .collect();
    assert_eq!(summaries.len(), 1, "one run directory, no temporaries left");
    let run_dir = summaries[0].as_ref().unwrap().path();
    let json = std::fs::read_to_string(run_dir.join("summary.json")).unwrap();
    assert!(json.contains(&format!(
        "\"run_hash\": \"{}\"",
        &hash_line(&a)["run_hash=".len()..]
    )));
}

#[test]
fn good_scenario_file_runs() {
    let (code, stderr, dir) = run_text("good", GOOD);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(dir.join("out/tiny").is_dir());
}

#[test]
fn limit_is_a_clear_error() {
    let text = GOOD.replace("seed: 3,", "seed: 3,\n    limits: (max_events: 100),");
    let (code, stderr, _) = run_text("limit", &text);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("limits.max_events = 100"), "{stderr}");
    assert!(stderr.contains("seed 3"), "{stderr}");
}

#[test]
fn check_refuses_an_empty_directory_and_seeds_past_the_last() {
    // Both used to pass: "0 scenarios, 0 failures", or "5 seeds" with none run.
    let dir = scratch("empty-check");
    let out = cancelsim(&["check", dir.to_str().unwrap()], &dir);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no scenario files"), "{err}");
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/library/baseline.ron");
    let lib = lib.to_str().unwrap();
    for args in [
        vec!["check", lib, "--swarm", "18446744073709551615"],
        vec![
            "check",
            lib,
            "--swarm",
            "5",
            "--first-seed",
            "18446744073709551614",
        ],
    ] {
        let out = cancelsim(&args, &dir);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("past the last seed"), "{err}");
    }
}

#[test]
fn an_unsorted_trace_is_an_error_naming_its_line_not_a_panic() {
    let dir = scratch("unsorted");
    let rows = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                2023-11-16 18:17:03.0,10,5\n2023-11-16 18:17:05.0,10,5\n\
                2023-11-16 18:17:04.0,10,5\n";
    std::fs::write(dir.join("t.csv"), rows).unwrap();
    let text = r#"Scenario(name: "u", workload: (source: Trace(path: "t.csv", format: AzureCsv)),
        cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous()))"#;
    std::fs::write(dir.join("s.ron"), text).unwrap();
    let out = cancelsim(&["run", "s.ron", "--no-write"], &dir);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("t.csv:4: timestamp earlier than the previous row's"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn profiles_lists_the_planned_capacity_and_refuses_a_bad_share() {
    let dir = scratch("profiles");
    let out = cancelsim(&["profiles"], &dir);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for p in cancelsim_models::gpu::PROFILES {
        assert!(text.contains(p.name), "{} missing from:\n{text}", p.name);
    }
    // vLLM's own log for Llama-3-8B on an H100 at 0.9: 53.29 GiB of KV cache.
    assert!(text.contains("53.29"), "{text}");
    let low = cancelsim(&["profiles", "--gpu-memory-utilization", "0.5"], &dir);
    assert!(!String::from_utf8(low.stdout).unwrap().contains("53.29"));
    assert_one_line_error_of(&cancelsim(
        &["profiles", "--gpu-memory-utilization", "0"],
        &dir,
    ));
    // A scenario whose share leaves no room for the KV cache is refused at load.
    let text = GOOD.replace("profile:", "gpu_memory_utilization: 0.2,\n        profile:");
    assert_one_line_error(
        "no-kv",
        &text,
        &["cluster.gpu_memory_utilization", "no memory"],
    );
}

/// `profiles --check`: the template table against its own profile is exact, against another GPU
/// it is not, and a table of another model's shape, or of none, is refused in one line.
#[test]
fn profiles_check_sets_a_table_beside_a_roofline_and_refuses_another_shape() {
    let dir = scratch("profiles-check");
    let table = dir.join("t.csv");
    let out = cancelsim(&["profiles", "--table", "llama-3.1-8b-h100"], &dir);
    std::fs::write(&table, &out.stdout).unwrap();
    let t = table.to_str().unwrap();
    let check = |against: &str| cancelsim(&["profiles", "--check", t, "--against", against], &dir);
    let same = check("llama-3.1-8b-h100");
    assert!(same.status.success());
    let summary = String::from_utf8_lossy(&same.stderr).to_string();
    assert!(summary.contains("median 0.0 %, max 0.0 %"), "{summary}");
    let rows = String::from_utf8(same.stdout).unwrap();
    assert_eq!(rows.lines().count(), 1 + 5 * 6 * 4, "{rows}");
    let other = String::from_utf8_lossy(&check("llama-3.1-8b-b200").stderr).to_string();
    assert!(!other.contains("max 0.0 %"), "{other}");
    assert_one_line_error_of(&check("llama-2-7b-h100"));
    // The profiler's whole 70B on one GPU is not the TP4 profile's shard.
    let whole = String::from_utf8_lossy(&out.stdout)
        .replace("# model shape llama-3.1-8b", "# model shape llama-3.1-70b");
    std::fs::write(&table, whole).unwrap();
    assert_one_line_error_of(&check("llama-3.1-70b-tp4-h100"));
    let text = String::from_utf8_lossy(&out.stdout).replace("# model shape", "# model");
    std::fs::write(&table, text).unwrap();
    assert_one_line_error_of(&check("llama-3.1-8b-h100"));
    assert_one_line_error_of(&check("no-such-profile"));
}

fn assert_one_line_error_of(out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn a_bad_step_table_is_one_line_naming_its_line_and_column() {
    let dir = scratch("table");
    let table = "prefill_tokens,decode_seqs,kv_tokens,step_ms\n0,1,0,5\n8,1,0,oops\n";
    std::fs::write(dir.join("t.csv"), table).unwrap();
    let text = GOOD.replace(
        "profile: Named(\"llama-3.1-8b-h100\"),",
        "profile: Table(path: \"t.csv\", kv_blocks_16: 100),",
    );
    std::fs::write(dir.join("s.ron"), text).unwrap();
    let out = cancelsim(&["run", "s.ron", "--out", "out"], &dir);
    assert_one_line_error_of(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("t.csv:3:7: field `step_ms`"), "{err}");
    assert!(!dir.join("out").exists(), "wrote output for a bad table");
    // A full grid runs.
    std::fs::write(dir.join("t.csv"), table.replace("oops", "9")).unwrap();
    let ok = cancelsim(&["run", "s.ron", "--no-write"], &dir);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

#[test]
fn no_streak_prints_the_same_report() {
    let dir = scratch("no-streak");
    let storm = GOOD.replace(
        "    cluster:",
        "    cancellation: (fraction: 0.3, stage: Random),\n    cluster:",
    );
    std::fs::write(dir.join("s.ron"), storm).unwrap();
    let fast = cancelsim(&["run", "s.ron", "--no-write"], &dir);
    let slow = cancelsim(&["run", "s.ron", "--no-write", "--no-streak"], &dir);
    assert!(
        fast.status.success(),
        "{}",
        String::from_utf8_lossy(&fast.stderr)
    );
    assert!(
        slow.status.success(),
        "{}",
        String::from_utf8_lossy(&slow.stderr)
    );
    let text = String::from_utf8_lossy(&fast.stdout);
    assert!(text.contains("run_hash="), "{text}");
    assert!(text.contains("requests.cancelled"), "{text}");
    // All but the run hashes: coasting, which needs the streak, dispatches fewer events.
    let answers = |out: &[u8]| -> Vec<String> {
        let text = String::from_utf8_lossy(out);
        let lines = text.lines().filter(|l| !l.starts_with("run_hash"));
        lines.map(str::to_string).collect()
    };
    assert_eq!(answers(&fast.stdout), answers(&slow.stdout));
}
