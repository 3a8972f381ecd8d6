#!/usr/bin/env bash
# NeoBERT stage 2: go on from stage 1 at four times its length with the same tokens per step, for a twentieth
# of its steps: after the paper's stage 1 (1M steps of 2048 x 1024 tokens on 8 GPUs) that is 50k steps of
# 512 x 4096, iterations 1,000,001 .. 1,050,000. Everything else comes from the stage-1 checkpoint
# (python -m megatron_neobert.cli.stage2_plan reads it): the preset and sizes, the tokenizer, the ranks, the
# parallel layout, the optimizer setup and schedule, and the data unless DATA_DIR or DATA_PATH says otherwise.
#
#   STAGE1_DIR=checkpoints/neobert-stage1 DATA_DIR=data examples/pretrain_neobert_stage2.sh    # the paper's
#   STAGE1_DIR=neobert_quickstart/checkpoints bash examples/pretrain_neobert_stage2.sh        # after the quickstart
#
# The paper's data: a 0.2 / 0.4 / 0.4 blend of RefinedWeb / RefinedWeb1024+ / RefinedWeb2048+, DATA_DIR holding
# the three preprocessed datasets. Make the subsets first:
#
#   neobert-make-length-subset --input-prefix data/refinedweb_content_document \
#       --min-tokens 1024 --output-prefix data/refinedweb1024plus_content_document
#   (and --min-tokens 2048 for refinedweb2048plus)
#
# Settings through the environment: STAGE1_DIR (stage 1's --save), CHECKPOINT_DIR (stage 2's, default
# neobert-stage2 beside STAGE1_DIR), DATA_DIR or DATA_PATH (a prefix or a weighted blend), SEQ_LENGTH,
# STAGE2_ITERS, GPUS_PER_NODE (default: stage 1's ranks / NNODES), NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT.
# Arguments go to the trainer after ours, so they override them.
#
# LOAD_OPTIM=1 (default): continue the stage-1 run with its optimizer state and schedule (at the paper's step 1M
#   the schedule is in its constant tail, 6e-5). The optimizer state loads only into the setup that saved it,
#   which is stage 1's here.
# LOAD_OPTIM=0: the stage-1 weights only (--finetune): a fresh optimizer, iterations 1 .. STAGE2_ITERS, at
#   stage 1's final learning rate after a 1% warmup.
# The data position restarts at the start of the new data (the trainer sees that the data settings differ
# from the checkpoint's); a re-run of this script resumes stage 2 itself.
set -euo pipefail

STAGE1_DIR=${STAGE1_DIR:-checkpoints/neobert-stage1}
CHECKPOINT_DIR=${CHECKPOINT_DIR:-$(dirname "$STAGE1_DIR")/neobert-stage2}
LOAD_OPTIM=${LOAD_OPTIM:-1}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
if [ -n "${DATA_DIR:-}" ] && [ -z "${DATA_PATH:-}" ]; then
    DATA_PATH="0.2 ${DATA_DIR}/refinedweb_content_document 0.4 ${DATA_DIR}/refinedweb1024plus_content_document 0.4 ${DATA_DIR}/refinedweb2048plus_content_document"
fi

# RANKS (stage 1's world size) and STAGE2_FLAGS (the trainer's), with a line saying what came from stage 1.
PLAN=$(python -m megatron_neobert.cli.stage2_plan --stage1 "$STAGE1_DIR" --save "$CHECKPOINT_DIR" \
    --load-optim "$LOAD_OPTIM" ${SEQ_LENGTH:+--seq-length "$SEQ_LENGTH"} ${STAGE2_ITERS:+--iters "$STAGE2_ITERS"} \
    ${DATA_PATH:+--data-path $DATA_PATH})
eval "$PLAN"
GPUS_PER_NODE=${GPUS_PER_NODE:-$(( RANKS / NNODES ))}

source "$(dirname "${BASH_SOURCE[0]}")/cuda_env.sh" "$@"  # CUDA_DEVICE_MAX_CONNECTIONS with TP > 1
exec torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    -m megatron_neobert.pretrain "${STAGE2_FLAGS[@]}" \
    --data-cache-path "${CHECKPOINT_DIR}/data_cache" --keep-last-n-checkpoints 3 --exit-signal-handler \
    --tensorboard-dir "${CHECKPOINT_DIR}/tensorboard" \
    "$@"
