#!/usr/bin/env bash
# Time one cached one-float allreduce on emulated fleets of several sizes: the measurement the
# simulator's coordination and tiny rings are checked against (tests/simulate/test_protocol.py).
# Usage: scripts/allreduce-probe.sh OUTPUT.jsonl [DEVICES...]   (default devices: 16 8 4)
# Each size: `globaldl fleet up`, REPEATS runs of `globaldl.fleet.allreduce_probe` (rank 0's
# times), `globaldl fleet down`. One JSON line per run: devices, repeat, the 1-minute load
# before the run, and the probe's result. Needs root (network namespaces); run it on an
# otherwise quiet machine. Environment: REPEATS (3), PROFILE (custom:5:20:50), CPU (0.125).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
if [[ $# -lt 1 ]]; then
  echo "usage: $0 OUTPUT.jsonl [DEVICES...]" >&2
  exit 2
fi
output=$1
shift
if [[ $# -gt 0 ]]; then sizes=("$@"); else sizes=(16 8 4); fi
repeats=${REPEATS:-3}
profile=${PROFILE:-custom:5:20:50}
cpu=${CPU:-0.125}
gdl=.venv/bin/globaldl
for devices in "${sizes[@]}"; do
  if ! [[ $devices =~ ^[0-9]+$ ]] || ((devices < 2)); then
    echo "devices must be whole numbers >= 2, got '$devices'" >&2
    exit 2
  fi
done
logs=$(mktemp -d)
state=""
down() { [[ -n $state ]] && "$gdl" fleet down --state-dir "$state" >/dev/null 2>&1 || true; }
trap down EXIT
for devices in "${sizes[@]}"; do
  state=/run/globaldl-probe-n$devices
  echo "[probe] $devices devices: fleet up ($profile, $cpu core each)"
  "$gdl" fleet up -n "$devices" --profile "$profile" --cpu "$cpu" --latency require \
    --state-dir "$state" >"$logs/up-$devices.log"
  for ((repeat = 1; repeat <= repeats; repeat++)); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "[probe] $devices devices: run $repeat of $repeats (load $load)"
    HOROVOD_CYCLE_TIME=5 "$gdl" fleet run --state-dir "$state" --exec -- \
      .venv/bin/python -m globaldl.fleet.allreduce_probe >"$logs/run-$devices-$repeat.log" 2>&1
    result=$(grep '^ALLREDUCE_PROBE ' "$logs/run-$devices-$repeat.log" | tail -1)
    if [[ -z $result ]]; then
      echo "[probe] no result; the run's log: $logs/run-$devices-$repeat.log" >&2
      exit 1
    fi
    .venv/bin/python -c 'import json, sys
line = {"devices": int(sys.argv[1]), "repeat": int(sys.argv[2]), "load_1m": float(sys.argv[3]),
        "profile": sys.argv[4], "cpu_cores": float(sys.argv[5]), "cycle_time_ms": 5}
print(json.dumps(line | json.loads(sys.argv[6].split(" ", 1)[1])))' \
      "$devices" "$repeat" "$load" "$profile" "$cpu" "$result" >>"$output"
  done
  down
  state=""
done
echo "[probe] written to $output"
