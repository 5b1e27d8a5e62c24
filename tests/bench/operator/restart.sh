#!/usr/bin/env bash
# A restart as operators script it without the collection: restart the unit, then ask /health until it answers
# 200 (a unit that fails instead ends the script). It asks every 0.1 s, as often as the restart chain looks, so that
# neither side gains or loses by when it happens to look. Prints the wall-clock start and stop of that work:
# "START STOP".
#   restart.sh UNIT URL [TIMEOUT_S]
set -u
unit=$1 url=$2 timeout=${3:-900}

healthy() {
  # curl -sf, where the host has curl; the lab's hosts have none, and python3's urllib asks the same way
  # (no answer or a status >= 400 is "not yet").
  if command -v curl >/dev/null; then
    curl -sf -o /dev/null "$url/health"
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=30)' "$url/health" 2>/dev/null
  fi
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
echo "$start $(date +%s.%N)"
