//! `cancelsim run` (and `cancelsim` alone): run a scenario, print its report, write its run
//! directory.

use std::path::PathBuf;

use cancelsim::output as report;
use std::io::IsTerminal;

use cancelsim::record::{Progress, TRACE_EVENTS_MAX};
use cancelsim::run::{self, RunOptions};
use cancelsim::scenario::{Scenario, Source};
use cancelsim::world::RunError;

use super::{Code, Fail, Outcome};

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
    /// Trace events kept per run in trace.json; a run's trace stops at the first step or
    /// request that would pass it, with a warning. 0: no trace.json.
    #[arg(long, default_value_t = TRACE_EVENTS_MAX as u64)]
    pub trace_events: u64,
    /// Gauges sampling interval for timeseries.csv, in virtual milliseconds (at least 0.001).
    #[arg(long, default_value_t = 100.0, value_parser = sample_ms)]
    pub sample_ms: f64,
    /// Every token an output of its step (no replica's streak, so no coasting): the same
    /// report but its run hash (more events), slower. A check of the fast path (`cancelsim
    /// diff` the two run directories).
    #[arg(long)]
    pub no_streak: bool,
}

/// The smallest sampling interval: 1 µs of virtual time.
const SAMPLE_MS_MIN: f64 = 0.001;

fn sample_ms(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if !(SAMPLE_MS_MIN..=1e12).contains(&v) {
        return Err(format!(
            "{v} is out of range: a sampling interval is at least {SAMPLE_MS_MIN} ms and finite"
        ));
    }
    Ok(v)
}

/// A run that stopped: a broken invariant is a failure found, anything else is the input's.
fn run_failed(shown: &str, seed: u64, e: RunError) -> Fail {
    let code = match e {
        RunError::Invariant { .. } => Code::Found,
        RunError::Limit(_) | RunError::Input(_) | RunError::Stalled(_) => Code::Input,
    };
    Fail {
        code,
        msg: format!("scenario {shown} seed {seed}: {e}"),
    }
}

/// Requests one run of `s` issues, if known before it runs (a trace without `rows` is not).
fn requests_per_run(s: &Scenario) -> Option<u64> {
    match &s.workload.source {
        Source::Conversations {
            conversations,
            turns,
            requests_per_turn,
            ..
        } => {
            Some((*conversations as f64 * turns.mean().max(1.0) * *requests_per_turn as f64) as u64)
        }
        Source::Jobs { jobs, job, .. } => Some(jobs.saturating_mul(job.bounds().calls)),
        _ => cancelsim::check::requests(s),
    }
}

/// A progress bar over the report's recorded runs, on a terminal only (not when standard error
/// is piped, nor in CI): requests arrived against those expected, with an ETA.
fn progress_bar(s: &Scenario) -> Option<(indicatif::ProgressBar, Progress)> {
    if !std::io::stderr().is_terminal() || std::env::var_os("CI").is_some() {
        return None;
    }
    let runs = if run::has_intent_sources(s) {
        1 + s.policies.len() as u64
    } else {
        1
    };
    let per_run = requests_per_run(s).unwrap_or(0).max(1);
    let style = indicatif::ProgressStyle::with_template(
        "{bar:30} run {msg} {pos}/{len} requests, {elapsed} elapsed, ETA {eta}",
    )
    .expect("a valid template");
    let bar = indicatif::ProgressBar::new(runs * per_run).with_style(style);
    let b = bar.clone();
    let progress: Progress = std::sync::Arc::new(move |run: u32, arrived: u64| {
        b.set_message(format!("{}/{runs}", run + 1));
        b.set_position(run as u64 * per_run + arrived.min(per_run));
    });
    Some((bar, progress))
}

pub fn run(path: Option<PathBuf>, opts: RunOpts) -> Outcome {
    let start = std::time::Instant::now();
    let scenario = match &path {
        Some(p) => Scenario::load(p).map_err(|e| Fail::input(e.to_string()))?,
        None => Scenario::default_embedded(),
    };
    let bar = progress_bar(&scenario);
    let progress = bar.as_ref().map(|(_, p)| p.clone());
    let outcome = run_with(path, &scenario, opts, progress);
    if let Some((bar, _)) = bar {
        bar.finish_and_clear();
        eprintln!("done in {:.1} s", start.elapsed().as_secs_f64());
    }
    outcome
}

fn run_with(
    path: Option<PathBuf>,
    scenario: &Scenario,
    opts: RunOpts,
    progress: Option<Progress>,
) -> Outcome {
    let seed = opts.seed.unwrap_or(scenario.seed);
    let shown = path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "<embedded default>".into());
    let fail = |e: RunError| run_failed(&shown, seed, e);
    if opts.no_write {
        let run_opts = RunOptions {
            progress,
            no_streak: opts.no_streak,
            ..RunOptions::default()
        };
        let (report, _) = run::run(scenario, seed, run_opts).map_err(fail)?;
        say_part!("{}", report::render(&report));
        return Ok(());
    }
    let dir = report::RunDir::begin(&opts.out, &scenario.name).map_err(Fail::io)?;
    dir.add_file("graph.dot", &scenario.topology().to_dot())
        .map_err(Fail::io)?;
    let mut trace = if opts.trace_events > 0 {
        Some(dir.trace_sink().map_err(Fail::io)?)
    } else {
        None
    };
    let mut sink = dir.requests_sink().map_err(Fail::io)?;
    let run_opts = RunOptions {
        sample_ns: (opts.sample_ms * 1e6).round() as u64,
        sink: Some(sink.as_mut()),
        trace: trace.as_deref_mut(),
        trace_events_max: opts.trace_events,
        progress,
        no_streak: opts.no_streak,
        ..RunOptions::default()
    };
    let (report, extras) = run::run(scenario, seed, run_opts).map_err(fail)?;
    let rendered = report::render(&report);
    let (body, hash_line) = rendered
        .trim_end()
        .rsplit_once('\n')
        .expect("the summary has several lines");
    say!("{body}");
    let sinks = (Some(sink), trace);
    let done = dir
        .finish(&report, extras, sinks, opts.force)
        .map_err(Fail::io)?;
    for w in &done.warnings {
        eprintln!("warning: {w}");
    }
    match &done.written {
        report::Written::New(d) => say!("wrote {}", d.display()),
        report::Written::Replaced(d) => say!("replaced {}", d.display()),
        report::Written::Kept(d) => say!(
            "kept {} (same run_hash already there; --force replaces it)",
            d.display()
        ),
    }
    if !matches!(done.written, report::Written::Kept(_)) {
        for p in &done.plots {
            say!("plot {}", p.display());
        }
    }
    say!("{hash_line}");
    Ok(())
}
