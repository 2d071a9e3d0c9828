//! A measured step-time table: step times on a grid of (prefill tokens, decode sequences, KV
//! tokens read), as a user profiles their own GPU (vidur profiles its operators the same way).
//! A step between grid points is interpolated linearly along each axis (trilinear); past the
//! grid's edge, the edge cell's slope carries on. An affine step model (cancelsim 0.1's linear
//! form) sampled on any grid is reproduced exactly, up to rounding.

use super::StepShape;

/// Grid rows at most, and distinct values per axis at most.
pub const TABLE_ROWS_MAX: usize = 1_000_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepTable {
    /// The distinct values of each axis, increasing.
    prefill: Vec<u64>,
    seqs: Vec<u64>,
    kv: Vec<u64>,
    /// Step times in ns, `[p][s][k]` flattened.
    ns: Vec<u64>,
}

/// What is wrong with a table's rows: the 0-based row, if one row is to blame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableError {
    pub row: Option<usize>,
    pub message: String,
}

fn axis(values: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut v: Vec<u64> = values.collect();
    v.sort_unstable();
    v.dedup();
    v
}

impl StepTable {
    /// A table from rows `(prefill_tokens, decode_seqs, kv_tokens, step_ns)`, which must cover
    /// every combination of the values each axis takes, once.
    pub fn new(rows: &[(u64, u64, u64, u64)]) -> Result<StepTable, TableError> {
        let bad = |row, message: String| Err(TableError { row, message });
        if rows.is_empty() {
            return bad(None, "has no data rows".into());
        }
        if rows.len() > TABLE_ROWS_MAX {
            return bad(None, format!("has more than {TABLE_ROWS_MAX} rows"));
        }
        let prefill = axis(rows.iter().map(|r| r.0));
        let seqs = axis(rows.iter().map(|r| r.1));
        let kv = axis(rows.iter().map(|r| r.2));
        let cells = prefill.len() * seqs.len() * kv.len();
        let mut ns = vec![u64::MAX; cells];
        let at = |v: &[u64], x| v.binary_search(&x).expect("an axis value");
        for (i, r) in rows.iter().enumerate() {
            if r.3 == 0 || r.3 == u64::MAX {
                return bad(Some(i), "step time must be > 0".into());
            }
            let cell = (at(&prefill, r.0) * seqs.len() + at(&seqs, r.1)) * kv.len() + at(&kv, r.2);
            if ns[cell] != u64::MAX {
                let m = format!("repeats the point ({}, {}, {})", r.0, r.1, r.2);
                return bad(Some(i), m);
            }
            ns[cell] = r.3;
        }
        if let Some(hole) = ns.iter().position(|&t| t == u64::MAX) {
            let (k, rest) = (hole % kv.len(), hole / kv.len());
            let (s, p) = (rest % seqs.len(), rest / seqs.len());
            let m = format!(
                "is not a full grid: the point ({}, {}, {}) is missing ({} x {} x {} values)",
                prefill[p],
                seqs[s],
                kv[k],
                prefill.len(),
                seqs.len(),
                kv.len()
            );
            return bad(None, m);
        }
        Ok(StepTable {
            prefill,
            seqs,
            kv,
            ns,
        })
    }

    /// The step time of `shape`, interpolated (extrapolated past the edges), at least 1 ns.
    pub fn step_ns(&self, shape: StepShape) -> u64 {
        let p = locate(&self.prefill, shape.prefill_tokens);
        let s = locate(&self.seqs, shape.decode_seqs);
        let k = locate(&self.kv, shape.kv_tokens_read);
        let mut t = 0.0;
        for (pi, pw) in p.corners() {
            for (si, sw) in s.corners() {
                for (ki, kw) in k.corners() {
                    let cell = (pi * self.seqs.len() + si) * self.kv.len() + ki;
                    t += pw * sw * kw * self.ns[cell] as f64;
                }
            }
        }
        if t.is_nan() || t < 1.0 {
            1
        } else if t >= u64::MAX as f64 {
            u64::MAX
        } else {
            t.round() as u64
        }
    }
}

