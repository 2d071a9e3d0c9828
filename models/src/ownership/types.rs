//! The values the controller hands out and takes: states, dispositions, classifications,
//! payloads, admission results, tickets and errors.

use std::fmt;
use std::sync::Arc;

use super::barrier::BarrierId;
use super::evidence::{EvidenceError, Ledger};
use crate::sparse::Sparse;

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
    pub(super) final_output: bool,
    /// Its accepted output and evidence, boxed at the first of either: a record is kept for
    /// every request in the system, most of them waiting with neither (24 bytes a record
    /// instead of 112).
    more: Sparse<More>,
}

#[derive(Clone, Debug, Default)]
struct More {
    /// `None` until the first accepted output (the reference's revision −1).
    revision: Option<u64>,
    payload: Payload,
    ledger: Ledger,
}

impl Default for Payload {
    fn default() -> Payload {
        Payload::empty()
    }
}

impl Row {
    pub(super) fn new(generation: u64) -> Row {
        Row {
            generation,
            state: State::Running,
            final_output: false,
            more: Sparse::default(),
        }
    }

    pub(super) fn revision(&self) -> Option<u64> {
        self.more.made().and_then(|m| m.revision)
    }

    pub(super) fn payload(&self) -> &[u8] {
        self.more.made().map_or(&[], |m| &m.payload)
    }

    /// Its accepted payload as held (a shared one is not copied).
    pub(super) fn payload_held(&self) -> Payload {
        self.more
            .made()
            .map(|m| m.payload.clone())
            .unwrap_or_default()
    }

    /// The output accepted at `revision`.
    #[inline]
    pub(super) fn accept(&mut self, revision: u64, payload: &[u8], final_output: bool) {
        let more = self.more.get_mut();
        debug_assert!(more.revision.is_none_or(|r| revision > r));
        more.revision = Some(revision);
        more.payload = Payload::from(payload);
        self.final_output = final_output;
    }

    pub(super) fn ledger(&self) -> Ledger {
        self.more.made().map(|m| m.ledger).unwrap_or_default()
    }

    pub(super) fn set_ledger(&mut self, ledger: Ledger) {
        self.more.get_mut().ledger = ledger;
    }

    pub(super) fn snapshot(&self) -> RequestSnapshot {
        RequestSnapshot {
            generation: self.generation,
            state: self.state,
            revision: self.revision(),
            payload: self.payload_held(),
            final_output: self.final_output,
            ledger: self.ledger(),
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
