#!/usr/bin/env bash
# Freeing a GPU by hand, without the collection: SIGTERM the holder, wait the grace period, SIGKILL it, then watch
# nvidia-smi until GPU GPU's used memory is back to BASELINE_MIB (polled every POLL_S seconds).
# Prints the wall-clock start, the SIGKILL and the stop: "START KILLED STOP".
#   reap.sh PID GRACE_S GPU BASELINE_MIB POLL_S
set -u
pid=$1 grace=$2 gpu=$3 baseline=$4 poll=$5

used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$gpu"; }

start=$(date +%s.%N)
kill -TERM "$pid"
sleep "$grace"
killed=$(date +%s.%N)
kill -KILL "$pid" 2>/dev/null
until (($(used) <= baseline)); do
  if (($(date +%s) - ${start%.*} > 120)); then
    echo "GPU $gpu still uses $(used) MiB" >&2
    exit 1
  fi
  sleep "$poll"
done
echo "$start $killed $(date +%s.%N)"
