//! `cancelsim sweep`, `merge` and `compare`.

use std::path::Path;

pub fn sweep(
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

/// `cancelsim merge`: join the shards' parts into one `results.csv`.
pub fn merge(sweep: &Path, dirs: &[std::path::PathBuf], out: &Path) -> Result<(), String> {
    let plan = cancelsim::sweep::Plan::load(sweep)?;
    cancelsim::sweep::assemble(&plan, dirs, out)?;
    println!("wrote {}", out.join("results.csv").display());
    Ok(())
}
