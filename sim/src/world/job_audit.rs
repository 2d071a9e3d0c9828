//! The five rules every durable agent job keeps, checked as the run goes (`check` and the swarm
//! see a broken one as a broken invariant). Each check takes the facts and says whether the rule
//! holds, so a test can break each rule on purpose and see it caught.

use crate::scenario::PROVIDER_ATTEMPTS_MAX;

/// A job's status. Terminal states never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobState {
    Running,
    Completed,
    Cancelled,
    Expired,
    /// A provider call ran out of attempts.
    Failed,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        self != JobState::Running
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Cancelled => "cancelled",
            JobState::Expired => "expired",
            JobState::Failed => "failed",
        }
    }
}

/// Tokens a job used: the truth (what the GPUs computed for it) or what it reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub input: u64,
    pub output: u64,
}

impl Tokens {
    pub fn total(self) -> u64 {
        self.input + self.output
    }
}

/// Rule 1: no provider call, tool or subagent starts after the job's terminal decision.
pub(crate) fn dispatch(job: u64, state: JobState) -> Result<(), String> {
    if state.is_terminal() {
        return Err(format!(
            "job {job} dispatched work after its terminal decision ({state:?})"
        ));
    }
    Ok(())
}

/// Rule 2: a terminal state never changes.
pub(crate) fn transition(job: u64, from: JobState, to: JobState) -> Result<(), String> {
    if from.is_terminal() && from != to {
        return Err(format!(
            "job {job}'s terminal state changed: {from:?} to {to:?}"
        ));
    }
    Ok(())
}

/// Rule 3: reported usage is a lower bound of the truth, and equal to it when complete.
pub(crate) fn usage(
    job: u64,
    truth: Tokens,
    reported: Tokens,
    complete: bool,
) -> Result<(), String> {
    let below = reported.input <= truth.input && reported.output <= truth.output;
    if !below || (complete && reported != truth) {
        return Err(format!(
            "job {job} reported {reported:?} against a true {truth:?} (usage_complete: {complete})"
        ));
    }
    Ok(())
}

/// Rule 4: a child's deadline is within what is left of its parent's.
pub(crate) fn child_deadline(job: u64, child_ns: u64, parent_ns: u64) -> Result<(), String> {
    if child_ns > parent_ns {
        return Err(format!(
            "job {job}: a child's deadline ({child_ns} ns) passes its parent's ({parent_ns} ns)"
        ));
    }
    Ok(())
}

/// Rule 5: at most 4,096 provider attempts are journalled per job.
pub(crate) fn attempts(job: u64, journalled: u32) -> Result<(), String> {
    if journalled > PROVIDER_ATTEMPTS_MAX {
        return Err(format!(
            "job {job} journalled {journalled} provider attempts (at most {PROVIDER_ATTEMPTS_MAX})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_holds_on_good_facts_and_catches_a_broken_one() {
        assert!(dispatch(1, JobState::Running).is_ok());
        assert!(dispatch(1, JobState::Cancelled).is_err());
        assert!(dispatch(1, JobState::Expired).is_err());

        assert!(transition(1, JobState::Running, JobState::Cancelled).is_ok());
        assert!(transition(1, JobState::Expired, JobState::Expired).is_ok());
        assert!(transition(1, JobState::Completed, JobState::Cancelled).is_err());

        let t = Tokens {
            input: 100,
            output: 20,
        };
        let r = Tokens {
            input: 100,
            output: 7,
        };
        assert!(usage(1, t, r, false).is_ok());
        assert!(usage(1, t, t, true).is_ok());
        assert!(
            usage(1, t, r, true).is_err(),
            "complete, yet below the truth"
        );
        let over = Tokens {
            input: 100,
            output: 21,
        };
        assert!(
            usage(1, t, over, false).is_err(),
            "reported above the truth"
        );

        assert!(child_deadline(1, 10, 10).is_ok());
        assert!(child_deadline(1, 11, 10).is_err());

        assert!(attempts(1, PROVIDER_ATTEMPTS_MAX).is_ok());
        assert!(attempts(1, PROVIDER_ATTEMPTS_MAX + 1).is_err());
    }
}
