//! Coasting: the quiet turns a replica takes if nothing reaches it, found before they come.
//!
//! A turn (`Engine::turn`) is quiet for reasons of two kinds: what only something from outside
//! changes (a request waiting, an abort pending, a drain, tainted blocks, the window's fill),
//! and what the streak itself reaches at a known step (a member's last token, an output by
//! phase, a block boundary that needs blocks). With nothing from outside, the first kind stays
//! as it is and the second is read off by step number, so the turns ahead, and the times their
//! steps end, are known now: the caller may take them later, together, at the same times
//! (`Engine::coast_ends`). A prediction may stop short (it is then merely shorter), never run
//! long: each turn it names is one that `turn` takes.

use super::super::seq::Step;
use super::super::Engine;
use crate::gpu::StepShape;
use crate::protocol::{StepReport, Turned};

impl Engine {
    /// What keeps a turn quiet that only something from outside the streak changes: the step
    /// in flight, `s`, holds the streak and nothing else, and so would the next one.
    #[inline(always)]
    pub(super) fn turn_still(&self, s: &Step) -> bool {
        let members = self.streak.members;
        s.entries.is_empty()
            && s.streak > 0
            && self.streak.drains.is_empty()
            && self.pending_aborts.is_empty()
            && self.ideal_pending == 0
            && self.inflight.len() as u32 == self.cfg.window
            && self.cfg.chunked_prefill
            && self.waiting.len() == 0
            && self.taint.blocks() == 0
            && self.running.len() == members as usize
            && members <= self.cfg.max_num_batched_tokens
    }

    /// Whether the streak step's `growth` blocks can be taken in its order (the `planned`
    /// entries, then the members in the boundary bucket) to the same effect as in the running
    /// order. Either every allocation takes a block with no content, evicting nothing; or, with
    /// no entry planned (so nothing is cached between the allocations), every allocation
    /// succeeds and the cache evicts its oldest blocks: the same ones in the same order
    /// whichever member asks first (blocks are counts: which request holds which is not kept).
    /// A planned entry could cache a block that an earlier allocation, one at a time, would
    /// have evicted first.
    pub(super) fn streak_fits(&self, growth: u64, planned: bool) -> bool {
        growth <= self.pool.clean_blocks() || (!planned && growth <= self.pool.free_blocks())
    }

    /// Whether no member's token of streak step `j` can come out as an output.
    pub(super) fn no_notes(&self, j: u64) -> bool {
        NotePhase::of(self, j).quiet(&self.streak.notes)
    }

    /// The turns ahead, if nothing from outside reaches this engine: into `ends`, the end of
    /// the step in flight, then the end of each step launched by a quiet turn, at most
    /// `turns_max` of them. So `ends[i]`, for `i < ends.len() - 1`, is when the `i`-th turn
    /// ahead comes and is quiet, and launches the step that ends at `ends[i + 1]`; the last end
    /// is a step's whose turn may not be quiet. Empty where not even the next turn is known
    /// to be. One step in flight at a time only (`window` 1), whose start is its predecessor's
    /// end; and only growth that takes blocks with no content, which no turn ahead can change.
    pub fn coast_ends(&mut self, turns_max: u32, ends: &mut Vec<u64>) {
        ends.clear();
        self.find_ends(turns_max, ends);
    }

    /// Whether `coast_ends` can ever name a turn: with one step in flight at a time only, as
    /// `find_ends` asks.
    pub fn may_coast(&self) -> bool {
        self.cfg.window == 1
    }

