#!/usr/bin/env bash
# The GPU test suite on one GPU, from the repository root; results under $OUT (default gpu_results/).
#
#   REQUIRE_GPU_KERNELS=te,fp8,flash bash tests/gpu/run.sh
#
# A test whose kernel path is absent skips; REQUIRE_GPU_KERNELS (any of gpu, te, fp8, flash, dali) turns
# those skips into failures (tests/gpu/conftest.py). $OUT/summary.txt lists each test that ran or skipped.
# Wheels the host lacks (megatron-core, zstandard; see docs/gpu.md) are installed from .whl/ when it exists.
set -uo pipefail
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import megatron.core" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import torch, megatron.core, megatron_neobert.kernels as k; \
print('torch', torch.__version__, 'CUDA', torch.version.cuda, '| megatron-core', megatron.core.__version__); \
print(k.format_report(k.kernel_report('auto', 'torch')))"
} > "$OUT/environment.txt" 2>&1
python3 -m pytest -q -rA tests/gpu --junitxml="$OUT/gpu-tests.xml" 2>&1 | tee "$OUT/gpu-tests.log"
status=${PIPESTATUS[0]}
{
    echo "REQUIRE_GPU_KERNELS=${REQUIRE_GPU_KERNELS:-} exit status $status"
    sed -n '/short test summary info/,$p' "$OUT/gpu-tests.log"
} > "$OUT/summary.txt"
exit "$status"
