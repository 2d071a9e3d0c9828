//! The adversarial findings of `cancelsim capacity`: the search's own bounds, and a
//! prefill/decode graph scanned one stage at a time.

use super::pd_burst;

/// `cancelsim capacity` on a scenario file, in a scratch directory: (exit code, stdout, stderr).
fn capacity(name: &str, scenario: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let dir = crate::scratch::Scratch::new("adversarial", name, true);
    std::fs::write(dir.join("s.ron"), scenario).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args(["capacity", "s.ron"])
        .args(args)
        .current_dir(&*dir)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// 150 requests, 20 % cancelled, on one flat 10 ms step: too few for a steady state at high
/// rates.
const SHORT: &str = r#"Scenario(name: "short", seed: 1,
    workload: (source: Poisson(rate_per_s: 5.0, requests: 150),
        prompt_tokens: Constant(64.0), output_tokens: Constant(50.0)),
    cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 4000), scheduler: Continuous()),
    cancellation: (fraction: 0.2, stage: Decode), policies: [PerRequest])"#;

/// An SLO every rate meets, on two seeds.
const MET_AT_ANY_RATE: [&str; 6] = [
    "--ttft-p99-ms",
    "1e9",
    "--e2e-p99-ms",
    "1e9",
    "--seeds",
    "2",
];

#[test]
fn item_9_capacity_says_when_its_answer_is_the_searchs_own_bound() {
    // An SLO met at every rate: the answer is the ceiling, and says so (it used to print
    // `per_request 100.000`, `"best": 100.0`). An SLO met at none: the floor.
    let slo = MET_AT_ANY_RATE;
    let (code, out, err) = capacity(
        "ceiling",
        SHORT,
        &[&slo[..], &["--rate", "1", "100"]].concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("at least 100.000 (the search's ceiling, 100)"),
        "{out}"
    );
    // 150 requests at 100 req/s: most are in the system at once, a ramp-up, not a steady state.
    assert!(
        err.contains("warning: per_request: at 100") && err.contains("ramp-up"),
        "{err}"
    );
    let json = [&slo[..], &["--rate", "1", "100", "--json"]].concat();
    let (_, out, _) = capacity("ceiling-json", SHORT, &json);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = &doc["answers"][0];
    assert_eq!(
        (&a["at_ceiling"], &a["at_floor"]),
        (&true.into(), &false.into()),
        "{a}"
    );
    assert_eq!(a["steady"], false, "{a}");
    let strict = [
        "--ttft-p99-ms",
        "0.001",
        "--e2e-p99-ms",
        "1e9",
        "--rate",
        "1",
        "100",
        "--json",
    ];
    let (_, out, _) = capacity("floor", SHORT, &strict);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = &doc["answers"][0];
    assert_eq!(
        (&a["best"], &a["at_floor"]),
        (&serde_json::Value::Null, &true.into()),
        "{a}"
    );
    // Long enough (2,000 requests at 5 req/s, about 3 in the system): no warning.
    let long = SHORT.replace("requests: 150", "requests: 2000");
    let (_, _, err) = capacity("steady", &long, &[&slo[..], &["--rate", "1", "5"]].concat());
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn item_10_capacity_scans_one_stage_of_a_prefill_decode_graph() {
    // `--replicas-max` set `cluster.replicas` alone, and every probe failed on the stages'
    // mismatch. Now it scans the named stage, and refuses a graph without one, in one line.
    let pd = pd_burst(
        "",
        "cancellation: (fraction: 0.2, stage: Decode), policies: [PerRequest]",
    )
    .replace("requests: 400", "requests: 60")
    .replace("rate_per_s: 200.0", "rate_per_s: 20.0");
    let slo = MET_AT_ANY_RATE;
    let (code, _, err) = capacity(
        "no-stage",
        &pd,
        &[&slo[..], &["--replicas-max", "3"]].concat(),
    );
    assert_eq!(code, Some(2));
    assert!(
        err.contains("needs --stage NAME") && err.contains("prefill, decode"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    for stage in ["prefill", "decode"] {
        let args = [
            &slo[..],
            &["--replicas-max", "3", "--stage", stage, "--json"],
        ]
        .concat();
        let (code, out, err) = capacity(stage, &pd, &args);
        assert_eq!(code, Some(0), "{stage}: {err}");
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(doc["answers"][0]["best"], 1.0, "{stage}: {out}");
    }
    let args = [&slo[..], &["--replicas-max", "3", "--stage", "router"]].concat();
    let (code, _, err) = capacity("router", &pd, &args);
    assert_eq!(code, Some(2));
    assert!(err.contains("--stage router: no serving stage"), "{err}");
}