    /// The turns at `ends` in one call, as `turn` takes them one by one: step `step`, in
    /// flight, ends at `ends[0]`, and the step each turn launches (the next step) at the next
    /// tick. `ends` is a run of what `coast_ends` found, and nothing has called in since: each
    /// step's time is the span between its ticks (checked against the step's shape with debug
    /// assertions). Counts the turns up to the first that is not quiet: only the first can be,
    /// where the caller's last call was not a turn (`turn` takes it and may find it so); each
    /// one's report is the one `Turned::report` implies (checked with debug assertions). After
    /// one turn (this call's first, or the caller's last call, `after_turn`), what only
    /// something from outside changes still holds and no one waits, and `coast_ends` found the
    /// rest quiet, so each turn does only what changes (`turns_again`).
    pub fn turns_at(&mut self, step: u64, ends: &[u64], after_turn: bool) -> Turned {
        if after_turn {
            return self.turns_again(step, ends);
        }
        let [now_ns, ref rest @ ..] = *ends else {
            return Turned::NONE;
        };
        if rest.is_empty() {
            return Turned::NONE;
        }
        let Some((first, d)) = self.turn(now_ns, step) else {
            return Turned::NONE;
        };
        debug_assert_eq!(d.end_ns, rest[0], "the turn launched the step found");
        debug_assert_eq!(d.step, step + 1, "the turn launched the next step");
        let again = self.turns_again(d.step, rest);
        // The step the first turn launched, reported by the second, is a streak step of the
        // members, from tick to tick, as each later one is.
        debug_assert!(
            again.count == 0 || again.first.tokens == again.tokens_after,
            "the second turn's step is the streak's"
        );
        let tokens_after = match again.count {
            0 => self.streak.members as u64,
            _ => again.tokens_after,
        };
        let turned = Turned {
            count: 1 + again.count,
            first,
            tokens_after,
        };
        debug_assert!(
            again.count == 0 || again.first == turned.report(1, ends),
            "the second turn's report is implied"
        );
        turned
    }

    /// `turn` at each tick of `ends` but the last, right after a quiet `turn` with nothing
    /// from outside since: the conditions `turn_still` checks still hold, and the pass's
    /// `admit_waiting`, with no one waiting and the waiting front's run forgotten, changes
    /// nothing. Every one of these turns is quiet: `coast_ends` found them so by the streak's
    /// own reckoning (`quiet_steps`, within the first member to leave), and nothing has called
    /// in since, so nothing it read has changed. Debug builds check each turn again, as `turn`
    /// would (`StillQuiet`). A turn only does what changes: the boundary's blocks, the step in
    /// flight's end, and the next streak step in its place (the same step `launch` would put
    /// there: no entries, the streak's members), which ends at the next tick. What only adds
    /// up (the counts, the clock, the streak's numbers) is added once for a run of turns
    /// (`Taken`), at the end; the step in flight is put back once.
    fn turns_again(&mut self, step: u64, ends: &[u64]) -> Turned {
        let Some(s) = self.inflight.front() else {
            return Turned::NONE;
        };
        debug_assert!(self.turn_still(s));
        let [first_ns, ..] = *ends else {
            return Turned::NONE;
        };
        // A streak step with no members launches none (`streak_launch`): never coasted.
        if s.id != step || s.end_ns != first_ns || self.streak.members == 0 {
            return Turned::NONE;
        }
        let t = Taken::new(self, s, step);
        let taken = ends.len() - 1;
        if taken == 0 {
            return Turned::NONE;
        }
        let mut bucket = self.streak.bucket;
        #[cfg(debug_assertions)]
        let mut quiet = StillQuiet::new(self, &t);
        for (i, tick) in ends.windows(2).enumerate() {
            let (now_ns, next_ns) = (tick[0], tick[1]);
            #[cfg(debug_assertions)]
            quiet.check(self, i as u64, tick, bucket);
            debug_assert!(!self.at_boundary, "the turn before left no boundary");
            // A boundary's blocks are counted, not given to the members (`growth.rs`): the
            // counts of the turns before it may wait.
            self.streak_grow(bucket, now_ns);
            debug_assert_eq!(
                Some(next_ns - now_ns),
                (self.streak_kv(t.dispatched + i as u64)).map(|kv| self
                    .costing
                    .step_ns(StepShape::decode_only(t.members as u64, kv))),
                "the step found"
            );
            bucket += 1;
            if bucket == self.cfg.block_tokens as usize {
                bucket = 0;
            }
        }
        t.add_to(self, taken, ends);
        debug_assert_eq!(self.streak.bucket, bucket);
        let s = self.inflight.front_mut().expect("a step in flight");
        s.id = t.step_next + taken as u64 - 1;
        (s.end_ns, s.duration_ns) = (ends[taken], ends[taken] - ends[taken - 1]);
        (s.streak, s.streak_step) = (t.members, t.streak_step + taken as u64);
        Turned {
            count: taken,
            first: t.first_report(),
            tokens_after: t.members as u64,
        }
    }

