//! Lazy requests: those whose output tokens nothing in the world reads one by one while they
//! decode, so their replica may advance them in its streak with no output a token
//! (`NewRequest::lazy`), and hand the tokens over later, in order (`Implicit`). Each token then
//! goes through what an output of it would have gone through (its share of its step, the sink,
//! its chunks through the controller), so the books and every request's outcome are the same;
//! only when differs, and nothing reads it until the hand-over.
//!
//! A request is lazy when nothing reads its tokens one by one: no stop string, no conversation
//! or job, and no cancel intent yet. A storm target or a request with a client timer may be
//! lazy: every stage its plan waits for is an output (its first and last tokens) or an event,
//! and its intent, when it comes, asks for its tokens first. (A prefill replica's
//! request samples one token, so it never rides a streak; its decode replica's may.) Where the
//! sink's chunks wait for their writer, each is an event of the run: the token that makes one
//! still comes out as an output (`EngineConfig::lazy_output_every`). Whatever would still need
//! its outputs (a cancel intent) asks the replica for them first (`World::make_explicit`); the
//! replica's own records of it (a release, an abort observed) come after its hand-over in the
//! same outbox.
//!
//! Each replica's streak steps are shared out as any step is: the world keeps each streak
//! step's share of a token (`ShareLog`), back to the earliest one a member may still hand over.

use std::collections::VecDeque;

use cancelsim_models::protocol::Implicit;

use crate::record::StreakCounts;

use super::cluster::Cluster;
use super::error::{Step, Stop};
use super::requests::Tag;
use super::World;

/// One replica's streak steps' token shares, from streak step `base` on.
#[derive(Default)]
struct ShareLog {
    base: u64,
    shares: VecDeque<f64>,
    /// Past this many shares, ask the replica what it still needs.
    trim_at: usize,
}

/// Shares kept before the first trim; after one, twice what was left.
const TRIM_AT_LEAST: usize = 256;

/// The streak steps' shares, by replica.
#[derive(Default)]
pub(crate) struct Lazy {
    logs: Vec<ShareLog>,
    /// No request rides a streak (`World::without_streak`).
    off: bool,
    counts: StreakCounts,
}

impl Lazy {
    /// Every request steps one output a token: the engine as it was before the streak.
    pub fn turn_off(&mut self) {
        self.off = true;
    }

    pub fn is_off(&self) -> bool {
        self.off
    }

    pub fn counts(&self) -> StreakCounts {
        self.counts
    }

    /// Streak steps `first`, `first + 1`, … of `replica` ended: each member's token in each
    /// costs that step's share. True if the log should be trimmed (`trim`).
    pub fn record(&mut self, replica: u32, first: u64, shares: impl Iterator<Item = f64>) -> bool {
        let r = replica as usize;
        if self.logs.len() <= r {
            self.logs.resize_with(r + 1, ShareLog::default);
        }
        let log = &mut self.logs[r];
        assert_eq!(
            first,
            log.base + log.shares.len() as u64,
            "streak steps recorded in order"
        );
        log.shares.extend(shares);
        log.shares.len() > log.trim_at.max(TRIM_AT_LEAST)
    }

    /// `record`, then, where the log grew enough, forget what `replica`'s streak no longer
    /// needs (`trim` to its floor). A run of streak steps (a coast's) is trimmed once, after:
    /// the shares it keeps are the same, since the floor does not move while no member leaves.
    pub fn record_streak(
        &mut self,
        cluster: &Cluster,
        replica: u32,
        first: u64,
        shares: impl Iterator<Item = f64>,
    ) {
        if self.record(replica, first, shares) {
            let floor = cluster.streak_floor(replica);
            self.trim(replica, floor.expect("a replica with a streak"));
        }
    }

    /// Forget `replica`'s shares before streak step `floor`: no member can hand those over.
    pub fn trim(&mut self, replica: u32, floor: u64) {
        let log = &mut self.logs[replica as usize];
        let drop = floor.saturating_sub(log.base).min(log.shares.len() as u64);
        log.shares.drain(..drop as usize);
        log.base += drop;
        log.trim_at = 2 * log.shares.len();
        // A long request's shares made room that the next ones may not need: give it back, so
        // a long run's memory follows what is in flight, not the longest it ever had.
        let keep = 2 * log.trim_at.max(TRIM_AT_LEAST);
        if log.shares.capacity() > 2 * keep {
            log.shares.shrink_to(keep);
        }
    }

