#!/usr/bin/python3
"""bench/cpu_vs_torch: training throughput of meshstudio-engine against PyTorch eager on the same CPU, same run.

The model is the issue's GPT: vocab 256, context 128, width 256, 4 layers, 4 heads, batch 16, AdamW, fp32.
Both train on the same byte-level text for WARMUP + STEPS steps with the same thread count; the first WARMUP
steps are not timed. tokens/s = STEPS * batch * context / (sum of the timed step times). The engine's step time
comes from its own metrics stream (step_time_s, which includes data loading, forward, backward, clipping and
the optimizer step); PyTorch's is measured around the same work.

usage: bench/cpu_vs_torch.py [--engine build/engine/meshstudio-engine] [--threads N] [--steps 20] [--warmup 3]
Prints a fixed-column table and the ratio engine/torch (> 1 means the engine is faster).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from torch_gpt import GPT

V, T, C, L, H, B = 256, 128, 256, 4, 4, 16


def text_files():
    files = sorted(glob.glob("/usr/share/games/fortunes/*.u8"))
    if files:
        return files
    # Fallback: any sizeable text on a Debian system.
    return sorted(glob.glob("/usr/share/common-licenses/*"))


def bench_torch(data, threads, warmup, steps):
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = GPT(V, T, C, L, H)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(0)
    times, losses = [], []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        starts = torch.randint(0, len(data) - T - 1, (B,), generator=gen)
        batch = torch.stack([data[s:s + T + 1] for s in starts.tolist()]).long()
        loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= warmup:
            times.append(dt)
        losses.append(float(loss))
    return steps * B * T / sum(times), losses


def bench_engine(engine, threads, warmup, steps, workdir):
    config = {
        "version": 1, "name": "bench-cpu-vs-torch", "seed": 1, "device": "cpu",
        "model": {"type": "gpt", "layers": L, "width": C, "heads": H, "vocab": V, "context": T,
                  "tie_embeddings": True},
        "data": {"kind": "text", "files": text_files(), "val_fraction": 0.05},
        "optimizer": {"type": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
        "training": {"steps": warmup + steps, "batch_size": B, "seq_len": T, "warmup_steps": 0,
                     "lr_schedule": "constant", "grad_clip": 1.0, "eval_batches": 1, "threads": threads},
    }
    path = os.path.join(workdir, "config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    metrics = os.path.join(workdir, "metrics.jsonl")
    proc = subprocess.run([engine, "train", path, "--metrics", metrics, "--run-dir", os.path.join(workdir, "run"),
                           "--quiet"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"engine failed ({proc.returncode}): {proc.stderr}")
    times, losses = [], []
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if j["type"] == "step":
                losses.append(j["loss"])
                if j["step"] > warmup:
                    times.append(j["step_time_s"])
    return steps * B * T / sum(times), losses


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default=os.path.join(here, "..", "build", "engine", "meshstudio-engine"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    raw = b"".join(open(f, "rb").read() for f in text_files())
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        eng_tps, eng_losses = bench_engine(args.engine, args.threads, args.warmup, args.steps, tmp)
    torch_tps, torch_losses = bench_torch(data, args.threads, args.warmup, args.steps)
    print(f"GPT V={V} T={T} C={C} L={L} H={H} B={B} AdamW fp32, {args.threads} threads, "
          f"{args.steps} timed steps after {args.warmup} warm-up, torch {torch.__version__}")
    print(f"{'':12s} {'tokens/s':>12s} {'first loss':>11s} {'last loss':>10s}")
    print(f"{'engine':12s} {eng_tps:12.0f} {eng_losses[0]:11.4f} {eng_losses[-1]:10.4f}")
    print(f"{'pytorch':12s} {torch_tps:12.0f} {torch_losses[0]:11.4f} {torch_losses[-1]:10.4f}")
    print(f"ratio engine/pytorch: {eng_tps / torch_tps:.2f}x")


if __name__ == "__main__":
    main()
