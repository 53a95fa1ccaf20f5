#!/bin/sh
# Every GPU check of issue 6 in one command, for a GPU machine's short lease. Here: scripts/gpu_bundle.sh; then
# on the GPU machine, with .gpu carried, from the repository root:  scripts/gpu_check.sh
# Logs go to $OUT (the device tool's folder) or /tmp/gpu-check; a summary is printed.
#  1. tst_backend gpu: every Backend op on CUDA against the CPU backend (fp32 and bf16), memory, marks.
#  2. tst_cuda_kernels: every CUDA kernel against its CPU reference; its plain flashAttention cases again with
#     MESHSTUDIO_FLASH_TC=0 (the scalar kernel where bf16 would take the tensor-core one).
#  2b. bench_attention: the fused attention's scalar and tensor-core kernels and the materialised path, timed
#     on GPT-2 124M's attention (exit 1 when tensor-core and scalar results disagree).
#  3. Parity: a small GPT trained 20 steps in fp32 on the GPU and on the CPU (the losses agree to 1e-4
#     relative), and in bf16 on the GPU (tracks fp32 within 1%; with MESHSTUDIO_FLASH_TC=0 too, and the
#     tensor-core attention's losses track the scalar one's within 1%).
#  3b. Gradients: `dump` (one batch's logits, loss and every parameter's gradient) on the CPU and on the GPU in
#     fp32 from the same initial weights: per tensor ||g_gpu - g_cpu|| / ||g_cpu|| <= 1e-4; and the plan's
#     predicted activation memory against the measured peak of the GPU runs (fp32 and bf16).
#  4. Ranks sharing the GPU: dp2 and pp2 (2 ranks on one GPU, MPI with host staging) match one rank's losses
#     (1e-5 relative), with the bundle's relocated mpirun.
#  5. bench/gpu_vs_torch.py: GPT-2 124M tokens/s and MFU of the engine and PyTorch eager, bf16 and fp32.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
run=.gpu/run.sh
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
$run tst_backend gpu >"$out/tst_backend_gpu.txt" 2>&1
echo "tst_backend gpu: exit $? ($(grep -c '^FAIL' "$out/tst_backend_gpu.txt") failures, $(grep -c '^SKIP' "$out/tst_backend_gpu.txt") skipped)"
$run tst_cuda_kernels >"$out/tst_cuda_kernels.txt" 2>&1
echo "tst_cuda_kernels: exit $? ($(grep -c '^FAIL' "$out/tst_cuda_kernels.txt") failures, $(grep -c '^SKIP' "$out/tst_cuda_kernels.txt") skipped)"
MESHSTUDIO_FLASH_TC=0 $run tst_cuda_kernels flashAttention >"$out/tst_cuda_kernels_flash_scalar.txt" 2>&1
echo "tst_cuda_kernels flashAttention, MESHSTUDIO_FLASH_TC=0: exit $? ($(grep -c '^FAIL' "$out/tst_cuda_kernels_flash_scalar.txt") failures)"
$run bench_attention >"$out/bench_attention.txt" 2>&1
echo "bench_attention: exit $?"
cat "$out/bench_attention.txt"

work=$(mktemp -d)
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
with open(f"{work}/text.txt", "w") as f:
    for i in range(3000):
        f.write(f"line {i}: the GPU must train exactly what the CPU trains, {i % 13} times over.\n")
runs = [("cpu", "cpu", "fp32", {}), ("cuda", "cuda", "fp32", {}), ("cuda-bf16", "cuda", "bf16", {}),
        ("cuda-dp2", "cuda", "fp32", {"dp": 2}), ("cuda-pp2", "cuda", "fp32", {"pp": 2, "microbatches": 4})]
for name, device, precision, parallel in runs:
    ranks = parallel.get("dp", 1) * parallel.get("pp", 1)
    cfg = {"version": 1, "name": name, "seed": 5, "device": device,
           "mesh": {"nodes": [{"name": "n0", "device": "h100-sxm-80gb", "count": ranks}]},
           "model": {"type": "gpt", "layers": 4, "width": 128, "heads": 4, "context": 128},
           "data": {"kind": "text", "files": [f"{work}/text.txt"]},
           "parallel": dict(parallel, precision=precision),
           "optimizer": {"type": "adamw", "lr": 0.001},
           "training": {"steps": 20, "batch_size": 8, "seq_len": 128, "eval_batches": 2, "checkpoint_every": 0}}
    json.dump(cfg, open(f"{work}/{name}.json", "w"))
