#!/usr/bin/env bash
# SGLang's scripts/playground/bench_speculative.py, step for step from its source, on a plain unit: for each batch
# size, for each point, it launches a server with the point's flags and --cuda-graph-max-bs and
# --max-running-requests set to the batch size (popen_launch_server), asks /health_generate with a 5 s timeout every
# 10 s until it answers 200 (sglang/test/test_utils.py _wait_for_server_health), sends one warm-up batch of
# batch-size prompts and then the benchmark's prompts at that concurrency (send_one_batch), kills the server
# (kill_process_tree) and sleeps 5 s. Here the server is the unit, its ExecStart rewritten per point. It leaves no
# server running; to compare like for like with a sweep that restores the original, the original unit is put
# back and started at the end, waited for the same way.
# Prints one JSON line per (batch size, point), then one for the restore, each with its wall-clock start and stop.
#   bench_speculative.sh UNIT URL REQUESTS_JSON STEPS...
set -eu
unit=$1 url=$2 requests=$3
shift 3
file=/etc/systemd/system/$unit
here=$(dirname "$0")
work=$(mktemp -d)
cp "$file" "$work/original"

healthy() {
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$url/health_generate" \
    2>/dev/null
}

launch_and_wait() {
  systemctl daemon-reload
  systemctl restart "$unit" || return 1
  local began=$SECONDS
  until healthy; do
    if systemctl is-failed --quiet "$unit" || ((SECONDS - began > 600)); then
      return 1
    fi
    sleep 10
  done
}

# One level of REQUESTS_JSON as plain_bench.py reads it: its first batch-size prompts as the warm-up, then its
# prompts once at its concurrency. Prints the batch sizes.
batch_sizes=$(python3 - "$requests" "$work" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
for index, level in enumerate(spec["levels"]):
    one = dict(spec, warmup=level["prompts"][: level["concurrency"]], levels=[level], repeats=1)
    with open(f"{sys.argv[2]}/level-{index}.json", "w") as out:
        json.dump(one, out)
    print(level["concurrency"])
PY
)

index=0
for batch_size in $batch_sizes; do
  for steps in "$@"; do
    start=$(date +%s.%N)
    sed -E "s/--speculative-num-steps [0-9]+/--speculative-num-steps $steps/; \
s/--speculative-num-draft-tokens [0-9]+/--speculative-num-draft-tokens $((steps + 1))/; \
/^ExecStart=/ s/$/ --cuda-graph-max-bs $batch_size --max-running-requests $batch_size/" "$work/original" >"$file"
    if launch_and_wait; then
      ready=$(date +%s.%N)
      bench=$(python3 "$here/plain_bench.py" "$url" "$work/level-$index.json")
      systemctl stop "$unit"
      echo "{\"batch_size\": $batch_size, \"steps\": $steps, \"start\": $start, \"ready\": $ready, \"bench\": $bench, \"stop\": $(date +%s.%N)}"
    else
      systemctl stop "$unit" || true
      echo "{\"batch_size\": $batch_size, \"steps\": $steps, \"start\": $start, \"failed\": true, \"stop\": $(date +%s.%N)}"
    fi
    sleep 5
  done
  index=$((index + 1))
done
start=$(date +%s.%N)
cp "$work/original" "$file"
rm -rf "$work"
launch_and_wait || exit 1
echo "{\"restore\": true, \"start\": $start, \"ready\": $(date +%s.%N), \"stop\": $(date +%s.%N)}"
