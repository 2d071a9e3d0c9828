//! The GPU step-time model and its named hardware/model profiles.
//!
//! One engine step (one forward pass over a mixed prefill/decode batch) takes
//!
//! ```text
//! t_step = c0 + prefill_tokens / prefill_rate + decode_seqs * c_seq + kv_tokens_read * c_kv
//! ```
//!
//! - `c0`: the fixed cost of a step: reading the weights once (memory-bound decode) plus launch,
//!   scheduling and (with tensor parallelism) all-reduce overhead;
//! - `prefill_rate`: prompt tokens per second when compute-bound;
//! - `c_seq`: per-sequence cost of a decode slot (sampling, attention launch, padding);
//! - `c_kv`: time to read one token's KV cache (bytes per token / effective memory bandwidth);
//! - `kv_tokens_read`: the sum of the context lengths of every sequence in the step.
//!
//! This is the memory-bound decode model of `shared/research/runtime-cancellation.md` §9.1,
//! `t_dec(B, L) ≈ c0 + Wbytes/(η·BW) + B·L·kv_bytes/(η·BW) + B·c_tok`, plus the chunked-prefill
//! term of §9.2. All times are integer nanoseconds; the arithmetic is integer so it is portable.

/// Costs of one step, in nanoseconds (or tokens per second for prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepCost {
    pub c0_ns: u64,
    /// Prompt tokens per second. 0 means prefill costs nothing beyond `c0` (for queueing tests).
    pub prefill_tokens_per_s: u64,
    pub per_seq_ns: u64,
    /// Picoseconds per KV token read (sub-nanosecond for small models).
    pub per_kv_token_ps: u64,
}

/// What a step contains, for costing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    pub prefill_tokens: u64,
    pub decode_seqs: u64,
    pub kv_tokens_read: u64,
}

impl StepCost {
    pub fn step_ns(&self, shape: StepShape) -> u64 {
        let prefill_ns = if self.prefill_tokens_per_s == 0 {
            0
        } else {
            (shape.prefill_tokens as u128 * 1_000_000_000)
                .div_ceil(self.prefill_tokens_per_s as u128) as u64
        };
        let kv_ns = (shape.kv_tokens_read as u128 * self.per_kv_token_ps as u128 / 1000) as u64;
        self.c0_ns
            .saturating_add(prefill_ns)
            .saturating_add(shape.decode_seqs.saturating_mul(self.per_seq_ns))
            .saturating_add(kv_ns)
    }
}

/// A named hardware + model profile: step costs and the KV capacity of one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    pub name: &'static str,
    pub cost: StepCost,
    /// KV cache capacity of one replica, in 16-token blocks.
    pub kv_blocks_16: u64,
    /// KV cache bytes of one token, all layers (and all tensor-parallel shards): what a
    /// prefill-to-decode transfer moves. Layers × KV heads × head size × 2 (K and V) × 2 bytes.
    pub kv_bytes_per_token: u64,
    /// vLLM's defaults for this GPU class (`get_batch_defaults`, §9.3).
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
}

/// Llama-3.1-8B, bf16, one H100 SXM 80 GB.
///
/// - Weights 16 GB at η·BW = 0.7 × 3.35 TB/s ≈ 2.35 TB/s: 6.8 ms in theory. The measured c=1
///   ITLs are 4.63 ms (NIM 1.8.0) and 6.48 ms (vLLM 0.21, fp16), so c0 = 5.2 ms sits between them
///   (§9.1).
/// - KV 128 KiB per token (§9.4) at 2.35 TB/s: 55.9 ns per token read.
/// - Prefill: the first-principles 25–35k tok/s (§9.2), so 30k tok/s.
/// - Capacity: ≈27k blocks of 16 tokens at 0.9 memory utilisation (§9.4).
/// - Batch defaults: vLLM's 1024 seqs and 8192 tokens for ≥ 70 GiB non-A100 GPUs (§9.3).
pub const LLAMA31_8B_H100: Profile = Profile {
    name: "llama-3.1-8b-h100",
    cost: StepCost {
        c0_ns: 5_200_000,
        prefill_tokens_per_s: 30_000,
        per_seq_ns: 20_000,
        per_kv_token_ps: 55_900,
    },
    kv_blocks_16: 27_000,
    // 32 layers x 8 KV heads x 128 x 2 x 2 B (GQA).
    kv_bytes_per_token: 131_072,
    max_num_seqs: 1024,
    max_num_batched_tokens: 8192,
};

