#!/usr/bin/env python3
"""Measure a step-time table on your own hardware, for cancelsim's `Table(path, kv_blocks_16)`.

It builds one decoder layer of a named model shape with random weights, times it on the grid
of (prefill tokens, decode sequences, KV tokens read) that the table's axes are, and writes the
CSV that `Table` reads, with a header naming the device, the framework, the attention kernel,
the date and the command.

A step at (p, s, k) is one prompt of p tokens computed from nothing cached, plus s decode
sequences that read k KV tokens in all (k // s each, at least one). Its time is

    layers x (one layer: RMSNorm, QKV GEMM, attention, O GEMM, add, RMSNorm, gate/up GEMM,
              SiLU x up, down GEMM, add)
    + the step's fixed part: the final norm and the LM head on the sampled rows, and argmax
    + --overhead-ms (your runtime's scheduling and sampling between steps; 0 by default)

each the median of --repeats timed runs after --warmup untimed ones. With no decode sequence
there is no KV to read, so a point (p, 0, k) is timed as (p, 0, 0).

Backends:
- torch: bf16 on the first CUDA device, timed with CUDA events; attention through
  flash_attn if it is installed, otherwise PyTorch's scaled_dot_product_attention with its
  fastest available backend (FlashAttention, then memory-efficient, grouped-query natively
  where it can); the kernel is named in the header. The decode KV cache is one contiguous
  tensor per layer, not vLLM's paged blocks: a paged kernel's block-table walk is not timed.
  `--device cpu` runs this path without a GPU, to check it.
- numpy: float32 on the CPU (NumPy has no bf16), timed with perf_counter: real matrix products,
  so the whole path runs and is tested anywhere.

    python3 tools/profile/profile.py --model llama-3.1-8b --backend torch --out my-gpu.csv
    python3 tools/profile/profile.py --model tiny --backend numpy --out tiny.csv \\
        --prefill 0,64,256 --seqs 0,1,8 --kv 0,512,4096

Every refusal (an unknown shape, a missing framework, a grid point the device's memory cannot
hold, an existing output without --force) is one line on stderr and exit status 2, before
anything is measured; the CSV is written to a temporary file and renamed, so no partial table
is ever left.
"""

import argparse
import datetime
import os
import shlex
import statistics
import sys
import time

# name: (layers, d_model, heads, kv_heads, head_dim, mlp, vocab), from each model's config.json.
SHAPES = {
    "llama-3.1-8b": (32, 4096, 32, 8, 128, 14336, 128256),
    "llama-3.1-70b": (80, 8192, 64, 8, 128, 28672, 128256),
    "llama-2-7b": (32, 4096, 32, 32, 128, 11008, 32000),
    # A toy shape for the CPU path and its test.
    "tiny": (2, 256, 4, 2, 64, 512, 1024),
}

GRID = {
    "prefill": [0, 128, 512, 2048, 8192],
    "seqs": [0, 1, 16, 64, 256, 1024],
    "kv": [0, 16384, 131072, 1048576],
}


class Refusal(Exception):
    pass


def ints(text, what):
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip() != ""})
    except ValueError:
        raise Refusal(f"--{what} must be whole numbers separated by commas (got {text!r})")
    if not values or values[0] < 0:
        raise Refusal(f"--{what} must be a non-empty list of numbers >= 0 (got {text!r})")
    return values


def model_bytes(shape, elem, p, s, k):
    """Bytes a whole replica of this shape needs at a step (p, s, k): weights, KV, activations."""
    layers, d, h, kvh, hd, mlp, vocab = shape
    per_layer = d * (h + 2 * kvh) * hd + h * hd * d + d * 2 * mlp + mlp * d
    weights = (layers * per_layer + 2 * vocab * d) * elem
    kv = layers * (k + p + s) * kvh * hd * 2 * elem
    rows = p + s
    act = rows * (3 * d + 3 * mlp + (h + 2 * kvh) * hd) * elem + max(rows, 1) * vocab * 4
    return weights + kv + act


