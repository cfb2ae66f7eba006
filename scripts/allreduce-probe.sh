#!/usr/bin/env bash
# Time one cached one-float allreduce on emulated fleets of several sizes: the measurement the
# simulator's coordination and tiny rings are checked against (tests/simulate/test_protocol.py).
# Usage: scripts/allreduce-probe.sh OUTPUT.jsonl [DEVICES...]   (default devices: 16 8 4)
# Each size: `globaldl fleet up`, REPEATS runs of `globaldl.fleet.allreduce_probe` (rank 0's
# times), `globaldl fleet down`. One JSON line per run and probed size (devices, repeat, the
# 1-minute load before the run, the Horovod build's source edits and the probe's result),
# appended to OUTPUT once every run has succeeded. Needs root (network namespaces); run it on an
# otherwise quiet machine.
# Environment: REPEATS (3), PROFILE (custom:5:20:50), CPU (0.125), BYTES (4: each rank's bytes,
# comma-separated) and COLLECTIVES (allreduce; "allgather allreduce" runs both, interleaved).
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
bytes=${BYTES:-4}
read -r -a collectives <<<"${COLLECTIVES:-allreduce}"
cycle_ms=5
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
    for collective in "${collectives[@]}"; do
      load=$(cut -d' ' -f1 /proc/loadavg)
      echo "[probe] $devices devices: $collective run $repeat of $repeats (load $load)"
      log=$logs/run-$devices-$collective-$repeat.log
      if ! HOROVOD_CYCLE_TIME=$cycle_ms "$gdl" fleet run --state-dir "$state" --exec -- \
        .venv/bin/python -m globaldl.fleet.allreduce_probe --collective "$collective" \
        --bytes "$bytes" >"$log" 2>&1; then
        echo "[probe] the run failed; its log: $log" >&2
        exit 1
      fi
      .venv/bin/python - "$log" "$devices" "$repeat" "$load" "$profile" "$cpu" "$cycle_ms" \
        >>"$logs/runs.jsonl" <<'EOF'
import json
import sys
from pathlib import Path

from globaldl import horovod_edits
from globaldl.fleet.allreduce_probe import results_in

log, devices, repeat, load, profile, cpu, cycle_ms = sys.argv[1:]
found = results_in(Path(log).read_text())
if not found:
    sys.exit(f"[probe] no result in the run's log: {log}")
run = {"devices": int(devices), "repeat": int(repeat), "load_1m": float(load)}
setting = {"profile": profile, "cpu_cores": float(cpu), "cycle_time_ms": int(cycle_ms)}
# The build's source edits: gathers changed with "gloo-allgather-receive-first".
setting["horovod_edits"] = list(horovod_edits.installed())
for result in found:
    print(json.dumps(run | setting | result))
EOF
    done
  done
  down
  state=""
done
# Only a complete measurement reaches OUTPUT: a failed run above left it untouched.
cat "$logs/runs.jsonl" >>"$output"
echo "[probe] written to $output"
