//! The fit table's rows from NVIDIA AIConfigurator / AI Simulate's performance database
//! (Apache-2.0; see `NOTICE`): vLLM's kernels measured on an A100, H100, H200 and B200, one row
//! per kernel call of one layer, vendored in `aic_kernels.csv` by
//! `tools/calibrate/aic_kernels.py`. Never read at run time: only the fit table
//! (`fit_table.rs`) and its tests read them.
//!
//! - **Blocks** at `m` tokens: the layer's GEMMs at `m` rows (QKV, O, gate/up and down
//!   projections, each fused projection the database lacks as two measured GEMMs of the same
//!   FLOPs and bytes) summed, times the layers. No norms, no activations: the kernels alone.
//! - **Layers**, decode of `b` sequences of context `c`: the blocks at `b` tokens plus, per
//!   layer, the generation-attention kernel at (batch `b`, isl 1, step `c - 1`).
//! - **Layers**, prefill of one `n`-token prompt: the blocks at `n` plus, per layer, the
//!   context-attention kernel at (batch 1, isl `n`).

use super::fit::{Point, Scope};
use super::profiles::{
    LLAMA31_70B_TP4_B200, LLAMA31_70B_TP4_H100, LLAMA31_70B_TP4_H200, LLAMA31_8B_A100,
    LLAMA31_8B_B200, LLAMA31_8B_H100, LLAMA31_8B_H200,
};
use super::{Profile, StepShape};

/// The vendored rows.
pub const KERNELS_CSV: &str = include_str!("aic_kernels.csv");

/// One measured kernel call of one layer.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub system: String,
    pub op: String,
    pub kernel: String,
    pub model: String,
    /// gemm: (m, n, k); attention: (batch, isl, step).
    pub key: [u64; 3],
    pub latency_ms: f64,
}

/// The rows of [`KERNELS_CSV`]; a malformed row is a bug in the vendored file, so it panics.
pub fn kernels() -> Vec<Kernel> {
    let mut lines = KERNELS_CSV.lines().filter(|l| !l.starts_with('#'));
    let header = lines.next().expect("a header");
    assert_eq!(
        header,
        "system,vllm,device,op,kernel,model,a,b,c,latency_ms,rows"
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 11, "{l}");
            let n = |i: usize| f[i].parse::<u64>().expect("a whole number");
            Kernel {
                system: f[0].into(),
                op: f[3].into(),
                kernel: f[4].into(),
                model: f[5].into(),
                key: [n(6), n(7), n(8)],
                latency_ms: f[9].parse().expect("a latency"),
            }
        })
        .collect()
}

/// A GPU's rows: which system, which profiles stand for the 8B and the 70B there, and the
/// source the table names.
struct System {
    name: &'static str,
    llama8b: Profile,
    llama70b: Option<Profile>,
    gemm_source: &'static str,
    layers_source: &'static str,
    /// Why these rows are not held to the target, if they are not.
    not_fitted: Option<&'static str>,
}

const SYSTEMS: [System; 4] = [
    System {
        name: "a100_sxm",
        llama8b: LLAMA31_8B_A100,
        llama70b: None,
        gemm_source: "aic A100 vLLM 0.14.0 gemm_perf (bf16)",
        layers_source: "aic A100 vLLM 0.14.0 gemm_perf + attention (vllm_flash_attn)",
        not_fitted: Some(
            "the A100's shares are fitted to vidur's profile, whose GEMMs run at 64 % of peak \
             where vLLM 0.14's run at 79 %; the vidur side by side runs on them",
        ),
    },
    System {
        name: "h100_sxm",
        llama8b: LLAMA31_8B_H100,
        llama70b: Some(LLAMA31_70B_TP4_H100),
        gemm_source: "aic H100 vLLM 0.24.0 gemm_perf (bf16)",
        layers_source: "aic H100 vLLM 0.24.0 gemm_perf + attention (vllm_flash_attn_fa3)",
        not_fitted: None,
    },
    System {
        name: "h200_sxm",
        llama8b: LLAMA31_8B_H200,
        llama70b: Some(LLAMA31_70B_TP4_H200),
        gemm_source: "aic H200 vLLM 0.24.0 gemm_perf (bf16)",
        layers_source: "aic H200 vLLM 0.24.0 gemm_perf + attention (vllm_flash_attn_fa3)",
        not_fitted: None,
    },
    System {
        name: "b200_sxm",
        llama8b: LLAMA31_8B_B200,
        llama70b: Some(LLAMA31_70B_TP4_B200),
        gemm_source: "aic B200 vLLM 0.24.0 gemm_perf (bf16)",
        layers_source: "aic B200 vLLM 0.24.0 gemm_perf + attention (vllm_flashinfer_trtllm*)",
        not_fitted: None,
    },
];

