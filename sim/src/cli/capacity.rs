//! `cancelsim capacity`: per policy, the largest arrival rate (or the fewest replicas) that meets
//! an SLO at the scenario's cancel rate, with confidence over seeds.

use std::path::PathBuf;

use cancelsim::scenario::Scenario;
use cancelsim::search::{self, Knob, Slo};

use super::{Fail, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// The scenario: its workload, cluster, cancellation and policies.
    pub scenario: PathBuf,
    /// The SLO: TTFT p99 at most this (ms).
    #[arg(long)]
    pub ttft_p99_ms: f64,
    /// The SLO: E2E p99 at most this (ms).
    #[arg(long)]
    pub e2e_p99_ms: f64,
    /// The SLO: sibling survival at least this.
    #[arg(long, default_value_t = 1.0)]
    pub sibling_survival: f64,
    /// Search the arrival rate between these (req/s). Default: the scenario's rate / 16 to × 16.
    #[arg(long, num_args = 2, value_names = ["LOW", "HIGH"])]
    pub rate: Option<Vec<f64>>,
    /// Relative precision of the rate found.
    #[arg(long, default_value_t = 0.02)]
    pub precision: f64,
    /// Search the replica count instead, from 1 up to this.
    #[arg(long, conflicts_with = "rate")]
    pub replicas_max: Option<u32>,
    /// On a prefill/decode graph, the stage whose replicas `--replicas-max` scans (the others
    /// keep theirs), by its name in `cluster.topology.stages`.
    #[arg(long, requires = "replicas_max")]
    pub stage: Option<String>,
    /// Cancel fraction to search at (default: the scenario's).
    #[arg(long)]
    pub cancel_fraction: Option<f64>,
    /// Seeds per candidate (a candidate passes when the 95 % bounds over them do).
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    #[arg(long, default_value_t = 1)]
    pub first_seed: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Draw the search here (.png or .svg).
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

fn knob(args: &Args, s: &Scenario) -> Result<Knob, String> {
    if let Some(max) = args.replicas_max {
        if !(1..=cancelsim::scenario::REPLICAS_MAX).contains(&max) {
            return Err(format!(
                "--replicas-max must be between 1 and {}",
                cancelsim::scenario::REPLICAS_MAX
            ));
        }
        let stage = stage_of(s, args.stage.as_deref())?;
        return Ok(Knob::Replicas { max, stage });
    }
    let (low, high) = match &args.rate {
        Some(v) => (v[0], v[1]),
        None => {
            let r = search::rate_of(s)
                .ok_or("a rate search needs an open-loop source (Poisson, Gamma or OnOff)")?;
            (r / 16.0, r * 16.0)
        }
    };
    if !(low.is_finite() && high.is_finite() && 0.0 < low && low < high) {
        return Err(format!("--rate must be 0 < LOW < HIGH (got {low}, {high})"));
    }
    if !(args.precision > 0.0 && args.precision < 1.0) {
        return Err(format!(
            "--precision must be in (0, 1) (got {})",
            args.precision
        ));
    }
    Ok(Knob::Rate {
        low,
        high,
        precision: args.precision,
    })
}

/// The index of the serving stage a replica scan moves: the one named, or a graph's only one.
fn stage_of(s: &Scenario, name: Option<&str>) -> Result<Option<usize>, String> {
    use cancelsim::scenario::RoleSpec::{Colocated, Decode, Prefill};
    let Some(t) = &s.cluster.topology else {
        return match name {
            Some(n) => Err(format!(
                "--stage {n}: the scenario has no stage graph; --replicas-max alone scans \
                 cluster.replicas"
            )),
            None => Ok(None),
        };
    };
    let serving: Vec<(usize, &str)> = (t.stages.iter().enumerate())
        .filter(|(_, st)| matches!(st.role, Colocated | Prefill | Decode))
        .map(|(i, st)| (i, st.name.as_str()))
        .collect();
    let names = serving
        .iter()
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(", ");
    match name {
        Some(n) => match serving.iter().find(|(_, m)| *m == n) {
            Some((i, _)) => Ok(Some(*i)),
            None => Err(format!(
                "--stage {n}: no serving stage has that name (the serving stages: {names})"
            )),
        },
        None if serving.len() == 1 => Ok(Some(serving[0].0)),
        None => Err(format!(
            "--replicas-max on this graph needs --stage NAME, the stage whose replicas it scans \
             (the serving stages: {names})"
        )),
    }
}

pub fn main(args: Args) -> Outcome {
    let mut s = Scenario::load(&args.scenario).map_err(|e| Fail::input(e.to_string()))?;
    if let Some(f) = args.cancel_fraction {
        let c = s.cancellation.as_mut().ok_or_else(|| {
            Fail::input("--cancel-fraction needs a scenario with a cancellation section")
        })?;
        c.fraction = f;
        c.requests.clear();
    }
    let slo = slo_of(&args)?;
    if args.seeds == 0 || args.seeds > 1000 || args.first_seed.checked_add(args.seeds).is_none() {
        return Err(Fail::input(
            "--seeds must be between 1 and 1000, and end before 2^64",
        ));
    }
    let knob = knob(&args, &s).map_err(Fail::input)?;
    let seeds: Vec<u64> = (args.first_seed..args.first_seed + args.seeds).collect();
    let start = std::time::Instant::now();
    let answers = search::search(&s, knob, &seeds, slo).map_err(Fail::input)?;
    let what = match knob {
        Knob::Rate { .. } => "arrival rate (req/s)",
        Knob::Replicas { .. } => "replicas",
    };
    if let Some(p) = &args.plot {
        cancelsim::output::search_plot::draw(p, &answers, slo, what).map_err(Fail::io)?;
    }
    for a in answers.iter().filter(|a| !a.steady) {
        eprintln!("warning: {}", transient(a));
    }
    if args.json {
        let doc = serde_json::json!({ "scenario": s.name, "knob": what, "slo": slo, "seeds": seeds, "answers": answers });
        say!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serialises")
        );
        return Ok(());
    }
    let fraction = s.cancellation.as_ref().map_or(0.0, |c| c.fraction);
    say!(
        "capacity of {} at cancel fraction {fraction}: TTFT p99 <= {} ms, E2E p99 <= {} ms, sibling survival >= {}",
        s.name, slo.ttft_p99_ms, slo.e2e_p99_ms, slo.sibling_survival_min
    );
    say!(
        "each candidate on seeds {}..={}, judged on the 95 % bounds of the means",
        seeds[0],
        seeds[seeds.len() - 1]
    );
    let best_name = match knob {
        Knob::Rate { .. } => "largest rate (req/s)",
        Knob::Replicas { .. } => "fewest replicas",
    };
    say!("{:<28} {:>38} {:>8}", "policy", best_name, "probes");
    for a in &answers {
        say!(
            "{:<28} {:>38} {:>8}",
            a.policy,
            best_text(a, knob),
            a.probes.len()
        );
    }
    say!("searched in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// The SLO the arguments state, if it makes sense.
fn slo_of(args: &Args) -> Result<Slo, Fail> {
    let slo = Slo {
        ttft_p99_ms: args.ttft_p99_ms,
        e2e_p99_ms: args.e2e_p99_ms,
        sibling_survival_min: args.sibling_survival,
    };
    let finite = [slo.ttft_p99_ms, slo.e2e_p99_ms, slo.sibling_survival_min];
    if finite.iter().any(|x| !x.is_finite() || *x < 0.0) || slo.sibling_survival_min > 1.0 {
        return Err(Fail::input(
            "the SLO needs finite latencies >= 0 and a survival in [0, 1]",
        ));
    }
    Ok(slo)
}

/// A policy's answer as the table prints it: the search's own bounds said as bounds.
fn best_text(a: &search::Answer, knob: Knob) -> String {
    match (knob, a.best) {
        (Knob::Rate { high, .. }, Some(b)) if a.at_ceiling => {
            format!("at least {b:.3} (the search's ceiling, {high})")
        }
        (Knob::Rate { .. }, Some(b)) => format!("{b:.3}"),
        (Knob::Rate { low, .. }, None) => format!("below {low:.3} (the search's floor)"),
        (Knob::Replicas { .. }, Some(b)) => format!("{b:.0}"),
        (Knob::Replicas { max, .. }, None) => format!("more than {max} (the search's ceiling)"),
    }
}

/// Why an answer measured a ramp-up rather than a steady state.
fn transient(a: &search::Answer) -> String {
    let at = a.probes.iter().rev().find(|p| Some(p.value) == a.best);
    let p = at
        .or(a.probes.last())
        .expect("a search probes at least once");
    format!(
        "{}: at {} each run has {:.0} requests and holds about {:.0} at once, fewer than {} times \
         as many: it measures a ramp-up, not a steady state, so the answer rises with the load \
         probed; give the scenario at least {:.0} requests",
        a.policy,
        p.value,
        p.requests_mean,
        p.in_system_mean,
        search::STEADY_TURNOVER_MIN,
        (search::STEADY_TURNOVER_MIN * p.in_system_mean).ceil()
    )
}
