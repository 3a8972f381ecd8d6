#!/usr/bin/env bash
# NeoBERT stage 1: 1M steps at length 1024, 2M tokens per step, on one 8-GPU node
# as in the paper (8 GPUs x 32 sequences x 8 accumulation x 1024 tokens). Multi-node: set NNODES,
# NODE_RANK, MASTER_ADDR on every node; the global batch stays 2048 (accumulation shrinks).
#
#   DATA_PATH=data/refinedweb_content_document CHECKPOINT_DIR=ckpt/neobert examples/pretrain_neobert.sh
#
# Re-running the same command resumes from CHECKPOINT_DIR's latest complete checkpoint.
set -euo pipefail

: "${DATA_PATH:?set DATA_PATH to a preprocessed prefix (neobert-preprocess-data), or a weighted blend}"
CHECKPOINT_DIR=${CHECKPOINT_DIR:-checkpoints/neobert-stage1}
TENSORBOARD_DIR=${TENSORBOARD_DIR:-${CHECKPOINT_DIR}/tensorboard}
TOKENIZER_MODEL=${TOKENIZER_MODEL:-bert-base-uncased}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-32}

# The optimizer, schedule, masking and batch are the defaults (the paper's recipe); they are
# spelled out here so that the command documents the run.
ARGS=(
    --model-preset neobert-250m
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_MODEL"
    --data-path $DATA_PATH --split 949,50,1 --data-cache-path "${CHECKPOINT_DIR}/data_cache"
    --seq-length 1024 --micro-batch-size "$MICRO_BATCH_SIZE" --global-batch-size 2048
    --train-iters 1000000
    --lr 6e-4 --min-lr 6e-5 --lr-warmup-iters 2000 --lr-decay-iters 900000 --lr-decay-style cosine
    --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --weight-decay 0.1 --clip-grad 1.0
    --mask-rate 0.2 --mask-scheme mask --packed
    --bf16 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
    --save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR" --save-interval 5000 --keep-last-n-checkpoints 3
    --exit-signal-handler
    --log-interval 100 --eval-interval 5000 --eval-iters 50 --tensorboard-dir "$TENSORBOARD_DIR"
)

source "$(dirname "${BASH_SOURCE[0]}")/cuda_env.sh" "$@"  # CUDA_DEVICE_MAX_CONNECTIONS with TP > 1
if [ "${SLURM_TASK_PER_GPU:-0}" = 1 ]; then
    # One SLURM task per GPU (examples/pretrain_neobert.slurm): no torchrun; every rank gets the
    # scheduler's signals itself: SIGUSR1 (#SBATCH --signal=USR1@300) asks for the save.
    export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS
    exec python -m megatron_neobert.pretrain "${ARGS[@]}" --exit-signal SIGUSR1 "$@"
fi
# torchrun forwards SIGTERM (--exit-signal's default) to the ranks and kills them --shutdown-timeout
# seconds later: longer than a save.
exec torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" --shutdown-timeout "${SHUTDOWN_TIMEOUT:-300}" \
    -m megatron_neobert.pretrain "${ARGS[@]}" "$@"