    /// The shares of `replica`'s streak steps `from..from + count`, in order, in two parts.
    fn shares(&self, replica: u32, from: u64, count: u32) -> Option<[&[f64]; 2]> {
        let log = self.logs.get(replica as usize)?;
        let i = from.checked_sub(log.base)? as usize;
        let end = i + count as usize;
        if end > log.shares.len() {
            return None;
        }
        let (a, b) = log.shares.as_slices();
        Some(if end <= a.len() {
            [&a[i..end], &[]]
        } else if i >= a.len() {
            [&b[i - a.len()..end - a.len()], &[]]
        } else {
            [&a[i..], &b[..end - a.len()]]
        })
    }
}

impl World<'_> {
    /// Whether request `tag`, entering a replica, may ride its streak (see the module).
    pub(super) fn lazy_ok(&self, tag: Tag) -> bool {
        let q = &self.requests[tag];
        !self.lazy.off
            && self.jobs.is_none()
            && q.conv().is_none()
            && q.cancel().intent_ns().is_none()
            && q.stop_detect_ns().is_none()
    }

    /// A streak step of `replica` ended, each member's token costing `share`.
    /// The log is trimmed here only if nothing handed over is still unread: call it once the
    /// outbox's hand-overs were processed (`implicit_all`).
    pub(super) fn streak_step(&mut self, replica: u32, step: u64, share: f64) {
        let share = std::iter::once(share);
        self.lazy.record_streak(&self.cluster, replica, step, share);
    }

    /// The world needs every output of request `tag` from now on: its replica hands over what
    /// it had not.
    pub(super) fn make_explicit(&mut self, tag: Tag) -> Step {
        let q = &self.requests[tag];
        if !q.life.enqueued() || q.life.engine_released() {
            return Ok(());
        }
        let replica = q.replica;
        self.reach(replica)?;
        match self.cluster.make_explicit(replica, tag) {
            Some(i) => {
                self.lazy.counts.tokens_at_intent += i.count as u64;
                self.on_implicit(i)
            }
            None => Ok(()),
        }
    }

    /// The tokens handed over, as their outputs would have been processed one by one: each
    /// its share of its step, into the request's life and its sink, whose chunks then pass the
    /// controller (all at once where each would pass at once, `PlaybackSink::play_run`).
    pub(super) fn on_implicit(&mut self, i: Implicit) -> Step {
        if !self.requests.live(i.id, i.tag) {
            let what = "tokens handed over for a request that is not here";
            return Err(Stop::broken(vec![i.id], what));
        }
        let q = &mut self.requests[i.tag];
        let Some(shares) = self.lazy.shares(q.replica, i.from, i.count) else {
            let what = format!(
                "no shares kept for streak steps {}..+{} of replica {}",
                i.from, i.count, q.replica
            );
            return Err(Stop::broken(vec![i.id], what));
        };
        let (cost, cancel) = q.cost_and_cancel();
        assert!(
            cancel.intent_ns().is_none(),
            "a lazy request with an intent"
        );
        cost.stepped_each(shares);
        self.accounts.implicit_tokens(i.count);
        self.lazy.counts.tokens += i.count as u64;
        let last = q.life.tokens() + i.count;
        assert!(
            last < q.output && !q.life.terminal(),
            "a lazy request's last token, or one after its end, handed over"
        );
        q.life.tokens_to(last);
        if self.sink.tokens(&mut q.chunks, i.count) == 0 {
            return Ok(());
        }
        if !self.sink.admits_at_once() {
            // A chunk that waits for its writer is made by an output, never handed over.
            let what = "a chunk made by tokens handed over, with a writer's wait";
            return Err(Stop::broken(vec![i.id], what));
        }
        let who = q.chunk_owner();
        self.owners_for(i.tag)?;
        if self
            .sink
            .play_run(&mut self.owners, who, &mut self.requests[i.tag].chunks)
        {
            return Ok(());
        }
        self.hold_next_chunk(i.tag)
    }

    /// A step of `replica` ended (streak step `streak`, each member's token costing `share`):
    /// its share into the log, every hand-over in `implicit`, then the log's trim if due.
    pub(super) fn implicit_all_with(
        &mut self,
        implicit: &mut Vec<Implicit>,
        (replica, streak, share): (u32, Option<u64>, f64),
    ) -> Step {
        let trim =
            streak.is_some_and(|step| self.lazy.record(replica, step, std::iter::once(share)));
        self.implicit_all(implicit)?;
        if trim {
            let floor = self.cluster.streak_floor(replica);
            self.lazy
                .trim(replica, floor.expect("a replica with a streak"));
        }
        Ok(())
    }

    /// Every hand-over in `implicit`, first thing, then none.
    pub(super) fn implicit_all(&mut self, implicit: &mut Vec<Implicit>) -> Step {
        for &i in implicit.iter() {
            self.on_implicit(i)?;
        }
        implicit.clear();
        Ok(())
    }
}
