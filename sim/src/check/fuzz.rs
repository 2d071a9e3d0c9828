//! The whole-scenario fuzzer: every field of the schema drawn per seed, within and at the edges
//! of its valid range, and two tiers of size. `Small` worlds are many and quick; `Big` worlds are
//! the swarm's second tier: thousands of requests, overload, conversations with every intent
//! source, tight KV pools at every window, reused ids, both release modes.
//!
//! A drawn scenario always validates (a test holds the generator to it), so every failure is the
//! simulator's: a limit hit, an invariant broken, or a summary that means nothing.

use std::path::PathBuf;

use rayon::prelude::*;

use super::draw::Draw;
use super::sense::{nonsense, unfounded};
use super::{Runner, SeedResult};
use crate::dist::Dist;
use crate::kernel::rng::{Purpose, Stream};
use crate::run::Report;
use crate::scenario::*;
use crate::world::RunError;

/// How big the drawn worlds are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Up to a few hundred requests: every field, every edge.
    Small = 1,
    /// 5,000 to 50,000 requests, offered up to 3x capacity.
    Big = 2,
    /// A small world whose source is durable agent jobs (`fuzz_jobs.rs`).
    Jobs = 3,
}

/// The scenario of fuzz seed `seed` in tier `tier`. `base_dir` is where trace paths resolve.
pub fn scenario(seed: u64, tier: Tier, base_dir: PathBuf) -> Scenario {
    let mut d = Draw {
        s: Stream::new(seed, Purpose::Fuzz, tier as u64),
    };
    let mut s = Scenario::parse(DEFAULT_SCENARIO, DEFAULT_SCENARIO_PATH)
        .expect("the embedded default scenario is valid");
    s.name = format!("fuzz-{}-{seed}", format!("{tier:?}").to_lowercase());
    s.description = format!("Drawn by `cancelsim check --fuzz`, seed {seed}.");
    s.seed = seed;
    s.base_dir = base_dir;
    s.limits = LimitsConfig {
        max_events: 100_000_000,
        max_time_s: 1e7,
        max_queue_len: 10_000_000,
        max_in_system: IN_SYSTEM_MAX_DEFAULT,
    };
    s.workload = workload(&mut d, tier);
    s.cluster = cluster(&mut d, tier);
    // A prefill rate at its low edge (1 token/s) with real prompts is days of virtual time per
    // request: a legitimately long run, not a finding. Keep such prompts short.
    let slow = s
        .cluster
        .profile
        .custom()
        .is_some_and(|c| c.prefill_tokens_per_s > 0.0 && c.prefill_tokens_per_s < 100.0);
    if slow {
        s.workload.prompt_tokens = Dist::Constant(d.int(1, 8) as f64);
    }
    s.cancellation = d.chance(0.8).then(|| cancellation(&mut d));
    s.policies = policies(&mut d);
    s.adapter = adapter(&mut d);
    s.backend = backend(&mut d);
    s.playback = playback(&mut d);
    // Drawn last, so that the draws above are those of a colocated world.
    if d.chance(0.3) {
        disaggregate(&mut d, &mut s);
    }
    if d.chance(0.3) {
        let some = d.real(0.0, 1.0);
        s.workload.length_capped = d.pick(&[1.0, some]);
    }
    if d.chance(0.3) {
        let some = d.real(0.0, 1.0);
        s.workload.stop_strings = Some(StopStrings {
            probability: d.pick(&[1.0, some]),
            detect_ms: d.dist(5.0, 1.0),
        });
    }
    if tier == Tier::Jobs {
        let requests = super::swarm::requests(&s).unwrap_or(100);
        let rate = d.scale(0.1, 200.0);
        s.workload.source = super::fuzz_jobs::source(&mut d, requests, rate);
    }
    super::fuzz_router::pools(&mut s, tier);
    super::fuzz_router::beside(&mut s, tier);
    super::fuzz_router::shared_prefixes(&mut s, tier);
    super::fuzz_router::conditional(&mut s, tier);
    super::fuzz_router::kv_router(&mut s, tier);
    s.expect.clear();
    s.coverage.clear();
    s.properties = Properties::default();
    s.swarm = None;
    s
}

