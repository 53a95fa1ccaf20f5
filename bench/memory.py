#!/usr/bin/env python3
"""Predicted against measured memory per rank for a few plans of one GPT.

Each plan is trained for a few steps under mpirun; the stream's run_start line carries the plan's prediction
per rank (memory_bytes by category, from plan/memory_model) and its memory lines the tracking allocator's
peak per category (engine/runtime/memory.h). The table prints both per rank and the ratio of the totals.
Categories differ slightly: the prediction's "other" (workspace and communication buffers) is compared with
the measured workspace + communication. The last column is the model states (parameters + gradients +
optimizer) held at the end of a step, measured / predicted: above 1 only by the parameter store's padding
(each parameter to 16 floats, each unit to 16 * dp). Offload rows run on the emulated device (the host/device
split of a GPU, --emulate-device); their model states include what the host holds, and a last part gives the
host's peak (parameters, gradients, optimizer state, staging), predicted -> measured.

Usage: python3 bench/memory.py [--engine build/engine/meshstudio-engine] [--out results.json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

PLANS = [
    ("1 rank", {}),
    ("dp2 zero1", {"dp": 2, "zero": 1}),
    ("dp2 zero3", {"dp": 2, "zero": 3}),
    ("tp2", {"tp": 2}),
    ("tp2 sequence parallel", {"tp": 2, "sequence_parallel": True}),
    ("pp2 1f1b m4", {"pp": 2, "microbatches": 4}),
    ("pp2 zb-h1 m4", {"pp": 2, "microbatches": 4, "schedule": "zb_h1"}),
    ("pp2 1f1b m4 recompute", {"pp": 2, "microbatches": 4, "recompute": "full"}),
    # Selective recompute (the attention matrix re-made in backward) and Megatron's partial recompute.
    ("pp2 1f1b m4 selective", {"pp": 2, "microbatches": 4, "recompute": "selective"}),
    ("tp2 selective", {"tp": 2, "recompute": "selective"}),
    ("pp2 1f1b m4 recompute 1 of 2", {"pp": 2, "microbatches": 4, "recompute": "full", "recompute_layers": 1}),
    # bf16 mixed precision (plan/model_state.h): bf16 working parameters, fp32 gradients, fp32 master
    # weights with the moments as optimizer state, sharded from ZeRO-1 on.
    ("bf16 1 rank", {"precision": "bf16"}),
    ("bf16 dp2 zero1", {"dp": 2, "zero": 1, "precision": "bf16"}),
    ("bf16 dp2 zero2", {"dp": 2, "zero": 2, "precision": "bf16"}),
    ("bf16 dp2 zero3", {"dp": 2, "zero": 3, "precision": "bf16"}),
    ("bf16 tp2 pp2", {"tp": 2, "pp": 2, "microbatches": 2, "precision": "bf16"}),
    # bf16 gradients ("grad_precision": "bf16"): 2 bytes per gradient element, the ZeRO paper's table.
    ("bf16 grads dp2 zero1", {"dp": 2, "zero": 1, "precision": "bf16", "grad_precision": "bf16"}),
    ("bf16 grads dp2 zero2 m4", {"dp": 2, "zero": 2, "microbatches": 4, "precision": "bf16",
                                 "grad_precision": "bf16"}),
    # Offload (ZeRO-Offload's optimizer, FSDP's CPU offload of the ZeRO-3 shards), on the emulated device.
    ("offload opt dp2 zero1", {"dp": 2, "zero": 1, "precision": "bf16", "offload": "optimizer"},
     ["--emulate-device"]),
    ("offload params dp2 zero3", {"dp": 2, "zero": 3, "microbatches": 2, "precision": "bf16",
                                  "offload": "parameters"}, ["--emulate-device"]),
]


def config(name, parallel, ranks, text):
    return {
        "version": 1, "name": name, "seed": 1,
        "mesh": {"nodes": [{"name": "n0", "device": "cpu", "count": ranks}]},
        "model": {"type": "gpt", "layers": 4, "width": 128, "heads": 4, "context": 128},
        "data": {"kind": "text", "files": [text]},
        "optimizer": {"type": "adamw", "lr": 0.001},
        "training": {"steps": 3, "batch_size": 16, "seq_len": 128, "threads": 1, "eval_every": 0,
                     "eval_batches": 1, "checkpoint_every": 0, "log_every": 1},
        "parallel": parallel,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="build/engine/meshstudio-engine")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not os.access(args.engine, os.X_OK):
        sys.exit(f"memory.py: {args.engine}: no engine binary (build first: ./test.sh or scripts/common.sh)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    tmp = tempfile.mkdtemp(prefix="ms-memory-")
    results = []
    try:
        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:
            for i in range(4000):
                f.write(f"line {i}: memory is predicted per rank and measured by the tracking allocator.\n")
        print(f"{'plan':24s} {'rank':>4s} {'predicted MB':>12s} {'measured MB':>12s} {'ratio':>6s} "
              f"{'states':>6s}   (params / grads / optimizer / activations / other, predicted -> measured, MB)")
        for name, parallel, *extra in PLANS:
            extra = extra[0] if extra else []
            ranks = parallel.get("dp", 1) * parallel.get("tp", 1) * parallel.get("pp", 1)
            path = os.path.join(tmp, name.replace(" ", "_") + ".json")
            with open(path, "w") as f:
                json.dump(config(name.replace(" ", "-"), parallel, ranks, text), f)
            run_dir = path[:-5]
            cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), args.engine, "train", path, "--run-dir",
                   run_dir, "--quiet"] + extra
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"memory.py: {name} failed:\n{p.stderr[-2000:]}")
            predicted, measured = None, None
            with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                for line in f:
                    j = json.loads(line)
                    if j["type"] == "run_start":
                        predicted = j["predicted"]["ranks"]
                    elif j["type"] == "memory":
                        measured = j["ranks"]
            for r in range(ranks):
                pm = predicted[r]["memory_bytes"]
                mm = measured[r]["peak"]
                cats = [("parameters", "parameters"), ("gradients", "gradients"), ("optimizer", "optimizer"),
                        ("activations", "activations")]
                parts = [f"{pm[a] / 1e6:.2f}->{mm[b] / 1e6:.2f}" for a, b in cats]
                parts.append(f"{pm['other'] / 1e6:.2f}->{(mm['workspace'] + mm['communication']) / 1e6:.2f}")
                ratio = mm["total"] / pm["total"] if pm["total"] else float("nan")
                cur = measured[r]["current"]
                states_p = pm["parameters"] + pm["gradients"] + pm["optimizer"]
                states_m = cur["parameters"] + cur["gradients"] + cur["optimizer"]
                if "host" in pm:
                    ph, mh = pm["host"], measured[r].get("host", {})
                    hc, hp = mh.get("current", {}), mh.get("peak", {})
                    states_p += ph["parameters"] + ph["gradients"] + ph["optimizer"]
                    states_m += sum(hc.get(k, 0) for k in ("parameters", "gradients", "optimizer"))
                    host_m = sum(hp.get(k, 0) for k in ("parameters", "gradients", "optimizer", "communication"))
                    parts.append(f"host {ph['total'] / 1e6:.2f}->{host_m / 1e6:.2f}")
                print(f"{name:24s} {r:4d} {pm['total'] / 1e6:12.2f} {mm['total'] / 1e6:12.2f} {ratio:6.2f} "
                      f"{states_m / states_p:6.3f}   " + " / ".join(parts))
                results.append({"plan": name, "rank": r, "predicted": pm, "measured_peak": mm})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
