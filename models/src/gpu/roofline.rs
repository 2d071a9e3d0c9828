//! The roofline step model: a step is bound by the larger of its compute and its memory traffic,
//! not their sum, and a prefill chunk pays attention over its own context (quadratic in the
//! prompt).
//!
//! ```text
//! compute_ns = tokens · linear_flops / achieved_flops + pairs · pair_flops / achieved_attn_flops
//! memory_ns  = weight_bytes / achieved_bytes + kv_tokens_moved · kv_bytes / achieved_kv_bytes
//! t_step     = overhead_ns + decode_seqs · per_seq_ns + √(compute_ns² + memory_ns²)
//! ```
//!
//! - `tokens` are the step's prefill tokens plus one per decode sequence;
//! - `pairs` are the (query, key) pairs attention computes: a decode token attends to its
//!   context, and a chunk of `n` prompt tokens after `p` cached ones to `n·p + n(n+1)/2`;
//! - `kv_tokens_moved` are the KV tokens read (every decode context, every chunk's earlier
//!   context) plus the KV tokens the step writes (one per token).
//!
//! The weights and the KV cache are read at two rates because measured kernels read them at
//! two rates: a step's weight read is a few hundred small GEMMs, each with its launch and tail,
//! while an attention kernel streams one large paged cache (see [`MBU_KV_PCT`]). For the same
//! reason the arithmetic runs at two rates: the blocks' GEMMs at [`MFU_PCT`], attention's
//! (query, key) pairs, with their softmax between two small matmuls, at [`MFU_ATTN_PCT`].
//!
//! The √(c² + m²) join is a smooth roofline: it equals the bound far from the knee, where one
//! term dominates, and rounds the corner where the two meet. vidur's measured GEMM times show
//! that corner (Llama-2-7B on an A100: 12.4 ms at 128 tokens, where compute alone is 8.3 ms and
//! the weight read 9.4 ms; the join gives 12.5 ms, a hard max 9.4 ms, the sum 17.7 ms).
//! Everything is integer nanoseconds and an integer square root, so it is portable.

mod ahead;

pub use ahead::DecodeSteps;

/// A dense decoder's shape, as the runtime executes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// Parameters of the transformer blocks (attention projections and MLP), all layers.
    pub block_params: u64,
    /// Parameters of the output head (vocabulary × model width), read once per step.
    pub head_params: u64,
    /// Parameters of the input embedding: held in memory, but a step reads only its rows.
    pub embedding_params: u64,
    pub layers: u64,
    /// Model width (query heads × head size).
    pub d_model: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// Bytes of one weight: 2 for bf16, 1 for fp8.
    pub weight_bytes: u64,
    /// Bytes of one KV-cache element.
    pub kv_elem_bytes: u64,
}

impl ModelShape {
    /// KV bytes of one token, all layers: K and V, each kv_heads × head_dim.
    pub const fn kv_bytes_per_token(&self) -> u64 {
        self.layers * self.kv_heads * self.head_dim * 2 * self.kv_elem_bytes
    }
}

/// One GPU's datasheet figures, and the utilisations of them fitted to its measured kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub name: &'static str,
    /// Dense tensor-core peak at the profile's precision, FLOP/s.
    pub peak_flops: u64,
    /// HBM bandwidth, bytes/s.
    pub hbm_bytes_per_s: u64,
    /// Device memory as PyTorch reports it (what vLLM's `gpu_memory_utilization` is a share of).
    pub memory_bytes: u64,
    /// The shares of the peaks its kernels reach: see [`Fitted`].
    pub fitted: Fitted,
}

/// What a GPU's measured kernels reach: the shares of its peaks, in whole percent, and a
/// per-sequence cost, each a least-squares fit (the tests say to which rows of the fit table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fitted {
    /// The blocks' GEMMs, of the FLOP/s peak.
    pub mfu_pct: u64,
    /// The weight read, of HBM bandwidth.
    pub mbu_pct: u64,
    /// The KV-cache reads and writes, of HBM bandwidth.
    pub mbu_kv_pct: u64,
    /// Attention's (query, key) arithmetic, of the FLOP/s peak.
    pub mfu_attn_pct: u64,
    /// A decode sequence's cost beyond its bytes and FLOPs, per step: the attention kernel's
    /// per-sequence work (its block table, its own tile), which the roofline's bytes do not
    /// time. Fitted jointly with `mbu_kv_pct` on the decode rows.
    pub per_seq_ns: u64,
}

