//! The world: owns the components of a run and routes the one closed `Event` enum between them
//! through one exhaustive `match`.
//!
//! A scenario is run once as the counterfactual (no cancel intents at all) and once per policy,
//! all on the same seed, so every run sees the same workload (common random numbers); `run.rs`
//! drives that. The components, each with its own state:
//! - `arrivals`: the open-loop source and the workload hash;
//! - `conversations`: closed-loop turns and barge-ins;
//! - `cluster`: replicas, router, scheduler passes and timers;
//! - `cancel`: the adapter's cancel client (plans, handles, the cancel RPC);
//! - `playback`: the sink's chunks and two-phase admissions, and the owners' clear barriers;
//! - `accounts`: the books; `baseline`: the counterfactual comparison; `recorder`: files.
//!
//! The world itself only holds them, the kernel and the controller, and says what follows what:
//! the cancel RPC's events in `cancel_rpc.rs`, the transitions of a request's life in `flow.rs`.

mod accounts;
mod arrivals;
mod baseline;
mod cancel;
mod cancel_rpc;
mod cancel_state;
mod cluster;
mod coast;
mod conditional;
mod conversations;
mod delivery;
mod digest;
mod disagg;
mod error;
mod event;
mod flow;
mod follow;
mod handoff;
mod intent;
mod job;
mod job_audit;
mod job_books;
mod job_flow;
mod job_observer;
mod job_plan;
mod jobs;
mod kv_router;
mod lazy;
mod leave;
mod life;
mod occupancy;
mod playback;
mod recorder;
mod recovery;
mod registry;
mod requests;
mod sharing;
mod summary;
mod turns;

pub use baseline::{CfRecord, CfTable};
pub use error::RunError;
pub use event::{Cause, Event};
#[cfg(feature = "broken-variants")]
pub use jobs::JobBug;
pub use kv_router::KvRouterStats;

use cancelsim_models::gpu::StepTable;
#[cfg(feature = "broken-variants")]
use cancelsim_models::ownership::ControllerBug;
use cancelsim_models::ownership::{Owners, Retention};
use cancelsim_models::protocol::Handle;
use std::sync::Arc;

use crate::workload::TraceReader;

use accounts::Accounts;
use arrivals::Arrivals;
use baseline::{Baseline, Siblings};
use cancel::CancelClient;
use cluster::Cluster;
use conversations::Conversations;
use error::{Step, Stop};
use follow::Follow;
use handoff::Handoff;
use occupancy::Occupancy;
use playback::PlaybackSink;
use recorder::Recorder;
use recovery::Recover;
use requests::Requests;
use requests::Tag;

use crate::kernel::Kernel;
use crate::metrics::Summary;
use crate::record::{Extras, Recording};
use crate::scenario::{Policy, Scenario};

/// Deliberately broken variants, to show that `check --swarm` catches real bugs. Only tests
/// build them (the `broken-variants` feature); no scenario file or command-line flag can.
#[cfg(feature = "broken-variants")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hooks {
    pub controller_bug: Option<ControllerBug>,
    /// The adapter aborts the whole engine under the per-request policy.
    pub adapter_aborts_batch: bool,
    /// A durable job model that breaks one of the five job rules.
    pub job_bug: Option<JobBug>,
}

/// The run's role.
#[derive(Clone, Copy)]
pub enum Mode<'a> {
    /// No cancel intents: the reference the siblings are compared with.
    Counterfactual,
    Policy(&'a Policy, &'a CfTable),
}

/// Controller records stay as long as the request is in the world (an event can still refer to
/// it: a backlog, a long cancel path, a delayed intent), and join the tombstones when it leaves.
/// Request ids are unique by construction and the world ignores events for requests that left,
/// so a small retention of tombstones serves: memory follows the requests in the world. Small
/// enough that the tombstones and the evicted ids stay in cache: with 4,096 of each, every
/// request that left evicted a row it had not touched for 4,096 departures, and the records'
/// map, which every played chunk reads, held 4,096 dead rows.
/// Too small shows loudly, not as other answers: a call about an id forgotten is an error.
const RETENTION: Retention = Retention {
    tombstones_max: 64,
    tombstone_age_ns_max: None,
    evicted_max: 64,
    until_retired: true,
};

