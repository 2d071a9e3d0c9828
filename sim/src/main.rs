//! The `cancelsim` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

use cli::run::RunOpts;

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
    /// Files that scenarios and sweeps name (traces, base scenarios) must lie under this
    /// directory. Default: the working directory.
    #[arg(long, global = true, default_value = ".")]
    data_root: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario file (RON, or JSON by its `.json` name) and print its summary.
    Run {
        /// The scenario file. Omit it to run the embedded default.
        scenario: Option<PathBuf>,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Run scenarios and check invariants, properties, expectations, coverage and golden hashes.
    Check(cli::check::Args),
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
    /// Compare two sweeps (or two run directories) paired by point, policy and seed, or two
    /// policies of one sweep (--policies) paired by point and seed: B − A with 95 % intervals and
    /// Holm-adjusted p-values.
    Compare {
        a: PathBuf,
        /// The second sweep or run directory (not with --policies).
        b: Option<PathBuf>,
        /// Compare policy B with policy A within sweep A, by their labels (as in run_policy).
        #[arg(long, num_args = 2, value_names = ["POLICY_A", "POLICY_B"])]
        policies: Option<Vec<String>>,
        /// A table for people, or JSON.
        #[arg(long, value_enum, default_value_t = cli::sweep::CompareFormat::Table)]
        format: cli::sweep::CompareFormat,
        /// Also draw a forest plot here (.png, or .svg).
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Per policy, the largest arrival rate (or fewest replicas) that meets an SLO at the
    /// scenario's cancel rate, with confidence over seeds.
    Capacity(cli::capacity::Args),
    /// List the named hardware profiles: KV capacity from the memory planner, and step times.
    Profiles {
        /// Share of each GPU's memory the engine may use, as in scenarios.
        #[arg(long, default_value_t = 0.9)]
        gpu_memory_utilization: f64,
        /// Instead, print a step-time table (the `Table` profile's CSV) sampled from this
        /// profile's roofline: a template to replace with your own measurements.
        #[arg(long, value_name = "PROFILE", conflicts_with_all = ["check", "against"])]
        table: Option<String>,
        /// Instead, set a measured step-time table (a `Table` CSV, as `tools/profile` writes)
        /// beside a profile's roofline, point by point, with the relative error.
        #[arg(long, value_name = "TABLE", requires = "against")]
        check: Option<PathBuf>,
        /// The named profile to check `--check`'s table against.
        #[arg(long, value_name = "PROFILE", requires = "check")]
        against: Option<String>,
    },
    /// Print an input format's JSON Schema: scenario files (RON or JSON) or the op log.
    Schema {
        #[arg(value_enum)]
        which: cli::schema::Which,
    },
    /// Where two run directories (or two sweeps) first differ: `summary.json` field by field,
    /// `requests.csv` and `timeseries.csv` row by row (the build's identity and the run hashes
    /// left out). Exit 0 if they agree, 1 if they differ.
    Diff { a: PathBuf, b: PathBuf },
    /// Replay a JSON Lines op log through the ownership controller: one JSON result per line.
    Replay {
        /// The op log, or `-` for standard input.
        file: PathBuf,
        /// Every op line carries the result it expects in an `expect` field (a result word,
        /// `"error"`, or the whole result object); exit 1 at the first line that differs.
        #[arg(long)]
        expect: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cancelsim::scenario::set_data_root(&cli.data_root) {
        eprintln!("error: {e}");
        return ExitCode::from(cli::Code::Input as u8);
    }
    if cli::stdout_was_closed() {
        eprintln!("error: cannot write to standard output: it is closed");
        return ExitCode::from(cli::Code::Io as u8);
    }
    let outcome = match cli.command {
        None => cli::run::run(
            None,
            RunOpts {
                out: "output".into(),
                sample_ms: 100.0,
                trace_events: cancelsim::record::TRACE_EVENTS_MAX as u64,
                ..RunOpts::default()
            },
        ),
        Some(Command::Run { scenario, opts }) => cli::run::run(scenario, opts),
        Some(Command::Schema { which }) => cli::schema::schema(which),
        Some(Command::Replay { file, expect }) => cli::replay::replay(&file, expect),
        Some(Command::Diff { a, b }) => cli::diff::diff(&a, &b),
        Some(Command::Sweep {
            sweep,
            out,
            shard,
            threads,
        }) => cli::sweep::sweep(&sweep, &out, &shard, threads),
        Some(Command::Merge { sweep, dirs, out }) => cli::sweep::merge(&sweep, &dirs, &out),
        Some(Command::Compare {
            a,
            b,
            policies,
            format,
            plot,
        }) => cli::sweep::compare(
            &a,
            b.as_deref(),
            policies.as_deref(),
            format,
            plot.as_deref(),
        ),
        Some(Command::Check(args)) => cli::check::main(args),
        Some(Command::Capacity(args)) => cli::capacity::main(args),
        Some(Command::Profiles {
            table: Some(name), ..
        }) => cli::profiles::table(&name),
        Some(Command::Profiles {
            check: Some(path),
            against: Some(name),
            ..
        }) => cli::profiles::check(&path, &name),
        Some(Command::Profiles {
            gpu_memory_utilization,
            ..
        }) => cli::profiles::profiles(gpu_memory_utilization),
    };
    cli::exit(outcome)
}
