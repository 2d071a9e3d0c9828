//! The open-loop source of a run: the next arrival is always in the queue, one at a time, so a
//! million-request trace never sits in memory. It also hashes every arrival, conversations' too,
//! into the run's `workload_hash`.

use super::error::{Step, Stop};
use super::event::Event;
use crate::kernel::{Class, Kernel};
use crate::scenario::Scenario;
use crate::workload::{Arrival, OpenLoop};

pub(crate) struct Arrivals {
    open: Option<OpenLoop>,
    pending: Option<Arrival>,
    hasher: blake3::Hasher,
}

impl Arrivals {
    pub fn new(s: &Scenario, seed: u64) -> Result<Arrivals, String> {
        Ok(Arrivals {
            open: OpenLoop::new(s, seed)?,
            pending: None,
            hasher: blake3::Hasher::new(),
        })
    }

    /// The first event of the run: the first open-loop arrival, or the first conversation.
    pub fn begin(&mut self, k: &mut Kernel<Event>, s: &Scenario) -> Step {
        if self.open.is_some() {
            self.pull(k, s)
        } else {
            k.schedule_at(0, Class::Arrival, Event::ConversationStart { conv: 0 })?;
            Ok(())
        }
    }

    /// Schedule the source's next arrival, if any.
    pub fn pull(&mut self, k: &mut Kernel<Event>, s: &Scenario) -> Step {
        let open = self.open.as_mut().expect("open-loop source");
        if let Some(a) = open.next(&s.workload).map_err(Stop::Input)? {
            self.pending = Some(a);
            k.schedule_at(a.time_ns, Class::Arrival, Event::Arrival { request: a.id })?;
        }
        Ok(())
    }

    /// The pending arrival, now due.
    pub fn take(&mut self, request: u64) -> Arrival {
        let a = self.pending.take().expect("an arrival is pending");
        debug_assert_eq!(a.id, request);
        a
    }

    /// Fold an arrival into the workload hash: equal across runs that share a workload.
    pub fn hash(&mut self, a: &Arrival) {
        self.hasher.update(&a.id.to_le_bytes());
        self.hasher.update(&a.time_ns.to_le_bytes());
        self.hasher.update(&a.prompt_tokens.to_le_bytes());
        self.hasher.update(&a.output_tokens.to_le_bytes());
    }

    pub fn workload_hash(&self) -> String {
        self.hasher.finalize().to_hex().to_string()
    }
}