class Numpy:
    name = "numpy"

    def __init__(self):
        try:
            import numpy as np
        except ImportError as e:
            raise Refusal(f"backend numpy needs NumPy (not importable: {e})")
        self.np = np
        self.rng = np.random.default_rng(0)
        self.dtype = np.float32
        self.elem = 4
        self.device = f"CPU ({os.cpu_count()} cores)"
        self.framework = f"NumPy {np.__version__}"
        self.kernel = "numpy matmul + softmax (float32)"

    def memory_bytes(self):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def randn(self, *dims):
        return (self.rng.standard_normal(dims, dtype=self.np.float32) * 0.02).astype(self.dtype)

    def zeros(self, *dims):
        return self.np.zeros(dims, dtype=self.dtype)

    def norm(self, x):
        np = self.np
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)

    def silu_mul(self, g, u):
        return g / (1.0 + self.np.exp(-g)) * u

    def attention(self, q, k, v, causal):
        """q: (b, h, tq, hd); k, v: (b, kvh, tk, hd)."""
        np = self.np
        group = q.shape[1] // k.shape[1]
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
        if causal:
            t = scores.shape[-1]
            scores = scores + np.triu(np.full((t, t), -np.inf, dtype=scores.dtype), 1)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        return scores @ v

    def argmax(self, logits):
        return logits.argmax(axis=-1)

    def swap(self, t, a, b):
        return self.np.swapaxes(t, a, b)

    def cat(self, parts):
        return self.np.concatenate(parts, axis=0)

    def time_ms(self, fn, warmup, repeats):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times


class Torch:
    name = "torch"

    def __init__(self, device="cuda"):
        try:
            import torch
        except (ImportError, OSError, ValueError) as e:
            raise Refusal(f"backend torch needs PyTorch (not importable: {e})")
        self.torch = torch
        self.cuda = device == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise Refusal("backend torch needs a CUDA device (torch.cuda.is_available() is False)")
        self.dev = torch.device("cuda:0" if self.cuda else "cpu")
        self.dtype = torch.bfloat16
        self.elem = 2
        torch.manual_seed(0)
        if self.cuda:
            props = torch.cuda.get_device_properties(0)
            self.device = f"{props.name} ({props.total_memory / 2**30:.2f} GiB), CUDA {torch.version.cuda}"
        else:
            self.device = f"CPU ({os.cpu_count()} cores) through PyTorch"
        self.framework = f"PyTorch {torch.__version__}"
        self.flash = None
        try:
            import flash_attn
            from flash_attn import flash_attn_func

            self.flash = flash_attn_func
            self.kernel = f"flash_attn {flash_attn.__version__} (flash_attn_func)"
        except ImportError:
            self.kernel = self.sdpa_backend()

    def sdpa_backend(self):
        """The fastest SDPA backend that runs a grouped-query layout: natively (`enable_gqa`, no
        copy of the cache inside the timed call) where it can, else on a repeated cache."""
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q = torch.randn(1, 4, 16, 64, device=self.dev, dtype=self.dtype)
        kv = torch.randn(1, 2, 16, 64, device=self.dev, dtype=self.dtype)
        for gqa in (True, False):
            for backend, name in [
                (SDPBackend.FLASH_ATTENTION, "FlashAttention"),
                (SDPBackend.EFFICIENT_ATTENTION, "memory-efficient"),
            ]:
                try:
                    with sdpa_kernel([backend]):
                        if gqa:
                            torch.nn.functional.scaled_dot_product_attention(
                                q, kv, kv, is_causal=True, enable_gqa=True)
                        else:
                            k = kv.repeat_interleave(2, dim=1)
                            torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True)
                    self.backend, self.gqa = backend, gqa
                    how = "grouped-query natively" if gqa else "on a repeated KV cache"
                    return f"torch scaled_dot_product_attention ({name} backend, {how})"
                except (RuntimeError, TypeError):
                    continue
        self.backend, self.gqa = SDPBackend.MATH, False
        return "torch scaled_dot_product_attention (math backend: no fused kernel available)"

    def memory_bytes(self):
        if not self.cuda:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return self.torch.cuda.mem_get_info()[1]

    def randn(self, *dims):
        return self.torch.randn(*dims, device=self.dev, dtype=self.dtype) * 0.02

    def zeros(self, *dims):
        return self.torch.zeros(*dims, device=self.dev, dtype=self.dtype)

    def norm(self, x):
        return self.torch.nn.functional.rms_norm(x, (x.shape[-1],))

    def silu_mul(self, g, u):
        return self.torch.nn.functional.silu(g) * u

    def attention(self, q, k, v, causal):
        torch = self.torch
        if self.flash is not None:
            out = self.flash(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
            return out.transpose(1, 2)
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel([self.backend]):
            if self.gqa:
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, enable_gqa=True)
            group = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def argmax(self, logits):
        return logits.argmax(dim=-1)

    def swap(self, t, a, b):
        return t.transpose(a, b)

    def cat(self, parts):
        return self.torch.cat(parts, dim=0)

    def time_ms(self, fn, warmup, repeats):
        torch = self.torch
        if not self.cuda:
            return Numpy.time_ms(self, fn, warmup, repeats)
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return times


