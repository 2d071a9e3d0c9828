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
