//! The streak (`engine/streak.rs`) against the engine without it: the same random workloads,
//! aborts and configurations, once with every request lazy-eligible and once with none, must
//! give every request the same tokens at the same times, the same discards, observations and
//! releases, and the engine the same counters and pool. The lazy run's tokens without outputs
//! are read back from its hand-overs (`Implicit`) and its streak steps' end times.

use cancelsim_models::engine::{Engine, EngineConfig};
use cancelsim_models::gpu::{StepCost, StepModel};
use cancelsim_models::kv::KvPool;
use cancelsim_models::prefix::StreamKey;
use cancelsim_models::protocol::{
    turns_one_by_one, Abort, BlastRadius, Checkpoint, CheckpointReport, Dispatch, Gauges, Implicit,
    NewRequest, Outbox, Rejection, ReleaseMode, ReplicaStats, Scheduler, Scope, StepReport, Turned,
    UnknownAbort,
};
use proptest::prelude::*;

use crate::driver::{drive_full, req, MS};

#[derive(Clone, Debug)]
pub(crate) struct World {
    pub(crate) cfg: EngineConfig,
    pub(crate) arrivals: Vec<(u64, NewRequest)>,
    pub(crate) aborts: Vec<(u64, Abort)>,
    pub(crate) explicit: Vec<(u64, u32)>,
}

fn config() -> impl Strategy<Value = EngineConfig> {
    (
        (1u32..4, any::<bool>(), any::<bool>(), 8u64..400),
        (4u32..200, 1u32..12, 0u64..3, any::<bool>()),
        (
            0u32..4,
            any::<bool>(),
            prop_oneof![Just(4u32), Just(16)],
            0u32..5,
        ),
    )
        .prop_map(
            |((window, chunked, cache, blocks), (budget, seqs, wm, tomb), (ck, imm, bt, every))| {
                EngineConfig {
                    max_num_seqs: seqs,
                    max_num_batched_tokens: budget,
                    chunked_prefill: chunked,
                    block_tokens: bt,
                    kv_blocks: blocks,
                    watermark_blocks: wm,
                    prefix_caching: cache,
                    window,
                    // A step's time depends on its whole shape: a wrong shape shows in the times.
                    cost: StepModel::Linear(StepCost {
                        c0_ns: 2 * MS,
                        prefill_tokens_per_s: 50_000,
                        per_seq_ns: 30_000,
                        per_kv_token_ps: 7_000,
                    }),
                    checkpoint: match ck {
                        0 => Checkpoint::Never,
                        k => Checkpoint::EveryPasses(k),
                    },
                    release: match imm {
                        true => ReleaseMode::Immediate,
                        false => ReleaseMode::Fenced,
                    },
                    unknown_abort: UnknownAbort::Ignore,
                    tombstones: tomb,
                    lazy_output_every: every,
                }
            },
        )
}

pub(crate) fn world() -> impl Strategy<Value = World> {
    let request = (0u64..400, 1u32..120, 1u32..90, any::<bool>());
    let abort = (0u64..600, 0u64..30, 0u8..6, any::<bool>());
    (
        config(),
        prop::collection::vec(request, 1..30),
        prop::collection::vec(abort, 0..6),
        prop::collection::vec((0u64..600, 0u32..30), 0..6),
    )
        .prop_map(|(cfg, reqs, aborts, explicit)| {
            let mut arrivals: Vec<(u64, NewRequest)> = reqs
                .iter()
                .enumerate()
                .map(|(i, &(t, prompt, output, capped))| {
                    let r = NewRequest {
                        length_capped: capped,
                        ..req(i as u64, prompt, output)
                    };
                    (t * MS, r)
                })
                .collect();
            arrivals.sort_by_key(|a| a.0);
            let mut aborts: Vec<(u64, Abort)> = aborts
                .iter()
                .map(|&(t, id, how, ideal)| {
                    let scope = match how {
                        0 => Scope::Stream(id % 2),
                        1 => Scope::Engine,
                        _ => Scope::Request(id),
                    };
                    let fault = (how == 5).then_some(BlastRadius::Batch);
                    (
                        t * MS,
                        Abort {
                            scope,
                            fault,
                            key: id + 1000 * t,
                            ideal,
                        },
                    )
                })
                .collect();
            aborts.sort_by_key(|a| a.0);
            let mut explicit: Vec<(u64, u32)> =
                explicit.iter().map(|&(t, tag)| (t * MS, tag)).collect();
            explicit.sort();
            World {
                cfg,
                arrivals,
                aborts,
                explicit,
            }
        })
}

/// The engine, with two requests in three sharing blocks with others through the prefix cache:
/// a trace's block ids (as a Mooncake row has), or a conversation's stream. With `.1`, a
/// coast's turns taken together are taken as the trait has it (`turns_one_by_one`), not as the
/// engine does.
pub(crate) struct Sharing(pub(crate) Engine, pub(crate) bool);

