//! `cancelsim diff` on run directories and sweeps: agreement where the answers are the same,
//! the first request and field where they are not, and no agreement on a missing, empty or
//! corrupt file.

use crate::scratch::Scratch;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The CLI tests' small scenario, with a storm, so that its policy runs differ.
fn tiny() -> String {
    let good = crate::cli::GOOD
        .trim_end()
        .strip_suffix(')')
        .expect("a scenario");
    format!("{good}    cancellation: (fraction: 0.2, stage: Decode),\n)\n")
}

/// (exit code, stdout, stderr) of `cancelsim diff a b`.
fn diff(a: &Path, b: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .arg("diff")
        .args([a, b])
        .output()
        .expect("cancelsim runs");
    let text = |v: Vec<u8>| String::from_utf8(v).unwrap();
    (out.status.code(), text(out.stdout), text(out.stderr))
}

/// Run the tiny scenario into `dir/out`; the run directory.
fn run_into(dir: &Path, out: &str) -> PathBuf {
    std::fs::write(dir.join("s.ron"), tiny()).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args(["run", "s.ron", "--out", out])
        .current_dir(dir)
        .output()
        .expect("cancelsim runs")
        .status;
    assert!(status.success());
    let scenario = dir.join(out).join("tiny");
    let mut runs = std::fs::read_dir(&scenario).unwrap();
    runs.next().unwrap().unwrap().path()
}

/// A run directory `a` and a copy `b` of it, in a scratch directory named `name`.
fn run_and_copy(name: &str) -> (Scratch, PathBuf, PathBuf) {
    let dir = Scratch::new("diff", name, true);
    let a = run_into(&dir, "a");
    let b = dir.join("b");
    copy(&a, &b);
    (dir, a, b)
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Replace line `n` (1-based) of `file` by `f(line)`.
fn edit_line(file: &Path, n: usize, mut f: impl FnMut(&str) -> String) {
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| if i + 1 == n { f(l) } else { l.to_string() })
        .collect();
    std::fs::write(file, lines.join("\n") + "\n").unwrap();
}

#[test]
fn two_runs_of_one_scenario_agree_row_for_row() {
    let dir = Scratch::new("diff", "agree", true);
    let (a, b) = (run_into(&dir, "a"), run_into(&dir, "b"));
    let (code, out, err) = diff(&a, &b);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("requests.csv: the same"), "{out}");
    assert!(out.contains("run hashes: the same"), "{out}");
    // Every request of every run (the counterfactual, the policies, the ideal) was compared.
    let rows = std::fs::read_to_string(a.join("requests.csv"))
        .unwrap()
        .lines()
        .count()
        - 1;
    assert!(rows >= 200 * 2, "{rows} rows");
    assert!(
        out.contains(&format!("the same ({rows} compared)")),
        "{out}"
    );
}

#[test]
fn the_first_differing_request_and_field_are_named() {
    let (_dir, a, b) = run_and_copy("differ");
    let csv = b.join("requests.csv");
    let header = std::fs::read_to_string(&csv)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    let cols: Vec<&str> = header.split(',').collect();
    let id_col = cols.iter().position(|&c| c == "id").unwrap();
    let prompt_col = cols.iter().position(|&c| c == "prompt_tokens").unwrap();
    // Line 31 and line 40 change; the report names line 31, its request and the column.
    let mut id = String::new();
    for n in [31, 40] {
        edit_line(&csv, n, |l| {
            let mut f: Vec<String> = l.split(',').map(str::to_string).collect();
            if n == 31 {
                id = f[id_col].clone();
            }
            f[prompt_col] = "999999".into();
            f.join(",")
        });
    }
    let (code, out, _) = diff(&a, &b);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("requests.csv: 2 of "), "{out}");
    assert!(out.contains("first at line 31 (policy "), "{out}");
    assert!(out.contains(&format!("id {id}), prompt_tokens: ")), "{out}");
    assert!(out.contains("vs 999999 (B)"), "{out}");
    assert!(out.contains("summary.json: the same"), "{out}");
}

