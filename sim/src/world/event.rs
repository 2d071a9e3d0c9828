//! The one closed event enum of a run, and what the run hash sees of each event.

use cancelsim_models::protocol::Scope;

use crate::kernel::{Class, Traced};

/// A slab index: the handle a replica echoes in every output and release (the requests' slab,
/// `requests.rs`, hands them out). Defined here, with the events that carry it, so the components
/// that name a request need not import the slab.
pub(crate) type Tag = u32;

/// Why a request got a cancel intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    Storm,
    Deadline,
    Disconnect,
    Interruption,
    /// The playback sink expired a held chunk, or gave up on a blocked one.
    Playback,
    /// The request's durable job was cancelled: its worker closes the provider stream.
    Job,
}

/// Every event of a run. Closed: adding a variant forces every `match` to say what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The pending open-loop arrival (request `request`) enters.
    Arrival {
        request: u64,
    },
    ConversationStart {
        conv: u64,
    },
    TurnStart {
        conv: u64,
    },
    /// The user of `conv` barges in on generation `generation`.
    BargeIn {
        conv: u64,
        generation: u32,
    },
    /// Step `step` of `replica` ends; its outputs are processed.
    StepDone {
        replica: u32,
        step: u64,
    },
    /// The scheduler of `replica` checks for aborts, then composes and dispatches steps.
    SchedulePass {
        replica: u32,
    },
    BatcherTimer {
        replica: u32,
    },
    Deadline {
        request: u64,
        tag: Tag,
    },
    Disconnect {
        request: u64,
        tag: Tag,
    },
    /// A storm target reaches the moment of its cancel intent.
    Intent {
        request: u64,
        tag: Tag,
    },
    /// The adapter submits cancel attempt `attempt`.
    CancelSubmit {
        request: u64,
        tag: Tag,
        attempt: u8,
    },
    /// A cancel attempt reaches the backend of `replica`.
    CancelDeliver {
        request: u64,
        replica: u32,
        scope: Scope,
        attempt: u8,
    },
    CancelTimeout {
        request: u64,
        tag: Tag,
        attempt: u8,
    },
    /// The backend's acknowledgement of an observed cancel reaches the adapter.
    CancelAck {
        request: u64,
        tag: Tag,
    },
    /// The fallback bound of `PerRequestWithFallback` runs out.
    Fallback {
        request: u64,
        tag: Tag,
    },
    /// A held chunk's writer wait is over: check its admission.
    ChunkAdmit {
        request: u64,
        tag: Tag,
        born_ns: u64,
        epoch: u64,
        retry: u8,
    },
    /// A playback clear of `owner`'s sink is acknowledged.
    BarrierAck {
        owner: u64,
        epoch: u64,
    },
    /// A prefilled request reaches the decode stage (it crossed the prefill-to-decode link).
    Handoff {
        request: u64,
        tag: Tag,
    },
    /// A KV transfer on the wire of prefill replica `prefill` lands (or ends, cancelled).
    KvLanded {
        request: u64,
        prefill: u32,
    },
    /// A handoff message reaches the cleanup owner of `replica`: a completion notice, or a
    /// cancel (`cancel`).
    Notice {
        request: u64,
        replica: u32,
        cancel: bool,
    },
    /// A lease of `replica`'s cleanup owner may have run out.
    LeaseCheck {
        replica: u32,
    },
    /// The frontend found a stop string in `request`'s output: its abort reaches the engine.
    StopAbort {
        request: u64,
        tag: Tag,
    },
    /// The hang detector looks at `replica`, wedged since `since_ns`.
    HangCheck {
        replica: u32,
        since_ns: u64,
    },
    /// Durable agent job `job` is accepted.
    JobStart {
        job: u64,
    },
    /// The tool wave or approval wait `serial` of `job` ends.
    JobTimer {
        job: u64,
        serial: u32,
    },
    /// The client's cancel of `job` arrives (`copy` > 0: a duplicate, same idempotency key).
    JobCancel {
        job: u64,
        copy: u8,
    },
    /// `job`'s deadline from acceptance.
    JobDeadline {
        job: u64,
    },
    /// `job`'s worker learns of its terminal decision (notification or poll).
    JobObserve {
        job: u64,
    },
    /// `job`'s local cleanup is done, or (`give_up`) its worker runs out of allowances.
    JobCleanup {
        job: u64,
        give_up: bool,
    },
    /// `job`'s observer disconnects.
    JobObserverLeft {
        job: u64,
    },
    /// `job`'s observer reconnects (a GET of its events).
    JobObserverBack {
        job: u64,
    },
}

