//! The named profiles: a model's shape on a GPU, at a stated precision, with the constants of
//! both step models. Every constant says where it comes from; the fit of the roofline against
//! published step times is the table in `docs/validation.md` (kept in sync by a test).

use super::roofline::{Gpu, ModelShape, Roofline, A100_80GB, B200_SXM, H100_SXM, H200_SXM};
use super::{StepCost, StepModel};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// bf16 weights, activations and KV cache (vLLM's default for these models).
    Bf16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
        }
    }
}

/// A named hardware + model profile: step costs and the KV capacity of one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    pub name: &'static str,
    pub precision: Precision,
    pub shape: ModelShape,
    pub gpu: Gpu,
    /// Tensor-parallel degree: GPUs per replica.
    pub tp: u64,
    pub roofline: Roofline,
    /// The linear constants of cancelsim 0.1, for `step_model: Linear`; profiles added since have
    /// none.
    pub linear_v1: Option<StepCost>,
    /// KV cache bytes of one token, all layers and all tensor-parallel shards: what a
    /// prefill-to-decode transfer moves.
    pub kv_bytes_per_token: u64,
    /// vLLM's defaults for this GPU class (`get_batch_defaults`).
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
}

impl Profile {
    /// The KV bytes of `tokens` tokens: what moving a prompt's cache from prefill to decode
    /// carries.
    pub fn kv_bytes(&self, tokens: u64) -> u64 {
        tokens.saturating_mul(self.kv_bytes_per_token)
    }

    /// The roofline, or the 0.1 linear constants (`None` if this profile has none).
    pub fn model(&self, linear: bool) -> Option<StepModel> {
        if linear {
            self.linear_v1.map(StepModel::Linear)
        } else {
            Some(StepModel::Roofline(self.roofline))
        }
    }
}

/// Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json): 32 layers, width 4,096, 8 KV heads of
/// 128, MLP 14,336, vocabulary 128,256. Blocks 32 × 218,103,808 parameters; head 525,336,576.
const LLAMA31_8B: ModelShape = ModelShape {
    block_params: 6_979_321_856,
    head_params: 525_336_576,
    embedding_params: 525_336_576,
    layers: 32,
    d_model: 4096,
    kv_heads: 8,
    head_dim: 128,
    weight_bytes: 2,
    kv_elem_bytes: 2,
};

/// Llama-2-7B (meta-llama/Llama-2-7b-hf config.json): 32 layers, width 4,096, 32 KV heads (no
/// GQA), MLP 11,008, vocabulary 32,000. Blocks 32 × 202,375,168; head 131,072,000.
const LLAMA2_7B: ModelShape = ModelShape {
    block_params: 6_476_005_376,
    head_params: 131_072_000,
    embedding_params: 131_072_000,
    layers: 32,
    d_model: 4096,
    kv_heads: 32,
    head_dim: 128,
    weight_bytes: 2,
    kv_elem_bytes: 2,
};

/// Llama-3.1-70B (meta-llama/Llama-3.1-70B config.json): 80 layers, width 8,192, 8 KV heads of
/// 128, MLP 28,672, vocabulary 128,256. Blocks 80 × 855,638,016; head 1,050,673,152.
const LLAMA31_70B: ModelShape = ModelShape {
    block_params: 68_451_041_280,
    head_params: 1_050_673_152,
    embedding_params: 1_050_673_152,
    layers: 80,
    d_model: 8192,
    kv_heads: 8,
    head_dim: 128,
    weight_bytes: 2,
    kv_elem_bytes: 2,
};

/// Tensor-parallel all-reduce latency per step at TP4: two all-reduces per layer, "≈1–3 ms per
/// step at TP4–8" with custom all-reduce kernels; 2 ms.
const TP4_ALL_REDUCE_NS: u64 = 2_000_000;

