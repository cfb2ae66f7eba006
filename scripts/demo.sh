#!/usr/bin/env bash
# The main job end to end on the embedded default: LeNet on the real MNIST subset, trained by
# two Horovod processes exchanging gradients over Gloo, with the run summary printed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
out=${GLOBALDL_DEMO_DIR:-runs/demo}
mkdir -p "$out"
echo "[demo] training LeNet on MNIST with 2 Horovod processes (Gloo)"
.venv/bin/horovodrun -np 2 -H localhost:2 --gloo \
  .venv/bin/globaldl train --model lenet --dataset mnist --epochs 2 \
  --checkpoint-dir "$out/checkpoints" --summary "$out/summary.json"
echo "[demo] run summary ($out/summary.json):"
.venv/bin/python -m json.tool "$out/summary.json"
