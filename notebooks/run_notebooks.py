#!/usr/bin/env python3
"""Execute every notebook in this folder headless (nbclient), from the repository root.

Exits non-zero on the first cell error. No timestamps are recorded, so the executed notebooks are
byte-stable for the same data; they are not written back.
"""
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

here = pathlib.Path(__file__).resolve().parent
root = here.parent
failed = False
for path in sorted(here.glob("*.ipynb")):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(root)}})
    try:
        client.execute()
        print(f"ok   {path.name}")
    except Exception as e:  # CellExecutionError and kernel failures alike
        print(f"FAIL {path.name}: {e}", file=sys.stderr)
        failed = True
sys.exit(1 if failed else 0)
