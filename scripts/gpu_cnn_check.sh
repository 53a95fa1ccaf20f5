#!/bin/bash
# The cnn (issue 19) on a GPU machine: one batch's evaluation logits, training loss, every gradient and the
# updated BatchNorm running statistics from `meshstudio-engine dump` on the GPU in fp32, against the
# independent PyTorch model of tests/reference/reference.py (float64, on the CPU), and a short training run
# on the GPU. Run from the repository root with .gpu carried (scripts/gpu_bundle.sh); gpu_check.sh calls it.
#   bash scripts/gpu_cnn_check.sh [WORK_DIR]
set -u
work=${1:-$(mktemp -d)}
mkdir -p "$work"
run=.gpu/run.sh
data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
  # The GPU machines have no Debian dataset package: four small IDX files of random images stand in (the
  # comparison needs real inputs, not real classes).
  data=$work/fashion
  mkdir -p "$data"
  python3 - "$data" <<'PY'
import gzip, os, random, struct, sys
d = sys.argv[1]
random.seed(7)
for split, n in (("train", 256), ("t10k", 64)):
    with gzip.open(f"{d}/{split}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + bytes(random.randrange(256) for _ in range(n * 784)))
    with gzip.open(f"{d}/{split}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, n) + bytes(random.randrange(10) for _ in range(n)))
PY
fi
cat >"$work/cnn.json" <<JSON
{"version": 1, "name": "gpu-cnn", "seed": 5, "device": "${MS_CNN_DEVICE:-cuda}",
 "model": {"type": "cnn", "channels": [16, 32], "blocks": 2, "bn_momentum": 0.3},
 "data": {"kind": "fashion_mnist", "dir": "$data"},
 "optimizer": {"type": "adamw", "lr": 0.003},
 "training": {"steps": 20, "batch_size": 32, "eval_batches": 2, "checkpoint_every": 0, "log_every": 5}}
JSON
timeout 120 $run meshstudio-engine dump "$work/cnn.json" --out "$work/dump" --samples 8 >"$work/dump.txt" 2>&1
echo "cnn dump on the GPU: exit $?"
tail -2 "$work/dump.txt"
timeout 120 ${PYTHON:-python3} tests/reference/reference.py "$work/dump" >"$work/reference.txt" 2>&1
echo "cnn GPU dump against PyTorch (reference.py): exit $?"
grep -E "MISMATCH|tensors match|mismatch" "$work/reference.txt"
grep -E "^(logits|loss)" "$work/reference.txt"
timeout 120 $run meshstudio-engine train "$work/cnn.json" --run-dir "$work/train" --quiet >"$work/train.txt" 2>&1
echo "cnn training on the GPU (20 steps): exit $?"
python3 - "$work/train/metrics.jsonl" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"type": "step"' in l or '"type":"step"' in l]
if steps:
    print(f"cnn GPU training: loss {steps[0]['loss']:.4f} at step 1, {steps[-1]['loss']:.4f} at step "
          f"{steps[-1]['step']}; {sum(s['step_time_s'] for s in steps[1:]) / max(1, len(steps[1:])) * 1e3:.1f} ms/step")
PY