    fn find_ends(&self, turns_max: u32, ends: &mut Vec<u64>) {
        let Some(s) = self.inflight.front() else {
            return;
        };
        let k = &self.streak;
        let members = k.members as u64;
        if !self.may_coast()
            || !self.turn_still(s)
            || s.streak_step != k.processed
            || s.end_ns != self.gpu_free_ns
        {
            return;
        }
        // A left member's entry may head `ends` still: an earlier stop, never a later one.
        let last_from = k.ends.peek().map_or(u64::MAX, |e| e.0 .0);
        let steps = (turns_max as u64).min(last_from.saturating_sub(k.dispatched));
        let Some(kv0) = self.streak_kv(k.dispatched) else {
            return;
        };
        ends.reserve(steps as usize + 1);
        ends.push(s.end_ns);
        // The steps first, then their times: two short loops, where one long one kept more
        // values than there are registers. The KV read grows by one token a member each step
        // (`streak_kv`), so it stays at least `kv0`.
        let quiet = self.quiet_steps(steps);
        let mut times = self.costing.streak_times(members, kv0, steps);
        times.extend_ends(quiet, s.end_ns, ends);
        #[cfg(debug_assertions)]
        for (d, end) in (k.dispatched..).zip(ends.windows(2)) {
            let kv = self.streak_kv(d).expect("a quiet step's KV read");
            let shape = StepShape::decode_only(members, kv);
            assert_eq!(
                end[1] - end[0],
                self.costing.step_ns(shape),
                "the step timed"
            );
        }
        if ends.len() == 1 {
            ends.clear();
        }
    }

    /// How many of the next `steps` streak steps are quiet by the streak's own reckoning: no
    /// member's token comes out as an output, and each block boundary's blocks are clean ones.
    /// Both repeat, the notes every `lazy_output_every` steps and the boundaries every
    /// `block_tokens`, so each is found within one period rather than step by step.
    fn quiet_steps(&self, steps: u64) -> u64 {
        let k = &self.streak;
        let noted = NotePhase::of(self, k.processed).first_noted(&k.notes, steps);
        noted.min(self.blocks_last(noted))
    }

    /// The first of the next streak steps whose boundary's blocks are more than the clean ones
    /// left after the steps before it; `u64::MAX` where none of the next `steps` is. Each
    /// member is in one boundary bucket, so a period of `block_tokens` steps takes a block a
    /// member.
    fn blocks_last(&self, steps: u64) -> u64 {
        let k = &self.streak;
        let block_tokens = self.cfg.block_tokens as usize;
        let period = k.members as u64;
        debug_assert_eq!(
            period,
            k.boundary.iter().map(Vec::len).sum::<usize>() as u64,
            "each member in one boundary bucket"
        );
        let clean = self.pool.clean_blocks();
        if period == 0 || clean / period > steps / block_tokens as u64 {
            // Every step of `steps` (within whole periods) finds its blocks.
            return u64::MAX;
        }
        // Whole periods, then the steps of the next one while their blocks are at hand, up to
        // `steps`: it stops within that period, since what is left is less than one takes.
        let periods = clean / period;
        let mut left = clean - periods * period;
        let mut bucket = k.bucket % block_tokens;
        let mut i = periods * block_tokens as u64;
        while i < steps {
            let growth = k.boundary_blocks(bucket);
            if growth > left {
                return i;
            }
            left -= growth;
            i += 1;
            bucket += 1;
            if bucket == block_tokens {
                bucket = 0;
            }
        }
        u64::MAX
    }
}

/// A streak step's phase among the notes buckets (`no_notes`), stepped on with the streak
/// rather than found by division each step.
struct NotePhase {
    every: u64,
    at: u64,
}

impl NotePhase {
    fn of(engine: &Engine, j: u64) -> NotePhase {
        let every = engine.cfg.lazy_output_every as u64;
        let at = if every == 0 { 0 } else { j % every };
        NotePhase { every, at }
    }

    /// The first of the next `steps` streak steps from this phase on whose notes bucket holds
    /// a member, or `steps`: the buckets repeat, so at most `every` of them are read.
    fn first_noted(mut self, notes: &[Vec<u32>], steps: u64) -> u64 {
        for i in 0..steps.min(self.every) {
            if !self.quiet(notes) {
                return i;
            }
            self.next();
        }
        steps
    }

    /// `no_notes` of this phase's step.
    #[inline(always)]
    fn quiet(&self, notes: &[Vec<u32>]) -> bool {
        self.every == 0 || notes.get(self.at as usize).is_none_or(Vec::is_empty)
    }

    /// The next streak step's phase.
    #[inline(always)]
    fn next(&mut self) {
        self.at += 1;
        if self.at == self.every {
            self.at = 0;
        }
    }
}

