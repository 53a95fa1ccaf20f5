#!/bin/bash
# GPT-3 175B (Brown et al. 2020, table 2.1: 96 layers, d_model 12288, 96 heads, context 2048, batch 3.2M
# tokens = 1536 sequences, lr 0.6e-4 with cosine decay to 10%) with tensor parallelism 8 and pipeline
# parallelism 16 (the split Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh uses) on 128 nodes of 8
# GPUs (this test's choice: data parallelism 8), launched as a pretrain_gpt.py job under Slurm. Written for
# MeshStudio's import tests from the flags Megatron-LM documents (megatron/training/arguments.py). The model's
# shape, the batch and the learning rates are the paper's; the step counts, warm-up and
# intervals are this test's. The last flag is not Megatron-LM's: the import must list it as unknown.
#SBATCH --job-name=gpt3-175b
#SBATCH --nodes=128
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8

export CUDA_DEVICE_MAX_CONNECTIONS=1
RUN_DIR=/lustre/runs/gpt3-175b
DATA_PATH=/lustre/data/pile_text_document

MODEL=(
  --num-layers 96 --hidden-size 12288 --num-attention-heads 96
  --seq-length 2048 --max-position-embeddings 2048
  --init-method-std 0.006
  --attention-dropout 0.1 --hidden-dropout 0.1   # the paper trained with dropout
)
PARALLEL=(
  --tensor-model-parallel-size 8
  --pipeline-model-parallel-size 16
  --sequence-parallel
  --use-distributed-optimizer
  --bf16
)
TRAINING=(
  --micro-batch-size 1 --global-batch-size 1536
  --train-iters 300000
  --lr 6.0e-5 --min-lr 6.0e-6 --lr-decay-style cosine --lr-warmup-iters 120
  --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0
  --overlap-grad-reduce --overlap-param-gather
)
DATA=(
  --data-path "$DATA_PATH" --vocab-file "$RUN_DIR/gpt2-vocab.json" --merge-file "$RUN_DIR/gpt2-merges.txt"
  --split 949,50,1
  --save "$RUN_DIR/checkpoints" --load "$RUN_DIR/checkpoints" --save-interval 2000
  --log-interval 10 --eval-interval 1000 --eval-iters 10
)

srun python pretrain_gpt.py "${MODEL[@]}" "${PARALLEL[@]}" "${TRAINING[@]}" "${DATA[@]}" --not-a-megatron-flag 3