/// Llama-3.1-8B, bf16, one H100 SXM 80 GB.
///
/// - Roofline: the weights (15.0 GB with the head) at 69 % of 3.35 TB/s take 6.49 ms a step;
///   vLLM 0.21 measures 6.48 ms at concurrency 1 (yobitel vLLM benchmark, fp16).
/// - Linear (0.1): c0 5.2 ms, which sits below the bf16 weight read at full bandwidth (4.5 ms
///   at 3.35 TB/s, so 5.2 ms needs 86 % of it): it matches fp8 NIM figures, not bf16.
/// - Capacity (the memory planner): 53.29 GiB of KV cache, 27,284 blocks of 16 tokens at 0.9.
/// - Batch defaults: vLLM's 1024 seqs and 8192 tokens for ≥ 70 GiB non-A100 GPUs.
pub const LLAMA31_8B_H100: Profile = Profile {
    name: "llama-3.1-8b-h100",
    precision: Precision::Bf16,
    shape: LLAMA31_8B,
    gpu: H100_SXM,
    tp: 1,
    roofline: Roofline::derive(LLAMA31_8B, H100_SXM, 1, 0),
    linear_v1: Some(StepCost {
        c0_ns: 5_200_000,
        prefill_tokens_per_s: 30_000,
        per_seq_ns: 20_000,
        per_kv_token_ps: 55_900,
    }),
    kv_bytes_per_token: LLAMA31_8B.kv_bytes_per_token(),
    max_num_seqs: 1024,
    max_num_batched_tokens: 8192,
};

/// Llama-3.1-8B, bf16, one A100 SXM 80 GB. Capacity as on the H100 (the same memory, a smaller
/// activation peak at 2,048 batched tokens: 27,768 blocks); vLLM's A100
/// defaults, 256 seqs and 2048 tokens.
pub const LLAMA31_8B_A100: Profile = Profile {
    name: "llama-3.1-8b-a100",
    precision: Precision::Bf16,
    shape: LLAMA31_8B,
    gpu: A100_80GB,
    tp: 1,
    roofline: Roofline::derive(LLAMA31_8B, A100_80GB, 1, 0),
    linear_v1: None,
    kv_bytes_per_token: LLAMA31_8B.kv_bytes_per_token(),
    max_num_seqs: 256,
    max_num_batched_tokens: 2048,
};

/// Llama-3.1-70B, bf16, tensor parallel over four H100 SXM 80 GB.
///
/// - Roofline: 34.7 GB of weights per GPU at 69 % of 3.35 TB/s, 15.0 ms, plus 2 ms of
///   all-reduce.
/// - Linear (0.1): c0 14.5 ms, c_seq 60 µs, fitted to NIM 1.3.0 figures (13.21 ms at c=1,
///   31.22 ms at c=200) whose precision the page does not state.
/// - Capacity (the memory planner): 32.34 GiB of KV per GPU, 26,496 blocks of 16 tokens.
pub const LLAMA31_70B_TP4_H100: Profile = Profile {
    name: "llama-3.1-70b-tp4-h100",
    precision: Precision::Bf16,
    shape: LLAMA31_70B,
    gpu: H100_SXM,
    tp: 4,
    roofline: Roofline::derive(LLAMA31_70B, H100_SXM, 4, TP4_ALL_REDUCE_NS),
    linear_v1: Some(StepCost {
        c0_ns: 14_500_000,
        prefill_tokens_per_s: 14_000,
        per_seq_ns: 60_000,
        per_kv_token_ps: 34_900,
    }),
    kv_bytes_per_token: LLAMA31_70B.kv_bytes_per_token(),
    max_num_seqs: 1024,
    max_num_batched_tokens: 8192,
};

/// Llama-2-7B, bf16, one A100 SXM 80 GB.
///
/// - Roofline: 13.2 GB of weights at 69 % of 2.04 TB/s, 9.4 ms a step; vidur's profiled blocks
///   alone take 9.35 ms at one token.
/// - Linear (0.1): c0 10.4 ms, 9.5k prefill tokens/s, 374.5 ns per KV token read.
/// - Capacity (the memory planner): 56.64 GiB, 7,250 blocks of 16 tokens (vLLM reported 7,351).
/// - Batch defaults: vLLM's 256 seqs and 2048 tokens for A100.
pub const LLAMA2_7B_A100: Profile = Profile {
    name: "llama-2-7b-a100",
    precision: Precision::Bf16,
    shape: LLAMA2_7B,
    gpu: A100_80GB,
    tp: 1,
    roofline: Roofline::derive(LLAMA2_7B, A100_80GB, 1, 0),
    linear_v1: Some(StepCost {
        c0_ns: 10_400_000,
        prefill_tokens_per_s: 9_500,
        per_seq_ns: 30_000,
        per_kv_token_ps: 374_500,
    }),
    kv_bytes_per_token: LLAMA2_7B.kv_bytes_per_token(),
    max_num_seqs: 256,
    max_num_batched_tokens: 2048,
};

