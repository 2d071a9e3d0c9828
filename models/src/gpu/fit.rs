//! The roofline against published step times, point by point: the points of the fit table of
//! `docs/validation.md` (`fit_table.rs` assembles them with the database's and writes the table).
//!
//! Three kinds of point:
//!
//! - **Blocks**: vidur's profiled GEMM and norm times for the transformer blocks alone
//!   (`microsoft/vidur` at 7d47513, `data/profiling/compute/<gpu>/meta-llama/<model>/mlp.csv`:
//!   the medians of `attn_pre_proj`, `attn_rope`, `attn_post_proj`, both layer norms,
//!   `mlp_up_proj`, `mlp_act`, `mlp_down_proj` and `add`, summed per layer as vidur's
//!   `ExecutionTime` does, times the layers; the mean of the file's repeated rows). The model
//!   side is the roofline of the blocks alone: no head, no attention kernel, no KV traffic.
//! - **Layers**: a decode step's transformer layers at batch b and context k: the blocks' time
//!   at b tokens (as above) plus, per layer, vidur's profiled decode attention at (b, k): the
//!   medians of `attn_decode` and of the small kernels around it (`attn_input_reshape` and
//!   `attn_output_reshape` for FlashAttention, `attn_kv_cache_save` for FlashInfer; the mean of
//!   a row the file repeats). They come from `attention.csv` for Llama-2-7B (FlashAttention) and
//!   Llama-3-8B (FlashInfer) on an A100, as kept in the fork `sw5sh/cs378-assignment3` at
//!   7ac2fe9: vidur's own snapshot stores those files as Git LFS pointers. The model side is the
//!   roofline without the head: blocks plus the KV traffic. That profile's batches stop at 128;
//!   the batch-256 rows come from vidur's later FlashInfer profile of Llama-3-8B on an A100
//!   (newer column format, batches to 512 where the cache allows), as kept in the fork
//!   `adi-anirudh/vidur_hbf_hbm_backend` at a336807.
//!
//!   The prefill rows are the same for a prompt of n tokens after `ctx` cached ones, alone in
//!   its step: blocks at n tokens plus, per layer, the median of `attn_prefill` at
//!   (n, ctx), with `attn_output_reshape` for FlashAttention. FlashInfer's
//!   `attn_kv_cache_save` is left out of them: in this profile it writes a prompt's K and V at
//!   7-8 GB/s (1.1 ms for a layer's 8 MB at 2,048 tokens, 4.6 ms at 8,192), 0.4 % of the A100's
//!   bandwidth and longer than the attention itself, and vidur's FlashAttention rows time no
//!   such write. The model pays that write at the KV share of bandwidth.
//! - **Step**: an engine's measured time per output token, against the whole step.
//!
//! - **Database**: vLLM's kernels measured by NVIDIA's AIConfigurator, per GPU (see
//!   [`super::aic`]): the rows the H100's, H200's and B200's shares are fitted to.
//!
//! A point is *fitted* when the target (within 10 %) applies. Points from another runtime or
//! precision are shown with their error and the reason they are not fitted, and so is a step
//! whose KV cache the replica cannot hold (vidur times one layer alone, so its profile has
//! batches no 80 GB GPU can run).

use super::memory::UTILIZATION_DEFAULT;
use super::profiles::{
    LLAMA2_7B_A100, LLAMA2_7B_H100, LLAMA31_70B_TP4_H100, LLAMA31_8B_A100, LLAMA31_8B_H100,
};
use super::{Profile, Roofline, StepShape};

#[derive(Clone, Copy, Debug)]
pub enum Scope {
    Blocks,
    Layers,
    Step,
}

#[derive(Clone, Copy, Debug)]
pub struct Point {
    pub profile: Profile,
    pub scope: Scope,
    pub shape: StepShape,
    /// Published value, in microseconds.
    pub published_us: u64,
    pub source: &'static str,
    /// Why the point is not held to the target; `None`: it is.
    pub not_fitted: Option<&'static str>,
}

/// The fit target: every fitted point within this relative error, or a [`KNOWN_MISSES`] row.
pub const TARGET_PCT: f64 = 10.0;

