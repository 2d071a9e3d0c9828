//! Coasting: a replica whose batch will not change takes its quiet turns with no event each.
//!
//! After a turn (`World::turned`), the replica's turns ahead are known if nothing reaches it
//! (`Scheduler::coast_ends`): it coasts through them. No event is pushed for those steps; the
//! replica's state stays behind, and is brought up to now (`catch_up`: the same turns, each at
//! its own tick) when something reads it (`reach`) or when its last step ends (the wake-up,
//! a real `StepDone`). Every answer is the same as with an event a step. Why:
//! - A coasted turn is the turn the replica would have taken: nothing reaches it before (a
//!   reader first ends the coast) and no other event comes at its tick. A turn needs that
//!   (`World::turned` asks `pending_now`), and it keeps the tie order: events of one tick and
//!   class are ordered by sequence number, and a coasted step's end has none. So a coast stops
//!   short of the first tick another event holds (`Kernel::pending_at`) or another coast does
//!   (`ticks`), and an event asked for later at a coasted tick ends that coast first.
//! - The wake-up is pushed when the tick of the coast's last turn passes (`wake_due`, before
//!   the kernel pops an event after it), which is when that turn would have pushed it: the
//!   same place among the other events' sequence numbers.
//! - A coast that ends early pushes its next step's end at once. That step's turn would have
//!   pushed it earlier, but only an event at the same tick and class could tell, and one asked
//!   for since the coast began would have ended the coast then (its tick is the coast's); one
//!   pending before, the coast never reached.
//!
//! What does change is the run hash, which sees the events dispatched: coasted steps are not
//! events. The event count, and its limit, count them as the two events (a step's end and its
//! pass) each was, when their replica is brought up to date: a run stopped by a limit stops at
//! the same count or virtual time, but its error may name a later time or an earlier event
//! number than without coasting.

mod ticks;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use cancelsim_models::protocol::Dispatch;

use super::accounts::Shares;
use super::error::{Step, Stop};
use super::event::Event;
use super::World;
use crate::kernel::Class;
use ticks::Ticks;

/// Turns a coast takes, at least and at most. Each coast's last step is an event again (its
/// wake-up): a longer coast saves more events but, where an arrival ends it early, finds more
/// steps for nothing. So each replica's next coast may take twice the turns of one that ran
/// out, half those of one that something reached first (`Coast::reach_turns`). Of fixed
/// lengths 16 to 256 and these bounds (4 or 8, 64 or 128), 8 to 128 cost the fewest
/// instructions on slices of the Poisson and fleet benchmarks (docs/performance.md).
const TURNS_MIN: u32 = 8;
const TURNS_MAX: u32 = 128;

/// The coasting replicas of a world.
#[derive(Default)]
pub(super) struct Coasts {
    /// Whether this world coasts at all (`World::coastable`).
    on: bool,
    by_replica: Vec<Coast>,
    /// The ticks of coasted turns, and whose: one coast a tick, no event there. What a coast
    /// holds is its own (`Coast::holds`); the table finds the coast.
    ticks: Ticks,
    /// Coasts whose wake-up is not in the kernel yet, by the tick of their last turn:
    /// (that tick, replica, coast id). A coast that ended early leaves a stale entry.
    due: BinaryHeap<Reverse<(u64, u32, u64)>>,
    ids_next: u64,
    /// Coasts whose wake-up is not in the kernel yet: they keep the run alive.
    unwoken: u32,
    /// Reused for the ends a replica names, and for the ticks an event asks for.
    scratch: Vec<u64>,
    asked: Vec<u64>,
}

/// One replica's coast.
#[derive(Default)]
struct Coast {
    /// 0: none.
    id: u64,
    /// Turns the next coast may take: doubled after a coast that ran out, halved after one
    /// that something reached first.
    reach_turns: u32,
    /// `ends[i]`: the tick of turn `i`, for `i` below the last; the last: when the step that
    /// the last turn launches ends (its wake-up).
    ends: Vec<u64>,
    /// The step in flight at the coast's start, which turn 0 ends.
    first_step: u64,
    /// Turns taken so far (`catch_up`).
    taken: usize,
    /// Whether the wake-up is in the kernel (the last turn's tick passed).
    woken: bool,
}

impl Coast {
    fn turns(&self) -> usize {
        self.ends.len() - 1
    }

    /// Whether this coast holds tick `t`: it goes on, its wake-up is not in the kernel yet, and
    /// `t` is one of its turns' ticks.
    fn holds(&self, t: u64) -> bool {
        self.id != 0 && !self.woken && self.ends[..self.turns()].binary_search(&t).is_ok()
    }
}

