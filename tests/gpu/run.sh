#!/usr/bin/env bash
# The GPU test suite on one GPU, from the repository root; results under $OUT (default gpu_results/).
#
#   bash tests/gpu/run.sh
#
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
python3 -m pytest -q -rs tests/gpu --junitxml="$OUT/gpu-tests.xml" 2>&1 | tee "$OUT/gpu-tests.log"
exit "${PIPESTATUS[0]}"