/// A fitted point past the target, named: (profile, point, bound in percent, why).
pub type Miss = (&'static str, &'static str, f64, &'static str);

/// The fitted points known to miss the target, each within its own bound, with the reason.
pub const KNOWN_MISSES: &[Miss] = &[
    (
        "llama-2-7b-a100",
        "decode b=64, context 1,024",
        11.0,
        TWO_KERNELS,
    ),
    ("llama-2-7b-a100", "prefill 2,048 tokens", 11.0, TWO_KERNELS),
    ("llama-2-7b-a100", "prefill 4,096 tokens", 14.0, TWO_KERNELS),
    (
        "llama-3.1-8b-a100",
        "prefill 8,192 tokens",
        12.0,
        TWO_KERNELS,
    ),
    (
        "llama-3.1-8b-h100",
        "decode c=1, context 512",
        13.0,
        WHOLE_STEP,
    ),
    (
        "llama-3.1-8b-h100",
        "decode c=4, context 512",
        13.0,
        WHOLE_STEP,
    ),
    ("llama-3.1-8b-h100", "512 tokens", 11.0, RIDGE),
    (
        "llama-3.1-8b-h100",
        "decode b=16, context 1,024",
        12.0,
        FLOOR,
    ),
    ("llama-3.1-70b-tp4-h100", "256 tokens", 13.0, RIDGE),
    ("llama-3.1-70b-tp4-h100", "8,192 tokens", 18.0, WIDE_GEMMS),
    (
        "llama-3.1-8b-h200",
        "decode b=1, context 1,024",
        12.0,
        FLOOR,
    ),
    (
        "llama-3.1-8b-h200",
        "decode b=16, context 1,024",
        14.0,
        FLOOR,
    ),
    ("llama-3.1-70b-tp4-h200", "8,192 tokens", 13.0, WIDE_GEMMS),
    (
        "llama-3.1-8b-b200",
        "decode b=1, context 1,024",
        16.0,
        FLOOR,
    ),
];

/// One attention share for two kernels: vidur's FlashAttention path computes a prompt's
/// attention at 16 % of the A100's peak, FlashInfer at 35-52 %.
const TWO_KERNELS: &str = "one attention share for two kernels (FlashAttention 16 %, FlashInfer \
     35-52 % of peak)";
/// An engine's whole step against the kernels' fit.
const WHOLE_STEP: &str = "a whole engine step: the scheduling, sampling and launch gaps between \
     the kernels (about 0.8 ms), which the roofline does not charge";
/// The GEMMs' ridge point, where the smooth join rounds the corner less than the kernels do.
const RIDGE: &str = "at the GEMMs' ridge point, where the kernels take more than the join";
/// An attention call at a few sequences: too few tiles to fill the GPU.
const FLOOR: &str = "an attention call at 1-16 sequences reads below the fitted bandwidth (10-36 \
     µs a layer: too few tiles to fill the GPU)";
/// The 70B shard's wider GEMMs at many tokens.
const WIDE_GEMMS: &str = "the 70B shard's GEMMs at 8,192 tokens reach 70-73 % of peak, the \
     8B's 76 %, and one MFU serves both";

const fn tokens(n: u64) -> StepShape {
    StepShape {
        prefill_tokens: n,
        decode_seqs: 0,
        kv_tokens_read: 0,
        prefill_pairs: 0,
        prefill_ctx_tokens: 0,
    }
}

const fn decode(b: u64, ctx: u64) -> StepShape {
    StepShape {
        prefill_tokens: 0,
        decode_seqs: b,
        kv_tokens_read: b * ctx,
        prefill_pairs: 0,
        prefill_ctx_tokens: 0,
    }
}

/// A prompt chunk of `n` tokens after `ctx` cached ones, alone in its step: it attends to
/// `n·ctx + n(n+1)/2` (query, key) pairs and reads the cached context.
const fn prefill(n: u64, ctx: u64) -> StepShape {
    StepShape {
        prefill_tokens: n,
        decode_seqs: 0,
        kv_tokens_read: 0,
        prefill_pairs: n * ctx + n * (n + 1) / 2,
        prefill_ctx_tokens: ctx,
    }
}

const VIDUR: &str = "vidur mlp.csv";
const VIDUR_FA: &str = "vidur mlp.csv + attention.csv (FlashAttention)";
const VIDUR_FI: &str = "vidur mlp.csv + attention.csv (FlashInfer)";
const VIDUR_FI_LATER: &str = "vidur mlp.csv + later attention.csv (FlashInfer, batches to 512)";
const YOBITEL: &str = "vLLM 0.21, fp16, ITL at concurrency c (yobitelcomm bench)";

/// vidur's mlp.csv sums for the blocks of Llama-2-7B on an A100, (tokens, µs): the blocks rows
/// and the linear part of every layers row of that profile read them here, so each measured
/// figure is written once. 32 tokens serves the decode row at batch 32 only.
const LLAMA2_7B_A100_BLOCKS: &[(u64, u64)] = &[
    (1, 9_280),
    (16, 9_184),
    (32, 9_536),
    (64, 9_696),
    (128, 12_240),
    (256, 17_808),
    (2048, 133_464),
    (4096, 259_920),
];

/// The same for Llama-3-8B on an A100.
const LLAMA31_8B_A100_BLOCKS: &[(u64, u64)] = &[
    (1, 9_696),
    (16, 10_128),
    (64, 11_232),
    (128, 13_184),
    (256, 19_488),
    (2048, 143_680),
    (8192, 543_888),
];

/// The measured blocks time at `n` tokens; a token count the table lacks stops the build.
const fn blocks_us(table: &[(u64, u64)], n: u64) -> u64 {
    let mut i = 0;
    while i < table.len() {
        if table[i].0 == n {
            return table[i].1;
        }
        i += 1;
    }
    panic!("no blocks time at that token count")
}

const fn blocks(profile: Profile, n: u64, us: u64) -> Point {
    Point {
        profile,
        scope: Scope::Blocks,
        shape: tokens(n),
        published_us: us,
        source: VIDUR,
        not_fitted: None,
    }
}

/// Why vidur's H100 rows are shown but not fitted.
const VIDUR_H100: &str = "vidur's H100 GEMMs run at 64 % of peak where vLLM 0.24.0's measured \
     ones run at 84 %: the H100's shares follow the newer measurement";

/// A blocks row of vidur's H100 profile: shown, not fitted ([`VIDUR_H100`]).
const fn blocks_h100(profile: Profile, n: u64, us: u64) -> Point {
    Point {
        not_fitted: Some(VIDUR_H100),
        ..blocks(profile, n, us)
    }
}

/// An attention profile: the replica it stands for, that model's blocks, and its source.
#[derive(Clone, Copy)]
struct Kernel {
    profile: Profile,
    blocks: &'static [(u64, u64)],
    source: &'static str,
}

/// FlashAttention on Llama-2-7B (the earlier attention.csv).
const FA: Kernel = Kernel {
    profile: LLAMA2_7B_A100,
    blocks: LLAMA2_7B_A100_BLOCKS,
    source: VIDUR_FA,
};
/// FlashInfer on Llama-3-8B (the earlier attention.csv).
const FI: Kernel = Kernel {
    profile: LLAMA31_8B_A100,
    blocks: LLAMA31_8B_A100_BLOCKS,
    source: VIDUR_FI,
};
/// FlashInfer on Llama-3-8B, vidur's later profile, whose decode batches go past 128 (to 512 at
/// short contexts).
const FI_LATER: Kernel = Kernel {
    source: VIDUR_FI_LATER,
    ..FI
};

/// A step's transformer layers: the blocks at the step's tokens (`n`, from the kernel's blocks
/// table) plus 32 layers of attention at `attn_us` each (attention.csv).
const fn layers(k: Kernel, shape: StepShape, n: u64, attn_us: u64) -> Point {
    Point {
        profile: k.profile,
        scope: Scope::Layers,
        shape,
        published_us: blocks_us(k.blocks, n) + 32 * attn_us,
        source: k.source,
        not_fitted: None,
    }
}

/// A blocks row of the kernel's model, its time from the blocks table.
const fn blocks_of(k: Kernel, n: u64) -> Point {
    blocks(k.profile, n, blocks_us(k.blocks, n))
}

/// Decode of `b` sequences of `ctx` tokens: `[b, ctx, attn_us]`.
const fn dec(k: Kernel, [b, ctx, attn_us]: [u64; 3]) -> Point {
    layers(k, decode(b, ctx), b, attn_us)
}

/// A prefill of `n` prompt tokens after `ctx` cached ones, alone in its step: `[n, ctx,
/// attn_us]`.
const fn pre(k: Kernel, [n, ctx, attn_us]: [u64; 3]) -> Point {
    layers(k, prefill(n, ctx), n, attn_us)
}

/// vidur's and the engines' points, in the order of the table.
pub(super) const PUBLISHED: &[Point] = &[
    blocks_of(FA, 1),
    blocks_of(FA, 16),
    blocks_of(FA, 64),
    blocks_of(FA, 128),
    blocks_of(FA, 256),
    blocks_of(FA, 2048),
    blocks_of(FA, 4096),
    dec(FA, [16, 512, 112]),
    dec(FA, [64, 512, 331]),
    dec(FA, [128, 512, 607]),
    dec(FA, [64, 1024, 596]),
    dec(FA, [1, 2048, 30]),
    dec(FA, [16, 2048, 343]),
    dec(FA, [32, 2048, 631]),
    dec(FA, [64, 2048, 1_188]),
    dec(FA, [128, 2048, 2_146]),
    pre(FA, [128, 0, 19]),
    pre(FA, [2048, 0, 803]),
    pre(FA, [4096, 0, 2_777]),
    pre(FA, [2048, 2048, 1_230]),
    blocks_h100(LLAMA2_7B_H100, 1, 5_600),
    blocks_h100(LLAMA2_7B_H100, 16, 5_792),
    blocks_h100(LLAMA2_7B_H100, 64, 5_856),
    blocks_h100(LLAMA2_7B_H100, 128, 6_368),
    blocks_h100(LLAMA2_7B_H100, 256, 9_152),
    blocks_h100(LLAMA2_7B_H100, 2048, 40_424),
    blocks_h100(LLAMA2_7B_H100, 4096, 83_208),
    blocks_of(FI, 1),
    blocks_of(FI, 16),
    blocks_of(FI, 64),
    blocks_of(FI, 128),
    blocks_of(FI, 256),
    blocks_of(FI, 2048),
    blocks_of(FI, 8192),
    dec(FI, [16, 2048, 114]),
    dec(FI, [64, 2048, 342]),
    dec(FI, [128, 2048, 672]),
    dec(FI_LATER, [1, 1024, 27]),
    dec(FI_LATER, [16, 1024, 67]),
    dec(FI_LATER, [64, 1024, 184]),
    dec(FI_LATER, [128, 1024, 347]),
    dec(FI_LATER, [256, 1024, 639]),
    dec(FI_LATER, [256, 416, 271]),
    pre(FI, [128, 0, 15]),
    pre(FI, [2048, 0, 314]),
    pre(FI, [8192, 0, 3_384]),
    pre(FI, [2048, 2048, 763]),
    blocks_h100(LLAMA31_70B_TP4_H100, 1, 14_320),
    blocks_h100(LLAMA31_70B_TP4_H100, 16, 14_520),
    blocks_h100(LLAMA31_70B_TP4_H100, 64, 15_280),
    blocks_h100(LLAMA31_70B_TP4_H100, 256, 19_200),
    blocks_h100(LLAMA31_70B_TP4_H100, 2048, 112_060),
    Point {
        profile: LLAMA31_8B_H100,
        scope: Scope::Step,
        shape: decode(1, 512),
        published_us: 6_480,
        source: YOBITEL,
        not_fitted: None,
    },
    Point {
        profile: LLAMA31_8B_H100,
        scope: Scope::Step,
        shape: decode(4, 512),
        published_us: 6_590,
        source: YOBITEL,
        not_fitted: None,
    },
    Point {
        profile: LLAMA31_8B_H100,
        scope: Scope::Step,
        shape: decode(100, 512),
        published_us: 7_570,
        source: "NIM 1.8.0 ITL at c=100 (NIM benchmarking page)",
        not_fitted: Some("NIM runs TensorRT-LLM, likely fp8 (8 GB of weights)"),
    },
    Point {
        profile: LLAMA31_70B_TP4_H100,
        scope: Scope::Step,
        shape: decode(1, 512),
        published_us: 13_210,
        source: "NIM 1.3.0 ITL at c=1 (NIM benchmarking page)",
        not_fitted: Some("NIM runs TensorRT-LLM at a precision the page does not state"),
    },
];

impl Point {
    /// The model's value for this point, in microseconds.
    pub fn model_us(&self) -> f64 {
        let ns = match self.scope {
            Scope::Step => self.profile.roofline.step_ns(self.shape),
            Scope::Blocks => blocks_only(&self.profile).step_ns(self.shape),
            Scope::Layers => layers_only(&self.profile).step_ns(self.shape),
        };
        ns as f64 / 1e3
    }

    /// The point's name in the table, read from its scope and shape, so it cannot say other
    /// numbers than the point's: "256 tokens", "decode b=16, context 512" (c=, concurrency, for
    /// an engine's step), "prefill 2,048 tokens after 2,048".
    pub fn what(&self) -> String {
        let s = self.shape;
        let tokens = |n: u64| match n {
            1 => "1 token".to_string(),
            n => format!("{} tokens", thousands(n)),
        };
        match self.scope {
            Scope::Blocks => tokens(s.prefill_tokens),
            _ if s.decode_seqs > 0 => {
                let seqs = if matches!(self.scope, Scope::Step) {
                    "c"
                } else {
                    "b"
                };
                let context = thousands(s.kv_tokens_read / s.decode_seqs);
                format!("decode {seqs}={}, context {context}", s.decode_seqs)
            }
            _ => match s.prefill_ctx_tokens {
                0 => format!("prefill {}", tokens(s.prefill_tokens)),
                ctx => format!(
                    "prefill {} after {}",
                    tokens(s.prefill_tokens),
                    thousands(ctx)
                ),
            },
        }
    }

    /// Model against published, in percent.
    pub fn error_pct(&self) -> f64 {
        (self.model_us() / self.published_us as f64 - 1.0) * 100.0
    }

    /// KV tokens the step holds: every decode context, plus the token each sequence adds.
    pub fn kv_tokens(&self) -> u64 {
        let s = self.shape;
        s.kv_tokens_read + s.prefill_ctx_tokens + s.prefill_tokens + s.decode_seqs
    }

    /// KV tokens the profile's replica holds at vLLM's default memory share.
    pub fn kv_capacity_tokens(&self) -> u64 {
        let ppm = (UTILIZATION_DEFAULT * 1e6) as u64;
        let batched = self.profile.max_num_batched_tokens as u64;
        self.profile.plan(ppm, batched).kv_tokens
    }

    /// The named miss this point is, if it is one.
    pub fn known_miss(&self) -> Option<&'static Miss> {
        KNOWN_MISSES
            .iter()
            .find(|m| m.0 == self.profile.name && m.1 == self.what())
    }

    /// Why the target does not apply to this point; `None`: it does.
    pub fn why_not_fitted(&self) -> Option<String> {
        let (held, capacity) = (self.kv_tokens(), self.kv_capacity_tokens());
        if held > capacity {
            return Some(format!(
                "the step holds {} KV tokens, more than the replica's {}",
                thousands(held),
                thousands(capacity)
            ));
        }
        self.not_fitted.map(str::to_string)
    }
}

/// `n` with a comma between groups of three digits, as the rest of the table writes numbers.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The profile's roofline for the blocks alone: no head weights, no KV traffic, no overhead.
pub(super) fn blocks_only(p: &Profile) -> Roofline {
    let mut shape = p.shape;
    shape.head_params = 0;
    shape.kv_elem_bytes = 0;
    Roofline::derive(shape, p.gpu, p.tp, 0)
}

/// The profile's roofline without the head: the blocks, the attention and the KV traffic, no
/// overhead.
pub(super) fn layers_only(p: &Profile) -> Roofline {
    let mut shape = p.shape;
    shape.head_params = 0;
    Roofline::derive(shape, p.gpu, p.tp, 0)
}
