#!/usr/bin/env python3
"""The largest GPT that fits one GPU, per precision / recompute / offload setting: the planner's answer and,
with --run, what the GPU says (issue 23, item 3).

For each setting the script searches the number of layers L (width, heads, context and batch fixed) for the
largest with which `meshstudio-engine plan` says the one-rank plan fits the device type's memory (doubling,
then bisecting; a plan call takes milliseconds). With --run it then trains that model for --steps steps on
the GPU ("device": "cuda"), which must succeed, and the model with L + 1 layers, which the planner says does
not fit and which must fail with the CUDA backend's "out of device memory" (the caching allocator trims its
pool and retries once before it says so). ZeRO stages change nothing at one rank and are not searched; offload
of the ZeRO-3 shards needs ZeRO-3 and so more than one rank.

usage: bench/gpu_largest_fit.py [--engine build/engine/meshstudio-engine] [--device-type h200-141gb]
                                [--width 2048] [--heads 16] [--seq 1024] [--batch 1] [--run] [--steps 2]
                                [--host-limit-gb 100] [--settings 1,3,5] [--memory-bytes B|torch]
       without --run it needs no GPU (the planner's answers only).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from llmc_shard import write_shard

SETTINGS = [  # (name, parallel)
    ("fp32", {"precision": "fp32"}),
    ("fp32 full recompute", {"precision": "fp32", "recompute": "full"}),
    ("bf16", {"precision": "bf16"}),
    ("bf16 selective", {"precision": "bf16", "recompute": "selective"}),
    ("bf16 full recompute", {"precision": "bf16", "recompute": "full"}),
    ("bf16 offload optimizer", {"precision": "bf16", "offload": "optimizer"}),
    ("bf16 full, offload optimizer", {"precision": "bf16", "recompute": "full", "offload": "optimizer"}),
]
VOCAB = 50304


def mesh(args):
    if not args.memory_bytes:
        return {"nodes": [{"name": "n0", "device": args.device_type, "count": 1}]}
    # The GPU as measured: the H100/H200 catalog entries' figures (plan/hardware.cpp; only the memory and the
    # host memory decide what fits) with the device's own total memory.
    gpu = {"name": "measured-gpu", "peak_tflops_fp32": 66.9, "peak_tflops_bf16": 989.4,
           "memory_gb": args.memory_bytes / 1e9, "memory_bandwidth_gbs": 3350, "host_link_gbs": 64,
           "host_memory_gb": 250, "host_memory_bandwidth_gbs": 76.8}
    return {"device_types": [gpu], "nodes": [{"name": "n0", "device": "measured-gpu", "count": 1}]}


def config(args, layers, parallel, shard):
    return {"version": 1, "name": f"largest-fit-{layers}", "seed": 1, "device": "cuda",
            "model": {"type": "gpt", "layers": layers, "width": args.width, "heads": args.heads, "vocab": VOCAB,
                      "context": args.seq},
            "data": {"kind": "tokens", "train": [shard], "val": [shard]},
            "mesh": mesh(args),
            "parallel": parallel, "optimizer": {"type": "adamw", "lr": 1e-4},
            "training": {"steps": args.steps, "batch_size": args.batch, "seq_len": args.seq, "eval_every": 0,
                         "eval_batches": 1, "checkpoint_every": 0, "log_every": 1}}


def plan(args, tmp, layers, parallel, shard):
    path = os.path.join(tmp, "plan.json")
    with open(path, "w") as f:
        json.dump(config(args, layers, parallel, shard), f)
    p = subprocess.run([args.engine, "plan", path, "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"gpu_largest_fit.py: plan of {layers} layers failed: {p.stderr.strip()[-400:]}")
    j = json.loads(p.stdout)
    return j["fits"], j["devices"][0]


def largest(args, tmp, parallel, shard):
    lo, hi = 0, 1  # fits(lo) (0: none), !fits(hi) once found
    while plan(args, tmp, hi, parallel, shard)[0]:
        lo, hi = hi, hi * 2
        if hi > 4096:
            sys.exit("gpu_largest_fit.py: more than 4096 layers fit; is the device type right?")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if plan(args, tmp, mid, parallel, shard)[0]:
            lo = mid
        else:
            hi = mid
    return lo


def wait_for_idle_gpu(seconds=30.0):
    """Waits (bounded) until the GPU's used memory is under 1 GiB, as nvidia-smi reports it (no CUDA context
    here): a process that just ended, an out-of-memory run among them, may still be returning its memory."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            p = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i",
                                "0"], capture_output=True, text=True)
        except OSError:  # no nvidia-smi: nothing to wait with
            return
        fields = p.stdout.split()
        if p.returncode != 0 or not fields or float(fields[0]) < 1024:  # no reading: nothing to wait for
            return
        time.sleep(0.5)


