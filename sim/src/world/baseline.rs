//! The counterfactual baseline: what the run without cancellations did with each request, and
//! how a policy run's siblings compare with it.

use rustc_hash::FxHashMap;

use cancelsim_models::ownership::State;

use super::requests::Req;
use crate::record::PAIRS_MAX;

/// What the counterfactual run remembers of each request, to judge siblings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CfRecord {
    pub state: State,
    pub digest: u64,
    pub ttft_ns: u64,
    pub e2e_ns: u64,
}

/// Counterfactual records by request id: a dense vector for open-loop ids, a map otherwise.
#[derive(Default)]
pub struct CfTable {
    dense: Vec<Option<CfRecord>>,
    sparse: FxHashMap<u64, CfRecord>,
}

impl CfTable {
    const DENSE_MAX: u64 = 1 << 27;

    fn insert(&mut self, id: u64, r: CfRecord) {
        if id < Self::DENSE_MAX {
            let i = id as usize;
            if self.dense.len() <= i {
                self.dense.resize(i + 1, None);
            }
            self.dense[i] = Some(r);
        } else {
            self.sparse.insert(id, r);
        }
    }

    fn get(&self, id: u64) -> Option<CfRecord> {
        if id < Self::DENSE_MAX {
            self.dense.get(id as usize).copied().flatten()
        } else {
            self.sparse.get(&id).copied()
        }
    }
}

/// Siblings judged so far, and their latency against the counterfactual.
#[derive(Default)]
pub(crate) struct Siblings {
    pub siblings: u64,
    pub survived: u64,
    pub ttft_deltas_ns: Vec<i64>,
    pub e2e_deltas_ns: Vec<i64>,
    /// (counterfactual TTFT, this run's TTFT) in ms, the first `PAIRS_MAX` (for a plot).
    pub ttft_pairs_ms: Vec<(f64, f64)>,
}

/// The run's side of the baseline: the counterfactual writes the table, a policy run reads it.
pub(crate) enum Baseline<'s> {
    Record(Option<&'s mut CfTable>),
    Compare(&'s CfTable, Siblings),
}

/// How a leaving request stood against the baseline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Judged {
    pub sibling: bool,
    /// Same disposition and byte-identical output as in the counterfactual (None: no record).
    pub survived: Option<bool>,
    /// The request's output digest, where the baseline read it (the books need it too).
    pub digest: Option<u64>,
}

impl Baseline<'_> {
    /// Request `q` leaves in `state`. In a policy run, `sibling` says whether it had no intent of
    /// its own and shared a replica with a cancel, or was harmed by one.
    pub fn left(&mut self, q: &Req, state: State, sibling: bool) -> Judged {
        let ttft_ns = q.life.first_token_ns().saturating_sub(q.arrival_ns);
        let e2e_ns = q.life.last_token_ns().saturating_sub(q.arrival_ns);
        match self {
            Baseline::Record(table) => {
                let Some(t) = table.as_deref_mut() else {
                    return Judged::default();
                };
                let digest = q.chunks.digest(q.id);
                t.insert(
                    q.id,
                    CfRecord {
                        state,
                        digest,
                        ttft_ns,
                        e2e_ns,
                    },
                );
                Judged {
                    digest: Some(digest),
                    ..Judged::default()
                }
            }
            Baseline::Compare(table, s) if sibling => {
                s.siblings += 1;
                let Some(base) = table.get(q.id) else {
                    return Judged {
                        sibling: true,
                        ..Judged::default()
                    };
                };
                let digest = q.chunks.digest(q.id);
                Judged {
                    sibling: true,
                    survived: Some(s.compare(base, q, state, digest)),
                    digest: Some(digest),
                }
            }
            Baseline::Compare(..) => Judged::default(),
        }
    }

    pub fn siblings(&self) -> Option<&Siblings> {
        match self {
            Baseline::Record(_) => None,
            Baseline::Compare(_, s) => Some(s),
        }
    }

    pub fn take_pairs(&mut self) -> Vec<(f64, f64)> {
        match self {
            Baseline::Record(_) => Vec::new(),
            Baseline::Compare(_, s) => std::mem::take(&mut s.ttft_pairs_ms),
        }
    }
}

impl Siblings {
    /// A sibling against its counterfactual record: survived, and latency deltas if both
    /// completed.
    fn compare(&mut self, base: CfRecord, q: &Req, state: State, digest: u64) -> bool {
        let survived = base.state == state && base.digest == digest;
        if survived {
            self.survived += 1;
        }
        if base.state == State::Completed && state == State::Completed {
            let ttft_ns = q.life.first_token_ns() - q.arrival_ns;
            let e2e_ns = q.life.last_token_ns() - q.arrival_ns;
            if self.ttft_pairs_ms.len() < PAIRS_MAX {
                let pair = (base.ttft_ns as f64 / 1e6, ttft_ns as f64 / 1e6);
                self.ttft_pairs_ms.push(pair);
            }
            self.ttft_deltas_ns
                .push(ttft_ns as i64 - base.ttft_ns as i64);
            self.e2e_deltas_ns.push(e2e_ns as i64 - base.e2e_ns as i64);
        }
        survived
    }
}
