#!/usr/bin/env bash
# Behaviour unchanged by a refactor? Runs six simulator configurations (one replica and several,
# four routers, policies, static batching, swap, Mooncake prefixes, the shared-prefix workload)
# in this checkout and in a temporary worktree of REV, and compares the JSON summaries key by key
# (wall-clock keys and the fast path's share of steps aside).
# Usage: scripts/same_results.sh REV   (exit 1 if any differs)
set -euo pipefail
rev=${1:?usage: scripts/same_results.sh REV}
here=$(git rev-parse --show-toplevel)
py=$here/.venv/bin/python
tmp=$(mktemp -d)
trap 'git -C "$here" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git -C "$here" worktree add -q --detach "$tmp/base" "$rev"
run() {  # tree outdir
  local T=$here/traces
  local P=(env PYTHONPATH="$1" "$py" -m sim run --no-progress)
  mkdir -p "$2"
  (cd "$1"
   "${P[@]}" --trace "$T/azure_llm_2023_conv.csv" --num-requests 3000 --json "$2/a.json"
   "${P[@]}" --trace "$T/azure_llm_2023_code.csv" --num-requests 2000 --replicas 3 --router least_kv --policy sjf \
     --json "$2/b.json"
   "${P[@]}" --trace "$T/mooncake_fast25_synthetic_trace.jsonl" --num-requests 800 --replicas 2 --router prefix_aware \
     --model llama-3-8b --hardware h100 --json "$2/c.json"
   "${P[@]}" --trace "$T/azure_llm_2023_conv.csv" --num-requests 500 --static-batching --static-batch-size 8 \
     --json "$2/d.json"
   "${P[@]}" --trace "$T/azure_llm_2023_conv.csv" --num-requests 1500 --preemption swap --swap-space-gib 4 \
     --num-gpu-blocks 400 --time-scale 0.3 --json "$2/e.json"
   "${P[@]}" --shared-prefix 4,512,64,32 --num-requests 300 --rate 20 --replicas 2 --router round_robin \
     --json "$2/f.json") > /dev/null
}
run "$tmp/base" "$tmp/out_base"
run "$here" "$tmp/out_new"
"$py" - "$tmp" <<'PY'
import json, sys
tmp, bad = sys.argv[1], 0
for n in "abcdef":
    docs = [json.load(open(f"{tmp}/{side}/{n}.json")) for side in ("out_base", "out_new")]
    for d in docs:
        # how fast the run went, and how (the share of steps the fast path took): not what it simulated
        for k in ("wall_time_s", "sim_requests_per_wall_s", "fast_path_step_fraction"):
            d.pop(k, None)
    diff = sorted(k for k in set(docs[0]) | set(docs[1]) if docs[0].get(k) != docs[1].get(k))
    bad += bool(diff)
    print(f"config {n}: {'identical' if not diff else 'DIFFERENT in ' + ', '.join(diff)}")
sys.exit(1 if bad else 0)
PY
