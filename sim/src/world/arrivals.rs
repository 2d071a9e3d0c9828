//! The open-loop source of a run: the next arrival is always in the queue, one at a time, so a
//! million-request trace never sits in memory. It also hashes every arrival, conversations' too,
//! into the run's `workload_hash`.

use std::collections::BTreeMap;

use super::error::{Step, Stop};
use super::event::Event;
use super::event::Tag;
use super::follow::Follow;
use crate::scenario::{Scenario, Source, Workload};
use crate::workload::{self, Arrival, OpenLoop, TraceReader};

/// The client's own timers of request `(id, tag)`: its deadline and its disconnect, if the
/// workload has them.
pub(crate) fn client_timers(f: &mut Follow, w: &Workload, seed: u64, (id, tag): (u64, Tag)) {
    let (deadline, disconnect) = workload::timing(w, seed, id);
    // Weak: a request that left does not keep the run alive with its client's timers.
    if let Some(d) = deadline {
        f.weak_after(d, Event::Deadline { request: id, tag });
    }
    if let Some(d) = disconnect {
        f.weak_after(d, Event::Disconnect { request: id, tag });
    }
}

pub(crate) struct Arrivals {
    open: Option<OpenLoop>,
    pending: Option<Arrival>,
    /// The shared-prefix block ids of the pending arrival, then of the one taken last.
    pending_prefix: Box<[u64]>,
    taken_prefix: (u64, Box<[u64]>),
    /// Those of arrivals waiting in a shared queue at the router, until they reach a replica
    /// (at most the router queue's bound of them).
    held_prefix: BTreeMap<u64, Box<[u64]>>,
    hasher: crate::kernel::BufferedHasher,
}

impl Arrivals {
    pub fn new(s: &Scenario, seed: u64, trace: Option<TraceReader>) -> Result<Arrivals, String> {
        Ok(Arrivals {
            open: OpenLoop::new(s, seed, trace)?,
            pending: None,
            pending_prefix: Box::default(),
            taken_prefix: (u64::MAX, Box::default()),
            held_prefix: BTreeMap::new(),
            hasher: crate::kernel::BufferedHasher::default(),
        })
    }

    /// The first event of the run: the first open-loop arrival, conversation or job.
    pub fn begin(&mut self, f: &mut Follow, s: &Scenario, first_job_ns: u64) -> Step {
        if self.open.is_some() {
            return self.pull(f, s);
        }
        match s.workload.source {
            Source::Jobs { .. } | Source::AgentTrace { .. } => {
                f.at(first_job_ns, Event::JobStart { job: 0 })
            }
            _ => f.at(0, Event::ConversationStart { conv: 0 }),
        }
        Ok(())
    }

    /// Schedule the source's next arrival, if any.
    pub fn pull(&mut self, f: &mut Follow, s: &Scenario) -> Step {
        let open = self.open.as_mut().expect("open-loop source");
        if let Some(a) = open.next(&s.workload).map_err(Stop::Input)? {
            self.pending = Some(a);
            self.pending_prefix = open.prefix_ids().into();
            f.at(a.time_ns, Event::Arrival { request: a.id });
        }
        Ok(())
    }

    /// The pending arrival, now due.
    pub fn take(&mut self, request: u64) -> Arrival {
        let a = self.pending.take().expect("an arrival is pending");
        assert_eq!(a.id, request, "arrivals taken out of order");
        self.taken_prefix = (a.id, std::mem::take(&mut self.pending_prefix));
        a
    }

    /// A job's recorded call `id` arrives now with these block ids (it is the one taken last).
    pub fn give_prefix(&mut self, id: u64, ids: Box<[u64]>) {
        self.taken_prefix = (id, ids);
    }

    /// The shared-prefix block ids of arrival `id` if it is the one taken last or waits at the
    /// router; else none.
    pub fn prefix_of(&self, id: u64) -> &[u64] {
        match &self.taken_prefix {
            (taken, ids) if *taken == id => ids,
            _ => self.held_prefix.get(&id).map_or(&[], |ids| ids),
        }
    }

    /// Arrival `id`, just taken, waits in the router's shared queue: its block ids are kept for
    /// the replica it reaches later (the next arrival replaces the last one's).
    pub fn hold_prefix(&mut self, id: u64) {
        match &self.taken_prefix {
            (taken, ids) if *taken == id && !ids.is_empty() => {
                self.held_prefix.insert(id, ids.clone());
            }
            _ => {}
        }
    }

    /// Arrival `id` left the router's shared queue (to a replica, or cancelled there).
    pub fn release_prefix(&mut self, id: u64) {
        self.held_prefix.remove(&id);
    }

    /// Fold an arrival into the workload hash: equal across runs that share a workload.
    pub fn hash(&mut self, a: &Arrival) {
        let mut arrival = [0u8; 24];
        arrival[..8].copy_from_slice(&a.id.to_le_bytes());
        arrival[8..16].copy_from_slice(&a.time_ns.to_le_bytes());
        arrival[16..20].copy_from_slice(&a.prompt_tokens.to_le_bytes());
        arrival[20..].copy_from_slice(&a.output_tokens.to_le_bytes());
        self.hasher.update(&arrival);
        let ids = match &self.taken_prefix {
            (taken, ids) if *taken == a.id => &ids[..],
            _ => &[],
        };
        for id in ids {
            self.hasher.update(&id.to_le_bytes());
        }
    }

    pub fn workload_hash(&self) -> String {
        self.hasher.finalize().to_hex().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "out of order")]
    fn an_arrival_taken_out_of_order() {
        let s = Scenario::default_embedded();
        let mut a = Arrivals::new(&s, 1, None).unwrap();
        let mut f = Follow::default();
        a.begin(&mut f, &s, 0).unwrap();
        let pending = a.pending.expect("a first arrival").id;
        a.take(pending + 1);
    }
}
