//! The `cancelsim check` command: the I/O around `check`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cancelsim::check::{self, fuzz, fuzz::Tier};
use cancelsim::run;
use cancelsim::scenario::Scenario;

use super::cases::{Cases, Format};
use super::{Code, Fail, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// Scenario files or directories (default: scenarios/library).
    pub paths: Vec<PathBuf>,
    /// Also run N swarm seeds of every scenario that declares swarm ranges.
    #[arg(long, default_value_t = 0)]
    pub swarm: u64,
    /// First swarm seed.
    #[arg(long, default_value_t = 1)]
    pub first_seed: u64,
    /// Worker threads for the swarm (0: all cores). Results do not depend on it.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Where shrunk reproductions are written.
    #[arg(long, default_value = "output/check")]
    pub out: PathBuf,
    /// Rewrite the golden run hashes of the checked scenarios.
    #[arg(long)]
    pub update_golden: bool,
    /// Skip the golden run hashes (for scenario files that have none, such as shrunk
    /// reproductions).
    #[arg(long, conflicts_with = "update_golden")]
    pub no_golden: bool,
    /// Also run N whole scenarios drawn by the fuzzer (small worlds, every field at its edges).
    #[arg(long, default_value_t = 0)]
    pub fuzz: u64,
    /// Also run N big worlds drawn by the fuzzer (5,000-50,000 requests, overload, tight KV).
    #[arg(long, default_value_t = 0)]
    pub big: u64,
    /// Stop starting new big-world seeds after this many seconds (0: no budget). The small
    /// tier always runs all its seeds.
    #[arg(long, default_value_t = 0.0)]
    pub budget_s: f64,
    /// How to report: lines for people, or one JUnit XML or JSON document on standard output
    /// (the lines then go to standard error).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

pub const COMMIT: &str = env!("CANCELSIM_COMMIT");
const GOLDEN: &str = "golden.txt";
/// Failing swarm seeds shrunk per scenario, at most.
const SHRINK_MAX: usize = 3;

fn scenario_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut here: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "ron" || x == "json"))
                .collect();
            here.sort();
            files.extend(here);
        } else {
            files.push(p.clone());
        }
    }
    Ok(files)
}

/// One directory's `golden.txt`: `name seed run_hash` per line, next to the scenarios. What
/// cannot be read as such is kept as errors, which fail the check: a corrupt, empty or missing
/// golden file never passes.
struct Golden {
    entries: BTreeMap<String, (u64, String)>,
    errors: Vec<String>,
}

fn golden_line(line: &str) -> Option<(String, (u64, String))> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let [name, seed, hash] = w.as_slice() else {
        return None;
    };
    let hex = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then_some(())?;
    Some((name.to_string(), (seed.parse().ok()?, hash.to_string())))
}

fn read_golden(path: &Path) -> Golden {
    let mut g = Golden {
        entries: BTreeMap::new(),
        errors: Vec::new(),
    };
    let text = match cancelsim::input::read_text(path, cancelsim::input::CONFIG_BYTES_MAX) {
        Ok(t) => t,
        Err(e) => {
            g.errors.push(format!(
                "{}: cannot read ({e}); record the hashes with --update-golden, or pass --no-golden",
                path.display()
            ));
            return g;
        }
    };
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() || l.starts_with('#') {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        match golden_line(l) {
            None => g.errors.push(format!(
                "{at}: expected `scenario-file seed run_hash` (64 hex digits)"
            )),
            Some((name, _)) if g.entries.contains_key(&name) => {
                g.errors.push(format!("{at}: a second line for {name}"));
            }
            Some((name, v)) => {
                g.entries.insert(name, v);
            }
        }
    }
    g
}