/// One run of one scenario in one mode.
pub struct World<'s> {
    scenario: &'s Scenario,
    seed: u64,
    label: String,
    kernel: Kernel<Event>,
    /// What the event being handled asks for; into the kernel after each dispatch.
    follow: Follow,
    owners: Owners<u64>,
    requests: Requests,
    arrivals: Arrivals,
    conversations: Conversations,
    /// Durable agent jobs, with a `Jobs` source.
    jobs: Option<jobs::Jobs>,
    cluster: Cluster,
    /// The prefill-to-decode handoff, in a disaggregated graph.
    handoff: Option<Handoff>,
    cancel: CancelClient<'s>,
    sink: PlaybackSink,
    /// Lazy requests' streak steps' shares (`lazy.rs`).
    lazy: lazy::Lazy,
    accounts: Accounts,
    baseline: Baseline<'s>,
    recorder: Recorder<'s>,
    recover: Recover,
    /// The slab's occupancy over time: Little's L, measured apart from the books' λ and W.
    occupancy: Occupancy,
    /// Events dispatched at which the progress callback next hears.
    progress_at: u64,
    coasts: coast::Coasts,
}

/// What a run reads from outside, opened at the edge (`run.rs`) and handed in: the world itself
/// never opens a file.
#[derive(Default)]
pub struct Inputs {
    /// The measured step times of a `Table` profile.
    pub step_table: Option<Arc<StepTable>>,
    /// The trace an open-loop `Trace` source replays, opened at its first row.
    pub trace: Option<TraceReader>,
    /// The recorded sessions an `AgentTrace` source replays, read once for every run.
    pub sessions: Option<Arc<crate::workload::agentic::AgentSessions>>,
}

impl<'s> World<'s> {
    pub fn new(
        scenario: &'s Scenario,
        seed: u64,
        mode: Mode<'s>,
        cf_out: Option<&'s mut CfTable>,
        inputs: Inputs,
    ) -> Result<Self, RunError> {
        debug_assert!(scenario.validate().is_ok());
        let (policy, label, baseline) = match mode {
            Mode::Counterfactual => (None, "counterfactual".into(), Baseline::Record(cf_out)),
            Mode::Policy(p, cf) => (
                Some(p),
                p.label(),
                Baseline::Compare(cf, Siblings::default()),
            ),
        };
        // Aborts by request id: a policy run's cancels, and the frontend's after a stop string.
        // The counterfactual sends no cancel (`on_cancel_submit` asserts it).
        let late_aborts = policy.is_some() || scenario.workload.stop_strings.is_some();
        Ok(World {
            scenario,
            seed,
            label,
            kernel: Kernel::new(scenario.limits()),
            follow: Follow::default(),
            owners: Owners::new(RETENTION),
            requests: Requests::default(),
            arrivals: Arrivals::new(scenario, seed, inputs.trace).map_err(RunError::Input)?,
            conversations: Conversations::new(seed, &scenario.workload),
            jobs: jobs::Jobs::new(seed, &scenario.workload, inputs.sessions.as_ref()),
            cluster: Cluster::new(scenario, inputs.step_table.as_ref(), late_aborts),
            handoff: scenario
                .prefill_decode()
                .map(|pd| Handoff::new(scenario, seed, pd)),
            cancel: CancelClient::new(scenario, seed, policy, false),
            sink: PlaybackSink::new(&scenario.playback, seed),
            lazy: lazy::Lazy::default(),
            accounts: Accounts::new(),
            baseline,
            recorder: Recorder::new(Recording::default()),
            recover: Recover::new(scenario.cancellation.as_ref().and_then(|c| c.window_s)),
            occupancy: Occupancy::default(),
            progress_at: crate::record::PROGRESS_EVERY_EVENTS,
            coasts: coast::Coasts::default(),
        })
    }

