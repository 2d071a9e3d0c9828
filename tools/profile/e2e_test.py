#!/usr/bin/env python3
"""End to end on the CPU: profile a tiny shape with NumPy, run a scenario on the table, and check
that the simulated step times match the measured ones within the table's interpolation error.

    python3 tools/profile/e2e_test.py target/release/cancelsim

1. `profile.py --backend numpy` times the tiny shape's steps on a 3 x 3 x 3 grid (real matrix
   products) and writes the table.
2. cancelsim runs one request of a 64-token prompt (a grid point) and 24 output tokens on it,
   with `trace.json` on: its first step is that prefill, each later step one decode whose
   context grows by a token (off the grid, between kv 0 and 512).
3. The prefill step must equal the table's point (to the trace's 1 µs), and each decode step
   the straight line between the table's points (0, 1, 0) and (0, 1, 512). Each decode step is
   also timed again directly (`profile.py --at 0,1,K`, the median of three) and must lie
   within the interpolation bound: between two grid points a step time that grows with its
   context differs from the straight line by at most the cell's rise, plus the measurement's
   own spread (the same point timed four times: its range), plus 0.05 ms.

Steps 1 and 2 are exact: a miss fails at once. Step 3 compares two wall-clock measurements
taken seconds apart on a machine that may be shared, so a neighbour that slows one of them
can put a right model out of bounds: a miss there profiles a fresh table and runs the whole
check again, up to ATTEMPTS times in all, and fails only if every attempt misses. A model
that is off misses every time.

Exits non-zero with one line naming what differs; refuses a missing binary.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROFILE = [sys.executable, str(HERE / "profile.py"), "--model", "tiny", "--backend", "numpy"]
PROMPT, OUTPUT = 64, 24
ATTEMPTS = 3


def fail(msg):
    print(f"e2e_test: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def at(p, s, k):
    out = subprocess.run(PROFILE + ["--at", f"{p},{s},{k}", "--repeats", "25"], check=True,
                         capture_output=True, text=True).stdout
    return float(out)


def main():
    if len(sys.argv) != 2 or not os.access(sys.argv[1], os.X_OK):
        fail("usage: e2e_test.py PATH/TO/cancelsim (an executable)")
    binary = os.path.abspath(sys.argv[1])
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for n in range(1, ATTEMPTS + 1):
        # An exact miss exits inside, leaving its files to look at; a timed one leaves none.
        work = Path(tempfile.mkdtemp(prefix="cancelsim-e2e-"))
        missed = attempt(binary, work)
        shutil.rmtree(work)
        if missed is None:
            return
        print(f"e2e_test: attempt {n} of {ATTEMPTS}: {missed}", file=sys.stderr)
    fail(f"every attempt missed; the last: {missed}")


def attempt(binary, work):
    """One whole check on a fresh table in `work`: None if it holds, else what the timing
    missed. An exact miss (steps 1 and 2) fails at once."""
    table = work / "tiny.csv"
    subprocess.run(PROFILE + ["--out", str(table), "--prefill", "0,64,256", "--seqs", "0,1,8",
                              "--kv", "0,512,4096"], check=True)
    grid = {}
    for line in table.read_text().splitlines():
        if line[:1].isdigit():
            p, s, k, ms = line.split(",")
            grid[(int(p), int(s), int(k))] = float(ms)
    if len(grid) != 27:
        fail(f"{table}: {len(grid)} grid points, 27 expected")
    scenario = work / "tiny.ron"
    scenario.write_text(f"""Scenario(name: "tiny-table", seed: 1,
    workload: (source: Poisson(rate_per_s: 1.0, requests: 1),
        prompt_tokens: Constant({PROMPT}.0), output_tokens: Constant({OUTPUT}.0)),
    cluster: (profile: Table(path: "tiny.csv", kv_blocks_16: 1000),
        scheduler: Continuous(window: 1, prefix_caching: false)))
""")
    subprocess.run([binary, "run", str(scenario), "--out", str(work / "out"), "--data-root", str(work)],
                   check=True, capture_output=True, cwd=work)
    traces = list((work / "out").glob("*/*/trace.json"))
    if len(traces) != 1:
        fail(f"expected one trace.json under {work / 'out'}, found {len(traces)}")
    events = json.loads(traces[0].read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps = [e for e in events if e.get("name") == "step" and e.get("pid") == 0]
    if len(steps) < OUTPUT:
        fail(f"{len(steps)} steps in the counterfactual's trace, {OUTPUT} expected")
    steps = steps[:OUTPUT]
    prefill_ms = steps[0]["dur"] / 1e3
    if abs(prefill_ms - grid[(PROMPT, 0, 0)]) > 0.002:
        fail(f"the prefill step took {prefill_ms} ms, the table's point {grid[(PROMPT, 0, 0)]} ms")
    lo, hi = grid[(0, 1, 0)], grid[(0, 1, 512)]
    for i in (1, OUTPUT // 2, OUTPUT - 1):
        ctx = PROMPT + i
        sim_ms = steps[i]["dur"] / 1e3
        line = lo + (hi - lo) * ctx / 512
        if abs(sim_ms - line) > 0.002:
            fail(f"decode at context {ctx}: simulated {sim_ms} ms, the table's straight line "
                 f"between its points {line:.4f} ms")
    again = [at(0, 1, 0) for _ in range(4)]
    spread = max(again) - min(again)
    bound = abs(hi - lo) + spread + 0.05
    worst = 0.0
    for i in (1, OUTPUT // 2, OUTPUT - 1):
        ctx = PROMPT + i
        sim_ms = steps[i]["dur"] / 1e3
        # The median of three timings: a spike of a shared machine passes, a model that is off
        # does not.
        measured = sorted(at(0, 1, ctx) for _ in range(3))[1]
        worst = max(worst, abs(sim_ms - measured))
        print(f"decode at context {ctx}: simulated {sim_ms:.4f} ms, measured {measured:.4f} ms")
        if abs(sim_ms - measured) > bound:
            return (f"decode at context {ctx}: simulated {sim_ms:.4f} ms, measured "
                    f"{measured:.4f} ms, beyond the bound {bound:.4f} ms")
    print(f"e2e_test: ok: prefill {prefill_ms:.4f} ms equals the table; decodes within "
          f"{worst:.4f} ms of the measured steps (bound {bound:.4f} ms)")
    return None


if __name__ == "__main__":
    main()
