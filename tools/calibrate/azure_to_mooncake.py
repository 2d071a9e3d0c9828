#!/usr/bin/env python3
"""Write an Azure LLM 2023 trace (TIMESTAMP,ContextTokens,GeneratedTokens) as Mooncake JSON
lines, for AI Simulate, which reads Mooncake traces: `timestamp` in ms after the first row,
`input_length`, `output_length`, and `hash_ids` fresh for every row (one per 512-token block), so
no two prompts share a cached prefix, as in cancelsim's replay of the Azure trace.

    python3 tools/calibrate/azure_to_mooncake.py scenarios/traces/azure_llm_2023_conv.csv > conv.jsonl
"""

import csv
import datetime
import json
import sys


def main(argv):
    if len(argv) != 2:
        print("usage: azure_to_mooncake.py TRACE.csv", file=sys.stderr)
        sys.exit(2)
    with open(argv[1], newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"azure_to_mooncake: {argv[1]}: no rows", file=sys.stderr)
        sys.exit(1)

    def at(row):
        # Azure writes 7 fractional digits; Python parses 6.
        stamp = row["TIMESTAMP"][:26]
        return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f")

    t0 = at(rows[0])
    next_hash = 0
    for row in rows:
        n_in, n_out = int(row["ContextTokens"]), int(row["GeneratedTokens"])
        blocks = -(-n_in // 512)
        hashes = list(range(next_hash, next_hash + blocks))
        next_hash += blocks
        ms = (at(row) - t0).total_seconds() * 1e3
        print(json.dumps({"timestamp": round(ms, 3), "input_length": n_in,
                          "output_length": n_out, "hash_ids": hashes}))


if __name__ == "__main__":
    main(sys.argv)
