#!/usr/bin/env bash
# NeoBERT stage 2: 50k more steps at length 4096 with the same 2M tokens per step
# (512 x 4096), each batch drawn from RefinedWeb / RefinedWeb1024+ / RefinedWeb2048+ with
# probabilities 0.2 / 0.4 / 0.4. Make the subsets first:
#
#   neobert-make-length-subset --input-prefix data/refinedweb_content_document \
#       --min-tokens 1024 --output-prefix data/refinedweb1024plus_content_document
#   (and --min-tokens 2048 for refinedweb2048plus)
#
# LOAD_OPTIM=1 (default): continue the stage-1 run with its optimizer state and schedule (at step
#   1M the schedule is in its constant tail, 6e-5), iterations 1,000,001 .. 1,050,000.
#   The optimizer state loads only into the setup that saved it (here --bf16
#   --use-distributed-optimizer); a stage 1 trained otherwise (as the quickstart) is refused with a
#   line saying what differs: pass --no-load-optim to keep its weights, iteration and schedule.
# LOAD_OPTIM=0: the stage-1 weights only (--finetune): a fresh optimizer, iterations 1 .. 50,000,
#   at the constant 6e-5 after a short warmup.
# The data position restarts at the start of the new blend (the trainer sees that the data
# settings differ from the checkpoint's); a re-run of this script resumes stage 2 itself.
set -euo pipefail

DATA_DIR=${DATA_DIR:?set DATA_DIR to the folder with the three preprocessed datasets}
STAGE1_DIR=${STAGE1_DIR:-checkpoints/neobert-stage1}
CHECKPOINT_DIR=${CHECKPOINT_DIR:-checkpoints/neobert-stage2}
LOAD_OPTIM=${LOAD_OPTIM:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}

BLEND="0.2 ${DATA_DIR}/refinedweb_content_document 0.4 ${DATA_DIR}/refinedweb1024plus_content_document 0.4 ${DATA_DIR}/refinedweb2048plus_content_document"

# Stage 2 saves into its own folder; until it has a checkpoint there, it starts from stage 1's.
LOAD=$CHECKPOINT_DIR
if [ ! -f "${CHECKPOINT_DIR}/latest_checkpointed_iteration.txt" ]; then
    LOAD=$STAGE1_DIR
    if [ "$LOAD_OPTIM" = 0 ]; then FRESH=(--finetune); fi
fi
if [ "$LOAD_OPTIM" = 1 ]; then
    SCHEDULE=(--train-iters 1050000 --lr 6e-4 --min-lr 6e-5 --lr-warmup-iters 2000 --lr-decay-iters 900000)
else
    SCHEDULE=(--train-iters 50000 --lr 6e-5 --lr-decay-style constant --lr-warmup-iters 500)
fi

source "$(dirname "${BASH_SOURCE[0]}")/cuda_env.sh" "$@"  # CUDA_DEVICE_MAX_CONNECTIONS with TP > 1
exec torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    -m megatron_neobert.pretrain \
    --model-preset neobert-250m --tokenizer-model "${TOKENIZER_MODEL:-bert-base-uncased}" \
    --data-path $BLEND --split 949,50,1 --data-cache-path "${CHECKPOINT_DIR}/data_cache" \
    --seq-length 4096 --micro-batch-size 8 --global-batch-size 512 \
    "${SCHEDULE[@]}" "${FRESH[@]}" \
    --bf16 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --load "$LOAD" --save "$CHECKPOINT_DIR" --save-interval 2500 --keep-last-n-checkpoints 3 \
    --exit-signal-handler \
    --log-interval 100 --eval-interval 2500 --eval-iters 20 --tensorboard-dir "${CHECKPOINT_DIR}/tensorboard" \
    "$@"
