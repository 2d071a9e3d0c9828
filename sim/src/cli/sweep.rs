//! `cancelsim sweep`, `merge` and `compare`.

use std::path::{Path, PathBuf};

use cancelsim::sweep::SweepError;

use super::{Fail, Outcome};

fn fail(e: SweepError) -> Fail {
    match e {
        SweepError::Input(m) => Fail::input(m),
        SweepError::Io(m) => Fail::io(m),
    }
}

pub fn sweep(path: &Path, out: &Path, shard: &str, threads: usize) -> Outcome {
    let plan = cancelsim::sweep::Plan::load(path).map_err(Fail::input)?;
    let (i, n) = shard
        .split_once('/')
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
        .ok_or_else(|| Fail::input(format!("--shard {shard}: expected i/n")))?;
    if threads > 0 {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global();
    }
    let start = std::time::Instant::now();
    let (ran, done) = cancelsim::sweep::run(&plan, out, (i, n), true).map_err(fail)?;
    say!(
        "sweep {}: {} points x {} seeds = {} tasks; ran {ran} now, {done} done in {}",
        plan.sweep.name,
        plan.points,
        plan.sweep.seeds,
        plan.tasks(),
        out.display()
    );
    if done == plan.tasks() {
        let table = cancelsim::sweep::summarise(&plan, out).map_err(fail)?;
        say!("mean ± 95 % interval over {} seeds:", plan.sweep.seeds);
        say_part!("{table}");
        let plots = cancelsim::sweep::draw_plots(&plan, out).map_err(fail)?;
        if !plots.is_empty() {
            say!("{} plots in {}", plots.len(), out.join("plots").display());
        }
        say!(
            "wrote {} and {} in {:.1} s",
            out.join("results.csv").display(),
            out.join("summary.csv").display(),
            start.elapsed().as_secs_f64()
        );
    } else {
        say!(
            "{} tasks remain (other shards, or resume)",
            plan.tasks() - done
        );
    }
    Ok(())
}

/// `cancelsim merge`: join the shards' parts into one `results.csv`.
pub fn merge(sweep: &Path, dirs: &[PathBuf], out: &Path) -> Outcome {
    let plan = cancelsim::sweep::Plan::load(sweep).map_err(Fail::input)?;
    cancelsim::sweep::assemble(&plan, dirs, out).map_err(fail)?;
    let table = cancelsim::sweep::summarise(&plan, out).map_err(fail)?;
    cancelsim::sweep::draw_plots(&plan, out).map_err(fail)?;
    say!("mean ± 95 % interval over {} seeds:", plan.sweep.seeds);
    say_part!("{table}");
    say!(
        "wrote {} and {}",
        out.join("results.csv").display(),
        out.join("summary.csv").display()
    );
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompareFormat {
    Table,
    Json,
}

/// `cancelsim compare`: the table (or JSON) on standard output, and the forest plot if asked.
pub fn compare(
    a: &Path,
    b: Option<&Path>,
    policies: Option<&[String]>,
    format: CompareFormat,
    plot: Option<&Path>,
) -> Outcome {
    use cancelsim::sweep::Pairing;
    let pairing =
        match (b, policies) {
            (Some(b), None) => Pairing::Sweeps(a, b),
            (None, Some([pa, pb])) => Pairing::Policies(a, pa, pb),
            (Some(_), Some(_)) => {
                return Err(Fail::input(
                    "compare: give a second sweep or --policies, not both",
                ))
            }
            _ => return Err(Fail::input(
                "compare: give a second sweep (A B), or two policies of sweep A (--policies P Q)",
            )),
        };
    let c = cancelsim::sweep::comparison(pairing).map_err(Fail::input)?;
    if let Some(p) = plot {
        c.forest(p).map_err(Fail::io)?;
    }
    match format {
        CompareFormat::Table => say_part!("{}", c.table()),
        CompareFormat::Json => say!("{}", c.json()),
    }
    Ok(())
}