/// Whether replica `o`'s coast holds tick `t` (`Coast::holds`): what the tick table asks of the
/// owner an entry names.
fn live(by_replica: &[Coast]) -> impl Fn(u32, u64) -> bool + Copy + '_ {
    |o, t| by_replica[o as usize].holds(t)
}

impl Coasts {
    pub(super) fn start(&mut self, on: bool, replicas: u32) {
        self.on = on;
        self.by_replica = (0..replicas).map(|_| Coast::default()).collect();
        if on {
            self.ticks = Ticks::with_capacity(replicas as u64 * TURNS_MAX as u64);
        }
    }

    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// Whether a coast's wake-up is still to come: the run is not over.
    pub(super) fn waking(&self) -> bool {
        self.unwoken > 0
    }

    /// Whether a coast holds tick `time_ns`.
    pub(super) fn holds(&self, time_ns: u64) -> Option<u32> {
        self.ticks.holds(time_ns, live(&self.by_replica))
    }

    pub(super) fn any(&self) -> bool {
        self.by_replica.iter().any(|c| c.id != 0)
    }
}

impl World<'_> {
    /// Whether this world coasts, decided as its run starts: with the streak (a coast is its
    /// quiet turns), where no hand-over, pool or KV-aware router reads a replica between them,
    /// and where some replica can coast at all (`Scheduler::may_coast`: with none, the ticks the
    /// kernel would count for coasts are never asked for). Not what the run records: samples
    /// bring the replicas up to their time first (`catch_up_all`), and a trace gets a coasted
    /// step when its replica is brought up to now.
    pub(super) fn start_coasts(&mut self) {
        let on = !self.lazy.is_off()
            && self.handoff.is_none()
            && !self.cluster.disaggregated()
            && !self.cluster.kv_aware()
            && self.cluster.may_coast();
        self.coasts.start(on, self.cluster.len() as u32);
        if on {
            self.kernel.track_times();
        }
    }

    /// The events the handler asked for are about to go into the kernel: a coast that holds
    /// one's tick ends first.
    pub(super) fn reach_asked(&mut self) -> Step {
        // No coast holds a tick (`Coast::holds`).
        if self.coasts.unwoken == 0 {
            return Ok(());
        }
        let mut asked = std::mem::take(&mut self.coasts.asked);
        asked.clear();
        self.follow.ticks(&mut asked);
        let reached = self.reach_holders(asked.iter().copied());
        self.coasts.asked = asked;
        reached
    }

    /// A turn just launched `d` on `replica`: coast through the turns ahead, up to the first
    /// whose tick an event or another coast holds. True if it coasts (the caller then asks
    /// for no event for `d`).
    pub(super) fn coast_from(&mut self, replica: u32, d: &Dispatch) -> bool {
        let c = &mut self.coasts;
        let mut ends = std::mem::take(&mut c.scratch);
        let want = c.by_replica[replica as usize]
            .reach_turns
            .clamp(TURNS_MIN, TURNS_MAX);
        self.cluster.coast_ends(replica, want, &mut ends);
        let named = ends.len().saturating_sub(1);
        let now_ns = self.kernel.now_ns();
        let live = live(&c.by_replica);
        c.ticks.sweep(now_ns, live);
        c.ticks.warm(&ends[..named]);
        // Each tick held as it is found free, up to the first one that is not: one an event
        // or another coast holds, or this coast's own tick again.
        let mut turns = 0;
        while turns < named
            && (turns == 0 || ends[turns] > ends[turns - 1])
            && !self.kernel.pending_at(ends[turns])
            && c.ticks.hold(ends[turns], replica, now_ns, live)
        {
            turns += 1;
        }
        if turns == 0 {
            c.scratch = ends;
            return false;
        }
        debug_assert_eq!(
            ends[0], d.end_ns,
            "a coast begins with the step just launched"
        );
        ends.truncate(turns + 1);
        c.ids_next += 1;
        c.unwoken += 1;
        let id = c.ids_next;
        c.due.push(Reverse((ends[turns - 1], replica, id)));
        let coast = &mut c.by_replica[replica as usize];
        debug_assert_eq!(coast.id, 0, "one coast at a time");
        c.scratch = std::mem::replace(&mut coast.ends, ends);
        (coast.id, coast.first_step, coast.taken, coast.woken) = (id, d.step, 0, false);
        self.cluster.set_coasting(replica, true);
        true
    }

    /// `replica`'s turns before `now_ns`, taken at their ticks, as `World::turned` takes them:
    /// the replica's, in one call (`Cluster::turns_at`), then the world's, in order.
    fn catch_up(&mut self, replica: u32, now_ns: u64) -> Step {
        let c = &self.coasts.by_replica[replica as usize];
        let (from, turns) = (c.taken, c.turns());
        let due = c.ends[from..turns].partition_point(|&t| t < now_ns);
        if due == 0 {
            return Ok(());
        }
        let step = c.first_step + from as u64;
        // The turns' ticks, and the end of the step the last one launches.
        let ends = &c.ends[from..=from + due];
        // A coast begins right after a turn (`World::turned`), and nothing calls into the
        // replica while it coasts: its last call was a turn.
        let turned = self.cluster.turns_at(replica, step, ends, true);
        if turned.count != due {
            return Err(Stop::broken(vec![], "a coasted turn was not quiet"));
        }
        // The first turn ended the coast's step in flight; each later one the step the one
        // before launched, which ends at its tick (`Turned::report`).
        if turned.first.step != step {
            return Err(Stop::broken(vec![], "a coasted turn ended another step"));
        }
        // Each step's share of a token, logged in order (`Lazy::record` checks it).
        let first = turned.first.streak.expect("a turn is a streak step's");
        let shares = (0..due).map(|i| Shares::unit_of(&turned.report(i, ends)));
        self.lazy
            .record_streak(&self.cluster, replica, first, shares);
        if self.recorder.traces() {
            for (i, tick) in ends.windows(2).enumerate() {
                let (start_ns, end_ns) = (tick[0], tick[1]);
                let d = Dispatch {
                    step: step + i as u64 + 1,
                    start_ns,
                    end_ns,
                };
                self.recorder.step(replica, &d);
            }
        }
        // Each step's end and its pass, as the events they were.
        self.kernel.count_dispatched(2 * due as u64)?;
        self.coasts.by_replica[replica as usize].taken += due;
        Ok(())
    }

    pub(super) fn coasting(&self, replica: u32) -> bool {
        self.coasts.by_replica[replica as usize].id != 0
    }

    /// Every coasting replica's turns before `now_ns` taken: each as it was then, still
    /// coasting (the gauges sampled read them).
    pub(super) fn catch_up_all(&mut self, now_ns: u64) -> Step {
        for replica in 0..self.coasts.by_replica.len() as u32 {
            if self.coasting(replica) {
                self.catch_up(replica, now_ns)?;
            }
        }
        Ok(())
    }

    /// Before anything reads or changes `replica`: it is brought up to now and coasts no
    /// longer; the step it has in flight ends with an event again.
    pub(super) fn reach(&mut self, replica: u32) -> Step {
        if self.coasts.by_replica[replica as usize].id == 0 {
            return Ok(());
        }
        let now_ns = self.kernel.now_ns();
        self.catch_up(replica, now_ns)?;
        self.progress();
        let c = &mut self.coasts.by_replica[replica as usize];
        c.id = 0;
        self.cluster.set_coasting(replica, false);
        if c.woken {
            debug_assert_eq!(c.taken, c.turns(), "woken, every turn's tick passed");
            return Ok(()); // its wake-up, the step in flight's end, is in the kernel
        }
        self.coasts.unwoken -= 1;
        c.reach_turns = (c.turns() as u32 / 2).max(TURNS_MIN);
        let (at, step) = (c.ends[c.taken], c.first_step + c.taken as u64);
        let done = Event::StepDone { replica, step };
        Ok(self.kernel.schedule_at(at, Class::Completion, done)?)
    }

    /// Events are about to be asked for at these ticks: the coasts that hold one end first.
    pub(super) fn reach_holders(&mut self, ticks: impl IntoIterator<Item = u64>) -> Step {
        for t in ticks {
            if let Some(replica) = self.coasts.holds(t) {
                self.reach(replica)?;
            }
        }
        Ok(())
    }

    /// Before the kernel's next event: the wake-up of every coast whose last turn comes
    /// earlier, pushed as that turn would have pushed it (the module's doc).
    pub(super) fn wake_due(&mut self) -> Step {
        while let Some(&Reverse((at, replica, id))) = self.coasts.due.peek() {
            let r = replica as usize;
            if self.coasts.by_replica[r].id != id {
                self.coasts.due.pop(); // ended early
                continue;
            }
            if let Some(next_ns) = self.kernel.next_time_ns().filter(|&t| t <= at) {
                debug_assert!(next_ns < at, "an event at a coasted tick");
                return Ok(());
            }
            self.coasts.due.pop();
            let c = &mut self.coasts.by_replica[r];
            c.woken = true;
            c.reach_turns = (c.turns() as u32 * 2).min(TURNS_MAX);
            self.coasts.unwoken -= 1;
            let (wake_ns, step) = (c.ends[c.turns()], c.first_step + c.turns() as u64);
            // Another coast's turn at that tick would not be quiet: that coast ends first.
            if let Some(other) = self.coasts.holds(wake_ns) {
                self.catch_up(other, at)?;
                self.reach(other)?;
            }
            let done = Event::StepDone { replica, step };
            self.kernel.schedule_at(wake_ns, Class::Completion, done)?;
        }
        Ok(())
    }
}