const GIB: u64 = 1 << 30;

/// Device memory as PyTorch reports it for a part of `nominal_gib`: the nominal size less the
/// 0.78 GiB the driver keeps (an 80 GB H100: 80 GiB nominal, 79.22 GiB in vLLM's log), taken for
/// every part.
const fn reported_bytes(nominal_gib: u64) -> u64 {
    (nominal_gib * 100 - 78) * GIB / 100
}

/// NVIDIA A100 SXM 80 GB: 312 TFLOP/s dense bf16, 2,039 GB/s HBM2e (A100 datasheet); memory
/// as PyTorch reports the H100 80 GB (vLLM's log: 79.22 GiB). Shares fitted to vidur's profile
/// (the module's constants below).
pub const A100_80GB: Gpu = Gpu {
    name: "A100-SXM-80GB",
    peak_flops: 312_000_000_000_000,
    hbm_bytes_per_s: 2_039_000_000_000,
    memory_bytes: reported_bytes(80),
    fitted: Fitted {
        mfu_pct: MFU_PCT,
        mbu_pct: MBU_PCT,
        mbu_kv_pct: MBU_KV_PCT,
        mfu_attn_pct: MFU_ATTN_PCT,
        per_seq_ns: 0,
    },
};

/// NVIDIA H100 SXM 80 GB: 989.4 TFLOP/s dense bf16, 3.35 TB/s HBM3 (H100 datasheet); 79.22 GiB
/// as PyTorch reports it (vLLM's log). Shares fitted to vLLM 0.24.0's measured kernels in
/// AIConfigurator's database (the `aic` rows of the fit table): cuBLAS GEMMs through
/// `torch.nn.functional.linear`, FlashAttention-3 (`vllm_flash_attn_fa3`).
pub const H100_SXM: Gpu = Gpu {
    name: "H100-SXM-80GB",
    peak_flops: 989_400_000_000_000,
    hbm_bytes_per_s: 3_350_000_000_000,
    memory_bytes: reported_bytes(80),
    fitted: Fitted {
        mfu_pct: 84,
        mbu_pct: 79,
        mbu_kv_pct: 78,
        mfu_attn_pct: 41,
        per_seq_ns: 4_500,
    },
};

/// NVIDIA H200 SXM 141 GB: 989.4 TFLOP/s dense bf16 (the H100's die), 4.8 TB/s HBM3e (H200
/// datasheet). Memory: 141 GiB less the 0.78 GiB an 80 GB part keeps from PyTorch (80 GiB
/// nominal, 79.22 reported): 140.22 GiB. Shares fitted as the H100's, to vLLM 0.24.0's kernels
/// on an H200 (FlashAttention-3).
pub const H200_SXM: Gpu = Gpu {
    name: "H200-SXM-141GB",
    peak_flops: 989_400_000_000_000,
    hbm_bytes_per_s: 4_800_000_000_000,
    memory_bytes: reported_bytes(141),
    fitted: Fitted {
        mfu_pct: 83,
        mbu_pct: 73,
        mbu_kv_pct: 74,
        mfu_attn_pct: 42,
        per_seq_ns: 5_700,
    },
};

/// NVIDIA B200 SXM 180 GB: 2.25 PFLOP/s dense bf16, 7.7 TB/s HBM3e (HGX B200 datasheet, per
/// GPU; AIConfigurator's system file takes the same). Memory: 180 GiB less 0.78 GiB, 179.22 GiB.
/// Shares fitted to vLLM 0.24.0's kernels on a B200 (FlashInfer's TensorRT-LLM prefill and decode
/// kernels, `vllm_flashinfer_trtllm*`).
pub const B200_SXM: Gpu = Gpu {
    name: "B200-SXM-180GB",
    peak_flops: 2_250_000_000_000_000,
    hbm_bytes_per_s: 7_700_000_000_000,
    memory_bytes: reported_bytes(180),
    fitted: Fitted {
        mfu_pct: 71,
        mbu_pct: 65,
        mbu_kv_pct: 80,
        mfu_attn_pct: 41,
        per_seq_ns: 1_800,
    },
};