fn workload(d: &mut Draw, tier: Tier) -> Workload {
    let big = tier == Tier::Big;
    let requests = if big {
        d.int(5_000, 50_000)
    } else {
        d.int(1, 300)
    };
    // Long outputs cost a step each: heavy tails only in small worlds, and then few requests.
    let sigma_max = if big { 1.5 } else { 10.0 };
    let (prompt_tokens, output_tokens) = (d.dist(600.0, sigma_max), d.dist(120.0, sigma_max));
    let heavy = [&prompt_tokens, &output_tokens].iter().any(|x| match x {
        Dist::LogNormal { sigma, .. } => *sigma > 2.0,
        Dist::Gamma { cv, .. } => *cv > 3.0,
        _ => false,
    });
    let requests = if heavy { requests.min(8) } else { requests };
    let mut source = source(d, requests, big);
    // Heavy tails in conversations: turns wait for their slowest request, one after another.
    // Two turns of one request each keep a run within days of virtual time.
    if let (
        true,
        Source::Conversations {
            turns,
            requests_per_turn,
            ..
        },
    ) = (heavy, &mut source)
    {
        *turns = Dist::Constant(2.0);
        *requests_per_turn = 1;
    }
    Workload {
        source,
        prompt_tokens,
        output_tokens,
        // A deadline far past the run's end is an edge too: its timer must not keep the run alive.
        deadline_ms: d.chance(0.3).then(|| {
            let near = d.dist(5_000.0, 1.0);
            d.pick(&[near, Dist::Constant(7e8)])
        }),
        disconnect_ms: d.chance(0.2).then(|| d.dist(10_000.0, 1.0)),
        // Drawn at the end of `scenario`, after every older draw.
        length_capped: 0.0,
        stop_strings: None,
    }
}

fn source(d: &mut Draw, requests: u64, big: bool) -> Source {
    // Big worlds are offered up to 3x what one 8B/H100 replica serves (~40 req/s).
    let rate = if big {
        d.scale(5.0, 120.0)
    } else {
        d.scale(0.01, 10_000.0)
    };
    match d.s.below(if big { 3 } else { 4 }) {
        0 if d.chance(0.3) => Source::Gamma {
            rate_per_s: rate,
            cv: d.real(0.0, 4.0),
            requests,
        },
        0 => Source::Poisson {
            rate_per_s: rate,
            requests,
        },
        1 => {
            // About `requests` requests in all: conversations x turns (about 4) x per turn.
            let per_turn = d.int(1, if big { 4 } else { 64 }) as u32;
            Source::Conversations {
                conversations: (requests / (4 * per_turn as u64)).max(1),
                start_rate_per_s: rate / (4.0 * per_turn as f64),
                turns: d.dist(4.0, 1.0),
                think_ms: d.dist(500.0, 1.0),
                requests_per_turn: per_turn,
                barge_in: d.chance(0.6).then(|| BargeIn {
                    probability: d.real(0.0, 1.0),
                    after_ms: d.dist(200.0, 1.0),
                }),
                history: d.chance(0.5),
            }
        }
        2 => Source::OnOff {
            rate_on_per_s: rate,
            rate_off_per_s: d.real(0.0, rate / 4.0),
            // At least one arrival per on period on average: rarer ones make runs of years of
            // virtual time (about `requests` periods of `off_ms` each).
            on_ms: Dist::Exponential {
                mean: d.scale(1.0, 5_000.0).max(1e3 / rate),
            },
            off_ms: d.dist(1_000.0, 1.0),
            requests,
        },
        _ => Source::Trace {
            path: d
                .pick(&[
                    "traces/azure_llm_2023_conv.csv",
                    "traces/azure_llm_2023_code.csv",
                ])
                .to_string(),
            format: TraceFormat::AzureCsv,
            speedup: d.scale(0.5, 200.0),
            first_row: d.int(0, 5_000),
            rows: Some(requests),
            sample_fraction: d.real(1e-3, 1.0),
            max_total_tokens: d.chance(0.3).then(|| d.int(2, 8192) as u32),
        },
    }
}

