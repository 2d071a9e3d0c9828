//! Coverage marks: the rare paths a run counts, so `check` can fail a scenario whose declared
//! path was never reached. One enum, one list, one spelling per mark.

use std::collections::BTreeMap;

macro_rules! marks {
    ($($variant:ident => $name:literal,)*) => {
        /// A rare path of a run.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Mark {
            $($variant,)*
        }

        impl Mark {
            /// Every mark, in the order the docs list them.
            pub const ALL: &'static [Mark] = &[$(Mark::$variant,)*];

            /// The mark as scenario files and `summary.json` spell it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Mark::$variant => $name,)*
                }
            }
        }
    };
}

marks! {
    StageBeforeAdmission => "stage.before_admission",
    StageQueued => "stage.queued",
    StagePrefill => "stage.prefill",
    StageDecode => "stage.decode",
    StageAfterFinalOutput => "stage.after_final_output",
    StageAfterCompletion => "stage.after_completion",
    StageAfterArrival => "stage.after_arrival",
    RaceCancelWon => "race.cancel_won",
    RaceCompletionWon => "race.completion_won",
    ScopeRequest => "scope.request",
    ScopeStream => "scope.stream",
    ScopeSequence => "scope.sequence",
    ScopePrefix => "scope.prefix",
    ScopeEngine => "scope.engine",
    EvidenceIntent => "evidence.intent",
    EvidenceLocalInvalidation => "evidence.local_invalidation",
    EvidenceCancelSubmission => "evidence.cancel_submission",
    EvidenceBackendObservation => "evidence.backend_observation",
    EvidenceFinalCallback => "evidence.final_callback",
    EvidenceResourceRelease => "evidence.resource_release",
    ReleaseAfterFence => "release.after_fence",
    ReleaseCorruptedNextOwner => "release.corrupted_next_owner",
    RpcRetry => "rpc.retry",
    RpcLost => "rpc.lost",
    RpcDuplicate => "rpc.duplicate",
    RpcLateCallback => "rpc.late_callback",
    RpcBudgetExhausted => "rpc.budget_exhausted",
    RpcUnknownAbort => "rpc.unknown_abort",
    RpcFallback => "rpc.fallback",
    Fault => "fault",
    CollateralKill => "collateral_kill",
    Preemption => "preemption",
    PlaybackBlocked => "playback.blocked",
    PlaybackExpired => "playback.expired",
    PlaybackSuppressed => "playback.suppressed",
    StageKvTransfer => "stage.kv_transfer",
    StageAwaitingRemoteKv => "stage.awaiting_remote_kv",
    HandoffAbortAtBoundary => "handoff.abort_at_boundary",
    HandoffPinnedForNobody => "handoff.pinned_for_nobody",
    HandoffStranded => "handoff.stranded",
    HandoffReceiveWait => "handoff.receive_wait",
    HandoffNoticeLost => "handoff.notice_lost",
    HandoffLeaseExpired => "handoff.lease_expired",
    HandoffNeverReturned => "handoff.never_returned",
    HandoffSecondCompletion => "handoff.second_completion",
    TransferCancelled => "transfer.cancelled",
    HandoffWedge => "handoff.wedge",
    TransferFailed => "transfer.failed",
    HandoffKvReleasedEarly => "handoff.kv_released_before_transfer",
    HandoffIdealRelease => "handoff.ideal_release",
}

impl Mark {
    pub fn parse(s: &str) -> Option<Mark> {
        Mark::ALL.iter().copied().find(|m| m.as_str() == s)
    }
}

/// How often each mark was hit in one run.
#[derive(Clone, Debug, Default)]
pub struct Coverage {
    counts: BTreeMap<Mark, u64>,
}

impl Coverage {
    pub fn hit(&mut self, m: Mark) {
        self.add(m, 1);
    }

    pub fn add(&mut self, m: Mark, n: u64) {
        if n > 0 {
            *self.counts.entry(m).or_insert(0) += n;
        }
    }

    /// The marks hit, by name (`summary.json`'s `coverage`).
    pub fn into_map(self) -> BTreeMap<String, u64> {
        self.counts
            .into_iter()
            .map(|(m, n)| (m.as_str().to_string(), n))
            .collect()
    }
}
