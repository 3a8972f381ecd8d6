#!/usr/bin/env bash
# Continue pre-training a released NeoBERT (a Hugging Face folder or hub name in the published layout, of any shape)
# on your own corpus, and export the result to Hugging Face again:
#
#   RELEASED=chandar-lab/NeoBERT CORPUS='domain/*.parquet' JSON_KEY=text bash examples/continue_pretraining.sh
#
# 1. the released model becomes a megatron-core checkpoint ($WORK_DIR/released; its args record its shape and its
#    tokenizer); 2. the corpus is tokenized with that tokenizer; 3. the trainer starts from the released weights
#    (--pretrained-checkpoint: weights only, iteration 0, a fresh optimizer, as --finetune / --no-load-optim) with
#    the released model's shape and tokenizer (--use-checkpoint-args; no preset needed) and saves into
#    $WORK_DIR/checkpoints, which the same command resumes from after a pre-emption (--load of the run's own folder,
#    with its optimizer state); 4. the last checkpoint is exported to $WORK_DIR/hf, whose config keeps the released
#    one's max_length and intermediate_size.
#
# Learning rate: a peak of 1e-4 with 6% warm-up, then the recipe's cosine decay to 10%: the domain-adaptive
# pre-training of Gururangan et al. (2020, "Don't Stop Pretraining") continued RoBERTa at 1e-4 (a sixth of its
# pre-training peak, 6e-4, which is NeoBERT's too) with 6% warm-up; the full peak would undo much of what the
# released model learned before the warm-up ends.
#
# Settings through the environment: RELEASED, CORPUS (files or a glob, Parquet or JSON lines), JSON_KEY (the text
# field; default text), WORK_DIR, NPROC (ranks; default 8), TRAIN_ITERS (default 12500), GLOBAL_BATCH (sequences per
# step; default 2048), MICRO_BATCH (default 32), SEQ_LENGTH (default 1024), MASTER_PORT. Arguments go to the trainer
# after ours (e.g. --bf16 --use-distributed-optimizer, or --eval-interval 500).
set -euo pipefail

: "${CORPUS:?give CORPUS, the files of your corpus (e.g. CORPUS='domain/*.parquet')}"
RELEASED=${RELEASED:-chandar-lab/NeoBERT}
JSON_KEY=${JSON_KEY:-text}
WORK_DIR=${WORK_DIR:-neobert_continued}
NPROC=${NPROC:-8}
REPO=$(cd "$(dirname "$0")/.." && pwd)
DATA=$WORK_DIR/data/domain_${JSON_KEY}_document

echo "== 1/4 convert $RELEASED to a megatron-core checkpoint: $WORK_DIR/released"
if [ ! -d "$WORK_DIR/released" ]; then
    python "$REPO/tools/convert_checkpoint.py" --direction hf-to-mcore --load "$RELEASED" \
        --save "$WORK_DIR/released" --no-progress
fi

echo "== 2/4 tokenize $CORPUS with the released tokenizer: $DATA"
if [ ! -f "$DATA.idx" ]; then
    python "$REPO/tools/preprocess_data.py" --input "$CORPUS" --json-keys "$JSON_KEY" \
        --output-prefix "$WORK_DIR/data/domain" --tokenizer-model "$RELEASED"
fi

echo "== 3/4 continue pre-training on $NPROC ranks (re-running resumes from $WORK_DIR/checkpoints)"
torchrun --nproc-per-node "$NPROC" --master-port "${MASTER_PORT:-29512}" -m megatron_neobert.pretrain \
    --pretrained-checkpoint "$WORK_DIR/released" --use-checkpoint-args \
    --save "$WORK_DIR/checkpoints" --load "$WORK_DIR/checkpoints" --save-interval 1000 \
    --data-path "$DATA" --split 99,1,0 \
    --seq-length "${SEQ_LENGTH:-1024}" --micro-batch-size "${MICRO_BATCH:-32}" \
    --global-batch-size "${GLOBAL_BATCH:-2048}" --train-iters "${TRAIN_ITERS:-12500}" \
    --lr 1e-4 --lr-warmup-fraction 0.06 \
    "$@"

echo "== 4/4 export to a Hugging Face folder: $WORK_DIR/hf"
python "$REPO/tools/convert_checkpoint.py" --direction mcore-to-hf --load "$WORK_DIR/checkpoints" \
    --save "$WORK_DIR/hf" --overwrite --no-progress
echo "done: $WORK_DIR/hf (AutoModelForMaskedLM.from_pretrained after import megatron_neobert.hf)"
