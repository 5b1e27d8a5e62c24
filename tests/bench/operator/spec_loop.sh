#!/usr/bin/env bash
# A speculative sweep as operators run it without the collection, point by point (relaunch with the point's flags,
# wait until the server is ready, send the benchmark requests), the lean way, on a plain unit: rewrite the point's
# flags in the unit's ExecStart, restart, ask /health every 0.1 s (as often as the restart chain looks) until 200,
# run plain_bench.py; at the end put the original unit back, restart and wait again. SGLang's own
# bench_speculative.py waits longer per point and loads a point once per batch size (bench_speculative.sh).
# Prints one JSON line per point, then one for the restore, each with its wall-clock start, ready and stop.
#   spec_loop.sh UNIT URL REQUESTS_JSON STEPS...
set -eu
unit=$1 url=$2 requests=$3
shift 3
file=/etc/systemd/system/$unit
here=$(dirname "$0")
cp "$file" "$file.orig"

healthy() {
  if command -v curl >/dev/null; then
    curl -sf -o /dev/null "$url/health"
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=30)' "$url/health" 2>/dev/null
  fi
}

# Returns non-zero when the unit fails instead of serving (a point whose load fails is recorded and skipped).
restart_and_wait() {
  systemctl daemon-reload
  systemctl restart "$unit" || return 1
  local began=$SECONDS
  until healthy; do
    if systemctl is-failed --quiet "$unit" || ((SECONDS - began > 900)); then
      return 1
    fi
    sleep 0.1
  done
}

for steps in "$@"; do
  start=$(date +%s.%N)
  sed -i -E "s/--speculative-num-steps [0-9]+/--speculative-num-steps $steps/; \
s/--speculative-num-draft-tokens [0-9]+/--speculative-num-draft-tokens $((steps + 1))/" "$file"
  if ! restart_and_wait; then
    echo "{\"steps\": $steps, \"start\": $start, \"failed\": true, \"stop\": $(date +%s.%N)}"
    continue
  fi
  ready=$(date +%s.%N)
  bench=$(python3 "$here/plain_bench.py" "$url" "$requests")
  echo "{\"steps\": $steps, \"start\": $start, \"ready\": $ready, \"stop\": $(date +%s.%N), \"bench\": $bench}"
done
start=$(date +%s.%N)
mv "$file.orig" "$file"
restart_and_wait || exit 1
echo "{\"restore\": true, \"start\": $start, \"ready\": $(date +%s.%N), \"stop\": $(date +%s.%N)}"
