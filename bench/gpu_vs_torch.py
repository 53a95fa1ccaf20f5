#!/usr/bin/python3
"""bench/gpu_vs_torch: GPT-2 124M training throughput and MFU of meshstudio-engine against PyTorch eager on the
same GPU, in the same run (issue 6).

Shape: 12 layers, width 768, 12 heads, context 1024, vocab 50304, tied embeddings, AdamW, bf16 autocast with
fp32 master weights (PyTorch) / "precision": "bf16" (engine). Both train WARMUP + STEPS steps on random tokens
(throughput does not depend on the data); the first WARMUP steps are not timed.

MFU (Chowdhery et al. 2022, PaLM, appendix B): model FLOPs per token = 6 N + 6 L C T (N = parameters without the
position table, L layers, C width, T context; the second term is attention's score and value products), over the
device's dense bf16 peak (--peak-tflops, else looked up from the device name: H100 SXM 989, H200 989, A100 312).

A last row trains the same model under torch.compile (bf16; its compilation falls in the warm-up steps).

The engine's half runs `meshstudio-engine train` on a config of the same shape with "device": "cuda", in bf16
and in fp32. The bf16 rows (autocast against the engine's bf16) are the issue's target; the fp32 rows (PyTorch
eager in fp32, no TF32, against the engine in fp32) compare MFU against the device's dense fp32 peak
(--peak-fp32-tflops, else H100 SXM / H200 66.9, A100 19.5). If the engine fails a run, its row says so.

With --model llama the same comparison runs on a Llama-shaped model of the same size (torch_llama.py: RMSNorm,
rotary, grouped-query attention with 4 kv heads, SwiGLU of width 2048, vocab 32000, untied head); N is then every
parameter but the input embedding table.

usage: bench/gpu_vs_torch.py [--engine build/engine/meshstudio-engine] [--batch 8] [--steps 20] [--warmup 5]
                             [--model gpt|llama]
                             [--no-compile] [--engine-only | --torch-only] [--precision bf16|fp32|both]
       bench/gpu_vs_torch.py --device cpu --tiny      (checks the script on a machine without a GPU)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from torch_gpt import GPT
from torch_llama import Llama

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "RTX 4090": 165.0}
PEAK_FP32_TFLOPS = {"H100": 66.9, "H200": 66.9, "A100": 19.5, "L40S": 91.6, "RTX 4090": 82.6}


def flops_per_token(n_params, L, C, T):
    return 6 * n_params + 6 * L * C * T


def peak_tflops(name, override, table=PEAK_BF16_TFLOPS):
    if override:
        return override
    for key, value in table.items():
        if key in name:
            return value
    return float("nan")


# --model llama: a Llama-shaped model of GPT-2 124M's size: 12 x 768, 12 query heads and 4 kv heads, SwiGLU
# of width 2048, Llama 2's 32000-token vocabulary, an untied head, rope base 500000 (Llama 3's).
LLAMA = {"kv_heads": 4, "ffn_hidden": 2048, "rope_theta": 500000.0}


def torch_model(args, shape):
    V, T, C, L, H = shape
    if args.model == "llama":
        model = Llama(V, T, C, L, H, min(LLAMA["kv_heads"], H), LLAMA["ffn_hidden"] if not args.tiny else 128,
                      LLAMA["rope_theta"])
        return model, model.matmul_weights()
    model = GPT(V, T, C, L, H)
    return model, model.weights_without_positions()


def run_torch(args, shape, device, precision, compiled=False):
    V, T, C, L, H = shape
    torch.manual_seed(1)
    model, n_params = torch_model(args, shape)
    model = model.to(device)
    step_model = torch.compile(model) if compiled else model  # compiled in the first (untimed) warm-up step
    fused = {"fused": True} if device.type == "cuda" else {}  # one kernel per step on GPUs (PyTorch >= 2.0)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, **fused)
    dtype = torch.bfloat16
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randint(0, V, (args.batch, T), device=device)
        y = torch.randint(0, V, (args.batch, T), device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=precision == "bf16"):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    tokens_per_s = args.steps * args.batch * T / sum(times)
    return tokens_per_s, n_params, float(loss.detach())


def engine_config(args, shape, run_dir, precision):
    V, T, C, L, H = shape
    return {
        "version": 1, "name": "gpu-vs-torch", "seed": 1, "device": "cuda" if args.device == "cuda" else "cpu",
        "model": {"type": "gpt", "layers": L, "width": C, "heads": H, "vocab": V, "context": T,
                  "tie_embeddings": True} if args.model == "gpt" else
                 {"type": "llama", "layers": L, "width": C, "heads": H, "vocab": V, "context": T,
                  "kv_heads": min(LLAMA["kv_heads"], H), "ffn_hidden": LLAMA["ffn_hidden"] if not args.tiny else 128,
                  "rope_theta": LLAMA["rope_theta"], "tie_embeddings": False},
        "data": {"kind": "tokens", "train": [os.path.join(run_dir, "train.bin")],
                 "val": [os.path.join(run_dir, "train.bin")]},
        "mesh": {"nodes": [{"name": "node0", "device": "h100-sxm-80gb", "count": 1}]},
        "parallel": {"precision": precision},
        "optimizer": {"type": "adamw", "lr": 6e-4, "betas": [0.9, 0.95], "weight_decay": 0.1},
        "training": {"steps": args.warmup + args.steps, "batch_size": args.batch, "seq_len": T,
                     "grad_clip": 1.0, "eval_batches": 1, "checkpoint_every": 0},
    }


def write_tokens(path, count, V):
    # llm.c shard: 256 int32 header (magic 20240520, version 1, token count), then uint16 tokens.
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, count
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, V, (count,), generator=g, dtype=torch.int32).to(torch.int16)
    with open(path, "wb") as f:
        f.write(torch.tensor(header, dtype=torch.int32).numpy().tobytes())
        f.write(tokens.numpy().tobytes())


def run_engine(args, shape, precision):
    V, T = shape[0], shape[1]
    with tempfile.TemporaryDirectory() as tmp:
        write_tokens(os.path.join(tmp, "train.bin"), (args.warmup + args.steps + 2) * args.batch * T + 1, V)
        cfg = os.path.join(tmp, "gpt.json")
        with open(cfg, "w") as f:
            json.dump(engine_config(args, shape, tmp, precision), f)
        p = subprocess.run([args.engine, "train", cfg, "--metrics", "-", "--run-dir", os.path.join(tmp, "run"),
                            "--quiet"], capture_output=True, text=True)
        if p.returncode != 0:
            return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
        times = [json.loads(l)["step_time_s"] for l in p.stdout.splitlines()
                 if l.startswith("{") and json.loads(l).get("type") == "step"][args.warmup:]
        return args.steps * args.batch * T / sum(times), ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="build/engine/meshstudio-engine")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="dense bf16 peak of the device")
    ap.add_argument("--peak-fp32-tflops", type=float, default=0.0, help="dense fp32 peak of the device")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer width-64 model (script check)")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile bf16 row")
    ap.add_argument("--engine-only", action="store_true", help="the engine's rows alone (no PyTorch runs)")
    ap.add_argument("--torch-only", action="store_true", help="PyTorch's rows alone (no engine runs)")
    ap.add_argument("--precision", choices=["bf16", "fp32", "both"], default="both")
    ap.add_argument("--model", choices=["gpt", "llama"], default="gpt",
                    help="gpt: GPT-2 124M; llama: a Llama-shaped model of its size (see LLAMA)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu_vs_torch: no CUDA device visible to PyTorch; run it on a GPU machine "
              "(or --device cpu --tiny to check the script)", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    shape = (256, 64, 64, 2, 2) if args.tiny else (50304 if args.model == "gpt" else 32000, 1024, 768, 12, 12)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peaks = {"bf16": peak_tflops(name, args.peak_tflops),
             "fp32": peak_tflops(name, args.peak_fp32_tflops, PEAK_FP32_TFLOPS)}
    n_params = torch_model(args, shape)[1]
    fpt = flops_per_token(n_params, shape[3], shape[2], shape[1])
    print(f"device: {name} (dense peak bf16 {peaks['bf16']:.0f}, fp32 {peaks['fp32']:.1f} TFLOP/s); "
          f"{args.model} {n_params / 1e6:.1f}M parameters, {fpt / 1e9:.3f} GFLOP per token; batch {args.batch} x {shape[1]}")
    print(f"{'':16} {'tokens/s':>12} {'MFU':>8}")
    for precision in ("bf16", "fp32") if args.precision == "both" else (args.precision,):
        peak = peaks[precision]
        torch_tps = float("nan")
        if not args.engine_only:
            torch_tps, _, loss = run_torch(args, shape, device, precision)
            print(f"{'pytorch ' + precision:16} {torch_tps:12.0f} {100 * torch_tps * fpt / (peak * 1e12):7.1f}%"
                  f"   (final loss {loss:.3f})")
        engine_tps, why = (None, "--torch-only") if args.torch_only else run_engine(args, shape, precision)
        if args.torch_only:
            pass
        elif engine_tps is None:
            print(f"{'engine ' + precision:16} {'-':>12} {'-':>8}   refused: {why}")
        else:
            print(f"{'engine ' + precision:16} {engine_tps:12.0f} {100 * engine_tps * fpt / (peak * 1e12):7.1f}%"
                  + (f"   engine / pytorch: {engine_tps / torch_tps:.2f}x" if not args.engine_only else ""))
    wants_compile = not (args.no_compile or args.engine_only or args.precision == "fp32")
    if wants_compile and not hasattr(torch, "compile"):
        print(f"torch.compile: not in PyTorch {torch.__version__}")
    elif wants_compile:  # last: its compilation takes the longest
        compiled_tps, _, loss = run_torch(args, shape, device, "bf16", compiled=True)
        print(f"{'torch.compile bf16':16} {compiled_tps:12.0f} {100 * compiled_tps * fpt / (peaks['bf16'] * 1e12):7.1f}%"
              f"   (final loss {loss:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
