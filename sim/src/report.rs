//! What a run shows and leaves behind: the summary table on stdout and `summary.json` in a run
//! directory, written atomically.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::world::{LatencyMs, Summary};

/// The human summary. Its last line is always `run_hash=<hex>`.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "scenario {}  seed {}  (scenario_hash {})",
        s.scenario,
        s.seed,
        &s.scenario_hash[..16]
    );
    let r = &s.requests;
    let _ = writeln!(
        w,
        "requests: {} scheduled, {} admitted, {} rejected, {} completed in {:.3} s of virtual time ({} events)",
        r.scheduled, r.admitted, r.rejected, r.completed, s.virtual_time_s, s.events
    );
    let _ = writeln!(
        w,
        "throughput {:.2} req/s, {:.0} output tokens/s; GPU utilisation {:.3} over {} steps, {} preemptions",
        s.throughput_rps, s.output_tokens_per_s, s.gpu.utilisation, s.gpu.steps, s.gpu.preemptions
    );
    let _ = writeln!(
        w,
        "{:<8} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "latency", "mean", "±95%", "p50", "p90", "p99", "max"
    );
    let row = |w: &mut String, name: &str, l: &LatencyMs| {
        let _ = writeln!(
            w,
            "{:<8} {:>10.3} {:>9.3} {:>10.3} {:>10.3} {:>10.3} {:>10.3}",
            name, l.mean, l.mean_ci95, l.p50, l.p90, l.p99, l.max
        );
    };
    row(w, "ttft_ms", &s.ttft_ms);
    row(w, "tpot_ms", &s.tpot_ms);
    row(w, "e2e_ms", &s.e2e_ms);
    let g = &s.gpu;
    let _ = writeln!(
        w,
        "gpu: {:.3} s busy, {:.3} s to completed requests, {:.3} s discarded ({} tokens), {:.3} s padding; {} token-steps",
        g.busy_s, g.gpu_s_completed, g.gpu_s_discarded, g.tokens_discarded, g.gpu_s_padding, g.token_steps
    );
    let _ = writeln!(
        w,
        "kv: {:.1} block-s held, peak {} blocks on one replica",
        s.kv.block_s, s.kv.peak_blocks
    );
    let wl = &s.workload;
    if wl.conversations > 0 || wl.deadlines_missed > 0 || wl.disconnects > 0 {
        let _ = writeln!(
            w,
            "workload: {} conversations, {} turns, {} interruptions ({} requests superseded), {} deadlines missed, {} disconnects",
            wl.conversations, wl.turns, wl.interruptions, wl.superseded_requests, wl.deadlines_missed, wl.disconnects
        );
    }
    let l = &s.littles_law;
    let _ = writeln!(
        w,
        "little's law: L = {:.4} (time average), lambda*W = {:.4}, gap {:.2e}",
        l.mean_in_system,
        l.lambda_per_s * l.mean_e2e_s,
        l.relative_gap
    );
    let _ = writeln!(w, "run_hash={}", s.run_hash);
    out
}

/// Where a run's files go: `<root>/<scenario>/seed<seed>-<run_hash[..12]>/`. The name is derived
/// from the run hash, so an existing directory of that name holds the same run.
pub fn run_dir(root: &Path, s: &Summary) -> PathBuf {
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
pub fn write_run(root: &Path, s: &Summary, force: bool) -> Result<Written, String> {
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