    /// Turn on deliberately broken variants (tests of the checker only).
    #[cfg(feature = "broken-variants")]
    pub fn with_hooks(mut self, hooks: Hooks) -> Self {
        self.owners.set_bug(hooks.controller_bug);
        let policy = self.cancel.policy();
        self.cancel =
            CancelClient::new(self.scenario, self.seed, policy, hooks.adapter_aborts_batch);
        if let Some(j) = self.jobs.as_mut() {
            j.bug = hooks.job_bug;
        }
        self
    }

    /// Record samples, rows or a trace while running.
    pub fn with_recording(mut self, r: Recording<'s>) -> Self {
        self.recorder = Recorder::new(r);
        self
    }

    /// No request rides a replica's streak: each token is an output of its step, as before the
    /// streak. The same answers and run hash, slower (`RunOptions::no_streak`).
    pub fn without_streak(mut self) -> Self {
        self.lazy.turn_off();
        self
    }

    /// Run to completion and summarise.
    pub fn run(self) -> Result<Summary, RunError> {
        self.run_recorded().map(|(s, _)| s)
    }

    /// Run to completion; the summary and what was recorded.
    pub fn run_recorded(mut self) -> Result<(Summary, Extras), RunError> {
        self.start_coasts();
        self.follow.open(self.kernel.now_ns());
        let first_job_ns = self.jobs.as_ref().map_or(0, |j| j.first_start_ns());
        let started = self
            .arrivals
            .begin(&mut self.follow, self.scenario, first_job_ns);
        started.map_err(|e| self.stopped(e))?;
        self.follow.schedule(&mut self.kernel)?;
        loop {
            if self.coasts.on() {
                self.wake_due().map_err(|e| self.stopped(e))?;
            }
            let (accounts, handoff, cancel) = (&self.accounts, &self.handoff, &self.cancel);
            let waking = self.coasts.waking();
            let go_on = || {
                waking
                    || cancel.awaiting() > 0
                    || disagg::waits_on_leases(accounts, handoff.as_ref())
            };
            let event = self.kernel.next_event_or(go_on)?;
            let Some(event) = event else {
                break;
            };
            self.occupancy
                .advance(self.kernel.now_ns(), self.requests.live_count());
            self.sample_until(self.kernel.now_ns())
                .map_err(|e| self.stopped(e))?;
            self.follow.open(self.kernel.now_ns());
            self.dispatch(event).map_err(|e| self.stopped(e))?;
            self.progress();
            self.follow_up()?;
        }
        if self.coasts.any() {
            let e = Stop::broken(vec![], "a replica coasts past the end of the run");
            return Err(self.stopped(e));
        }
        let now = self.kernel.now_ns();
        self.sample_until(now.saturating_add(1))
            .map_err(|e| self.stopped(e))?;
        let (seed, label, events) = (
            self.seed,
            self.label.clone(),
            self.kernel.events_dispatched(),
        );
        self.finish()
            .map_err(|e| e.into_run_error(seed, &label, events))
    }

    /// What the event asked for, into the kernel. A scheduler pass asked for last at this tick
    /// when nothing else is due at it is the event the kernel would pop next: it runs at once
    /// (`Kernel::dispatch_now`: the same sequence number and run hash record), and so on. The
    /// clock does not move, so no sample or occupancy changes in between.
    #[inline]
    fn follow_up(&mut self) -> Result<(), RunError> {
        loop {
            let pass = self.follow.take_last_pass();
            if self.coasts.on() {
                self.reach_asked().map_err(|e| self.stopped(e))?;
            }
            self.follow.schedule(&mut self.kernel)?;
            let Some(pass) = pass else {
                return Ok(());
            };
            if self.kernel.pending_now() {
                self.kernel.schedule_in(0, pass.class(), pass)?;
                return Ok(());
            }
            let pass = self.kernel.dispatch_now(pass.class(), pass)?;
            self.follow.open(self.kernel.now_ns());
            self.dispatch(pass).map_err(|e| self.stopped(e))?;
            self.progress();
        }
    }

    /// Every so many events, the progress callback hears how many requests arrived.
    #[inline]
    pub(super) fn progress(&mut self) {
        if self.kernel.events_dispatched() >= self.progress_at {
            let every = crate::record::PROGRESS_EVERY_EVENTS;
            self.progress_at = (self.kernel.events_dispatched() / every + 1) * every;
            self.recorder
                .progress(self.accounts.tally().counts.scheduled);
        }
    }

