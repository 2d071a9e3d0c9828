#!/usr/bin/env python3
"""Extract the measured kernel times the roofline is fitted to, from NVIDIA's AIConfigurator /
AI Simulate performance database (Apache-2.0), into `models/src/gpu/aic_kernels.csv`.

The database ships in the `aisimulate` wheel under `aisimulate_core/systems/data/<system>/`:
`gemm/vllm/<ver>/gemm_perf.parquet` and `attention/vllm/<ver>/{context,generation}_attention_perf
.parquet`, one row per measured kernel (latency in ms, per call, per layer). This script keeps
only the rows the fit needs: the GEMMs of the named models' layers and the attention of their
head layout, in bf16, and writes them with their source, so each figure in the fit table names
the row it came from. Run it when the database changes; cancelsim never reads the database at run
time.

    pip download --no-deps aisimulate==0.13.0.dev202610270000000085 -d /tmp/w
    unzip -q /tmp/w/aisimulate-*.whl 'aisimulate_core/systems/data/*' -d /tmp/w/x
    python3 tools/calibrate/aic_kernels.py /tmp/w/x/aisimulate_core/systems/data \
        > models/src/gpu/aic_kernels.csv

Needs pandas and pyarrow. Exits non-zero, writing nothing, when a row it needs is missing.
"""

import sys
from pathlib import Path

# (system, vLLM version of its data): the newest vLLM version with both GEMM and attention rows.
SYSTEMS = [
    ("a100_sxm", "0.14.0"),
    ("h100_sxm", "0.24.0"),
    ("h200_sxm", "0.24.0"),
    ("b200_sxm", "0.24.0"),
]

# GEMM shapes (n, k) of one layer, per model: the database's grid has no n = 28,672 or k = 14,336,
# so the fused gate/up projection is two measured GEMMs (n = 16,384 + 12,288) and the down
# projection two (k = 8,192 + 6,144): the same FLOPs and the same weight bytes.
GEMMS = {
    # Llama-3.1-8B: qkv 6,144 x 4,096; o 4,096 x 4,096; gate_up 28,672 x 4,096; down 4,096 x 14,336.
    "llama-3.1-8b": [(6144, 4096), (4096, 4096), (16384, 4096), (12288, 4096), (4096, 8192), (4096, 6144)],
    # Llama-3.1-70B at TP4, per GPU: qkv 2,560 x 8,192; o 8,192 x 2,048; gate_up 14,336 x 8,192
    # (8,192 + 6,144); down 8,192 x 7,168.
    "llama-3.1-70b-tp4": [(2560, 8192), (8192, 2048), (8192, 8192), (6144, 8192), (8192, 7168)],
}
GEMM_TOKENS = [1, 16, 64, 128, 256, 512, 1024, 2048, 8192]

# Attention of Llama-3.1-8B's layout: 32 query heads, 8 KV heads of 128, bf16 cache.
HEADS = (32, 8, 128)
# Decode: (batch, step) at isl 1, so the context read is 1 + step tokens.
DECODE = [(1, 1023), (16, 1023), (64, 1023), (128, 1023), (256, 511), (512, 255), (1024, 127)]
# Prefill: one prompt of isl tokens, nothing cached.
PREFILL = [1024, 2048, 8192]


def fail(msg):
    print(f"aic_kernels: {msg}", file=sys.stderr)
    sys.exit(1)


def one(frame, what, **key):
    sel = frame
    for col, val in key.items():
        sel = sel[sel[col] == val]
    if len(sel) == 0:
        fail(f"{what}: no row with {key}")
    if sel.kernel_source.nunique() != 1:
        fail(f"{what}: several kernels at {key}: {sorted(sel.kernel_source.unique())}")
    return float(sel.latency.mean()), sel.kernel_source.iloc[0], len(sel)


def main(argv):
    if len(argv) != 2:
        fail("usage: aic_kernels.py DATA_DIR (aisimulate_core/systems/data)")
    try:
        import pandas as pd
    except ImportError:
        fail("needs pandas and pyarrow (pip install pandas pyarrow)")
    data = Path(argv[1])
    if not data.is_dir():
        fail(f"{data}: not a directory")
    out = []
    for system, ver in SYSTEMS:
        base = data / system
        gemm = pd.read_parquet(base / f"gemm/vllm/{ver}/gemm_perf.parquet")
        gemm = gemm[gemm.gemm_dtype == "bfloat16"]
        device = gemm.device.iloc[0]
        for model, shapes in GEMMS.items():
            for m in GEMM_TOKENS:
                for n, k in shapes:
                    ms, kern, rows = one(gemm, f"{system} gemm", m=m, n=n, k=k)
                    out.append((system, ver, device, "gemm", kern, model, m, n, k, ms, rows))
        h, kvh, d = HEADS
        for table, points in (("generation", DECODE), ("context", PREFILL)):
            att = pd.read_parquet(base / f"attention/vllm/{ver}/{table}_attention_perf.parquet")
            att = att[(att.num_heads == h) & (att.num_key_value_heads == kvh) & (att.head_dim == d)]
            att = att[(att.kv_cache_dtype == "bfloat16") & (att.attn_dtype == "bfloat16")]
            if "window_size" in att.columns:
                att = att[att.window_size == 0]
            att = att[att.beam_width == 1]
            for p in points:
                if table == "generation":
                    key = dict(batch_size=p[0], isl=1, step=p[1])
                    a, b, c = p[0], 1, p[1]
                else:
                    key = dict(batch_size=1, isl=p, step=0)
                    a, b, c = 1, p, 0
                ms, kern, rows = one(att, f"{system} {table} attention", **key)
                out.append((system, ver, device, f"{table}_attention", kern, "llama-3.1-8b", a, b, c, ms, rows))
    print("# Measured kernel times from NVIDIA AIConfigurator / AI Simulate's performance database")
    print("# (aisimulate 0.13.0.dev202610270000000085, aisimulate_core/systems/data; Apache-2.0, see")
    print("# NOTICE). Extracted by tools/calibrate/aic_kernels.py. One row per kernel call of one layer:")
    print("# gemm: a,b,c = m,n,k; generation_attention: batch, isl, step (context 1 + step);")
    print("# context_attention: batch, isl, step. latency_ms: the database's latency (the mean of")
    print("# `rows` repeated rows).")
    print("system,vllm,device,op,kernel,model,a,b,c,latency_ms,rows")
    for r in out:
        print(",".join(str(x) for x in r[:9]) + f",{r[9]:.6f},{r[10]}")


if __name__ == "__main__":
    main(sys.argv)
