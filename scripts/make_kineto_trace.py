#!/usr/bin/python3
"""Writes real PyTorch profiler (Kineto) traces for the trace import's tests (engine/plan/trace_import.h).

Two processes (world size 2, torch.distributed over gloo, a file store) each train a tiny MLP on the CPU for
a few steps under torch.profiler with record_shapes and a schedule (so the trace has ProfilerStep#N markers),
and all-reduce every gradient plus one tensor of a known size each step. Each rank R writes two files:

  OUT_DIR/torch-cpu-rankR.json         prof.export_chrome_trace() as this torch writes it;
  OUT_DIR/torch-cpu-rankR.kineto.json  the same events in Kineto's layout (see below).

Debian's torch (1.13) is built without Kineto (torch.autograd.kineto_available() is False), so its
export_chrome_trace falls back to the legacy autograd profiler's writer: a bare array of "X" events with
"pid": "CPU functions", empty args and no rank. The shapes that record_shapes recorded are in the profiler's
events all the same (FunctionEvent.input_shapes), so the second file writes those events as Kineto writes
them (pytorch/kineto libkineto/src/output_json.cpp, torch/profiler/profiler.py): an object with
"schemaVersion", "distributedInfo" {"backend", "rank", "world_size"} (what torch.profiler adds under
torch.distributed), and "traceEvents" with "cat" ("cpu_op", or "user_annotation" for record_function
ranges), integer pid and tid, and args "Input Dims". The times, names and shapes are the measured ones; only
the layout is written here.

What the tests rely on (tests/tst_trace_import.cpp, kKineto*):
  - the model: Linear(16, 32) -> ReLU -> Linear(32, 8) on a batch of 4, so the forward runs aten::addmm with
    (m, n, k) = (4, 32, 16) and (4, 8, 32), and the backward aten::mm for the gradients;
  - the steps recorded: schedule(wait=1, warmup=1, active=2), so ProfilerStep#2 and ProfilerStep#3;
  - the all_reduces of each step, fp32: the gradients (16*32, 32, 32*8 and 8 floats, in the order the
    model's parameters come) and then 1000 floats, so 2048, 128, 1024, 32 and 4000 bytes.

Run with Debian's PyTorch (it is in /usr/bin/python3, not in a virtual environment's python):
    /usr/bin/python3 scripts/make_kineto_trace.py tests/data/traces
Takes a few seconds. The checked-in traces under tests/data/traces/ were written this way (torch 1.13);
gloo's collectives show up as "gloo:all_reduce" record_function events on gloo's own threads (with the
tensor's "Input Dims"), and c10d::allreduce_ ops on the main thread that enqueue them.
"""

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

KNOWN_NUMEL = 1000  # the extra all_reduce's floats
STEPS = 4  # wait 1, warmup 1, active 2


def write_kineto_layout(prof, path, rank, world):
    pid = os.getpid()
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python3"}}]
    for evt in prof.events():
        if evt.trace_name is None:
            continue
        name = evt.trace_name
        record_function = name.startswith("ProfilerStep") or ":" not in name or name.startswith("gloo:")
        e = {"ph": "X", "cat": "user_annotation" if record_function else "cpu_op", "name": name, "pid": pid,
             "tid": evt.thread, "ts": evt.time_range.start, "dur": evt.time_range.elapsed_us(), "args": {}}
        if any(len(s) > 0 for s in evt.input_shapes):
            e["args"]["Input Dims"] = evt.input_shapes
        events.append(e)
    doc = {"schemaVersion": 1,
           "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
           "traceEvents": events}
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def rank_main(rank, world, store_file, out_dir):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store_file, rank=rank, world_size=world)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)
    y = torch.randn(4, 8)
    known = torch.ones(KNOWN_NUMEL)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                record_shapes=True) as prof:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            dist.all_reduce(known)
            opt.step()
            prof.step()
    prof.export_chrome_trace(os.path.join(out_dir, "torch-cpu-rank%d.json" % rank))
    write_kineto_layout(prof, os.path.join(out_dir, "torch-cpu-rank%d.kineto.json" % rank), rank, world)
    dist.barrier()
    dist.destroy_process_group()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_kineto_trace.py OUT_DIR")
    out_dir = os.path.abspath(sys.argv[1])
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(2, os.path.join(tmp, "store"), out_dir), nprocs=2, join=True)


if __name__ == "__main__":
    main()