/// Llama-3.1-70B, bf16, tensor parallel over four H100 SXM 80 GB.
///
/// - Weights 140 GB / 4 per GPU at 2.35 TB/s is about 15 ms, plus TP4 all-reduce. The measured
///   ITL is 13.21 ms at c=1 and 17.42 ms at c=50 (NIM 1.3.0, H100 class), against the note's
///   practical range of 13–20 ms at B ≤ 25 (§9.1). So c0 = 14.5 ms.
/// - KV 320 KiB per token, 80 KiB per GPU at TP4 (§9.4): 34.9 ns per token read.
/// - c_seq is 60 µs. With it the step time is 23–35 ms at B = 100–200, as the note reports from
///   23.28 ms at c=100 and 31.22 ms at c=200.
/// - Prefill is 12–16k tok/s at TP4 (§9.2), so 14k tok/s.
/// - Capacity: 4 × 80 GB × 0.9 − 140 GB leaves 148 GB; at 5 MiB per 16-token block that is about
///   28k blocks.
pub const LLAMA31_70B_TP4_H100: Profile = Profile {
    name: "llama-3.1-70b-tp4-h100",
    cost: StepCost {
        c0_ns: 14_500_000,
        prefill_tokens_per_s: 14_000,
        per_seq_ns: 60_000,
        per_kv_token_ps: 34_900,
    },
    kv_blocks_16: 28_000,
    // 80 layers x 8 KV heads x 128 x 2 x 2 B (GQA), over the four shards.
    kv_bytes_per_token: 327_680,
    max_num_seqs: 1024,
    max_num_batched_tokens: 8192,
};

/// Llama-2-7B, bf16, one A100 80 GB.
///
/// - Weights 13.5 GB at 0.7 × 2.0 TB/s = 1.4 TB/s is 9.6 ms, plus about 0.8 ms of overhead, so
///   c0 = 10.4 ms. NeMo measured about 10–11 ms per token at bs1 (234 ms for 128 in / 20 out),
///   and the note's range for 7–8B on A100 is 10–14 ms at B ≤ 8 (§9.1).
/// - KV 512 KiB per token (MHA, §9.4) at 1.4 TB/s: 374.5 ns per token read. This is why 7B on A100
///   rises steeply with B × context.
/// - Prefill 8–11k tok/s on A100 (§9.2), so 9.5k tok/s.
/// - Capacity: 80 GB × 0.9 − 13.5 GB leaves 58.5 GB; at 8 MiB per 16-token block that is about
///   7.3k blocks.
/// - Batch defaults: vLLM's 256 seqs and 2048 tokens for A100 (§9.3).
pub const LLAMA2_7B_A100: Profile = Profile {
    name: "llama-2-7b-a100",
    cost: StepCost {
        c0_ns: 10_400_000,
        prefill_tokens_per_s: 9_500,
        per_seq_ns: 30_000,
        per_kv_token_ps: 374_500,
    },
    kv_blocks_16: 7_300,
    // 32 layers x 32 KV heads x 128 x 2 x 2 B (MHA).
    kv_bytes_per_token: 524_288,
    max_num_seqs: 256,
    max_num_batched_tokens: 2048,
};

pub const PROFILES: [Profile; 3] = [LLAMA31_8B_H100, LLAMA31_70B_TP4_H100, LLAMA2_7B_A100];

pub fn profile(name: &str) -> Option<Profile> {
    PROFILES.iter().copied().find(|p| p.name == name)
}

