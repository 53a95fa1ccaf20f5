#!/bin/bash
# Per-kernel profiles of one GPT-2 124M bf16 training step (batch 8 x 1024), the engine's and PyTorch eager's
# (bench/gpu_vs_torch.py's model), on a GPU machine, with bench/kernel_profile.cpp's CUPTI injection library
# (the lent machines have no Nsight Systems, and Nsight Compute's replay of every kernel takes minutes), and
# the time of PyTorch's own fused attention on the engine's attention shape beside bench_attention's.
#
#   scripts/gpu_bundle.sh                                   (here: .gpu/ with the engine and the profiler)
#   bash scripts/gpu_profile.sh [OUT_DIR [engine]]          (there, in the repository root; .gpu carried;
#                                                            "engine": the engine's profile alone)
#
# Writes OUT_DIR/profile-engine.txt and OUT_DIR/profile-torch.txt (per step: wall span, GPU busy time, then
# each kernel's ms, share and launches; steps are cut after the AdamW kernel, the first 3 left out).
set -u
out=${1:-${OUT:-/tmp}}
run=.gpu/run.sh
$run true || exit 1  # unpack the bundle
lib=/tmp/ms-gpu/lib/libms_kernel_profile.so
[ -f "$lib" ] || { echo "gpu_profile: $lib missing (rebuild .gpu with scripts/gpu_bundle.sh)"; exit 1; }
export MS_KPROF_STEP_MARKER=adam MS_KPROF_SKIP_STEPS=3 MS_KPROF_TOP=${MS_KPROF_TOP:-45}

CUDA_INJECTION64_PATH=$lib MS_KPROF_OUT=$out/profile-engine.txt timeout 120 $run python3 bench/gpu_vs_torch.py \
  --engine /tmp/ms-gpu/wrap/meshstudio-engine --engine-only --precision bf16 --steps 5 --warmup 3
echo "engine profile: exit $?"
cat "$out/profile-engine.txt"
[ "${2:-}" = engine ] && exit 0
CUDA_INJECTION64_PATH=$lib MS_KPROF_OUT=$out/profile-torch.txt timeout 120 python3 bench/gpu_vs_torch.py \
  --torch-only --no-compile --precision bf16 --steps 5 --warmup 3
echo "torch profile: exit $?"
cat "$out/profile-torch.txt"
# PyTorch's scaled_dot_product_attention (its flash kernel) on bench_attention's shape, forward and backward.
timeout 60 python3 - <<'PY'
import torch, torch.nn.functional as F
B, H, T, D = 8, 12, 1024, 64
q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
g = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
def fwd():
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
def both():
    fwd().backward(g)
for f in (fwd, both):
    for _ in range(5):
        f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        s.record(); f(); e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e))
    times.sort()
    print(f"torch sdpa causal B{B} H{H} T{T} hs{D} bf16 {f.__name__}: median {times[10]:.3f} ms")
PY
