#!/usr/bin/env python3
"""Predicted against measured device memory of one GPU rank, per category, for GPT-2 124M and 350M in fp32 and
bf16 (issue 23, item 3).

Each row trains the model for a few steps with "device": "cuda" (one rank, no parallelism) and compares the
plan's prediction (the run_start line's memory_bytes, plan/memory_model) with the tracking allocator's peak per
category (the memory lines' "peak"), and gives the device's own view beside it: cudaMemGetInfo's used bytes
(CUDA context, cuBLAS workspace and the caching allocator's pool included) and the pool's reserved bytes, at the
step where the tracked total peaked. The prediction's "other" is compared with workspace + communication.

usage: bench/gpu_memory.py [--engine build/engine/meshstudio-engine] [--batch 4] [--steps 3] [--models 124M,350M]
       bench/gpu_memory.py --emulate-device --tiny   (checks the script without a GPU, on the emulated device)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from llmc_shard import write_shard

MODELS = {"124M": (12, 768, 12), "350M": (24, 1024, 16)}  # layers, width, heads (GPT-2 small, medium)
# --models llama-124M,moe-124M: a Llama-shaped model of GPT-2 small's size (bench/gpu_vs_torch.py --model llama:
# 4 kv heads, SwiGLU 2048, vocab 32000, untied) and a mixture-of-experts one (8 SwiGLU experts of width 768, 2 a
# token, dropless, every block).
LLAMA = {"type": "llama", "kv_heads": 4, "ffn_hidden": 2048, "rope_theta": 500000.0, "tie_embeddings": False}
FAMILY = {"llama-124M": (12, 768, 12, LLAMA),
          "moe-124M": (12, 768, 12, dict(LLAMA, experts=8, experts_per_token=2, expert_ffn_hidden=768))}
CATS = ("parameters", "gradients", "optimizer", "activations")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="build/engine/meshstudio-engine")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--emulate-device", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="2 x 64 models, context 64 (script check)")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--models", default="124M,350M",
                    help="comma-separated, of " + ", ".join(list(MODELS) + list(FAMILY)))
    args = ap.parse_args()
    names = args.models.split(",")
    for n in names:
        if n not in MODELS and n not in FAMILY:
            print(f"bench/gpu_memory.py: --models: unknown model {n!r}", file=sys.stderr)
            return 2
    vocab, context = (256, 64) if args.tiny else (50304, 1024)
    rows = []
    print(f"{'run':14s} {'predicted MiB':>13s} {'tracked MiB':>11s} {'ratio':>6s}  "
          f"{'device used':>11s} {'pool':>8s} {'used/pred':>9s}   params / grads / optimizer / activations / other (pred -> meas, MiB)")
    with tempfile.TemporaryDirectory() as tmp:
        shard = os.path.join(tmp, "train.bin")
        write_shard(shard, (args.steps + 3) * args.batch * context + 1, min(vocab, 32000))  # below every vocab
        for name in names:
            layers, width, heads, extra = FAMILY[name] if name in FAMILY else MODELS[name] + (None,)
            model_vocab = vocab if extra is None or args.tiny else 32000
            if args.tiny:
                layers, width, heads = 2, 64, 2
            model = {"type": "gpt", "layers": layers, "width": width, "heads": heads, "vocab": model_vocab,
                     "context": context, "tie_embeddings": True}
            if extra is not None:
                model.update(extra)
                if args.tiny:
                    model.update(kv_heads=1, ffn_hidden=128, **({"expert_ffn_hidden": 64} if "experts" in extra else {}))
            for precision in ("fp32", "bf16"):
                run = f"{name} {precision}"
                cfg = {"version": 1, "name": f"gpu-memory-{name}-{precision}", "seed": 1,
                       "device": "cpu" if args.emulate_device else "cuda",
                       "model": model,
                       "data": {"kind": "tokens", "train": [shard], "val": [shard]},
                       "mesh": {"nodes": [{"name": "n0", "device": "h100-sxm-80gb", "count": 1}]},
                       "parallel": {"precision": precision},
                       "optimizer": {"type": "adamw", "lr": 3e-4},
                       "training": {"steps": args.steps, "batch_size": args.batch, "seq_len": context,
                                    "eval_every": 0, "eval_batches": 1, "checkpoint_every": 0, "log_every": 1}}
                path = os.path.join(tmp, f"{name}-{precision}.json")
                with open(path, "w") as f:
                    json.dump(cfg, f)
                cmd = [args.engine, "train", path, "--run-dir", path[:-5], "--quiet"]
                if args.emulate_device:
                    cmd.append("--emulate-device")
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"{run:14s} failed (exit {p.returncode}): {p.stderr.strip()[-400:]}")
                    continue
                predicted, best = None, None
                with open(os.path.join(path[:-5], "metrics.jsonl")) as f:
                    for line in f:
                        j = json.loads(line)
                        if j["type"] == "run_start":
                            predicted = j["predicted"]["ranks"][0]["memory_bytes"]
                        elif j["type"] == "memory":
                            r = j["ranks"][0]
                            if best is None or r["peak"]["total"] >= best["peak"]["total"]:
                                best = r
                pm, mm = predicted, best["peak"]
                mib = 2.0 ** 20
                parts = [f"{pm[c] / mib:.1f}->{mm[c] / mib:.1f}" for c in CATS]
                parts.append(f"{pm['other'] / mib:.1f}->{(mm['workspace'] + mm['communication']) / mib:.1f}")
                dev = best.get("device", {})
                print(f"{run:14s} {pm['total'] / mib:13.1f} {mm['total'] / mib:11.1f} {mm['total'] / pm['total']:6.3f}  "
                      f"{dev.get('used', 0) / mib:11.1f}  {dev.get('reserved', 0) / mib:8.1f} {dev.get('used', 0) / pm['total']:9.3f}   " + " / ".join(parts))
                rows.append({"run": run, "predicted": pm, "measured_peak": mm, "device": dev})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