    /// Samples of the gauges at every boundary before `now_ns`: the state between events.
    fn sample_until(&mut self, now_ns: u64) -> Step {
        let in_flight = self.cancel.in_flight();
        while self.recorder.sample_due(now_ns) {
            if self.coasts.on() {
                // The turns coasted up to the boundary, as their events were before it.
                self.catch_up_all(self.recorder.next_sample_ns() + 1)?;
            }
            self.recorder.sample_once(&self.cluster, in_flight);
        }
        Ok(())
    }

    /// A component's stop, as the run's error: a broken invariant names the seed, the policy and
    /// the event number.
    fn stopped(&self, e: Stop) -> RunError {
        e.into_run_error(self.seed, &self.label, self.kernel.events_dispatched())
    }

    /// One call per event; `flow.rs` holds what follows each. Inlined into the run loop, its one
    /// caller and every run's hot path (callgrind, a 20k-request storm: 0.9 % fewer instructions
    /// than out of line).
    #[inline(always)]
    fn dispatch(&mut self, event: Event) -> Result<(), Stop> {
        match event {
            Event::Arrival { request } => self.on_arrival(request),
            Event::ConversationStart { conv } => {
                let w = &self.scenario.workload;
                self.conversations.start(&mut self.follow, w, conv);
                Ok(())
            }
            Event::TurnStart { conv } => self.on_turn_start(conv),
            Event::BargeIn { conv, generation } => self.on_barge_in(conv, generation),
            Event::StepDone { replica, step } => self.on_step_done(replica, step),
            Event::SchedulePass { replica } => self.on_schedule_pass(replica),
            Event::BatcherTimer { replica } => {
                self.cluster.timer_fired(replica, self.kernel.now_ns());
                self.cluster.request_pass(&mut self.follow, replica);
                Ok(())
            }
            Event::Deadline { request, tag } => self.on_timer(request, tag, Cause::Deadline),
            Event::Disconnect { request, tag } => self.on_timer(request, tag, Cause::Disconnect),
            Event::Intent { request, tag } => self.on_storm_intent(request, tag),
            Event::CancelSubmit {
                request,
                tag,
                attempt,
            } => self.on_cancel_submit(request, tag, attempt),
            Event::CancelDeliver {
                request,
                replica,
                scope,
                attempt,
            } => self.on_cancel_deliver(request, replica, scope, attempt),
            Event::CancelTimeout {
                request,
                tag,
                attempt,
            } => self.on_cancel_timeout(request, tag, attempt),
            Event::CancelAck { request, tag } => self.on_cancel_ack(request, tag),
            Event::Fallback { request, tag } => self.on_fallback(request, tag),
            Event::ChunkAdmit {
                request,
                tag,
                born_ns,
                epoch,
                retry,
            } => self.on_chunk_admit(request, tag, (born_ns, epoch), retry),
            Event::BarrierAck { owner, epoch } => {
                self.sink.cleared(&mut self.owners, owner, epoch);
                Ok(())
            }
            Event::Handoff { request, tag } => self.on_handoff(request, tag),
            Event::KvLanded { prefill, .. } => self.on_kv_landed(prefill),
            Event::Notice {
                request,
                replica,
                cancel,
            } => self.on_notice(request, replica, cancel),
            Event::LeaseCheck { replica } => self.on_lease_check(replica),
            Event::HangCheck { replica, since_ns } => self.on_hang_check(replica, since_ns),
            Event::StopAbort { request, tag } => self.on_stop_abort(request, tag),
            Event::JobStart { job } => self.on_job_start(job),
            Event::JobTimer { job, serial } => self.on_job_timer(job, serial),
            Event::JobCancel { job, copy } => self.on_job_cancel(job, copy),
            Event::JobDeadline { job } => self.on_job_deadline(job),
            Event::JobObserve { job } => self.on_job_observe(job),
            Event::JobCleanup { job, give_up } => self.on_job_cleanup(job, give_up),
            Event::JobObserverLeft { job } => self.on_job_observer_left(job),
            Event::JobObserverBack { job } => self.on_job_observer_back(job),
        }
    }

