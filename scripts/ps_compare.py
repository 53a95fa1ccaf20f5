#!/usr/bin/env python3
"""Trains one parameter-server config under sync, async and bounded consistency (the same model, data, seed
and straggler) with `meshstudio-engine launch`, and prints, per consistency: the final evaluation's loss and
accuracy, the wall time, the training throughput, the staleness of the updates (mean and largest) and each
worker's pushes. The figures in README.md and docs/status.md ("Parameter servers") come from this script.

usage: scripts/ps_compare.py [CONFIG] [--engine PATH] [--out DIR] [--staleness K]
       (CONFIG defaults to resources/examples/mlp-fashion-ps.json)
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config", nargs="?", default=os.path.join(ROOT, "resources/examples/mlp-fashion-ps.json"))
    ap.add_argument("--engine", default=os.path.join(ROOT, "build/engine/meshstudio-engine"))
    ap.add_argument("--out", default="/tmp/ms-ps-compare")
    ap.add_argument("--staleness", type=int, default=2, help="bounded's staleness (steps)")
    args = ap.parse_args()
    base = json.load(open(args.config))
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for consistency in ("sync", "async", "bounded"):
        c = json.loads(json.dumps(base))
        c["name"] = base["name"] + "-" + consistency
        c["parallel"]["consistency"] = consistency
        c["parallel"]["staleness"] = args.staleness
        if "files" in c.get("data", {}):
            base_dir = os.path.dirname(os.path.abspath(args.config))
            c["data"]["files"] = [f if os.path.isabs(f) else os.path.join(base_dir, f) for f in c["data"]["files"]]
        path = os.path.join(args.out, consistency + ".json")
        json.dump(c, open(path, "w"), indent=1)
        metrics = os.path.join(args.out, consistency + ".jsonl")
        t0 = time.time()
        r = subprocess.run([args.engine, "launch", path, "--", "--metrics", metrics, "--run-dir",
                            os.path.join(args.out, "runs", consistency), "--overwrite", "--quiet"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.time() - t0
        if r.returncode != 0:
            sys.exit(f"{consistency}: launch failed ({r.returncode}):\n{r.stderr[-2000:]}")
        lines = [json.loads(l) for l in open(metrics) if l.strip()]
        evals = [l for l in lines if l["type"] == "eval"]
        steps = [l for l in lines if l["type"] == "step"]
        ps = [l for l in lines if l["type"] == "ps"][-1]
        hist = ps["staleness_total"]
        updates = sum(hist)
        mean = sum(i * n for i, n in enumerate(hist)) / max(1, updates)
        largest = max((i for i, n in enumerate(hist) if n), default=0)
        start = next(l for l in lines if l["type"] == "run_start")
        samples = base["training"]["batch_size"] * base["training"]["steps"]
        span = steps[-1]["t"] - steps[0]["t"] if len(steps) > 1 else 0
        rows.append((consistency, evals[-1], wall, samples / max(span, 1e-9) * (len(steps) - 1) / len(steps),
                     mean, largest, [w["steps"] for w in ps["worker_states"]],
                     start.get("predicted", {}).get("mean_staleness")))
    print(f"{os.path.relpath(args.config, ROOT)}: {base['parallel']['workers']} workers, "
          f"{base['parallel']['servers']} servers, stragglers {base['parallel'].get('stragglers', [])}, "
          f"bounded staleness {args.staleness}")
    print(f"{'consistency':<12}{'eval loss':>10}{'accuracy':>10}{'wall s':>9}{'samples/s':>11}"
          f"{'staleness':>11}{'largest':>9}{'predicted':>11}  pushes per worker")
    for c, e, wall, rate, mean, largest, pushes, predicted in rows:
        print(f"{c:<12}{e['loss']:>10.4f}{100 * e.get('accuracy', 0):>9.2f}%{wall:>9.1f}{rate:>11.0f}"
              f"{mean:>11.2f}{largest:>9d}{predicted if predicted is not None else float('nan'):>11.2f}  {pushes}")


if __name__ == "__main__":
    main()
