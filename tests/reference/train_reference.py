#!/usr/bin/python3
"""Several training steps of MeshStudio's engine against PyTorch.

usage: train_reference.py DUMP_DIR METRICS_JSONL [--rtol R]

DUMP_DIR is what `meshstudio-engine dump CONFIG --out DUMP_DIR` wrote (its checkpoint/ holds the config and the
initial weights, which are those `train` starts from: initialisation depends only on the seed). METRICS_JSONL
is the metrics stream of `meshstudio-engine train CONFIG`. This script rebuilds the model (reference.py), draws
the same batches from the documented sampling rule (data.h: text windows start at
hashCombine(seed, step, sample) mod (train tokens - seq_len); Fashion-MNIST follows epochPermutation(seed,
epoch, 60000)), and trains in float64 with torch.optim.AdamW / torch.optim.SGD, the engine's learning-rate
schedule (optimizer.cpp) and torch.nn.utils.clip_grad_norm_. Every step's loss must match the engine's within
rtol (default 1e-4: float32 against float64 over a few steps), and so must a mixture of experts' load-balancing
loss (the step line's "aux_loss", the sum over the MoE layers). Exit 0 on a match, 1 on a mismatch, 2 on bad
input.
"""
import argparse
import glob
import gzip
import json
import math
import struct
import sys

import torch

import reference as R

M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def hash_combine(seed, a, b):
    return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b)


class SplitMix64:
    def __init__(self, state):
        self.state = state

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next() * n) >> 64


def epoch_permutation(seed, epoch, n):
    perm = list(range(n))
    rng = SplitMix64(hash_combine(seed, epoch, n))
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def text_sampler(cfg):
    # Paths must be absolute: the config copy in the checkpoint no longer sits beside relative data files.
    files = []
    for pattern in cfg["data"]["files"]:
        files += sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
    raw = b"".join(open(f, "rb").read() for f in files)
    train = torch.tensor(list(raw[:int(math.floor((1.0 - cfg["data"]["val_fraction"]) * len(raw)))]))
    T = cfg["training"]["seq_len"]
    seed = cfg["seed"]

    def batch(step, B):
        starts = [hash_combine(seed, step, i) % (len(train) - T) for i in range(B)]
        w = torch.stack([train[s:s + T + 1] for s in starts])
        return {"tokens": w[:, :-1], "targets": w[:, 1:]}
    return batch


def mnist_sampler(cfg):
    d = cfg["data"]["dir"]
    with gzip.open(f"{d}/train-images-idx3-ubyte.gz") as f:
        raw = f.read()
    n, rows, cols = struct.unpack(">III", raw[4:16])
    images = torch.frombuffer(bytearray(raw[16:]), dtype=torch.uint8).view(n, rows * cols).double()
    images = (images / 255.0 - 0.2860) / 0.3530
    with gzip.open(f"{d}/train-labels-idx1-ubyte.gz") as f:
        labels = torch.frombuffer(bytearray(f.read()[8:]), dtype=torch.uint8).long()
    seed = cfg["seed"]
    perms = {}

    def batch(step, B):
        idx = []
        for i in range(B):
            g = step * B + i
            e = g // n
            if e not in perms:
                perms[e] = epoch_permutation(seed, e, n)
            idx.append(perms[e][g % n])
        return {"images": images[idx], "targets": labels[idx]}
    return batch


def learning_rate(cfg, step):
    o, t = cfg["optimizer"], cfg["training"]
    peak, warm, steps = o["lr"], t["warmup_steps"], t["steps"]
    if step < warm:
        return peak * (step + 1) / warm
    floor = peak * t["min_lr_ratio"]
    progress = min(max((step - warm) / max(1, steps - warm - 1), 0.0), 1.0)
    kind = t["lr_schedule"]
    if kind == "constant":
        return peak
    if kind == "linear":
        return peak - (peak - floor) * progress
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def decays(name, p):
    # The engine's model spec: weight matrices and embeddings decay, biases and norms do not.
    return p.dim() >= 2 or name in ("cls_token",)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("metrics")
    ap.add_argument("--rtol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    try:
        with open(f"{args.dump}/checkpoint/config.json") as f:
            cfg = json.load(f)
        params = {k: v.double().requires_grad_(True)
                  for k, v in R.read_safetensors(f"{args.dump}/checkpoint/model.safetensors").items()}
        engine, engine_aux = {}, {}
        with open(args.metrics) as f:
            for line in f:
                j = json.loads(line)
                if j.get("type") == "step":
                    engine[j["step"]] = j["loss"]
                    if "aux_loss" in j:
                        engine_aux[j["step"]] = j["aux_loss"]
    except (OSError, KeyError, ValueError) as e:
        print(f"train_reference.py: bad input: {e}", file=sys.stderr)
        return 2
    model = {"gpt": R.gpt, "llama": R.llama, "vit": R.vit, "mlp": R.mlp}[cfg["model"]["type"]]
    sample = text_sampler(cfg) if cfg["data"]["kind"] == "text" else mnist_sampler(cfg)
    o = cfg["optimizer"]
    groups = [{"params": [p for n, p in params.items() if decays(n, p)], "weight_decay": o["weight_decay"]},
              {"params": [p for n, p in params.items() if not decays(n, p)], "weight_decay": 0.0}]
    if o["type"] == "adamw":
        opt = torch.optim.AdamW(groups, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"])
    else:
        opt = torch.optim.SGD(groups, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"])
    B = cfg["training"]["batch_size"]
    worst = 0.0
    failed = False
    for step in range(cfg["training"]["steps"]):
        if step + 1 not in engine:
            continue
        batch = sample(step, B)
        _, loss = model(params, batch, cfg)
        opt.zero_grad()
        loss.backward()
        if cfg["training"]["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), cfg["training"]["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = learning_rate(cfg, step)
        opt.step()
        ref, got = float(loss), engine[step + 1]
        rel = abs(got - ref) / abs(ref)
        worst = max(worst, rel)
        ok = rel <= args.rtol
        failed |= not ok
        print(f"step {step + 1:3d}  engine {got:.7f}  torch {ref:.7f}  rel {rel:.1e} {'ok' if ok else 'MISMATCH'}")
        if hasattr(loss, "aux"):
            # The engine reports the load-balancing loss whenever the model has one: it must be there.
            ref_aux = float(loss.aux)
            got_aux = engine_aux.get(step + 1)
            rel_aux = abs(got_aux - ref_aux) / abs(ref_aux) if got_aux is not None and ref_aux else float("inf")
            worst = max(worst, rel_aux)
            ok = rel_aux <= args.rtol
            failed |= not ok
            print(f"          aux engine {got_aux}  torch {ref_aux:.7f}  rel {rel_aux:.1e} {'ok' if ok else 'MISMATCH'}")
    if not engine:
        print("no step lines in the metrics", file=sys.stderr)
        return 2
    print(f"worst relative difference {worst:.2e} over {len(engine)} steps (rtol {args.rtol})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
