//! Whether a run's summaries mean something: every number finite and in its range, rates in
//! [0, 1], Little's law's two measurements agreeing. The fuzzer holds every drawn world to it.

/// What a summary must never say, whatever the scenario: a NaN or a negative where that means
/// nothing, a rate outside [0, 1], or Little's law broken. Returns the problems.
pub fn nonsense(p: &crate::metrics::Summary) -> Vec<String> {
    let mut out = Vec::new();
    let v = serde_json::to_value(p).expect("a summary serialises");
    walk(&v, &mut String::new(), &mut out);
    for (name, rate) in [
        ("sibling_survival.rate", p.sibling_survival.rate),
        ("gpu.utilisation", p.gpu.utilisation),
    ] {
        if !(0.0..=1.0 + 1e-9).contains(&rate) {
            out.push(format!("{}: {name} = {rate} is not in [0, 1]", p.policy));
        }
    }
    if p.requests.scheduled > 0 && p.littles_law.relative_gap > 1e-6 {
        let gap = p.littles_law.relative_gap;
        out.push(format!("{}: Little's law gap {gap}", p.policy));
    }
    out.iter_mut().for_each(|m| {
        if !m.starts_with(&p.policy) {
            *m = format!("{}: {m}", p.policy);
        }
    });
    out
}

/// Every number finite and non-negative, but the signed differences; a null (a NaN) only for
/// a mean's interval with too few batches.
fn walk(v: &serde_json::Value, path: &mut String, out: &mut Vec<String>) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                walk(x, path, out);
                path.truncate(len);
            }
        }
        Value::Array(xs) => xs.iter().for_each(|x| walk(x, path, out)),
        Value::Null if !path.ends_with("mean_ci95") => out.push(format!("{path} is NaN")),
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            // Differences between two runs are signed: sibling deltas against the
            // counterfactual, and the capacity cost against the ideal (a group abort that kills
            // siblings can spend less GPU time than the ideal, and two runs diverge).
            let signed =
                path.starts_with("sibling_latency_delta_ms") || path.starts_with("capacity_cost");
            if !x.is_finite() || (x < 0.0 && !signed) {
                out.push(format!("{path} = {x}"));
            }
        }
        _ => {}
    }
}

/// What a report must never say of its own scenario, beyond each summary's sense:
/// - every pool drained: the blocks allocated equal the blocks freed, in every run;
/// - blocks never returned, and requests left cleanup pending, only where the scenario lets a
///   hold wait for good: a `Never` reclaim on that side, with a notice that can fail to come (a
///   lossy link, or on the prefill side no notice from the router);
/// - the ideal cancel leaves nothing behind: no request stranded between the stages, no receive
///   blocks held for an aborted transfer, no wedge.
///
/// Returns the problems, each naming its run.
pub fn unfounded(s: &crate::scenario::Scenario, r: &crate::run::Report) -> Vec<String> {
    let mut out = Vec::new();
    let runs = std::iter::once(&r.counterfactual)
        .chain(&r.policies)
        .chain(r.ideal.as_ref());
    let may_wait = waits_for_good(s);
    for p in runs {
        let kv = &p.kv;
        if kv.allocated_blocks != kv.freed_blocks {
            let (a, f) = (kv.allocated_blocks, kv.freed_blocks);
            out.push(format!("{}: {a} KV blocks allocated, {f} freed", p.policy));
        }
        let handoff = p.handoff.unwrap_or_default();
        for (side, stats, allowed) in [
            ("prefill", handoff.prefill, may_wait.0),
            ("decode", handoff.decode, may_wait.1),
        ] {
            if stats.blocks_never_returned > 0 && !allowed {
                let n = stats.blocks_never_returned;
                out.push(format!(
                    "{}: {n} {side} blocks never returned, though every {side} hold gets a \
                     notice or a lease",
                    p.policy
                ));
            }
        }
        if p.requests.cleanup_pending > 0 && !(may_wait.0 || may_wait.1) {
            let n = p.requests.cleanup_pending;
            out.push(format!(
                "{}: {n} requests cleanup pending, though every release is confirmed",
                p.policy
            ));
        }
    }
    if let Some(i) = &r.ideal {
        let h = i.handoff.unwrap_or_default();
        let left = [
            ("requests stranded between the stages", h.stranded as f64),
            (
                "receive block-seconds held for aborted transfers",
                h.decode.retained_block_s,
            ),
            ("wedges", h.wedges as f64),
        ];
        for (what, n) in left.into_iter().filter(|&(_, n)| n > 0.0) {
            out.push(format!("ideal: left {n} {what} behind"));
        }
    }
    out
}

