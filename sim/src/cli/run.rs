//! `cancelsim run` (and `cancelsim` alone): run a scenario, print its report, write its run
//! directory.

use std::path::PathBuf;

use cancelsim::output as report;
use cancelsim::run::{self, RunOptions};
use cancelsim::scenario::Scenario;
use cancelsim::world;

#[derive(clap::Args, Default)]
pub struct RunOpts {
    /// Override the scenario's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Root directory for run outputs.
    #[arg(long, default_value = "output")]
    pub out: PathBuf,
    /// Replace an existing run directory.
    #[arg(long)]
    pub force: bool,
    /// Print the summary only; write no files.
    #[arg(long)]
    pub no_write: bool,
    /// Write trace.json even for a large run (by default only up to 20,000 requests).
    #[arg(long)]
    pub trace: bool,
    /// Gauges sampling interval for timeseries.csv, in virtual milliseconds.
    #[arg(long, default_value_t = 100.0)]
    pub sample_ms: f64,
}

/// Runs up to this many requests get a trace.json by default.
const TRACE_REQUESTS_DEFAULT: u64 = 20_000;

pub fn run(path: Option<PathBuf>, opts: RunOpts) -> Result<(), String> {
    let scenario = match &path {
        Some(p) => Scenario::load(p).map_err(|e| e.to_string())?,
        None => Scenario::default_embedded(),
    };
    let seed = opts.seed.unwrap_or(scenario.seed);
    let shown = path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "<embedded default>".into());
    let fail = |e: world::RunError| format!("scenario {shown} seed {seed}: {e}");
    if opts.no_write {
        let report = run::report(&scenario, seed).map_err(fail)?;
        print!("{}", report::render(&report));
        return Ok(());
    }
    // A trace of a small run opens in ui.perfetto.dev; a huge one would not, so it is opt-in.
    let requests = cancelsim::check::requests(&scenario).unwrap_or(u64::MAX);
    let trace = opts.trace || requests <= TRACE_REQUESTS_DEFAULT;
    let dir = report::RunDir::begin(&opts.out, &scenario.name)?;
    let sink = dir.requests_sink()?;
    let sample_ns = (opts.sample_ms * 1e6).round() as u64;
    let force = opts.force;
    let opts = RunOptions {
        sample_ns,
        sink: Some(sink),
        trace,
        ..RunOptions::default()
    };
    let (report, extras) = run::run(&scenario, seed, opts).map_err(fail)?;
    let rendered = report::render(&report);
    let (body, hash_line) = rendered
        .trim_end()
        .rsplit_once('\n')
        .expect("the summary has several lines");
    println!("{body}");
    let (written, plots) = dir.finish(&report, extras, force)?;
    match &written {
        report::Written::New(d) => println!("wrote {}", d.display()),
        report::Written::Replaced(d) => println!("replaced {}", d.display()),
        report::Written::Kept(d) => println!(
            "kept {} (same run_hash already there; --force replaces it)",
            d.display()
        ),
    }
    if !matches!(written, report::Written::Kept(_)) {
        for p in &plots {
            println!("plot {}", p.display());
        }
    }
    println!("{hash_line}");
    Ok(())
}