/// Every database row the fit table shows: per GPU, the 8B's blocks, decode and prefill rows,
/// and the 70B TP4's blocks.
pub fn points() -> Vec<Point> {
    let rows = kernels();
    let mut out = Vec::new();
    for sys in &SYSTEMS {
        let of = |op: &str, model: &str| -> Vec<&Kernel> {
            rows.iter()
                .filter(|k| k.system == sys.name && k.op == op && k.model == model)
                .collect()
        };
        let gemm8 = of("gemm", "llama-3.1-8b");
        let blocks8 = |m: u64| blocks_us(&gemm8, m, sys.llama8b.shape.layers);
        let point = |profile, scope, shape, us: f64, source| Point {
            profile,
            scope,
            shape,
            published_us: us.round() as u64,
            source,
            not_fitted: sys.not_fitted,
        };
        for m in tokens_of(&gemm8) {
            out.push(point(
                sys.llama8b,
                Scope::Blocks,
                tokens(m),
                blocks8(m),
                sys.gemm_source,
            ));
        }
        for k in of("generation_attention", "llama-3.1-8b") {
            let [b, isl, step] = k.key;
            let shape = decode(b, isl + step);
            let us = blocks8(b) + attention_us(sys, k, sys.llama8b.shape.layers);
            out.push(point(
                sys.llama8b,
                Scope::Layers,
                shape,
                us,
                sys.layers_source,
            ));
        }
        for k in of("context_attention", "llama-3.1-8b") {
            let [b, isl, _] = k.key;
            assert_eq!(b, 1, "one prompt alone in its step");
            let us = blocks8(isl) + attention_us(sys, k, sys.llama8b.shape.layers);
            out.push(point(
                sys.llama8b,
                Scope::Layers,
                prefill(isl),
                us,
                sys.layers_source,
            ));
        }
        if let Some(p70) = sys.llama70b {
            let gemm70 = of("gemm", "llama-3.1-70b-tp4");
            for m in tokens_of(&gemm70) {
                let us = blocks_us(&gemm70, m, p70.shape.layers);
                out.push(point(p70, Scope::Blocks, tokens(m), us, sys.gemm_source));
            }
        }
    }
    out
}

/// The token counts the GEMM rows are measured at, increasing.
fn tokens_of(gemms: &[&Kernel]) -> Vec<u64> {
    let mut m: Vec<u64> = gemms.iter().map(|k| k.key[0]).collect();
    m.sort_unstable();
    m.dedup();
    m
}

/// The layer's GEMMs at `m` rows, summed, times the layers, in µs.
fn blocks_us(gemms: &[&Kernel], m: u64, layers: u64) -> f64 {
    let ms: f64 = gemms
        .iter()
        .filter(|k| k.key[0] == m)
        .map(|k| k.latency_ms)
        .sum();
    assert!(ms > 0.0, "no GEMM rows at m = {m}");
    ms * 1e3 * layers as f64
}

/// One attention call of `k`, times the layers, in µs. The kernel must be the one the
/// system's source names (a regenerated file with another kernel would otherwise pass under
/// a stale label): `vllm_flashinfer_trtllm*` names both its prefill and decode kernels.
fn attention_us(sys: &System, k: &Kernel, layers: u64) -> f64 {
    let stem = k
        .kernel
        .trim_end_matches("decode")
        .trim_end_matches("prefill");
    assert!(
        sys.layers_source.contains(stem),
        "{}: {} rows come from {}, but the source says {:?}",
        sys.name,
        k.op,
        k.kernel,
        sys.layers_source
    );
    k.latency_ms * 1e3 * layers as f64
}

fn tokens(n: u64) -> StepShape {
    StepShape {
        prefill_tokens: n,
        ..StepShape::default()
    }
}

fn decode(b: u64, ctx: u64) -> StepShape {
    StepShape {
        decode_seqs: b,
        kv_tokens_read: b * ctx,
        ..StepShape::default()
    }
}

fn prefill(n: u64) -> StepShape {
    let mut s = StepShape::default();
    s.add_prefill(0, n);
    s
}
