#!/usr/bin/env bash
# Quickstart: pre-train the tiny NeoBERT on the built-in sample corpus (Python's documentation,
# 1.4M tokens) in a few minutes, on 2 ranks: GPUs when there are 2, else CPU processes over gloo.
#
#   pip install .            # from the repository root
#   bash examples/quickstart.sh
#
# Settings through the environment: WORK_DIR (outputs), NPROC (ranks), TRAIN_ITERS.
# Runs from any directory; needs only the installed package (its assets and modules).
set -euo pipefail

WORK_DIR=${WORK_DIR:-neobert_quickstart}
NPROC=${NPROC:-2}
TRAIN_ITERS=${TRAIN_ITERS:-300}
mkdir -p "$WORK_DIR"
TOKENIZER=$(python -c "from megatron_neobert.data.assets import SAMPLE_TOKENIZER; print(SAMPLE_TOKENIZER)")

echo "== 1/3 preprocess: tokenize the sample corpus into $WORK_DIR/data"
python - "$WORK_DIR/data/sample" <<'PY'
import sys
from megatron_neobert.data.assets import SAMPLE_CORPUS, SAMPLE_TOKENIZER
from megatron_neobert.data.preprocess import preprocess_data
stats = preprocess_data([SAMPLE_CORPUS], sys.argv[1], tokenizer_model=SAMPLE_TOKENIZER, progress=False)
print(stats.summary())
PY

echo "== 2/3 pre-train neobert-tiny for $TRAIN_ITERS steps on $NPROC ranks (watch the loss fall)"
# Length 128, 16 sequences (2k tokens) per step, the paper's optimizer and masking, a short
# schedule: 30 warmup steps to 2e-3, cosine to 10% over 90% of the steps. Re-running resumes.
torchrun --nproc-per-node "$NPROC" --master-port "${MASTER_PORT:-29511}" -m megatron_neobert.pretrain \
    --model-preset neobert-tiny \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER" \
    --data-path "$WORK_DIR/data/sample_content_document" --split 98,2,0 \
    --data-cache-path "$WORK_DIR/data/cache" --num-workers 1 \
    --seq-length 128 --micro-batch-size 8 --global-batch-size 16 \
    --train-iters "$TRAIN_ITERS" --lr 2e-3 --lr-warmup-iters 30 \
    --log-interval 20 --eval-interval 100 --eval-iters 4 \
    --save "$WORK_DIR/checkpoints" --load "$WORK_DIR/checkpoints" --save-interval 100 \
    --tensorboard-dir "$WORK_DIR/tensorboard" \
    "$@"
CHECKPOINT=$WORK_DIR/checkpoints/iter_$(printf %07d "$(cat "$WORK_DIR/checkpoints/latest_checkpointed_iteration.txt")")
echo "== 3/3 checkpoint: $CHECKPOINT (megatron-core distributed checkpoint, loads at any TP/PP)"

# ---- HOOK: export to Hugging Face ---------------------------------------------------------
# (the lead adds: convert $CHECKPOINT into a transformers folder under $WORK_DIR/hf)

# ---- HOOK: small evaluation ---------------------------------------------------------------
# (the lead adds: a small evaluation of the exported model)

echo "done: TensorBoard logs in $WORK_DIR/tensorboard (tensorboard --logdir $WORK_DIR/tensorboard)"
