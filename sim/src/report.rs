//! What a run shows and leaves behind: the summary table on stdout and `summary.json` in a run
//! directory, written atomically.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::metrics::Summary;
use crate::world::Report;

/// The human report: one column per policy, beside the counterfactual. Its last line is always
/// `run_hash=<hex>`.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let w = &mut out;
    let cf = &r.counterfactual;
    let _ = writeln!(
        w,
        "scenario {}  seed {}  (scenario_hash {})",
        r.scenario,
        r.seed,
        &r.scenario_hash[..16]
    );
    let _ = writeln!(
        w,
        "{} requests over {:.1} s of virtual time; counterfactual: {} completed, {:.2} req/s, {:.0} output tokens/s, GPU utilisation {:.3}",
        cf.requests.scheduled, cf.virtual_time_s, cf.requests.completed, cf.throughput_rps, cf.output_tokens_per_s, cf.gpu.utilisation
    );
    let cols: Vec<&Summary> = std::iter::once(cf).chain(r.policies.iter()).collect();
    let width = cols
        .iter()
        .map(|s| s.policy.len())
        .max()
        .unwrap_or(10)
        .max(12);
    let row = |w: &mut String, name: &str, f: &dyn Fn(&Summary) -> String| {
        let _ = write!(w, "{name:<34}");
        for s in &cols {
            let _ = write!(w, " {:>width$}", f(s));
        }
        let _ = writeln!(w);
    };
    row(w, "", &|s| s.policy.clone());
    let int = |x: u64| x.to_string();
    let f3 = |x: f64| {
        if x.is_finite() {
            format!("{x:.3}")
        } else {
            "-".into()
        }
    };
    row(w, "requests.completed", &|s| int(s.requests.completed));
    row(w, "requests.cancelled", &|s| int(s.requests.cancelled));
    row(w, "requests.expired", &|s| int(s.requests.expired));
    row(w, "requests.cleanup_pending", &|s| {
        int(s.requests.cleanup_pending)
    });
    row(w, "requests.rejected", &|s| int(s.requests.rejected));
    row(w, "leaked_work.gpu_s", &|s| f3(s.leaked_work.gpu_s));
    row(w, "leaked_work.token_steps", &|s| {
        int(s.leaked_work.token_steps)
    });
    row(w, "  by_cause.in_flight_window", &|s| {
        f3(s.leaked_work.by_cause.in_flight_window)
    });
    row(w, "  by_cause.checkpoint_delay", &|s| {
        f3(s.leaked_work.by_cause.checkpoint_delay)
    });
    row(w, "  by_cause.unobserved_or_lost", &|s| {
        f3(s.leaked_work.by_cause.unobserved_or_lost)
    });
    row(w, "  by_cause.finish_and_discard", &|s| {
        f3(s.leaked_work.by_cause.finish_and_discard)
    });
    row(w, "late_output_discards", &|s| int(s.late_output_discards));
    row(
        w,
        "late_outputs_admitted",
        &|s| int(s.late_outputs_admitted),
    );
    row(w, "sibling_survival", &|s| {
        format!(
            "{}/{}",
            s.sibling_survival.survived, s.sibling_survival.siblings
        )
    });
    row(w, "sibling_survival.rate", &|s| f3(s.sibling_survival.rate));
    row(w, "sibling_latency_delta_ms.ttft_p50", &|s| {
        f3(s.sibling_latency_delta_ms.ttft_p50)
    });
    row(w, "sibling_latency_delta_ms.ttft_p99", &|s| {
        f3(s.sibling_latency_delta_ms.ttft_p99)
    });
    row(w, "sibling_latency_delta_ms.e2e_p99", &|s| {
        f3(s.sibling_latency_delta_ms.e2e_p99)
    });
    row(w, "retained.kv_block_s", &|s| f3(s.retained.kv_block_s));
    row(w, "retained.peak_blocks", &|s| int(s.retained.peak_blocks));
    row(w, "retained.admission_stalls", &|s| {
        int(s.retained.admission_stalls)
    });
    for level in [
        "local_invalidation",
        "cancel_submission",
        "backend_observation",
        "final_callback",
        "resource_release",
    ] {
        row(w, &format!("cleanup_ms.{level}.p99"), &|s| {
            s.cleanup_latency_ms.get(level).map_or("-".into(), |l| {
                if l.count > 0 {
                    f3(l.p99)
                } else {
                    "-".into()
                }
            })
        });
        row(w, &format!("cleanup_ms.{level}.unknown"), &|s| {
            s.cleanup_latency_ms
                .get(level)
                .map_or("-".into(), |l| int(l.unknown))
        });
    }
    row(w, "playback.routing_violations", &|s| {
        int(s.playback.routing_violations)
    });
    row(w, "playback.corrupted_requests", &|s| {
        int(s.playback.corrupted_requests)
    });
    row(w, "ttft_ms.p50", &|s| f3(s.ttft_ms.p50));
    row(w, "ttft_ms.p99", &|s| f3(s.ttft_ms.p99));
    row(w, "tpot_ms.p50", &|s| f3(s.tpot_ms.p50));
    row(w, "e2e_ms.p50", &|s| f3(s.e2e_ms.p50));
    row(w, "e2e_ms.p99", &|s| f3(s.e2e_ms.p99));
    row(w, "gpu.busy_s", &|s| f3(s.gpu.busy_s));
    row(w, "run_hash", &|s| s.run_hash[..12].to_string());
    let _ = writeln!(w, "run_hash={}", r.run_hash);
    out
}

/// Where a run's files go: `<root>/<scenario>/seed<seed>-<run_hash[..12]>/`. The name is derived
/// from the run hash, so an existing directory of that name holds the same run.
pub fn run_dir(root: &Path, s: &Report) -> PathBuf {
    root.join(&s.scenario)
        .join(format!("seed{}-{}", s.seed, &s.run_hash[..12]))
}

/// What `write_run` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    New(PathBuf),
    /// The directory already held this run (same run hash) and `force` was off.
    Kept(PathBuf),
    Replaced(PathBuf),
}

/// Write the run directory atomically: everything goes to a hidden temporary directory next to
/// the target, which is renamed into place at the end. An interrupted write leaves only a
/// `.tmp-*` directory, never a half-written run.
pub fn write_run(root: &Path, s: &Report, force: bool) -> Result<Written, String> {
    let dir = run_dir(root, s);
    let exists = dir.exists();
    if exists && !force {
        return Ok(Written::Kept(dir));
    }
    let parent = dir.parent().expect("run dir has a parent");
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("{}: cannot create: {e}", parent.display()))?;
    let tmp = parent.join(format!(
        ".tmp-{}-{}",
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("run"),
        std::process::id()
    ));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .map_err(|e| format!("{}: cannot clear: {e}", tmp.display()))?;
    }
    std::fs::create_dir(&tmp).map_err(|e| format!("{}: cannot create: {e}", tmp.display()))?;
    let json = serde_json::to_string_pretty(s).expect("summary serialises") + "\n";
    std::fs::write(tmp.join("summary.json"), json)
        .map_err(|e| format!("{}: cannot write: {e}", tmp.join("summary.json").display()))?;
    if exists {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| format!("{}: cannot replace: {e}", dir.display()))?;
    }
    std::fs::rename(&tmp, &dir)
        .map_err(|e| format!("{}: cannot move into place: {e}", dir.display()))?;
    Ok(if exists {
        Written::Replaced(dir)
    } else {
        Written::New(dir)
    })
}
