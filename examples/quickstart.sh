#!/usr/bin/env bash
# Quickstart: pre-train the tiny NeoBERT on the built-in sample corpus (Python's documentation,
# 1.4M tokens) in a few minutes, on 2 ranks: GPUs when there are 2, else CPU processes over gloo.
#
#   pip install .            # from the repository root
#   bash examples/quickstart.sh
#
# Settings through the environment: WORK_DIR (outputs), NPROC (ranks), TRAIN_ITERS (steps, at least 2; the
# warmup is a tenth of them, at most 30), MASTER_PORT (torchrun's), MAX_RESTARTS (how many times a failed run is
# restarted within the job, from its latest checkpoint; 2 by default). Arguments go to the trainer after ours, so
# they override them (e.g. `bash examples/quickstart.sh --lr 1e-3 --lr-warmup-iters 10`).
# Runs from any directory; needs only the installed package (its assets and modules).
set -euo pipefail

WORK_DIR=${WORK_DIR:-neobert_quickstart}
# The trainer refuses a CUDA build of torch that sees no GPU (a container started without GPUs, say); the quickstart
# runs on CPU processes then, as said above: PyPI's torch for Linux is a CUDA build, the one CPython 3.12 gets.
export NEOBERT_ALLOW_CPU=${NEOBERT_ALLOW_CPU:-1}
NPROC=${NPROC:-2}
TRAIN_ITERS=${TRAIN_ITERS:-300}
if ! [[ "$TRAIN_ITERS" =~ ^[0-9]+$ ]] || (( TRAIN_ITERS < 2 )); then
    echo "error: TRAIN_ITERS=$TRAIN_ITERS: give a whole number of steps, at least 2" >&2
    exit 2
fi
# The schedule warms up over a tenth of the run (30 steps at most) and decays over 90% of it.
WARMUP=$(( TRAIN_ITERS / 10 < 30 ? TRAIN_ITERS / 10 : 30 ))
mkdir -p "$WORK_DIR"
TOKENIZER=$(python -c "from megatron_neobert.data.assets import SAMPLE_TOKENIZER; print(SAMPLE_TOKENIZER)")
SAMPLE_CORPUS=$(python -c "from megatron_neobert.data.assets import SAMPLE_CORPUS; print(SAMPLE_CORPUS)")

echo "== 1/5 preprocess: tokenize the sample corpus into $WORK_DIR/data"
# The command rather than the library: it imports megatron-core without its warnings about the GPU extensions it lacks.
REPO=$(cd "$(dirname "$0")/.." && pwd)
python "$REPO/tools/preprocess_data.py" --input "$SAMPLE_CORPUS" --json-keys content \
    --output-prefix "$WORK_DIR/data/sample" --tokenizer-model "$TOKENIZER" --no-progress

echo "== 2/5 pre-train neobert-tiny for $TRAIN_ITERS steps ($WARMUP warmup) on $NPROC ranks (watch the loss fall)"
source "$(dirname "${BASH_SOURCE[0]}")/cuda_env.sh" "$@"  # CUDA_DEVICE_MAX_CONNECTIONS with TP > 1
# Length 128, 16 sequences (2k tokens) per step, the paper's optimizer and masking, a short
# schedule: warmup to 2e-3 over a tenth of the steps (30 at most), cosine to 10% over 90% of the steps. Re-running resumes.
torchrun --nproc-per-node "$NPROC" --master-port "${MASTER_PORT:-29511}" --max-restarts "${MAX_RESTARTS:-2}" \
    -m megatron_neobert.pretrain \
    --model-preset neobert-tiny \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER" \
    --data-path "$WORK_DIR/data/sample_content_document" --split 98,2,0 \
    --data-cache-path "$WORK_DIR/data/cache" --num-workers 1 \
    --seq-length 128 --micro-batch-size 8 --global-batch-size 16 \
    --train-iters "$TRAIN_ITERS" --lr 2e-3 --lr-warmup-iters "$WARMUP" \
    --log-interval 20 --eval-interval 100 --eval-iters 4 \
    --save "$WORK_DIR/checkpoints" --load "$WORK_DIR/checkpoints" --save-interval 100 \
    --tensorboard-dir "$WORK_DIR/tensorboard" \
    "$@"
CHECKPOINT=$WORK_DIR/checkpoints/iter_$(printf %07d "$(cat "$WORK_DIR/checkpoints/latest_checkpointed_iteration.txt")")
echo "== 3/5 checkpoint: $CHECKPOINT (megatron-core distributed checkpoint, loads at any TP/PP)"

echo "== 4/5 export to a Hugging Face folder: $WORK_DIR/hf"
python "$REPO/tools/convert_checkpoint.py" --direction mcore-to-hf --load "$WORK_DIR/checkpoints" \
    --save "$WORK_DIR/hf" --tokenizer "$TOKENIZER" --overwrite --no-progress

echo "== 5/5 evaluate: pseudo-perplexity of the exported model on 16 sample documents"
python "$REPO/tools/pseudo_perplexity.py" --model "$WORK_DIR/hf" --texts "$SAMPLE_CORPUS" \
    --text-field content --num-texts 16 --max-length 128 --min-length 16 --buckets 32 64 128 \
    --device cpu --output "$WORK_DIR/pseudo_perplexity"
python "$REPO/tools/watch_run.py" --save "$WORK_DIR/checkpoints" --suite "$REPO/examples/quickstart_suite.yaml" --once

echo "done: TensorBoard logs in $WORK_DIR/tensorboard (tensorboard --logdir $WORK_DIR/tensorboard)"
