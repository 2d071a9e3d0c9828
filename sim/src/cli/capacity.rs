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
        return Ok(Knob::Replicas { max });
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

pub fn main(args: Args) -> Outcome {
    let mut s = Scenario::load(&args.scenario).map_err(|e| Fail::input(e.to_string()))?;
    if let Some(f) = args.cancel_fraction {
        let c = s.cancellation.as_mut().ok_or_else(|| {
            Fail::input("--cancel-fraction needs a scenario with a cancellation section")
        })?;
        c.fraction = f;
        c.requests.clear();
    }
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
    say!("{:<28} {:>22} {:>8}", "policy", best_name, "probes");
    for a in &answers {
        let best = a
            .best
            .map_or("none meets the SLO".to_string(), |b| match knob {
                Knob::Rate { .. } => format!("{b:.3}"),
                Knob::Replicas { .. } => format!("{b:.0}"),
            });
        say!("{:<28} {:>22} {:>8}", a.policy, best, a.probes.len());
    }
    say!("searched in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}