/// `turns_again`'s precondition, checked turn by turn in debug builds, as `turn` checks it
/// and independently of `quiet_steps`, which found the turns: the ticks in order, none past
/// the first member to leave, no member's output, and the boundary's blocks at hand.
#[cfg(debug_assertions)]
struct StillQuiet {
    last_from: u64,
    note: NotePhase,
    dispatched: u64,
}

#[cfg(debug_assertions)]
impl StillQuiet {
    fn new(e: &Engine, t: &Taken) -> StillQuiet {
        StillQuiet {
            last_from: e.streak.ends.peek().map_or(u64::MAX, |e| e.0 .0),
            note: NotePhase::of(e, t.streak_step),
            dispatched: t.dispatched,
        }
    }

    /// Turn `i` of the run, at `tick[0]`, launching the step that ends at `tick[1]`, its
    /// members' boundary bucket `bucket`: before its blocks are taken.
    fn check(&mut self, e: &Engine, i: u64, tick: &[u64], bucket: usize) {
        let growth = e.streak.boundary_blocks(bucket);
        assert!(tick[1] >= tick[0], "a coasted turn's ticks in order");
        assert!(
            self.dispatched + i < self.last_from,
            "a coasted turn before any leaves"
        );
        assert!(
            self.note.quiet(&e.streak.notes),
            "a coasted turn with no output"
        );
        assert!(
            e.streak_fits(growth, false),
            "a coasted turn's blocks at hand"
        );
        self.note.next();
    }
}

/// A run of quiet turns taken by `turns_again`, the first ending step `step`: what each adds
/// to the engine's counts, clock and streak numbers, added for the whole run once it is taken
/// (`add_to`), as the turns' `turn`s one by one would have added it.
struct Taken {
    step: u64,
    /// The step in flight's: its time, tokens and streak step.
    duration_ns: u64,
    tokens: u64,
    streak_step: u64,
    /// At the start: the next step's number, and the streak's next step.
    step_next: u64,
    dispatched: u64,
    members: u32,
}

impl Taken {
    fn new(e: &Engine, s: &Step, step: u64) -> Taken {
        assert_eq!(
            s.streak_step, e.streak.processed,
            "streak steps end in order"
        );
        debug_assert_eq!(e.gpu_free_ns, s.end_ns, "one step in flight");
        debug_assert_eq!(
            e.step_next,
            step + 1,
            "the step in flight is the last launched"
        );
        Taken {
            step,
            duration_ns: s.duration_ns,
            tokens: s.streak as u64,
            streak_step: s.streak_step,
            step_next: e.step_next,
            dispatched: e.streak.dispatched,
            members: e.streak.members,
        }
    }

    /// The step that ends at turn `i`: the one in flight, then each turn's launch.
    #[inline(always)]
    fn ended_step(&self, i: usize) -> u64 {
        match i {
            0 => self.step,
            _ => self.step_next + i as u64 - 1,
        }
    }

    /// The report of the first turn: the step in flight's. Each later one's is implied
    /// (`Turned::report`): step `step_next + i - 1`, which is `step + i`, between its ticks,
    /// of the members, the next streak step.
    fn first_report(&self) -> StepReport {
        StepReport {
            step: self.step,
            duration_ns: self.duration_ns,
            tokens: self.tokens,
            streak: Some(self.streak_step),
        }
    }

    /// The run's first `taken` turns, added to `e`: the ends of their steps (their tokens
    /// delivered, their streak steps processed, the blocks they fenced clean), then their
    /// launches, each of the streak's step at its tick (`clock`).
    fn add_to(&self, e: &mut Engine, taken: usize, ends: &[u64]) {
        assert!(taken > 0, "a run of no turns");
        let n = taken as u64;
        e.stats.tokens_delivered += self.tokens + (n - 1) * self.members as u64;
        e.streak.processed += n;
        e.taint.step_ended(self.ended_step(taken - 1));
        debug_assert_eq!(e.gpu_free_ns, ends[0]);
        e.gpu_free_ns = ends[taken];
        e.step_next += n;
        e.stats.steps += n;
        e.stats.busy_ns += ends[taken] - ends[0];
        let k = &mut e.streak;
        k.dispatched += n;
        k.bucket = ((k.bucket as u64 + n) % e.cfg.block_tokens as u64) as usize;
    }
}
