#!/usr/bin/python3
"""bench/scaling: tokens/s of data- and pipeline-parallel plans of meshstudio-engine against one rank, same run.

Every plan trains the same GPT (vocab 256, context 128, width 128, 4 layers, 4 heads, global batch 32, AdamW,
fp32) on the text of Debian's fortunes package for WARMUP + STEPS steps under `mpirun -np dp*tp*pp`, each rank
with one thread, on one node of cpu devices (Open MPI binds a one-thread rank to a core of its own when it
starts at most 2 ranks; a rank of two threads runs unbound). The first WARMUP steps of each run are not used.
The plans run in ROUNDS interleaved rounds (every plan once per round), so slow drifts of a shared machine hit
every plan alike.

tokens/s = median over the rounds of batch * context / (median step_time_s of the round's kept steps),
step_time_s being the engine's own figure from its metrics stream: one disturbed round does not move it.
"x 1 rank" divides by the one-rank, one-thread reference of the same run; a second reference gives that rank
both threads, the fair figure for a plan that fills two cores. "spread" is (max - min) / median of the
per-round tokens/s: the noise to read the ratios against. "other" is the most cores that other processes kept
busy during one of the plan's runs (from /proc/stat less our own children's CPU time).

Bubble of a rank in one step (the definition of docs/plan-model.md, "Simulator", applied to measured spans):
    window = latest end - earliest start of the compute spans (F, B, W) over the ranks of the rank's pipeline
             replica in that step (all its stages and TP ranks: the ranks with the same DP index)
    bubble = 1 - (sum of that rank's F, B and W span durations) / window
Waits for activations and gradients (r, R) therefore count as bubble; the end-of-step gradient finish (G: the
DP and tied-embedding sync waits) and the optimizer step (O) fall outside the window, as in the simulator. The
window is per replica because the simulator simulates one replica: DP replicas run unsynchronised until the
gradient sync, and their skew shows up in the G wait ("sync ms" in the table), not in the bubble.
The bubble is averaged over the kept steps and the ranks of a stage, and shown beside the plan's predicted
bubble_fraction from the stream's run_start line. The predicted tokens/s comes from the same line; the cpu
device's peak and bandwidth are placeholders, so only its ratio between plans ("pred x") means anything.

Every plan must train like one process: each step's loss within 1e-2 relative of the reference's, or the
script exits 1 (checked after the runs, outside the timed region).

With --profile FILE (a profile `meshstudio-engine calibrate --out FILE` wrote of this machine) the plans name it
as their device and links (mesh.profiles) and the table adds each plan's predicted step time, its measured one
and the error (predicted / measured - 1): the fidelity of the cost model on this machine, without calibrating
from any of these runs. --calibrate measures the profile first (`calibrate`, about two minutes here): this
machine's speed drifts by up to 2x over hours (a shared VM), so a profile is only good for runs beside it.

usage: bench/scaling.py [--engine build/engine/meshstudio-engine] [--steps 20] [--warmup 3] [--rounds 3]
                        [--quick] [--out results.json] [--keep DIR] [--profile FILE | --calibrate]
Prints a fixed-column table; exits 1 when the engine or mpirun is missing, a run fails, or a loss differs.
"""
import argparse
import glob
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

# The full model and the --quick one (a smoke run, seconds in all). Letters as STYLE.md: V vocab, T context,
# C width, L layers, H heads, B global batch.
FULL = {"V": 256, "T": 128, "C": 128, "L": 4, "H": 4, "B": 32}
QUICK = {"V": 256, "T": 32, "C": 32, "L": 2, "H": 2, "B": 16}

# (name, threads per rank, parallel object or None). The first row is the reference; ranks = dp * tp * pp.
PLANS = [
    ("1 rank", 1, None),
    ("1 rank, 2 threads", 2, None),
    ("1 rank, M=4 accum", 1, {"microbatches": 4}),
    ("dp2", 1, {"dp": 2}),
    ("pp2 1f1b M=4", 1, {"pp": 2, "microbatches": 4}),
    ("pp2 1f1b M=8", 1, {"pp": 2, "microbatches": 8}),
    ("pp2 gpipe M=4", 1, {"pp": 2, "microbatches": 4, "schedule": "gpipe"}),
    ("pp2 zb_h1 M=4", 1, {"pp": 2, "microbatches": 4, "schedule": "zb_h1"}),
    ("pp2 interleaved V=2 M=4", 1,
     {"pp": 2, "microbatches": 4, "schedule": "interleaved_1f1b", "virtual_chunks": 2}),
    ("dp2 x pp2 1f1b M=4", 1, {"dp": 2, "pp": 2, "microbatches": 4}),
]

