#!/usr/bin/env bash
# README's throughput figures: the runs on one H100/H200, in NVIDIA's PyTorch container (Dockerfile).
#
#   docker build -t megatron-neobert .
#   docker run --gpus all --ipc=host --ulimit memlock=-1 --rm -v "$PWD/results:/results" \
#       -e RESULTS=/results megatron-neobert bash examples/benchmark_gpu.sh
#
# Each run writes RESULTS/NAME.json (every figure, the targets, the kernels used), NAME.png,
# NAME.md (the table and the targets, to paste into README) and NAME.log.
# Settings through the environment: RESULTS (folder, default results), PRESET (default
# neobert-250m, the targets' model), EXTRA_ARGS (more flags for every run), QUICK=1 (one run,
# RESULTS/quick.*: lengths 1024 and 4096, 5 timed steps, no compile; about 3 minutes where the full
# runs take 20-40, so it fits a 10-minute command).
set -euo pipefail
cd "$(dirname "$0")/.."

RESULTS=${RESULTS:-results}
PRESET=${PRESET:-neobert-250m}
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RESULTS/gpu.csv"

run() {  # run NAME FLAGS...
    local name=$1
    shift
    # shellcheck disable=SC2086  # EXTRA_ARGS holds several flags
    python tools/benchmark_throughput.py --model-preset "$PRESET" "$@" ${EXTRA_ARGS:-} \
        --output-json "$RESULTS/$name.json" --output-png "$RESULTS/$name.png" \
        --markdown "$RESULTS/$name.md" 2>&1 | tee "$RESULTS/$name.log"
}

if [ "${QUICK:-0}" = 1 ]; then
    echo "== quick: inference and training at 1024 and 4096, bf16 and FP8, no compile"
    run quick --quick --fp8
    cat "$RESULTS/quick.md"
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
cat "$RESULTS/length1024.md"
