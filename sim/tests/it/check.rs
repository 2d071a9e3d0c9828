//! `cancelsim check`: the library passes, the swarm is the same whatever the thread count, and
//! deliberately broken variants are caught and shrunk to small reproductions.

use std::path::Path;

use cancelsim::check;
use cancelsim::run;
use cancelsim::scenario::Scenario;
use cancelsim::world::Hooks;
use cancelsim_models::ownership::ControllerBug;

fn library(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/library")
        .join(name);
    Scenario::load(&path).unwrap()
}

#[test]
fn the_whole_library_passes() {
    for path in crate::library::files() {
        let s = Scenario::load(&path).unwrap();
        if let Err(f) = check::check_one(&s, s.seed, true) {
            panic!("{}: {f:?}", path.display());
        }
    }
}

#[test]
fn swarm_results_do_not_depend_on_the_thread_count() {
    let s = library("storm-continuous.ron");
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| check::swarm(&s, 1, 24))
    };
    let one = run(1);
    let four = run(4);
    assert_eq!(one, four);
    assert_eq!(one.len(), 24);
    assert!(one.iter().all(|r| r.failures.is_empty()), "{one:?}");
    // And the seeds really differ: the swarm drew different parameters.
    let hashes: std::collections::BTreeSet<_> = one.iter().map(|r| r.run_hash.clone()).collect();
    assert_eq!(hashes.len(), 24);
}

/// Swarm a broken variant, expect it caught, shrink the first failure, and return the shrunk
/// scenario (which must still fail).
fn caught_and_shrunk(s: &Scenario, hooks: Hooks) -> Scenario {
    let broken = move |s: &Scenario, seed: u64| run::report_with(s, seed, hooks);
    let results = check::swarm_with(&broken, s, 1, 40);
    let failed: Vec<_> = results.iter().filter(|r| !r.failures.is_empty()).collect();
    assert!(!failed.is_empty(), "the swarm missed the broken variant");
    let seed = failed[0].seed;
    let variant = check::randomise(s, seed);
    let fails = |c: &Scenario| check::check_with(&broken, c, seed, false).is_err();
    let small = check::shrink(&variant, seed, 300, &fails);
    assert!(fails(&small), "the shrunk scenario must still fail");
    // The correct controller and adapter pass the same shrunk scenario: it isolates the bug.
    assert!(check::check_one(&small, seed, false).is_ok());
    // And it round-trips through RON as a file the user can re-run.
    let text = check::to_ron(&small);
    let again = Scenario::parse(&text, "<shrunk>").unwrap();
    assert!(fails(&again), "the written reproduction fails when re-run");
    small
}

#[test]
fn a_broken_controller_is_caught_and_shrunk_to_three_requests_or_fewer() {
    // The bug: admission trusts the state it saw before the writer wait.
    let hooks = Hooks {
        controller_bug: Some(ControllerBug::TerminalCheckedBeforeWait),
        ..Hooks::default()
    };
    let small = caught_and_shrunk(&library("storm-continuous.ron"), hooks);
    let n = check::requests(&small).unwrap();
    assert!(n <= 3, "shrunk to {n} requests");
    assert_eq!(small.policies.len(), 1);
}

#[test]
fn a_broken_adapter_is_caught_and_shrunk_to_three_requests_or_fewer() {
    // The bug: "per-request" cancel through the engine's handle, killing the whole batch.
    let hooks = Hooks {
        adapter_aborts_batch: true,
        ..Hooks::default()
    };
    let small = caught_and_shrunk(&library("storm-continuous.ron"), hooks);
    let n = check::requests(&small).unwrap();
    assert!(n <= 3, "shrunk to {n} requests");
    let targets = small.cancellation.as_ref().unwrap().requests.len();
    assert!(
        targets >= 1 && targets < n as usize,
        "a target and at least one sibling: {targets} of {n}"
    );
}

#[test]
fn undeclared_coverage_and_broken_expectations_fail_the_check() {
    // A scenario that declares a path it cannot reach fails; so does a violated expectation.
    let mut s = library("s02-mid-decode-w1.ron");
    s.coverage.push("playback.blocked".into());
    let f = check::check_one(&s, s.seed, true).unwrap_err();
    assert!(f.iter().any(|m| m.contains("playback.blocked")), "{f:?}");
    let mut s = library("s02-mid-decode-w1.ron");
    s.expect[0].leaked_gpu_s_max = Some(0.0);
    let f = check::check_one(&s, s.seed, true).unwrap_err();
    assert!(f.iter().any(|m| m.contains("leaked")), "{f:?}");
}