fn cluster(d: &mut Draw, tier: Tier) -> Cluster {
    let big = tier == Tier::Big;
    let profile = if d.chance(0.7) {
        let names = cancelsim_models::gpu::PROFILES.map(|p| p.name);
        ProfileRef::Named(d.pick(&names).to_string())
    } else {
        ProfileRef::Custom {
            c0_ms: d.scale(1e-3, 50.0),
            prefill_tokens_per_s: {
                let any = d.scale(1.0, 1e5);
                // 0 (free) and 1 are the edges; below 1 but above 0 is refused at load. Big
                // worlds at 1 token/s would run for years of virtual time.
                if big {
                    d.scale(1_000.0, 1e5)
                } else {
                    d.pick(&[0.0, 1.0, 1.4, any])
                }
            },
            per_seq_us: d.real(0.0, 100.0),
            per_kv_token_ns: d.real(0.0, 500.0),
            kv_blocks_16: d.int(1, 30_000),
        }
    };
    // Tight pools are the point: a few blocks up to the profile's.
    let kv_blocks = d
        .chance(0.6)
        .then(|| d.int(1, if big { 4_000 } else { 600 }));
    let block_tokens = d.pick(&[1, 8, 16, 16, 32]);
    let scheduler = if d.chance(0.75) {
        Scheduler::Continuous {
            max_num_seqs: d.chance(0.7).then(|| d.int(1, 512) as u32),
            // One token per step is an edge for small worlds; a big world would take 10^8 steps.
            max_num_batched_tokens: d
                .chance(0.7)
                .then(|| d.int(if big { 512 } else { 1 }, 16_384) as u32),
            chunked_prefill: d.chance(0.8),
            block_tokens,
            kv_blocks,
            window: d.int(1, 4) as u32,
            watermark: {
                let any = d.real(0.0, 0.3);
                d.pick(&[0.0, WATERMARK, WATERMARK, any])
            },
            prefix_caching: d.chance(0.7),
        }
    } else {
        Scheduler::Dynamic {
            max_batch_size: d.int(1, 64) as u32,
            max_queue_delay_ms: d.real(0.0, 100.0),
            block_tokens,
            kv_blocks,
        }
    };
    let (step_model, roofline) = step_form(d, &profile);
    Cluster {
        replicas: d.int(1, if big { 16 } else { 4 }) as u32,
        router: router(d),
        profile,
        step_model,
        roofline,
        // From 0.8 every named profile keeps a KV cache at any batched-token budget.
        gpu_memory_utilization: if d.chance(0.3) {
            d.real(0.8, 1.0)
        } else {
            cancelsim_models::gpu::UTILIZATION_DEFAULT
        },
        scheduler,
        // Colocated; `disaggregate` may draw a prefill/decode graph at the end.
        topology: None,
    }
}

/// The 0.1 linear constants now and then, where the profile has them; else a named roofline
/// sometimes runs at other utilisations, down to 1 % of a peak.
fn step_form(d: &mut Draw, profile: &ProfileRef) -> (Option<StepForm>, Option<RooflineShares>) {
    let ProfileRef::Named(n) = profile else {
        return (None, None);
    };
    let linear = cancelsim_models::gpu::profile(n).is_some_and(|p| p.linear_v1.is_some());
    if linear && d.chance(0.25) {
        return (Some(StepForm::Linear), None);
    }
    if !d.chance(0.15) {
        return (None, None);
    }
    let mut pct = || d.chance(0.5).then(|| d.int(1, 100));
    let [mfu_pct, mbu_pct, mbu_kv_pct, mfu_attn_pct] = [pct(), pct(), pct(), pct()];
    let shares = RooflineShares {
        mfu_pct,
        mbu_pct,
        mbu_kv_pct,
        mfu_attn_pct,
    };
    (None, Some(shares))
}

fn router(d: &mut Draw) -> Router {
    match d.s.below(4) {
        0 => Router::LeastLoaded,
        1 => Router::Session,
        2 => Router::SharedQueue {
            max_outstanding: d.int(1, 64) as u32,
        },
        _ => Router::RoundRobin,
    }
}

/// The handoff's mechanisms, every one drawn, for a KV link of this `loss`.
fn handoff(d: &mut Draw, loss: f64) -> HandoffSpec {
    // Intents come from storms, deadlines, disconnects, barge-ins and playback: any run may
    // strand a request. With no loss and the router's notice, every hold gets its notice.
    let notify_prefill = d.chance(0.5);
    let calm = loss == 0.0 && notify_prefill;
    let reclaim = |d: &mut Draw| match d.chance(if calm { 0.3 } else { 0.1 }) {
        true => ReclaimSpec::Never,
        false => ReclaimSpec::Lease {
            lease_ms: d.scale(1.0, 480_000.0),
            grace_ms: d.real(0.0, 1_000.0),
        },
    };
    let transfer_cancel = d.pick(&[
        TransferCancel::AtOnce,
        TransferCancel::AtTransferEnd,
        TransferCancel::AtTransferEndNoNotice,
    ]);
    // A wedge is drawn where a cancel stops a transfer on the wire: with `AtOnce` only.
    let wedge = d.pick(&[0.0, 0.0, 0.05, 1.0]);
    HandoffSpec {
        abort_order: d.pick(&[AbortOrder::BeforeOutput, AbortOrder::AfterOutput]),
        transfer_cancel,
        prefill_reclaim: reclaim(d),
        decode_reclaim: reclaim(d),
        decode_completions: d.pick(&[CompletionsSpec::Counted, CompletionsSpec::FirstFrees]),
        notify_prefill,
        kv_bytes_per_token: d.chance(0.3).then(|| d.int(1, 1 << 20)),
        // A wedged engine without a hang detector stalls the run by design: always one here.
        wedge_probability: if transfer_cancel == TransferCancel::AtOnce {
            wedge
        } else {
            0.0
        },
        transfer_failure: d.pick(&[0.0, 0.0, 0.1, 1.0]),
        hang_detector_ms: Some(d.scale(1.0, 300_000.0)),
        // Drawn from its own stream (`fuzz_router.rs`), after the world.
        conditional: None,
    }
}