/// The roofline's constants for one replica, per GPU of its tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roofline {
    /// FLOPs of one token through the blocks (2 × block parameters / TP).
    pub linear_flops: u64,
    /// FLOPs of one attention (query, key) pair, all layers (4 × layers × d_model / TP).
    pub pair_flops: u64,
    /// Weight bytes read once per step (blocks and head / TP).
    pub weight_bytes: u64,
    /// KV bytes of one token (/ TP).
    pub kv_bytes: u64,
    /// Peak × model-FLOPs utilisation, for the blocks' GEMMs.
    pub achieved_flops: u64,
    /// Peak × the attention kernels' FLOPs utilisation, for the (query, key) pairs.
    pub achieved_attn_flops: u64,
    /// HBM bandwidth × memory-bandwidth utilisation, for the weights.
    pub achieved_bytes_per_s: u64,
    /// HBM bandwidth × the attention kernels' utilisation, for KV-cache reads and writes.
    pub achieved_kv_bytes_per_s: u64,
    /// Fixed cost of a step beyond the roofline: launch, and all-reduce latency under TP.
    pub overhead_ns: u64,
    /// Cost of each decode sequence beyond the roofline (sampling).
    pub per_seq_ns: u64,
}

/// The A100's shares. Model-FLOPs and memory-bandwidth utilisation, in percent, fitted to
/// vidur's profiled GEMM times (`microsoft/vidur` `data/profiling/compute/{a100,h100}/meta-llama/Llama-2-7b-hf/mlp.csv`):
/// the blocks of Llama-2-7B at 4,096 tokens run at 64.5 % (A100) and 63.8 % (H100) of peak, and
/// at one token read their weights at 69.0 % (A100) and 68.7 % (H100) of HBM bandwidth.
pub const MFU_PCT: u64 = 64;
pub const MBU_PCT: u64 = 69;

/// Memory-bandwidth utilisation of the KV-cache traffic, in percent: the least-squares fit to
/// vidur's profiled decode attention on an A100 (`attention.csv`, the decode "layers" rows of
/// the fit table) over the steps a replica can hold; a test checks it is the best whole
/// percentage. Two kernels bracket it: FlashAttention on Llama-2-7B (32 KV heads) reads the
/// cache at 57-89 % of peak there, rising with the bytes a layer reads, and FlashInfer on
/// Llama-3-8B (8 KV heads) at 51-83 % from batch 16 up. The H100, H200 and B200 have their own
/// shares, fitted to vLLM's measured kernels (their constants above).
pub const MBU_KV_PCT: u64 = 76;

/// FLOPs utilisation of attention's arithmetic, in percent: the least-squares fit to vidur's
/// profiled prefill attention on an A100 (the prefill "layers" rows of the fit table); a test
/// checks it is the best whole percentage. Two kernels bracket it there: vidur's FlashAttention
/// path computes a prompt's attention at 16 % of peak, FlashInfer at 35-52 %.
pub const MFU_ATTN_PCT: u64 = 37;

/// Utilisations in whole percent, each replacing the fitted one it names when set: what a user
/// who knows their kernels (FlashAttention-3 on an H100, say) states instead of a step table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shares {
    /// Replaces [`MFU_PCT`].
    pub mfu_pct: Option<u64>,
    /// Replaces [`MBU_PCT`].
    pub mbu_pct: Option<u64>,
    /// Replaces [`MBU_KV_PCT`].
    pub mbu_kv_pct: Option<u64>,
    /// Replaces [`MFU_ATTN_PCT`].
    pub mfu_attn_pct: Option<u64>,
}

/// The range a share may take, in percent.
pub const SHARE_PCT_RANGE: std::ops::RangeInclusive<u64> = 1..=100;

impl Shares {
    /// The first set share outside [`SHARE_PCT_RANGE`], by its field name, with its value.
    pub fn out_of_range(&self) -> Option<(&'static str, u64)> {
        [
            ("mfu_pct", self.mfu_pct),
            ("mbu_pct", self.mbu_pct),
            ("mbu_kv_pct", self.mbu_kv_pct),
            ("mfu_attn_pct", self.mfu_attn_pct),
        ]
        .into_iter()
        .find_map(|(name, pct)| Some((name, pct?)).filter(|(_, p)| !SHARE_PCT_RANGE.contains(p)))
    }
}