class Layer:
    """One decoder layer's weights, and the step's fixed part (final norm, head, argmax)."""

    def __init__(self, be, shape):
        layers, d, h, kvh, hd, mlp, vocab = shape
        self.be, self.shape = be, shape
        self.wqkv = be.randn(d, (h + 2 * kvh) * hd)
        self.wo = be.randn(h * hd, d)
        self.wgu = be.randn(d, 2 * mlp)
        self.wd = be.randn(mlp, d)
        self.head = be.randn(d, vocab)

    def inputs(self, p, s, k):
        _, d, h, kvh, hd, _, _ = self.shape
        be = self.be
        ctx = max(1, k // s) if s else 0
        return {
            "x": be.randn(p + s, d),
            "cache_k": be.randn(s, kvh, ctx, hd) if s else None,
            "cache_v": be.randn(s, kvh, ctx, hd) if s else None,
        }

    def forward(self, p, s, inp):
        _, d, h, kvh, hd, mlp, _ = self.shape
        be = self.be
        x = inp["x"]
        qkv = be.norm(x) @ self.wqkv
        outs = []
        if p:
            # The prompt attends to itself, causally: (1, heads, p, head_dim) each.
            heads = lambda lo, hi, n: be.swap(qkv[:p, lo * hd : hi * hd].reshape(1, p, n, hd), 1, 2)
            q, kk, vv = heads(0, h, h), heads(h, h + kvh, kvh), heads(h + kvh, h + 2 * kvh, kvh)
            a = be.attention(q, kk, vv, True).reshape(h, p, hd)
            outs.append(be.swap(a, 0, 1).reshape(p, h * hd))
        if s:
            # Each decode's one query attends to its cached context.
            q = qkv[p:, : h * hd].reshape(s, h, 1, hd)
            a = be.attention(q, inp["cache_k"], inp["cache_v"], False)
            outs.append(a.reshape(s, h * hd))
        attn = outs[0] if len(outs) == 1 else be.cat(outs)
        x = x + attn @ self.wo
        gu = be.norm(x) @ self.wgu
        return x + be.silu_mul(gu[:, :mlp], gu[:, mlp:]) @ self.wd

    def fixed(self, hidden):
        """The step's fixed part on the sampled rows' hidden states: final norm, head, argmax."""
        be = self.be
        return be.argmax(be.norm(hidden) @ self.head)


def measure(be, layer, shape, p, s, k, warmup, repeats):
    """The step's time in ms at (p, s, k): layers x one layer, plus the fixed part."""
    layers = shape[0]
    s_eff, k_eff = (s, k) if s else (0, 0)
    if p == 0 and s_eff == 0:
        layer_ms = 0.0
    else:
        inp = layer.inputs(p, s_eff, k_eff)
        layer_ms = statistics.median(be.time_ms(lambda: layer.forward(p, s_eff, inp), warmup, repeats))
    rows = s_eff + (1 if p else 0)
    fixed_ms = 0.0
    if rows:
        hidden = be.randn(rows, shape[1])
        fixed_ms = statistics.median(be.time_ms(lambda: layer.fixed(hidden), warmup, repeats))
    return layers * layer_ms + fixed_ms


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="one of: " + ", ".join(SHAPES))
    ap.add_argument("--backend", required=True, choices=["torch", "numpy"])
    ap.add_argument("--out", help="the CSV to write (refused if it exists, without --force)")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--prefill", default=",".join(map(str, GRID["prefill"])))
    ap.add_argument("--seqs", default=",".join(map(str, GRID["seqs"])))
    ap.add_argument("--kv", default=",".join(map(str, GRID["kv"])))
    ap.add_argument("--at", help="time one step P,S,K and print its ms instead of a table")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--overhead-ms", type=float, default=0.0)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="the torch backend's device: cpu runs its path without a GPU (a test)")
    return ap.parse_args(argv)


