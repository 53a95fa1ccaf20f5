#!/bin/bash
# Starts torchtitan's trainer on torchtitan_llama3_70b.toml on one of 8 nodes of 8 GPUs.
torchrun --nnodes 8 --nproc_per_node 8 --node_rank "$NODE_RANK" --rdzv_backend c10d \
    --rdzv_endpoint "$MASTER_ADDR:29500" -m torchtitan.train --job.config_file torchtitan_llama3_70b.toml