/// A prefill/decode graph of 1P1D up to 4P2D, with every handoff mechanism drawn. A reclaim of
/// `Never` is drawn mostly where no notice can be missed; elsewhere it may hold blocks for good,
/// and then the run must stop as stalled (`check_drawn`), at every window.
fn disaggregate(d: &mut Draw, s: &mut Scenario) {
    if !matches!(s.cluster.scheduler, Scheduler::Continuous { .. }) {
        return;
    }
    let (p, dd) = (d.int(1, 4) as u32, d.int(1, 2) as u32);
    s.cluster.replicas = p + dd;
    let some = d.real(0.0, 0.5);
    let loss = d.pick(&[0.0, 0.0, some, 1.0]);
    let handoff = handoff(d, loss);
    let stage = |name: &str, role, replicas| StageSpec {
        name: name.into(),
        role,
        replicas,
        profile: None,
        scheduler: None,
    };
    let local = |from: &str, to: &str| LinkRon {
        from: from.into(),
        to: to.into(),
        latency_ms: 0.0,
        bandwidth_gbps: None,
        loss: 0.0,
    };
    let kv = LinkRon {
        latency_ms: d.real(0.0, 5.0),
        bandwidth_gbps: d.chance(0.8).then(|| d.scale(1.0, 800.0)),
        loss,
        ..local("prefill", "decode")
    };
    s.cluster.topology = Some(TopologySpec {
        stages: vec![
            stage("router", RoleSpec::Router, 1),
            stage("prefill", RoleSpec::Prefill, p),
            stage("decode", RoleSpec::Decode, dd),
            stage("playback", RoleSpec::Playback, 1),
        ],
        links: vec![local("router", "prefill"), kv, local("decode", "playback")],
        handoff,
    });
    if let Some(c) = &mut s.cancellation {
        if d.chance(0.3) {
            c.stage = d.pick(&[Stage::KvTransfer, Stage::AwaitingRemoteKv]);
        }
    }
}

fn cancellation(d: &mut Draw) -> Cancellation {
    // Every stage: the lifecycle's six, and the two that are not a point of the lifecycle.
    let stage = match d.s.below(8) {
        0 => Stage::Random,
        7 => Stage::AfterArrival,
        i => Stage::LIFECYCLE[i as usize - 1],
    };
    Cancellation {
        fraction: d.real(0.0, 1.0),
        requests: Vec::new(),
        stage,
        delay_ms: d.dist(50.0, 1.0),
        window_s: None,
        request_cancellation_rate: None,
        request_cancellation_delay: None,
        ideal_baseline: d.chance(0.5),
    }
}

fn policies(d: &mut Draw) -> Vec<Policy> {
    let all = [
        Policy::FinishAndDiscard,
        Policy::PerRequest,
        Policy::GroupAbort(GroupScope::Stream),
        Policy::GroupAbort(GroupScope::Sequence),
        Policy::GroupAbort(GroupScope::Prefix),
        Policy::GroupAbort(GroupScope::Engine),
        Policy::PerRequestWithFallback {
            fallback_after_ms: d.real(0.0, 1_000.0),
        },
        Policy::Ideal,
    ];
    let n = d.int(1, 3) as usize;
    let mut ps: Vec<Policy> = Vec::new();
    for _ in 0..n {
        let p = d.pick(&all);
        if !ps.iter().any(|q| q.label() == p.label()) {
            ps.push(p);
        }
    }
    ps
}

fn adapter(d: &mut Draw) -> AdapterConfig {
    AdapterConfig {
        submit_delay_ms: d.dist(5.0, 1.0),
        rpc_latency_ms: d.dist(1.0, 1.0),
        loss: d.real(0.0, 1.0),
        duplicate: d.real(0.0, 1.0),
        timeout_ms: d.scale(1e-3, 1_000.0),
        max_attempts: d.int(1, 100) as u32,
        streams: d.int(0, 8),
        identity: if d.chance(0.3) {
            IdentityMode::ClientReused {
                pool: d.int(1, 1_000),
            }
        } else {
            IdentityMode::ServerGenerated
        },
    }
}

