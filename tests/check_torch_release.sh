#!/usr/bin/env bash
# The project under another torch release than CI's 2.13.0 (the GPU host runs 2.11, NVIDIA's containers others):
# that release's CPU build, from PyTorch's CPU wheel index (PyPI's build where that index lacks it), in a scratch
# venv with CPython 3.12 where present (else python3, or $PYTHON), the project and its `test` extra installed there
# from a copy of this checkout; then the unit tier and a 20-step quickstart. This checkout and its environment stay
# as they are; the scratch folder goes at the end (KEEP=1 keeps it and says where).
#   bash tests/check_torch_release.sh 2.11.0
set -euo pipefail
cd "$(dirname "$0")/.."
release=${1:?usage: bash tests/check_torch_release.sh TORCH_RELEASE, e.g. 2.11.0}
# shellcheck source=tests/find_python312.sh
source tests/find_python312.sh
python=${PYTHON:-$(find_python312)}
python=${python:-python3}
"$python" -c "import venv, ensurepip" 2>/dev/null ||
    { echo "error: $python cannot make a venv (give another Python as PYTHON=...)" >&2; exit 2; }
scratch=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then echo "scratch folder (kept): $scratch"; else trap 'rm -rf "$scratch"' EXIT; fi
mkdir "$scratch/src"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$scratch/src"
"$python" -m venv "$scratch/venv"
# shellcheck disable=SC1091
source "$scratch/venv/bin/activate"
# The release asked for, even where this machine's pip configuration caps torch (at the releases on its disk).
export PIP_CONSTRAINT=/dev/null
echo "== torch $release into a $(python --version) venv"
if ! python -m pip install -q --index-url https://download.pytorch.org/whl/cpu "torch==$release" \
        > "$scratch/cpu-index.log" 2>&1; then
    echo "PyTorch's CPU wheel index gave no torch $release ($scratch/cpu-index.log, kept with KEEP=1): PyPI's" \
        "build instead, with its CUDA libraries"
    python -m pip install -q "torch==$release"
fi
echo "== the project and its test extra"
python -m pip install -q "$scratch/src[test]"
cd "$scratch/src"
python -c "import sys, torch, megatron.core, transformers; print('==', 'CPython', sys.version.split()[0], '| torch', \
torch.__version__, '| megatron-core', megatron.core.__version__, '| transformers', transformers.__version__)"
[ "$(python -c 'import torch; print(torch.__version__.split("+")[0])')" = "$release" ] ||
    { echo "error: the install replaced torch $release" >&2; exit 1; }
echo "== the unit tier"
python -m pytest -n 2 -q -p no:cacheprovider -m "not integration" tests
echo "== a 20-step quickstart"
# PyPI's CUDA build of torch on a machine without a GPU runs on the CPU only when asked (parallel/launch.py).
NEOBERT_ALLOW_CPU=1 TRAIN_ITERS=20 WORK_DIR="$scratch/quickstart" bash examples/quickstart.sh