    /// How an abort can name request `tag`: a function of its id and owner, never stored.
    fn handle(&self, tag: Tag) -> Handle {
        let q = &self.requests[tag];
        self.cancel.handle(q.id, q.owner())
    }

    /// The run is over: conservation, then the summary.
    fn finish(mut self) -> Result<(Summary, Extras), Stop> {
        let end_ns = self.kernel.now_ns();
        self.occupancy.advance(end_ns, self.requests.live_count());
        self.conserved()?;
        let handoff = self.handoff_finish(end_ns);
        let pools = (self.handoff.as_ref())
            .map(|h| h.pool_summaries(|r| self.cluster.totals_of(r)))
            .unwrap_or_default();
        let drained = self
            .cluster
            .drained()
            .ok_or_else(|| Stop::broken(vec![], "a replica did not drain, or KV blocks leaked"))?;
        self.accounts.conserved(&drained.stats)?;
        let pairs = self.baseline.take_pairs();
        // The events, the outcomes, and the scenario itself: two scenarios whose event streams
        // coincide never share a run hash (nor the run directory named after it).
        let run_hash = {
            let mut h = blake3::Hasher::new();
            h.update(self.kernel.run_hash().as_bytes());
            h.update(self.accounts.outcome_hash().as_bytes());
            h.update(self.scenario.hash().as_bytes());
            h.finalize().to_hex().to_string()
        };
        let mut extras = self.recorder.finish();
        extras.sibling_ttft_ms = pairs;
        extras.admission_bins_ms = self.recover.bins_ms();
        extras.streak = self.lazy.counts();
        let (router, router_decode) = self.cluster.kv_stats();
        let books = summary::Books {
            scenario: self.scenario,
            seed: self.seed,
            policy: &self.label,
            accounts: self.accounts.tally(),
            drained,
            replicas: self.cluster.len(),
            conversations: self.conversations.events(),
            jobs: self.jobs.as_ref().map(|j| j.books.summary()),
            playback: self.sink.counts(),
            late_admitted: self.sink.late_admitted(),
            rpc: self.cancel.rpc(),
            siblings: self.baseline.siblings(),
            events: self.kernel.events_dispatched(),
            end_ns,
            handoff,
            pools,
            recovery: self.recover.summary(),
            router,
            router_decode,
            occupancy_area_ns: self.occupancy.area_ns,
            workload_hash: self.arrivals.workload_hash(),
            run_hash,
        };
        let summary = summary::summary(books, &mut extras);
        Ok((summary, extras))
    }

    /// Conservation, checked on every run (invariant 5): everyone who arrived ended in exactly one
    /// disposition and left, and every conversation ended.
    fn conserved(&self) -> Result<(), Stop> {
        let live = self.requests.live_ids(8);
        if let (false, Some(h)) = (live.is_empty(), &self.handoff) {
            let wedged = self.cluster.wedged().next().map(|(r, since_ns)| {
                format!(
                    "replica {r} wedged at {:.3} s and no hang detector kills it",
                    since_ns as f64 / 1e9
                )
            });
            if let Some(why) = wedged.or_else(|| h.stall()) {
                return Err(Stop::Stalled(format!(
                    "{} requests never finished ({live:?}, ...): {why}",
                    self.accounts.tally().little.in_system
                )));
            }
        }
        if !live.is_empty() || self.accounts.tally().little.in_system != 0 {
            return Err(Stop::broken(
                live,
                "requests never reached a terminal disposition",
            ));
        }
        let c = &self.accounts.tally().counts;
        if c.completed + c.cancelled + c.expired + c.rejected != c.scheduled {
            let what = "dispositions do not add up to the requests scheduled";
            return Err(Stop::broken(vec![], what));
        }
        if !self.conversations.all_ended() {
            return Err(Stop::broken(vec![], "a conversation never ended"));
        }
        if self.jobs.as_ref().is_some_and(|j| !j.all_ended()) {
            return Err(Stop::broken(vec![], "a job never ended"));
        }
        Ok(())
    }
}