/// Whether a hold on the prefill side, and on the decode side, may wait for good.
pub(super) fn waits_for_good(s: &crate::scenario::Scenario) -> (bool, bool) {
    use crate::scenario::ReclaimSpec;
    let Some(t) = &s.cluster.topology else {
        return (false, false);
    };
    let h = &t.handoff;
    let lossy = t.links.iter().any(|l| l.loss > 0.0);
    // Without the router's notice, a request stranded in the gap leaves its prefill hold with
    // none to wait for (as does a transfer stopped on the wire, or one with no notice at all).
    let unnotified = !h.notify_prefill;
    (
        h.prefill_reclaim == ReclaimSpec::Never && (lossy || unnotified),
        h.decode_reclaim == ReclaimSpec::Never && lossy,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    /// A 1P1D world with a lossless link, the router's notice and leases on both sides: no hold
    /// can wait for good, so the checks below hold it to the strictest reading.
    const PD: &str = r#"Scenario(name: "pd", seed: 1,
        workload: (source: Poisson(rate_per_s: 50.0, requests: 40),
            prompt_tokens: Constant(256.0), output_tokens: Constant(16.0)),
        cluster: (replicas: 2, profile: Named("llama-3.1-8b-h100"), scheduler: Continuous(),
            topology: Some((
                stages: [(name: "router", role: Router), (name: "prefill", role: Prefill),
                    (name: "decode", role: Decode), (name: "playback", role: Playback)],
                links: [(from: "router", to: "prefill"),
                    (from: "prefill", to: "decode", latency_ms: 1.0, bandwidth_gbps: 25.0),
                    (from: "decode", to: "playback")],
                handoff: (notify_prefill: true,
                    decode_reclaim: Lease(lease_ms: 1000.0, grace_ms: 0.0))))),
        cancellation: (fraction: 0.5, stage: Random), policies: [PerRequest])"#;

    #[test]
    fn a_report_that_breaks_its_own_books_is_caught() {
        let s = Scenario::parse(PD, "pd.ron").unwrap();
        let r = crate::run::report(&s, 1).unwrap();
        assert_eq!(unfounded(&s, &r), Vec::<String>::new());
        let mut leak = r.clone();
        leak.policies[0].kv.freed_blocks -= 1;
        assert!(unfounded(&s, &leak)[0].contains("allocated"), "pools drain");
        let mut held = r.clone();
        held.counterfactual.requests.cleanup_pending = 2;
        let h = held.policies[0].handoff.as_mut().unwrap();
        h.prefill.blocks_never_returned = 16;
        let found = unfounded(&s, &held);
        assert_eq!(found.len(), 2, "{found:?}");
        let mut ideal = r.clone();
        ideal
            .ideal
            .as_mut()
            .unwrap()
            .handoff
            .as_mut()
            .unwrap()
            .stranded = 1;
        assert!(unfounded(&s, &ideal)[0].starts_with("ideal: left 1 requests stranded"));
        // With `Never` and a lossy link, a hold may wait for good: then it is no finding.
        let mut lossy = s.clone();
        let t = lossy.cluster.topology.as_mut().unwrap();
        t.links[1].loss = 0.1;
        t.handoff.prefill_reclaim = crate::scenario::ReclaimSpec::Never;
        assert_eq!(unfounded(&lossy, &held).len(), 0);
    }
}