COMPUTE = ("F", "B", "W")
# Loose on purpose: AdamW's normalised update turns a rounding difference (another summation order of the
# microbatch or replica gradients) in a near-zero gradient into a visible step, so single steps of correct plans
# differ by up to ~1e-3 here after 20 steps. tests/tst_equivalence.cpp is the precise check; this one only
# keeps the benchmark from timing a plan that trains wrongly.
LOSS_RTOL = 1e-2
RUN_TIMEOUT_S = 600


def text_files():
    files = sorted(glob.glob("/usr/share/games/fortunes/*.u8"))
    if files:
        return files
    # Fallback: any sizeable text on a Debian system (the numbers are then not comparable with the README's).
    return sorted(glob.glob("/usr/share/common-licenses/*"))


def cpu_seconds():
    """(CPU seconds every process of the machine has spent busy, CPU seconds of our finished children), or None
    off Linux. The difference over a run is the work of others that shared the cores with it."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]  # user nice system idle iowait irq softirq ...
    except OSError:
        return None
    ours = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK"), ours.ru_utime + ours.ru_stime


def other_cores(before, after, wall):
    """Cores busy with other work between two cpu_seconds() samples `wall` seconds apart, or None."""
    if before is None or after is None or wall <= 0:
        return None
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / wall


def busy_cores(seconds=1.0):
    """Cores kept busy by other work over the next `seconds`, or None off Linux."""
    before = cpu_seconds()
    time.sleep(seconds)
    return other_cores(before, cpu_seconds(), seconds)


def ranks_of(parallel):
    p = parallel or {}
    return p.get("dp", 1) * p.get("tp", 1) * p.get("pp", 1)


def write_config(path, name, m, steps, threads, parallel, profile=None):
    mesh = {"nodes": [{"name": "n0", "device": "cpu", "count": ranks_of(parallel)}]}
    if profile:  # this machine as `meshstudio-engine calibrate` measured it (docs/calibration.md)
        mesh = {"nodes": [{"name": "n0", "device": "here", "count": ranks_of(parallel)}],
                "intra_link": "here.shm", "inter_link": "here.tcp",
                "profiles": [{"name": "here", "file": os.path.abspath(profile)}]}
    config = {
        "version": 1, "name": name, "seed": 1,
        "mesh": mesh,
        "model": {"type": "gpt", "layers": m["L"], "width": m["C"], "heads": m["H"], "vocab": m["V"],
                  "context": m["T"], "tie_embeddings": True},
        "data": {"kind": "text", "files": text_files(), "val_fraction": 0.05},
        "optimizer": {"type": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
        "training": {"steps": steps, "batch_size": m["B"], "seq_len": m["T"], "warmup_steps": 0,
                     "lr_schedule": "constant", "grad_clip": 1.0, "eval_batches": 1, "log_every": 1,
                     "threads": threads},
    }
    if parallel:
        config["parallel"] = parallel
    with open(path, "w") as f:
        json.dump(config, f, indent=1)


def tail(text, lines=30):
    return "\n".join((text or "").rstrip().splitlines()[-lines:]) or "(no stderr)"


def run_engine(mpirun, engine, ranks, threads, config, run_dir, name):
    """Runs one plan; on failure exits with the run's stderr tail. Returns the cores that other work kept busy
    meanwhile (None off Linux)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    # Open MPI binds each rank to one core when it starts at most 2 (4.1: "--bind-to core"), which puts all of a
    # rank's threads on that core; a rank with more threads than one is left unbound instead.
    bind = ["--bind-to", "none"] if threads > 1 else []
    cmd = [mpirun, "--oversubscribe", *bind, "-np", str(ranks), engine, "train", config, "--run-dir", run_dir,
           "--quiet"]
    t0, cpu0 = time.perf_counter(), cpu_seconds()
    # Own process group, so a hung run's ranks go with mpirun when the timeout kills it.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        sys.exit(f"scaling: plan '{name}' timed out after {RUN_TIMEOUT_S} s: {' '.join(cmd)}\n{tail(err)}")
    except BaseException:  # Ctrl-C: the run's own session does not see it, so end the run before leaving
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    if proc.returncode != 0:
        sys.exit(f"scaling: plan '{name}' failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail(err)}")
    return other_cores(cpu0, cpu_seconds(), time.perf_counter() - t0)