impl Event {
    /// Its tie class at one tick (`kernel::Class`): output first, then control, arrivals, and
    /// scheduler passes last. One class per kind, so no call site picks it.
    pub fn class(&self) -> Class {
        match self {
            Event::StepDone { .. } | Event::KvLanded { .. } => Class::Completion,
            Event::Arrival { .. }
            | Event::ConversationStart { .. }
            | Event::TurnStart { .. }
            | Event::JobStart { .. } => Class::Arrival,
            Event::SchedulePass { .. } | Event::BatcherTimer { .. } => Class::Schedule,
            Event::BargeIn { .. }
            | Event::Deadline { .. }
            | Event::Disconnect { .. }
            | Event::Intent { .. }
            | Event::CancelSubmit { .. }
            | Event::CancelDeliver { .. }
            | Event::CancelTimeout { .. }
            | Event::CancelAck { .. }
            | Event::Fallback { .. }
            | Event::ChunkAdmit { .. }
            | Event::BarrierAck { .. }
            | Event::Handoff { .. }
            | Event::Notice { .. }
            | Event::LeaseCheck { .. }
            | Event::StopAbort { .. }
            | Event::HangCheck { .. }
            | Event::JobTimer { .. }
            | Event::JobCancel { .. }
            | Event::JobDeadline { .. }
            | Event::JobObserve { .. }
            | Event::JobCleanup { .. }
            | Event::JobObserverLeft { .. }
            | Event::JobObserverBack { .. } => Class::Control,
        }
    }
}

impl Traced for Event {
    /// The kind's code in the run hash. Append-only: never renumber or reuse a code, or every
    /// golden hash changes; a new kind takes the next number.
    fn kind_code(&self) -> u8 {
        match self {
            Event::Arrival { .. } => 1,
            Event::ConversationStart { .. } => 2,
            Event::TurnStart { .. } => 3,
            Event::BargeIn { .. } => 4,
            Event::StepDone { .. } => 5,
            Event::SchedulePass { .. } => 6,
            Event::BatcherTimer { .. } => 7,
            Event::Deadline { .. } => 8,
            Event::Disconnect { .. } => 9,
            Event::Intent { .. } => 10,
            Event::CancelSubmit { .. } => 11,
            Event::CancelDeliver { .. } => 12,
            Event::CancelTimeout { .. } => 13,
            Event::CancelAck { .. } => 14,
            Event::Fallback { .. } => 15,
            Event::ChunkAdmit { .. } => 16,
            Event::BarrierAck { .. } => 17,
            Event::Handoff { .. } => 18,
            Event::KvLanded { .. } => 19,
            Event::Notice { .. } => 20,
            Event::LeaseCheck { .. } => 21,
            Event::HangCheck { .. } => 22,
            Event::StopAbort { .. } => 23,
            Event::JobStart { .. } => 24,
            Event::JobTimer { .. } => 25,
            Event::JobCancel { .. } => 26,
            Event::JobDeadline { .. } => 27,
            Event::JobObserve { .. } => 28,
            Event::JobCleanup { .. } => 29,
            Event::JobObserverLeft { .. } => 30,
            Event::JobObserverBack { .. } => 31,
        }
    }

    fn entity(&self) -> u64 {
        match *self {
            Event::Arrival { request } => request,
            Event::ConversationStart { conv } | Event::TurnStart { conv } => conv,
            Event::BargeIn { conv, generation } => (conv << 16) | generation as u64,
            Event::StepDone { replica, step } => ((replica as u64) << 48) | step,
            Event::SchedulePass { replica } | Event::BatcherTimer { replica } => replica as u64,
            Event::Deadline { request, .. }
            | Event::Disconnect { request, .. }
            | Event::Intent { request, .. }
            | Event::CancelSubmit { request, .. }
            | Event::CancelDeliver { request, .. }
            | Event::CancelTimeout { request, .. }
            | Event::CancelAck { request, .. }
            | Event::Fallback { request, .. }
            | Event::ChunkAdmit { request, .. }
            | Event::Handoff { request, .. }
            | Event::KvLanded { request, .. }
            | Event::Notice { request, .. }
            | Event::StopAbort { request, .. } => request,
            Event::BarrierAck { owner, .. } => owner,
            Event::LeaseCheck { replica } | Event::HangCheck { replica, .. } => replica as u64,
            Event::JobStart { job }
            | Event::JobDeadline { job }
            | Event::JobObserve { job }
            | Event::JobCleanup { job, .. }
            | Event::JobObserverLeft { job }
            | Event::JobObserverBack { job } => job,
            Event::JobTimer { job, serial } => (job << 24) | serial as u64,
            Event::JobCancel { job, copy } => (job << 8) | copy as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_event_stays_four_words() {
        // The queue's entries are an event and a 16-byte rank: 48 bytes while this holds.
        assert!(std::mem::size_of::<super::Event>() <= 32);
    }
}