impl Roofline {
    /// This roofline with the shares `s` sets, of `gpu`'s peaks; the rest as they were.
    pub fn with_shares(mut self, gpu: Gpu, s: Shares) -> Roofline {
        assert_eq!(s.out_of_range(), None, "shares are validated to 1..=100 %");
        let set = |field: &mut u64, pct: Option<u64>, peak: u64| {
            if let Some(pct) = pct {
                *field = peak / 100 * pct;
            }
        };
        set(&mut self.achieved_flops, s.mfu_pct, gpu.peak_flops);
        set(
            &mut self.achieved_bytes_per_s,
            s.mbu_pct,
            gpu.hbm_bytes_per_s,
        );
        set(
            &mut self.achieved_kv_bytes_per_s,
            s.mbu_kv_pct,
            gpu.hbm_bytes_per_s,
        );
        set(
            &mut self.achieved_attn_flops,
            s.mfu_attn_pct,
            gpu.peak_flops,
        );
        self
    }

    /// The constants of `model` on `tp` GPUs of kind `gpu`, at the GPU's fitted utilisations.
    pub const fn derive(model: ModelShape, gpu: Gpu, tp: u64, overhead_ns: u64) -> Roofline {
        Roofline {
            linear_flops: 2 * model.block_params / tp,
            pair_flops: 4 * model.layers * model.d_model / tp,
            weight_bytes: (model.block_params + model.head_params) * model.weight_bytes / tp,
            kv_bytes: model.kv_bytes_per_token() / tp,
            achieved_flops: gpu.peak_flops / 100 * gpu.fitted.mfu_pct,
            achieved_attn_flops: gpu.peak_flops / 100 * gpu.fitted.mfu_attn_pct,
            achieved_bytes_per_s: gpu.hbm_bytes_per_s / 100 * gpu.fitted.mbu_pct,
            achieved_kv_bytes_per_s: gpu.hbm_bytes_per_s / 100 * gpu.fitted.mbu_kv_pct,
            overhead_ns,
            per_seq_ns: gpu.fitted.per_seq_ns,
        }
    }

    /// What every step of this roofline shares, worked out once (`step_ns_prepared`).
    pub fn prepare(&self) -> Prepared {
        Prepared {
            flops: Rate::of(self.achieved_flops),
            attn: Rate::of(self.achieved_attn_flops),
            kv: Rate::of(self.achieved_kv_bytes_per_s),
            weight_ns: Rate::of(self.achieved_bytes_per_s).ns(self.weight_bytes as u128),
        }
    }

    /// The compute and memory times of a step, in ns, before they are joined.
    pub fn terms_ns(&self, s: super::StepShape) -> (u64, u64) {
        self.terms_prepared(s, &self.prepare())
    }

    /// `terms_ns`, with what every step shares worked out (`prepare`).
    #[inline]
    pub fn terms_prepared(&self, s: super::StepShape, p: &Prepared) -> (u64, u64) {
        if let Some(terms) = self.terms_narrow(s, p) {
            return terms;
        }
        self.terms_wide(s, p)
    }

    /// The terms in 64-bit arithmetic, if every number fits: a step's nearly always do.
    #[inline]
    fn terms_narrow(&self, s: super::StepShape, p: &Prepared) -> Option<(u64, u64)> {
        let tokens = s.prefill_tokens.checked_add(s.decode_seqs)?;
        let pairs = s.prefill_pairs.checked_add(s.kv_tokens_read)?;
        let moved = (s.kv_tokens_read.checked_add(s.prefill_ctx_tokens)?).checked_add(tokens)?;
        let compute = p.flops.ns_narrow(tokens.checked_mul(self.linear_flops)?)?;
        let attn = p.attn.ns_narrow(pairs.checked_mul(self.pair_flops)?)?;
        let kv = p.kv.ns_narrow(moved.checked_mul(self.kv_bytes)?)?;
        let weight = u64::try_from(p.weight_ns).ok()?;
        Some((compute.checked_add(attn)?, weight.checked_add(kv)?))
    }

    #[inline(never)]
    fn terms_wide(&self, s: super::StepShape, p: &Prepared) -> (u64, u64) {
        let tokens = (s.prefill_tokens + s.decode_seqs) as u128;
        let pairs = (s.prefill_pairs + s.kv_tokens_read) as u128;
        let moved = (s.kv_tokens_read + s.prefill_ctx_tokens) as u128 + tokens;
        let kv_bytes = moved * self.kv_bytes as u128;
        let compute_ns = p.flops.ns(tokens * self.linear_flops as u128)
            + p.attn.ns(pairs * self.pair_flops as u128);
        let memory_ns = p.weight_ns + p.kv.ns(kv_bytes);
        (
            u64::try_from(compute_ns).unwrap_or(u64::MAX),
            u64::try_from(memory_ns).unwrap_or(u64::MAX),
        )
    }

