#!/usr/bin/env bash
# A restart as operators script it without the collection when they check it as the restart chain does: restart
# the unit, ask /health every 0.1 s until 200, send one generation and require its answer, then wait WINDOW_S and
# require the same MainPID and restart count as at the first 200 (an engine that exits right after it became
# ready fails here). Prints the wall-clock start, the end of the generation (serving) and the end of the wait:
# "START SERVING STOP".
#   restart_checked.sh UNIT URL WINDOW_S [TIMEOUT_S]
set -u
unit=$1 url=$2 window=$3 timeout=${4:-900}

healthy() {
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=30)' "$url/health" 2>/dev/null
}

generates() {
  python3 - "$url" <<'PY'
import json, sys, urllib.request
body = json.dumps({"text": "Say hello.", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).encode()
request = urllib.request.Request(sys.argv[1] + "/generate", body, {"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as response:
    sys.exit(0 if json.load(response).get("text") else 1)
PY
}

watched() {
  systemctl show -P MainPID "$unit"
  systemctl show -P NRestarts "$unit"
}

start=$(date +%s.%N)
systemctl restart "$unit" || exit 1
until healthy; do
  if systemctl is-failed --quiet "$unit"; then
    echo "$unit failed: $(journalctl -u "$unit" -n 3 --no-pager -o cat | tr '\n' ' ')" >&2
    exit 1
  fi
  if (($(date +%s) - ${start%.*} > timeout)); then
    echo "no /health 200 within ${timeout} s" >&2
    exit 1
  fi
  sleep 0.1
done
first=$(watched)
generates || { echo "the generation after the first /health 200 failed" >&2; exit 1; }
serving=$(date +%s.%N)
sleep "$window"
if [ "$(watched)" != "$first" ] || ! systemctl is-active --quiet "$unit"; then
  echo "$unit did not stay up for ${window} s: MainPID and NRestarts $(echo $first) then $(echo $(watched))" >&2
  exit 1
fi
echo "$start $serving $(date +%s.%N)"