def busy_time(spans):
    return sum(s["end"] - s["start"] for s in spans if s["action"] in COMPUTE)


def measured_bubbles(spans_line, replica_of):
    """rank -> bubble of one step's spans line (definition in the header); ranks without compute are left out."""
    compute = {r["rank"]: [s for s in r["spans"] if s["action"] in COMPUTE] for r in spans_line["ranks"]}
    windows = {}  # replica -> (earliest start, latest end)
    for rank, spans in compute.items():
        for s in spans:
            lo, hi = windows.get(replica_of(rank), (s["start"], s["end"]))
            windows[replica_of(rank)] = (min(lo, s["start"]), max(hi, s["end"]))
    out = {}
    for rank, spans in compute.items():
        lo, hi = windows.get(replica_of(rank), (0.0, 0.0))
        if hi > lo:
            out[rank] = 1.0 - busy_time(spans) / (hi - lo)
    return out


def read_run(metrics, warmup):
    """One run's raw figures: kept step times, per-stage bubbles and compute times, G waits, every loss."""
    start, steps, spans = None, {}, {}
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if j["type"] == "run_start":
                start = j
            elif j["type"] == "step":
                steps[j["step"]] = j
            elif j["type"] == "spans":
                spans[j["step"]] = j
    if start is None or not steps:
        sys.exit(f"scaling: {metrics} has no run_start or no step lines")
    kept = [s for s in sorted(steps) if s > warmup]
    if not kept:
        sys.exit(f"scaling: {metrics}: no step after the {warmup} warm-up steps")
    predicted = start["predicted"]
    stage_of = {r["rank"]: r["stage"] for r in predicted["ranks"]}
    parallel = start["config"].get("parallel", {})
    dp, tp = parallel.get("dp", 1), parallel.get("tp", 1)

    def replica_of(rank):  # DP index; rank = (pp_i * dp + dp_i) * tp + tp_i (docs/plan-model.md)
        return (rank // tp) % dp

    bubbles, compute, waits = {}, {}, []  # stage -> values over kept steps and the stage's ranks
    for s in (s for s in kept if s in spans):
        for rank, bubble in measured_bubbles(spans[s], replica_of).items():
            bubbles.setdefault(stage_of.get(rank, 0), []).append(bubble)
        for r in spans[s]["ranks"]:
            compute.setdefault(stage_of.get(r["rank"], 0), []).append(busy_time(r["spans"]))
            waits.append(sum(x["end"] - x["start"] for x in r["spans"] if x["action"] == "G"))
    return {
        "step_times": [steps[s]["step_time_s"] for s in kept],
        "predicted": predicted,
        "bubbles": bubbles,
        "compute": compute,
        "waits": waits,
        "losses": {s: steps[s]["loss"] for s in sorted(steps)},
    }


def summarise(name, threads, parallel, runs, m, cores):
    """Pools one plan's rounds into its row of results."""
    per_round = [m["B"] * m["T"] / statistics.median(r["step_times"]) for r in runs]
    tokens = statistics.median(per_round)
    predicted = runs[0]["predicted"]
    predicted_stage = {}
    for r in predicted["ranks"]:
        predicted_stage.setdefault(r["stage"], r["bubble_fraction"])  # DP and TP peers agree
    stages = []
    for st in sorted(predicted_stage):
        b = [x for r in runs for x in r["bubbles"].get(st, [])]
        c = [x for r in runs for x in r["compute"].get(st, [])]
        stages.append({"stage": st, "measured_bubble": statistics.mean(b) if b else None,
                       "predicted_bubble": predicted_stage[st],
                       "compute_s": statistics.median(c) if c else None})
    waits = [w for r in runs for w in r["waits"]]
    ranks = ranks_of(parallel)
    return {
        "name": name, "ranks": ranks, "threads": threads, "parallel": parallel or {},
        "oversubscribed": ranks * threads > cores,
        "step_time_s": m["B"] * m["T"] / tokens, "tokens_per_s": tokens,
        "tokens_per_s_per_round": per_round,
        "spread": (max(per_round) - min(per_round)) / tokens,
        "other_cores_per_round": [r["other_cores"] for r in runs],
        "predicted_step_time_s": predicted["step_time_s"], "predicted_tokens_per_s": predicted["tokens_per_s"],
        "stages": stages,
        "sync_wait_s": statistics.mean(waits) if waits else None,
        "losses": [r["losses"] for r in runs],
    }


def fmt_stages(stages):
    def f(x):
        return "  -  " if x is None else f"{x:.3f}"
    def ms(x):
        return "" if x is None else f" ({x * 1e3:.0f} ms)"
    return "  ".join(f"s{st['stage']} {f(st['measured_bubble'])}/{f(st['predicted_bubble'])}{ms(st['compute_s'])}"
                     for st in stages)


def fmt_busy(b):
    return "?" if b is None else f"{b:.2f}"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default=os.path.join(here, "..", "build", "engine", "meshstudio-engine"))
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run after the warm-up (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="first steps of each run not used (default 3)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every plan, interleaved (default 3)")
    ap.add_argument("--quick", action="store_true", help="tiny model, 1 round of 1 + 3 steps: a smoke run")
    ap.add_argument("--out", help="write the results as JSON to this file")
    ap.add_argument("--keep", metavar="DIR", help="keep each run's folder (config.json, metrics.jsonl) in DIR")
    ap.add_argument("--calibrate", action="store_true",
                    help="run `meshstudio-engine calibrate` first (about a minute) and use its profile as --profile")
    ap.add_argument("--profile", metavar="FILE",
                    help="plan on this machine's profile (`meshstudio-engine calibrate --out FILE`) instead of "
                         "the cpu entry's placeholders, and compare predicted with measured step times")
    args = ap.parse_args()
    m = QUICK if args.quick else FULL
    if args.quick:
        args.steps, args.warmup, args.rounds = min(args.steps, 3), min(args.warmup, 1), 1
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        sys.exit("scaling: --steps and --rounds must be at least 1, --warmup at least 0")

    engine = os.path.abspath(args.engine)
    if not (os.path.isfile(engine) and os.access(engine, os.X_OK)):
        sys.exit(f"scaling: no engine at {engine}: build it (./test.sh) or pass --engine PATH")
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpirun:
        sys.exit("scaling: mpirun not found: install openmpi-bin")
    if not text_files():
        sys.exit("scaling: no text to train on: install the fortunes package (/usr/share/games/fortunes)")
    cores = os.cpu_count() or 1

    calibrate_s = None
    with tempfile.TemporaryDirectory(prefix="ms-calibrate-") as ctmp:
        if args.calibrate:
            if args.profile:
                sys.exit("scaling: give --calibrate or --profile FILE, not both")
            args.profile = os.path.join(args.keep or ctmp, "profile.json")
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            print(f"  calibrating this machine into {args.profile}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            done = subprocess.run([engine, "calibrate", "--out", args.profile] + (["--quick"] if args.quick else []),
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  timeout=RUN_TIMEOUT_S)
            if done.returncode != 0:
                sys.exit(f"scaling: calibrate failed (exit {done.returncode})\n{tail(done.stderr)}")
            calibrate_s = time.perf_counter() - t0
            with open(args.profile) as f:  # read now: the temporary folder goes when this block ends
                profile_text = f.read()
        if args.calibrate and not args.keep:
            args.profile = os.path.join(tempfile.gettempdir(), f"ms-scaling-profile-{os.getpid()}.json")
            with open(args.profile, "w") as f:
                f.write(profile_text)
    try:
        run_plans(args, m, engine, mpirun, cores, calibrate_s)
    finally:
        if args.calibrate and not args.keep:
            os.remove(args.profile)