fn backend(d: &mut Draw) -> BackendConfig {
    let radii = [Radius::Request, Radius::Batch, Radius::Engine];
    BackendConfig {
        checkpoint: match d.s.below(3) {
            0 => CheckpointConfig::EveryStep,
            1 => CheckpointConfig::EveryKSteps(d.int(1, 1_000_000) as u32),
            _ => CheckpointConfig::Never,
        },
        release: d.pick(&[Release::Fenced, Release::Immediate]),
        cancel_after_completion: if d.chance(0.5) {
            AfterCompletion::Ignore
        } else {
            AfterCompletion::Fault(d.pick(&radii))
        },
        abort_fault_probability: {
            let any = d.real(0.0, 1.0);
            d.pick(&[0.0, 0.0, any])
        },
        abort_fault_radius: d.pick(&radii),
        clock_offset_ms: d.real(0.0, 1e6),
    }
}

fn playback(d: &mut Draw) -> PlaybackConfig {
    PlaybackConfig {
        chunk_tokens: {
            let any = d.int(1, 1 << 20) as u32;
            d.pick(&[1, 8, any])
        },
        writer_wait_ms: d.dist(2.0, 1.0),
        clear_ack_ms: d.dist(50.0, 1.0),
        max_age_ms: {
            let any = d.real(0.0, 10_000.0);
            d.pick(&[0.0, 60_000.0, 1e308, any])
        },
        admit_retries: d.int(0, 1_000) as u32,
    }
}

/// Check one drawn scenario: it validates, runs to its end within its limits with no invariant
/// broken (or stops as stalled, where it may), keeps its properties, and every summary makes
/// sense, of itself and of its scenario. `Ok(None)`: it stalled, as it may.
pub fn check_drawn(runner: Runner, s: &Scenario) -> Result<Option<Report>, Vec<String>> {
    if let Err(e) = s.validate() {
        let m = format!(
            "the fuzzer drew an invalid scenario: field `{}` {}",
            e.field, e.message
        );
        return Err(vec![m]);
    }
    let report = match runner(s, s.seed) {
        // A hold that can wait for good stalls the run by design: reported as a stall, it
        // passes; reported as a limit, or where nothing can wait for good, it fails.
        Err(RunError::Stalled(_)) if may_stall(s) => return Ok(None),
        Err(e) => return Err(vec![e.to_string()]),
        Ok(r) => r,
    };
    let mut problems = super::judge(s, &report, false);
    let runs = std::iter::once(&report.counterfactual)
        .chain(&report.policies)
        .chain(report.ideal.as_ref());
    problems.extend(runs.flat_map(nonsense));
    problems.extend(unfounded(s, &report));
    if problems.is_empty() {
        Ok(Some(report))
    } else {
        Err(problems)
    }
}

/// Whether a drawn world may stall by design: a hold that waits for good (a `Never` reclaim and
/// a notice that can fail to come). Wedges always have a hang detector here.
fn may_stall(s: &Scenario) -> bool {
    let (prefill, decode) = super::sense::waits_for_good(s);
    prefill || decode
}

/// Fuzz seeds `first..first + n` of `tier` in parallel, collected in seed order. Seeds not yet
/// started when `until` passes are skipped (a time budget for CI); the result says which ran.
pub fn fuzz_with(
    runner: Runner,
    tier: Tier,
    (first, n): (u64, u64),
    base_dir: &std::path::Path,
    until: Option<std::time::Instant>,
) -> Vec<SeedResult> {
    (first..first.saturating_add(n))
        .into_par_iter()
        .filter_map(|seed| {
            if until.is_some_and(|t| std::time::Instant::now() > t) {
                return None;
            }
            let s = scenario(seed, tier, base_dir.to_path_buf());
            let (failures, run_hash) = match check_drawn(runner, &s) {
                Ok(r) => (Vec::new(), r.map(|r| r.run_hash)),
                Err(f) => (f, None),
            };
            Some(SeedResult {
                seed,
                failures,
                run_hash,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drawn_scenario_validates_and_draws_differ() {
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let mut names = std::collections::BTreeSet::new();
        for tier in [Tier::Small, Tier::Big, Tier::Jobs] {
            for seed in 1..=300 {
                let s = scenario(seed, tier, base.clone());
                if let Err(e) = s.validate() {
                    panic!("{tier:?} seed {seed}: field `{}` {}", e.field, e.message);
                }
                names.insert(s.hash());
            }
        }
        assert_eq!(names.len(), 900, "every seed draws another scenario");
    }
}
