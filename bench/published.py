#!/usr/bin/python3
"""bench/published.py: the planner's predicted MFU against published large-scale runs, row by row.

Megatron-LM's README ("Performance Benchmarking", the model table image images/model_table.png, read at commit
d98e8a64dd of github.com/NVIDIA/Megatron-LM) lists GPT models from 1.7B to 462B trained on H100s with
vocabulary 131072 and 4096-token sequences, the tensor, pipeline and data-parallel sizes, the global batch,
and the per-GPU teraFLOP/s and MFU it measured, "end to end" (data loading, optimizer, communication and
logging included), with DP, TP and PP communication overlapped (--overlap-grad-reduce, --overlap-param-gather,
--tp-comm-overlap). The README states neither the micro-batch size nor the schedule; this script assumes
what Megatron's own GPT scripts default to for these runs: micro-batch 1, the distributed optimizer
(ZeRO-1 here) with its parameter all-gather beside the next forward (the plan's overlap_param_gather;
--serial-param-gather plans it inside the optimizer step instead), bf16, sequence parallelism with tensor
parallelism and its collectives in chunks beside the GEMMs (the plan's tp_comm_overlap; --serial-tp-comm
plans them whole), no recompute, and for pp > 1 the 1F1B schedule (--schedule interleaved_1f1b --chunks V plans the
interleaved one instead), with the layers split over the stages as Megatron-LM splits them by default
(megatron_placement below).

Each row becomes a run config on nodes of 8 H100 SXM (the catalog's NVLink inside a node, InfiniBand
between), `meshstudio-engine plan --json` predicts it, and the table prints predicted against published MFU
and the ratio. "free MFU" plans the same row with every link free (a link type of 10^7 GB/s and no latency):
what the compute costing alone gives (bubbles included), so the rest of the gap is communication the
prediction leaves exposed. The planner's figures do not depend on the machine that runs this.

The two MFUs count FLOPs differently. Megatron's TFLOP/s come from its num_floating_point_operations as it
stood when the table was made (megatron/training/training.py at f2e5db402c, 2024-07-15, "New scaling figures
on H100 GPUs"): 12 B s L h^2 (1 + g/a + s/h + 4 + V / (2 L h)) for these models, which counts both T x T
attention products whole; the planner counts the causal half (model_spec.cpp attentionFlopsPerSample, as
Megatron's own formula has since 8873b55d6a, 2025-03-06). So the comparison is made in time: the published
step time is Megatron's FLOPs over its TFLOP/s, and "pub MFU*" is the planner's FLOPs over that time (what
the planner would call the published run's MFU); "ratio" is predicted over that, the published step time
over the predicted one.

usage: bench/published.py [--engine build/engine/meshstudio-engine] [--schedule 1f1b|interleaved_1f1b]
                          [--chunks V] [--serial-param-gather] [--serial-tp-comm] [--out results.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# (name, heads, hidden, layers, tp, pp, dp, gpus, global batch, published TFLOP/s per GPU, published MFU %)
MEGATRON_H100 = [
    ("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8, 41),
    ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9, 47),
    ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1, 49),
    ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6, 46),
    ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7, 42),
    ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5, 43),
    ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8, 44),
    ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4, 48),
    ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9, 47),
]


def megatron_flops(row, seq=4096, vocab=131072):
    """One step's FLOPs as Megatron counted them for the table (training.py at f2e5db402c): MHA (query
    groups = heads), an MLP of 4 h, full T x T attention, the logits."""
    name, heads, hidden, layers, tp, pp, dp, gpus, batch, _, _ = row
    return 12 * batch * seq * layers * hidden * hidden * (
        (1 + 1 + seq / hidden) + 4 + vocab / (2 * layers * hidden))


def megatron_placement(layers, pp, chunks):
    """Megatron-LM's default split, which these runs used: the blocks evenly over pp x chunks model chunks,
    the embedding with the first chunk and the output layer with the last, chunk k on pipeline rank k mod pp
    (megatron/core/transformer/transformer_block.py get_num_layers_to_build; the embedding and the loss are
    not counted unless --account-for-embedding/loss-in-pipeline-split). MeshStudio's own even split counts
    the embedding and the head as layers, which puts a 13th block on a stage of the 314B."""
    k_total = pp * chunks
    if layers % k_total:
        return None  # Megatron needs an explicit layout here (the 119B's 92 blocks over 8 chunks)
    per = layers // k_total
    out = []
    for k in range(k_total):
        names = (["embedding"] if k == 0 else []) + [f"block.{k * per + i}" for i in range(per)]
        if k == k_total - 1:
            names.append("head")
        out.append({"stage": k % pp, "layers": names})
    return out


def config_for(row, schedule, chunks, overlap_gather=True, overlap_tp=True, megatron_layout=True):
    name, heads, hidden, layers, tp, pp, dp, gpus, batch, _, _ = row
    assert tp * pp * dp == gpus
    parallel = {"dp": dp, "tp": tp, "pp": pp, "microbatches": batch // dp, "zero": 1, "precision": "bf16",
                "recompute": "none", "overlap_param_gather": overlap_gather}
    if tp > 1:
        parallel["sequence_parallel"] = True
        parallel["tp_comm_overlap"] = overlap_tp
    if pp > 1:
        parallel["schedule"] = schedule
        if schedule == "interleaved_1f1b":
            parallel["virtual_chunks"] = chunks
        placement = megatron_placement(layers, pp, chunks if schedule == "interleaved_1f1b" else 1)
        if megatron_layout and placement:
            parallel["placement"] = placement
    return {
        "version": 1,
        "name": f"megatron-{name}",
        "device": "cuda",
        "model": {"type": "gpt", "layers": layers, "width": hidden, "heads": heads, "vocab": 131072,
                  "context": 4096},
        "data": {"kind": "tokens", "train": ["train.bin"], "val": ["val.bin"]},
        "mesh": {"nodes": [{"name": f"node{i:04d}", "device": "h100-sxm-80gb", "count": 8} for i in range(gpus // 8)],
                 "intra_link": "nvlink", "inter_link": "infiniband"},
        "parallel": parallel,
        "optimizer": {"type": "adamw", "lr": 1e-4},
        "training": {"steps": 10, "batch_size": batch, "seq_len": 4096},
    }


def plan(engine, config, path):
    with open(path, "w") as f:
        json.dump(config, f)
    p = subprocess.run([engine, "plan", path, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode:
        raise RuntimeError(p.stderr.strip())
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default=os.path.join(ROOT, "build", "engine", "meshstudio-engine"))
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "interleaved_1f1b"])
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--serial-param-gather", action="store_true",
                    help="plan ZeRO-1's parameter all-gather inside the optimizer step (not overlapped)")
    ap.add_argument("--serial-tp-comm", action="store_true",
                    help="plan the sequence-parallel collectives whole (tp_comm_overlap off)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not os.path.exists(args.engine):
        print(f"bench/published: {args.engine} is missing (build first)", file=sys.stderr)
        return 1
    results = []
    print("Megatron-LM README, GPT on H100 (vocab 131072, 4096 tokens); predicted by `meshstudio-engine plan`")
    print(f"{'model':6} {'tp':>3} {'pp':>3} {'dp':>3} {'GPUs':>5} {'batch':>5} {'step s':>8} {'pred TF':>8} "
          f"{'pub TF':>7} {'pub step':>8} {'pred MFU':>9} {'pub MFU':>8} {'pub MFU*':>9} {'ratio':>6} {'free MFU':>9} "
          f"{'mem GiB':>8} {'fits':>5}")
    with tempfile.TemporaryDirectory() as tmp:
        for row in MEGATRON_H100:
            config = config_for(row, args.schedule, args.chunks, not args.serial_param_gather,
                                not args.serial_tp_comm)
            free = json.loads(json.dumps(config))
            free["mesh"]["link_types"] = [{"name": "free", "bandwidth_gbs": 1e7, "latency_us": 0}]
            free["mesh"]["intra_link"] = free["mesh"]["inter_link"] = "free"
            try:
                j = plan(args.engine, config, os.path.join(tmp, f"{row[0]}.json"))
                jf = plan(args.engine, free, os.path.join(tmp, f"{row[0]}-free.json"))
            except RuntimeError as e:
                print(f"bench/published: {row[0]}: {e}", file=sys.stderr)
                return 1
            mfu = j["mfu"]
            mem = max(d["memory_bytes"]["total"] for d in j["devices"]) / 2**30
            # The published step time, and the planner's FLOPs a step (its MFU x step x peak x GPUs).
            published_step = megatron_flops(row) / (row[9] * 1e12 * row[7])
            planner_flops = mfu * j["step_time_s"] * 989.4e12 * row[7]
            published_like = planner_flops / (published_step * 989.4e12 * row[7])
            res = {"model": row[0], "tp": row[4], "pp": row[5], "dp": row[6], "gpus": row[7], "batch": row[8],
                   "step_time_s": j["step_time_s"], "published_step_time_s": published_step,
                   "predicted_mfu": mfu, "published_mfu": row[10] / 100,
                   "published_mfu_planner_flops": published_like, "ratio": mfu / published_like,
                   "published_tflops": row[9], "predicted_tflops": mfu * 989.4, "max_memory_gib": mem,
                   "fits": j["fits"], "free_links_mfu": jf["mfu"]}
            results.append(res)
            print(f"{row[0]:6} {row[4]:3d} {row[5]:3d} {row[6]:3d} {row[7]:5d} {row[8]:5d} {j['step_time_s']:8.3f} "
                  f"{mfu * 989.4:8.1f} {row[9]:7.1f} {published_step:8.3f} {100 * mfu:8.1f}% {row[10]:7d}% "
                  f"{100 * published_like:8.1f}% {mfu / published_like:6.2f} "
                  f"{100 * jf['mfu']:8.1f}% {mem:8.1f} {'yes' if j['fits'] else 'NO':>5}")
    within = sum(abs(r["ratio"] - 1) <= 0.10 for r in results)
    print(f"\nwithin 10% of the published run (step time, or MFU in one FLOP count): {within} of {len(results)}; "
          f"schedule {args.schedule}"
          + (f" ({args.chunks} chunks)" if args.schedule == "interleaved_1f1b" else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