#[test]
fn a_summary_field_that_moves_is_named_by_its_path() {
    let (_dir, a, b) = run_and_copy("summary");
    let path = b.join("summary.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let p99 = v["policies"][0]["ttft_ms"]["p99"].as_f64().unwrap();
    v["policies"][0]["ttft_ms"]["p99"] = serde_json::json!(p99 + 0.5);
    // The build's identity and the run hash are left out: changing them changes nothing, and
    // the run hashes are reported apart.
    v["commit"] = serde_json::json!("0000000");
    v["run_hash"] = serde_json::json!("ffff");
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let (code, out, _) = diff(&a, &b);
    assert_eq!(code, Some(1), "{out}");
    let label = v["policies"][0]["policy"].as_str().unwrap();
    assert!(out.contains("summary.json: 1 of "), "{out}");
    assert!(
        out.contains(&format!("first at policies[0]({label}).ttft_ms.p99: ")),
        "{out}"
    );
    assert!(out.contains("vs ffff (B)\n"), "{out}");
}

#[test]
fn a_missing_empty_or_corrupt_file_is_an_error_not_an_agreement() {
    let dir = Scratch::new("diff", "bad", true);
    let a = run_into(&dir, "a");
    type Spoil<'a> = &'a dyn Fn(&Path);
    let cases: [(&str, Spoil); 4] = [
        ("no-requests", &|b| {
            std::fs::remove_file(b.join("requests.csv")).unwrap()
        }),
        ("empty-requests", &|b| {
            std::fs::write(b.join("requests.csv"), "").unwrap()
        }),
        ("corrupt-summary", &|b| {
            std::fs::write(b.join("summary.json"), "{\"a\":").unwrap()
        }),
        ("nothing", &|b| {
            std::fs::remove_file(b.join("summary.json")).unwrap()
        }),
    ];
    for (name, spoil) in cases {
        let b = dir.join(name);
        copy(&a, &b);
        spoil(&b);
        let (code, out, err) = diff(&a, &b);
        assert_eq!(code, Some(2), "{name}: {out}{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
        assert!(err.starts_with("error: "), "{name}: {err}");
        // Both ways round.
        assert_eq!(diff(&b, &a).0, Some(2), "{name}, reversed");
    }
}

#[test]
fn sweeps_compare_by_their_results_leaving_the_run_hashes_out() {
    let dir = Scratch::new("diff", "sweeps", true);
    let header = "task,point,seed,run_policy,report_run_hash,run_hash,completed";
    let results = |hash: &str, completed: u32| {
        format!("{header}\n0,0,1,per_request,{hash},{hash},{completed}\n1,0,2,per_request,{hash},{hash},200\n")
    };
    for (name, hash, completed) in [("a", "aaaa", 200), ("b", "bbbb", 200), ("c", "aaaa", 199)] {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        std::fs::write(dir.join(name).join("results.csv"), results(hash, completed)).unwrap();
    }
    let (code, out, _) = diff(&dir.join("a"), &dir.join("b"));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("run hashes: aaaa (A) vs bbbb (B)"), "{out}");
    let (code, out, _) = diff(&dir.join("a"), &dir.join("c"));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("first at line 2, completed: 200 (A) vs 199 (B)"),
        "{out}"
    );
    // A sweep against a run directory is refused.
    let run = run_into(&dir, "r");
    assert_eq!(diff(&dir.join("a"), &run).0, Some(2));
}

/// Run the library's hand-computed job into `dir/a`; the run directory.
fn run_hand_job(dir: &Path) -> PathBuf {
    let lib = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/library/");
    let text = std::fs::read_to_string(format!("{lib}jobs-hand-computed.ron")).unwrap();
    std::fs::write(dir.join("j.ron"), &text).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args(["run", "j.ron", "--out", "a"])
        .current_dir(dir)
        .output()
        .unwrap()
        .status;
    assert!(status.success());
    let mut runs = std::fs::read_dir(dir.join("a/jobs-hand-computed")).unwrap();
    runs.next().unwrap().unwrap().path()
}

#[test]
fn jobs_csv_holds_each_jobs_status_and_diff_names_its_first_difference() {
    // The hand-computed job (scenarios/library/jobs-hand-computed.ron): its row is the
    // arithmetic of docs/agent-jobs.md, and a run of plain requests has no jobs.csv.
    let dir = Scratch::new("diff", "jobs-csv", true);
    let a = run_hand_job(&dir);
    let csv = std::fs::read_to_string(a.join("jobs.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(
        rows.len(),
        3,
        "a header, the counterfactual's job, the policy's: {csv}"
    );
    let col = |name: &str, row: &str| {
        let at = rows[0].split(',').position(|h| h == name).unwrap();
        row.split(',').nth(at).unwrap().to_string()
    };
    let p = rows.iter().find(|r| r.starts_with("per_request,")).unwrap();
    let want = [
        ("status", "cancelled"),
        ("ended_ms", "1305.0"),
        ("provider_attempts", "2"),
        ("true_input_tokens", "320"),
        ("true_output_tokens", "32"),
        ("observed_input_tokens", "320"),
        ("observed_output_tokens", "30"),
        ("usage_complete", "false"),
        ("effects_completed", "2"),
        ("cleanup_complete", "true"),
        ("cleanup_reason", "run_cancelled"),
        ("cleanup_shortfall", ""),
        ("effects_awaiting_external", "0"),
        ("cleanup_ms", "55.0"),
        ("allowances_used", "2"),
    ];
    for (name, value) in want {
        assert_eq!(col(name, p), value, "{name} in {p}");
    }
    let cf = rows
        .iter()
        .find(|r| r.starts_with("counterfactual,"))
        .unwrap();
    assert_eq!(
        (col("status", cf), col("cleanup_reason", cf)),
        ("completed".into(), String::new())
    );
    // A copy agrees; one changed job field is named, with its job.
    let b = dir.join("b");
    copy(&a, &b);
    assert_eq!(diff(&a, &b).0, Some(0));
    std::fs::write(b.join("jobs.csv"), csv.replace(",1305.0,", ",1306.0,")).unwrap();
    let (code, out, _) = diff(&a, &b);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("jobs.csv") && out.contains("ended_ms"),
        "{out}"
    );
    let (_, plain, _) = run_and_copy("no-jobs-csv");
    assert!(
        !plain.join("jobs.csv").exists(),
        "plain requests wrote a jobs.csv"
    );
}
