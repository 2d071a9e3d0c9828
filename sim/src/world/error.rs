//! How a run stops early: a limit, bad input met mid-run, or a broken simulator invariant.

use cancelsim_models::ownership::OwnershipError;

use crate::kernel::LimitError;

#[derive(Debug, Clone, PartialEq)]
pub enum RunError {
    Limit(LimitError),
    /// A trace could not be read mid-run (file:line: message).
    Input(String),
    /// The modelled system stopped making progress: requests wait for blocks that are held
    /// for good (a reclaim mode of `Never` and notices that never came).
    Stalled(String),
    /// A simulator invariant broke: a bug in cancelsim.
    Invariant {
        seed: u64,
        policy: String,
        event: u64,
        requests: Vec<u64>,
        what: String,
    },
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Limit(e) => e.fmt(f),
            RunError::Input(e) => f.write_str(e),
            RunError::Stalled(e) => write!(f, "the modelled system stalled: {e}"),
            RunError::Invariant {
                seed,
                policy,
                event,
                requests,
                what,
            } => write!(
                f,
                "invariant violated (a cancelsim bug): {what}; seed {seed}, policy {policy}, event #{event}, requests {requests:?}"
            ),
        }
    }
}

impl std::error::Error for RunError {}

impl From<LimitError> for RunError {
    fn from(e: LimitError) -> Self {
        RunError::Limit(e)
    }
}

/// Why a component stopped the run. Components know neither the seed nor the policy nor the
/// event number; the world adds them when it turns a `Stop` into a `RunError`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Stop {
    Limit(LimitError),
    Input(String),
    Stalled(String),
    /// A simulator invariant broke, about these requests.
    Broken {
        requests: Vec<u64>,
        what: String,
    },
}

impl From<LimitError> for Stop {
    fn from(e: LimitError) -> Self {
        Stop::Limit(e)
    }
}

impl Stop {
    pub(crate) fn broken(requests: Vec<u64>, what: impl Into<String>) -> Stop {
        Stop::Broken {
            requests,
            what: what.into(),
        }
    }

    /// The run's error: a broken invariant names the seed, the policy and the event number.
    pub(crate) fn into_run_error(self, seed: u64, policy: &str, event: u64) -> RunError {
        match self {
            Stop::Limit(l) => RunError::Limit(l),
            Stop::Input(s) => RunError::Input(s),
            Stop::Stalled(s) => RunError::Stalled(s),
            Stop::Broken { requests, what } => RunError::Invariant {
                seed,
                policy: policy.to_string(),
                event,
                requests,
                what,
            },
        }
    }

    /// The controller refused an operation the world made on request `id`: always a bug here,
    /// since the world validates what it passes.
    pub(crate) fn controller(id: u64) -> impl Fn(OwnershipError) -> Stop {
        move |e| Stop::broken(vec![id], e.to_string())
    }
}

pub(crate) type Step<T = ()> = Result<T, Stop>;