def run(args, argv):
    if args.model not in SHAPES:
        raise Refusal(f"unknown model shape {args.model!r}; known: {', '.join(SHAPES)}")
    if args.repeats < 1 or args.warmup < 0:
        raise Refusal("--repeats must be >= 1 and --warmup >= 0")
    if not (args.overhead_ms >= 0.0 and args.overhead_ms < 1e6):
        raise Refusal(f"--overhead-ms must be a time >= 0 (got {args.overhead_ms})")
    shape = SHAPES[args.model]
    if args.at:
        points = [tuple(int(v) for v in args.at.split(","))]
        if len(points[0]) != 3 or min(points[0]) < 0:
            raise Refusal(f"--at must be P,S,K, three numbers >= 0 (got {args.at!r})")
    else:
        if not args.out:
            raise Refusal("--out FILE is needed (or --at P,S,K for one step)")
        if os.path.exists(args.out) and not args.force:
            raise Refusal(f"{args.out} exists; pass --force to replace it")
        grid = [ints(args.prefill, "prefill"), ints(args.seqs, "seqs"), ints(args.kv, "kv")]
        points = [(p, s, k) for p in grid[0] for s in grid[1] for k in grid[2]]
    be = Torch(args.device) if args.backend == "torch" else Numpy()
    have = be.memory_bytes()
    for p, s, k in points:
        need = model_bytes(shape, be.elem, p, s, k if s else 0)
        if need > have:
            raise Refusal(
                f"grid point (prefill {p}, seqs {s}, kv {k}) needs {need / 2**30:.1f} GiB for a "
                f"whole {args.model} replica; {be.device} has {have / 2**30:.1f} GiB"
            )
    layer = Layer(be, shape)
    timed = {}
    ms = {}
    for p, s, k in points:
        key = (p, s, k if s else 0)  # no decode sequence reads no KV
        if key not in timed:
            timed[key] = measure(be, layer, shape, *key, args.warmup, args.repeats)
        ms[(p, s, k)] = timed[key] + args.overhead_ms
    if args.at:
        print(f"{ms[points[0]]:.4f}")
        return
    lines = [
        f"# measured by tools/profile/profile.py on {be.device}",
        f"# framework: {be.framework}; attention: {be.kernel}",
        f"# model shape {args.model} {shape} (layers, d_model, heads, kv_heads, head_dim, mlp, vocab),"
        f" random weights; median of {args.repeats} after {args.warmup} warm-up",
        f"# overhead_ms {args.overhead_ms} added to every step; date {datetime.date.today().isoformat()}",
        "# command: " + " ".join(shlex.quote(a) for a in ["python3", "tools/profile/profile.py", *argv]),
        "prefill_tokens,decode_seqs,kv_tokens,step_ms",
    ]
    lines += [f"{p},{s},{k},{max(ms[(p, s, k)], 1e-6):.6f}" for p, s, k in points]
    tmp = f"{args.out}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}: {len(points)} steps on {be.device} ({be.kernel})", file=sys.stderr)


def main(argv):
    args = parse(argv)
    try:
        run(args, argv)
    except Refusal as e:
        print(f"profile: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
