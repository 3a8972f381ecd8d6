#!/usr/bin/env bash
# NeoBERT stage 1: 1M steps at length 1024, 2M tokens per step, on one 8-GPU node
# as in the paper (8 GPUs x 32 sequences x 8 accumulation x 1024 tokens). Multi-node: set NNODES,
# MASTER_ADDR (the node that holds the rendezvous) and RDZV_ID (one name for the job) on every node; the global
# batch stays 2048 (accumulation shrinks).
#
#   DATA_PATH=data/refinedweb_content_document CHECKPOINT_DIR=ckpt/neobert examples/pretrain_neobert.sh
#
# Re-running the same command resumes from CHECKPOINT_DIR's latest complete checkpoint. Within the job, torchrun
# does the same after a failure (a rank that dies, a lost node): it restarts every rank, up to MAX_RESTARTS times,
# and they resume from the latest complete checkpoint. With NNODES=MIN:MAX (e.g. 2:4) a job that lost nodes goes on
# with the rest (the same global batch, more accumulation per rank), and a node that comes back joins at the next
# restart; the node at MASTER_ADDR holds the rendezvous and must stay.
set -euo pipefail

: "${DATA_PATH:?set DATA_PATH to a preprocessed prefix (neobert-preprocess-data), or a weighted blend}"
CHECKPOINT_DIR=${CHECKPOINT_DIR:-checkpoints/neobert-stage1}
TENSORBOARD_DIR=${TENSORBOARD_DIR:-${CHECKPOINT_DIR}/tensorboard}
TOKENIZER_MODEL=${TOKENIZER_MODEL:-bert-base-uncased}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${NNODES:-1}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
MAX_RESTARTS=${MAX_RESTARTS:-3}
if [ -z "${RDZV_ID:-}" ] && [ "$NNODES" != 1 ] && [ -z "${SLURM_JOB_ID:-}" ]; then
    echo "error: NNODES=$NNODES: set RDZV_ID to one name for this job on every node (e.g. the scheduler's job id)" >&2
    exit 2
fi
RDZV_ID=${RDZV_ID:-${SLURM_JOB_ID:-neobert-$(hostname)-$$}}
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
    # scheduler's signals itself: SIGTERM (a pre-emption, or the batch script before the time limit) asks for the
    # save; SLURM requeues the job, which resumes.
    export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS
    exec python -m megatron_neobert.pretrain "${ARGS[@]}" "$@"
fi
# torchrun forwards SIGTERM (--exit-signal's default) to the ranks and kills them --shutdown-timeout
# seconds later: longer than a save. The c10d rendezvous lets the job go on at another number of nodes.
# Its timeouts bound what a lost node costs (docs/training.md, "A host cut off"): a node is gone after 3 missed
# heartbeats of 5 s; a round that has MIN nodes waits 15 s for more (torch: 30); a round still short of MIN nodes
# fails after RDZV_JOIN_TIMEOUT (torch: 600), at a start as after a lost node: raise it where nodes start minutes
# apart; store reads give up after 60 s.
RDZV_CONF=join_timeout=${RDZV_JOIN_TIMEOUT:-60},last_call_timeout=15,read_timeout=60,keep_alive_interval=5
RDZV_CONF=$RDZV_CONF,keep_alive_max_attempt=3
exec torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$RDZV_ID" \
    --max-restarts "$MAX_RESTARTS" --shutdown-timeout "${SHUTDOWN_TIMEOUT:-300}" --rdzv-conf "$RDZV_CONF" \
    -m megatron_neobert.pretrain "${ARGS[@]}" "$@"