def train(args, tmp, layers, parallel, shard, check=True):
    wait_for_idle_gpu()
    path = os.path.join(tmp, f"run-{layers}.json")
    with open(path, "w") as f:
        json.dump(config(args, layers, parallel, shard), f)
    p = subprocess.run([args.engine, "train", path, "--run-dir", path[:-5], "--quiet", "--overwrite", "--no-checkpoint"] +
                       ([] if check else ["--skip-memory-check"]), capture_output=True, text=True)
    used = 0
    try:
        for line in open(os.path.join(path[:-5], "metrics.jsonl")):
            j = json.loads(line)
            if j["type"] == "memory":
                used = max(used, j["ranks"][0].get("device", {}).get("used", 0))
    except OSError:
        pass
    return p.returncode, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "", used


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="build/engine/meshstudio-engine")
    ap.add_argument("--device-type", default="h200-141gb")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--memory-bytes", default="",
                    help="plan for a GPU of this many bytes (the device's measured total; 'torch' reads it "
                         "with torch.cuda.mem_get_info) instead of --device-type's catalog memory")
    ap.add_argument("--run", action="store_true", help="train L and L + 1 layers on the GPU")
    ap.add_argument("--settings", default="", help="comma-separated setting numbers (1-based; all by default)")
    ap.add_argument("--host-limit-gb", type=float, default=100.0,
                    help="with --run, skip offload runs whose predicted host memory is above this")
    args = ap.parse_args()
    if args.memory_bytes == "torch":
        # In a child process: a CUDA context in this one would hold about half a GiB of the GPU during the
        # engine's runs (it did, in the second H100 lease, and the engine refused the bf16 model that fits).
        p = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.mem_get_info()[1])"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"gpu_largest_fit.py: --memory-bytes torch: {p.stderr.strip()[-300:]}")
        args.memory_bytes = float(p.stdout.strip())
    else:
        try:
            args.memory_bytes = float(args.memory_bytes or 0)
        except ValueError:
            sys.exit(f"gpu_largest_fit.py: --memory-bytes: {args.memory_bytes!r} is neither a number nor 'torch'")
    gib = 2.0 ** 30
    with tempfile.TemporaryDirectory() as tmp:
        shard = os.path.join(tmp, "tokens.bin")
        write_shard(shard, (args.steps + 3) * args.batch * args.seq + 1, VOCAB)
        on = (f"a GPU of {args.memory_bytes:.0f} bytes ({args.memory_bytes / gib:.2f} GiB, measured)"
              if args.memory_bytes else f"one {args.device_type}")
        print(f"GPT width {args.width}, {args.heads} heads, context {args.seq}, batch {args.batch}, vocab {VOCAB}, "
              f"on {on}")
        head = f"{'setting':30s} {'L':>5s} {'params':>8s} {'predicted GiB':>14s} {'capacity':>9s} {'host GiB':>9s}"
        print(head + ("   L runs / used GiB      L + 1" if args.run else ""))
        chosen = [int(x) for x in args.settings.split(",") if x.strip()] or range(1, len(SETTINGS) + 1)
        for number in chosen:
            if not 1 <= number <= len(SETTINGS):
                sys.exit(f"gpu_largest_fit.py: --settings: {number} is not between 1 and {len(SETTINGS)}")
            name, parallel = SETTINGS[number - 1]
            L = largest(args, tmp, parallel, shard)
            fits, dev = plan(args, tmp, L, parallel, shard)
            m = dev["memory_bytes"]
            params = 12.0 * args.width ** 2 * L + VOCAB * args.width  # blocks and the (tied) embedding
            host = m.get("host", {}).get("total", 0.0) if isinstance(m.get("host"), dict) else 0.0
            row = (f"{name:30s} {L:5d} {params / 1e9:7.2f}B {m['total'] / gib:14.2f} "
                   f"{dev['capacity_bytes'] / gib:9.2f} {host / gib:9.2f}")
            if args.run:
                if host / 1e9 > args.host_limit_gb:
                    row += f"   not run: host memory over {args.host_limit_gb:.0f} GB"
                else:
                    rc, why, used = train(args, tmp, L, parallel, shard)
                    row += f"   {'ok' if rc == 0 else 'FAILED'} / {used / gib:.2f}"
                    if rc != 0:
                        row += f" ({why[-400:]})"
                    # Past the engine's own check (the plan's estimate against the free memory), which
                    # would refuse it before allocating: what the allocator says is the measurement.
                    rc1, why1, _ = train(args, tmp, L + 1, parallel, shard, check=False)
                    oom = rc1 != 0 and "out of device memory" in why1
                    row += "   OOM as predicted" if oom else f"   {'ran' if rc1 == 0 else 'failed: ' + why1[-80:]}"
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
