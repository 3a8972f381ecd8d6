#!/usr/bin/env bash
# README's throughput figures: the runs on one H100/H200, in NVIDIA's PyTorch container (Dockerfile).
#
#   docker build -t megatron-neobert .
#   docker run --gpus all --ipc=host --ulimit memlock=-1 --rm -v "$PWD/results:/results" \
#       -e OUT=/results megatron-neobert bash examples/benchmark_gpu.sh
#
# Each run writes OUT/NAME.json (every figure, the targets, the kernels used) and NAME.md (the table and the
# targets, to paste into README), both rewritten as each row finishes, so that a run stopped by a time limit keeps
# the rows it had; NAME.png (not without matplotlib: one line says so) and NAME.log (the GPU, then the tool's
# output); nothing else, nowhere else: at most 8 files, each cut to its last 16 MiB. Settings through the
# environment: OUT (folder; RESULTS is its older name; default results), PYTHON (default python3), PRESET (default
# neobert-250m, the targets' model), EXTRA_ARGS (more flags for every run), QUICK=1 (one run, OUT/quick.*: lengths
# 1024 and 4096, 5 timed steps, no compile, a failing row recorded and the rest run; under 180 s on an H100,
# estimated in docs/gpu.md, where the full runs take 20-40 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-${RESULTS:-results}}
PY=${PYTHON:-python3}
PRESET=${PRESET:-neobert-250m}
MAX_BYTES=$((16 * 1024 * 1024))
mkdir -p "$OUT"
export PYTHONDONTWRITEBYTECODE=1

run() {  # run NAME FLAGS...
    local name=$1 log=$OUT/$1.log status=0
    shift
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$log" 2>&1 || true
    # shellcheck disable=SC2086  # EXTRA_ARGS holds several flags
    "$PY" tools/benchmark_throughput.py --model-preset "$PRESET" "$@" ${EXTRA_ARGS:-} \
        --output-json "$OUT/$name.json" --output-png "$OUT/$name.png" \
        --markdown "$OUT/$name.md" 2>&1 | tee -a "$log" || status=$?
    for f in "$OUT/$name".{json,png,md,log}; do
        [ ! -f "$f" ] || [ "$(stat -c %s "$f")" -le "$MAX_BYTES" ] ||
            { tail -c "$MAX_BYTES" "$f" > "$f.part" && mv "$f.part" "$f"; }
    done
    return "$status"
}

if [ "${QUICK:-0}" = 1 ]; then
    echo "== quick: inference and training at 1024 and 4096, bf16 and FP8, no compile"
    run quick --quick --fp8
    cat "$OUT/quick.md"
    exit 0
fi

# Every figure beside its eager (--compile) and bf16 (--fp8) counterpart in the same process.
# 8 micro-batches of 32 x 1024 tokens per step: the recipe's global batch of 2048 sequences on
# 8 GPUs, so the step accumulates gradients (no_sync) as the trainer's does at scale; the
# reference baseline accumulates over the same micro-batches.
echo "== 1/2 inference at 512..8192 tokens; training at 1024: all four targets"
run length1024 --compile --fp8 \
    --inference-seq-lengths 512 1024 2048 4096 8192 \
    --train-seq-lengths 1024 --train-micro-batch 32 --train-micro-batches 8

echo "== 2/2 training at 4096 (stage 2): 8 x 4096 tokens per micro-batch, as many as at 1024"
run train4096 --compile --fp8 --skip-inference \
    --train-seq-lengths 4096 --train-micro-batch 8 --train-micro-batches 8

echo "== targets"
cat "$OUT/length1024.md"