fn write_golden(path: &Path, golden: &BTreeMap<String, (u64, String)>) -> Result<(), String> {
    debug_assert!(golden.values().all(|(_, h)| h.len() == 64));
    let mut text = String::from("# Golden run hashes: scenario file, seed, run_hash. Update with\n# `cancelsim check --update-golden`, in a commit of its own that says why the model changed.\n");
    for (name, (seed, hash)) in golden {
        text += &format!("{name} {seed} {hash}\n");
    }
    let tmp = path.with_extension("txt.tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

fn fail_line(path: &Path, seed: u64, what: &str) -> String {
    format!(
        "FAIL {} seed {seed}: {what} | reproduce: cancelsim run {} --seed {seed} (commit {COMMIT})",
        path.display(),
        path.display()
    )
}

/// The golden hashes of every scenario directory checked, by directory.
type Goldens = BTreeMap<PathBuf, Golden>;

/// The golden file of `dir`, read on first use; its errors are failures, reported once.
fn golden_of<'g>(
    goldens: &'g mut Goldens,
    dir: &Path,
    update: bool,
    cases: &mut Cases,
) -> (&'g mut Golden, usize) {
    let mut failures = 0;
    let golden = goldens.entry(dir.to_path_buf()).or_insert_with(|| {
        let g = read_golden(&dir.join(GOLDEN));
        if !update {
            for e in &g.errors {
                cases.line(&format!("FAIL {e}"));
            }
            failures = g.errors.len();
            let name = dir.join(GOLDEN).display().to_string();
            cases.case("golden", name, 0.0, g.errors.clone());
        }
        g
    });
    (golden, failures)
}

/// The golden comparison of one checked run: a missing line, another seed or another hash fails.
fn golden_verdict(g: &Golden, name: &str, seed: u64, run_hash: &str) -> Option<String> {
    match g.entries.get(name) {
        None => Some(format!(
            "no golden run hash in {GOLDEN} (record it with --update-golden)"
        )),
        Some((s, _)) if *s != seed => Some(format!(
            "{GOLDEN} records seed {s}, but the scenario's seed is {seed}"
        )),
        Some((_, hash)) if hash != run_hash => {
            Some(format!("golden run hash {hash} changed to {run_hash}"))
        }
        Some(_) => None,
    }
}

/// Check one scenario file as written: judge it, and compare (or record) its golden hash.
/// Returns its failures.
fn check_file(
    file: &Path,
    scenario: &Scenario,
    goldens: &mut Goldens,
    args: &Args,
    cases: &mut Cases,
) -> usize {
    let start = Instant::now();
    let mut found = Vec::new();
    let failures = judge_file(file, scenario, goldens, args, cases, &mut found);
    let secs = start.elapsed().as_secs_f64();
    cases.case("scenario", file.display().to_string(), secs, found);
    failures
}

/// `check_file`'s verdicts, each failure's line kept in `found`.
fn judge_file(
    file: &Path,
    scenario: &Scenario,
    goldens: &mut Goldens,
    args: &Args,
    cases: &mut Cases,
    found: &mut Vec<String>,
) -> usize {
    let dir = file.parent().unwrap_or(Path::new(".")).to_path_buf();
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("?")
        .to_string();
    let seed = scenario.seed;
    let report = match check::check_one(scenario, seed, true) {
        Ok(r) => r,
        Err(fs) => {
            for f in &fs {
                let line = fail_line(file, seed, f);
                cases.line(&line);
                found.push(line);
            }
            return 1;
        }
    };
    let mut failures = 0;
    if !args.no_golden {
        let (golden, read_failures) = golden_of(goldens, &dir, args.update_golden, cases);
        failures += read_failures;
        if args.update_golden {
            golden.entries.insert(name, (seed, report.run_hash.clone()));
        } else if let Some(what) = golden_verdict(golden, &name, seed, &report.run_hash) {
            let line = fail_line(file, seed, &what);
            cases.line(&line);
            found.push(line);
            failures += 1;
        }
    }
    if failures == 0 {
        let short = &report.run_hash[..16];
        cases.line(&format!(
            "ok   {} seed {seed} run_hash={short}",
            file.display()
        ));
    }
    failures
}

/// Golden lines that name no scenario file in their directory: stale, so they fail (and
/// `--update-golden` drops them).
fn stale_goldens(goldens: &mut Goldens, update: bool, cases: &mut Cases) -> usize {
    let mut failures = 0;
    for (dir, g) in goldens.iter_mut() {
        let stale: Vec<String> = g
            .entries
            .keys()
            .filter(|n| !dir.join(n).is_file())
            .cloned()
            .collect();
        for name in stale {
            if update {
                g.entries.remove(&name);
            } else {
                let file = dir.join(GOLDEN).display().to_string();
                let what = format!("{file}: names {name}, which is not in {}", dir.display());
                cases.line(&format!("FAIL {what}"));
                cases.case("golden", format!("{file} ({name})"), 0.0, vec![what]);
                failures += 1;
            }
        }
    }
    failures
}

/// The swarm of one scenario: failing seeds reported, the first few shrunk and written out.
/// Returns its failures.
fn swarm_file(file: &Path, scenario: &Scenario, args: &Args, cases: &mut Cases) -> usize {
    let start = Instant::now();
    let results = check::swarm(scenario, args.first_seed, args.swarm);
    let failed: Vec<_> = results.iter().filter(|r| !r.failures.is_empty()).collect();
    let mut lines = Vec::new();
    for r in &failed {
        let what = format!("swarm: {}", r.failures.join("; "));
        lines.push(fail_line(file, r.seed, &what));
        cases.line(lines.last().expect("just pushed"));
    }
    let name = format!("{} ({} seeds)", file.display(), args.swarm);
    cases.case("swarm", name, start.elapsed().as_secs_f64(), lines);
    for r in failed.iter().take(SHRINK_MAX) {
        let variant = check::randomise(scenario, r.seed);
        let fails = |s: &Scenario| check::check_one(s, r.seed, false).is_err();
        let small = check::shrink(&variant, r.seed, 200, &fails);
        let out = args
            .out
            .join(format!("{}-seed{}.ron", scenario.name, r.seed));
        let written = std::fs::create_dir_all(&args.out)
            .and_then(|_| std::fs::write(&out, check::to_ron(&small)));
        match written {
            Ok(()) => cases.line(&format!(
                "     shrunk to {} requests: {}",
                check::requests(&small).map_or("?".into(), |n| n.to_string()),
                out.display()
            )),
            Err(e) => cases.line(&format!("     could not write {}: {e}", out.display())),
        }
    }
    failed.len()
}

/// The fuzzer's seeds of one tier: failures reported, the first few shrunk and written out.
/// Returns (seeds run, failures).
fn fuzz_tier(tier: Tier, n: u64, args: &Args, cases: &mut Cases) -> (u64, usize) {
    let start = Instant::now();
    let budget = tier == Tier::Big && args.budget_s > 0.0;
    let until = budget.then(|| start + Duration::from_secs_f64(args.budget_s));
    let runner = &run::report;
    let base = PathBuf::from("scenarios");
    let results = fuzz::fuzz_with(runner, tier, (args.first_seed, n), &base, until);
    let name = format!("fuzz-{tier:?}").to_lowercase();
    let failed: Vec<_> = results.iter().filter(|r| !r.failures.is_empty()).collect();
    let mut lines = Vec::new();
    for r in &failed {
        let what = r.failures.join("; ");
        let flag = if tier == Tier::Big { "big" } else { "fuzz" };
        lines.push(format!(
            "FAIL {name} seed {}: {what} | reproduce: cancelsim check --{flag} 1 --first-seed {} (commit {COMMIT})",
            r.seed, r.seed
        ));
        cases.line(lines.last().expect("just pushed"));
    }
    for r in failed.iter().take(SHRINK_MAX) {
        let drawn = fuzz::scenario(r.seed, tier, base.clone());
        let fails = |s: &Scenario| fuzz::check_drawn(runner, s).is_err();
        let small = check::shrink(&drawn, r.seed, 200, &fails);
        let out = args.out.join(format!("{name}-seed{}.ron", r.seed));
        let written = std::fs::create_dir_all(&args.out)
            .and_then(|_| std::fs::write(&out, check::to_ron(&small)));
        match written {
            Ok(()) => cases.line(&format!("     shrunk to {}", out.display())),
            Err(e) => cases.line(&format!("     could not write {}: {e}", out.display())),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    cases.line(&format!(
        "{name}: {} seeds in {secs:.1} s, {} failed",
        results.len(),
        failed.len()
    ));
    cases.case(
        "fuzz",
        format!("{name} ({} seeds)", results.len()),
        secs,
        lines,
    );
    (results.len() as u64, failed.len())
}

/// The scenario files to check, or why there is nothing to do: no scenario in the paths, or
/// seeds past the last one.
fn inputs(args: &Args) -> Result<Vec<PathBuf>, String> {
    let paths = if args.paths.is_empty() {
        vec![PathBuf::from("scenarios/library")]
    } else {
        args.paths.clone()
    };
    let files = scenario_files(&paths)?;
    if files.is_empty() {
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(format!("no scenario files (*.ron) in {}", shown.join(", ")));
    }
    let seeds = args.swarm.max(args.fuzz).max(args.big);
    if args.first_seed.checked_add(seeds).is_none() {
        let (first, n) = (args.first_seed, seeds);
        return Err(format!(
            "--first-seed {first} plus {n} seeds is past the last seed (2^64 - 1)"
        ));
    }
    Ok(files)
}

pub fn main(args: Args) -> Outcome {
    let files = inputs(&args).map_err(Fail::input)?;
    if args.threads > 0 {
        // The global pool is set once per process; results never depend on its size.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(args.threads)
            .build_global();
    }
    let mut failures = 0usize;
    let mut cases = Cases::new(args.format);
    let mut goldens = Goldens::new();
    let (mut swarm_seeds, mut swarm_s) = (0u64, 0f64);
    for file in &files {
        let scenario = match Scenario::load(file) {
            Ok(s) => s,
            Err(e) => {
                cases.line(&format!("FAIL {e}"));
                let name = file.display().to_string();
                cases.case("scenario", name, 0.0, vec![e.to_string()]);
                failures += 1;
                continue;
            }
        };
        failures += check_file(file, &scenario, &mut goldens, &args, &mut cases);
        if args.swarm > 0 && scenario.swarm.is_some() {
            let start = Instant::now();
            failures += swarm_file(file, &scenario, &args, &mut cases);
            swarm_s += start.elapsed().as_secs_f64();
            swarm_seeds += args.swarm;
        }
    }
    if args.fuzz > 0 {
        failures += fuzz_tier(Tier::Small, args.fuzz, &args, &mut cases).1;
        // A quarter as many worlds of durable agent jobs, their own tier.
        failures += fuzz_tier(Tier::Jobs, args.fuzz.div_ceil(4), &args, &mut cases).1;
    }
    if args.big > 0 {
        failures += fuzz_tier(Tier::Big, args.big, &args, &mut cases).1;
    }
    failures += stale_goldens(&mut goldens, args.update_golden, &mut cases);
    if args.update_golden {
        for (dir, g) in &goldens {
            write_golden(&dir.join(GOLDEN), &g.entries).map_err(Fail::io)?;
        }
    }
    let mut summary = format!("check: {} scenarios, {failures} failures", files.len());
    if swarm_seeds > 0 {
        let rate = swarm_seeds as f64 / swarm_s.max(1e-9);
        summary += &format!("; swarm: {swarm_seeds} seeds in {swarm_s:.1} s ({rate:.0} seeds/s)");
    }
    cases.line(&format!("{summary} (commit {COMMIT})"));
    if let Some(doc) = cases.document(COMMIT) {
        say_part!("{doc}");
    }
    if failures > 0 {
        return Err(Fail {
            code: Code::Found,
            msg: format!("check found {failures} failures"),
        });
    }
    Ok(())
}
