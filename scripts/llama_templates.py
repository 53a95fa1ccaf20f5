#!/usr/bin/python3
"""Writes the Llama 3 planning templates (resources/examples/llama3-*.json): the published model shapes
(Grattafiori et al. 2024, "The Llama 3 Herd of Models", table 3) on H100 meshes of 8 GPUs a node, with the
parallel layouts their trainers published:

  llama3-8b-8xh100     one node; FSDP over the 8 GPUs (ZeRO-3), selective recompute, 8192-token
                       sequences (torchtitan's Llama 3 8B recipe: one sequence a GPU)
  llama3-70b-64xh100   8 nodes; tp 8 inside a node x ZeRO-3 data parallelism over nodes, sequence parallel,
                       full recompute (torchtitan's Llama 3 70B recipe layout)
  mixtral-8x7b-64xh100 8 nodes; the experts split by tp 8 inside a node as the dense MLPs are (expert
                       parallelism is to come), ZeRO-1 over the 8 nodes, 4096-token sequences
  llama3-405b-16k      2048 nodes; tp 8, pp 16, dp 128, 8192-token sequences, 16 sequences a data-parallel
                       group (2048 a step, 16M tokens), interleaved 1F1B (the Llama 3 paper, table 4, first
                       16384-GPU row), 4 virtual chunks a stage; the first block of each chunk recomputed
                       (Megatron's --recompute-num-layers 1, block method), the least recompute that fits
                       80 GB (63.6 GiB on the fullest GPU; 96.6 without any, bench/templates.py)

Run from the repository root: scripts/llama_templates.py. The files are plain run configs; the studio opens
them from File > New.
"""
import json
import os

H100 = "h100-sxm-80gb"


def mesh(nodes):
    return {"nodes": [{"name": f"node{i:04d}" if nodes > 8 else f"node{i}", "device": H100, "count": 8}
                      for i in range(nodes)],
            "intra_link": "nvlink", "inter_link": "infiniband"}


def llama3(layers, width, heads, ffn):
    return {"type": "llama", "layers": layers, "width": width, "heads": heads, "kv_heads": 8,
            "ffn_hidden": ffn, "rope_theta": 500000, "layer_norm_eps": 1e-5, "vocab": 128256,
            "context": 8192, "tie_embeddings": False}


def mixtral():
    # Mixtral 8x7B (Jiang et al. 2024): Mistral 7B's blocks, 8 experts of 14336 a block, 2 a token.
    return {"type": "llama", "layers": 32, "width": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
            "rope_theta": 1000000, "layer_norm_eps": 1e-5, "vocab": 32000, "context": 32768,
            "tie_embeddings": False, "experts": 8, "experts_per_token": 2, "aux_loss_coef": 0.02}


def config(name, model, nodes, parallel, batch, steps, lr, warmup, seq=8192):
    return {"version": 1, "name": name, "seed": 1, "device": "cuda", "model": model,
            "data": {"kind": "tokens", "train": ["data/llama3/train_*.bin"], "val": ["data/llama3/val_*.bin"]},
            "mesh": mesh(nodes), "parallel": parallel,
            "optimizer": {"type": "adamw", "lr": lr, "betas": [0.9, 0.95], "weight_decay": 0.1},
            "training": {"steps": steps, "batch_size": batch, "seq_len": seq, "warmup_steps": warmup,
                         "grad_clip": 1.0}}


TEMPLATES = {
    "llama3-8b-8xh100": config(
        "llama3-8b-8xh100", llama3(32, 4096, 32, 14336), 1,
        {"dp": 8, "zero": 3, "recompute": "selective", "precision": "bf16"}, 8, 1000, 3e-4, 200),
    "llama3-70b-64xh100": config(
        "llama3-70b-64xh100", llama3(80, 8192, 64, 28672), 8,
        {"dp": 8, "tp": 8, "microbatches": 8, "zero": 3, "sequence_parallel": True, "recompute": "full",
         "precision": "bf16"},
        64, 1000, 1.5e-4, 200),
    "llama3-405b-16k": config(
        "llama3-405b-16k", llama3(126, 16384, 128, 53248), 2048,
        {"dp": 128, "tp": 8, "pp": 16, "schedule": "interleaved_1f1b", "virtual_chunks": 4, "microbatches": 16,
         "zero": 1, "sequence_parallel": True, "recompute": "full", "recompute_layers": 1, "precision": "bf16"},
        2048, 1200000, 8e-5, 8000),
    "mixtral-8x7b-64xh100": config(
        "mixtral-8x7b-64xh100", mixtral(), 8,
        {"dp": 8, "tp": 8, "microbatches": 8, "zero": 1, "sequence_parallel": True, "recompute": "full",
         "precision": "bf16"},
        64, 1000, 1e-4, 200, seq=4096),
}


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "resources", "examples")
    for name, c in TEMPLATES.items():
        path = os.path.join(root, name + ".json")
        # One mesh node a line, as the other large templates keep them.
        nodes = c["mesh"]["nodes"]
        c = dict(c, mesh=dict(c["mesh"], nodes="NODES"))
        lines = ",\n".join("      " + json.dumps(n) for n in nodes)
        text = json.dumps(c, indent=2).replace('"nodes": "NODES"', '"nodes": [\n' + lines + "\n    ]")
        with open(path, "w") as f:
            f.write(text + "\n")
        print(path)


if __name__ == "__main__":
    main()
