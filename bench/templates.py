#!/usr/bin/python3
"""bench/templates.py: how long the engine takes to load and plan each cluster-scale template (what the
studio computes, off its GUI thread, when File > New opens one), with the plan's predictions, and the
predicted figures against the published ones where a template reproduces a published run.

usage: bench/templates.py [--engine build/engine/meshstudio-engine] [--runs 5]

Per template: the median wall time of `meshstudio-engine plan --json TEMPLATE` over --runs runs (a process
start, reading the config, building and checking the plan, simulating its step; the studio does the same
work minus the process start), the predicted step time, tokens/s, MFU, and the largest device's predicted
memory against its capacity.

Published: the Llama 3 paper (Grattafiori et al. 2024, "The Llama 3 Herd of Models", table 4) reports
400 TFLOPs a GPU, 41% bf16 MFU, for 405B on 16384 H100s with tp 8, cp 1, pp 16, dp 128, 8192-token
sequences and 16 a data-parallel group; its other rows are 43% (8192 GPUs, dp 64) and 38% (cp 16, 131072-
token sequences), which the "llama3-405b 128k cp16" row plans (ring attention over the 16 ranks of each
context-parallel group).

Megatron-Core's MoE README (megatron/core/transformer/moe/README.md, "Reference Best Parallel Mapping", MCore
v0.8/v0.9) gives Mixtral 8x7B, dropless, bf16, 64 H100s, 4096-token sequences, tp 1, ep 8, pp 4, virtual
pipeline 8, microbatch 1, global batch 256, with the distributed optimizer, and reports 468 TFLOPS a GPU for
Mixtral 8x7B bf16 training: 47.3% of the H100's dense 989. The "megatron-core mapping" row plans that layout
with ZeRO-1 (the distributed optimizer: the dense states sharded over the 16 replicas, each expert's over its
16 / 8 = 2) and Megatron's placement of one block a virtual stage.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TEMPLATES = ["llama3-8b-8xh100", "llama3-70b-64xh100", "llama3-405b-16k", "mixtral-8x7b-64xh100", "gpt3-175b-plan",
             "gpt3-175b-16k"]
# Variants: a template with parallel settings changed (what the template's choice is weighed against).
# (template, parallel changes, training changes[, model changes])
VARIANTS = {"llama3-405b-16k no recompute": ("llama3-405b-16k", {"recompute": "none", "recompute_layers": 0}, {}),
            # The Llama 3 paper's long-context row (table 4): 131072-token sequences, cp 16, dp 8, 16 a replica.
            "llama3-405b 128k cp16": (
                "llama3-405b-16k",
                {"tp": 8, "cp": 16, "pp": 16, "dp": 8, "microbatches": 16},
                {"batch_size": 128, "seq_len": 131072}, {"context": 131072}),
            # One block a virtual stage, the embedding with the first and the head with the last, as Megatron-Core
            # places 32 layers over pp 4 x vp 8 (the even split by layer count would put two blocks in one chunk).
            "mixtral-8x7b megatron-core mapping": (
                "mixtral-8x7b-64xh100",
                {"tp": 1, "pp": 4, "ep": 8, "dp": 16, "schedule": "interleaved_1f1b", "virtual_chunks": 8,
                 "microbatches": 16, "zero": 1, "recompute": "none", "sequence_parallel": False,
                 "placement": [{"stage": k % 4, "layers": (["embedding"] if k == 0 else []) + [f"block.{k}"]
                                + (["head"] if k == 31 else [])} for k in range(32)]},
                {"batch_size": 256})}
# The same mapping with the optimizer state whole (ZeRO 0), and with the even split by layer count instead of
# Megatron's placement: what docs/plan-model.md says the distributed optimizer and the placement are worth.
_MIXTRAL = VARIANTS["mixtral-8x7b megatron-core mapping"]
VARIANTS["mixtral-8x7b mapping, zero 0"] = (_MIXTRAL[0], {**_MIXTRAL[1], "zero": 0}, _MIXTRAL[2])
VARIANTS["mixtral-8x7b mapping, even split"] = (
    _MIXTRAL[0], {k: v for k, v in _MIXTRAL[1].items() if k != "placement"}, _MIXTRAL[2])
PUBLISHED_MFU = {"llama3-405b-16k": (0.41, "Llama 3 paper, table 4"),
                 "llama3-405b 128k cp16": (0.38, "Llama 3 paper, table 4"),
                 "mixtral-8x7b megatron-core mapping": (468 / 989, "Megatron-Core MoE README, 468 TFLOPS")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default=os.path.join(ROOT, "build", "engine", "meshstudio-engine"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--categories", action="store_true",
                    help="also print the fullest device's stage and memory by category (GiB)")
    args = ap.parse_args()
    print(f"{'template':36s} {'plan ms':>8s} {'devices':>7s} {'step s':>8s} {'tokens/s':>11s} {'MFU':>6s}"
          f" {'max GiB':>8s} {'capacity':>8s}  published")
    tmp = tempfile.TemporaryDirectory()
    rows = [(n, os.path.join(ROOT, "resources", "examples", n + ".json")) for n in TEMPLATES]
    for name, (base, change, training, *model) in VARIANTS.items():
        with open(os.path.join(ROOT, "resources", "examples", base + ".json")) as f:
            c = json.load(f)
        c["parallel"].update(change)
        c["training"].update(training)
        for m in model:
            c["model"].update(m)
        path = os.path.join(tmp.name, name.replace(" ", "-") + ".json")
        with open(path, "w") as f:
            json.dump(c, f)
        rows.append((name, path))
    for name, path in rows:
        times = []
        out = None
        for _ in range(args.runs):
            t0 = time.perf_counter()
            r = subprocess.run([args.engine, "plan", "--json", path], capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if r.returncode != 0:
                print(f"{name}: plan failed: {r.stderr.strip()}", file=sys.stderr)
                return 1
            out = json.loads(r.stdout)
        devices = out["devices"]
        worst = max(devices, key=lambda d: d["memory_bytes"]["total"])
        pub = PUBLISHED_MFU.get(name) or PUBLISHED_MFU.get(name.split()[0])
        pub_text = f"MFU {pub[0] * 100:.0f}% ({pub[1]})" if pub else ""
        print(f"{name:36s} {statistics.median(times) * 1e3:8.0f} {len(devices):7d} {out['step_time_s']:8.2f}"
              f" {out['tokens_per_s']:11.0f} {out['mfu'] * 100:5.1f}% {worst['memory_bytes']['total'] / 2**30:8.1f}"
              f" {worst['capacity_bytes'] / 2**30:8.1f}  {pub_text}")
        if args.categories:
            m = worst["memory_bytes"]
            parts = m.get("other_parts", {})
            print(f"    stage {worst['stage']}: " + ", ".join(
                f"{k} {m[k] / 2**30:.1f}" for k in ("parameters", "gradients", "optimizer", "activations", "other"))
                  + (f" (workspace {parts.get('workspace', 0) / 2**30:.1f}, communication"
                     f" {parts.get('communication', 0) / 2**30:.1f})" if parts else "")
                  + (f"; the peak {m['not_at_once'] / 2**30:.1f} below their sum (not all at once)"
                     if m.get("not_at_once", 0) > 0 else "")
                  + (f"; up to {max(d['memory_bytes'].get('uneven_routing_total', 0) for d in devices) / 2**30:.1f}"
                     f" at the most uneven routing" if m.get("uneven_routing_total", 0) > 0 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