/// Llama-2-7B, bf16, one H100 SXM 80 GB: capacity as on the A100 (same memory), vLLM's H100
/// defaults. (No H200 or B200 profile of Llama-2-7B: a model of 2023 on GPUs of 2024-25.)
pub const LLAMA2_7B_H100: Profile = Profile {
    name: "llama-2-7b-h100",
    precision: Precision::Bf16,
    shape: LLAMA2_7B,
    gpu: H100_SXM,
    tp: 1,
    roofline: Roofline::derive(LLAMA2_7B, H100_SXM, 1, 0),
    linear_v1: None,
    kv_bytes_per_token: LLAMA2_7B.kv_bytes_per_token(),
    max_num_seqs: 1024,
    max_num_batched_tokens: 8192,
};

/// A profile of `shape` on `tp` GPUs of kind `gpu` with vLLM's batch defaults for GPUs of 70 GiB
/// or more that are not A100s (1,024 sequences, 8,192 tokens) and no 0.1 linear constants.
const fn profile_on(
    name: &'static str,
    shape: ModelShape,
    gpu: Gpu,
    tp: u64,
    overhead_ns: u64,
) -> Profile {
    Profile {
        name,
        precision: Precision::Bf16,
        shape,
        gpu,
        tp,
        roofline: Roofline::derive(shape, gpu, tp, overhead_ns),
        linear_v1: None,
        kv_bytes_per_token: shape.kv_bytes_per_token(),
        max_num_seqs: 1024,
        max_num_batched_tokens: 8192,
    }
}

/// Llama-3.1-8B, bf16, one H200 SXM 141 GB: its shares fitted to vLLM 0.24.0's kernels on an
/// H200; twice the H100's KV cache (108 GiB against 53, `cancelsim profiles`).
pub const LLAMA31_8B_H200: Profile = profile_on("llama-3.1-8b-h200", LLAMA31_8B, H200_SXM, 1, 0);

/// Llama-3.1-8B, bf16, one B200 SXM 180 GB: its shares fitted to vLLM 0.24.0's kernels on a
/// B200.
pub const LLAMA31_8B_B200: Profile = profile_on("llama-3.1-8b-b200", LLAMA31_8B, B200_SXM, 1, 0);

/// Llama-3.1-70B, bf16, tensor parallel over four H200s: the H100 TP4 profile's 2 ms of
/// all-reduce (NVLink 4 on both).
pub const LLAMA31_70B_TP4_H200: Profile = profile_on(
    "llama-3.1-70b-tp4-h200",
    LLAMA31_70B,
    H200_SXM,
    4,
    TP4_ALL_REDUCE_NS,
);

/// Llama-3.1-70B, bf16, tensor parallel over four B200s. The all-reduce is taken at the H100's
/// 2 ms, though NVLink 5 doubles the bandwidth: at a step's few-MB messages the all-reduce is
/// latency-bound, and no measurement of it on a B200 was found.
pub const LLAMA31_70B_TP4_B200: Profile = profile_on(
    "llama-3.1-70b-tp4-b200",
    LLAMA31_70B,
    B200_SXM,
    4,
    TP4_ALL_REDUCE_NS,
);

/// The named profiles. Never renumber: `cancelsim profiles` lists them in this order.
pub const PROFILES: [Profile; 9] = [
    LLAMA31_8B_H100,
    LLAMA31_8B_A100,
    LLAMA31_70B_TP4_H100,
    LLAMA2_7B_A100,
    LLAMA2_7B_H100,
    LLAMA31_8B_H200,
    LLAMA31_8B_B200,
    LLAMA31_70B_TP4_H200,
    LLAMA31_70B_TP4_B200,
];

/// The one-line refusal of an unknown profile name, listing the known ones.
pub fn unknown_profile(name: &str) -> String {
    let known: Vec<&str> = PROFILES.iter().map(|p| p.name).collect();
    format!("unknown profile {name:?}; known: {}", known.join(", "))
}

/// The model shape a profile stands for: its name without the GPU (`llama-3.1-8b-h100` is
/// `llama-3.1-8b`, `llama-3.1-70b-tp4-h100` the TP4 shard `llama-3.1-70b-tp4`).
pub fn model_shape_name(profile_name: &str) -> &str {
    profile_name
        .rsplit_once('-')
        .map_or(profile_name, |(shape, _gpu)| shape)
}

pub fn profile(name: &str) -> Option<Profile> {
    PROFILES.iter().copied().find(|p| p.name == name)
}