    pub fn step_ns(&self, s: super::StepShape) -> u64 {
        self.step_ns_prepared(s, &self.prepare())
    }

    /// `step_ns`, with what every step shares worked out (`prepare`): the same time.
    #[inline]
    pub fn step_ns_prepared(&self, s: super::StepShape, p: &Prepared) -> u64 {
        let (c, m) = self.terms_prepared(s, p);
        self.overhead_ns
            .saturating_add(s.decode_seqs.saturating_mul(self.per_seq_ns))
            .saturating_add(joined(c, m))
    }
}

/// `√(c² + m²)`, rounded down: how a step's compute and memory times join.
#[inline(always)]
fn joined(c: u64, m: u64) -> u64 {
    if c.max(m) < 1 << 31 {
        // Both squares and their sum fit a u64: the same root, in 64-bit arithmetic.
        isqrt_below_2_63(c * c + m * m)
    } else {
        let square = |x: u64| (x as u128).saturating_mul(x as u128);
        let joined = square(c).saturating_add(square(m)).isqrt();
        u64::try_from(joined).unwrap_or(u64::MAX)
    }
}

/// What every step of a roofline shares (`Roofline::prepare`): its rates, and the time of its
/// weights, which no step changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prepared {
    flops: Rate,
    attn: Rate,
    kv: Rate,
    weight_ns: u128,
}

/// A rate of `per_s` a second as the fraction a quantity's nanoseconds are: `x · 10⁹ / per_s`,
/// reduced by the two's greatest common divisor. The same rational, so the same quotient, and
/// the numerator mostly fits 64 bits where `x · 10⁹` would not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rate {
    mul: u64,
    div: u64,
}

impl Rate {
    pub(super) fn of(per_s: u64) -> Rate {
        const NS_PER_S: u64 = 1_000_000_000;
        let (mut a, mut b) = (NS_PER_S, per_s);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        Rate {
            mul: NS_PER_S / a,
            div: per_s / a,
        }
    }

    /// `ns`, where `x · mul` fits 64 bits.
    #[inline]
    fn ns_narrow(self, x: u64) -> Option<u64> {
        Some(x.checked_mul(self.mul)?.div_ceil(self.div))
    }

    /// `x · 10⁹ / per_s` ns, rounded up: `div_ceil_ns(x · 10⁹, per_s)`.
    #[inline]
    pub(super) fn ns(self, x: u128) -> u128 {
        match u64::try_from(x).ok().and_then(|x| x.checked_mul(self.mul)) {
            Some(n) => n.div_ceil(self.div) as u128,
            None => (x * self.mul as u128).div_ceil(self.div as u128),
        }
    }
}

/// Where the float root needs no correction (`isqrt_below_2_63`).
pub(super) const EXACT_ROOT_BELOW: u64 = 1 << 52;

/// `x.isqrt()` for `x < 2^63`, from the float root and a correction: a double holds `x` to within
/// half a unit in 2^53, so its root is the integer root or one off, and the two steps make it
/// exact (`(r + 1)^2` stays below 2^64). The library's integer root loops a bit at a time.
///
/// Below 2^52 (compute and memory terms of up to about 47 ms each) the float root is exact as it
/// is, with no correction: `x` converts exactly, and the root is correctly rounded (IEEE 754),
/// so it rounds up to an integer `k` only from within half a unit of `k`, at most `k · 2^-53`;
/// but a root below `k` is at most `√(k² − 1) < k − 1/(2k)`, further than that while
/// `k² <= 2^52`, which holds for the `k` above the root of any `x < 2^52`.
#[inline]
pub(super) fn isqrt_below_2_63(x: u64) -> u64 {
    debug_assert!(x < 1 << 63);
    let mut r = float_root(x);
    if x < EXACT_ROOT_BELOW {
        debug_assert_eq!(r, x.isqrt(), "the float root of {x}");
        return r;
    }
    while r * r > x {
        r -= 1;
    }
    while (r + 1) * (r + 1) <= x {
        r += 1;
    }
    r
}

/// The float root of `x < 2^63`, truncated: through i64, the same value and the same rounding,
/// in fewer instructions than a u64's conversions, which must handle 2^63 and more.
#[inline(always)]
fn float_root(x: u64) -> u64 {
    (x as i64 as f64).sqrt() as i64 as u64
}
