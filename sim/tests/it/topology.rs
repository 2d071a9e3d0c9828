//! The stage graph in scenario files: validated at load with one-line errors that name the
//! field, drawn as `graph.dot` in every run directory. Only the colocated graph runs so far.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn cancelsim(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cancelsim-topo-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small scenario with `topology` as its cluster's graph.
fn scenario(replicas: u32, topology: &str) -> String {
    format!(
        r#"Scenario(
    name: "topo",
    seed: 2,
    workload: (source: Poisson(rate_per_s: 20.0, requests: 30)),
    cluster: (
        replicas: {replicas},
        profile: Named("llama-3.1-8b-h100"),
        scheduler: Continuous(),
        topology: {topology},
    ),
)
"#
    )
}

const COLOCATED: &str = include_str!("../fixtures/graph-colocated.ron");

const ONE_P_ONE_D: &str = include_str!("../fixtures/graph-1p1d.ron");

/// Run `text`: (exit code, stderr, the scratch directory).
fn run(name: &str, text: &str) -> (Option<i32>, String, PathBuf) {
    let dir = scratch(name);
    std::fs::write(dir.join("s.ron"), text).unwrap();
    let out = cancelsim(&["run", "s.ron", "--out", "out"], &dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        dir,
    )
}

fn refused(name: &str, text: &str, want: &[&str]) {
    let (code, err, dir) = run(name, text);
    assert_eq!(code, Some(2), "{name}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
    for w in want {
        assert!(err.contains(w), "{name}: missing {w:?} in {err}");
    }
    assert!(!dir.join("out").exists(), "{name}: output written");
}

#[test]
fn a_colocated_graph_runs_like_the_default_and_is_drawn() {
    let (code, err, dir) = run("colocated", &scenario(2, COLOCATED));
    assert_eq!(code, Some(0), "{err}");
    let runs: Vec<_> = std::fs::read_dir(dir.join("out/topo")).unwrap().collect();
    let run_dir = runs[0].as_ref().unwrap().path();
    let dot = std::fs::read_to_string(run_dir.join("graph.dot")).unwrap();
    assert!(
        dot.contains("gpus\\nColocated x2") && dot.contains("local"),
        "{dot}"
    );
    // Without a topology the same scenario runs as the implied colocated graph.
    let (code, err, dir) = run("implied", &scenario(2, "None"));
    assert_eq!(code, Some(0), "{err}");
    let runs: Vec<_> = std::fs::read_dir(dir.join("out/topo")).unwrap().collect();
    let dot = std::fs::read_to_string(runs[0].as_ref().unwrap().path().join("graph.dot")).unwrap();
    assert!(dot.contains("serve\\nColocated x2"), "{dot}");
}

#[test]
fn invalid_graphs_get_one_line_naming_the_field() {
    refused(
        "cycle",
        &scenario(
            2,
            &ONE_P_ONE_D.replace(
                "(from: \"decode\", to: \"playback\"),",
                "(from: \"decode\", to: \"playback\"), (from: \"decode\", to: \"prefill\"),",
            ),
        ),
        &["s.ron:", "cluster.topology.links", "cycle through stage"],
    );
    refused(
        "unknown",
        &scenario(
            2,
            &ONE_P_ONE_D.replace("to: \"decode\", latency", "to: \"decoder\", latency"),
        ),
        &[
            "cluster.topology.links[1].to",
            "names no stage (got `decoder`)",
        ],
    );
    refused(
        "bypass",
        &scenario(
            2,
            &ONE_P_ONE_D.replace(
                "(from: \"decode\", to: \"playback\"),",
                "(from: \"decode\", to: \"playback\"), (from: \"prefill\", to: \"playback\"),",
            ),
        ),
        &["without passing a Decode or Colocated stage"],
    );
    refused(
        "no-replicas",
        &scenario(
            2,
            &ONE_P_ONE_D.replace("role: Decode)", "role: Decode, replicas: 0)"),
        ),
        &["cluster.topology.stages[2].replicas", "needs 1 to"],
    );
    refused(
        "bandwidth",
        &scenario(2, &ONE_P_ONE_D.replace("400.0", "-1.0")),
        &["cluster.topology.links[1].bandwidth_gbps"],
    );
    refused(
        "mismatch",
        &scenario(3, COLOCATED),
        &["Colocated stage has 2 replicas", "says 3"],
    );
    refused(
        "typo",
        &scenario(
            2,
            &COLOCATED.replace("to: \"gpus\")", "to: \"gpus\", latncy_ms: 1.0)"),
        ),
        &["s.ron:", "latncy_ms"],
    );
    refused(
        "ignored-latency",
        &scenario(
            2,
            &COLOCATED.replace("to: \"gpus\")", "to: \"gpus\", latency_ms: 0.2)"),
        ),
        &["cluster.topology.links[0]", "links are local"],
    );
}

#[test]
fn a_disaggregated_graph_is_validated_but_refused_to_run_with_a_clear_line() {
    refused(
        "1p1d",
        &scenario(1, ONE_P_ONE_D),
        &["cluster.topology", "not simulated yet"],
    );
}
