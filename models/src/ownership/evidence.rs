//! The evidence ledger: one timestamp per evidence level, each with its clock domain. Missing
//! evidence is unknown (`None`), never zero.

use std::fmt;

/// Why the ledger refused a record: its own error, which `OwnershipError::Evidence` wraps (so
/// the ledger depends on nothing of the controller's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvidenceError {
    /// `level` would be earlier than `after` in the same clock domain.
    OutOfOrder {
        level: EvidenceLevel,
        after: EvidenceLevel,
    },
    AlreadyRecorded(EvidenceLevel),
}

impl fmt::Display for EvidenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvidenceError::OutOfOrder { level, after } => write!(
                f,
                "{} evidence earlier than {} in the same clock domain",
                level.as_str(),
                after.as_str()
            ),
            EvidenceError::AlreadyRecorded(level) => {
                write!(f, "{} evidence already recorded", level.as_str())
            }
        }
    }
}

/// The evidence levels of a cancellation, in their nominal order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EvidenceLevel {
    Intent = 0,
    LocalInvalidation = 1,
    CancelSubmission = 2,
    BackendObservation = 3,
    FinalCallback = 4,
    ResourceRelease = 5,
}

impl EvidenceLevel {
    pub const ALL: [EvidenceLevel; 6] = [
        EvidenceLevel::Intent,
        EvidenceLevel::LocalInvalidation,
        EvidenceLevel::CancelSubmission,
        EvidenceLevel::BackendObservation,
        EvidenceLevel::FinalCallback,
        EvidenceLevel::ResourceRelease,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceLevel::Intent => "intent",
            EvidenceLevel::LocalInvalidation => "local_invalidation",
            EvidenceLevel::CancelSubmission => "cancel_submission",
            EvidenceLevel::BackendObservation => "backend_observation",
            EvidenceLevel::FinalCallback => "final_callback",
            EvidenceLevel::ResourceRelease => "resource_release",
        }
    }

    /// Whether the level is on the cancel chain intent → local invalidation → cancel submission
    /// → backend observation → resource release, whose timestamps are ordered within a clock
    /// domain. The final callback is not: a completion can come before any intent.
    pub fn in_chain(self) -> bool {
        self != EvidenceLevel::FinalCallback
    }
}

/// The clock a timestamp was read from. Timestamps of different domains are never compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClockDomain {
    /// The controller's own monotonic clock.
    Local,
    /// The serving backend's clock.
    Backend,
    /// The playback sink's clock.
    Playback,
}

/// One piece of evidence: when, and by which clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Timestamp {
    pub domain: ClockDomain,
    pub ns: u64,
}

/// Evidence per level. `None` is unknown, never zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ledger {
    pub levels: [Option<Timestamp>; 6],
}

impl Ledger {
    pub fn get(&self, level: EvidenceLevel) -> Option<Timestamp> {
        self.levels[level as usize]
    }
}

impl Ledger {
    /// Record one level. Each level is recorded once; within a clock domain, a level of the cancel
    /// chain is never earlier than its predecessor nor later than its successor. A rejected record
    /// changes nothing.
    pub fn record(&mut self, level: EvidenceLevel, at: Timestamp) -> Result<(), EvidenceError> {
        if self.get(level).is_some() {
            return Err(EvidenceError::AlreadyRecorded(level));
        }
        // The cancel chain is linear in declaration order; the final callback stands outside it.
        if level.in_chain() {
            for other in EvidenceLevel::ALL {
                let Some(t) = self.get(other) else {
                    continue;
                };
                if !other.in_chain() || t.domain != at.domain || other == level {
                    continue;
                }
                if other < level && at.ns < t.ns {
                    return Err(EvidenceError::OutOfOrder {
                        level,
                        after: other,
                    });
                }
                if other > level && t.ns < at.ns {
                    return Err(EvidenceError::OutOfOrder {
                        level: other,
                        after: level,
                    });
                }
            }
        }
        self.levels[level as usize] = Some(at);
        Ok(())
    }
}
