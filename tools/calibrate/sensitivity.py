#!/usr/bin/env python3
"""Near saturation, a few percent of step cost is the difference between a stable queue and a
growing one. This runs vidur's Azure conv replay (scenarios/vidur-azure-conv-vllm.ron) on one
replica, with every share of the Llama-2-7B/A100 roofline divided by s (`cluster.roofline`, whole
percentages: MFU 64, MBU 69, KV 76, attention 37 at s = 1), so every step costs about s times
as much (within 1 %: the shares are whole percentages), and plots TTFT and E2E against s.

    python3 tools/calibrate/sensitivity.py target/release/cancelsim docs/img/step-cost-sensitivity.png

Needs matplotlib. Prints one line per scale: s, TTFT p50, TTFT p99, E2E p50 (ms), GPU busy time (its ratio to s = 1).
"""

import glob
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SCALES = [0.85, 0.90, 0.95, 1.00, 1.05, 1.10, 1.15]
ROOT = Path(__file__).resolve().parents[2]


def main(argv):
    if len(argv) != 3:
        print("usage: sensitivity.py CANCELSIM OUT.png", file=sys.stderr)
        sys.exit(2)
    binary, out_png = argv[1], argv[2]
    work = Path(tempfile.mkdtemp(prefix="cancelsim-sens-"))
    base = (ROOT / "scenarios/vidur-azure-conv-vllm.ron").read_text()
    base = base.replace("replicas: 4,", "replicas: 1,")
    base = base.replace('"traces/', f'"{ROOT}/scenarios/traces/')
    if "replicas: 1," not in base or 'profile: Named("llama-2-7b-a100"),' not in base:
        sys.exit("sensitivity: the vidur scenario changed shape; update this script")
    rows, busy_1 = [], None
    for s in SCALES:
        pct = [min(100, round(x / s)) for x in (64, 69, 76, 37)]
        shares = "roofline: (mfu_pct: {}, mbu_pct: {}, mbu_kv_pct: {}, mfu_attn_pct: {}),".format(*pct)
        (work / "s.ron").write_text(base.replace('profile: Named("llama-2-7b-a100"),',
                                                 'profile: Named("llama-2-7b-a100"), ' + shares))
        out = work / f"out{s}"
        subprocess.run([binary, "run", str(work / "s.ron"), "--out", str(out), "--trace-events", "0",
                        "--data-root", "/"], check=True, capture_output=True)
        summary = json.loads(Path(glob.glob(f"{out}/*/*/summary.json")[0]).read_text())
        c = summary.get("counterfactual", summary)
        busy = c["gpu"]["busy_s"]
        busy_1 = busy if s == 1.0 else busy_1
        rows.append([s, c["ttft_ms"]["p50"], c["ttft_ms"]["p99"], c["e2e_ms"]["p50"], busy])
    for r in rows:
        print(f"{r[0]:.2f} {r[1]:.1f} {r[2]:.1f} {r[3]:.1f} busy {r[4]:.1f} s ({r[4] / busy_1:.3f})")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot([r[0] for r in rows], [r[1] / 1e3 for r in rows], "o-", label="TTFT p50")
    ax.plot([r[0] for r in rows], [r[2] / 1e3 for r in rows], "s-", label="TTFT p99")
    ax.plot([r[0] for r in rows], [r[3] / 1e3 for r in rows], "^-", label="E2E p50")
    ax.set_yscale("log")
    ax.set_xlabel("step cost s, times the Llama-2-7B/A100 roofline (shares divided by s)")
    ax.set_ylabel("latency (s, log scale)")
    ax.set_title("Azure conv on one replica (vidur's vLLM replay): near saturation")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    print(f"wrote {out_png}")


if __name__ == "__main__":
    main(sys.argv)
