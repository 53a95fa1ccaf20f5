#!/usr/bin/env python3
"""ZeRO 0-3 model-state bytes of a 7.5B GPT on 64 A100s, as `meshstudio-engine plan` predicts them, against
the published tables (plan/model_state.h):

- ZeRO (Rajbhandari et al. 2020, Figure 1; bf16 gradients, K = 12): 16, 4 + 12/d, 2 + 14/d, 16/d bytes per
  parameter; the paper's own figures for Psi = 7.5B, d = 64: 120, 31.4, 16.6, 1.9 GB per device;
- Megatron Core's distributed optimizer (bf16 parameters, fp32 gradients): 18, 6 + 12/d (and 2 + 16/d, 18/d
  for stages 2 and 3 by the same rule).

Usage: scripts/zero_table.py [ENGINE] [CONFIG]   (defaults: build/engine/meshstudio-engine,
scripts/configs/gpt-7.5b-64xa100.json). Prints a markdown table; exits 1 when a predicted figure is off the
formula by more than 0.01 bytes per parameter.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
engine = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build/engine/meshstudio-engine")
config_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "scripts/configs/gpt-7.5b-64xa100.json")
with open(config_path) as f:
    config = json.load(f)

m = config["model"]
L, h, V, T = m["layers"], m["width"], m["vocab"], m["context"]
# GPT-2 layout: per block qkv 3h^2 + 3h, projection h^2 + h, MLP 8h^2 + 5h, two LayerNorms 4h; tied wte,
# wpe and the final LayerNorm.
psi = L * (12 * h * h + 13 * h) + V * h + T * h + 2 * h
d = config["parallel"]["dp"]
formulas = {
    "bf16": [16, 4 + 12 / d, 2 + 14 / d, 16 / d],
    "fp32": [18, 6 + 12 / d, 2 + 16 / d, 18 / d],
}
paper_gb = [120, 31.4, 16.6, 1.9]  # ZeRO paper, Figure 1 (Psi = 7.5B, d = 64)

print(f"GPT {psi / 1e9:.2f}B parameters, dp {d}: model states per device (parameters + gradients + optimizer)")
print()
print("| gradients | ZeRO | predicted B/param | formula B/param | predicted GB | ZeRO paper GB (7.5B) |")
print("|---|---|---|---|---|---|")
bad = False
with tempfile.TemporaryDirectory() as tmp:
    for grads in ("bf16", "fp32"):
        for zero in range(4):
            c = json.loads(json.dumps(config))
            c["parallel"]["zero"] = zero
            c["parallel"]["grad_precision"] = grads
            path = os.path.join(tmp, f"c-{grads}-{zero}.json")
            with open(path, "w") as f:
                json.dump(c, f)
            out = subprocess.run([engine, "plan", path, "--json"], capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{engine} plan {path} failed: {out.stderr.strip()}")
            mem = json.loads(out.stdout)["devices"][0]["memory_bytes"]
            states = mem["parameters"] + mem["gradients"] + mem["optimizer"]
            per = states / psi
            want = formulas[grads][zero]
            bad |= abs(per - want) > 0.01
            paper = f"{paper_gb[zero]}" if grads == "bf16" else ""
            print(f"| {grads} | {zero} | {per:.3f} | {want:.3f} | {states / 1e9:.1f} | {paper} |")
sys.exit(1 if bad else 0)
