//! The values the controller hands out and takes: states, dispositions, classifications,
//! payloads, admission results, tickets and errors.

use std::fmt;
use std::sync::Arc;

use super::barrier::BarrierId;
use super::evidence::{EvidenceError, Ledger};

/// Where a request's lifecycle stands. `Running` until the first terminal transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    Running,
    Completed,
    Cancelled,
    Expired,
}

impl State {
    pub fn is_terminal(self) -> bool {
        self != State::Running
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Completed => "completed",
            State::Cancelled => "cancelled",
            State::Expired => "expired",
        }
    }
}

/// A terminal disposition, the argument of `finish`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Disposition {
    Completed,
    Cancelled,
    Expired,
}

impl Disposition {
    pub fn parse(s: &str) -> Option<Disposition> {
        match s {
            "completed" => Some(Disposition::Completed),
            "cancelled" => Some(Disposition::Cancelled),
            "expired" => Some(Disposition::Expired),
            _ => None,
        }
    }

    pub fn state(self) -> State {
        match self {
            Disposition::Completed => State::Completed,
            Disposition::Cancelled => State::Cancelled,
            Disposition::Expired => State::Expired,
        }
    }
}

/// How `update` classified a piece of output evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpdateClass {
    Accepted,
    Stale,
    Duplicate,
    Conflict,
    /// The identity's record was evicted from the tombstones: the evidence is late, and rejected.
    Late,
}

impl UpdateClass {
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateClass::Accepted => "accepted",
            UpdateClass::Stale => "stale",
            UpdateClass::Duplicate => "duplicate",
            UpdateClass::Conflict => "conflict",
            UpdateClass::Late => "late",
        }
    }
}

/// Owned, immutable payload bytes. Small payloads (up to 30 bytes, the simulator's per-token
/// markers) are stored inline, larger ones shared; either way cloning never lets anyone mutate
/// the bytes, and there is no allocation per token.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Payload(PayloadRepr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum PayloadRepr {
    Inline {
        len: u8,
        bytes: [u8; Payload::INLINE_MAX],
    },
    Shared(Arc<[u8]>),
}

impl Payload {
    pub const INLINE_MAX: usize = 30;

    pub fn empty() -> Payload {
        Payload(PayloadRepr::Inline {
            len: 0,
            bytes: [0; Self::INLINE_MAX],
        })
    }
}

impl From<&[u8]> for Payload {
    fn from(b: &[u8]) -> Payload {
        if b.len() <= Self::INLINE_MAX {
            let mut bytes = [0; Self::INLINE_MAX];
            bytes[..b.len()].copy_from_slice(b);
            Payload(PayloadRepr::Inline {
                len: b.len() as u8,
                bytes,
            })
        } else {
            Payload(PayloadRepr::Shared(Arc::from(b)))
        }
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            PayloadRepr::Inline { len, bytes } => &bytes[..*len as usize],
            PayloadRepr::Shared(b) => b,
        }
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({:?})", String::from_utf8_lossy(self))
    }
}

/// The result of `admit_end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The current payload may go to the consumer.
    Submitted(Payload),
    /// The admission was for an obsolete generation.
    Stale,
    /// The request is terminal (that state); its output is never admitted again.
    Terminal(State),
    /// The clear barrier is not clear, or its epoch changed during the wait. Retryable.
    Blocked,
    /// The age budget was exceeded: the request is now `expired`.
    Expired,
    /// No output yet.
    Empty,
    /// The request's record was evicted from the tombstones.
    Late,
}

impl Admission {
    pub fn as_str(&self) -> &'static str {
        match self {
            Admission::Submitted(_) => "submitted",
            Admission::Stale => "stale",
            Admission::Terminal(s) => s.as_str(),
            Admission::Blocked => "blocked",
            Admission::Expired => "expired",
            Admission::Empty => "empty",
            Admission::Late => "late",
        }
    }
}

/// Why an operation was rejected. A rejected operation changed nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnershipError {
    InvalidIdentity,
    ReusedIdentity,
    UnknownRequest,
    /// A running record cannot be retired.
    StillRunning,
    InvalidAgeInputs,
    InvalidClock,
    /// The ledger refused the record.
    Evidence(EvidenceError),
}

impl From<EvidenceError> for OwnershipError {
    fn from(e: EvidenceError) -> Self {
        OwnershipError::Evidence(e)
    }
}

impl fmt::Display for OwnershipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnershipError::InvalidIdentity => f.write_str("invalid request identity"),
            OwnershipError::ReusedIdentity => f.write_str("reused request identity"),
            OwnershipError::UnknownRequest => f.write_str("unknown request"),
            OwnershipError::StillRunning => f.write_str("a running request cannot be retired"),
            OwnershipError::InvalidAgeInputs => f.write_str("invalid age inputs"),
            OwnershipError::InvalidClock => f.write_str("invalid local clock"),
            OwnershipError::Evidence(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for OwnershipError {}

/// A read-only copy of one request's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSnapshot {
    pub generation: u64,
    pub state: State,
    /// `None` until the first accepted output (the reference's revision −1).
    pub revision: Option<u64>,
    pub payload: Payload,
    pub final_output: bool,
    pub ledger: Ledger,
}

#[derive(Clone, Debug)]
pub(super) struct Row {
    pub(super) generation: u64,
    pub(super) state: State,
    pub(super) revision: Option<u64>,
    pub(super) payload: Payload,
    pub(super) final_output: bool,
    /// Boxed at its first evidence: most requests never have a cancel, and a record is kept for
    /// every request in the system (96 bytes less each).
    pub(super) ledger: Option<Box<Ledger>>,
}

impl Row {
    pub(super) fn new(generation: u64) -> Row {
        Row {
            generation,
            state: State::Running,
            revision: None,
            payload: Payload::empty(),
            final_output: false,
            ledger: None,
        }
    }

    pub(super) fn snapshot(&self) -> RequestSnapshot {
        RequestSnapshot {
            generation: self.generation,
            state: self.state,
            revision: self.revision,
            payload: self.payload.clone(),
            final_output: self.final_output,
            ledger: self.ledger.as_deref().copied().unwrap_or_default(),
        }
    }
}

/// Deliberately broken variants of the controller, for testing checkers (never on by default).
#[cfg(feature = "broken-variants")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerBug {
    /// Admission trusts the state it saw before the wait: the terminal check is not repeated
    /// after it, so a request cancelled during the wait still gets its output admitted.
    TerminalCheckedBeforeWait,
}

/// What `admit_begin` captured before the wait.
#[derive(Clone, Debug, PartialEq)]
pub struct Ticket<K> {
    pub request: K,
    /// Signed and wide: the reference does not validate an admission's generation, so a negative
    /// one is legal and simply never matches a record (whose generation is >= 0).
    pub generation: i128,
    pub born: f64,
    pub max_age: f64,
    /// The clear barrier this admission waits on.
    pub barrier: BarrierId,
    pub epoch: u64,
}
