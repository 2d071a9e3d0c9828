//! The `cancelsim` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cancelsim::report;
use cancelsim::run::{self, RunOptions};
use cancelsim::scenario::Scenario;
use cancelsim::world;

#[derive(Parser)]
#[command(
    name = "cancelsim",
    version,
    about = "Deterministic simulator of cancellation in batched LLM inference",
    long_about = "Deterministic simulator of cancellation in batched LLM inference.\n\n\
                  With no command, runs the embedded default scenario."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario file (RON) and print its summary.
    Run {
        /// The scenario file. Omit it to run the embedded default.
        scenario: Option<PathBuf>,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Run scenarios and check invariants, properties, expectations, coverage and golden hashes.
    Check {
        /// Scenario files or directories (default: scenarios/library).
        paths: Vec<PathBuf>,
        /// Also run N swarm seeds of every scenario that declares swarm ranges.
        #[arg(long, default_value_t = 0)]
        swarm: u64,
        /// First swarm seed.
        #[arg(long, default_value_t = 1)]
        first_seed: u64,
        /// Worker threads for the swarm (0: all cores). Results do not depend on it.
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Where shrunk reproductions are written.
        #[arg(long, default_value = "output/check")]
        out: PathBuf,
        /// Rewrite the golden run hashes of the checked scenarios.
        #[arg(long)]
        update_golden: bool,
    },
    /// Run a grid of parameters x seeds (SWEEP.ron); resumable, shardable.
    Sweep {
        sweep: PathBuf,
        /// Output directory (parts/, manifest.json, results.csv).
        #[arg(long)]
        out: PathBuf,
        /// Run only slice i of n (1-based), e.g. 2/8, for a job array; `merge` joins them.
        #[arg(long, default_value = "1/1")]
        shard: String,
        /// Worker threads (0: all cores). Results do not depend on it.
        #[arg(long, default_value_t = 0)]
        threads: usize,
    },
    /// Join the parts of a sharded sweep into one results.csv.
    Merge {
        sweep: PathBuf,
        /// The shards' output directories.
        dirs: Vec<PathBuf>,
        #[arg(long)]
        out: PathBuf,
    },
    /// Compare two sweeps (or two run directories), paired by seed, with 95 % intervals.
    Compare { a: PathBuf, b: PathBuf },
    /// Replay a JSON Lines op log through the ownership controller: one JSON result per line.
    Replay {
        /// The op log, or `-` for standard input.
        file: PathBuf,
    },
}

#[derive(clap::Args, Default)]
struct RunOpts {
    /// Override the scenario's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Root directory for run outputs.
    #[arg(long, default_value = "output")]
    out: PathBuf,
    /// Replace an existing run directory.
    #[arg(long)]
    force: bool,
    /// Print the summary only; write no files.
    #[arg(long)]
    no_write: bool,
    /// Write trace.json even for a large run (by default only up to 20,000 requests).
    #[arg(long)]
    trace: bool,
    /// Gauges sampling interval for timeseries.csv, in virtual milliseconds.
    #[arg(long, default_value_t = 100.0)]
    sample_ms: f64,
}

/// Runs up to this many requests get a trace.json by default.
const TRACE_REQUESTS_DEFAULT: u64 = 20_000;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => run(
            None,
            RunOpts {
                out: "output".into(),
                sample_ms: 100.0,
                ..RunOpts::default()
            },
        ),
        Some(Command::Run { scenario, opts }) => run(scenario, opts),
        Some(Command::Replay { file }) => return replay(&file),
        Some(Command::Sweep {
            sweep,
            out,
            shard,
            threads,
        }) => sweep_cmd(&sweep, &out, &shard, threads),
        Some(Command::Merge { sweep, dirs, out }) => {
            cancelsim::sweep::Plan::load(&sweep).and_then(|plan| {
                cancelsim::sweep::assemble(&plan, &dirs, &out)?;
                println!("wrote {}", out.join("results.csv").display());
                Ok(())
            })
        }
        Some(Command::Compare { a, b }) => cancelsim::sweep::compare(&a, &b).map(|t| print!("{t}")),
        Some(Command::Check {
            paths,
            swarm,
            first_seed,
            threads,
            out,
            update_golden,
        }) => {
            return cancelsim::cli_check::main(cancelsim::cli_check::Args {
                paths,
                swarm,
                first_seed,
                threads,
                out,
                update_golden,
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn sweep_cmd(
    path: &std::path::Path,
    out: &std::path::Path,
    shard: &str,
    threads: usize,
) -> Result<(), String> {
    let plan = cancelsim::sweep::Plan::load(path)?;
    let (i, n) = shard
        .split_once('/')
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
        .ok_or_else(|| format!("--shard {shard}: expected i/n"))?;
    if threads > 0 {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global();
    }
    let (ran, done) = cancelsim::sweep::run(&plan, out, (i, n), true)?;
    println!(
        "sweep {}: {} points x {} seeds = {} tasks; ran {ran} now, {done} done in {}",
        plan.sweep.name,
        plan.points,
        plan.sweep.seeds,
        plan.tasks(),
        out.display()
    );
    if done == plan.tasks() {
        println!("wrote {}", out.join("results.csv").display());
    } else {
        println!(
            "{} tasks remain (other shards, or resume)",
            plan.tasks() - done
        );
    }
    Ok(())
}

/// Exit 0 when every line was processed (a rejected op is a result), 2 when the input cannot be
/// read.
fn replay(file: &std::path::Path) -> ExitCode {
    let stdout = std::io::stdout().lock();
    let out = std::io::BufWriter::new(stdout);
    let result = if file.as_os_str() == "-" {
        cancelsim::replay::replay(std::io::stdin().lock(), out)
    } else {
        match std::fs::File::open(file) {
            Ok(f) => cancelsim::replay::replay(std::io::BufReader::new(f), out),
            Err(e) => {
                eprintln!("error: {}: cannot read op log: {e}", file.display());
                return ExitCode::from(2);
            }
        }
    };
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}: {e}", file.display());
            ExitCode::from(2)
        }
    }
}

fn run(path: Option<PathBuf>, opts: RunOpts) -> Result<(), String> {
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
