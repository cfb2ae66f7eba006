#!/usr/bin/env bash
# The main job end to end on the embedded default: a real Prometheus on loopback, LeNet on the
# real MNIST subset trained by two Horovod processes (Gloo) with top-k 1% + int8 gradient
# compression and a metrics exporter each, the Grafana dashboards written as code, and a
# markdown + PNG report naming each device's bottleneck.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export TF_CPP_MIN_LOG_LEVEL=2
out=${GLOBALDL_DEMO_DIR:-runs/demo}
metrics_port=${GLOBALDL_DEMO_METRICS_PORT:-19100}
run_id="demo-$(date -u +%Y%m%dT%H%M%SZ)"
gdl=.venv/bin/globaldl
mkdir -p "$out"

stop_prometheus() {
  if [[ ${GLOBALDL_DEMO_KEEP_PROMETHEUS:-0} == 1 ]]; then
    echo "[demo] Prometheus keeps running (globaldl monitor down to stop it)"
  else
    "$gdl" monitor down >/dev/null || true
  fi
}
echo "[demo] 1/5 starting Prometheus on loopback"
"$gdl" monitor up
trap stop_prometheus EXIT
"$gdl" monitor targets --run "$run_id" -H localhost:2 --metrics-port "$metrics_port"

echo "[demo] 2/5 training LeNet on MNIST: 2 Horovod processes, top-k 1% + int8, exporters on :$metrics_port-:$((metrics_port + 1))"
.venv/bin/horovodrun -np 2 -H localhost:2 --gloo \
  "$gdl" train --model lenet --dataset mnist --epochs 3 \
  --prune topk --density 0.01 --quantize int8 \
  --metrics-port "$metrics_port" --run-id "$run_id" \
  --checkpoint-dir "$out/checkpoints" --summary "$out/summary.json"

echo "[demo] 3/5 writing the Grafana dashboards (deploy/grafana/dashboards/)"
"$gdl" dashboards build

echo "[demo] 4/5 writing the report from Prometheus ($out/report/)"
"$gdl" report --prometheus http://127.0.0.1:19090 --run "$run_id" --out "$out/report"

echo "[demo] 5/5 run summary ($out/summary.json):"
.venv/bin/python - "$out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
keys = ["run_id", "model", "dataset", "ranks", "epochs", "steps", "global_batch_size",
        "val_accuracy", "val_loss", "wall_seconds", "gradient_bytes_raw", "gradient_bytes_wire",
        "compression_ratio", "weights_identical"]
for key in keys:
    print(f"  {key:20s} {s[key]}")
print("  phase_seconds       ", {k: round(v, 3) for k, v in s["phase_seconds"].items()})
PY
