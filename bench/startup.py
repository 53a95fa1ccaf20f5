#!/usr/bin/env python3
"""Start-up time of a CPU engine process, against the same process with CUDA's libraries loaded as they were
before the CUDA plugin (engine/runtime/cuda_plugin.h): every engine process linked libcublasLt, libcublas and
libnccl, and the loader mapped and initialised them whether the rank used a GPU or not.

    python3 bench/startup.py [--engine build/engine/meshstudio-engine] [--runs 20]

Times `meshstudio-engine validate CONFIG` (the whole process: loader, static initialisers, parsing, the checks)
as it is, and with LD_PRELOAD of the libraries the plugin holds (the reference, measured in the same run,
interleaved). Prints the medians and their ratio. Needs a build with CUDA (the plugin beside the engine)."""
import argparse, os, statistics, subprocess, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--engine", default="build/engine/meshstudio-engine")
ap.add_argument("--config", default="resources/examples/mlp-fashion.json")
ap.add_argument("--runs", type=int, default=20)
a = ap.parse_args()
plugin = os.path.join(os.path.dirname(a.engine), "libmeshstudio_cuda.so")
if not os.path.exists(plugin):
    sys.exit(f"{plugin}: no CUDA plugin (a build without CUDA); nothing to compare")
# The plugin's CUDA libraries, from its own dependencies.
libs = []
for line in subprocess.run(["ldd", plugin], capture_output=True, text=True, check=True).stdout.splitlines():
    parts = line.split()
    if len(parts) >= 3 and parts[2].startswith("/") and any(k in parts[0] for k in ("cublas", "nccl", "cudart")):
        libs.append(parts[2])
if not libs:
    sys.exit(f"{plugin}: ldd names no CUDA library")

def once(env):
    t = time.perf_counter()
    r = subprocess.run([a.engine, "validate", a.config], env=env, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"validate failed: {r.stderr.decode()}")
    return time.perf_counter() - t

plain_env = dict(os.environ)
linked_env = dict(os.environ, LD_PRELOAD=":".join(libs))
plain, linked = [], []
for _ in range(a.runs):
    plain.append(once(plain_env))
    linked.append(once(linked_env))
p, l = statistics.median(plain), statistics.median(linked)
print(f"CUDA libraries preloaded (as linked before): {', '.join(os.path.basename(x) for x in libs)}")
print(f"{'':34s} median ms   min ms")
print(f"{'validate, CUDA plugin not loaded':34s} {p * 1e3:9.1f} {min(plain) * 1e3:8.1f}")
print(f"{'validate, CUDA libraries loaded':34s} {l * 1e3:9.1f} {min(linked) * 1e3:8.1f}")
print(f"speed-up of a CPU process's start: {l / p:.1f}x ({(l - p) * 1e3:.0f} ms saved per process)")
