#!/usr/bin/env bash
# The GPU suite's modules on a CPU machine with the GPU host's Python stack: CPython 3.12, PyPI's torch (a CUDA
# build; 2.11.0 as on the lent hosts, or $TORCH), the packages the host has, megatron-core ($MEGATRON_CORE, 0.19.2 by
# default) with zstandard and pydantic as a staged folder brings them, this package without its dependencies; every
# other package is left out, so an import the host could not satisfy fails here. Each GPU test module is then
# imported and its tests collected and run (they skip without a GPU, each with its reason), and run.sh writes its
# summary. This checkout and its environment stay as they are; the scratch folder goes at the end (KEEP=1 keeps it).
#   bash tests/check_gpu_host_stack.sh
set -euo pipefail
cd "$(dirname "$0")/.."
torch_release=${TORCH:-2.11.0}
megatron_core=${MEGATRON_CORE:-0.19.2}
# shellcheck source=tests/find_python312.sh
source tests/find_python312.sh
python=$(find_python312)
[ -n "$python" ] || { echo "error: the GPU host runs CPython 3.12, and none was found" >&2; exit 2; }
scratch=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then echo "scratch folder (kept): $scratch"; else trap 'rm -rf "$scratch"' EXIT; fi
"$python" -m venv "$scratch/venv"
# shellcheck disable=SC1091
source "$scratch/venv/bin/activate"
export PIP_QUIET=1
# The host's own packages (its image), then what a staged folder adds; nothing else.
pip install "torch==$torch_release" "transformers>=5.2,<6" tensorboard pyarrow safetensors tokenizers sentencepiece \
    einops numpy pyyaml tqdm psutil pytest
pip install "megatron-core==$megatron_core" zstandard pydantic
pip install --no-deps .
python -c "import sys, torch, megatron.core; print('== CPython', sys.version.split()[0], '| torch', torch.__version__, \
'| megatron-core', megatron.core.__version__)"
echo "== every GPU test module imports"
for module in tests/gpu/test_*.py; do
    PYTHONPATH=tests:tests/gpu python -c "import sys, importlib; importlib.import_module(sys.argv[1])" \
        "$(basename "$module" .py)"
done
echo "== the suite, as run.sh runs it (no GPU: every test skips with its reason)"
OUT="$scratch/results" bash tests/gpu/run.sh > "$scratch/run.log" 2>&1 || true
cat "$scratch/results/summary.txt"
if grep -v -E '^(REQUIRE_GPU_KERNELS=|SKIPPED |exit status 0 )' "$scratch/results/summary.txt"; then
    echo "error: a GPU test did not skip cleanly on the host's stack (above; $scratch/results/gpu-tests.log)" >&2
    exit 1
fi
