#!/usr/bin/env bash
# Our own H200 measurement, in one bounded run on a machine with one H200 (PyTorch installed):
# Llama-3.1-8B's layer on the Table grid, KV to 512k tokens (a whole replica at 1M KV tokens
# would need more than the H200's memory, which the profiler refuses, naming the point), then
# the table beside the roofline. Writes to ${OUT:-.}:
#   llama-3.1-8b-h200-measured.csv   (commit as scenarios/profiles/llama-3.1-8b-h200-measured.csv)
#   check-roofline.csv               (cancelsim profiles --check against llama-3.1-8b-h200, if
#                                     a cancelsim binary is given as $1)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-.}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 480 python3 tools/profile/profile.py --model llama-3.1-8b --backend torch \
  --prefill 0,128,512,2048,8192 --seqs 0,1,16,64,256,1024 --kv 0,16384,131072,524288 \
  --out "$out/llama-3.1-8b-h200-measured.csv" --force
if [[ $# -ge 1 ]]; then
  "$1" profiles --check "$out/llama-3.1-8b-h200-measured.csv" --against llama-3.1-8b-h200 \
    > "$out/check-roofline.csv"
fi
