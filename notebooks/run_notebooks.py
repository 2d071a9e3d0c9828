#!/usr/bin/env python3
"""Execute every notebook in this folder headless (nbclient), from the repository root.

Each executed notebook, with its outputs (figures inline), is saved beside the data it read:
`run_report.ipynb` into the run directory (`CANCELSIM_RUN`), `sweep_comparison.ipynb` into the
sweep directory (`CANCELSIM_SWEEP`), `jobs_sweep.ipynb` into the jobs sweep's
(`CANCELSIM_JOBS_SWEEP`), each written to a temporary file and renamed. The notebooks in
this folder are never rewritten. No timestamps are recorded, so the saved notebooks are
byte-stable for the same data. Exits non-zero on the first cell error.
"""
import os
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

here = pathlib.Path(__file__).resolve().parent
root = here.parent
# Where each notebook's data is, so its executed copy goes there.
BESIDE = {
    "run_report.ipynb": "CANCELSIM_RUN",
    "sweep_comparison.ipynb": "CANCELSIM_SWEEP",
    "jobs_sweep.ipynb": "CANCELSIM_JOBS_SWEEP",
}

failed = False
for path in sorted(here.glob("*.ipynb")):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(root)}})
    try:
        client.execute()
    except Exception as e:  # CellExecutionError and kernel failures alike
        print(f"FAIL {path.name}: {e}", file=sys.stderr)
        failed = True
        continue
    target = os.environ.get(BESIDE.get(path.name, ""), "")
    if target:
        out = pathlib.Path(target) / path.name
        tmp = out.with_suffix(".ipynb.tmp")
        nbformat.write(nb, str(tmp))
        os.replace(tmp, out)
        print(f"ok   {path.name} -> {out}")
    else:
        print(f"ok   {path.name} (not saved: {BESIDE.get(path.name, 'no directory')} is unset)")
sys.exit(1 if failed else 0)
