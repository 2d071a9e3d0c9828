//! Sweeps: killed with SIGKILL halfway and resumed, or split into shards and merged, they give a
//! results.csv byte-identical to one uninterrupted run.

use crate::scratch::Scratch;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn sweep_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/sweeps/grid-200x5.ron")
}

fn scratch(name: &str) -> Scratch {
    Scratch::new("sweep", name, false)
}

/// The binary on `args`, with every path allowed (the sweeps live in the repository).
fn invoke(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args(args)
        .args(["--data-root", "/"])
        .env("CI", "1")
        .output()
        .unwrap()
}

fn cancelsim(args: &[&str]) -> std::process::Output {
    let out = invoke(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn results(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("results.csv")).unwrap()
}

fn uninterrupted(tag: &str) -> Vec<u8> {
    let dir = scratch(&format!("full-{tag}"));
    cancelsim(&[
        "sweep",
        sweep_file().to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    let r = results(&dir);
    assert_eq!(
        r.iter().filter(|&&b| b == b'\n').count(),
        1001,
        "a header and 1,000 rows"
    );
    r
}

#[test]
fn a_sweep_killed_halfway_resumes_to_the_same_csv() {
    let full = uninterrupted("killed");
    let dir = scratch("killed");
    let parts = dir.join("parts");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args([
            "sweep",
            sweep_file().to_str().unwrap(),
            "--out",
            dir.to_str().unwrap(),
            "--threads",
            "2",
            "--data-root",
            "/",
        ])
        .env("CI", "1")
        .spawn()
        .unwrap();
    // Kill it with SIGKILL once part of the work is on disk.
    let start = Instant::now();
    loop {
        let n = std::fs::read_dir(&parts).map(|d| d.count()).unwrap_or(0);
        if n >= 300 || start.elapsed() > Duration::from_secs(120) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let done = std::fs::read_dir(&parts)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "csv")
        })
        .count();
    assert!(
        done < 1000,
        "the sweep finished before it was killed ({done} parts); the test needs it halfway"
    );
    assert!(!dir.join("results.csv").exists());
    // Resume: only the missing tasks run.
    let out = cancelsim(&[
        "sweep",
        sweep_file().to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(&format!("ran {} now", 1000 - done)), "{text}");
    assert_eq!(
        results(&dir),
        full,
        "resumed results differ from an uninterrupted run"
    );
}

#[test]
fn shards_merge_to_the_unsharded_csv() {
    let full = uninterrupted("shards");
    let dirs: Vec<Scratch> = (1..=3).map(|i| scratch(&format!("shard{i}"))).collect();
    for (i, d) in dirs.iter().enumerate() {
        let shard = format!("{}/3", i + 1);
        cancelsim(&[
            "sweep",
            sweep_file().to_str().unwrap(),
            "--out",
            d.to_str().unwrap(),
            "--shard",
            &shard,
            "--threads",
            "1",
        ]);
        assert!(
            !d.join("results.csv").exists(),
            "a shard alone is not the whole sweep"
        );
    }
    let merged = scratch("merged");
    let mut args = vec![
        "merge".to_string(),
        sweep_file().to_str().unwrap().to_string(),
    ];
    args.extend(dirs.iter().map(|d| d.to_str().unwrap().to_string()));
    args.extend(["--out".to_string(), merged.to_str().unwrap().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cancelsim(&args);
    assert_eq!(results(&merged), full);
}

#[test]
fn compare_pairs_by_seed_and_reports_intervals() {
    let dir = scratch("cmp");
    cancelsim(&[
        "sweep",
        sweep_file().to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    // A sweep against itself: every difference is exactly 0, so none is significant.
    let out = cancelsim(&["compare", dir.to_str().unwrap(), dir.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("leaked_gpu_s"), "{text}");
    assert!(!text.lines().skip(1).any(|l| l.ends_with(" yes")), "{text}");
}

/// A small sweep next to the library's base scenario, with its own first seed.
fn small_sweep(dir: &Path, first_seed: u64) -> PathBuf {
    let base = sweep_file().parent().unwrap().join("tiny-storm.ron");
    let text = format!(
        "Sweep(name: \"small\", scenario: {:?}, first_seed: {first_seed}, seeds: 2, grid: [Fraction([0.1, 0.3])])",
        base.to_str().unwrap()
    );
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("small-{first_seed}.ron"));
    std::fs::write(&path, text).unwrap();
    path
}

fn refused(args: &[&str], want: &str) {
    let out = invoke(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
}

#[test]
fn merge_refuses_foreign_planted_and_overlapping_shards() {
    let root = scratch("foreign");
    let (ours, theirs) = (small_sweep(&root, 1), small_sweep(&root, 100));
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    let (a, b, c) = (root.join("a"), root.join("b"), root.join("c"));
    cancelsim(&["sweep", &s(&ours), "--out", &s(&a), "--shard", "1/2"]);
    cancelsim(&["sweep", &s(&theirs), "--out", &s(&b), "--shard", "2/2"]);
    let merged = s(&root.join("m"));
    // Shard 2/2 of another sweep (another first_seed) does not complete shard 1/2 of ours.
    refused(
        &["merge", &s(&ours), &s(&a), &s(&b), "--out", &merged],
        "belongs to another sweep",
    );
    // A directory of part files without a manifest is not a sweep's.
    std::fs::create_dir_all(c.join("parts")).unwrap();
    std::fs::copy(b.join("parts/00000001.csv"), c.join("parts/00000001.csv")).unwrap();
    std::fs::copy(b.join("parts/00000003.csv"), c.join("parts/00000003.csv")).unwrap();
    refused(
        &["merge", &s(&ours), &s(&a), &s(&c), "--out", &merged],
        "cannot read the sweep manifest",
    );
    refused(
        &["sweep", &s(&ours), "--out", &s(&c)],
        "has part files but no manifest.json",
    );
    // The same shard twice is not two disjoint shards.
    refused(
        &["merge", &s(&ours), &s(&a), &s(&a), "--out", &merged],
        "a part in two shards",
    );
    // A part with the right name and another task's rows.
    let d = root.join("d");
    cancelsim(&["sweep", &s(&ours), "--out", &s(&d), "--shard", "2/2"]);
    std::fs::copy(d.join("parts/00000001.csv"), d.join("parts/00000003.csv")).unwrap();
    refused(
        &["merge", &s(&ours), &s(&a), &s(&d), "--out", &merged],
        "is not a row of task 3",
    );
    assert!(!root.join("m").exists(), "nothing merged");
}

/// The sweep ends with its answer: `summary.csv` holds, per point and policy, the mean and 95 %
/// half-width over seeds that a reader gets from `results.csv` alone, and the printed table
/// shows the headline metrics.
#[test]
fn a_sweep_summarises_each_point_and_policy_over_its_seeds() {
    let dir = scratch("summary");
    let file = small_sweep(&dir, 1);
    let out_dir = dir.join("out");
    let out = cancelsim(&[
        "sweep",
        file.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("mean ± 95 % interval over 2 seeds"), "{text}");
    assert!(
        text.contains("leaked GPU-s") && text.contains("cf TTFT p99"),
        "{text}"
    );
    // The plots: each metric against the numeric axis, written with the results.
    for metric in [
        "leaked_gpu_s",
        "sibling_survival_rate",
        "ttft_p99_ms",
        "e2e_p99_ms",
    ] {
        let png = out_dir.join(format!("plots/{metric}_vs_fraction.png"));
        let big = std::fs::metadata(&png).is_ok_and(|m| m.len() > 1000);
        assert!(big, "{}", png.display());
    }
    // Recompute one cell from results.csv: leaked_gpu_s of the first point's first policy.
    let mut r = csv::Reader::from_path(out_dir.join("results.csv")).unwrap();
    let h = r.headers().unwrap().clone();
    let at = |name: &str| h.iter().position(|x| x == name).unwrap();
    let rows: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
    let first_policy = rows[0][at("run_policy")].to_string();
    let xs: Vec<f64> = rows
        .iter()
        .filter(|row| &row[1] == "0" && row[at("run_policy")] == first_policy)
        .map(|row| row[at("leaked_gpu_s")].parse().unwrap())
        .collect();
    assert_eq!(xs.len(), 2);
    let mean = (xs[0] + xs[1]) / 2.0;
    // Two seeds: t(1) = 12.706, s = |x0 - x1| / sqrt 2, half-width t s / sqrt 2.
    let half = 12.706 * (xs[0] - xs[1]).abs() / 2.0;
    let mut s = csv::Reader::from_path(out_dir.join("summary.csv")).unwrap();
    let sh = s.headers().unwrap().clone();
    let sat = |name: &str| sh.iter().position(|x| x == name).unwrap();
    let first = s.records().next().unwrap().unwrap();
    assert_eq!(&first[sat("run_policy")], first_policy.as_str());
    assert_eq!(&first[sat("seeds")], "2");
    let got_mean: f64 = first[sat("leaked_gpu_s_mean")].parse().unwrap();
    let got_half: f64 = first[sat("leaked_gpu_s_ci95")].parse().unwrap();
    assert!(
        (got_mean - mean).abs() < 1e-9 * mean.abs().max(1.0),
        "{got_mean} vs {mean}"
    );
    assert!(
        (got_half - half).abs() < 1e-9 * half.max(1.0),
        "{got_half} vs {half}"
    );
}

/// Two policies of one sweep, paired by point and seed: the JSON's mean differences are those
/// a reader computes from results.csv, Holm never lowers a p-value, and the forest plot is
/// written. Two sweeps on other seeds say what pairing needs instead of "no rows pair up".
#[test]
fn compare_pairs_two_policies_within_one_sweep_with_holm() {
    let dir = scratch("within");
    let base = sweep_file().parent().unwrap().join("tiny-storm.ron");
    let text = format!(
        "Sweep(name: \"within\", scenario: {:?}, seeds: 3, \
         grid: [Fraction([0.1, 0.3]), Policy([FinishAndDiscard, PerRequest])])",
        base.to_str().unwrap()
    );
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("within.ron");
    std::fs::write(&file, text).unwrap();
    let out_dir = dir.join("out");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    cancelsim(&["sweep", &s(&file), "--out", &s(&out_dir)]);
    let plot = dir.join("forest.png");
    let args = [
        "compare",
        &s(&out_dir),
        "--policies",
        "finish_and_discard",
        "per_request",
    ];
    let json = cancelsim(&[&args[..], &["--format", "json", "--plot", &s(&plot)]].concat());
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let tests = v["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 2 * 7, "two fractions, seven metrics");
    for t in tests {
        let (p, holm) = (t["p"].as_f64().unwrap(), t["p_holm"].as_f64().unwrap());
        assert!((0.0..=1.0).contains(&p) && holm >= p - 1e-15, "{t}");
    }
    assert!(std::fs::metadata(&plot).unwrap().len() > 1000);
    // Recompute leaked_gpu_s at fraction 0.1 from the rows.
    let mut r = csv::Reader::from_path(out_dir.join("results.csv")).unwrap();
    let h = r.headers().unwrap().clone();
    let at = |n: &str| h.iter().position(|x| x == n).unwrap();
    let rows: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
    let leaked = |policy: &str, seed: &str| -> f64 {
        let row = rows.iter().find(|x| {
            &x[at("fraction")] == "0.1" && &x[at("run_policy")] == policy && &x[at("seed")] == seed
        });
        row.unwrap()[at("leaked_gpu_s")].parse().unwrap()
    };
    let mean = ["1", "2", "3"]
        .iter()
        .map(|seed| leaked("per_request", seed) - leaked("finish_and_discard", seed))
        .sum::<f64>()
        / 3.0;
    let t = tests
        .iter()
        .find(|t| t["group"] == "fraction=0.1" && t["metric"] == "leaked_gpu_s")
        .unwrap();
    assert!(
        (t["mean"].as_f64().unwrap() - mean).abs() < 1e-9,
        "{t} vs {mean}"
    );
    // The table fits 100 columns.
    let table = String::from_utf8(cancelsim(&args).stdout).unwrap();
    assert!(table.lines().all(|l| l.chars().count() <= 100), "{table}");
    // Sweeps on other seeds: what pairing needs.
    let (a, b) = (small_sweep(&dir, 1), small_sweep(&dir, 100));
    let (da, db) = (dir.join("a"), dir.join("b"));
    cancelsim(&["sweep", &s(&a), "--out", &s(&da)]);
    cancelsim(&["sweep", &s(&b), "--out", &s(&db)]);
    refused(
        &["compare", &s(&da), &s(&db)],
        "A has seeds 1–2 and B has 100–101",
    );
}

/// The Slurm example of `docs/sweeps.md` is the script `.ci/run` submits to a real Slurm
/// (`tools/slurm-smoke.sh`), word for word.
#[test]
fn the_readme_slurm_example_is_the_smoke_tested_script() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("docs/sweeps.md")).unwrap();
    let script = std::fs::read_to_string(root.join("tools/slurm-sweep.sbatch")).unwrap();
    assert!(
        readme.contains(&format!("```sh\n{script}```")),
        "docs/sweeps.md and tools/slurm-sweep.sbatch differ"
    );
    let smoke = std::fs::read_to_string(root.join("tools/slurm-smoke.sh")).unwrap();
    assert!(smoke.contains("tools/slurm-sweep.sbatch"));
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(ci.contains("tools/slurm-smoke.sh"));
}

/// The `AttentionShare` axis sets `cluster.roofline.mfu_attn_pct` and nothing else: the shipped
/// `attention-kernel` sweep's tasks are the base scenario with that share stated, and a share
/// left unset on the base stays the fitted one in its other fields.
#[test]
fn the_attention_share_axis_states_the_share() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/sweeps/attention-kernel.ron");
    let plan = cancelsim::sweep::Plan::load(&path).unwrap();
    assert_eq!(plan.tasks(), 20);
    for t in 0..plan.tasks() {
        let (s, values, _) = plan.task(t);
        let pct: u64 = values[0].parse().unwrap();
        assert!([37, 75].contains(&pct), "{values:?}");
        let shares = s.cluster.roofline.expect("the axis states a share");
        assert_eq!(shares.mfu_attn_pct, Some(pct));
        assert_eq!(
            (shares.mfu_pct, shares.mbu_pct, shares.mbu_kv_pct),
            (None, None, None)
        );
        let mut base = s.clone();
        base.cluster.roofline = None;
        base.policies = plan.base.policies.clone();
        base.properties = plan.base.properties.clone();
        base.expect = plan.base.expect.clone();
        assert_eq!(
            base, plan.base,
            "task {t} differs from its base beyond the axes"
        );
    }
}

/// A share outside 1..=100 %, a fractional one, and the axis on a base scenario without a named
/// roofline are each refused at load, before any task runs.
#[test]
fn a_bad_attention_share_axis_is_refused() {
    let dir = scratch("bad-share");
    std::fs::create_dir_all(&dir).unwrap();
    let scenarios = sweep_file()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    for (name, base, values, want) in [
        (
            "zero",
            "default.ron",
            "[37, 0]",
            "must be a whole percentage from 1 to 100 (got 0)",
        ),
        (
            "frac",
            "default.ron",
            "[37, 37.5]",
            "a list item must be a whole number (got 37.5)",
        ),
        (
            "linear",
            "md1-rho08.ron",
            "[37]",
            "needs a named profile on the Roofline step model",
        ),
    ] {
        let path = dir.join(format!("{name}.ron"));
        let base = scenarios.join(base);
        let text = format!(
            "Sweep(name: \"s\", scenario: {:?}, seeds: 1, grid: [AttentionShare({values})])",
            base.to_str().unwrap()
        );
        std::fs::write(&path, text).unwrap();
        let out = dir.join(format!("out-{name}"));
        refused(
            &[
                "sweep",
                path.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
            want,
        );
        assert!(!out.exists(), "{name}: wrote output");
    }
}