def run_plans(args, m, engine, mpirun, cores, calibrate_s):
    busy_before = busy_cores()
    t_all = time.perf_counter()
    runs = [[] for _ in PLANS]
    with tempfile.TemporaryDirectory(prefix="ms-scaling-") as tmp:
        for rnd in range(args.rounds):
            for i, (name, threads, parallel) in enumerate(PLANS):
                ranks = ranks_of(parallel)
                config = os.path.join(tmp, f"plan{i}.json")
                run_dir = os.path.join(args.keep or tmp, f"round{rnd}-plan{i}")
                shutil.rmtree(run_dir, ignore_errors=True)  # a run folder that exists would be resumed
                write_config(config, f"bench-scaling-{i}", m, args.warmup + args.steps, threads, parallel,
                             args.profile)
                print(f"  round {rnd + 1}/{args.rounds}: {name} ({ranks} rank{'s' if ranks > 1 else ''})",
                      file=sys.stderr, flush=True)
                other = run_engine(mpirun, engine, ranks, threads, config, run_dir, name)
                runs[i].append(read_run(os.path.join(run_dir, "metrics.jsonl"), args.warmup))
                runs[i][-1]["other_cores"] = other
    busy_after = busy_cores()
    wall = time.perf_counter() - t_all
    results = [summarise(name, threads, parallel, runs[i], m, cores)
               for i, (name, threads, parallel) in enumerate(PLANS)]

    # Correctness outside the timed region: every run trains like the reference, step by step.
    ref = results[0]
    bad = []
    for r in results:
        worst = max(abs(losses[s] - loss) / abs(loss)
                    for losses in r["losses"] for s, loss in ref["losses"][0].items())
        r["loss_max_rel_diff"] = worst
        if worst > LOSS_RTOL:
            bad.append(f"{r['name']}: loss differs from one rank's by {worst:.2e} relative")
        r["x_vs_1_rank"] = r["tokens_per_s"] / ref["tokens_per_s"]
        r["predicted_x_vs_1_rank"] = r["predicted_tokens_per_s"] / ref["predicted_tokens_per_s"]
    for r in results:
        r["losses"] = [{str(s): v for s, v in losses.items()} for losses in r["losses"]]

    print(f"GPT V={m['V']} T={m['T']} C={m['C']} L={m['L']} H={m['H']} B={m['B']} AdamW fp32 on "
          f"{'fortunes' if 'fortunes' in text_files()[0] else 'common-licenses'}, {cores} cores, 1 thread per "
          f"rank unless said; {args.rounds} round(s) of {args.steps} steps after {args.warmup} warm-up; "
          f"tokens/s from each round's median step time, median over the rounds")
    pred = f" {'pred s':>7s} {'meas s':>7s} {'error':>6s}" if args.profile else ""
    print(f"{'plan':26s} {'ranks':>5s} {'tokens/s':>9s} {'spread':>6s} {'other':>5s} {'x 1 rank':>8s} {'pred x':>6s} "
          f"{'sync ms':>7s}{pred}  per stage: bubble measured/predicted (F+B+W busy per rank and step)")
    for r in results:
        mark = " *" if r["oversubscribed"] else ""
        sync = "-" if r["sync_wait_s"] is None else f"{r['sync_wait_s'] * 1e3:.1f}"
        others = [o for o in r["other_cores_per_round"] if o is not None]
        other = f"{max(others):.2f}" if others else "?"
        r["step_time_error"] = r["predicted_step_time_s"] / r["step_time_s"] - 1
        pred = (f" {r['predicted_step_time_s']:7.4f} {r['step_time_s']:7.4f} {r['step_time_error']:+6.0%}"
                if args.profile else "")
        print(f"{r['name'] + mark:26s} {r['ranks']:5d} {r['tokens_per_s']:9.0f} {r['spread']:6.0%} {other:>5s} "
              f"{r['x_vs_1_rank']:8.2f} {r['predicted_x_vs_1_rank']:6.2f} {sync:>7s}{pred}  "
              f"{fmt_stages(r['stages'])}")
    if any(r["oversubscribed"] for r in results):
        print(f"* more ranks x threads than the {cores} cores: oversubscribed, the ranks share cores")
    print("spread: (max - min) / median of the rounds' tokens/s; other: the most cores that other processes kept "
          "busy during one of the plan's runs")
    if args.profile:
        worst = max(results, key=lambda r: abs(r["step_time_error"]))
        source = (f"measured by calibrate just before the runs ({calibrate_s:.0f} s)" if calibrate_s is not None
                  else args.profile)
        print(f"pred s / meas s: the step time the plan predicts on this machine's profile ({source}) against the "
              f"measured one; worst {worst['step_time_error']:+.0%} ({worst['name']})")
    print(f"pred x: the plans' own predicted tokens/s over the one-rank prediction ({ref['predicted_tokens_per_s']:.0f}"
          f" tokens/s{'' if args.profile else ': the cpu figures are placeholders'}); sync ms: mean end-of-step "
          f"gradient-finish wait (G) per rank")
    busy = max(b for b in [busy_before, busy_after, 0.0] + [o for r in results for o in r["other_cores_per_round"]]
               if b is not None)
    print(f"total wall time {wall:.0f} s; cores busy with other work just before and after the runs: "
          f"{fmt_busy(busy_before)}, {fmt_busy(busy_after)}" + (" (NOT QUIET)" if busy > 0.25 else ""))

    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": m, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
                       "cores": cores, "busy_cores_before": busy_before, "busy_cores_after": busy_after,
                       "date": time.strftime("%Y-%m-%d"), "wall_s": wall, "plans": results}, f, indent=1)
    if bad:
        sys.exit("scaling: wrong training:\n  " + "\n  ".join(bad))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("scaling: interrupted")