impl Profile {
    /// The KV bytes of `tokens` tokens: what moving a prompt's cache from prefill to decode
    /// carries.
    pub fn kv_bytes(&self, tokens: u64) -> u64 {
        tokens.saturating_mul(self.kv_bytes_per_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_bytes_agree_with_the_kv_read_cost_and_the_block_size() {
        // The per-token KV read cost was derived from the same bytes at η·BW (0.7 × HBM): read
        // back, the two constants must agree. TP4 reads its 80 KiB shard per GPU in parallel.
        for (p, bw_bytes_per_s, shards) in [
            (LLAMA31_8B_H100, 3.35e12, 1.0),
            (LLAMA31_70B_TP4_H100, 3.35e12, 4.0),
            (LLAMA2_7B_A100, 2.0e12, 1.0),
        ] {
            let ps = p.kv_bytes_per_token as f64 / shards / (0.7 * bw_bytes_per_s) * 1e12;
            let rel = (ps - p.cost.per_kv_token_ps as f64).abs() / ps;
            assert!(
                rel < 0.01,
                "{}: {ps:.0} ps against {}",
                p.name,
                p.cost.per_kv_token_ps
            );
        }
        // 16-token blocks: the block sizes the capacities were computed with.
        assert_eq!(LLAMA31_70B_TP4_H100.kv_bytes(16), 5 << 20);
        assert_eq!(LLAMA2_7B_A100.kv_bytes(16), 8 << 20);
        assert_eq!(LLAMA31_8B_H100.kv_bytes(2048), 256 << 20);
    }

    /// A decode-only step of `b` sequences at a mean context of `ctx` tokens, in ms.
    fn decode_ms(p: &Profile, b: u64, ctx: u64) -> f64 {
        p.cost.step_ns(StepShape {
            prefill_tokens: 0,
            decode_seqs: b,
            kv_tokens_read: b * ctx,
        }) as f64
            / 1e6
    }

    fn within(name: &str, b: u64, ms: f64, (lo, hi): (f64, f64)) {
        assert!(
            (lo..=hi).contains(&ms),
            "{name} at batch {b}: {ms:.2} ms outside the reported range {lo}–{hi} ms"
        );
    }

    // Ranges from shared/research/runtime-cancellation.md §9.1, at a 512-token mean context
    // (the short-prompt benchmarks behind those figures).

    #[test]
    fn llama31_8b_h100_matches_reported_step_times() {
        let p = &LLAMA31_8B_H100;
        // "7–8B on H100 4.5–7 ms (B ≤ 32), 7–15 ms (B 64–256)"
        within(p.name, 1, decode_ms(p, 1, 512), (4.5, 7.0));
        within(p.name, 32, decode_ms(p, 32, 512), (4.5, 7.0));
        within(p.name, 128, decode_ms(p, 128, 512), (7.0, 15.0));
    }

    #[test]
    fn llama31_70b_tp4_h100_matches_reported_step_times() {
        let p = &LLAMA31_70B_TP4_H100;
        // "70B on 4–8×H100 13–20 ms (B ≤ 25), 23–35 ms (B 100–200)"; NIM 17.42 ms at c=50.
        within(p.name, 1, decode_ms(p, 1, 512), (13.0, 20.0));
        within(p.name, 32, decode_ms(p, 32, 512), (13.0, 20.0));
        within(p.name, 128, decode_ms(p, 128, 512), (23.0, 35.0));
    }

    #[test]
    fn llama2_7b_a100_matches_reported_step_times() {
        let p = &LLAMA2_7B_A100;
        // "on A100 10–14 ms (B ≤ 8), rising ~linearly with B·context". For B = 32 and 128 the
        // note gives its parametric formula rather than a measurement, so the ranges are that
        // formula's bounds: η in 0.6–0.8, c0 in 0.5–2 ms, BW 2.0 TB/s (A100-80GB), weights
        // 13.5 GB, KV 512 KiB per token, and c_tok in 0–50 µs.
        within(p.name, 1, decode_ms(p, 1, 512), (10.0, 14.0));
        let bound = |b: f64| {
            let bytes = 13.5e9 + b * 512.0 * 524_288.0;
            let lo = 0.5 + bytes / (0.8 * 2.0e12) * 1e3;
            let hi = 2.0 + bytes / (0.6 * 2.0e12) * 1e3 + b * 0.05;
            (lo, hi)
        };
        within(p.name, 32, decode_ms(p, 32, 512), bound(32.0));
        within(p.name, 128, decode_ms(p, 128, 512), bound(128.0));
    }

    #[test]
    fn prefill_term_matches_prefill_rates() {
        // A 5,000-token prefill on the 70B profile: §9.2 reports TTFT 407 ms for 70B fp8 TP2,
        // i.e. about 12k tok/s; at 14k tok/s the prefill term is 357 ms.
        let p = &LLAMA31_70B_TP4_H100;
        let ms = p.cost.step_ns(StepShape {
            prefill_tokens: 5000,
            decode_seqs: 0,
            kv_tokens_read: 0,
        }) as f64
            / 1e6;
        assert!((350.0..=430.0).contains(&ms), "{ms}");
    }

    #[test]
    fn profiles_are_found_by_name() {
        for p in PROFILES {
            assert_eq!(profile(p.name), Some(p));
        }
        assert_eq!(profile("gpt-5-on-a-toaster"), None);
    }
}