/// Where a value falls on an axis: the cell's lower index and the weight of its upper end
/// (below 0 or above 1 past the edges).
struct Place {
    lower: usize,
    upper_weight: f64,
    single: bool,
}

impl Place {
    fn corners(&self) -> impl Iterator<Item = (usize, f64)> {
        let w = self.upper_weight;
        let upper = (!self.single).then_some((self.lower + 1, w));
        std::iter::once((self.lower, if self.single { 1.0 } else { 1.0 - w })).chain(upper)
    }
}

fn locate(v: &[u64], x: u64) -> Place {
    if v.len() == 1 {
        return Place {
            lower: 0,
            upper_weight: 0.0,
            single: true,
        };
    }
    // The cell whose upper end is the first value above x, kept inside the grid.
    let lower = v.partition_point(|&a| a <= x).clamp(1, v.len() - 1) - 1;
    let (a, b) = (v[lower] as f64, v[lower + 1] as f64);
    Place {
        lower,
        upper_weight: (x as f64 - a) / (b - a),
        single: false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::StepCost;
    use super::*;

    fn shape(p: u64, s: u64, k: u64) -> StepShape {
        StepShape {
            prefill_tokens: p,
            decode_seqs: s,
            kv_tokens_read: k,
            ..StepShape::default()
        }
    }

    #[test]
    fn an_affine_model_sampled_on_a_grid_is_reproduced_everywhere() {
        let linear = StepCost {
            c0_ns: 5_000_000,
            prefill_tokens_per_s: 20_000,
            per_seq_ns: 30_000,
            per_kv_token_ps: 50_000,
        };
        let mut rows = Vec::new();
        for p in [0, 512, 2048, 8192] {
            for s in [0, 8, 64, 256] {
                for k in [0, 100_000, 1_000_000] {
                    rows.push((p, s, k, linear.step_ns(shape(p, s, k))));
                }
            }
        }
        let table = StepTable::new(&rows).unwrap();
        // Inside, on the grid, and past every edge.
        for (p, s, k) in [
            (100, 3, 5_000),
            (2048, 64, 0),
            (9000, 300, 2_000_000),
            (1, 1, 1),
        ] {
            let (want, got) = (
                linear.step_ns(shape(p, s, k)),
                table.step_ns(shape(p, s, k)),
            );
            assert!(
                want.abs_diff(got) <= 2,
                "({p}, {s}, {k}): {got} against {want}"
            );
        }
    }

    #[test]
    fn holes_repeats_and_zero_times_are_refused_with_their_row() {
        let hole = StepTable::new(&[(0, 1, 0, 5), (1, 1, 0, 6), (0, 2, 0, 7)]).unwrap_err();
        assert!(hole.message.contains("(1, 2, 0) is missing"), "{hole:?}");
        let repeat = StepTable::new(&[(0, 1, 0, 5), (0, 1, 0, 6)]).unwrap_err();
        assert_eq!(repeat.row, Some(1));
        let zero = StepTable::new(&[(0, 1, 0, 0)]).unwrap_err();
        assert_eq!(zero.row, Some(0));
        assert!(StepTable::new(&[]).is_err());
        // One point is a constant step.
        let one = StepTable::new(&[(0, 1, 0, 7_000)]).unwrap();
        assert_eq!(one.step_ns(shape(4096, 100, 1 << 20)), 7_000);
    }

    #[test]
    fn extrapolation_never_goes_below_one_ns() {
        let t = StepTable::new(&[(100, 1, 0, 1_000), (200, 1, 0, 100_000)]).unwrap();
        assert_eq!(t.step_ns(shape(0, 1, 0)), 1);
        assert_eq!(t.step_ns(shape(150, 1, 0)), 50_500);
    }
}