impl Scheduler for Sharing {
    fn enqueue(&mut self, now_ns: u64, r: NewRequest) -> Result<(), Rejection> {
        self.0.enqueue(now_ns, r)?;
        if r.id % 3 == 0 {
            let ids: Vec<u64> = (0..1 + r.id % 4).map(|i| 7 * i + r.id % 2).collect();
            self.0.share_prefix(r.tag, &ids, 16);
        } else if r.id % 3 == 1 {
            // A conversation's stream, carried on past its history: its output blocks are
            // shared too, so it puts them in the cache as they fill.
            let key = StreamKey {
                id: r.id % 2,
                bounds: vec![r.prompt_tokens as u64 / 2].into(),
                whole: r.id % 2 == 1,
            };
            self.0.share_stream(r.tag, key);
        }
        Ok(())
    }
    fn dispatch(&mut self, now_ns: u64, out: &mut Outbox) -> Option<Dispatch> {
        self.0.dispatch(now_ns, out)
    }
    fn step_done(&mut self, now_ns: u64, step: u64, out: &mut Outbox) -> StepReport {
        self.0.step_done(now_ns, step, out)
    }
    fn abort(&mut self, a: Abort) {
        self.0.abort(a)
    }
    fn checkpoint(&mut self, now_ns: u64, out: &mut Outbox) -> CheckpointReport {
        self.0.checkpoint(now_ns, out)
    }
    fn mark_intent(&mut self, now_ns: u64, tag: u32) {
        self.0.mark_intent(now_ns, tag)
    }
    fn timer_ns(&self) -> Option<u64> {
        self.0.timer_ns()
    }
    fn gauges(&self) -> Gauges {
        self.0.gauges()
    }
    fn load(&self) -> u64 {
        self.0.load()
    }
    fn is_idle(&self) -> bool {
        self.0.is_idle()
    }
    fn kv(&self) -> &KvPool {
        self.0.kv()
    }
    fn totals(&self) -> ReplicaStats {
        self.0.totals()
    }
    fn make_explicit(&mut self, tag: u32) -> Option<Implicit> {
        self.0.make_explicit(tag)
    }
    fn turn(&mut self, now_ns: u64, step: u64) -> Option<(StepReport, Dispatch)> {
        self.0.turn(now_ns, step)
    }
    fn coast_ends(&mut self, turns_max: u32, ends: &mut Vec<u64>) {
        self.0.coast_ends(turns_max, ends)
    }
    fn turns_at(&mut self, step: u64, ends: &[u64], after_turn: bool) -> Turned {
        match self.1 {
            true => turns_one_by_one(self, step, ends),
            false => self.0.turns_at(step, ends, after_turn),
        }
    }
}

/// What a run of `w` shows: every request's trace, the engine's counters and pool totals.
fn run(w: &World, lazy: bool) -> String {
    let mut e = Sharing(Engine::new(w.cfg.clone()), false);
    let arrivals: Vec<(u64, NewRequest)> = (w.arrivals.iter())
        .map(|&(t, r)| (t, NewRequest { lazy, ..r }))
        .collect();
    let traces = drive_full(&mut e, &arrivals, &w.aborts, &w.explicit);
    let kv = e.kv();
    format!(
        "{traces:#?}\n{:?}\n{} {} {} {}",
        e.0.stats(),
        kv.allocated_total(),
        kv.freed_total(),
        kv.in_use(),
        kv.in_use_max()
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn the_streak_changes_nothing_a_request_or_the_engine_shows(w in world()) {
        prop_assert_eq!(run(&w, false), run(&w, true));
    }
}

/// The streak is taken when it can be: a long decode without aborts hands its tokens over in
/// one piece, with an output only for its first token (the prefill's) and its last.
#[test]
fn a_quiet_decode_rides_the_streak() {
    let mut e = Engine::new(crate::driver::cfg(1));
    let lazy = NewRequest {
        lazy: true,
        ..req(1, 20, 50)
    };
    e.enqueue(0, lazy).unwrap();
    let mut out = cancelsim_models::protocol::Outbox::default();
    let (mut outputs, mut implicit, mut now) = (0, Vec::new(), 0);
    while let Some(d) = e.dispatch(now, &mut out) {
        now = d.end_ns;
        e.step_done(now, d.step, &mut out);
        outputs += out.outputs.len();
        implicit.append(&mut out.implicit);
        out.clear();
        e.checkpoint(now, &mut out);
        implicit.append(&mut out.implicit);
    }
    assert_eq!((outputs, now, e.stats().steps), (2, 50 * 10 * MS, 50));
    assert_eq!(e.stats().tokens_delivered, 50);
    let handed: Vec<(u64, u32)> = implicit.iter().map(|i| (i.from, i.count)).collect();
    assert_eq!(
        handed,
        [(0, 48)],
        "48 tokens in streak steps 0 to 47, handed over once"
    );
}
