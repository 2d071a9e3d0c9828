//! A streak's step times by addition (`Costing::streak_times`) against each step's own time
//! (`Costing::step_ns` of its shape): the same, for every named profile and for rooflines
//! drawn over rates that divide 10⁹ or not, terms past 64 bits (timed one by one then), and
//! times past 2³¹ ns.

use cancelsim_models::gpu::{
    Costing, Roofline, StepCost, StepModel, StepShape, StreakTimes, PROFILES,
};
use proptest::prelude::*;

/// Each of `steps + 1` times, one by one and by `streak_times`, whose ends (`extend_ends`,
/// from a start drawn by the seqs) are checked here against the times added up.
fn both(model: &StepModel, seqs: u64, kv0: u64, steps: u64) -> (Vec<u64>, Vec<u64>) {
    let costing = Costing::new(model);
    let mut times = costing.streak_times(seqs, kv0, steps);
    let added: Vec<u64> = (0..=steps).map(|_| times.next_ns()).collect();
    let start_ns = seqs.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (seqs % 64);
    let mut ends = vec![];
    costing
        .streak_times(seqs, kv0, steps)
        .extend_ends(steps + 1, start_ns, &mut ends);
    let summed: Vec<u64> = (added.iter())
        .scan(start_ns, |end_ns, &t| {
            *end_ns = end_ns.checked_add(t)?;
            Some(*end_ns)
        })
        .collect();
    assert_eq!(ends, summed, "the ends from {start_ns}");
    let each = (0..=steps)
        .map(|i| {
            costing.step_ns(StepShape {
                decode_seqs: seqs,
                kv_tokens_read: kv0 + i * seqs,
                ..StepShape::default()
            })
        })
        .collect();
    (added, each)
}

fn rate() -> impl Strategy<Value = u64> {
    prop_oneof![
        // Small divisors: the remainders carry, and land on the divisor exactly, often.
        1u64..200,
        1u64..=u64::MAX,
        (1u64..1_000_000).prop_map(|k| k * 1_000_000_000),
        Just(1_000_000_000),
        Just(1),
    ]
}

prop_compose! {
    fn roofline()(
        // Up to 2^36 a token: `step_ns`'s own 128-bit path holds every product (larger ones
        // overflow it, in a debug build).
        linear_flops in prop_oneof![1u64..1_000, 1u64..1 << 24, 1u64..1 << 36],
        pair_flops in prop_oneof![1u64..1_000, 1u64..1 << 24, 1u64..1 << 36],
        weight_bytes in 0u64..1 << 44,
        kv_bytes in prop_oneof![1u64..1_000, 1u64..1 << 20, 1u64..1 << 36],
        rates in (rate(), rate(), rate(), rate()),
        overhead_ns in 0u64..1 << 40,
        per_seq_ns in 0u64..1 << 20,
    ) -> Roofline {
        Roofline {
            linear_flops,
            pair_flops,
            weight_bytes,
            kv_bytes,
            achieved_flops: rates.0,
            achieved_attn_flops: rates.1,
            achieved_bytes_per_s: rates.2,
            achieved_kv_bytes_per_s: rates.3,
            overhead_ns,
            per_seq_ns,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

    #[test]
    fn added_times_are_each_steps_time(
        r in roofline(),
        seqs in 1u64..2_048,
        kv0 in prop_oneof![0u64..1_000, 0u64..1 << 24, 0u64..1 << 50],
        steps in 0u64..300,
    ) {
        let (added, each) = both(&StepModel::Roofline(r), seqs, kv0, steps);
        prop_assert_eq!(added, each);
    }

    #[test]
    fn named_profiles_add_up_to_their_step_times(
        i in 0..PROFILES.len(),
        seqs in 1u64..1_024,
        kv0 in 0u64..4_000_000,
        steps in 0u64..200,
    ) {
        let model = StepModel::Roofline(PROFILES[i].roofline);
        // A real profile's steps fit 64 bits: they are added, not timed one by one.
        let costing = Costing::new(&model);
        let added_here = matches!(costing.streak_times(seqs, kv0, steps), StreakTimes::Added(_));
        prop_assert!(added_here);
        let (added, each) = both(&model, seqs, kv0, steps);
        prop_assert_eq!(added, each);
    }
}

/// Other step models are timed one by one, by their own `step_ns`.
#[test]
fn a_linear_model_is_timed_step_by_step() {
    let linear = StepModel::Linear(StepCost {
        c0_ns: 5_000_000,
        prefill_tokens_per_s: 10_000,
        per_seq_ns: 10_000,
        per_kv_token_ps: 40,
    });
    let (added, each) = both(&linear, 8, 1_000, 50);
    assert_eq!(added, each);
    assert!(
        added.windows(2).all(|w| w[0] <= w[1]) && added[0] < added[50],
        "{added:?}"
    );
}

/// A step whose time saturates at `u64::MAX` ns ends at the last nanosecond from 0, and no step
/// after it fits: its time is no bound that a sum of ends may trust.
#[test]
fn a_saturated_step_ends_at_the_last_nanosecond() {
    // At 10⁹ a second, a count is its own nanoseconds: both terms about 1.31 x 10¹⁹ ns, whose
    // join passes 2⁶⁴.
    let big = 13_100_000_000_000_000_000;
    let r = Roofline {
        linear_flops: big,
        pair_flops: 1,
        weight_bytes: big,
        kv_bytes: 1,
        achieved_flops: 1_000_000_000,
        achieved_attn_flops: 1_000_000_000,
        achieved_bytes_per_s: 1_000_000_000,
        achieved_kv_bytes_per_s: 1_000_000_000,
        overhead_ns: 1,
        per_seq_ns: 0,
    };
    let model = StepModel::Roofline(r);
    let costing = Costing::new(&model);
    let mut times = costing.streak_times(1, 0, 1);
    assert!(matches!(times, StreakTimes::Added(_)));
    let mut ends = vec![];
    times.extend_ends(1, 0, &mut ends);
    times.extend_ends(1, u64::MAX, &mut ends);
    assert_eq!(ends, [u64::MAX]);
    let (added, each) = both(&model, 1, 0, 1);
    assert_eq!(added, each);
    assert_eq!(added[0], u64::MAX);
}