PY
for name in cpu cuda cuda-bf16 cuda-bf16-scalar cuda-dp2 cuda-pp2; do
  case $name in
    cuda-bf16-scalar) MESHSTUDIO_FLASH_TC=0 $run meshstudio-engine train "$work/cuda-bf16.json" \
          --run-dir "$work/$name" --quiet >"$out/train-$name.txt" 2>&1 ;;
    *2) $run mpirun --allow-run-as-root --oversubscribe -np 2 /tmp/ms-gpu/bin/meshstudio-engine train \
          "$work/$name.json" --run-dir "$work/$name" --quiet >"$out/train-$name.txt" 2>&1 ;;
    *) $run meshstudio-engine train "$work/$name.json" --run-dir "$work/$name" --quiet >"$out/train-$name.txt" 2>&1 ;;
  esac
  echo "train $name: exit $?"
  cp "$work/$name/metrics.jsonl" "$out/metrics-$name.jsonl" 2>/dev/null
done
for name in cpu cuda; do
  $run meshstudio-engine dump "$work/$name.json" --out "$work/dump-$name" --samples 4 >"$out/dump-$name.txt" 2>&1
  echo "dump $name: exit $?"
done
python3 - "$work" <<'PY'
import array, json, math, struct, sys
work = sys.argv[1]
def tensors(path):  # safetensors: an 8-byte header length, a JSON header, the data (no numpy needed)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        a, b = t["data_offsets"]
        out[name] = array.array("f", data[a:b])
    return out
def norm(v):
    return math.sqrt(math.fsum(x * x for x in v))
try:
    cpu, gpu = (tensors(f"{work}/dump-{n}/outputs.safetensors") for n in ("cpu", "cuda"))
    worst, where = 0.0, ""
    for name, ref in cpu.items():
        rel = norm([g - r for g, r in zip(gpu[name], ref)]) / max(norm(ref), 1e-30)
        if rel > worst:
            worst, where = rel, name
    print(f"dump fp32 GPU vs CPU ({len(cpu)} tensors: logits, loss, gradients): worst relative norm difference "
          f"{worst:.2e} in {where} ({'ok' if worst <= 1e-4 else 'TOO FAR'})")
except (OSError, KeyError) as e:
    print(f"dump comparison: missing output ({e})")
for name in ("cuda", "cuda-bf16"):
    try:
        lines = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
    except OSError:
        continue
    predicted = lines[0]["predicted"]["ranks"][0]["memory_bytes"]["activations"]
    measured = max(j["ranks"][0]["peak"]["activations"] for j in lines if j["type"] == "memory")
    print(f"{name}: activations predicted {predicted / 2**20:.1f} MiB, measured peak {measured / 2**20:.1f} MiB "
          f"(ratio {predicted / measured:.3f})")
PY
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def losses(name):
    try:
        return {j["step"]: j["loss"] for j in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if j["type"] == "step"}
    except OSError:
        return {}
cpu, gpu, bf16 = losses("cpu"), losses("cuda"), losses("cuda-bf16")
steps = sorted(set(cpu) & set(gpu))
if steps:
    worst = max(abs(gpu[s] - cpu[s]) / abs(cpu[s]) for s in steps)
    print(f"fp32 GPU vs CPU over {len(steps)} steps: worst relative loss difference {worst:.2e} "
          f"({'ok' if worst < 1e-4 else 'TOO FAR'})")
steps = sorted(set(bf16) & set(gpu))
if steps:
    worst = max(abs(bf16[s] - gpu[s]) / abs(gpu[s]) for s in steps)
    print(f"bf16 vs fp32 on the GPU: worst relative loss difference {worst:.2e} ({'ok' if worst < 1e-2 else 'TOO FAR'})")
scalar = losses("cuda-bf16-scalar")
steps = sorted(set(bf16) & set(scalar))
if steps:
    worst = max(abs(bf16[s] - scalar[s]) / abs(scalar[s]) for s in steps)
    print(f"bf16 tensor-core attention vs scalar (MESHSTUDIO_FLASH_TC=0): worst relative loss difference "
          f"{worst:.2e} ({'ok' if worst < 1e-2 else 'TOO FAR'})")
for name in ("cuda-dp2", "cuda-pp2"):
    other = losses(name)
    steps = sorted(set(other) & set(gpu))
    if steps:
        worst = max(abs(other[s] - gpu[s]) / abs(gpu[s]) for s in steps)
        print(f"{name} (2 ranks on one GPU) vs 1 rank: worst relative loss difference {worst:.2e} "
              f"({'ok' if worst < 1e-5 else 'TOO FAR'})")
PY
$run python3 bench/gpu_vs_torch.py --engine /tmp/ms-gpu/wrap/meshstudio-engine >"$out/bench.txt" 2>&1
echo "bench/gpu_vs_torch.py: exit $?"
cat "$out/bench.txt"
rm -rf "$work"
