#!/usr/bin/env bash
# The cancel storm on the Mooncake trace (600 rows, 30 % cancelled at random stages, four
# 8B/H100 replicas) on each serving graph the library runs it on, side by side: leaked GPU
# time, KV block-seconds retained (in the engines, and held by the handoff's cleanup owners),
# and sibling survival, per policy. Usage: tools/graphs-storm-table.sh [path/to/cancelsim]
set -euo pipefail
bin=${1:-cancelsim}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
lib="$root/scenarios/library"
# Colocated behind round robin: the KV-routing scenario with its router swapped.
sed 's/router: KvAware(overlap_weight: 1, load_weight: 4, lag_us: 50000)/router: RoundRobin/;
     s/name: "kv-routing-mooncake-storm"/name: "colocated-mooncake-storm"/;
     s#"\.\./traces/#"'"$root"'/scenarios/traces/#' \
    "$lib/kv-routing-mooncake-storm.ron" > "$out/colocated.ron"
sed -i '/expect: \[/,/^    \],/d' "$out/colocated.ron"
# 2P2D behind the KV-aware router, without conditional disaggregation: the prefix scenario with
# its router swapped (so it differs from the KV-routed conditional one by the rule alone).
sed 's/router: LeastLoaded/router: KvAware(overlap_weight: 1, load_weight: 4, lag_us: 50000)/;
     s/name: "pd-prefix-mooncake-storm"/name: "pd-kv-mooncake-storm"/;
     s#"\.\./traces/#"'"$root"'/scenarios/traces/#' \
    "$lib/pd-prefix-mooncake-storm.ron" > "$out/pd-kv.ron"
sed -i '/expect: \[/,/^    \],/d' "$out/pd-kv.ron"
runs=("colocated, round robin:$out/colocated.ron"
      "colocated, KV-aware:$lib/kv-routing-mooncake-storm.ron"
      "2P2D:$lib/pd-prefix-mooncake-storm.ron"
      "2P2D, conditional:$lib/pd-conditional-mooncake-storm.ron"
      "2P2D, KV-aware:$out/pd-kv.ron"
      "2P2D, KV-aware, conditional:$lib/pd-kv-routed-mooncake-storm.ron")
cat > "$out/table.py" <<'PY'
import json, sys
print("| graph | policy | leaked GPU-s | retained block-s (engines) | held block-s (handoff) | sibling survival | prefix hit rate | KV sent (GB) |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for line in sys.stdin:
    graph, path = line.rstrip("\n").split("\t")
    for p in json.load(open(path))["policies"]:
        h = p.get("handoff")
        held = h["prefill"]["retained_block_s"] + h["decode"]["retained_block_s"] if h else 0.0
        sent = h["transfer_bytes"] / 1e9 if h else 0.0
        row = (graph, p["policy"], p["leaked_work"]["gpu_s"], p["retained"]["kv_block_s"], held,
               p["sibling_survival"]["rate"], p["kv"]["prefix_hit_rate"], sent)
        print("| %s | %s | %.2f | %.0f | %.0f | %.3f | %.3f | %.1f |" % row)
PY
i=0
for r in "${runs[@]}"; do
    graph=${r%%:*}
    file=${r#*:}
    i=$((i + 1))
    "$bin" run "$file" --out "$out/runs/$i" --data-root / --trace-events 0 > /dev/null
    printf '%s\t%s\n' "$graph" "$(echo "$out"/runs/$i/*/*/summary.json)"
done | python3 "$out/table.py"
